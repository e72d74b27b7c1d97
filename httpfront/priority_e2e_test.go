package httpfront

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/httpfront/flow"
)

// queuedSignal is a flow.Observer that reports each request that starts to wait.
type queuedSignal chan struct{}

func (q queuedSignal) Queued(*flow.Limiter)                         { q <- struct{}{} }
func (q queuedSignal) Dequeued(*flow.Limiter, time.Duration, error) {}

// TestQueueOrdersByPriorityThenTenant: behind a router-wide limit of one, a bulk tenant's
// three queued requests are overtaken by a later request of priority 5 (body field, passed
// to the engine as is), and a later interactive tenant's request is served after at most one
// more bulk request, not after the bulk backlog.
func TestQueueOrdersByPriorityThenTenant(t *testing.T) {
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	a.hold, a.entered = make(chan struct{}), make(chan struct{}, 8)
	cfg := flowConfig(a, b)
	cfg.Workers = cfg.Workers[:1]
	cfg.Models["llama"].Buckets[0].Groups.Plain.WorkerIDs = &[]string{"A"}
	cfg.Server.MaxConcurrentRequests = 1
	cfg.Server.QueueSize = 10
	cfg.Server.QueueTimeout = time.Minute
	cfg.Server.TenantHeader = "x-tenant"
	queued := make(queuedSignal, 16)
	set := metrics.NewSet()
	gate := flow.NewGate(cfg, flow.Options{Observer: queued, Metrics: set})
	ts := startServer(t, cfg, Options{SkipStartupChecks: true, Flow: gate})
	url := ts.url + "/v1/chat/completions"
	out := make(chan result, 8)
	postAsync(context.Background(), url, chatBody("llama", "first", ""), out, "x-tenant", "bulk")
	waitFor(t, a.entered, "the first request at the engine")
	send := func(content, extra string, headers ...string) {
		postAsync(context.Background(), url, chatBody("llama", content, extra), out, headers...)
		waitFor(t, queued, content+" queued")
	}
	send("bulk1", "", "x-tenant", "bulk")
	send("bulk2", "", "x-tenant", "bulk")
	send("bulk3", "", "x-tenant", "bulk")
	send("urgent", `"priority": 5`, "x-tenant", "bulk")
	send("chat", "", "x-tenant", "chat", "x-priority", "0")
	close(a.hold)
	for _, r := range collect(t, out, 6, "answers") {
		if r.status != 200 {
			t.Fatalf("status %d %s", r.status, r.code)
		}
	}
	bodies, _ := a.received()
	var order []string
	for _, body := range bodies {
		var req struct {
			Messages []struct{ Content string } `json:"messages"`
			Priority *int                       `json:"priority"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			t.Fatal(err)
		}
		order = append(order, req.Messages[0].Content)
		if req.Messages[0].Content == "urgent" && (req.Priority == nil || *req.Priority != 5) {
			t.Fatalf("the engine saw priority %v, the client sent 5", req.Priority)
		}
	}
	// bulk1..3 and chat are one priority: bulk's tags are 0, 1, 2 and chat's the virtual time
	// when it arrived (0, as nobody of that level was served yet), after bulk1 by arrival.
	want := []string{"first", "urgent", "bulk1", "chat", "bulk2", "bulk3"}
	if len(order) != len(want) {
		t.Fatalf("engine order %v, want %v", order, want)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("engine order %v, want %v", order, want)
		}
	}
	var m bytes.Buffer
	set.WritePrometheus(&m)
	for _, want := range []string{
		`switchyard_queue_class_requests_total{priority="5",tenant="other",outcome="admitted"} 1`,
		`switchyard_queue_class_requests_total{priority="0",tenant="other",outcome="admitted"} 5`,
	} {
		if !contains(m.Bytes(), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestQueuePriorityRefusals(t *testing.T) {
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	cfg := flowConfig(a, b)
	cfg.Server.MaxConcurrentRequests = 4
	ts := startServer(t, cfg, Options{SkipStartupChecks: true})
	url := ts.url + "/v1/chat/completions"
	for _, tc := range []struct {
		name, extra string
		headers     []string
	}{
		{name: "body priority beyond max_priority", extra: `"priority": 11`},
		{name: "negative beyond", extra: `"priority": -11`},
		{name: "not an integer", extra: `"priority": "high"`},
		{name: "header not an integer", headers: []string{"x-priority", "high"}},
		{name: "header beyond", headers: []string{"x-priority", "99"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := post(t, url, chatBody("llama", "q", tc.extra), tc.headers...)
			if r.status != 400 || r.errorCode() != CodeInvalidParameter {
				t.Fatalf("status %d %s: %s", r.status, r.errorCode(), r.body)
			}
		})
	}
	if hits := a.hits.Load() + b.hits.Load(); hits != 0 {
		t.Fatalf("engines saw %d refused requests", hits)
	}
	if r := post(t, url, chatBody("llama", "q", `"priority": -10`), "x-priority", "99"); r.status != 200 {
		t.Fatalf("a body priority in range (the header ignored): %d %s", r.status, r.body)
	}
}
