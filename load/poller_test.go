package load

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeEngine serves the load routes with switchable behaviour.
type fakeEngine struct {
	mu         sync.Mutex
	loads      int    // status for /v1/loads
	loadsBody  string // body for /v1/loads
	getLoad    int
	getLoadBdy string
	metrics    int    // status for the metrics page (404 unless set)
	metricsBdy string // body of the metrics page
	metricsAt  string // path of the metrics page; default DefaultMetricsPath
	hits       map[string]int
	block      chan struct{} // when non-nil, handlers wait on it
}

func newFakeEngine(t *testing.T) (*fakeEngine, *httptest.Server) {
	t.Helper()
	fe := &fakeEngine{loads: http.StatusOK, getLoad: http.StatusOK, hits: map[string]int{},
		loadsBody:  `{"timestamp":null,"loads":[{"dp_rank":0,"num_running_reqs":2,"num_waiting_reqs":1,"max_total_num_tokens":100}]}`,
		getLoadBdy: `[{"dp_rank":0,"num_reqs":3,"num_waiting_reqs":1,"num_tokens":5}]`}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fe.mu.Lock()
		fe.hits[r.URL.Path]++
		block := fe.block
		status, body := http.StatusNotFound, ""
		switch r.URL.Path {
		case PathLoads:
			status, body = fe.loads, fe.loadsBody
		case PathGetLoad:
			status, body = fe.getLoad, fe.getLoadBdy
		case cmpOr(fe.metricsAt, DefaultMetricsPath):
			status, body = cmpOr(fe.metrics, http.StatusNotFound), fe.metricsBdy
		}
		fe.mu.Unlock()
		if block != nil {
			select {
			case <-block:
			case <-r.Context().Done():
			}
			return
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return fe, srv
}

func (fe *fakeEngine) set(f func(fe *fakeEngine)) {
	fe.mu.Lock()
	defer fe.mu.Unlock()
	f(fe)
}

func (fe *fakeEngine) hitCount(path string) int {
	fe.mu.Lock()
	defer fe.mu.Unlock()
	return fe.hits[path]
}

func newTestPoller(t *testing.T, url string, mod func(*PollerConfig)) *Poller {
	t.Helper()
	cfg := PollerConfig{WorkerID: "w1", URL: url + "/", Timeout: 2 * time.Second, Now: func() time.Time { return recvAt },
		Deliver: func(string, []RankReport, error) {}}
	if mod != nil {
		mod(&cfg)
	}
	p, err := NewPoller(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPollerNative(t *testing.T) {
	fe, srv := newFakeEngine(t)
	p := newTestPoller(t, srv.URL, nil)
	reps, err := p.Poll(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := RankReport{Fields: HasNative | HasRunning | HasWaiting | HasCapacity, Running: 2, Waiting: 1, MaxTotalTokens: 100, At: recvAt}
	if len(reps) != 1 || reps[0] != want || p.Legacy() {
		t.Fatalf("got %+v legacy=%v, want %+v", reps, p.Legacy(), want)
	}
	if fe.hitCount(PathGetLoad) != 0 {
		t.Fatal("polled /get_load although /v1/loads answered")
	}
}

func TestPollerFallbackAndReprobe(t *testing.T) {
	fe, srv := newFakeEngine(t)
	fe.set(func(fe *fakeEngine) { fe.loads = http.StatusNotFound })
	p := newTestPoller(t, srv.URL, func(c *PollerConfig) { c.ReprobeEvery = 2 })
	ctx := t.Context()

	reps, err := p.Poll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := RankReport{Fields: HasRunning | HasWaiting | HasUsedTokens, Running: 2, Waiting: 1, UsedTokens: 5, At: recvAt}
	if len(reps) != 1 || reps[0] != want || !p.Legacy() {
		t.Fatalf("got %+v legacy=%v, want %+v", reps, p.Legacy(), want)
	}
	// Two more legacy polls go straight to /get_load.
	for range 2 {
		if _, err := p.Poll(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := fe.hitCount(PathLoads); got != 1 {
		t.Fatalf("/v1/loads hit %d times, want 1", got)
	}
	// The engine gains /v1/loads; after ReprobeEvery legacy polls the next one re-probes it.
	fe.set(func(fe *fakeEngine) { fe.loads = http.StatusOK })
	reps, err = p.Poll(ctx)
	if err != nil || p.Legacy() || !reps[0].Has(HasNative) {
		t.Fatalf("re-probe: reps %+v err %v legacy %v", reps, err, p.Legacy())
	}
}

func TestPollerErrors(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(fe *fakeEngine)
		wantIs  error
		wantMsg string
	}{
		{name: "server error", setup: func(fe *fakeEngine) { fe.loads = http.StatusInternalServerError }, wantIs: ErrStatus, wantMsg: "500"},
		{name: "bad native body", setup: func(fe *fakeEngine) { fe.loadsBody = `{"loads":[{"dp_rank":"x"}]}` }, wantIs: ErrMalformed, wantMsg: "/v1/loads"},
		{name: "bad legacy body", setup: func(fe *fakeEngine) { fe.loads, fe.getLoadBdy = http.StatusNotFound, `{}` }, wantIs: ErrMalformed, wantMsg: "/get_load"},
		{name: "no load route", setup: func(fe *fakeEngine) { fe.loads, fe.getLoad = http.StatusNotFound, http.StatusNotFound }, wantIs: ErrStatus, wantMsg: "404"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fe, srv := newFakeEngine(t)
			fe.set(tt.setup)
			p := newTestPoller(t, srv.URL, nil)
			reps, err := p.Poll(t.Context())
			if !errors.Is(err, tt.wantIs) || !strings.Contains(err.Error(), tt.wantMsg) || !strings.HasPrefix(err.Error(), "cannot poll ") || reps != nil {
				t.Fatalf("got reps %v err %v; want %v containing %q", reps, err, tt.wantIs, tt.wantMsg)
			}
			if tt.name == "no load route" && p.Legacy() {
				t.Fatal("poller stays on /get_load although it answered 404")
			}
		})
	}
}

func TestPollerTimeout(t *testing.T) {
	fe, srv := newFakeEngine(t)
	block := make(chan struct{})
	fe.set(func(fe *fakeEngine) { fe.block = block })
	t.Cleanup(func() { close(block) }) // runs before srv.Close: unblock the handler first
	p := newTestPoller(t, srv.URL, func(c *PollerConfig) { c.Timeout = 50 * time.Millisecond })
	if _, err := p.Poll(t.Context()); err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("err = %v, want a timeout", err)
	}
}

func TestPollerCancelledContext(t *testing.T) {
	_, srv := newFakeEngine(t)
	p := newTestPoller(t, srv.URL, nil)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := p.Poll(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestPollerRun(t *testing.T) {
	_, srv := newFakeEngine(t)
	type result struct {
		id   string
		reps []RankReport
		err  error
	}
	got := make(chan result, 16)
	var panicked atomic.Bool
	p := newTestPoller(t, srv.URL, func(c *PollerConfig) {
		c.Interval = 5 * time.Millisecond
		c.Deliver = func(id string, reps []RankReport, err error) {
			if panicked.CompareAndSwap(false, true) {
				panic("callback bug") // recovered by the poller; polling continues
			}
			select {
			case got <- result{id, reps, err}:
			default:
			}
		}
	})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	deadline := time.After(10 * time.Second)
	for i := range 3 {
		select {
		case r := <-got:
			if r.id != "w1" || r.err != nil || len(r.reps) != 1 || r.reps[0].Running != 2 {
				t.Fatalf("delivery %d: %+v", i, r)
			}
		case <-deadline:
			t.Fatal("no delivery within 10 s")
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// recordHandler records log messages.
type recordHandler struct {
	mu   sync.Mutex
	msgs []string
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Message)
	return nil
}
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordHandler) WithGroup(string) slog.Handler      { return h }
func (h *recordHandler) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

func TestPollerLogsFailureChanges(t *testing.T) {
	fe, srv := newFakeEngine(t)
	h := &recordHandler{}
	var delivered []error
	p := newTestPoller(t, srv.URL, func(c *PollerConfig) {
		c.Logger = slog.New(h)
		c.Deliver = func(_ string, _ []RankReport, err error) { delivered = append(delivered, err) }
	})
	ctx := t.Context()
	fe.set(func(fe *fakeEngine) { fe.loads = http.StatusServiceUnavailable })
	for range 3 {
		p.round(ctx)
	}
	if n := h.count("load poll failing"); n != 1 {
		t.Fatalf("3 identical failures logged %d times, want 1", n)
	}
	fe.set(func(fe *fakeEngine) { fe.loads = http.StatusInternalServerError })
	p.round(ctx)
	if n := h.count("load poll failing"); n != 2 {
		t.Fatalf("a changed failure logged: %d, want 2", n)
	}
	fe.set(func(fe *fakeEngine) { fe.loads = http.StatusOK })
	p.round(ctx)
	p.round(ctx)
	if n := h.count("load poll recovered"); n != 1 {
		t.Fatalf("recovery logged %d times, want 1", n)
	}
	if len(delivered) != 6 || delivered[0] == nil || delivered[5] != nil {
		t.Fatalf("delivered %v", delivered)
	}
}

func TestNewPollerValidates(t *testing.T) {
	deliver := func(string, []RankReport, error) {}
	for _, cfg := range []PollerConfig{
		{URL: "http://127.0.0.1:1", Deliver: deliver},
		{WorkerID: "w", URL: "http://127.0.0.1:1"},
		{WorkerID: "w", URL: "127.0.0.1:1", Deliver: deliver},
		{WorkerID: "w", URL: "ftp://127.0.0.1:1", Deliver: deliver},
		{WorkerID: "w", URL: "http://127.0.0.1:1", Deliver: deliver, MetricsPath: "metrics"},
		{WorkerID: "w", URL: "http://127.0.0.1:1", Deliver: deliver, Mode: PollPrometheus + 1},
	} {
		if _, err := NewPoller(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewPoller(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
	p, err := NewPoller(PollerConfig{WorkerID: "w", URL: "http://127.0.0.1:1", Deliver: deliver})
	if err != nil || p.cfg.Interval != DefaultPollInterval || p.cfg.Timeout != DefaultPollInterval || p.cfg.ReprobeEvery != DefaultReprobeEvery ||
		p.cfg.MetricsPath != DefaultMetricsPath || p.cfg.MaxBodyBytes != MaxLoadBodyBytes || p.metricsURL != "http://127.0.0.1:1/metrics" {
		t.Fatalf("defaults: %+v, %v", p.cfg, err)
	}
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// vllmOnly makes fe answer like a vLLM server: 404 on the SGLang load routes, a /metrics page.
func vllmOnly(t *testing.T) func(fe *fakeEngine) {
	page := string(readTestdata(t, "vllm_metrics.txt"))
	return func(fe *fakeEngine) {
		fe.loads, fe.getLoad, fe.metrics, fe.metricsBdy = http.StatusNotFound, http.StatusNotFound, http.StatusOK, page
	}
}

// TestPollerDetectsPrometheusOnce is issue 14's first complaint: in front of an engine that
// serves only the vLLM API the poller asked /v1/loads and /get_load every second forever.
// Now they are probed once, and the metrics page is read from then on.
func TestPollerDetectsPrometheusOnce(t *testing.T) {
	fe, srv := newFakeEngine(t)
	fe.set(vllmOnly(t))
	p := newTestPoller(t, srv.URL, nil)
	for i := range 5 {
		reps, err := p.Poll(t.Context())
		if err != nil {
			t.Fatalf("poll %d: %v", i, err)
		}
		if len(reps) != 1 || !reps[0].Has(HasNative) || reps[0].Running != 3 || reps[0].Waiting != 2 {
			t.Fatalf("poll %d: reports %+v", i, reps)
		}
	}
	if l, g, m := fe.hitCount(PathLoads), fe.hitCount(PathGetLoad), fe.hitCount(DefaultMetricsPath); l != 1 || g != 1 || m != 5 {
		t.Fatalf("hits /v1/loads %d, /get_load %d, /metrics %d; want 1, 1, 5", l, g, m)
	}
	if p.Source() != SourcePrometheus || p.Info() == nil || p.Info().Flavor != FlavorVLLM || p.Info().Model != "Qwen/Qwen3-8B" {
		t.Fatalf("source %v info %+v", p.Source(), p.Info())
	}
}

// TestPollerLeavesRoutelessEngineAlone: an engine with no load route at all is probed once
// every ReprobeEvery polls, not every poll.
func TestPollerLeavesRoutelessEngineAlone(t *testing.T) {
	fe, srv := newFakeEngine(t)
	fe.set(func(fe *fakeEngine) { fe.loads, fe.getLoad = http.StatusNotFound, http.StatusNotFound })
	p := newTestPoller(t, srv.URL, func(c *PollerConfig) { c.ReprobeEvery = 3 })
	for i := range 8 {
		if _, err := p.Poll(t.Context()); !errors.Is(err, ErrNoLoadRoute) {
			t.Fatalf("poll %d: err %v, want ErrNoLoadRoute", i, err)
		}
	}
	// Probes at polls 0 and 4 (three quiet polls after each), so two of each route.
	for _, path := range []string{PathLoads, PathGetLoad, DefaultMetricsPath} {
		if got := fe.hitCount(path); got != 2 {
			t.Errorf("%s hit %d times in 8 polls, want 2", path, got)
		}
	}
	if p.Source() != SourceNone {
		t.Fatalf("source %v", p.Source())
	}
	// The engine gains a metrics page: found at the next probe.
	fe.set(vllmOnly(t))
	var err error
	for range 4 {
		if _, err = p.Poll(t.Context()); err == nil {
			break
		}
	}
	if err != nil || p.Source() != SourcePrometheus {
		t.Fatalf("after the page appeared: err %v source %v", err, p.Source())
	}
}

// TestPollerRedetectsWhenPageGoes: an engine replaced by one with native routes is found.
func TestPollerRedetectsWhenPageGoes(t *testing.T) {
	fe, srv := newFakeEngine(t)
	fe.set(vllmOnly(t))
	p := newTestPoller(t, srv.URL, nil)
	if _, err := p.Poll(t.Context()); err != nil || p.Source() != SourcePrometheus {
		t.Fatalf("err %v source %v", err, p.Source())
	}
	fe.set(func(fe *fakeEngine) { fe.loads, fe.metrics = http.StatusOK, http.StatusNotFound })
	if _, err := p.Poll(t.Context()); !errors.Is(err, ErrStatus) || p.Source() != SourceNone {
		t.Fatalf("page gone: err %v source %v", err, p.Source())
	}
	if reps, err := p.Poll(t.Context()); err != nil || p.Source() != SourceLoads || !reps[0].Has(HasNative) {
		t.Fatalf("re-detection: reps %+v err %v source %v", reps, err, p.Source())
	}
}

func TestPollerModes(t *testing.T) {
	t.Run("prometheus mode reads only its path and counts malformed pages", func(t *testing.T) {
		fe, srv := newFakeEngine(t)
		fe.set(func(fe *fakeEngine) {
			fe.metrics, fe.metricsAt, fe.metricsBdy = http.StatusOK, "/custom/metrics", "vllm:num_requests_running{engine=\"0\" 1\n"
		})
		p := newTestPoller(t, srv.URL, func(c *PollerConfig) { c.Mode, c.MetricsPath = PollPrometheus, "/custom/metrics" })
		if _, err := p.Poll(t.Context()); !errors.Is(err, ErrMalformed) || p.Malformed() != 1 {
			t.Fatalf("err %v malformed %d", err, p.Malformed())
		}
		fe.set(func(fe *fakeEngine) { fe.metricsBdy = string(readTestdata(t, "sglang_metrics.txt")) })
		reps, err := p.Poll(t.Context())
		if err != nil || reps[0].Running != 12 || p.Info().Flavor != FlavorSGLang || p.Source() != SourcePrometheus {
			t.Fatalf("reps %+v err %v info %+v", reps, err, p.Info())
		}
		if fe.hitCount(PathLoads)+fe.hitCount(PathGetLoad) != 0 {
			t.Fatal("prometheus mode polled a native route")
		}
	})
	t.Run("native mode never scrapes", func(t *testing.T) {
		fe, srv := newFakeEngine(t)
		fe.set(vllmOnly(t))
		p := newTestPoller(t, srv.URL, func(c *PollerConfig) { c.Mode = PollNative })
		if _, err := p.Poll(t.Context()); !errors.Is(err, ErrNoLoadRoute) {
			t.Fatalf("err %v", err)
		}
		if fe.hitCount(DefaultMetricsPath) != 0 {
			t.Fatal("native mode scraped /metrics")
		}
	})
}

// TestPollerKeepsPageAfterFailedScrape: a scrape that fails (5xx, timeout) during detection
// does not send the next round back to the native routes that already answered 404.
func TestPollerKeepsPageAfterFailedScrape(t *testing.T) {
	fe, srv := newFakeEngine(t)
	fe.set(vllmOnly(t))
	fe.set(func(fe *fakeEngine) { fe.metrics = http.StatusServiceUnavailable })
	p := newTestPoller(t, srv.URL, nil)
	for i := range 3 {
		if _, err := p.Poll(t.Context()); !errors.Is(err, ErrStatus) || errors.Is(err, ErrNoLoadRoute) {
			t.Fatalf("poll %d: err %v, want a 503 status error", i, err)
		}
	}
	fe.set(func(fe *fakeEngine) { fe.metrics = http.StatusOK })
	if _, err := p.Poll(t.Context()); err != nil || p.Source() != SourcePrometheus {
		t.Fatalf("err %v source %v", err, p.Source())
	}
	if l, g, m := fe.hitCount(PathLoads), fe.hitCount(PathGetLoad), fe.hitCount(DefaultMetricsPath); l != 1 || g != 1 || m != 4 {
		t.Fatalf("hits /v1/loads %d, /get_load %d, /metrics %d; want 1, 1, 4", l, g, m)
	}
}
