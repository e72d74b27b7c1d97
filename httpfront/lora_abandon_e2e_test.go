package httpfront

import (
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
