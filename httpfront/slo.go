package httpfront

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/load"
	"switchyard/load/series"
)

// SLO handling in the front end: a request's latency targets (headers, else the model's
// defaults), the estimates for the engines it was dispatched to, what a stream teaches the
// engines' learned rates, and the SLO metrics.

// Request headers carrying a request's latency targets, in milliseconds.
const (
	headerSLOTTFT = "X-Slo-Ttft-Ms"
	headerSLOTPOT = "X-Slo-Tpot-Ms"
)

// Response headers of a request with a target: the estimates at dispatch, in milliseconds,
// and the rule that ordered the buckets.
var (
	keyEstimatedTTFT = []byte("X-Switchyard-Estimated-Ttft-Ms")
	keyEstimatedTPOT = []byte("X-Switchyard-Estimated-Tpot-Ms")
	keyBucketOrder   = []byte("X-Switchyard-Bucket-Order")
)

// maxTargetMs bounds a target header, as config bounds a model's default.
const maxTargetMs = 10_000_000

// modelTargets converts a model's configured default targets.
func modelTargets(s config.SLO) engine.SLOTargets {
	var t engine.SLOTargets
	if s.TTFTMs != nil {
		t.TTFT = msDuration(*s.TTFTMs)
	}
	if s.TPOTMs != nil {
		t.TPOT = msDuration(*s.TPOTMs)
	}
	return t
}

func msDuration(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// sloTargets returns the request's targets: each header that is present (read in the
// client header pass, forwardNames.scan), else the model's default. A header that is not a
// number of milliseconds in (0, 10,000,000] is a 400.
func sloTargets(h *clientHeaders, def engine.SLOTargets) (engine.SLOTargets, *apiError) {
	t := def
	var e *apiError
	if t.TTFT, e = targetHeader(h[readSLOTTFT], headerSLOTTFT, t.TTFT); e != nil {
		return t, e
	}
	t.TPOT, e = targetHeader(h[readSLOTPOT], headerSLOTPOT, t.TPOT)
	return t, e
}

// targetHeader returns the target v, the value of header name, holds, or def when it is
// absent.
func targetHeader(v []byte, name string, def time.Duration) (time.Duration, *apiError) {
	if len(v) == 0 {
		return def, nil
	}
	ms, err := strconv.ParseFloat(string(v), 64)
	if err != nil || !(ms > 0 && ms <= maxTargetMs) {
		return def, paramError(CodeInvalidParameter, strings.ToLower(name),
			"the "+strings.ToLower(name)+" header must be a number of milliseconds in (0, 10000000]")
	}
	return msDuration(ms), nil
}

// sloTrack is what one dispatched request carries to its end for the SLO estimates and
// metrics: its targets, the engines' rates and the work and load it joined at dispatch (what
// the observed latencies teach the rates), the estimates made then, and, for a stream, the
// timing the relay records. It is a value inside the request's dispatch and relay.
type sloTrack struct {
	targets engine.SLOTargets
	order   engine.BucketOrder
	mm      *sloModelMetrics
	bucket  *sloBucketMetrics // nil when the bucket has no handles
	// prefill is the rates of the engine that prefills (plain or prefill); decode of the
	// engine that decodes (plain or decode).
	prefill, decode *load.Rates
	// uncached is the request's uncached prompt tokens on the prefill engine; work the
	// prefill work (PrefillWork) and dload the decode load (DecodeLoad) at dispatch.
	uncached int64
	work     float64
	dload    float64
	// estTTFT and estTPOT are the estimates at dispatch, in seconds.
	estTTFT, estTPOT float64
	hasTTFT, hasTPOT bool

	// start is the dispatch's time (engine.BucketRequest.Now: its selection's, a retry's
	// own, or the end of a retry's backoff): the engine's learning and the estimates' ratios
	// count from it (chunk). The targets are judged from the request's arrival (end).
	start time.Time

	// Recorded by a stream's relay.
	firstAt, lastAt time.Time
	events, done    int // SSE data lines, and [DONE] lines among them (done set at the end)
}

// sloStart makes into t the request's estimates for the engines of pick, at dispatch. It
// fills t in place: a returned sloTrack would be copied twice (fast path).
func (s *Server) sloStart(t *sloTrack, mr *modelRoute, req *engine.BucketRequest, pick *engine.BucketPick) {
	pw, dw := pick.Plain.Worker, pick.Plain.Worker
	if pick.IsPD() {
		pw, dw = pick.Prefill.Worker, pick.Decode.Worker
	}
	*t = sloTrack{targets: req.SLO, order: pick.Order, mm: mr.metrics.slo, start: req.Now,
		prefill: pw.Counters.Rates(), decode: dw.Counters.Rates()}
	t.bucket = t.mm.buckets[pick.BucketID]
	snap := s.opts.Loads.Load()
	po := snap.Observe(pw.ID, req.Now)
	t.uncached = engine.UncachedTokens(req, pw)
	t.work = load.PrefillWork(&po, pw.Counters, t.uncached, req.Now)
	t.estTTFT, t.hasTTFT = load.EstimateTTFTAtWork(&po, pw.Counters, t.work)
	do := po
	if dw != pw {
		do = snap.Observe(dw.ID, req.Now)
	}
	t.dload = load.DecodeLoad(&do, dw.Counters)
	t.estTPOT, t.hasTPOT = load.EstimateTPOTAtLoad(dw.Counters, t.dload)
}

// headers sets the estimate and order headers of a request that has a target.
func (t *sloTrack) headers(h *fasthttp.ResponseHeader) {
	if !t.targets.Any() {
		return
	}
	var buf [32]byte
	if t.hasTTFT {
		h.SetCanonical(keyEstimatedTTFT, strconv.AppendFloat(buf[:0], 1000*t.estTTFT, 'f', 1, 64))
	}
	if t.hasTPOT {
		h.SetCanonical(keyEstimatedTPOT, strconv.AppendFloat(buf[:0], 1000*t.estTPOT, 'f', 2, 64))
	}
	h.SetCanonical(keyBucketOrder, orderValues[t.order])
}

// orderValues are the X-Switchyard-Bucket-Order values by engine.BucketOrder.
var orderValues = [...][]byte{engine.OrderCapacity: []byte("capacity"), engine.OrderSLO: []byte("slo")}

// chunk records one read of the upstream stream arriving at now with its data lines (the
// relay's framer counts them): the first with any carries the first token, and every data
// event counts as one token (approximately: a final chunk that only carries finish_reason or
// usage counts too).
func (t *sloTrack) chunk(dataLines int, now time.Time) {
	if dataLines == 0 {
		return
	}
	if t.firstAt.IsZero() {
		t.firstAt = now
		ttft := now.Sub(t.start).Seconds()
		t.prefill.Prefill.Observe(t.work, ttft)
		if t.hasTTFT && ttft > 0 {
			t.mm.ratioTTFT.Update(t.estTTFT / ttft)
		}
	}
	t.events += dataLines
	t.lastAt = now
}

// end records the end of the stream of a request that arrived at arrived: a complete one
// teaches the decode engine its time per output token and, when the request had targets,
// counts them met or missed (its TTFT the client's, from arrived: a retry's earlier
// attempts count).
func (t *sloTrack) end(complete bool, arrived time.Time) {
	if !complete || t.firstAt.IsZero() {
		return
	}
	tokens := t.events - t.done
	tpot := math.NaN()
	if tokens >= 2 {
		tpot = t.lastAt.Sub(t.firstAt).Seconds() / float64(tokens-1)
		t.decode.Decode.Observe(t.dload, tpot)
		if t.hasTPOT && tpot > 0 {
			t.mm.ratioTPOT.Update(t.estTPOT / tpot)
		}
	}
	if !t.targets.Any() || t.bucket == nil {
		return
	}
	ttft := t.firstAt.Sub(arrived)
	met := true
	if t.targets.TTFT > 0 && ttft > t.targets.TTFT {
		met = false
		t.bucket.missedTTFT.Inc()
	}
	if t.targets.TPOT > 0 && !math.IsNaN(tpot) && tpot > t.targets.TPOT.Seconds() {
		met = false
		t.bucket.missedTPOT.Inc()
	}
	if met {
		t.bucket.met.Inc()
	}
}

// Metric names of the SLO handling.
const (
	metricSLOMet       = "switchyard_slo_met_total"
	metricSLOMissed    = "switchyard_slo_missed_total"
	metricSLORatio     = "switchyard_slo_estimate_ratio"
	metricBucketOrders = "switchyard_bucket_orders_total"
)

// ratioBuckets are the `le` bounds of the estimate ratio histograms (estimated / observed):
// 1 is exact, 0.7 to 1.3 within ±30%.
var ratioBuckets = []float64{0.25, 0.5, 0.7, 0.8, 0.9, 1, 1.1, 1.2, 1.3, 1.5, 2, 4}

// sloModelMetrics are one model's SLO handles.
type sloModelMetrics struct {
	// ratioTTFT and ratioTPOT are updated by every request with a target: without a lock.
	ratioTTFT, ratioTPOT *series.Histogram
	// buckets are the attainment counters by bucket ID; read-only after construction.
	buckets map[string]*sloBucketMetrics
	// orders counts selections by the rule that ordered their buckets.
	orders [2]*metrics.Counter
}

// sloBucketMetrics are one bucket's attainment counters.
type sloBucketMetrics struct {
	met, missedTTFT, missedTPOT *metrics.Counter
}

// newSLOModelMetrics makes a model's SLO handles; ratios is the family of the estimate
// ratio histograms (metricSLORatio).
func newSLOModelMetrics(set *metrics.Set, ratios *series.HistogramFamily, model string, r *engine.BucketResolver) *sloModelMetrics {
	m := &sloModelMetrics{buckets: map[string]*sloBucketMetrics{}}
	base := `model="` + model + `"`
	m.ratioTTFT = ratios.New(metricSLORatio+"{"+base+`,target="ttft"}`, ratioBuckets)
	m.ratioTPOT = ratios.New(metricSLORatio+"{"+base+`,target="tpot"}`, ratioBuckets)
	for _, o := range []engine.BucketOrder{engine.OrderCapacity, engine.OrderSLO} {
		m.orders[o] = set.NewCounter(metricBucketOrders + "{" + base + `,order="` + o.String() + `"}`)
	}
	if r == nil {
		return m
	}
	for _, b := range r.Buckets() {
		bl := base + `,bucket="` + series.Label(b.ID) + `"`
		m.buckets[b.ID] = &sloBucketMetrics{
			met:        set.NewCounter(metricSLOMet + "{" + bl + "}"),
			missedTTFT: set.NewCounter(metricSLOMissed + "{" + bl + `,target="ttft"}`),
			missedTPOT: set.NewCounter(metricSLOMissed + "{" + bl + `,target="tpot"}`),
		}
	}
	return m
}

// ordered counts a selection by its order rule.
func (m *sloModelMetrics) ordered(o engine.BucketOrder) {
	if int(o) < len(m.orders) {
		m.orders[o].Inc()
	}
}
