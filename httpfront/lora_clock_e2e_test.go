package httpfront

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestAdapterRetrySelectsAtClockNow: a retry's selection runs at the server clock's now,
// not at the request's start: after a first attempt that lasted longer than
// lora.load_timeout, the slot the retry reserves on B for the adapter's load is live at the
// clock's now (a reservation timed from the start would have lapsed already), and the
// request succeeds on B with one load.
func TestAdapterRetrySelectsAtClockNow(t *testing.T) {
	a := newFakeEngine(t, "A", "llama", withLoRA(4, "math"))
	b := newFakeEngine(t, "B", "llama", withLoRA(1))
	a.fail.Store(503) // inference only: its adapter routes answer
	a.delay = make(chan struct{})
	cfg := retryConfig(a, b)
	withAdapters(cfg, map[string]string{"math": "/adapters/math"})
	cfg.LoRA.LoadTimeout = time.Minute
	cfg.LoRA.MaxSlotWaiters = 0
	clock := newFakeClock() // advanced during the first attempt, and to end the backoff
	clock.scheduled = make(chan time.Duration, 4)
	ts := startServer(t, cfg, Options{NoTelemetry: true, SkipStartupChecks: true, Clock: clock})
	adapterWorker(t, ts, "A", "math")
	wb := slotsWorker(t, ts, "B", 1)

	done := make(chan result, 1)
	postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("math", "hi", ""), done)
	waitUntil(t, "the first attempt to reach A", func() bool { return a.hits.Load() == 1 })
	clock.Advance(2 * time.Minute) // the first attempt outlasts lora.load_timeout
	close(a.delay)
	select {
	case <-clock.scheduled: // the retry's selection picked B, and its backoff began
	case <-time.After(10 * time.Second):
		t.Fatal("the request never waited for its retry")
	}
	if now := clock.Now(); !wb.Adapters().Loading("math", now) {
		t.Fatal("the retry's reservation of B's slot for math is not live at the clock's now")
	}
	clock.Advance(time.Second) // the backoff ends
	r := collect(t, done, 1, "the request")[0]
	if r.status != 200 || r.header.Get(headerWorker) != "B" {
		t.Fatalf("status %d %s from %q, want 200 from B", r.status, r.code, r.header.Get(headerWorker))
	}
	if _, calls := b.loraState(); !slices.Equal(calls, []string{"load math"}) {
		t.Fatalf("B got the adapter calls %v, want one load", calls)
	}
	ts.waitBackground(t)
}

// TestAdapterListOnServerClock: the router's adapter loads and its questions of an engine's
// adapter list are timed on one clock, the server's (Options.Clock): with a clock far
// ahead of the wall's, a list asked after the router loaded an adapter, which the engine has
// unloaded since, is the engine's word (a load timed on one clock and a question on another
// would keep the adapter as loaded after the question).
func TestAdapterListOnServerClock(t *testing.T) {
	a := newFakeEngine(t, "A", "llama", withLoRA(2))
	cfg := loraConfigA(a, map[string]string{"math": "/adapters/math"})
	clock := newFakeClock()
	clock.Advance(20 * 365 * 24 * time.Hour) // far ahead of the wall clock
	ts := startServer(t, cfg, Options{SkipStartupChecks: true, Clock: clock})
	wa := slotsWorker(t, ts, "A", 2)

	if r := post(t, ts.url+"/v1/chat/completions", chatBody("math", "hi", "")); r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if !wa.Adapters().Has("math") {
		t.Fatal("the router does not count math on A after loading it")
	}
	clock.Advance(time.Second)
	a.lora.mu.Lock()
	a.lora.names = nil // unloaded behind the router's back
	a.lora.mu.Unlock()
	ts.workers.RefreshAdapters(context.Background(), ts.workers.Member("A"))
	if s := wa.Adapters(); s.Has("math") {
		t.Fatalf("after a list asked after the load: %v, want none", s.Names())
	}
	ts.waitBackground(t)
}
