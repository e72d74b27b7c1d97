package httpfront

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestAdapterPDLoadFailureGivesBackDecodeSlot: a PD request whose prefill engine fails the
// adapter load is never dispatched, and the slot its pick reserved on the decode engine,
// whose load never began, is free again at once (not after lora.load_timeout): the next
// request for another adapter finds room there.
func TestAdapterPDLoadFailureGivesBackDecodeSlot(t *testing.T) {
	p := newFakeEngine(t, "P", "llama", withMode("prefill"), withLoRA(1))
	p.bootstrapPort = 8998
	p.lora.loadStatus.Store(500)
	d := newFakeEngine(t, "D", "llama", withMode("decode"), withLoRA(1))
	d.expectHost, d.expectPort = "127.0.0.1", 8998
	cfg := pdConfig(p, d, ptr(8998))
	withAdapters(cfg, map[string]string{"math": "/adapters/math"})
	cfg.LoRA.LoadTimeout = time.Hour // a reservation left behind would hold D's slot
	ts := startServer(t, cfg, Options{SkipStartupChecks: true})
	workers := learnedWorkers(t, ts, 2)
	wp, wd := workers["P"], workers["D"]

	r := post(t, ts.url+"/v1/chat/completions", chatBody("math", "hi", ""))
	if r.status != 502 || r.errorCode() != CodeAdapterLoad {
		t.Fatalf("status %d %s: %s", r.status, r.errorCode(), r.body)
	}
	now := time.Now()
	for _, w := range []struct {
		id   string
		free bool
	}{{"P", wp.Adapters().Free(now)}, {"D", wd.Adapters().Free(now)}} {
		if !w.free {
			t.Errorf("%s's adapter slot is still taken after the request failed", w.id)
		}
	}
	if wd.Adapters().Loading("math", now) {
		t.Error("D still counts a load of math that never began")
	}
	if _, calls := d.loraState(); len(calls) != 0 {
		t.Errorf("D got the adapter calls %v, want none (P's load failed first)", calls)
	}
	if _, calls := p.loraState(); !slices.Equal(calls, []string{"load math"}) {
		t.Errorf("P got the adapter calls %v, want one load", calls)
	}
	ts.waitBackground(t)
}

// TestAdapterRetryAbandonedGivesBackSlot: a retry whose selection reserved a slot on B for
// the request's adapter, and whose client leaves during the backoff, is never dispatched:
// B's slot is free again at once, and B is never asked to load the adapter.
func TestAdapterRetryAbandonedGivesBackSlot(t *testing.T) {
	a := newFakeEngine(t, "A", "llama", withLoRA(4, "math"))
	b := newFakeEngine(t, "B", "llama", withLoRA(1))
	a.fail.Store(503) // inference only: its adapter routes answer
	cfg := retryConfig(a, b)
	withAdapters(cfg, map[string]string{"math": "/adapters/math"})
	cfg.LoRA.LoadTimeout = time.Hour // a reservation left behind would hold B's slot
	clock := newFakeClock()          // never advanced: the backoff ends only when the client leaves
	clock.scheduled = make(chan time.Duration, 4)
	clock.stopped = make(chan struct{}, 4)
	ts := startServer(t, cfg, Options{NoTelemetry: true, SkipStartupChecks: true, Clock: clock})
	adapterWorker(t, ts, "A", "math")
	wb := slotsWorker(t, ts, "B", 1)

	conn := sendChat(t, ts, chatBody("math", "hi", ""))
	select {
	case <-clock.scheduled:
	case <-time.After(10 * time.Second):
		t.Fatal("the request never waited for its retry")
	}
	if now := clock.Now(); !wb.Adapters().Loading("math", now) {
		t.Fatal("the retry's selection did not reserve B's slot for math")
	}
	_ = conn.Close()
	waitFor(t, clock.stopped, "the backoff to end when the client left")
	ts.stop(t) // the handler has returned: nothing can dispatch any more
	if now := clock.Now(); !wb.Adapters().Free(now) || wb.Adapters().Loading("math", now) {
		t.Fatal("B's slot is still reserved for a retry that was never dispatched")
	}
	if _, calls := b.loraState(); len(calls) != 0 || b.hits.Load() != 0 {
		t.Fatalf("B got the adapter calls %v and %d requests, want none", calls, b.hits.Load())
	}
}

// TestAdapterSharedLoadFailedNoLoadWithoutReservation: a retry that picked an engine while
// another request's load of the adapter was under way there shares that load's slot
// reservation; when that load fails before the retry dispatches (its backoff), the
// reservation is gone, and the retry does not load without one: it is selected again, as
// any request. With the engine's slot free, the new selection reserves it and loads; with
// another pick holding it meanwhile, the new selection finds no engine and the client gets
// the first attempt's answer, and the engine is never asked to load the adapter into a slot
// reserved for another.
func TestAdapterSharedLoadFailedNoLoadWithoutReservation(t *testing.T) {
	tests := []struct {
		name       string
		takeSlot   bool // another pick reserves B's one slot after the failed load
		wantStatus int
		wantWorker string
		wantCalls  []string
	}{
		{name: "the slot is free", wantStatus: 200, wantWorker: "B", wantCalls: []string{"load math", "load math"}},
		{name: "the slot is taken", takeSlot: true, wantStatus: 503, wantWorker: "A", wantCalls: []string{"load math"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newFakeEngine(t, "A", "llama", withLoRA(4, "math"))
			b := newFakeEngine(t, "B", "llama", withLoRA(1), withLoRALoadGate())
			a.fail.Store(503) // inference only: every request is retried on B
			cfg := retryConfig(a, b)
			withAdapters(cfg, map[string]string{"math": "/adapters/math"})
			cfg.LoRA.LoadTimeout = time.Hour
			cfg.LoRA.MaxSlotWaiters = 0 // a selection that finds B's slot taken fails at once
			clock := newFakeClock()     // advanced only to end a backoff
			clock.scheduled = make(chan time.Duration, 8)
			ts := startServer(t, cfg, Options{NoTelemetry: true, SkipStartupChecks: true, Clock: clock})
			adapterWorker(t, ts, "A", "math")
			wb := slotsWorker(t, ts, "B", 1)
			backoff := func(what string) {
				t.Helper()
				select {
				case <-clock.scheduled:
				case <-time.After(10 * time.Second):
					t.Fatalf("%s never waited for its retry", what)
				}
			}

			first, second := make(chan result, 1), make(chan result, 1)
			postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("math", "hi", ""), first)
			backoff("the first request")
			clock.Advance(time.Second)
			waitFor(t, b.lora.loading, "the first request's load of math on B")
			postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("math", "hi", ""), second)
			backoff("the second request") // its retry picked B, sharing the load under way
			b.lora.loadStatus.Store(500)
			close(b.lora.gate) // the first request's load fails
			if r := collect(t, first, 1, "the first request")[0]; r.status != 502 || r.code != CodeAdapterLoad {
				t.Fatalf("the first request: %d %s, want 502 %s", r.status, r.code, CodeAdapterLoad)
			}
			b.lora.loadStatus.Store(0) // the next load succeeds
			now := clock.Now()
			if wb.Adapters().Loading("math", now) {
				t.Fatal("the failed load's reservation is still there")
			}
			if tt.takeSlot && !reserved(wb.ReserveAdapter("sql", now, now.Add(time.Hour), nil)) {
				t.Fatal("B's slot is not free after the failed load")
			}
			clock.Advance(time.Second) // the second request's backoff ends
			r := collect(t, second, 1, "the second request")[0]
			if r.status != tt.wantStatus || r.header.Get(headerWorker) != tt.wantWorker {
				t.Fatalf("the second request: %d %s from %q, want %d from %s", r.status, r.code, r.header.Get(headerWorker), tt.wantStatus, tt.wantWorker)
			}
			if _, calls := b.loraState(); !slices.Equal(calls, tt.wantCalls) {
				t.Fatalf("B got the adapter calls %v, want %v", calls, tt.wantCalls)
			}
			// The second request's pick whose reservation went is counted, once.
			if got := metricValue(t, ts, `switchyard_lora_picks_total{model="llama",result="reselected"}`); got != 1 {
				t.Errorf("reselected picks = %v, want 1", got)
			}
			if tt.takeSlot {
				if s := wb.Adapters(); s.Loading("math", now) || s.Has("math") || !s.Loading("sql", now) {
					t.Fatalf("B's slot: math held %v or loading %v, sql loading %v; want sql's reservation alone",
						s.Has("math"), s.Loading("math", now), s.Loading("sql", now))
				}
			}
			ts.waitBackground(t)
		})
	}
}
