package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/load"
)

// modelEngine answers the routes that name a model: only those in routes (path → body),
// every other with 404; while down, every route answers 503.
type modelEngine struct {
	url    string
	down   atomic.Bool
	routes map[string]string
	asked  atomic.Int32
}

func newModelEngine(t *testing.T, routes map[string]string) *modelEngine {
	t.Helper()
	e := &modelEngine{routes: routes}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.asked.Add(1)
		if e.down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if r.URL.Path == PathHealth {
			return
		}
		body, ok := e.routes[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, body)
	}))
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return e
}

func testClient(t *testing.T) *fasthttp.Client {
	t.Helper()
	c := &fasthttp.Client{}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func TestDiscoverModel(t *testing.T) {
	tests := []struct {
		name   string
		routes map[string]string
		want   string
	}{
		{"server_info", map[string]string{PathServerInfo: `{"model_path":"/m/llama","served_model_name":"llama"}`,
			PathModels: `{"data":[{"id":"other"}]}`}, "llama"},
		{"get_server_info without a served name", map[string]string{PathGetServerInfo: `{"model_path":"/m/llama"}`}, "/m/llama"},
		{"v1/models (vLLM)", map[string]string{PathModels: `{"object":"list","data":[{"id":"Qwen/Qwen3-8B"},{"id":"lora"}]}`}, "Qwen/Qwen3-8B"},
		{"get_model_info", map[string]string{PathModels: `{"data":[]}`, PathGetModelInfo: `{"model_path":"/m/x","is_generation":true}`}, "/m/x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newModelEngine(t, tt.routes)
			got, err := DiscoverModel(context.Background(), testClient(t), e.url, 2*time.Second)
			if err != nil || got != tt.want {
				t.Fatalf("DiscoverModel = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
	e := newModelEngine(t, map[string]string{PathModels: `not json`})
	if _, err := DiscoverModel(context.Background(), testClient(t), e.url, 2*time.Second); !errors.Is(err, ErrNoModel) {
		t.Fatalf("an engine naming no model: %v", err)
	}
}

// signalClock is a manual clock that says when a timer is scheduled.
type signalClock struct {
	*manualClock
	scheduled chan time.Duration
}

func (c *signalClock) AfterFunc(d time.Duration, f func()) func() bool {
	stop := c.manualClock.AfterFunc(d, f)
	c.scheduled <- d
	return stop
}

func TestWaitForModel(t *testing.T) {
	a := newModelEngine(t, map[string]string{PathModels: `{"data":[{"id":"m"}]}`})
	b := newModelEngine(t, map[string]string{PathServerInfo: `{"model_path":"m"}`})
	b.down.Store(true) // starting
	clock := &signalClock{manualClock: newManualClock(), scheduled: make(chan time.Duration, 1)}
	got := make(chan error, 1)
	var model string
	go func() {
		var err error
		model, err = WaitForModel(context.Background(), testClient(t), []string{a.url, b.url}, time.Minute, 10*time.Second, clock)
		got <- err
	}()
	if d := <-clock.scheduled; d != 10*time.Second {
		t.Fatalf("retry after %s, want 10s", d)
	}
	askedA := a.asked.Load()
	b.down.Store(false)
	clock.Advance(10 * time.Second)
	if err := <-got; err != nil || model != "m" {
		t.Fatalf("WaitForModel = %q, %v", model, err)
	}
	if a.asked.Load() != askedA {
		t.Errorf("an engine that answered was asked again")
	}

	// An engine that never answers: the wait ends at the timeout.
	b.down.Store(true)
	go func() {
		_, err := WaitForModel(context.Background(), testClient(t), []string{b.url}, 15*time.Second, 10*time.Second, clock)
		got <- err
	}()
	<-clock.scheduled
	clock.Advance(10 * time.Second)
	<-clock.scheduled
	clock.Advance(10 * time.Second)
	if err := <-got; err == nil || !errors.Is(err, ErrNoModel) || !strings.Contains(err.Error(), "within 15s") {
		t.Fatalf("never ready: %v", err)
	}

	// Engines of different models.
	c := newModelEngine(t, map[string]string{PathModels: `{"data":[{"id":"other"}]}`})
	_, err := WaitForModel(context.Background(), testClient(t), []string{a.url, c.url}, time.Minute, time.Second, clock)
	if err == nil || !strings.Contains(err.Error(), "different models") {
		t.Fatalf("different models: %v", err)
	}
}

// logRecords is a slog handler that sends every record's message to a channel.
type logRecords chan string

func (l logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l logRecords) Handle(_ context.Context, r slog.Record) error {
	select {
	case l <- r.Message:
	default:
	}
	return nil
}
func (l logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l logRecords) WithGroup(string) slog.Handler      { return l }

// jobFleet is a Fleet for AddLater tests: a recorder telemetry, a signal clock and a log of
// messages.
func jobFleet(t *testing.T) (*Fleet, *engine.WorkerSet, *recorder, *signalClock, logRecords) {
	t.Helper()
	ws, err := engine.NewWorkerSet(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Health.StartupTimeout = 15 * time.Second
	cfg.Health.StartupCheckInterval = 10 * time.Second
	rec := newRecorder()
	clock := &signalClock{manualClock: newManualClock(), scheduled: make(chan time.Duration, 8)}
	logs := make(logRecords, 64)
	f := New(ws, Options{Health: cfg.Health, Upstream: cfg.Upstream, Tracker: load.NewTracker(), Metrics: metrics.NewSet(),
		Clock: clock, Telemetry: rec, Logger: slog.New(logs)})
	t.Cleanup(func() {
		f.Stop()
		f.CloseConnections()
	})
	return f, ws, rec, clock, logs
}

func waitLog(t *testing.T, logs logRecords, msg string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case m := <-logs:
			if m == msg {
				return
			}
		case <-timeout:
			t.Fatalf("no log %q", msg)
		}
	}
}

// TestAddLater: a worker given by URL alone is added in the background with the model its
// engine names, healthy at once; a second addition of the same URL is refused meanwhile; an
// engine that never answers leaves a failed job, kept for a while, then forgotten.
func TestAddLater(t *testing.T) {
	f, ws, rec, clock, logs := jobFleet(t)
	e := newModelEngine(t, map[string]string{PathModels: `{"data":[{"id":"served"}]}`})
	e.down.Store(true)
	id, err := f.AddLater(Spec{URL: e.url + "/"})
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.TrimPrefix(e.url, "http://"); id != want {
		t.Errorf("ID %q, want %q", id, want)
	}
	<-clock.scheduled // the first attempt failed: the job waits
	if st, jid, ok := f.Job(e.url); !ok || jid != id || st.Status != JobProcessing || st.JobType != JobAddWorker || st.WorkerURL != e.url+"/" {
		t.Errorf("job %+v %v", st, ok)
	}
	if _, err := f.AddLater(Spec{URL: e.url}); !errors.Is(err, ErrWorkerExists) {
		t.Errorf("a second addition of the same URL: %v", err)
	}
	e.down.Store(false)
	clock.Advance(10 * time.Second)
	rec.waitFor(t, "the worker's telemetry", func() bool { return len(rec.started) == 1 })
	w := ws.Load().Worker(id)
	if w == nil || w.Model != "served" || !w.Healthy() {
		t.Fatalf("added %+v", w)
	}
	if _, _, ok := f.Job(e.url); ok {
		t.Errorf("a finished addition keeps a job")
	}
	if m := f.MemberByURL(e.url + "/"); m == nil || m.ID() != id {
		t.Errorf("MemberByURL = %v", m)
	}
	if _, err := f.AddLater(Spec{URL: e.url}); !errors.Is(err, ErrWorkerExists) {
		t.Errorf("adding a known URL again: %v", err)
	}

	dead := newModelEngine(t, nil)
	dead.down.Store(true)
	if _, err := f.AddLater(Spec{URL: dead.url, ID: "dead"}); err != nil {
		t.Fatal(err)
	}
	<-clock.scheduled
	clock.Advance(10 * time.Second)
	<-clock.scheduled
	clock.Advance(10 * time.Second)
	waitLog(t, logs, "cannot add worker")
	st, _, ok := f.Job("dead")
	if !ok || st.Status != JobFailed || !strings.Contains(st.Message, "within 15s") {
		t.Fatalf("failed job %+v %v", st, ok)
	}
	if ws.Load().Worker("dead") != nil {
		t.Error("a worker whose engine never answered was added")
	}
	clock.Advance(jobFailureTTL + time.Second)
	if _, _, ok := f.Job(dead.url); ok {
		t.Error("a failed job outlived its TTL")
	}
	if _, err := f.AddLater(Spec{URL: "ftp://x"}); !errors.Is(err, ErrInvalidWorker) {
		t.Errorf("bad URL: %v", err)
	}
}

// TestStopEndsAdditions: Stop cancels an addition waiting for its engine and waits for it;
// nothing is added afterwards.
func TestStopEndsAdditions(t *testing.T) {
	f, ws, _, clock, _ := jobFleet(t)
	e := newModelEngine(t, map[string]string{PathModels: `{"data":[{"id":"m"}]}`})
	e.down.Store(true)
	if _, err := f.AddLater(Spec{URL: e.url}); err != nil {
		t.Fatal(err)
	}
	<-clock.scheduled
	f.Stop() // returns only once the job has ended
	if len(ws.Load().Workers()) != 0 {
		t.Error("a worker was added by a stopped fleet")
	}
	if _, err := f.AddLater(Spec{URL: e.url}); err == nil {
		t.Error("a stopped fleet took an addition")
	}
}
