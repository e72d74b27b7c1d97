package httpfront

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"

	"switchyard/config"
)

func TestLifecycleStopsInReverse(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	var order []string
	rec := func(name string) func() {
		return func() {
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
		}
	}
	l := lifecycle{logger: slog.New(slog.NewTextHandler(&logs, nil))}
	l.add("first", rec("first"))
	l.add("panics", func() { panic("boom") })
	loopDone := make(chan struct{})
	l.spawn("loop", func(ctx context.Context) {
		defer close(loopDone)
		<-ctx.Done()
		rec("loop")()
	})
	l.spawn("panicking loop", func(context.Context) { panic("loop boom") })
	l.add("last", rec("last"))
	l.stop()
	select {
	case <-loopDone:
	default:
		t.Fatal("stop returned before the spawned loop ended")
	}
	if want := []string{"last", "loop", "first"}; !slices.Equal(order, want) {
		t.Fatalf("stopped %v, want %v", order, want)
	}
	for _, want := range []string{"part=panics", "part=\"panicking loop\""} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %s: %s", want, logs.String())
		}
	}
	l.stop() // a second stop does nothing
	if len(order) != 3 {
		t.Fatalf("a second stop ran parts again: %v", order)
	}
	l.add("late", rec("late")) // added after the stop: stopped at once
	if order[len(order)-1] != "late" {
		t.Fatalf("a part added after stop was not stopped: %v", order)
	}
}

// TestNewFailureStopsWhatItBuilt makes New fail at its last step (the listen address is
// taken): the workers it registered are stopped again, their telemetry included.
func TestNewFailureStopsWhatItBuilt(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	tele := &fakeTelemetry{}
	cfg := baseConfig()
	cfg.Server.Port = busy.Addr().(*net.TCPAddr).Port
	cfg.Workers = []config.Worker{plainWorker("A", "http://127.0.0.1:1", "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("all", nil, nil, "A")}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if s, err := New(cfg, Options{Telemetry: tele, SkipStartupChecks: true}); err == nil {
		s.life.stop()
		t.Fatal("New listened on a busy port")
	}
	tele.mu.Lock()
	_, started := tele.started["A"]
	stopped := slices.Contains(tele.stopped, "A")
	tele.mu.Unlock()
	if !started || !stopped {
		t.Fatalf("worker A: telemetry started %v, stopped %v", started, stopped)
	}
}
