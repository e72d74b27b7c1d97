package httpfront

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/config"
	"switchyard/httpfront/flow"
)

// flowConfig is two plain engines of model llama behind one round-robin bucket.
func flowConfig(a, b *fakeEngine) *config.Config {
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", a.url, "llama"), plainWorker("B", b.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("all", nil, nil, "A", "B")}}}
	return cfg
}

// result is one concurrent request's answer.
type result struct {
	status int
	code   string
	header http.Header
	err    error
}

// postAsync sends a chat request on its own goroutine (an http.Client, one connection each
// while others are in flight) and delivers the answer on out.
func postAsync(ctx context.Context, url, body string, out chan<- result, headers ...string) {
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			out <- result{err: err}
			return
		}
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := testClient.Do(req)
		if err != nil {
			out <- result{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- result{status: resp.StatusCode, code: response{body: b}.errorCode(), header: resp.Header, err: err}
	}()
}

// collect receives n results, failing the test after a bounded wait.
func collect(t *testing.T, ch <-chan result, n int, what string) []result {
	t.Helper()
	var out []result
	deadline := time.After(30 * time.Second)
	for len(out) < n {
		select {
		case r := <-ch:
			if r.err != nil {
				t.Fatalf("%s: %v", what, r.err)
			}
			out = append(out, r)
		case <-deadline:
			t.Fatalf("%s: %d of %d answers", what, len(out), n)
		}
	}
	return out
}

func statuses(rs []result) []int {
	var s []int
	for _, r := range rs {
		s = append(s, r.status)
	}
	slices.Sort(s)
	return s
}

// queueScenario is issue 15's queue check: limit 2, queue 2, timeout 1 s, and 8 concurrent
// requests to two engines that hold every answer until the test lets them go. It returns
// the engines and the channel the 8 answers arrive on.
func queueScenario(t *testing.T) (*testServer, *fakeEngine, *fakeEngine, chan result) {
	t.Helper()
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	a.hold, b.hold = make(chan struct{}), make(chan struct{})
	cfg := flowConfig(a, b)
	cfg.Server.MaxConcurrentRequests = 2
	cfg.Server.QueueSize = 2
	cfg.Server.QueueTimeout = time.Second
	ts := startServer(t, cfg, Options{SkipStartupChecks: true})
	out := make(chan result, 8)
	for i := range 8 {
		postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("llama", "q"+string(rune('0'+i)), ""), out)
	}
	return ts, a, b, out
}

// TestQueueServesWaitersInsteadOf503: in the queue scenario two requests are served at once,
// two wait in the queue, four find it full (429). Released before the timeout, the two
// waiters are served: 4 served, 4 × 429, never a 503.
func TestQueueServesWaitersInsteadOf503(t *testing.T) {
	ts, a, b, out := queueScenario(t)
	// The queue is full only while two requests hold the slots and two wait: once four have
	// been refused, that is the state, and nothing changes until the engines answer.
	refused := collect(t, out, 4, "refusals")
	for _, r := range refused {
		if r.status != 429 || r.code != CodeQueueFull {
			t.Fatalf("refusal %d %q, want 429 queue_full", r.status, r.code)
		}
	}
	if n := ts.gate.Router().Queued(); n != 2 {
		t.Fatalf("%d requests queued, want 2", n)
	}
	close(a.hold)
	close(b.hold)
	served := collect(t, out, 4, "served")
	if got := statuses(served); !slices.Equal(got, []int{200, 200, 200, 200}) {
		t.Fatalf("statuses %v, want four 200", got)
	}
	if hits := a.hits.Load() + b.hits.Load(); hits != 4 {
		t.Fatalf("engines saw %d requests, want 4", hits)
	}
	m := scrape(t, ts.url)
	for _, want := range []string{
		`switchyard_queue_rejections_total{scope="router",reason="queue_full"} 4`,
		`switchyard_queue_wait_seconds_count{scope="router"} 2`,
		`switchyard_queue_depth{scope="router"} 0`,
		`switchyard_concurrent_requests{scope="router"} 0`,
		`switchyard_responses_total{route="/v1/chat/completions",model="llama",status="429"} 4`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestQueueTimeoutAnswers408: the queue scenario with engines that stay busy past the queue
// timeout: the two waiters are answered 408, the four others 429, the two running 200.
func TestQueueTimeoutAnswers408(t *testing.T) {
	ts, a, b, out := queueScenario(t)
	early := collect(t, out, 6, "refusals and timeouts")
	var full, timedOut int
	for _, r := range early {
		switch {
		case r.status == 429 && r.code == CodeQueueFull:
			full++
		case r.status == 408 && r.code == CodeQueueTimeout:
			timedOut++
		default:
			t.Fatalf("answer %d %q before the engines answered", r.status, r.code)
		}
	}
	if full != 4 || timedOut != 2 {
		t.Fatalf("%d × 429 and %d × 408, want 4 and 2", full, timedOut)
	}
	close(a.hold)
	close(b.hold)
	if got := statuses(collect(t, out, 2, "served")); !slices.Equal(got, []int{200, 200}) {
		t.Fatalf("statuses %v", got)
	}
	if m := scrape(t, ts.url); !strings.Contains(m, `switchyard_queue_rejections_total{scope="router",reason="queue_timeout"} 2`) {
		t.Error("queue timeouts not counted")
	}
}

// gateEvents is a flow.Observer that reports queue events on channels.
type gateEvents struct {
	queued   chan struct{}
	dequeued chan error
}

func newGateEvents() *gateEvents {
	return &gateEvents{queued: make(chan struct{}, 16), dequeued: make(chan error, 16)}
}

func (g *gateEvents) Queued(*flow.Limiter) { g.queued <- struct{}{} }

func (g *gateEvents) Dequeued(_ *flow.Limiter, _ time.Duration, err error) { g.dequeued <- err }

// TestQueuedClientThatLeavesIsRemoved: a request whose client closes its connection while it
// waits is taken out of the queue at once (its place goes to the next request) and never
// reaches an engine.
func TestQueuedClientThatLeavesIsRemoved(t *testing.T) {
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	a.hold, b.hold = make(chan struct{}), make(chan struct{})
	entered := make(chan struct{}, 4)
	a.entered, b.entered = entered, entered
	cfg := flowConfig(a, b)
	cfg.Server.MaxConcurrentRequests = 1
	cfg.Server.QueueSize = 1
	cfg.Server.QueueTimeout = time.Minute
	ev := newGateEvents()
	gate := flow.NewGate(cfg, flow.Options{Metrics: metrics.NewSet(), Observer: ev})
	ts := startServer(t, cfg, Options{SkipStartupChecks: true, Flow: gate})
	chat := ts.url + "/v1/chat/completions"

	out := make(chan result, 4)
	postAsync(context.Background(), chat, chatBody("llama", "first", ""), out)
	waitFor(t, entered, "the first request at its engine")
	leave, cancel := context.WithCancel(context.Background())
	defer cancel()
	left := make(chan result, 1)
	postAsync(leave, chat, chatBody("llama", "leaving", ""), left)
	waitFor(t, ev.queued, "the second request queued")

	cancel() // the client gives up: its connection closes
	select {
	case err := <-ev.dequeued:
		if !errors.Is(err, flow.ErrClientGone) {
			t.Fatalf("the queued request ended with %v, want ErrClientGone", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the request of a client that left stayed queued")
	}
	if r := <-left; r.err == nil {
		t.Fatalf("the cancelled client got an answer: %d", r.status)
	}
	if n := gate.Router().Queued(); n != 0 {
		t.Fatalf("%d queued after the client left", n)
	}

	// Its place is free: the next request queues instead of finding the queue full.
	postAsync(context.Background(), chat, chatBody("llama", "third", ""), out)
	waitFor(t, ev.queued, "the third request queued")
	close(a.hold)
	close(b.hold)
	if got := statuses(collect(t, out, 2, "served")); !slices.Equal(got, []int{200, 200}) {
		t.Fatalf("statuses %v", got)
	}
	if hits := a.hits.Load() + b.hits.Load(); hits != 2 {
		t.Fatalf("engines saw %d requests, want 2: the request of the client that left was dispatched", hits)
	}
	// The handler of the request that left counts its answer after the queue let it go (the
	// event above), on its own goroutine: wait for the count, not for a moment.
	waitUntil(t, "the request of the client that left counted as 499", func() bool {
		return strings.Contains(scrape(t, ts.url), `switchyard_responses_total{route="/v1/chat/completions",model="llama",status="499"} 1`)
	})
}

// TestStreamHoldsItsSlotUntilItEnds: a streamed answer keeps its concurrency slot until
// the stream ends, not until the handler returns.
func TestStreamHoldsItsSlotUntilItEnds(t *testing.T) {
	a, b := newFakeEngine(t, "A", "llama", withGate()), newFakeEngine(t, "B", "llama", withGate())
	cfg := flowConfig(a, b)
	cfg.Server.MaxConcurrentRequests = 1
	cfg.Server.QueueSize = 0
	ts := startServer(t, cfg, Options{SkipStartupChecks: true})
	chat := ts.url + "/v1/chat/completions"

	req, err := http.NewRequest(http.MethodPost, chat, strings.NewReader(chatBody("llama", "stream", `"stream":true`)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, 4)
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "data" {
		t.Fatalf("first chunk %q, %v", first, err)
	}
	// The handler has returned; the relay still streams: the slot is taken.
	r := post(t, chat, chatBody("llama", "meanwhile", ""))
	if r.status != 429 || r.errorCode() != CodeQueueFull {
		t.Fatalf("during the stream: %d %s, want 429 queue_full", r.status, r.body)
	}
	close(a.gate)
	close(b.gate)
	rest, err := io.ReadAll(resp.Body)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("stream end %q, %v", rest, err)
	}
	// The relay released the slot before its stream writer returned, which is what ended
	// the response the client just read to its end.
	if n := ts.gate.Router().Active(); n != 0 {
		t.Fatalf("%d slots held after the stream ended", n)
	}
	if r := post(t, chat, chatBody("llama", "after", "")); r.status != 200 {
		t.Fatalf("after the stream: %d %s", r.status, r.body)
	}
}

// TestRateLimitBurst is issue 15's rate-limit check on a clock that does not move: a burst
// above the limit gets 429 with Retry-After, the rest 200; a second later a token is back.
func TestRateLimitBurst(t *testing.T) {
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	cfg := flowConfig(a, b)
	cfg.Server.RateLimit.RequestsPerSecond = 2
	cfg.Server.RateLimit.Burst = 4
	clk := newFakeClock()
	ts := startServer(t, cfg, Options{SkipStartupChecks: true, Now: clk.Now})
	chat := ts.url + "/v1/chat/completions"

	out := make(chan result, 10)
	for range 10 {
		postAsync(context.Background(), chat, chatBody("llama", "q", ""), out)
	}
	var ok, limited int
	for _, r := range collect(t, out, 10, "burst") {
		switch {
		case r.status == 200:
			ok++
		case r.status == 429 && r.code == CodeRateLimited:
			limited++
			if ra := r.header.Get("Retry-After"); ra != "1" {
				t.Errorf("Retry-After %q, want 1 (one token every 500ms)", ra)
			}
		default:
			t.Fatalf("answer %d %q", r.status, r.code)
		}
	}
	if ok != 4 || limited != 6 {
		t.Fatalf("%d × 200 and %d × 429, want the burst of 4 and 6", ok, limited)
	}
	if r := post(t, chat, chatBody("llama", "q", "")); r.status != 429 {
		t.Fatalf("still limited: %d", r.status)
	}
	clk.Advance(500 * time.Millisecond)
	if r := post(t, chat, chatBody("llama", "q", "")); r.status != 200 {
		t.Fatalf("after a token came back: %d %s", r.status, r.body)
	}
	if hits := a.hits.Load() + b.hits.Load(); hits != 5 {
		t.Fatalf("engines saw %d requests, want 5", hits)
	}
	if m := scrape(t, ts.url); !strings.Contains(m, `switchyard_rate_limited_total{scope="router"} 7`) {
		t.Error("rate-limited requests not counted")
	}
}

// TestRateLimitPerKey: each API key (bearer token) has its own bucket; requests without a
// key share one.
func TestRateLimitPerKey(t *testing.T) {
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	cfg := flowConfig(a, b)
	cfg.Server.RateLimit.PerKey = config.KeyRateLimit{RequestsPerSecond: 0.25, Burst: 1, MaxKeys: 100}
	clk := newFakeClock()
	ts := startServer(t, cfg, Options{SkipStartupChecks: true, Now: clk.Now})
	chat := ts.url + "/v1/chat/completions"
	bearer := func(k string) []string { return []string{"Authorization", "Bearer " + k} }

	tests := []struct {
		name    string
		headers []string
		status  int
	}{
		{"alice", bearer("alice"), 200},
		{"alice again", bearer("alice"), 429},
		{"bob", bearer("bob"), 200},
		{"no key", nil, 200},
		{"no key again", nil, 429},
		{"bob again", bearer("bob"), 429},
	}
	for _, tt := range tests {
		r := post(t, chat, chatBody("llama", "q", ""), tt.headers...)
		if r.status != tt.status {
			t.Fatalf("%s: %d %s, want %d", tt.name, r.status, r.body, tt.status)
		}
		if r.status == 429 && (r.errorCode() != CodeRateLimited || r.header.Get("Retry-After") != "4" ||
			!strings.Contains(string(r.body), "API key")) {
			t.Fatalf("%s: %v %s", tt.name, r.header, r.body)
		}
	}
	clk.Advance(4 * time.Second)
	if r := post(t, chat, chatBody("llama", "q", ""), bearer("alice")...); r.status != 200 {
		t.Fatalf("alice after 4s: %d", r.status)
	}
}

// scrape returns the server's /metrics text.
func scrape(t *testing.T, base string) string {
	t.Helper()
	r := get(t, base+"/metrics")
	if r.status != 200 {
		t.Fatalf("/metrics: %d", r.status)
	}
	return string(r.body)
}

// TestQueuedConnectionStaysUsable: a keep-alive connection whose request waited in the
// queue (and was watched meanwhile) serves the next requests normally, and a client that
// pipelines a second request behind a waiting one is not taken for gone: both are served,
// in order.
func TestQueuedConnectionStaysUsable(t *testing.T) {
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	a.hold, b.hold = make(chan struct{}), make(chan struct{})
	entered := make(chan struct{}, 4)
	a.entered, b.entered = entered, entered
	cfg := flowConfig(a, b)
	cfg.Server.MaxConcurrentRequests = 1
	cfg.Server.QueueSize = 4
	cfg.Server.QueueTimeout = time.Minute
	ev := newGateEvents()
	gate := flow.NewGate(cfg, flow.Options{Metrics: metrics.NewSet(), Observer: ev})
	ts := startServer(t, cfg, Options{SkipStartupChecks: true, Flow: gate})

	out := make(chan result, 1)
	postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("llama", "holder", ""), out)
	waitFor(t, entered, "the first request at its engine")

	conn, err := net.Dial("tcp", ts.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	raw := func(content string) string {
		body := chatBody("llama", content, "")
		return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
			strconv.Itoa(len(body)) + "\r\n\r\n" + body
	}
	// One request, then a pipelined second one once the first waits.
	if _, err := io.WriteString(conn, raw("queued")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ev.queued, "the request queued")
	if _, err := io.WriteString(conn, raw("pipelined")); err != nil {
		t.Fatal(err)
	}
	close(a.hold)
	close(b.hold)
	br := bufio.NewReader(conn)
	for _, want := range []string{"queued", "pipelined", "after"} {
		if want == "after" {
			if _, err := io.WriteString(conn, raw(want)); err != nil {
				t.Fatal(err)
			}
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", want, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", want, resp.StatusCode, body)
		}
	}
	if r := <-out; r.err != nil || r.status != 200 {
		t.Fatalf("holder: %d %v", r.status, r.err)
	}
	if err := <-ev.dequeued; err != nil {
		t.Fatalf("the queued request ended with %v", err)
	}
}
