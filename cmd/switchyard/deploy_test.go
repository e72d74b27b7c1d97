package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"switchyard/bench/mockengine"
)

// The operator artefacts under deploy/ are checked against a running router: `switchyard
// serve` (runServe, as deployed) with a configuration file, in front of mock engines on
// loopback, after a short bounded load that takes every path whose metrics they read.

// deployDir is deploy/ of this checkout.
func deployDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../../deploy")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// observedRouter is a running router after the load, and what it exported.
type observedRouter struct {
	base    string
	scrape  string     // GET /metrics after the load
	exposed exposition // the scrape, parsed
}

// observeRouter starts the engines and `switchyard serve`, sends the load and scrapes
// /metrics. Everything is stopped at the end of the test.
//
// The deployment, each model taking some paths:
//   - llama: two plain engines, session_aware (sessions and new placements);
//   - llama-pd: a prefill and a decode engine (PD dispatch, streaming and not);
//   - switchyard-mock: two engines publishing KV events, cache_aware (the index, its event
//     lag, a miss then a cache hit);
//   - llama-capped: one engine held by a fault, admission max_inflight_requests 1 (an
//     admission rejection, a client that leaves);
//   - llama-flaky: one engine that answers 502 then fails its health checks (upstream
//     errors, an open breaker, no healthy engine);
//   - llama-queued: one engine held by a fault behind a concurrency limit of 1 and a queue
//     of 1 (a wait in the queue, a full queue), under router-wide limits;
//   - an unknown model and a malformed body (4xx).
func observeRouter(t *testing.T) *observedRouter {
	t.Helper()
	m1 := startMock(t, mockengine.Config{WorkerID: "m1", Model: "llama", ZeroCost: true})
	m2 := startMock(t, mockengine.Config{WorkerID: "m2", Model: "llama", ZeroCost: true})
	p1 := startMock(t, mockengine.Config{WorkerID: "p1", Model: "llama-pd", Role: mockengine.RolePrefill, Speedup: 50})
	d1 := startMock(t, mockengine.Config{WorkerID: "d1", Model: "llama-pd", Role: mockengine.RoleDecode, Speedup: 50})
	cache := startCacheEngines(t, 2) // KV events with a replay socket, model cacheModel
	c1, c2 := cache[0], cache[1]
	h1 := startMock(t, mockengine.Config{WorkerID: "h1", Model: "llama-capped", Speedup: 50})
	f1 := startMock(t, mockengine.Config{WorkerID: "f1", Model: "llama-flaky", ZeroCost: true})
	q1 := startMock(t, mockengine.Config{WorkerID: "q1", Model: "llama-queued", Speedup: 50})

	conf := fmt.Sprintf(`
server:
  host: 127.0.0.1
  port: 0
  drain_timeout: 5s
  max_concurrent_requests: 1000
  rate_limit: {requests_per_second: 1000, burst: 1000, per_key: {requests_per_second: 1000, burst: 1000}}
health: {interval: 100ms, timeout: 5s, failure_threshold: 1, success_threshold: 1, breaker_failures: 2, breaker_cooldown: 10m}
load: {poll_interval: 50ms}
kv: {reconnect_backoff: 20ms}
cache_aware: {min_matched_tokens: 128, query_timeout: 10s}
workers:
  - {id: m1, url: %q, model: llama}
  - {id: m2, url: %q, model: llama}
  - {id: p1, url: %q, model: llama-pd, role: prefill}
  - {id: d1, url: %q, model: llama-pd, role: decode}
  - {id: %s, url: %q, model: %s}
  - {id: %s, url: %q, model: %s}
  - {id: h1, url: %q, model: llama-capped}
  - {id: f1, url: %q, model: llama-flaky}
  - {id: q1, url: %q, model: llama-queued}
models:
  llama:
    buckets: [{id: all, groups: {plain: {policy: {type: session_aware}}}}]
  llama-pd:
    buckets: [{id: pd, groups: {pd: {prefill: {policy: {type: round_robin}}, decode: {policy: {type: power_of_two}}}}}]
  %s:
    buckets: [{id: all, groups: {plain: {policy: {type: cache_aware}}}}]
  llama-capped:
    buckets: [{id: all, groups: {plain: {policy: {type: round_robin, admission: {max_inflight_requests: 1}}}}}]
  llama-flaky:
    buckets: [{id: all, groups: {plain: {policy: {type: round_robin}}}}]
  llama-queued:
    max_concurrent_requests: 1
    queue_size: 1
    buckets: [{id: all, groups: {plain: {policy: {type: round_robin}}}}]
`, m1.URL(), m2.URL(), p1.URL(), d1.URL(), c1.WorkerID(), c1.URL(), cacheModel, c2.WorkerID(), c2.URL(), cacheModel, h1.URL(), f1.URL(), q1.URL(), cacheModel)
	base := runServeConfig(t, conf)
	waitReady(t, base)
	r := &observedRouter{base: base}

	// post sends a chat completion; it may run on any goroutine.
	post := func(ctx context.Context, model, body string, header map[string]string, want int) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			return err
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			return fmt.Errorf("%s: status %d, want %d: %s", model, resp.StatusCode, want, b)
		}
		return nil
	}
	send := func(model, body string, header map[string]string, want int) {
		t.Helper()
		if err := post(context.Background(), model, body, header, want); err != nil {
			t.Fatal(err)
		}
	}
	chat := func(model string, stream bool) string {
		return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Tell me about switchyards."}],"max_tokens":4,"stream":%t}`, model, stream)
	}

	// Plain, with and without a session, streaming and not; PD.
	for i := range 6 {
		send("llama", chat("llama", i%2 == 1), map[string]string{"X-Session-Id": fmt.Sprint("s", i%3)}, 200)
	}
	for i := range 4 {
		send("llama-pd", chat("llama-pd", i%2 == 1), nil, 200)
	}

	// cache_aware: a miss that the engine caches, then a hit once the index learned it.
	prefix := cachePrefix("deploy")
	if _, err := postChat(context.Background(), base, cacheMessages(prefix, "first"), 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the index learns the cached prefix", func() (bool, string) {
		n := metricValue(t, base+"/metrics", "switchyard_kv_index_blocks")
		return n > 0, fmt.Sprintf("%v blocks", n)
	})
	if _, err := postChat(context.Background(), base, cacheMessages(prefix, "second"), 1); err != nil {
		t.Fatal(err)
	}
	if n := metricValue(t, base+"/metrics", `switchyard_cache_aware_decisions_total{outcome="cache_candidate"}`); n < 1 {
		t.Fatalf("no cache hit after the index learned the prefix (%v)", n)
	}

	// Admission: one request held on h1 takes the only slot; the next is rejected; the held
	// client leaves before its answer.
	if err := h1.SetFaults(mockengine.Faults{Hang: true}); err != nil {
		t.Fatal(err)
	}
	held, leave := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() { left <- post(held, "llama-capped", chat("llama-capped", false), nil, http.StatusOK) }()
	waitFor(t, "h1 holds a request", func() (bool, string) {
		n := metricValue(t, base+"/metrics", `switchyard_worker_inflight_requests{worker="h1"}`)
		return n == 1, fmt.Sprintf("in flight %v", n)
	})
	send("llama-capped", chat("llama-capped", false), nil, http.StatusServiceUnavailable)
	leave()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("the held request ended with %v, want the client's cancellation", err)
	}
	// The router notices the client left when the engine answers.
	if err := h1.SetFaults(mockengine.Faults{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the held request ends", func() (bool, string) {
		n := metricValue(t, base+"/metrics", `switchyard_worker_inflight_requests{worker="h1"}`)
		return n == 0, fmt.Sprintf("in flight %v", n)
	})

	// Concurrency limit: one request held on q1 takes llama-queued's only slot, the next
	// waits in its queue of one, the third finds the queue full; then both are served.
	if err := q1.SetFaults(mockengine.Faults{Hang: true}); err != nil {
		t.Fatal(err)
	}
	const queued = `{scope="model",model="llama-queued"}`
	served := make(chan error, 2)
	for i, series := range []string{"switchyard_concurrent_requests" + queued, "switchyard_queue_depth" + queued} {
		go func() {
			served <- post(context.Background(), "llama-queued", chat("llama-queued", false), nil, http.StatusOK)
		}()
		waitFor(t, fmt.Sprintf("request %d is held", i+1), func() (bool, string) {
			n := metricValue(t, base+"/metrics", series)
			return n == 1, fmt.Sprintf("%s %v", series, n)
		})
	}
	send("llama-queued", chat("llama-queued", false), nil, http.StatusTooManyRequests)
	if err := q1.SetFaults(mockengine.Faults{}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-served; err != nil {
			t.Fatal(err)
		}
	}
	if n := metricValue(t, base+"/metrics", "switchyard_queue_wait_seconds_count"+queued); n != 1 {
		t.Fatalf("queue waits counted: %v, want 1", n)
	}

	// Client errors.
	send("none", chat("no-such-model", false), nil, http.StatusNotFound)
	send("bad", `{"model":`, nil, http.StatusBadRequest)

	// An engine that fails: its answers pass through, its breaker opens, then its health
	// checks fail and the model has no healthy engine.
	if err := f1.SetFaults(mockengine.Faults{Status: 502}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		send("llama-flaky", chat("llama-flaky", false), nil, http.StatusBadGateway)
	}
	if n := metricValue(t, base+"/metrics", `switchyard_worker_breaker_state{worker="f1"}`); n != 1 {
		t.Fatalf("f1 breaker state %v after 2 failures, want 1 (open)", n)
	}
	if err := f1.SetFaults(mockengine.Faults{Status: 502, Unhealthy: true}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "llama-flaky has no healthy engine", func() (bool, string) {
		n := metricValue(t, base+"/metrics", `switchyard_healthy_workers{model="llama-flaky",role="plain"}`)
		return n == 0, fmt.Sprintf("%v healthy", n)
	})

	status, body, err := httpGet(base + "/metrics")
	if err != nil || status != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", status, err)
	}
	r.scrape = string(body)
	r.exposed, err = parseExposition(r.scrape)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestDeployArtifactsMatchARunningRouter: every metric and label the dashboard's queries and
// variables, and the alert rules, refer to is exported by a running router (a renamed metric
// or label fails here, not on an operator's screen), every switchyard_* family it exports is
// in docs/operations.md with the values of its fixed labels, and the paths the Kubernetes manifests probe and scrape are served.
func TestDeployArtifactsMatchARunningRouter(t *testing.T) {
	r := observeRouter(t)
	dir := deployDir(t)

	t.Run("dashboard", func(t *testing.T) {
		d := loadDashboard(t, filepath.Join(dir, "grafana", "switchyard.json"))
		if len(d.exprs) < 20 {
			t.Fatalf("only %d queries in the dashboard", len(d.exprs))
		}
		for _, e := range d.exprs {
			for _, p := range checkQuery(r.exposed, e.expr) {
				t.Errorf("panel %q: %s", e.where, p)
			}
		}
		for _, v := range d.variables {
			for _, p := range checkQuery(r.exposed, v.expr) {
				t.Errorf("variable %s: %s", v.where, p)
			}
			if !r.exposed[v.selector][v.label] && !slices.Contains(targetLabels, v.label) {
				t.Errorf("variable %s: %s has no label %s", v.where, v.selector, v.label)
			}
		}
	})
	t.Run("alerts", func(t *testing.T) {
		for _, rule := range loadAlertRules(t, filepath.Join(dir, "prometheus", "alerts.yaml")) {
			for _, p := range checkQuery(r.exposed, rule.Expr) {
				t.Errorf("alert %s: %s", rule.Alert, p)
			}
			// An annotation can only name the labels the alert's series carry.
			out := alertOutputLabels(r.exposed, rule.Expr)
			for name, text := range rule.Annotations {
				for _, m := range templateLabel.FindAllStringSubmatch(text, -1) {
					if !out[m[1]] {
						t.Errorf("alert %s: annotation %s names $labels.%s, which its series do not carry", rule.Alert, name, m[1])
					}
				}
			}
		}
	})
	t.Run("metric kinds", func(t *testing.T) {
		for _, p := range checkMetricKinds(r.scrape) {
			t.Error(p)
		}
	})
	t.Run("metrics documented", func(t *testing.T) {
		doc, err := os.ReadFile("../../docs/operations.md")
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range undocumentedMetrics(r.scrape, string(doc)) {
			t.Errorf("%s is exported but not in docs/operations.md's metric reference", name)
		}
		// The values of the labels with a fixed set (fixedLabels) are named where the
		// reference describes their metric.
		for _, series := range undocumentedLabelValues(r.scrape, string(doc)) {
			t.Errorf("%s is exported but docs/operations.md does not name the value where it describes the metric", series)
		}
	})
	t.Run("kubernetes probes and scrape", func(t *testing.T) {
		m := loadManifests(t, filepath.Join(dir, "kubernetes"))
		c := m.container(t)
		probes := []struct {
			what, path string
			want       int
		}{
			{"liveness probe", c.LivenessProbe.HTTPGet.Path, http.StatusOK},
			{"startup probe", c.StartupProbe.HTTPGet.Path, http.StatusOK},
			// llama-flaky has no healthy engine: not ready, but served.
			{"readiness probe", c.ReadinessProbe.HTTPGet.Path, http.StatusServiceUnavailable},
			{"scrape", m.deployment.Spec.Template.Metadata.Annotations["prometheus.io/path"], http.StatusOK},
		}
		for _, p := range probes {
			status, body, err := httpGet(r.base + p.path)
			if err != nil || status != p.want {
				t.Errorf("%s: GET %s: %d %v %s, want %d", p.what, p.path, status, err, body, p.want)
			}
		}
	})
}
