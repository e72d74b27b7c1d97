package httpfront

import (
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/engine"
	"switchyard/load/series"
)

// Metric names. Every handle is created once — at start-up, when a worker is added, or the
// first time a fixed label combination occurs — and kept; no request builds a name.
const (
	metricRequests          = "switchyard_requests_total"
	metricResponses         = "switchyard_responses_total"
	metricDuration          = "switchyard_request_duration_seconds"
	metricTTFT              = "switchyard_time_to_first_token_seconds"
	metricSelections        = "switchyard_selections_total"
	metricSelectionFailures = "switchyard_selection_failures_total"
	metricAdmission         = "switchyard_admission_rejections_total"
	metricHealthyWorkers    = "switchyard_healthy_workers"
	metricUpstreamErrors    = "switchyard_upstream_errors_total"
	metricDisconnects       = "switchyard_client_disconnects_total"
	metricInflight          = "switchyard_inflight_requests"
	metricStaleGuards       = "switchyard_stale_guards_released_total"
	metricTokenizerErrors   = "switchyard_tokenizer_errors_total"
	metricClientConns       = "switchyard_client_connections"
	metricConnsRefused      = "switchyard_client_connections_refused_total"
	metricConnsEvicted      = "switchyard_client_connections_evicted_total"
	metricAcceptErrors      = "switchyard_accept_errors_total"
	metricBodyBytes         = "switchyard_request_body_bytes_in_flight"
	// metricRetries counts dispatch retries by the failure that caused them.
	metricRetries = "switchyard_retries_total"
	// metricRetryBudgetExhausted counts retries the retry budget refused.
	metricRetryBudgetExhausted = "switchyard_retry_budget_exhausted_total"
	metricPDBypass             = "switchyard_pd_bypass_decisions_total"
	metricPDBypassTokens       = "switchyard_pd_bypass_saved_tokens_total"
)

// durationBuckets are the classic `le` upper bounds, in seconds, of the latency histograms.
var durationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// statusSlots are the response status labels; a status not listed counts in its class.
var statusSlots = [...]string{"200", "400", "401", "403", "404", "405", "408", "409", "413", "415", "429", "499", "500", "502", "503", "504", "2xx", "3xx", "4xx", "5xx"}

func statusSlot(code int) int {
	if code == 200 {
		return 0 // statusSlots[0], the common case
	}
	l := statusLabel(code)
	for i, s := range statusSlots {
		if s == l {
			return i
		}
	}
	return len(statusSlots) - 1
}

// routeModelMetrics are one (route, model) pair's handles.
type routeModelMetrics struct {
	set       *metrics.Set
	base      string // `route="...",model="..."`
	requests  *metrics.Counter
	duration  *series.Histogram
	ttft      *series.Histogram
	responses [len(statusSlots)]atomic.Pointer[metrics.Counter]
}

func (m *routeModelMetrics) response(code int) *metrics.Counter {
	i := statusSlot(code)
	if c := m.responses[i].Load(); c != nil {
		return c
	}
	// Slow path: first response with this status.
	c := m.set.GetOrCreateCounter(metricResponses + "{" + m.base + `,status="` + statusSlots[i] + `"}`)
	m.responses[i].Store(c)
	return c
}

// counterMap holds counters by key, each created on its key's first use. A lookup takes no
// lock: the map is copied on write (under mu), so that a hot lookup writes no shared word (a
// read lock's reader count would bounce between cores on every call).
type counterMap[K comparable] struct {
	m  atomic.Pointer[map[K]*metrics.Counter]
	mu sync.Mutex
}

// get returns k's counter, created by create on k's first use.
func (c *counterMap[K]) get(k K, create func() *metrics.Counter) *metrics.Counter {
	if p := c.m.Load(); p != nil {
		if ctr := (*p)[k]; ctr != nil {
			return ctr
		}
	}
	// Slow path: first use of k.
	c.mu.Lock()
	defer c.mu.Unlock()
	var cur map[K]*metrics.Counter
	if p := c.m.Load(); p != nil {
		cur = *p
		if ctr := cur[k]; ctr != nil {
			return ctr
		}
	}
	ctr := create()
	next := make(map[K]*metrics.Counter, len(cur)+1)
	maps.Copy(next, cur)
	next[k] = ctr
	c.m.Store(&next)
	return ctr
}

// groupMetrics are one bucket group's selection counters, by reason.
type groupMetrics struct {
	set  *metrics.Set
	base string
	by   counterMap[string]
}

func newGroupMetrics(set *metrics.Set, base string) *groupMetrics {
	return &groupMetrics{set: set, base: base}
}

func (g *groupMetrics) selected(reason string) {
	g.by.get(reason, func() *metrics.Counter {
		return g.set.GetOrCreateCounter(metricSelections + "{" + g.base + `,reason="` + series.Label(reason) + `"}`)
	}).Inc()
}

// modelMetrics are one model's handles: per route, and per bucket and stage.
type modelMetrics struct {
	routes [numRoutes]*routeModelMetrics
	// groups[bucketID][stage]
	groups map[string]*[3]*groupMetrics
	// slo holds the SLO handles (attainment by bucket, estimate ratios, bucket orders).
	slo *sloModelMetrics
	// bypass[bucketID] counts a PD bucket's bypass decisions; only buckets with it on.
	bypass map[string]*bypassMetrics
}

// bypassMetrics are one PD bucket's bypass decisions and the prompt tokens whose KV was not
// transferred between engines because of them.
type bypassMetrics struct {
	bypass, pair, saved *metrics.Counter
}

// serverMetrics holds every handle of one Server.
type serverMetrics struct {
	set     *metrics.Set
	models  map[string]*modelMetrics // configured models; read-only after construction
	unknown *modelMetrics            // requests for no configured model
	other   [numOtherRoutes]*metrics.Counter
	// duration and ttft are the request histograms of every (route, model): updated by
	// every request without a lock.
	duration, ttft *series.HistogramFamily
	// sloRatio is the family of every model's SLO estimate ratio histograms.
	sloRatio *series.HistogramFamily

	failures [engine.OutcomePDIncompatible + 1]*metrics.Counter

	admission counterMap[string]      // by limit
	upstream  counterMap[upstreamKey] // upstream errors by worker and kind

	disconnects *metrics.Counter
	staleGuards *metrics.Counter // in-flight guards the janitor released
	inflight    atomic.Int64

	retryMetrics
}

type upstreamKey struct{ worker, kind string }

// otherRoutes are the non-inference routes counted by path only.
const (
	otherModels = iota
	otherHealth
	otherReadiness
	otherMetrics
	otherAdmin
	otherModelInfo
	otherServerInfo
	otherFlushCache
	otherUnknown
	numOtherRoutes
)

var otherRouteNames = [numOtherRoutes]string{"/v1/models", "/health", "/readiness", "/metrics", "/workers",
	"/get_model_info", "/get_server_info", "/flush_cache", "other"}

func newServerMetrics(set *metrics.Set, resolvers map[string]*engine.BucketResolver, retryable []int) *serverMetrics {
	m := &serverMetrics{
		set:      set,
		models:   make(map[string]*modelMetrics, len(resolvers)),
		duration: series.NewHistogramFamily(set, metricDuration),
		ttft:     series.NewHistogramFamily(set, metricTTFT),
		sloRatio: series.NewHistogramFamily(set, metricSLORatio),
	}
	for name, r := range resolvers {
		m.models[name] = m.newModel(name, r)
	}
	m.unknown = m.newModel("unknown", nil)
	for i, r := range otherRouteNames {
		m.other[i] = set.NewCounter(metricRequests + `{route="` + r + `",model="none"}`)
	}
	for o := engine.OutcomeNoMatchingBucket; o <= engine.OutcomePDIncompatible; o++ {
		m.failures[o] = set.NewCounter(metricSelectionFailures + `{outcome="` + o.String() + `"}`)
	}
	for _, l := range []string{"max_running_requests", "max_waiting_requests", "max_kv_tokens", "max_pending_prefill_tokens", "max_inflight_requests", engine.LimitWaitingPerRank} {
		m.admission.get(l, func() *metrics.Counter { return set.NewCounter(metricAdmission + `{limit="` + l + `"}`) })
	}
	m.disconnects = set.NewCounter(metricDisconnects)
	m.retryMetrics = newRetryMetrics(set, retryable)
	m.staleGuards = set.NewCounter(metricStaleGuards)
	set.NewGauge(metricInflight, func() float64 { return float64(m.inflight.Load()) })
	return m
}

func (m *serverMetrics) newModel(name string, r *engine.BucketResolver) *modelMetrics {
	mm := &modelMetrics{groups: make(map[string]*[3]*groupMetrics)}
	model := series.Label(name)
	for k := routeKind(0); k < numRoutes; k++ {
		base := `route="` + k.String() + `",model="` + model + `"`
		mm.routes[k] = &routeModelMetrics{
			set:      m.set,
			base:     base,
			requests: m.set.NewCounter(metricRequests + "{" + base + "}"),
			duration: m.duration.New(metricDuration+"{"+base+"}", durationBuckets),
			ttft:     m.ttft.New(metricTTFT+"{"+base+"}", durationBuckets),
		}
	}
	if r == nil {
		return mm
	}
	mm.slo = newSLOModelMetrics(m.set, m.sloRatio, model, r)
	for _, b := range r.Buckets() {
		var gs [3]*groupMetrics
		for _, g := range b.Groups() {
			if g == nil {
				continue
			}
			policy := ""
			if g.Policy() != nil {
				policy = g.Policy().Name()
			}
			gs[g.Stage()] = newGroupMetrics(m.set, `model="`+model+`",bucket="`+series.Label(b.ID)+`",group="`+
				g.Stage().String()+`",policy="`+series.Label(policy)+`"`)
		}
		mm.groups[b.ID] = &gs
		if b.IsPD() && b.BypassBelow > 0 {
			if mm.bypass == nil {
				mm.bypass = make(map[string]*bypassMetrics)
			}
			base := `model="` + model + `",bucket="` + series.Label(b.ID) + `"`
			mm.bypass[b.ID] = &bypassMetrics{
				bypass: m.set.NewCounter(metricPDBypass + "{" + base + `,decision="bypass"}`),
				pair:   m.set.NewCounter(metricPDBypass + "{" + base + `,decision="pair"}`),
				saved:  m.set.NewCounter(metricPDBypassTokens + "{" + base + "}"),
			}
		}
	}
	return mm
}

// tokenizerErrors creates the tokenizer failure counters of a model, one per stage.
func (m *serverMetrics) tokenizerErrors(model string) [numTokenizerStages]*metrics.Counter {
	var cs [numTokenizerStages]*metrics.Counter
	for st := range numTokenizerStages {
		cs[st] = m.set.NewCounter(series.Name(metricTokenizerErrors, "model", model, "stage", st.String()))
	}
	return cs
}

// selected counts a complete selection of a request of input prompt tokens.
func (m *serverMetrics) selected(mm *modelMetrics, p *engine.BucketPick, input int64) {
	mm.slo.ordered(p.Order)
	gs := mm.groups[p.BucketID]
	if gs == nil {
		return
	}
	if bm := mm.bypass[p.BucketID]; bm != nil {
		// Slow path: a PD bucket with the bypass on.
		if p.Bypass {
			bm.bypass.Inc()
			bm.saved.Add(int(input))
			if g := gs[engine.StageDecode]; g != nil {
				g.selected(p.Plain.Reason)
			}
			return
		}
		bm.pair.Inc()
	}
	if p.IsPD() {
		if g := gs[engine.StagePrefill]; g != nil {
			g.selected(p.Prefill.Reason)
		}
		if g := gs[engine.StageDecode]; g != nil {
			g.selected(p.Decode.Reason)
		}
		return
	}
	if g := gs[engine.StagePlain]; g != nil {
		g.selected(p.Plain.Reason)
	}
}

// selectionFailed counts a failed selection and its admission rejections.
func (m *serverMetrics) selectionFailed(err error) {
	o := engine.OutcomeOf(err)
	if int(o) < len(m.failures) && m.failures[o] != nil {
		m.failures[o].Inc()
	}
	pe, ok := err.(*engine.PickError)
	if !ok {
		return
	}
	for _, r := range pe.Rejections {
		m.admissionRejected(r.Limit)
	}
}

func (m *serverMetrics) admissionRejected(limit string) {
	m.admission.get(limit, func() *metrics.Counter {
		return m.set.GetOrCreateCounter(series.Name(metricAdmission, "limit", limit))
	}).Inc()
}

// Upstream error kinds.
const (
	upstreamTransport = "transport"
	upstreamTimeout   = "timeout"
	upstreamStatus    = "status_5xx"
	upstreamIdle      = "stream_idle"
)

func (m *serverMetrics) upstreamError(worker, kind string) {
	m.upstream.get(upstreamKey{worker, kind}, func() *metrics.Counter {
		return m.set.GetOrCreateCounter(series.Name(metricUpstreamErrors, "worker", worker, "kind", kind))
	}).Inc()
}

// healthyWorkers registers the gauge of a model's healthy workers in one role its buckets
// need (what /readiness checks); count reads the current registry at scrape time.
func (m *serverMetrics) healthyWorkers(model string, stage engine.Stage, count func() float64) {
	m.set.NewGauge(series.Name(metricHealthyWorkers, "model", model, "role", stage.String()), count)
}

// since returns seconds elapsed from start to now.
func since(start, now time.Time) float64 { return now.Sub(start).Seconds() }
