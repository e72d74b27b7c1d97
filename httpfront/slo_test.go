package httpfront

import (
	"bytes"
	"encoding/json"
	"maps"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/config"
	"switchyard/load"
)

// twoBucketConfig is one model with two plain buckets of the same lengths: "a" (rank 0,
// engine A, first in capacity order) and "b" (rank 1, engine B).
func twoBucketConfig(a, b *fakeEngine, order string, slo config.SLO) *config.Config {
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", a.url, "llama"), plainWorker("B", b.url, "llama")}
	ba, bb := plainBucket("a", nil, nil, "A"), plainBucket("b", nil, nil, "B")
	bb.Rank = 1
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{ba, bb}, BucketOrder: order, SLO: slo}}
	return cfg
}

func TestSLOTargetHeaders(t *testing.T) {
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	ts := startServer(t, twoBucketConfig(a, b, config.BucketOrderSLO, config.SLO{}), Options{NoTelemetry: true})
	for _, tt := range []struct{ header, value string }{
		{"x-slo-ttft-ms", "0"}, {"x-slo-ttft-ms", "-5"}, {"X-SLO-TPOT-MS", "fast"}, {"x-slo-tpot-ms", "1e9"},
		{"x-slo-ttft-ms", "NaN"}, {"x-slo-ttft-ms", "Inf"},
	} {
		r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""), tt.header, tt.value)
		var body struct {
			Error struct{ Code, Param string }
		}
		_ = json.Unmarshal(r.body, &body)
		if r.status != 400 || body.Error.Code != CodeInvalidParameter || body.Error.Param != strings.ToLower(tt.header) {
			t.Errorf("%s: %s: status %d body %s", tt.header, tt.value, r.status, r.body)
		}
	}
	// Valid targets: the answer carries the order rule; without a target it does not.
	r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""), "x-slo-ttft-ms", "250.5", "x-slo-tpot-ms", "20")
	if r.status != 200 || r.header.Get("X-Switchyard-Bucket-Order") != "slo" {
		t.Fatalf("status %d headers %v", r.status, r.header)
	}
	if r = post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", "")); r.header.Get("X-Switchyard-Bucket-Order") != "" {
		t.Fatalf("a request without a target got %v", r.header)
	}
	if a.hits.Load() != 2 || b.hits.Load() != 0 {
		t.Fatalf("hits A %d B %d: nothing learned, both buckets are equal, capacity order keeps A first", a.hits.Load(), b.hits.Load())
	}
}

// TestSLOOrderPrefersTheBucketExpectedToMeet: with the rates the router learned, a request
// with a TTFT target goes to the bucket expected to meet it; the response says what was
// expected; capacity order, a request without a target, or a model's default target
// behave as configured.
func TestSLOOrderPrefersTheBucketExpectedToMeet(t *testing.T) {
	tests := []struct {
		name    string
		order   string
		slo     config.SLO
		headers []string
		want    string  // bucket
		wantEst float64 // X-Switchyard-Estimated-Ttft-Ms per input token; 0: no header
	}{
		{name: "slo order, header target", order: config.BucketOrderSLO, headers: []string{"x-slo-ttft-ms", "200"}, want: "b", wantEst: 0.05},
		{name: "slo order, model default target", order: config.BucketOrderSLO, slo: config.SLO{TTFTMs: ptr(200.0)}, want: "b", wantEst: 0.05},
		{name: "slo order, every bucket meets: capacity order", order: config.BucketOrderSLO, headers: []string{"x-slo-ttft-ms", "5000"}, want: "a", wantEst: 2},
		{name: "slo order, no target", order: config.BucketOrderSLO, want: "a"},
		{name: "capacity order", order: "", headers: []string{"x-slo-ttft-ms", "200"}, want: "a", wantEst: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
			tr := load.NewTracker()
			// Learned so far: A takes 2s per 1,000 prefill tokens, B 50ms.
			tr.Counters("A").Rates().Prefill.Observe(1000, 2)
			tr.Counters("B").Rates().Prefill.Observe(1000, 0.05)
			ts := startServer(t, twoBucketConfig(a, b, tt.order, tt.slo), Options{NoTelemetry: true, Tracker: tr})
			body := chatBody("llama", strings.Repeat("word ", 1000), "")
			input := float64(len(body)) / 4 // the body-size estimate, without a tokenizer
			r := post(t, ts.url+"/v1/chat/completions", body, tt.headers...)
			if r.status != 200 || r.header.Get(headerBucket) != tt.want {
				t.Fatalf("status %d bucket %q, want %q", r.status, r.header.Get(headerBucket), tt.want)
			}
			est := r.header.Get("X-Switchyard-Estimated-Ttft-Ms")
			if tt.wantEst == 0 && est != "" || tt.wantEst != 0 && !sameMs(est, tt.wantEst*input) {
				t.Fatalf("estimated TTFT %q ms, want about %.1f", est, tt.wantEst*input)
			}
		})
	}
}

// TestSLOEstimateOfABypassedRequest: a PD request its decode engine takes alone is estimated
// with that engine's learned prefill rate (it prefills the request), and counts in its
// pending prefill until its first token; a paired request is estimated with the prefill
// engine's.
func TestSLOEstimateOfABypassedRequest(t *testing.T) {
	for _, tt := range []struct {
		name     string
		below    int64
		perToken float64 // estimated ms per input token
		bypassed bool
	}{
		{"bypassed: the decode engine prefills", 1 << 30, 0.05, true},
		{"paired: the prefill engine prefills", 1, 2, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := newFakeEngine(t, "P", "llama", withMode("prefill"))
			p.bootstrapPort = 8998
			d := newFakeEngine(t, "D", "llama", withMode("decode"))
			d.expectHost, d.expectPort, d.canPrefill = "127.0.0.1", 8998, true
			d.hold, d.entered = make(chan struct{}), make(chan struct{}, 1)
			cfg := pdConfig(p, d, ptr(8998))
			cfg.Workers[1].CanPrefill = true
			cfg.Models["llama"].Buckets[0].Groups.PD.BypassBelowTokens = tt.below
			tr := load.NewTracker()
			// Learned so far: P takes 2s per 1,000 prefill tokens, D 50ms.
			tr.Counters("P").Rates().Prefill.Observe(1000, 2)
			tr.Counters("D").Rates().Prefill.Observe(1000, 0.05)
			ts := startServer(t, cfg, Options{NoTelemetry: true, Tracker: tr})
			body := chatBody("llama", strings.Repeat("word ", 1000), "")
			input := float64(len(body)) / 4 // the body-size estimate, without a tokenizer
			out := make(chan result, 1)
			postAsync(t.Context(), ts.url+"/v1/chat/completions", body, out, "x-slo-ttft-ms", "100000")
			waitFor(t, d.entered, "the decode engine's request")
			reqs, tokens := tr.Counters("D").PendingPrefill()
			if tt.bypassed != (reqs == 1 && math.Abs(float64(tokens)-input) < 1) {
				t.Errorf("the decode engine's pending prefill: %d requests, %d tokens", reqs, tokens)
			}
			close(d.hold)
			r := collect(t, out, 1, "the answer")[0]
			if r.status != 200 || (p.hits.Load() == 0) != tt.bypassed {
				t.Fatalf("status %d, prefill engine hits %d", r.status, p.hits.Load())
			}
			if est := r.header.Get("X-Switchyard-Estimated-Ttft-Ms"); !sameMs(est, tt.perToken*input) {
				t.Fatalf("estimated TTFT %q ms, want about %.1f", est, tt.perToken*input)
			}
		})
	}
}

// sameMs reports whether the header value got is want milliseconds, within 1%.
func sameMs(got string, want float64) bool {
	g, err := strconv.ParseFloat(got, 64)
	return err == nil && g >= want*0.99 && g <= want*1.01
}

// TestSLOLearningAndAttainment: streams teach the engine's rates (GET /workers shows them),
// the estimate-ratio histograms fill, and a request's targets are counted met or missed by
// bucket.
func TestSLOLearningAndAttainment(t *testing.T) {
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	ts := startServer(t, twoBucketConfig(a, b, "", config.SLO{}), Options{NoTelemetry: true})
	stream := chatBody("llama", "hello there", `"stream":true`)
	for range 3 {
		if r := post(t, ts.url+"/v1/chat/completions", stream, "x-slo-ttft-ms", "10000000"); r.status != 200 {
			t.Fatalf("status %d", r.status)
		}
	}
	if r := post(t, ts.url+"/v1/chat/completions", stream, "x-slo-ttft-ms", "0.000001"); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	// A non-streamed request teaches nothing and is not judged.
	if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""), "x-slo-ttft-ms", "0.000001"); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	rates := ts.tracker.Counters("A").Rates()
	if _, _, n := rates.Prefill.Params(); n != 4 {
		t.Fatalf("prefill samples %d, want 4", n)
	}
	if _, _, n := rates.Decode.Params(); n != 4 {
		t.Fatalf("decode samples %d, want 4 (four tokens a stream)", n)
	}
	if req, tok := ts.tracker.Counters("A").PendingPrefill(); req != 0 || tok != 0 {
		t.Fatalf("pending prefill %d, %d after every request ended", req, tok)
	}

	var list struct {
		Workers []workerView `json:"workers"`
	}
	if err := json.Unmarshal(get(t, ts.url+"/workers").body, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Workers) != 2 || list.Workers[0].ID != "A" || list.Workers[0].Learned.PrefillSamples != 4 ||
		list.Workers[0].Learned.DecodeSamples != 4 || list.Workers[1].Learned.PrefillSamples != 0 {
		t.Fatalf("workers %+v", list.Workers)
	}

	m := string(get(t, ts.url+"/metrics").body)
	for _, want := range []string{
		`switchyard_slo_met_total{model="llama",bucket="a"} 3`,
		`switchyard_slo_missed_total{model="llama",bucket="a",target="ttft"} 1`,
		`switchyard_slo_missed_total{model="llama",bucket="a",target="tpot"} 0`,
		`switchyard_slo_met_total{model="llama",bucket="b"} 0`,
		`switchyard_slo_estimate_ratio_count{model="llama",target="ttft"} 3`, // the first stream had no estimate yet
		`switchyard_bucket_orders_total{model="llama",order="capacity"} 5`,
		`switchyard_worker_learned_prefill_tokens_per_second{worker="A"}`,
		`switchyard_worker_learned_tpot_base_seconds{worker="B"} 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestPDCompatibilityFromIntrospection: the transfer backends the engines report in
// /server_info become their labels; the decode engine is always the prefill engine's
// partner; when the only fitting bucket has no compatible decode engine, the 503 names
// pd_incompatible.
func TestPDCompatibilityFromIntrospection(t *testing.T) {
	p1 := newFakeEngine(t, "P1", "llama", withMode("prefill"), withInfo("disaggregation_transfer_backend", "nixl", "tp_size", 2))
	p2 := newFakeEngine(t, "P2", "llama", withMode("prefill"), withInfo("disaggregation_transfer_backend", "mooncake"))
	d1 := newFakeEngine(t, "D1", "llama", withMode("decode"), withInfo("disaggregation_transfer_backend", "mooncake"))
	d2 := newFakeEngine(t, "D2", "llama", withMode("decode"), withInfo("disaggregation_transfer_backend", "nixl"))
	for _, d := range []*fakeEngine{d1, d2} {
		d.expectHost = "127.0.0.1"
	}
	cfg := baseConfig()
	cfg.Workers = []config.Worker{
		{ID: "P1", URL: p1.url, Model: "llama", Role: config.RolePrefill, DPSize: 1},
		{ID: "P2", URL: p2.url, Model: "llama", Role: config.RolePrefill, DPSize: 1, Labels: map[string]string{"zone": "a"}},
		{ID: "D1", URL: d1.url, Model: "llama", Role: config.RoleDecode, DPSize: 1},
		{ID: "D2", URL: d2.url, Model: "llama", Role: config.RoleDecode, DPSize: 1},
	}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{{ID: "pd", Groups: config.Groups{PD: &config.PDGroups{
		Prefill: &config.Group{}, Decode: &config.Group{}, Compatibility: []string{config.LabelTransferBackend},
	}}}}}}
	ts := startServer(t, cfg, Options{NoTelemetry: true})

	partner := map[string]string{"P1": "D2", "P2": "D1"}
	seen := map[string]int{}
	for i := range 40 {
		r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
		p, d := r.header.Get(headerPrefillWorker), r.header.Get(headerWorker)
		if r.status != 200 || partner[p] != d {
			t.Fatalf("request %d: status %d pair %s+%s body %s", i, r.status, p, d, r.body)
		}
		seen[p]++
	}
	if seen["P1"] == 0 || seen["P2"] == 0 {
		t.Fatalf("prefill engines used %v", seen)
	}
	var list struct {
		Workers []workerView `json:"workers"`
	}
	_ = json.Unmarshal(get(t, ts.url+"/workers").body, &list)
	got := map[string]map[string]string{}
	for _, w := range list.Workers {
		got[w.ID] = w.Labels
	}
	if got["P1"]["transfer_backend"] != "nixl" || got["P1"]["tp_size"] != "2" || got["P1"]["page_size"] != "16" ||
		got["P2"]["zone"] != "a" || got["D1"]["transfer_backend"] != "mooncake" {
		t.Fatalf("labels %v", got)
	}

	// D2 goes: P1 has no partner left. Its attempts fail with pd_incompatible in the body.
	ts.wset.SetHealthy("D2", false)
	for range 4 {
		r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
		if r.status == 200 {
			if r.header.Get(headerPrefillWorker) != "P2" || r.header.Get(headerWorker) != "D1" {
				t.Fatalf("pair %s+%s", r.header.Get(headerPrefillWorker), r.header.Get(headerWorker))
			}
			continue
		}
		if r.status != 503 || r.errorCode() != CodeNoAvailableEngine || !contains(r.body, `"worker":"P1","limit":"pd_incompatible"`) {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
	}
}

// TestAdminWorkerLabels: POST /workers takes a worker's PD compatibility labels (the
// "labels" object, sgl-router's name too), checked as configured ones are, and GET
// /workers/{id} shows them over the introspected ones.
func TestAdminWorkerLabels(t *testing.T) {
	a := newFakeEngine(t, "A", "llama")
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", a.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{{ID: "b", Groups: config.Groups{Plain: &config.Group{}}}}}}
	ts := startServer(t, cfg, Options{NoTelemetry: true})

	c := newFakeEngine(t, "C", "llama")
	r := post(t, ts.url+"/workers", `{"url":"`+c.url+`","id":"C","model":"llama","labels":{"zone":"a","transfer_backend":"nixl"}}`)
	if r.status != 201 {
		t.Fatalf("add with labels: %d %s", r.status, r.body)
	}
	var v workerView
	if r := get(t, ts.url+"/workers/C"); r.status != 200 || json.Unmarshal(r.body, &v) != nil {
		t.Fatalf("GET: %d %s", r.status, r.body)
	}
	if want := map[string]string{"zone": "a", "transfer_backend": "nixl", "page_size": "16"}; !maps.Equal(v.Labels, want) {
		t.Fatalf("labels %v, want %v", v.Labels, want)
	}
	if r := post(t, ts.url+"/workers", `{"url":"`+c.url+`","id":"C2","model":"llama","labels":{"a b":"x"}}`); r.status != 400 ||
		!contains(r.body, "labels.a b") {
		t.Fatalf("bad label: %d %s", r.status, r.body)
	}
}

// TestSLORatioHistogramsExposition: /metrics exposes the estimate ratio histograms of every
// model byte for byte as metrics.PrometheusHistogram exposes the same observations.
func TestSLORatioHistogramsExposition(t *testing.T) {
	a, b, q := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama"), newFakeEngine(t, "Q", "qwen")
	cfg := twoBucketConfig(a, b, config.BucketOrderSLO, config.SLO{})
	cfg.Workers = append(cfg.Workers, plainWorker("Q", q.url, "qwen"))
	cfg.Models["qwen"] = config.Model{Buckets: []config.Bucket{plainBucket("q", nil, nil, "Q")}}
	ts := startServer(t, cfg, Options{NoTelemetry: true})
	// Binary fractions: the sums are exact in any order.
	obs := map[string][]float64{
		`model="llama",target="ttft"`: {0.5, 1, 1.25, 8},
		`model="llama",target="tpot"`: {0.25},
		`model="qwen",target="ttft"`:  {},
		`model="qwen",target="tpot"`:  {0.75, 0.75, 3},
	}
	ref := metrics.NewSet()
	for labels, vs := range obs {
		h := ref.NewPrometheusHistogramExt(metricSLORatio+"{"+labels+"}", ratioBuckets)
		for _, v := range vs {
			h.Update(v)
		}
	}
	for _, model := range []string{"llama", "qwen"} {
		m := ts.metrics.models[model].slo
		for _, v := range obs[`model="`+model+`",target="ttft"`] {
			m.ratioTTFT.Update(v)
		}
		for _, v := range obs[`model="`+model+`",target="tpot"`] {
			m.ratioTPOT.Update(v)
		}
	}
	var want bytes.Buffer
	ref.WritePrometheus(&want)
	if n := strings.Count(want.String(), "_count{"); n != 4 {
		t.Fatalf("the reference has %d series:\n%s", n, want.String())
	}
	if got := scrape(t, ts.url); !strings.Contains(got, want.String()) {
		t.Fatalf("/metrics lacks the ratio histograms as metrics.PrometheusHistogram writes them:\n%s\nwant:\n%s", got, want.String())
	}
}

// TestDataLines: the relay's framer counts a stream's data lines ("data:" at a line's start,
// after any line terminator: LF, CRLF, CR; not where "data:" appears inside a payload), its
// [DONE] lines ("data:", spaces, "[DONE]") and whether a complete event held one, the same
// however the bytes are split across reads.
func TestDataLines(t *testing.T) {
	for _, tc := range []struct {
		name, stream string
		data, done   int
		doneEvent    bool
	}{
		{"empty", "", 0, 0, false},
		{"one event", "data: {\"x\":1}\n\n", 1, 0, false},
		{"two events", "data: a\n\ndata: b\n\n", 2, 0, false},
		{"multi-line event", "data: a\ndata: b\n\n", 2, 0, false},
		{"CRLF", "data: a\r\n\r\ndata: b\r\n\r\n", 2, 0, false},
		{"CR", "data: a\r\rdata: b\r\r", 2, 0, false},
		{"comment and event", ": keep-alive\n\ndata: a\n\n", 1, 0, false},
		{"in a payload", "data: {\"text\":\"data: no\"}\n\n", 1, 0, false},
		{"not at the line's start", "x data: a\n\n data: b\n\n", 0, 0, false},
		{"other fields", "event: data:\nid: 1\ndata:\n\n", 1, 0, false},
		{"done", "data: a\n\ndata: [DONE]\n\n", 2, 1, true},
		{"done without a space", "data:[DONE]\n\n", 1, 1, true},
		{"done after spaces", "data:   [DONE]\r\n\r\n", 1, 1, true},
		{"done then text", "data: [DONE] x\n\n", 1, 1, true},
		{"done in a payload", "data: {\"text\":\"[DONE]\"}\n\n", 1, 0, false},
		{"done in a comment", ": [DONE]\n\n", 0, 0, false},
		{"done cut short", "data: [DON\n\n", 1, 0, false},
		{"done without its blank line", "data: [DONE]\n", 1, 1, false},
		{"done, then more events", "data: [DONE]\n\ndata: a\n\n", 2, 1, true},
		{"done in an event's second line", "id: 7\ndata: [DONE]\n\n", 1, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := []byte(tc.stream)
			// Whole, split in two at every offset, and a byte at a time.
			splits := [][][]byte{{b}}
			for i := 1; i < len(b); i++ {
				splits = append(splits, [][]byte{b[:i], b[i:]})
			}
			var bytewise [][]byte
			for i := range b {
				bytewise = append(bytewise, b[i:i+1])
			}
			splits = append(splits, bytewise)
			for _, reads := range splits {
				var f sseFramer
				for _, r := range reads {
					for off := 0; off < len(r); {
						n := f.next(r[off:])
						if n < 0 {
							break
						}
						off += n
					}
				}
				if f.dataLines != tc.data || f.doneLines != tc.done || f.doneEvent != tc.doneEvent {
					t.Fatalf("reads %q: data lines %d, [DONE] lines %d, a complete [DONE] event %v; want %d, %d, %v",
						reads, f.dataLines, f.doneLines, f.doneEvent, tc.data, tc.done, tc.doneEvent)
				}
			}
		})
	}
}

// TestBufferedAnswerFirstTokenExpected: a non-streamed request reports no first token; it
// leaves its engine's pending prefill when the estimate made at dispatch expects its first
// token (the dispatch plus the learned prefill time of its work), not when its answer ends,
// so the engine's progress on what follows counts from then. A stream keeps its prompt
// pending until its first token.
func TestBufferedAnswerFirstTokenExpected(t *testing.T) {
	a := newFakeEngine(t, "A", "llama")
	a.hold, a.entered = make(chan struct{}), make(chan struct{}, 1)
	tr := load.NewTracker()
	c := tr.Counters("A")
	c.Rates().Prefill.Observe(1000, 2) // learned so far: 2 ms a prefill token
	clock := newFakeClock()
	ts := startServer(t, oneEngineConfig(a), Options{NoTelemetry: true, Tracker: tr, Now: clock.Now})
	body := chatBody("llama", strings.Repeat("word ", 1000), "")
	out := make(chan result, 1)
	postAsync(t.Context(), ts.url+"/v1/chat/completions", body, out)
	waitFor(t, a.entered, "the engine's request")
	r, input := c.PendingPrefill()
	if r != 1 || math.Abs(float64(input)-float64(len(body))/4) > 1 { // the body-size estimate, without a tokenizer
		t.Fatalf("pending prefill %d requests, %d tokens at dispatch; want 1, about %d", r, input, len(body)/4)
	}
	expected := clock.Now().Add(time.Duration(input) * 2 * time.Millisecond)
	var o load.Observation
	if left := c.PendingPrefillLeft(&o, expected.Add(-time.Millisecond)); !(left > 0) {
		t.Fatalf("%v tokens left just before the expected first token", left)
	}
	if left := c.PendingPrefillLeft(&o, expected.Add(time.Millisecond)); left != 0 {
		t.Fatalf("%v tokens left after the expected first token, the answer still held: want 0", left)
	}
	if r, tok := c.PendingPrefill(); r != 0 || tok != 0 || c.InFlight() != 1 {
		t.Fatalf("pending %d, %d, in flight %d after the expected first token; want 0, 0, 1", r, tok, c.InFlight())
	}
	close(a.hold)
	if got := collect(t, out, 1, "the answer")[0]; got.status != 200 {
		t.Fatalf("status %d", got.status)
	}
	waitUntil(t, "the request's end", func() bool { return c.InFlight() == 0 })
}

// TestSLOAttainmentOfARetryCountsFromTheStart: a request's TTFT target is the client's: a
// retried stream is judged on the time from the request's start to its first token, the
// failed first attempt included.
func TestSLOAttainmentOfARetryCountsFromTheStart(t *testing.T) {
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	a.fail.Store(503)
	a.delay = make(chan struct{})
	clock := newFakeClock()
	clock.scheduled = make(chan time.Duration, 4)
	ts := startServer(t, retryConfig(a, b), Options{NoTelemetry: true, SkipStartupChecks: true, Clock: clock})
	out := make(chan result, 1)
	postAsync(t.Context(), ts.url+"/v1/chat/completions", chatBody("llama", "hi", `"stream":true`), out, "x-slo-ttft-ms", "1000")
	waitUntil(t, "the first attempt to reach A", func() bool { return a.hits.Load() == 1 })
	clock.Advance(2 * time.Second) // the first attempt alone outlasts the target
	close(a.delay)
	select {
	case <-clock.scheduled:
	case <-time.After(10 * time.Second):
		t.Fatal("the request never waited for its retry")
	}
	clock.Advance(10 * time.Millisecond) // the backoff ends; B answers at once
	if r := collect(t, out, 1, "the stream")[0]; r.status != 200 || r.header.Get(headerWorker) != "B" {
		t.Fatalf("status %d from %q, want 200 from B", r.status, r.header.Get(headerWorker))
	}
	waitUntil(t, "the stream's end", func() bool { return ts.tracker.Counters("B").InFlight() == 0 })
	if got := metricValue(t, ts, `switchyard_slo_missed_total{model="llama",bucket="b",target="ttft"}`); got != 1 {
		t.Errorf("missed ttft = %v, want 1 (2.01 s from the start against 1 s)", got)
	}
}
