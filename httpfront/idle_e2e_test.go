package httpfront

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"switchyard/config"
)

// keepAliveEngine is an engine written with net/http, not with the router's own client
// library: it behaves like uvicorn in front of SGLang or vLLM, keeping an idle keep-alive
// connection for idleTimeout (0: until the test calls closeIdle) and then closing it without
// a word. It speaks only the OpenAI routes and /health (no /server_info, as vLLM).
type keepAliveEngine struct {
	t    *testing.T
	id   string
	srv  *http.Server
	ln   net.Listener
	url  string
	mode string // "", "prefill", "decode"
	// info, when set, is the /server_info body (else the route is missing, as on vLLM).
	info string
	// breakStream: a stream's connection is cut after its first event, as by a crash;
	// dieBeforeEvent: after its response headers, before any event (a crash in prefill).
	breakStream, dieBeforeEvent bool

	mu    sync.Mutex
	conns map[net.Conn]http.ConnState

	dialed   atomic.Int64 // connections accepted
	requests atomic.Int64 // inference requests served
	closed   atomic.Int64 // idle connections closed by closeIdle
	// idled receives (without blocking) when a connection turns idle.
	idled chan struct{}
}

func newKeepAliveEngine(t *testing.T, id, mode string, idleTimeout time.Duration) *keepAliveEngine {
	t.Helper()
	e := &keepAliveEngine{t: t, id: id, mode: mode, conns: map[net.Conn]http.ConnState{}, idled: make(chan struct{}, 64)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.ln, e.url = ln, "http://"+ln.Addr().String()
	e.srv = &http.Server{
		Handler:     http.HandlerFunc(e.serve),
		IdleTimeout: idleTimeout,
		ConnState:   e.track,
	}
	if idleTimeout == 0 {
		e.srv.IdleTimeout = time.Hour
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = e.srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = e.srv.Close()
		<-done
	})
	return e
}

func (e *keepAliveEngine) track(c net.Conn, s http.ConnState) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch s {
	case http.StateNew:
		e.dialed.Add(1)
		e.conns[c] = s
	case http.StateClosed, http.StateHijacked:
		delete(e.conns, c)
	default:
		e.conns[c] = s
		if s == http.StateIdle {
			select {
			case e.idled <- struct{}{}:
			default:
			}
		}
	}
}

// closeIdle closes the engine's idle keep-alive connections, as an engine's keep-alive
// timeout does, once every open one is idle (a connection turns idle just after its answer
// is written), and returns how many it closed.
func (e *keepAliveEngine) closeIdle() int {
	deadline := time.After(5 * time.Second)
	for {
		e.mu.Lock()
		busy := 0
		for _, s := range e.conns {
			if s != http.StateIdle {
				busy++
			}
		}
		if busy == 0 {
			n := len(e.conns)
			for c := range e.conns {
				_ = c.Close()
				delete(e.conns, c)
			}
			e.mu.Unlock()
			e.closed.Add(int64(n))
			return n
		}
		e.mu.Unlock()
		select {
		case <-e.idled:
		case <-deadline:
			return 0
		}
	}
}

func (e *keepAliveEngine) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		return
	case "/server_info":
		if e.info != "" {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, e.info)
			return
		}
		http.NotFound(w, r)
		return
	case "/v1/chat/completions", "/generate", "/v1/completions":
	default:
		http.NotFound(w, r)
		return
	}
	e.requests.Add(1)
	var req map[string]any
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, `{"error":{"message":"bad json"}}`, http.StatusBadRequest)
		return
	}
	if e.mode == "decode" {
		if _, ok := req["bootstrap_room"]; !ok {
			http.Error(w, `{"error":{"message":"no bootstrap_room"}}`, http.StatusBadRequest)
			return
		}
	}
	if stream, _ := req["stream"].(bool); stream && e.mode != "prefill" {
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		if e.dieBeforeEvent {
			w.WriteHeader(http.StatusOK)
			f.Flush() // the headers go out at once, as uvicorn sends them
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				_ = c.Close()
			}
			return
		}
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"id\":\"%s\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", e.id, i)
			f.Flush()
			if e.breakStream {
				if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
					_ = c.Close()
				}
				return
			}
		}
		io.WriteString(w, "data: [DONE]\n\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"%s","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello from %s"}}]}`, e.id, e.id)
}

// idleCase is one kind of request of the idle-connection tests.
type idleCase struct {
	name   string
	stream bool
	pd     bool
}

var idleCases = []idleCase{{"plain", false, false}, {"plain stream", true, false}, {"pd", false, true}, {"pd stream", true, true}}

// idleServer starts a router in front of a plain engine and a PD pair of keepAliveEngines.
func idleServer(t *testing.T, idleTimeout time.Duration, mutate func(*config.Config)) (*testServer, []*keepAliveEngine) {
	t.Helper()
	a := newKeepAliveEngine(t, "A", "", idleTimeout)
	p := newKeepAliveEngine(t, "P", "prefill", idleTimeout)
	d := newKeepAliveEngine(t, "D", "decode", idleTimeout)
	cfg := baseConfig()
	cfg.Health.BreakerFailures = 1 // one charged failure opens the breaker: the test sees it
	cfg.Workers = []config.Worker{
		plainWorker("A", a.url, "plain"),
		{ID: "P", URL: p.url, Model: "pd", Role: config.RolePrefill, BootstrapPort: ptr(8998), DPSize: 1},
		{ID: "D", URL: d.url, Model: "pd", Role: config.RoleDecode, DPSize: 1},
	}
	cfg.Models = map[string]config.Model{
		"plain": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A")}},
		"pd": {Buckets: []config.Bucket{{ID: "pd", Groups: config.Groups{PD: &config.PDGroups{
			Prefill: &config.Group{WorkerIDs: &[]string{"P"}},
			Decode:  &config.Group{WorkerIDs: &[]string{"D"}},
		}}}}},
	}
	if mutate != nil {
		mutate(cfg)
	}
	ts := startServer(t, cfg, Options{NoTelemetry: true})
	return ts, []*keepAliveEngine{a, p, d}
}

// idleRequest sends one request of kind c and fails the test unless it succeeded completely.
func idleRequest(t *testing.T, ts *testServer, c idleCase) {
	t.Helper()
	model := "plain"
	if c.pd {
		model = "pd"
	}
	extra := ""
	if c.stream {
		extra = `"stream":true`
	}
	r := post(t, ts.url+"/v1/chat/completions", chatBody(model, "hi", extra))
	if r.status != 200 {
		t.Fatalf("%s: status %d body %s", c.name, r.status, r.body)
	}
	if c.stream && (!strings.HasSuffix(string(r.body), "data: [DONE]\n\n") || strings.Contains(string(r.body), `"error"`)) {
		t.Fatalf("%s: stream did not complete: %q", c.name, r.body)
	}
}

// TestEngineClosedIdleConnections: an engine closes the router's idle keep-alive connections
// (as uvicorn does after 5 s); the next request, sent on a dead pooled connection, is sent
// again on a fresh one and succeeds, and nothing is charged to the engine.
func TestEngineClosedIdleConnections(t *testing.T) {
	ts, engines := idleServer(t, 0, nil)
	for _, c := range idleCases {
		t.Run(c.name, func(t *testing.T) {
			idleRequest(t, ts, c) // leaves pooled connections behind
			for round := range 3 {
				closed := 0
				for _, e := range engines {
					closed += e.closeIdle()
				}
				if closed == 0 {
					t.Fatalf("round %d: no idle connection to close: the test proves nothing", round)
				}
				idleRequest(t, ts, c)
			}
		})
	}
	for _, id := range []string{"A", "P", "D"} {
		if w := ts.Workers().Worker(id); !w.Healthy() {
			t.Errorf("worker %s was charged for connections it closed while idle", id)
		}
	}
	if got := metricValue(t, ts, `switchyard_upstream_stale_connection_retries_total{worker="A"}`); got < 1 {
		t.Errorf("stale connection retries of A = %v, want at least 1", got)
	}
}

// TestEngineIdleTimeoutRealTime runs requests across real idle gaps of 0.5 to 3 s against
// engines whose keep-alive timeout is 1 s, streaming and not, plain and PD: no client error.
func TestEngineIdleTimeoutRealTime(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time idle gaps")
	}
	ts, engines := idleServer(t, time.Second, nil)
	gaps := []time.Duration{500 * time.Millisecond, 1200 * time.Millisecond, 2 * time.Second, 3 * time.Second}
	var wg sync.WaitGroup
	errs := make(chan string, 2*len(idleCases)*len(gaps))
	for _, pd := range []bool{false, true} {
		wg.Go(func() {
			for i, gap := range gaps {
				time.Sleep(gap) // the idle gap under test, not a wait for a condition
				c := idleCases[i%2]
				if pd {
					c = idleCases[2+i%2]
				}
				extra, model := "", "plain"
				if c.stream {
					extra = `"stream":true`
				}
				if c.pd {
					model = "pd"
				}
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, ts.url+"/v1/chat/completions",
					strings.NewReader(chatBody(model, "hi", extra)))
				resp, err := testClient.Do(req)
				if err != nil {
					errs <- fmt.Sprintf("%s after %v: %v", c.name, gap, err)
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || strings.Contains(string(b), `"error"`) {
					errs <- fmt.Sprintf("%s after %v: status %d body %s", c.name, gap, resp.StatusCode, b)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	dialed := int64(0)
	for _, e := range engines {
		dialed += e.dialed.Load()
	}
	if dialed < 4 {
		t.Errorf("engines accepted %d connections: idle connections were never replaced", dialed)
	}
}

// metricValue reads one series from /metrics; 0 when absent.
func metricValue(t *testing.T, ts *testServer, series string) float64 {
	t.Helper()
	r := get(t, ts.url+"/metrics")
	for _, line := range strings.Split(string(r.body), "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err != nil {
				t.Fatalf("series %s: %v", series, err)
			}
			return v
		}
	}
	return 0
}
