package httpfront

import (
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"switchyard/config"
	"switchyard/httpfront/fleet"
)

// TestHalfOpenEngineGetsOneProbe: an engine that hangs on inference but answers /health gets
// one request when its breaker turns half-open — when the cool-down ends, not at a health
// round — and every other request meanwhile goes to the other engine.
func TestHalfOpenEngineGetsOneProbe(t *testing.T) {
	a := newFakeEngine(t, "A", "llama")
	a.hold = make(chan struct{}) // answers wait here once a.fail is cleared
	b := newFakeEngine(t, "B", "llama")
	cfg := baseConfig()
	cfg.Health.BreakerFailures = 2
	cfg.Retry.Enabled = false // the breaker alone: a retry would wait for the fake clock
	cfg.Workers = []config.Worker{plainWorker("A", a.url, "llama"), plainWorker("B", b.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A", "B")}}}
	clock := newFakeClock()
	ts := startServer(t, cfg, Options{Clock: clock, NoTelemetry: true})
	m := ts.workers.Member("A")

	a.fail.Store(502)
	for i := 0; i < 8 && m.Breaker().State() != fleet.BreakerOpen; i++ {
		post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
	}
	if m.Breaker().State() != fleet.BreakerOpen {
		t.Fatal("breaker did not open")
	}
	a.fail.Store(0) // A now hangs on inference; its /health still answers 200
	hits := a.hits.Load()
	clock.Advance(cfg.Health.BreakerCooldown)
	if !ts.Workers().Worker("A").Healthy() {
		t.Fatal("the cool-down's end did not let A take its probe")
	}

	const n = 20
	type result struct {
		status int
		worker string
	}
	results := make(chan result, n)
	for range n {
		go func() {
			r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
			results <- result{r.status, r.header.Get(headerWorker)}
		}()
	}
	for i := range n - 1 {
		select {
		case r := <-results:
			if r.status != 200 || r.worker != "B" {
				t.Fatalf("request %d during the probe: status %d from %q", i, r.status, r.worker)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("only %d requests came back", i)
		}
	}
	if got := a.hits.Load() - hits; got != 1 {
		t.Fatalf("the half-open engine got %d requests, want exactly one probe", got)
	}
	close(a.hold) // the engine recovers: the probe succeeds
	if r := <-results; r.status != 200 || r.worker != "A" {
		t.Fatalf("probe: status %d from %q", r.status, r.worker)
	}
	if m.Breaker().State() != fleet.BreakerClosed || !ts.Workers().Worker("A").Healthy() {
		t.Fatalf("breaker %v after a good probe", m.Breaker().State())
	}
}

// TestConnectionLimitIsTheRouters: a request that finds every connection the router may open
// to its engine busy fails at once with 503 upstream_connection_limit, and the engine is not
// charged.
func TestConnectionLimitIsTheRouters(t *testing.T) {
	a := newFakeEngine(t, "A", "llama", withGate())
	cfg := baseConfig()
	cfg.Health.BreakerFailures = 1
	cfg.Upstream.MaxConnsPerWorker = 1
	cfg.Workers = []config.Worker{plainWorker("A", a.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A")}}}
	ts := startServer(t, cfg, Options{NoTelemetry: true})

	first := make(chan response, 1)
	go func() { first <- post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", `"stream":true`)) }()
	waitFor(t, a.streamed, "the first stream to hold the only connection")
	for range 3 {
		start := time.Now()
		r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
		if r.status != 503 || r.errorCode() != CodeConnectionLimit || !contains(r.body, "max_conns_per_worker") {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
		if el := time.Since(start); el > 5*time.Second {
			t.Fatalf("a full pool took %v to answer", el)
		}
	}
	if m := ts.workers.Member("A"); m.Breaker().State() != fleet.BreakerClosed || !ts.Workers().Worker("A").Healthy() {
		t.Fatal("the engine was charged with the router's connection limit")
	}
	if got := metricValue(t, ts, `switchyard_router_errors_total{kind="connection_limit"}`); got != 3 {
		t.Fatalf("router errors %v, want 3", got)
	}
	close(a.gate)
	if r := <-first; r.status != 200 || !strings.HasSuffix(string(r.body), "data: [DONE]\n\n") {
		t.Fatalf("held stream: %d %s", r.status, r.body)
	}
}

// TestOutOfDescriptorsIsTheRouters: a dial that fails for want of file descriptors is 503
// router_out_of_resources and leaves the engine in service, however often it happens.
func TestOutOfDescriptorsIsTheRouters(t *testing.T) {
	a := newFakeEngine(t, "A", "llama")
	cfg := baseConfig()
	cfg.Health.BreakerFailures = 1
	cfg.Workers = []config.Worker{plainWorker("A", a.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A")}}}
	var exhausted atomic.Bool
	dial := func(network, addr string, timeout time.Duration) (net.Conn, error) {
		if exhausted.Load() {
			return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("socket", syscall.EMFILE)}
		}
		return (&net.Dialer{Timeout: timeout}).Dial(network, addr)
	}
	ts := startServer(t, cfg, Options{NoTelemetry: true, Dial: dial})
	ts.workers.Member("A").Upstream().CloseIdle() // every request needs a new connection
	exhausted.Store(true)
	for range 5 {
		r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
		if r.status != 503 || r.errorCode() != CodeRouterResources || !strings.Contains(string(r.body), "too many open files") {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
	}
	if !ts.Workers().Worker("A").Healthy() {
		t.Fatal("the engine was charged with the router's missing file descriptors")
	}
	if got := metricValue(t, ts, `switchyard_router_errors_total{kind="out_of_resources"}`); got != 5 {
		t.Fatalf("router errors %v, want 5", got)
	}
	exhausted.Store(false)
	if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", "")); r.status != 200 {
		t.Fatalf("after the descriptors came back: %d %s", r.status, r.body)
	}
}

// TestResponseHeaderTimeoutEndToEnd: an engine that takes a request and never answers costs
// upstream.response_header_timeout, not server.request_timeout.
func TestResponseHeaderTimeoutEndToEnd(t *testing.T) {
	a := newFakeEngine(t, "A", "llama")
	a.hold = make(chan struct{})
	cfg := baseConfig()
	cfg.Upstream.ResponseHeaderTimeout = 200 * time.Millisecond
	cfg.Workers = []config.Worker{plainWorker("A", a.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A")}}}
	ts := startServer(t, cfg, Options{NoTelemetry: true})
	start := time.Now()
	r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
	if r.status != 504 || r.errorCode() != CodeUpstreamTimeout || !contains(r.body, "response headers") {
		t.Fatalf("status %d body %s", r.status, r.body)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("the frozen engine cost %v", el)
	}
	close(a.hold)
}
