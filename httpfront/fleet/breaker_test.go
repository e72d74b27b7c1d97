package fleet

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

// nowAt is a clock whose time the test sets.
type nowAt struct{ t time.Time }

func (n *nowAt) now() time.Time { return n.t }

// testBreaker is a Breaker with the worker's dispatch count it reads the volume from.
type testBreaker struct {
	*Breaker
	dispatched atomic.Uint64
}

// Record counts a dispatch, as the router's in-flight guard does, then records its outcome.
func (b *testBreaker) Record(o Outcome, probe bool, start time.Time) Transition {
	b.dispatched.Add(1)
	return b.Breaker.Record(o, probe, start)
}

// newTestBreaker returns a breaker of testSettings (changed by mutate) on a clock at t0.
func newTestBreaker(mutate func(*BreakerSettings)) (*testBreaker, *nowAt) {
	s := testSettings()
	if mutate != nil {
		mutate(&s)
	}
	clk := &nowAt{t0}
	b := &testBreaker{}
	b.Breaker = NewBreaker(s, clk.now, b.dispatched.Load)
	return b, clk
}

func testSettings() BreakerSettings {
	return BreakerSettings{Enabled: true, Failures: 3, ErrorRate: 0.5, MinRequests: 10, Window: 10 * time.Second,
		Cooldown: 30 * time.Second, Successes: 1}
}

func TestOutcomeOfStatus(t *testing.T) {
	for status, want := range map[int]Outcome{200: OutcomeSuccess, 204: OutcomeSuccess, 302: OutcomeSuccess,
		400: OutcomeNeutral, 404: OutcomeNeutral, 429: OutcomeNeutral, 500: OutcomeError, 501: OutcomeError,
		502: OutcomeFailure, 503: OutcomeFailure, 504: OutcomeFailure, 507: OutcomeError} {
		if got := OutcomeOfStatus(status); got != want {
			t.Errorf("status %d: %v, want %v", status, got, want)
		}
	}
}

func TestBreakerConsecutiveFailures(t *testing.T) {
	b, _ := newTestBreaker(nil)
	for range 2 {
		if tr := b.Record(OutcomeFailure, false, t0); tr != NoChange {
			t.Fatalf("opened below the threshold: %v", tr)
		}
	}
	b.Record(OutcomeSuccess, false, t0) // a success breaks the run
	b.Record(OutcomeFailure, false, t0)
	b.Record(OutcomeFailure, false, t0)
	b.Record(OutcomeNeutral, false, t0) // neutral outcomes neither break nor extend it
	b.Record(OutcomeError, false, t0)   // nor do request-specific errors
	if b.State() != BreakerClosed {
		t.Fatal("opened at 2 consecutive failures")
	}
	if tr := b.Record(OutcomeFailure, false, t0); tr != Opened || b.State() != BreakerOpen || b.Eligible() {
		t.Fatalf("3 consecutive failures: %v, state %v", tr, b.State())
	}
	if _, _, ok := b.Admit(); ok {
		t.Fatal("an open breaker admitted a dispatch")
	}
	// Outcomes of dispatches admitted before it opened change nothing.
	if tr := b.Record(OutcomeSuccess, false, t0); tr != NoChange || b.State() != BreakerOpen {
		t.Fatal("a late success closed an open breaker")
	}
}

func TestBreakerErrorRate(t *testing.T) {
	t.Run("request errors alone below the volume", func(t *testing.T) {
		b, _ := newTestBreaker(nil)
		for range 9 {
			b.Record(OutcomeError, false, t0)
		}
		if b.State() != BreakerClosed {
			t.Fatal("9 errors opened a breaker that needs a volume of 10")
		}
		if tr := b.Record(OutcomeError, false, t0); tr != Opened {
			t.Fatalf("10 errors out of 10: %v", tr)
		}
	})
	t.Run("errors among successes under the rate", func(t *testing.T) {
		b, _ := newTestBreaker(nil)
		for i := range 100 {
			o := OutcomeSuccess
			if i%3 == 0 {
				o = OutcomeError
			}
			b.Record(o, false, t0.Add(time.Duration(i)*time.Millisecond))
		}
		if b.State() != BreakerClosed {
			t.Fatal("a third of errors opened a breaker at rate 0.5")
		}
	})
	t.Run("4xx never count", func(t *testing.T) {
		b, _ := newTestBreaker(nil)
		b.Record(OutcomeSuccess, false, t0)
		for range 1000 {
			b.Record(OutcomeNeutral, false, t0)
		}
		for range 5 {
			b.Record(OutcomeError, false, t0)
		}
		if b.State() != BreakerClosed {
			t.Fatal("neutral outcomes counted toward the volume")
		}
	})
	t.Run("4xx do not dilute the rate", func(t *testing.T) {
		// Half of the answers that say something of the engine are errors; a flood of 4xx
		// answers (the clients' fault) between them must not hide it.
		b, _ := newTestBreaker(nil)
		for i := range 15 {
			at := t0.Add(time.Duration(i) * time.Millisecond)
			for range 60 {
				b.Record(OutcomeNeutral, false, at)
			}
			b.Record(OutcomeSuccess, false, at)
			if tr := b.Record(OutcomeError, false, at); tr == Opened {
				if i < 4 {
					t.Fatalf("opened after %d errors, below the volume of 10", i+1)
				}
				return
			}
		}
		t.Fatalf("15 errors among 15 successes and 900 4xx answers left the breaker %v", b.State())
	})
	t.Run("neutral outcomes of an older window do not count", func(t *testing.T) {
		b, _ := newTestBreaker(nil)
		for range 100 {
			b.Record(OutcomeNeutral, false, t0)
		}
		later := t0.Add(11 * time.Second)
		for range 5 {
			b.Record(OutcomeSuccess, false, later)
		}
		for range 4 {
			b.Record(OutcomeError, false, later)
		}
		if b.State() != BreakerClosed {
			t.Fatal("opened below the volume")
		}
		if tr := b.Record(OutcomeError, false, later); tr != Opened {
			t.Fatalf("5 errors of 10 in the window: %v", tr)
		}
	})
	t.Run("old errors leave the window", func(t *testing.T) {
		b, _ := newTestBreaker(nil)
		for range 9 {
			b.Record(OutcomeError, false, t0)
		}
		later := t0.Add(11 * time.Second)
		for range 9 {
			b.Record(OutcomeError, false, later)
		}
		if b.State() != BreakerClosed {
			t.Fatal("errors older than the window counted")
		}
		if tr := b.Record(OutcomeError, false, later); tr != Opened {
			t.Fatalf("10 errors within the window: %v", tr)
		}
	})
}

func TestBreakerHalfOpenOneProbe(t *testing.T) {
	b, clk := newTestBreaker(nil)
	for range 3 {
		b.Record(OutcomeFailure, false, t0)
	}
	if tr := b.Expire(t0.Add(29 * time.Second)); tr != NoChange {
		t.Fatal("half-open before the cool-down")
	}
	if tr := b.Expire(t0.Add(30 * time.Second)); tr != HalfOpened || b.State() != BreakerHalfOpen || !b.Eligible() {
		t.Fatalf("after the cool-down: %v, %v", tr, b.State())
	}
	probe, tr, ok := b.Admit()
	if !ok || !probe || tr != ProbeTaken || b.Eligible() {
		t.Fatalf("first dispatch: probe %v, %v, ok %v, eligible %v", probe, tr, ok, b.Eligible())
	}
	if _, _, ok := b.Admit(); ok {
		t.Fatal("a second dispatch got through while the probe is in flight")
	}
	// A neutral probe (the client left) frees the slot.
	if tr := b.Record(OutcomeNeutral, true, t0); tr != ProbeFreed || !b.Eligible() {
		t.Fatalf("neutral probe: %v", tr)
	}
	probe, _, _ = b.Admit()
	clk.t = t0.Add(40 * time.Second)
	if tr := b.Record(OutcomeError, probe, t0.Add(35*time.Second)); tr != Opened || b.State() != BreakerOpen {
		t.Fatalf("a failed probe must reopen: %v", tr)
	}
	if b.Expire(t0.Add(60*time.Second)) != NoChange || b.Expire(t0.Add(70*time.Second)) != HalfOpened {
		t.Fatal("the new cool-down counts from the failed probe")
	}
	probe, _, _ = b.Admit()
	if tr := b.Record(OutcomeSuccess, probe, t0); tr != Closed || b.State() != BreakerClosed {
		t.Fatalf("a good probe must close: %v", tr)
	}
	// Closed again, its window starts empty: one error does not reopen it.
	if tr := b.Record(OutcomeError, false, t0.Add(71*time.Second)); tr != NoChange {
		t.Fatal("the window kept the errors that opened the breaker")
	}
}

func TestBreakerSuccessesToClose(t *testing.T) {
	b, _ := newTestBreaker(func(s *BreakerSettings) { s.Successes = 2 })
	for range 3 {
		b.Record(OutcomeFailure, false, t0)
	}
	b.Expire(t0.Add(time.Minute))
	probe, _, _ := b.Admit()
	if tr := b.Record(OutcomeSuccess, probe, t0); tr != ProbeFreed || b.State() != BreakerHalfOpen {
		t.Fatalf("first good probe of 2: %v", tr)
	}
	probe, _, _ = b.Admit()
	if tr := b.Record(OutcomeSuccess, probe, t0); tr != Closed {
		t.Fatalf("second good probe: %v", tr)
	}
}

func TestBreakerDisabled(t *testing.T) {
	b, _ := newTestBreaker(func(s *BreakerSettings) { s.Enabled = false })
	for range 100 {
		b.Record(OutcomeFailure, false, t0)
	}
	if _, _, ok := b.Admit(); !ok || b.State() != BreakerClosed {
		t.Fatal("a disabled breaker opened")
	}
}

// TestBreakerConcurrentProbe: however many dispatches race for a half-open breaker, one is
// the probe.
func TestBreakerConcurrentProbe(t *testing.T) {
	b, _ := newTestBreaker(nil)
	for range 3 {
		b.Record(OutcomeFailure, false, t0)
	}
	b.Expire(t0.Add(time.Minute))
	var probes, admitted atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 32 {
		wg.Go(func() {
			<-start
			if probe, _, ok := b.Admit(); ok {
				admitted.Add(1)
				if probe {
					probes.Add(1)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if probes.Load() != 1 || admitted.Load() != 1 {
		t.Fatalf("%d probes, %d admitted, want one", probes.Load(), admitted.Load())
	}
}
