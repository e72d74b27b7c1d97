package httpfront

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"switchyard/config"
	"switchyard/httpfront/fleet"
)

// fakeTelemetry records StartWorker and StopWorker calls.
type fakeTelemetry struct {
	mu      sync.Mutex
	started map[string]TelemetrySource
	stopped []string
	// added, when set, receives the ID of every worker whose telemetry starts.
	added chan string
}

func (f *fakeTelemetry) StartWorker(src TelemetrySource) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.started == nil {
		f.started = map[string]TelemetrySource{}
	}
	f.started[src.WorkerID] = src
	if f.added != nil {
		f.added <- src.WorkerID
	}
	return nil
}

func (f *fakeTelemetry) StopWorker(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = append(f.stopped, id)
}

var _ Telemetry = (*fakeTelemetry)(nil)

func twoWorkerServer(t *testing.T, mutate func(*config.Config), opts Options) (*testServer, *fakeEngine, *fakeEngine) {
	a := newFakeEngine(t, "A", "llama")
	b := newFakeEngine(t, "B", "llama")
	cfg := baseConfig()
	cfg.Health.FailureThreshold = 2
	cfg.Health.SuccessThreshold = 2
	cfg.Workers = []config.Worker{plainWorker("A", a.url, "llama"), plainWorker("B", b.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A", "B")}}}
	if mutate != nil {
		mutate(cfg)
	}
	return startServer(t, cfg, opts), a, b
}

func TestUnhealthyEngineLeavesAndReturns(t *testing.T) {
	ts, a, b := twoWorkerServer(t, nil, Options{})
	st := ts.workers.Member("A")
	ctx := context.Background()

	a.health.Store(503)
	ts.workers.CheckOnce(ctx, st)
	if !ts.Workers().Worker("A").Healthy() {
		t.Fatal("one failure is below the threshold of 2")
	}
	ts.workers.CheckOnce(ctx, st)
	if ts.Workers().Worker("A").Healthy() {
		t.Fatal("A still healthy after 2 failed checks")
	}
	if r := get(t, ts.url+"/readiness"); r.status != 200 {
		t.Errorf("readiness %d with B healthy", r.status)
	}
	before := a.hits.Load()
	for range 6 {
		if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", "")); r.header.Get(headerWorker) != "B" {
			t.Fatalf("request went to %q while A is unhealthy", r.header.Get(headerWorker))
		}
	}
	if a.hits.Load() != before {
		t.Fatal("unhealthy engine received traffic")
	}

	a.health.Store(0)
	ts.workers.CheckOnce(ctx, st)
	if ts.Workers().Worker("A").Healthy() {
		t.Fatal("one success is below the threshold of 2")
	}
	ts.workers.CheckOnce(ctx, st)
	if !ts.Workers().Worker("A").Healthy() {
		t.Fatal("A not back after 2 good checks")
	}
	seen := map[string]bool{}
	for range 4 {
		seen[post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", "")).header.Get(headerWorker)] = true
	}
	if !seen["A"] || !seen["B"] {
		t.Fatalf("round robin over both after recovery, saw %v", seen)
	}
	_ = b
}

func TestReadinessNeedsEveryModel(t *testing.T) {
	ts, a, b := twoWorkerServer(t, nil, Options{})
	if r := get(t, ts.url+"/readiness"); r.status != 200 {
		t.Fatalf("readiness %d: %s", r.status, r.body)
	}
	a.health.Store(503)
	b.health.Store(503)
	for range 2 {
		ts.workers.CheckOnce(context.Background(), ts.workers.Member("A"))
		ts.workers.CheckOnce(context.Background(), ts.workers.Member("B"))
	}
	r := get(t, ts.url+"/readiness")
	if r.status != 503 || !contains(r.body, "llama/plain") {
		t.Fatalf("readiness %d: %s", r.status, r.body)
	}
	if r := get(t, ts.url+"/health"); r.status != 200 {
		t.Fatalf("health %d", r.status)
	}
	if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", "")); r.status != 503 || r.errorCode() != CodeNoAvailableEngine {
		t.Fatalf("status %d body %s", r.status, r.body)
	}
}

func TestBreakerOpensAndHalfOpenProbeCloses(t *testing.T) {
	clock := newFakeClock()
	ts, a, _ := twoWorkerServer(t, func(c *config.Config) {
		c.Health.BreakerFailures = 2
		c.Health.BreakerCooldown = 30 * time.Second
		c.Retry.Enabled = false // the breaker alone: a retry would wait for the fake clock
	}, Options{Clock: clock})
	m := ts.workers.Member("A")
	a.fail.Store(502)
	for i := 0; i < 8 && m.Breaker().State() != fleet.BreakerOpen; i++ {
		post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
	}
	if m.Breaker().State() != fleet.BreakerOpen || ts.Workers().Worker("A").Healthy() {
		t.Fatalf("breaker %v, eligible %v", m.Breaker().State(), ts.Workers().Worker("A").Healthy())
	}
	hits := a.hits.Load()
	for range 4 {
		if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", "")); r.header.Get(headerWorker) != "B" {
			t.Fatalf("open breaker still routed to %q", r.header.Get(headerWorker))
		}
	}
	ts.workers.CheckOnce(context.Background(), m)
	if m.Breaker().State() != fleet.BreakerOpen {
		t.Fatal("breaker left open state before the cool-down")
	}
	a.fail.Store(0)
	// The cool-down's end alone turns the breaker half-open: no health round is needed.
	clock.Advance(30 * time.Second)
	if m.Breaker().State() != fleet.BreakerHalfOpen || !ts.Workers().Worker("A").Healthy() {
		t.Fatalf("after cool-down: breaker %v", m.Breaker().State())
	}
	for i := 0; i < 4 && m.Breaker().State() != fleet.BreakerClosed; i++ {
		post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
	}
	if m.Breaker().State() != fleet.BreakerClosed || a.hits.Load() <= hits {
		t.Fatalf("probe did not close the breaker: %v", m.Breaker().State())
	}
}

func TestAdminWorkersAPI(t *testing.T) {
	tele := &fakeTelemetry{}
	a := newFakeEngine(t, "A", "llama")
	cfg := baseConfig()
	cfg.Server.AdminAPIKey = "adm"
	cfg.Workers = []config.Worker{plainWorker("A", a.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{{ID: "b", Groups: config.Groups{Plain: &config.Group{}}}}}}
	ts := startServer(t, cfg, Options{Telemetry: tele})
	key := []string{"Authorization", "Bearer adm"}

	if r := get(t, ts.url+"/workers"); r.status != 401 {
		t.Fatalf("admin without key: %d", r.status)
	}
	c := newFakeEngine(t, "C", "llama")
	r := post(t, ts.url+"/workers", `{"url":"`+c.url+`","id":"C","model":"llama"}`, key...)
	if r.status != 201 {
		t.Fatalf("add: %d %s", r.status, r.body)
	}
	var v fleet.View
	_ = json.Unmarshal(r.body, &v)
	if v.Model != "llama" || v.Role != "plain" || !v.Introspected {
		t.Fatalf("introspected view %+v", v)
	}
	if r := post(t, ts.url+"/workers", `{"url":"`+c.url+`","id":"C","model":"llama"}`, key...); r.status != 409 {
		t.Fatalf("duplicate add: %d", r.status)
	}
	if r := post(t, ts.url+"/workers", `{"url":"ftp://x"}`, key...); r.status != 400 {
		t.Fatalf("bad url: %d", r.status)
	}
	seen := map[string]bool{}
	for range 4 {
		seen[post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", "")).header.Get(headerWorker)] = true
	}
	if !seen["C"] {
		t.Fatalf("added worker got no traffic: %v", seen)
	}
	r = get(t, ts.url+"/workers", key...)
	if r.status != 200 || !contains(r.body, `"id":"C"`) || !contains(r.body, `"id":"A"`) {
		t.Fatalf("list: %d %s", r.status, r.body)
	}
	req, _ := http.NewRequest(http.MethodDelete, ts.url+"/workers/C", nil)
	req.Header.Set("Authorization", "Bearer adm")
	if r := do(t, req); r.status != 200 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	if r := do(t, req); r.status != 404 || r.errorCode() != CodeWorkerNotFound {
		t.Fatalf("second delete: %d %s", r.status, r.body)
	}
	if ts.Workers().Worker("C") != nil {
		t.Fatal("C still registered")
	}
	tele.mu.Lock()
	_, startedC := tele.started["C"]
	stopped := strings.Join(tele.stopped, ",")
	tele.mu.Unlock()
	if !startedC || !strings.Contains(stopped, "C") {
		t.Fatalf("telemetry started C: %v, stopped: %q", startedC, stopped)
	}
}

func TestStreamClientDisconnectCancelsUpstream(t *testing.T) {
	e := newFakeEngine(t, "A", "llama", withGate())
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A")}}}
	ts := startServer(t, cfg, Options{HeartbeatInterval: 10 * time.Millisecond})

	tr := &http.Transport{}
	client := &http.Client{Transport: tr}
	req, _ := http.NewRequest(http.MethodPost, ts.url+"/v1/chat/completions", strings.NewReader(chatBody("llama", "hi", `"stream":true`)))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(resp.Body).ReadString('\n')
	if !strings.Contains(line, "tok0") {
		t.Fatalf("first line %q", line)
	}
	resp.Body.Close()
	tr.CloseIdleConnections()
	// The router notices on a heartbeat write and closes the upstream connection, which the
	// engine sees as a failed write.
	waitFor(t, e.gone, "the engine to see its stream cancelled")
	ts.waitBackground(t)
	if ts.metrics.disconnects.Get() != 1 || ts.tracker.Outstanding() != 0 {
		t.Fatalf("disconnects %d outstanding %d after the stream ended", ts.metrics.disconnects.Get(), ts.tracker.Outstanding())
	}
}

func TestStreamIdleTimeout(t *testing.T) {
	e := newFakeEngine(t, "A", "llama", withGate())
	cfg := baseConfig()
	cfg.Server.StreamIdleTimeout = 100 * time.Millisecond
	cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A")}}}
	e.silent = true // the engine holds the stream and sends nothing
	ts := startServer(t, cfg, Options{HeartbeatInterval: time.Hour})
	r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", `"stream":true`))
	if r.status != 200 || !contains(r.body, CodeStreamIdleTimeout) || !strings.HasSuffix(string(r.body), "data: [DONE]\n\n") {
		t.Fatalf("status %d body %q", r.status, r.body)
	}
}

func TestGracefulShutdownDrainsStreams(t *testing.T) {
	e := newFakeEngine(t, "A", "llama", withGate())
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A")}}}
	ln := listenSignallingClose(t)
	ts := startServer(t, cfg, Options{HeartbeatInterval: time.Hour, Listener: ln})

	req, _ := http.NewRequest(http.MethodPost, ts.url+"/v1/chat/completions", strings.NewReader(chatBody("llama", "hi", `"stream":true`)))
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	waitFor(t, e.streamed, "first chunk")
	ts.cancel() // SIGTERM
	// New connections are refused once the listener closes; the stream continues.
	waitFor(t, ln.closed, "the server to close its listener")
	if resp, err := http.Get(ts.url + "/health"); err == nil {
		resp.Body.Close()
		t.Fatal("still accepting connections while draining")
	}
	close(e.gate)
	body := new(strings.Builder)
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		body.WriteString(line)
		if err != nil {
			break
		}
	}
	if !strings.HasSuffix(body.String(), "data: [DONE]\n\n") || strings.Contains(body.String(), CodeShuttingDown) {
		t.Fatalf("stream cut by shutdown: %q", body.String())
	}
}

func TestDrainTimeoutEndsStreams(t *testing.T) {
	e := newFakeEngine(t, "A", "llama", withGate())
	cfg := baseConfig()
	cfg.Server.DrainTimeout = 200 * time.Millisecond
	cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A")}}}
	ts := startServer(t, cfg, Options{HeartbeatInterval: time.Hour})
	req, _ := http.NewRequest(http.MethodPost, ts.url+"/v1/chat/completions", strings.NewReader(chatBody("llama", "hi", `"stream":true`)))
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	waitFor(t, e.streamed, "first chunk")
	ts.stop(t) // returns only after the drain timeout ended the stream
	ts.done = make(chan error, 1)
	ts.done <- nil
	b := new(strings.Builder)
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		b.WriteString(line)
		if err != nil {
			break
		}
	}
	if !strings.Contains(b.String(), "tok0") {
		t.Fatalf("stream body %q", b.String())
	}
}

func TestModelsHealthMetrics(t *testing.T) {
	ts, _, _ := twoWorkerServer(t, nil, Options{})
	r := get(t, ts.url+"/v1/models")
	if r.status != 200 || !contains(r.body, `"id":"llama"`) {
		t.Fatalf("models %d %s", r.status, r.body)
	}
	post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
	post(t, ts.url+"/v1/chat/completions", chatBody("nope", "hi", ""))
	r = get(t, ts.url+"/metrics")
	if r.status != 200 {
		t.Fatalf("metrics %d", r.status)
	}
	for _, want := range []string{
		`switchyard_requests_total{route="/v1/chat/completions",model="llama"} 1`,
		`switchyard_responses_total{route="/v1/chat/completions",model="llama",status="200"} 1`,
		`switchyard_responses_total{route="/v1/chat/completions",model="unknown",status="404"} 1`,
		`switchyard_request_duration_seconds_bucket{route="/v1/chat/completions",model="llama",le="0.001"}`,
		`switchyard_request_duration_seconds_bucket{route="/v1/chat/completions",model="llama",le="+Inf"} 1`,
		`switchyard_selections_total{model="llama",bucket="b",group="plain",policy="round_robin",reason="round_robin"} 1`,
		`switchyard_selection_failures_total{outcome="overloaded"} 0`,
		`switchyard_admission_rejections_total{limit="max_inflight_requests"} 0`,
		`switchyard_worker_inflight_requests{worker="A"} 0`,
		`switchyard_worker_healthy{worker="B"} 1`,
		`switchyard_worker_breaker_state{worker="A"} 0`,
		`switchyard_actor_mailbox_rejections_total{kind="bucket"} 0`,
	} {
		if !contains(r.body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
