package httpfront

import (
	"context"
	"testing"
	"time"

	"switchyard/httpfront/fleet"
	"switchyard/load"
)

// TestRetryChargesBreakerAtItsOwnTime: a retry's outcome counts in its engine's breaker
// window at the retry's time, not at the request's start. The first attempt, on A, lasts
// longer than health.breaker_window before A answers 503; the retry's 500 on B and a second
// request's 500 on B are then two errors in one window, which open B's breaker
// (breaker_min_requests 2). Timed from the request's start, the retry's error would fall in
// a window long gone, and B's breaker would stay closed after one counted error.
func TestRetryChargesBreakerAtItsOwnTime(t *testing.T) {
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	a.fail.Store(503)
	a.delay = make(chan struct{})
	b.fail.Store(500) // an error (not retried): it counts only in the error rate
	cfg := retryConfig(a, b)
	cfg.Health.BreakerFailures = 100 // consecutive failures out of the way: the window decides
	cfg.Health.BreakerErrorRate = 1
	cfg.Health.BreakerMinRequests = 2
	cfg.Health.BreakerWindow = 10 * time.Second
	clock := newFakeClock() // the request's time; the backoff runs on the wall clock
	ts := startServer(t, cfg, Options{NoTelemetry: true, SkipStartupChecks: true, Now: clock.Now})
	mb := ts.workers.Member("B")

	done := make(chan result, 1)
	postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""), done)
	waitUntil(t, "the first attempt to reach A", func() bool { return a.hits.Load() == 1 })
	clock.Advance(time.Minute) // the first attempt outlasts the breaker's window
	close(a.delay)
	if r := collect(t, done, 1, "the retried request")[0]; r.status != 500 || r.header.Get(headerWorker) != "B" {
		t.Fatalf("the retried request: %d %s from %q, want B's 500", r.status, r.code, r.header.Get(headerWorker))
	}
	if st := mb.Breaker().State(); st != fleet.BreakerClosed {
		t.Fatalf("B's breaker %v after one error, want closed", st)
	}
	// A second error on B at the same time: whichever engine the request is offered first,
	// it ends with B's 500.
	if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", "")); r.status != 500 || r.header.Get(headerWorker) != "B" {
		t.Fatalf("the second request: %d %s from %q, want B's 500", r.status, r.body, r.header.Get(headerWorker))
	}
	if n := b.hits.Load(); n != 2 {
		t.Fatalf("B served %d requests, want 2", n)
	}
	if st := mb.Breaker().State(); st != fleet.BreakerOpen {
		t.Fatalf("B's breaker %v after two errors in its window, want open (the retry's error was counted at the request's start)", st)
	}
}

// TestRetryGuardStampedAtItsOwnTime: a retry's in-flight guard on its engine is stamped with
// the retry's time, not with the request's start. The first attempt, on A, lasts a minute
// of the server's clock before A answers 503; while the retry is held on B, B's latest
// dispatch is the clock's now, and the guard is not old enough for the reaper of leaked
// guards (load.Tracker.ReleaseStale) to take it at half that age. A buffered answer and a
// stream alike.
func TestRetryGuardStampedAtItsOwnTime(t *testing.T) {
	for _, tc := range []struct {
		name, extra string
	}{
		{"buffered", ""},
		{"stream", `"stream":true`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama", withGate())
			a.fail.Store(503)
			a.delay = make(chan struct{})
			b.hold, b.entered = make(chan struct{}), make(chan struct{}, 1)
			cfg := retryConfig(a, b)
			cfg.Health.BreakerEnabled = false
			tr := load.NewTracker()
			clock := newFakeClock() // the request's time; the backoff runs on the wall clock
			ts := startServer(t, cfg, Options{NoTelemetry: true, SkipStartupChecks: true, Tracker: tr, Now: clock.Now})

			done := make(chan result, 1)
			postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("llama", "hi", tc.extra), done)
			waitUntil(t, "the first attempt to reach A", func() bool { return a.hits.Load() == 1 })
			clock.Advance(time.Minute)
			close(a.delay)
			if tc.extra == "" {
				waitFor(t, b.entered, "the retry held on B")
			} else {
				waitFor(t, b.streamed, "the retry's stream held on B")
			}
			if got, want := tr.Counters("B").LastDispatch(), clock.Now(); !got.Equal(want) {
				t.Errorf("B's latest dispatch at %v, want the retry's time %v (%v after the request's start)",
					got, want, want.Sub(got))
			}
			if n := tr.ReleaseStale(clock.Now(), 30*time.Second); n != 0 {
				t.Errorf("the reaper released %d guards at half a minute's age: the retry's guard was stamped at the request's start", n)
			}
			close(b.hold)
			close(b.gate)
			if r := collect(t, done, 1, "the retried request")[0]; r.status != 200 || r.header.Get(headerWorker) != "B" {
				t.Fatalf("the retried request: %d %s from %q, want 200 from B", r.status, r.code, r.header.Get(headerWorker))
			}
			ts.waitBackground(t)
		})
	}
}

// TestRetryDispatchedAtItsBackoffEnd: a retry that waited for its backoff is dispatched at
// the backoff's end, and its guard says so: B's latest dispatch is the clock's now once the
// backoff (a second on the server's clock) ended, not the time of the selection that
// preceded the wait.
func TestRetryDispatchedAtItsBackoffEnd(t *testing.T) {
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	a.fail.Store(503)
	b.hold, b.entered = make(chan struct{}), make(chan struct{}, 1)
	cfg := retryConfig(a, b)
	cfg.Health.BreakerEnabled = false
	cfg.Retry.InitialBackoff, cfg.Retry.MaxBackoff = time.Second, time.Second
	tr := load.NewTracker()
	clock := newFakeClock() // the request's time and the backoff's
	clock.scheduled = make(chan time.Duration, 4)
	ts := startServer(t, cfg, Options{NoTelemetry: true, SkipStartupChecks: true, Tracker: tr, Clock: clock})

	done := make(chan result, 1)
	postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""), done)
	var wait time.Duration
	select {
	case wait = <-clock.scheduled: // A failed, the retry's selection picked B, its backoff began
	case <-time.After(10 * time.Second):
		t.Fatal("the request never waited for its retry")
	}
	clock.Advance(wait)
	waitFor(t, b.entered, "the retry held on B")
	if got, want := tr.Counters("B").LastDispatch(), clock.Now(); !got.Equal(want) {
		t.Errorf("B's latest dispatch at %v, want the backoff's end %v (%v later)", got, want, want.Sub(got))
	}
	close(b.hold)
	if r := collect(t, done, 1, "the retried request")[0]; r.status != 200 || r.header.Get(headerWorker) != "B" {
		t.Fatalf("the retried request: %d %s from %q, want 200 from B", r.status, r.code, r.header.Get(headerWorker))
	}
	ts.waitBackground(t)
}

// TestRetryPDGuardsStampedAtTheirOwnTime: a retried prefill/decode pair's guards are stamped
// with the retry's time, as a plain retry's: the first prefill, on P1, lasts a minute of the
// server's clock before P1 answers 503; while the retry's prefill is held on P2, P2's and
// D1's latest dispatches are the clock's now.
func TestRetryPDGuardsStampedAtTheirOwnTime(t *testing.T) {
	p1, p2, p3 := newFakeEngine(t, "P1", "llama", withMode("prefill")), newFakeEngine(t, "P2", "llama", withMode("prefill")),
		newFakeEngine(t, "P3", "llama", withMode("prefill"))
	d1, d3 := newFakeEngine(t, "D1", "llama", withMode("decode")), newFakeEngine(t, "D3", "llama", withMode("decode"))
	p1.fail.Store(503)
	p1.delay = make(chan struct{})
	p2.hold, p2.entered = make(chan struct{}), make(chan struct{}, 1)
	cfg := pdRetryConfig(p1, p2, d1, p3, d3)
	cfg.Health.BreakerEnabled = false
	tr := load.NewTracker()
	clock := newFakeClock() // the request's time; the backoff runs on the wall clock
	ts := startServer(t, cfg, Options{NoTelemetry: true, SkipStartupChecks: true, Tracker: tr, Now: clock.Now})

	done := make(chan result, 1)
	postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""), done)
	waitUntil(t, "the first prefill to reach P1", func() bool { return p1.hits.Load() == 1 })
	clock.Advance(time.Minute)
	close(p1.delay)
	waitFor(t, p2.entered, "the retry's prefill held on P2")
	for _, id := range []string{"P2", "D1"} {
		if got, want := tr.Counters(id).LastDispatch(), clock.Now(); !got.Equal(want) {
			t.Errorf("%s's latest dispatch at %v, want the retry's time %v (%v after the request's start)", id, got, want, want.Sub(got))
		}
	}
	close(p2.hold)
	if r := collect(t, done, 1, "the retried request")[0]; r.status != 200 || r.header.Get(headerPrefillWorker) != "P2" {
		t.Fatalf("the retried request: %d %s from %q, want 200 with P2's prefill", r.status, r.code, r.header.Get(headerPrefillWorker))
	}
	ts.waitBackground(t)
}
