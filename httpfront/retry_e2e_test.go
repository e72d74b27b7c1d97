package httpfront

import (
	"cmp"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"switchyard/config"
)

// retryConfig is a plain bucket over the engines, round robin (the first request goes to
// the first engine by ID), with retries that wait a millisecond.
func retryConfig(engines ...*fakeEngine) *config.Config {
	cfg := baseConfig()
	ids := make([]string, 0, len(engines))
	for _, e := range engines {
		cfg.Workers = append(cfg.Workers, plainWorker(e.id, e.url, "llama"))
		ids = append(ids, e.id)
	}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, ids...)}}}
	cfg.Retry.InitialBackoff = time.Millisecond
	cfg.Retry.MaxBackoff = 2 * time.Millisecond
	return cfg
}

func attemptsOf(t *testing.T, r response) int {
	t.Helper()
	n, err := strconv.Atoi(r.header.Get(headerAttempts))
	if err != nil {
		t.Fatalf("%s = %q: %v", headerAttempts, r.header.Get(headerAttempts), err)
	}
	return n
}

// TestRetryTakesAnotherEngine: a dispatch that fails before any byte reached the client —
// an engine's 503, a refused connection, no response headers in time — is retried on
// another engine of the bucket; the client gets that engine's answer, the response says it
// took two attempts, and the retry is counted by reason.
func TestRetryTakesAnotherEngine(t *testing.T) {
	tests := []struct {
		name   string
		break_ func(t *testing.T, a *fakeEngine, cfg *config.Config)
		reason string
		hitsA  int64
	}{
		{"an engine's 503", func(_ *testing.T, a *fakeEngine, _ *config.Config) { a.fail.Store(503) }, "status_503", 1},
		{"a refused connection", func(_ *testing.T, a *fakeEngine, _ *config.Config) { a.kill() }, "transport", 0},
		{"no response headers in time", func(_ *testing.T, a *fakeEngine, cfg *config.Config) {
			a.delay = make(chan struct{})
			cfg.Upstream.ResponseHeaderTimeout = 100 * time.Millisecond
		}, "timeout", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Round robin over two engines: every request is offered to A first.
			a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
			cfg := retryConfig(a, b)
			cfg.Health.BreakerEnabled = false // A stays in the rotation
			tt.break_(t, a, cfg)
			ts := startServer(t, cfg, Options{NoTelemetry: true, SkipStartupChecks: true})
			for _, stream := range []string{"", `"stream":true`} {
				r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", stream))
				if r.status != 200 || r.header.Get(headerWorker) == "A" {
					t.Fatalf("stream=%q: %d %s from %s", stream, r.status, r.body, r.header.Get(headerWorker))
				}
				if stream != "" && strings.Count(string(r.body), "data: [DONE]") != 1 {
					t.Fatalf("the retried stream: %q", r.body)
				}
				if n := attemptsOf(t, r); n != 2 {
					t.Fatalf("stream=%q: %d attempts, want 2", stream, n)
				}
			}
			if got := a.hits.Load(); got != 2*tt.hitsA {
				t.Errorf("A served %d requests, want %d", got, 2*tt.hitsA)
			}
			if got := metricValue(t, ts, `switchyard_retries_total{reason="`+tt.reason+`"}`); got != 2 {
				t.Errorf("retries{%s} = %v, want 2", tt.reason, got)
			}
		})
	}
}

// TestRetryForwardsClientHeaders: the retry's request to the other engine carries the
// client's forwarded headers as the first attempt's did (the dispatch is rebuilt in place
// for each attempt, and keeps them).
func TestRetryForwardsClientHeaders(t *testing.T) {
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	a.fail.Store(503)
	cfg := retryConfig(a, b)
	cfg.Health.BreakerEnabled = false
	ts := startServer(t, cfg, Options{NoTelemetry: true, SkipStartupChecks: true})
	want := map[string]string{"X-Request-Id": "req-7", "Traceparent": "00-abc-01", "X-Session-Id": "s7"}
	r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""),
		"X-Request-Id", want["X-Request-Id"], "Traceparent", want["Traceparent"], "X-Session-Id", want["X-Session-Id"])
	if r.status != 200 || r.header.Get(headerWorker) != "B" || attemptsOf(t, r) != 2 {
		t.Fatalf("%d %s from %s after %s attempts", r.status, r.body, r.header.Get(headerWorker), r.header.Get(headerAttempts))
	}
	for _, e := range []*fakeEngine{a, b} {
		_, hs := e.received()
		if len(hs) != 1 {
			t.Fatalf("engine %s got %d requests, want 1", e.id, len(hs))
		}
		for k, v := range want {
			if got := hs[0].Get(k); got != v {
				t.Errorf("engine %s: %s = %q, want %q", e.id, k, got, v)
			}
		}
	}
}

// TestStreamThatStartedIsNotRetried: once the engine's stream has begun, its failure ends
// the client's stream with an error event and no retry.
func TestStreamThatStartedIsNotRetried(t *testing.T) {
	a := newKeepAliveEngine(t, "A", "", 0)
	a.breakStream = true
	b := newFakeEngine(t, "B", "llama")
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", a.url, "llama"), plainWorker("B", b.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A", "B")}}}
	ts := startServer(t, cfg, Options{NoTelemetry: true, SkipStartupChecks: true})
	r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", `"stream":true`))
	if r.status != 200 || r.header.Get(headerWorker) != "A" || !contains(r.body, `"code":"upstream_error"`) {
		t.Fatalf("broken stream: %d %s from %s", r.status, r.body, r.header.Get(headerWorker))
	}
	if n := attemptsOf(t, r); n != 1 || b.hits.Load() != 0 {
		t.Fatalf("%d attempts, B served %d: a started stream was retried", n, b.hits.Load())
	}
	if got := metricValue(t, ts, `switchyard_retries_total{reason="transport"}`); got != 0 {
		t.Fatalf("retries = %v", got)
	}
}

// TestStreamNotBegunIsRetried: an engine that answers a stream's headers and then fails
// before its first event has sent the client nothing: the stream is retried on another
// engine, and the client gets one whole stream.
func TestStreamNotBegunIsRetried(t *testing.T) {
	a := newKeepAliveEngine(t, "A", "", 0)
	a.dieBeforeEvent = true
	b := newFakeEngine(t, "B", "llama")
	cfg := retryConfig(b)
	cfg.Workers = append(cfg.Workers, plainWorker("A", a.url, "llama"))
	cfg.Models["llama"].Buckets[0] = plainBucket("b", nil, nil, "A", "B")
	ts := startServer(t, cfg, Options{NoTelemetry: true, SkipStartupChecks: true})
	r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", `"stream":true`))
	if r.status != 200 || r.header.Get(headerWorker) != "B" || attemptsOf(t, r) != 2 || contains(r.body, `"error"`) ||
		strings.Count(string(r.body), "data: [DONE]") != 1 {
		t.Fatalf("%d %q from %s after %s attempts", r.status, r.body, r.header.Get(headerWorker), r.header.Get(headerAttempts))
	}
	if a.requests.Load() != 1 {
		t.Fatalf("A served %d requests", a.requests.Load())
	}
	if got := metricValue(t, ts, `switchyard_retries_total{reason="transport"}`); got != 1 {
		t.Fatalf("retries = %v", got)
	}
}

// TestRetryOnlyWhatIsRetryable: a client error is the client's answer; a 500 is too, unless
// retry.retryable_statuses names it; nothing is retried with retries off.
func TestRetryOnlyWhatIsRetryable(t *testing.T) {
	tests := []struct {
		name     string
		status   int32
		mutate   func(*config.Retry)
		want     int
		attempts int
	}{
		{"a 400 is the client's", 400, nil, 400, 1},
		{"a 500 by default", 500, nil, 500, 1},
		{"a 500 when configured", 500, func(r *config.Retry) { r.RetryableStatuses = []int{500, 502, 503, 504} }, 200, 2},
		{"a 503 with retries off", 503, func(r *config.Retry) { r.Enabled = false }, 503, 1},
		{"a 503 with max_retries 0", 503, func(r *config.Retry) { r.MaxRetries = 0 }, 503, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
			a.fail.Store(tt.status)
			cfg := retryConfig(a, b)
			if tt.mutate != nil {
				tt.mutate(&cfg.Retry)
			}
			ts := startServer(t, cfg, Options{NoTelemetry: true, SkipStartupChecks: true})
			r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
			if r.status != tt.want || attemptsOf(t, r) != tt.attempts {
				t.Fatalf("%d %s after %s attempts, want %d after %d", r.status, r.body, r.header.Get(headerAttempts), tt.want, tt.attempts)
			}
			if tt.want != 200 && !contains(r.body, "injected failure") {
				t.Fatalf("the engine's own answer was not passed on: %s", r.body)
			}
		})
	}
}

// TestRetryLimits: a request is tried at most 1 + max_retries times, and answered with the
// last engine's answer; with no other engine left it is answered at once, without waiting
// for a backoff or spending the budget.
func TestRetryLimits(t *testing.T) {
	t.Run("max_retries", func(t *testing.T) {
		engines := []*fakeEngine{newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama"),
			newFakeEngine(t, "C", "llama"), newFakeEngine(t, "D", "llama")}
		for _, e := range engines {
			e.fail.Store(503)
		}
		ts := startServer(t, retryConfig(engines...), Options{NoTelemetry: true, SkipStartupChecks: true})
		r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
		if r.status != 503 || !contains(r.body, "injected failure") || attemptsOf(t, r) != 3 {
			t.Fatalf("%d %s after %s attempts, want the third engine's 503", r.status, r.body, r.header.Get(headerAttempts))
		}
		served := 0
		for _, e := range engines {
			if n := e.hits.Load(); n > 1 {
				t.Fatalf("engine %s tried %d times for one request", e.id, n)
			} else if n == 1 {
				served++
				if r.header.Get(headerWorker) == e.id && e.id == "A" {
					t.Fatal("the answer is the first attempt's")
				}
			}
		}
		if served != 3 {
			t.Fatalf("%d engines tried, want 3", served)
		}
	})
	t.Run("no engine left", func(t *testing.T) {
		a := newFakeEngine(t, "A", "llama")
		a.fail.Store(503)
		cfg := retryConfig(a)
		// A backoff this long would outlast the test client: the request must not wait.
		cfg.Retry.InitialBackoff, cfg.Retry.MaxBackoff = time.Hour, time.Hour
		cfg.Server.RequestTimeout = 3 * time.Hour
		ts := startServer(t, cfg, Options{NoTelemetry: true, SkipStartupChecks: true})
		r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
		if r.status != 503 || !contains(r.body, "injected failure") || attemptsOf(t, r) != 1 || r.header.Get(headerWorker) != "A" {
			t.Fatalf("%d %s after %s attempts from %s", r.status, r.body, r.header.Get(headerAttempts), r.header.Get(headerWorker))
		}
		if got := metricValue(t, ts, `switchyard_retries_total{reason="status_503"}`); got != 0 {
			t.Fatalf("retries = %v for a request with no engine left", got)
		}
	})
}

// TestRetryBudgetStopsAStorm: with every engine failing, retries stay within the budget's
// share of the requests, and the refusals are counted.
func TestRetryBudgetStopsAStorm(t *testing.T) {
	engines := []*fakeEngine{newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama"), newFakeEngine(t, "C", "llama")}
	for _, e := range engines {
		e.fail.Store(502)
	}
	cfg := retryConfig(engines...)
	cfg.Health.BreakerEnabled = false // keep every engine in the storm
	cfg.Retry.Budget = config.RetryBudget{Ratio: 0.2, MinRetriesPerSecond: 0, Window: time.Hour}
	ts := startServer(t, cfg, Options{NoTelemetry: true, SkipStartupChecks: true})
	const n = 50
	for i := range n {
		if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", "")); r.status != 502 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	retries := metricValue(t, ts, `switchyard_retries_total{reason="status_502"}`)
	refused := metricValue(t, ts, "switchyard_retry_budget_exhausted_total")
	if retries != 0.2*n {
		t.Errorf("%v retries for %d failing requests, want %v (ratio 0.2); without the budget: %d", retries, n, 0.2*n, 2*n)
	}
	if refused != n {
		// Every request ends at a refusal: of its first retry, or of its second.
		t.Errorf("%v refusals for %d requests, each of which failed until the budget refused", refused, n)
	}
	var hits int64
	for _, e := range engines {
		hits += e.hits.Load()
	}
	if float64(hits) != n+retries {
		t.Errorf("engines served %d requests, want %v", hits, n+retries)
	}
}

// TestRetryBackoffEndsWhenClientLeaves: a request waiting for its retry is dropped as soon
// as its client closes the connection; it is never dispatched again.
func TestRetryBackoffEndsWhenClientLeaves(t *testing.T) {
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	a.fail.Store(503)
	cfg := retryConfig(a, b)
	clock := newFakeClock() // never advanced: the backoff ends only when the client leaves
	clock.scheduled = make(chan time.Duration, 4)
	clock.stopped = make(chan struct{}, 4)
	ts := startServer(t, cfg, Options{NoTelemetry: true, SkipStartupChecks: true, Clock: clock})

	conn := sendChat(t, ts, chatBody("llama", "hi", ""))
	select {
	case d := <-clock.scheduled:
		if d <= 0 || d > cfg.Retry.MaxBackoff {
			t.Fatalf("backoff %v", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the request never waited for its retry")
	}
	_ = conn.Close()
	waitFor(t, clock.stopped, "the backoff to end when the client left")
	ts.stop(t) // the handler has returned: nothing can dispatch any more
	if a.hits.Load() != 1 || b.hits.Load() != 0 {
		t.Fatalf("A served %d, B %d: the abandoned request was retried", a.hits.Load(), b.hits.Load())
	}
}

// TestRetryAfterConnectionLimit: an engine whose every connection is busy (the router's own
// limit) is left out at once and the request goes to another engine, without a retry.
func TestRetryAfterConnectionLimit(t *testing.T) {
	a := newFakeEngine(t, "A", "llama", withGate())
	b := newFakeEngine(t, "B", "llama")
	cfg := retryConfig(a, b)
	cfg.Upstream.MaxConnsPerWorker = 1
	ts := startServer(t, cfg, Options{NoTelemetry: true, SkipStartupChecks: true})
	held := make(chan response, 1)
	go func() { held <- post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", `"stream":true`)) }()
	waitFor(t, a.streamed, "a stream to hold A's only connection")
	for i := range 4 { // round robin offers A every other time
		r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
		if r.status != 200 || r.header.Get(headerWorker) != "B" || attemptsOf(t, r) != 1 {
			t.Fatalf("request %d: %d %s from %s after %s attempts", i, r.status, r.body, r.header.Get(headerWorker), r.header.Get(headerAttempts))
		}
	}
	if got := metricValue(t, ts, `switchyard_router_errors_total{kind="connection_limit"}`); got < 1 {
		t.Fatal("the connection limit was never met")
	}
	close(a.gate)
	if r := <-held; r.status != 200 {
		t.Fatalf("held stream: %d", r.status)
	}
}

// TestRetryRebindsSession: a session bound to an engine that fails is retried on another
// engine, which its policy binds the session to: the session's next requests follow it.
func TestRetryRebindsSession(t *testing.T) {
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	cfg := retryConfig(a, b)
	cfg.Models["llama"].Buckets[0].Groups.Plain.Policy = &config.Policy{Type: config.PolicySessionAware}
	ts := startServer(t, cfg, Options{NoTelemetry: true, SkipStartupChecks: true, Seed: 7})
	first := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""), "X-Session-Id", "s1")
	bound := first.header.Get(headerWorker)
	engines := map[string]*fakeEngine{"A": a, "B": b}
	other := map[string]string{"A": "B", "B": "A"}[bound]
	if first.status != 200 || engines[bound] == nil {
		t.Fatalf("first request: %d from %q", first.status, bound)
	}
	engines[bound].fail.Store(503)
	r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""), "X-Session-Id", "s1")
	if r.status != 200 || r.header.Get(headerWorker) != other || attemptsOf(t, r) != 2 {
		t.Fatalf("retried session request: %d from %s after %s attempts", r.status, r.header.Get(headerWorker), r.header.Get(headerAttempts))
	}
	engines[bound].fail.Store(0)
	for range 3 {
		if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""), "X-Session-Id", "s1"); r.header.Get(headerWorker) != other {
			t.Fatalf("the session went back to %s after its retry rebound it to %s", r.header.Get(headerWorker), other)
		}
	}
}

// pdRetryConfig has two compatible PD buckets: short (prefill P1, P2; decode D1) and long
// (prefill P3; decode D3). Each prefill advertises its own bootstrap port.
func pdRetryConfig(p1, p2, d1, p3, d3 *fakeEngine) *config.Config {
	cfg := baseConfig()
	cfg.Retry.InitialBackoff, cfg.Retry.MaxBackoff = time.Millisecond, 2*time.Millisecond
	for i, p := range []*fakeEngine{p1, p2, p3} {
		port := 9001 + i
		cfg.Workers = append(cfg.Workers, config.Worker{ID: p.id, URL: p.url, Model: "llama", Role: config.RolePrefill, BootstrapPort: &port, DPSize: 1})
	}
	for _, d := range []*fakeEngine{d1, d3} {
		cfg.Workers = append(cfg.Workers, config.Worker{ID: d.id, URL: d.url, Model: "llama", Role: config.RoleDecode, DPSize: 1})
		d.expectHost, d.anyPort = "127.0.0.1", true
	}
	pd := func(id string, max *int64, prefill, decode []string) config.Bucket {
		return config.Bucket{ID: id, Limits: config.Limits{Max: max}, Groups: config.Groups{PD: &config.PDGroups{
			Prefill: &config.Group{WorkerIDs: &prefill}, Decode: &config.Group{WorkerIDs: &decode}}}}
	}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{
		pd("short", ptr[int64](4096), []string{"P1", "P2"}, []string{"D1"}),
		pd("long", nil, []string{"P3"}, []string{"D3"}),
	}}}
	return cfg
}

// bootstrapPorts returns the bootstrap_port of every request a decode engine received.
func bootstrapPorts(t *testing.T, d *fakeEngine) map[int]bool {
	t.Helper()
	bodies, _ := d.received()
	ports := map[int]bool{}
	for _, b := range bodies {
		var req struct {
			Port int `json:"bootstrap_port"`
		}
		if err := json.Unmarshal(b, &req); err != nil {
			t.Fatal(err)
		}
		ports[req.Port] = true
	}
	return ports
}

// TestRetryPDPair: a failed prefill or decode retries the pair, in the same bucket first,
// without the engine that failed, then in the next compatible bucket; no attempt ever pairs
// engines of two buckets (each decode engine hears only of its own bucket's prefills).
func TestRetryPDPair(t *testing.T) {
	tests := []struct {
		name                    string
		fail                    []string // engines answering status (503 when 0)
		status                  int32
		bucket, prefill, decode string
		attempts                int
		d1Ports, d3Ports        []int
	}{
		{"prefill fails: its bucket's other prefill", []string{"P1"}, 0, "short", "P2", "D1", 2, []int{9001, 9002}, nil},
		{"both prefills of the bucket fail: the next bucket's pair", []string{"P1", "P2"}, 0, "long", "P3", "D3", 3, []int{9001, 9002}, []int{9003}},
		{"decode fails: the next bucket's pair", []string{"D1"}, 0, "long", "P3", "D3", 2, []int{9001}, []int{9003}},
		{"prefill answers a retryable 429", []string{"P1"}, 429, "short", "P2", "D1", 2, []int{9001, 9002}, nil},
	}
	for _, tt := range tests {
		for _, stream := range []string{"", `"stream":true`} {
			t.Run(tt.name+" "+stream, func(t *testing.T) {
				p1, p2, p3 := newFakeEngine(t, "P1", "llama", withMode("prefill")), newFakeEngine(t, "P2", "llama", withMode("prefill")),
					newFakeEngine(t, "P3", "llama", withMode("prefill"))
				d1, d3 := newFakeEngine(t, "D1", "llama", withMode("decode")), newFakeEngine(t, "D3", "llama", withMode("decode"))
				all := map[string]*fakeEngine{"P1": p1, "P2": p2, "P3": p3, "D1": d1, "D3": d3}
				for _, id := range tt.fail {
					all[id].fail.Store(cmp.Or(tt.status, 503))
				}
				cfg := pdRetryConfig(p1, p2, d1, p3, d3)
				cfg.Retry.RetryableStatuses = []int{429, 502, 503, 504}
				ts := startServer(t, cfg, Options{NoTelemetry: true, SkipStartupChecks: true})
				r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", stream))
				if r.status != 200 || r.header.Get(headerBucket) != tt.bucket || r.header.Get(headerPrefillWorker) != tt.prefill ||
					r.header.Get(headerWorker) != tt.decode || attemptsOf(t, r) != tt.attempts {
					t.Fatalf("%d %s: bucket %s, prefill %s, decode %s after %s attempts", r.status, r.body, r.header.Get(headerBucket),
						r.header.Get(headerPrefillWorker), r.header.Get(headerWorker), r.header.Get(headerAttempts))
				}
				if stream != "" && (strings.Count(string(r.body), "data: [DONE]") != 1 || strings.Count(string(r.body), `"id":"c0"`) != 1) {
					t.Fatalf("the client got more than the retried pair's stream: %q", r.body)
				}
				for d, want := range map[*fakeEngine][]int{d1: tt.d1Ports, d3: tt.d3Ports} {
					got := bootstrapPorts(t, d)
					if len(got) != len(want) {
						t.Errorf("decode %s was paired with prefill ports %v, want %v", d.id, got, want)
					}
					for _, p := range want {
						if !got[p] {
							t.Errorf("decode %s was paired with prefill ports %v, want %v", d.id, got, want)
						}
					}
				}
			})
		}
	}
}

// TestRetryPDPrefillFailsAfterDecodeStreamed: the decode engine has begun its stream to the
// router when the prefill fails; nothing of it has reached the client, so the pair is
// retried and the client gets one whole stream.
func TestRetryPDPrefillFailsAfterDecodeStreamed(t *testing.T) {
	p1, p2, p3 := newFakeEngine(t, "P1", "llama", withMode("prefill")), newFakeEngine(t, "P2", "llama", withMode("prefill")),
		newFakeEngine(t, "P3", "llama", withMode("prefill"))
	d1, d3 := newFakeEngine(t, "D1", "llama", withMode("decode")), newFakeEngine(t, "D3", "llama", withMode("decode"))
	p1.delay = make(chan struct{})
	p1.fail.Store(503)
	ts := startServer(t, pdRetryConfig(p1, p2, d1, p3, d3), Options{NoTelemetry: true, SkipStartupChecks: true})
	done := make(chan response, 1)
	go func() { done <- post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", `"stream":true`)) }()
	waitFor(t, d1.streamed, "the decode engine's first event")
	close(p1.delay) // the prefill now fails
	r := <-done
	if r.status != 200 || r.header.Get(headerPrefillWorker) != "P2" || attemptsOf(t, r) != 2 {
		t.Fatalf("%d %s: prefill %s after %s attempts", r.status, r.body, r.header.Get(headerPrefillWorker), r.header.Get(headerAttempts))
	}
	if strings.Count(string(r.body), `"id":"c0"`) != 1 || strings.Count(string(r.body), "data: [DONE]") != 1 {
		t.Fatalf("the failed pair's stream reached the client: %q", r.body)
	}
}
