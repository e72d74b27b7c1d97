package flow

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// attempt runs Acquire on its own goroutine and delivers its result.
type attempt struct {
	done chan error
}

func start(l *Limiter, arrived time.Time, c Cancel) *attempt {
	a := &attempt{done: make(chan error, 1)}
	go func() { a.done <- l.Acquire(arrived, Class{}, c) }()
	return a
}

// result returns a's error if it has finished (call after synctest.Wait), failing the test
// otherwise.
func (a *attempt) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-a.done:
		return err
	default:
		t.Fatal("Acquire still waiting")
		return nil
	}
}

// waiting reports whether a is still blocked (call after synctest.Wait).
func (a *attempt) waiting() bool { return len(a.done) == 0 }

func TestLimiterFastPath(t *testing.T) {
	l := NewLimiter("router", 3, 0, time.Second, nil)
	for i := range 3 {
		if err := l.Acquire(time.Now(), Class{}, Cancel{}); err != nil {
			t.Fatalf("Acquire %d under the limit: %v", i, err)
		}
	}
	if l.Active() != 3 || l.Queued() != 0 {
		t.Fatalf("active %d queued %d", l.Active(), l.Queued())
	}
	err := l.Acquire(time.Now(), Class{}, Cancel{})
	var le *LimitError
	if !errors.Is(err, ErrQueueFull) || !errors.As(err, &le) || le.Scope != "router" {
		t.Fatalf("over the limit with no queue: %v, want a router ErrQueueFull", err)
	}
	for range 3 {
		l.Release()
	}
	if l.Active() != 0 {
		t.Fatalf("active %d after releasing", l.Active())
	}
	defer func() {
		if recover() == nil {
			t.Fatal("Release without Acquire did not panic")
		}
	}()
	l.Release()
}

func TestLimiterQueueInArrivalOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLimiter("router", 1, 3, time.Minute, nil)
		if err := l.Acquire(time.Now(), Class{}, Cancel{}); err != nil {
			t.Fatal(err)
		}
		var queued []*attempt
		for range 3 {
			queued = append(queued, start(l, time.Now(), Cancel{}))
			synctest.Wait() // each is queued before the next arrives
		}
		if l.Queued() != 3 {
			t.Fatalf("queued %d, want 3", l.Queued())
		}
		// The queue is full: a fifth request is refused at once.
		if err := l.Acquire(time.Now(), Class{}, Cancel{}); !errors.Is(err, ErrQueueFull) {
			t.Fatalf("full queue: %v", err)
		}
		for i, a := range queued {
			l.Release() // hands the slot to the head of the queue
			synctest.Wait()
			if err := a.result(t); err != nil {
				t.Fatalf("waiter %d: %v", i, err)
			}
			for _, later := range queued[i+1:] {
				if !later.waiting() {
					t.Fatalf("a later waiter got the slot before waiter %d", i)
				}
			}
			if l.Active() != 1 {
				t.Fatalf("active %d while handing over", l.Active())
			}
		}
		l.Release()
		if l.Active() != 0 || l.Queued() != 0 {
			t.Fatalf("active %d queued %d at the end", l.Active(), l.Queued())
		}
	})
}

func TestLimiterNewArrivalsQueueBehindWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLimiter("router", 2, 4, time.Minute, nil)
		l.Acquire(time.Now(), Class{}, Cancel{})
		l.Acquire(time.Now(), Class{}, Cancel{})
		first := start(l, time.Now(), Cancel{})
		synctest.Wait()
		second := start(l, time.Now(), Cancel{})
		synctest.Wait()
		l.Release()
		l.Release()
		synctest.Wait()
		if first.result(t) != nil || second.result(t) != nil {
			t.Fatal("waiters refused")
		}
		// Both slots went to the waiters, in order: a new arrival waits.
		late := start(l, time.Now(), Cancel{})
		synctest.Wait()
		if !late.waiting() {
			t.Fatal("a new arrival took a slot held by the waiters")
		}
		l.Release()
		synctest.Wait()
		if late.result(t) != nil {
			t.Fatal("late waiter refused")
		}
		l.Release()
		l.Release()
	})
}

func TestLimiterQueueTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLimiter("model llama", 1, 2, time.Second, nil)
		l.Acquire(time.Now(), Class{}, Cancel{})
		arrived := time.Now()
		a := start(l, arrived, Cancel{})
		time.Sleep(999 * time.Millisecond)
		synctest.Wait()
		if !a.waiting() {
			t.Fatal("the wait ended before its timeout")
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		err := a.result(t)
		var le *LimitError
		if !errors.Is(err, ErrQueueTimeout) || !errors.As(err, &le) || le.Scope != "model llama" {
			t.Fatalf("after the timeout: %v", err)
		}
		if l.Queued() != 0 {
			t.Fatalf("a timed-out request stayed queued")
		}
		// The timeout counts from arrival, not from queueing.
		b := start(l, time.Now().Add(-800*time.Millisecond), Cancel{})
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		if !errors.Is(b.result(t), ErrQueueTimeout) {
			t.Fatal("the timeout did not count from arrival")
		}
		l.Release()
		if l.Active() != 0 {
			t.Fatalf("active %d", l.Active())
		}
	})
}

func TestLimiterCancel(t *testing.T) {
	for _, tt := range []struct {
		name string
		want error
	}{{"client gone", ErrClientGone}, {"router stops", ErrStopped}} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := NewLimiter("router", 1, 3, time.Minute, nil)
				l.Acquire(time.Now(), Class{}, Cancel{})
				ch := make(chan struct{})
				w := &chanWatcher{gone: ch}
				c := Cancel{Client: w}
				if tt.want == ErrStopped {
					c = Cancel{Stop: ch}
				}
				before := start(l, time.Now(), Cancel{})
				synctest.Wait()
				leaving := start(l, time.Now(), c)
				synctest.Wait()
				after := start(l, time.Now(), Cancel{})
				synctest.Wait()
				close(ch)
				synctest.Wait()
				if err := leaving.result(t); !errors.Is(err, tt.want) {
					t.Fatalf("err %v, want %v", err, tt.want)
				}
				if l.Queued() != 2 {
					t.Fatalf("queued %d: the request that left is still queued", l.Queued())
				}
				l.Release()
				synctest.Wait()
				if before.result(t) != nil || !after.waiting() {
					t.Fatal("the queue order broke when a request left")
				}
				l.Release()
				synctest.Wait()
				if after.result(t) != nil {
					t.Fatal("the last waiter was refused")
				}
				l.Release()
				if l.Active() != 0 || l.Queued() != 0 {
					t.Fatalf("active %d queued %d", l.Active(), l.Queued())
				}
				if tt.want == ErrClientGone && (w.watches != 1 || w.stops != 1) {
					t.Fatalf("watched %d times, stopped %d", w.watches, w.stops)
				}
			})
		})
	}
}

// chanWatcher reports the client gone when gone is closed, and counts its calls.
type chanWatcher struct {
	gone           chan struct{}
	watches, stops int
}

func (w *chanWatcher) Watch() (<-chan struct{}, func()) {
	w.watches++
	return w.gone, func() { w.stops++ }
}

// TestLimiterWatchesOnlyWaiters: the client is watched only while its request waits.
func TestLimiterWatchesOnlyWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLimiter("router", 1, 1, time.Minute, nil)
		w := &chanWatcher{gone: make(chan struct{})}
		if err := l.Acquire(time.Now(), Class{}, Cancel{Client: w}); err != nil || w.watches != 0 {
			t.Fatalf("fast path: %v, %d watches", err, w.watches)
		}
		a := start(l, time.Now(), Cancel{Client: w})
		synctest.Wait()
		l.Release()
		synctest.Wait()
		if a.result(t) != nil || w.watches != 1 || w.stops != 1 {
			t.Fatalf("slow path: %d watches, %d stops", w.watches, w.stops)
		}
		b := start(l, time.Now(), Cancel{}) // fills the queue
		synctest.Wait()
		if err := l.Acquire(time.Now(), Class{}, Cancel{Client: w}); !errors.Is(err, ErrQueueFull) || w.watches != 1 {
			t.Fatalf("refused at once: %v, %d watches", err, w.watches)
		}
		l.Release()
		synctest.Wait()
		if b.result(t) != nil {
			t.Fatal("waiter refused")
		}
		l.Release()
	})
}

// recorder is an Observer that records events.
type recorder struct {
	mu     sync.Mutex
	queued int
	done   []error
	waits  []time.Duration
}

func (r *recorder) Queued(*Limiter) {
	r.mu.Lock()
	r.queued++
	r.mu.Unlock()
}

func (r *recorder) Dequeued(_ *Limiter, wait time.Duration, err error) {
	r.mu.Lock()
	r.done = append(r.done, err)
	r.waits = append(r.waits, wait)
	r.mu.Unlock()
}

func TestLimiterObserver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		l := NewLimiter("router", 1, 1, time.Second, rec)
		l.Acquire(time.Now(), Class{}, Cancel{}) // fast path: no event
		a := start(l, time.Now(), Cancel{})
		synctest.Wait()
		l.Acquire(time.Now(), Class{}, Cancel{}) // queue full
		time.Sleep(300 * time.Millisecond)
		l.Release()
		synctest.Wait()
		if a.result(t) != nil {
			t.Fatal("waiter refused")
		}
		l.Release()
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if rec.queued != 1 || len(rec.done) != 2 || !errors.Is(rec.done[0], ErrQueueFull) || rec.done[1] != nil {
			t.Fatalf("events: queued %d, done %v", rec.queued, rec.done)
		}
		if rec.waits[0] != 0 || rec.waits[1] != 300*time.Millisecond {
			t.Fatalf("waits %v, want [0 300ms]", rec.waits)
		}
	})
}

// TestLimiterStress runs many requests with random cancellations and timeouts against a
// small limit on real goroutines: the limit is never exceeded, and every slot comes back.
func TestLimiterStress(t *testing.T) {
	const limit, goroutines, rounds = 3, 16, 200
	l := NewLimiter("router", limit, 8, 5*time.Millisecond, nil)
	var inside, peak atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for range rounds {
				gone := make(chan struct{})
				if rng.IntN(4) == 0 {
					close(gone)
				}
				if err := l.Acquire(time.Now(), Class{}, Cancel{Client: closedWatcher(gone)}); err != nil {
					continue
				}
				n := inside.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				if rng.IntN(8) == 0 {
					time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
				}
				inside.Add(-1)
				l.Release()
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > limit || p == 0 {
		t.Fatalf("peak %d concurrent holders, limit %d", p, limit)
	}
	if l.Active() != 0 || l.Queued() != 0 || l.waiting.Load() != 0 {
		t.Fatalf("active %d queued %d waiting %d after the storm", l.Active(), l.Queued(), l.waiting.Load())
	}
}

// closedWatcher reports the client gone when its channel is closed.
type closedWatcher chan struct{}

func (w closedWatcher) Watch() (<-chan struct{}, func()) { return w, func() {} }

// queuedSignal is an Observer that tells each request queued on a channel.
type queuedSignal chan struct{}

func (q queuedSignal) Queued(*Limiter)                         { q <- struct{}{} }
func (q queuedSignal) Dequeued(*Limiter, time.Duration, error) {}

// TestLimiterRefusesWithoutLock: a request that cannot wait is refused without the
// Limiter's lock: over a limit without a queue, and over a limit whose queue is full. The
// refusals complete while the lock is held.
func TestLimiterRefusesWithoutLock(t *testing.T) {
	noQueue := NewLimiter("router", 1, 0, time.Minute, nil)
	signal := make(queuedSignal, 1)
	full := NewLimiter("model llama", 1, 1, time.Minute, signal)
	for _, l := range []*Limiter{noQueue, full} {
		if err := l.Acquire(time.Now(), Class{}, Cancel{}); err != nil {
			t.Fatal(err)
		}
	}
	queued := start(full, time.Now(), Cancel{})
	<-signal

	refused := make(chan error, 2)
	noQueue.mu.Lock()
	full.mu.Lock()
	go func() {
		for _, l := range []*Limiter{noQueue, full} {
			refused <- l.Acquire(time.Now(), Class{}, Cancel{})
		}
	}()
	timeout := time.After(10 * time.Second)
	got := 0
	for ; got < 2; got++ {
		select {
		case err := <-refused:
			if !errors.Is(err, ErrQueueFull) {
				t.Errorf("refusal %d: %v, want ErrQueueFull", got, err)
			}
			continue
		case <-timeout:
			t.Errorf("refusal %d waited for the Limiter's lock", got)
		}
		break
	}
	noQueue.mu.Unlock()
	full.mu.Unlock()
	for ; got < 2; got++ {
		<-refused
	}

	noQueue.Release()
	full.Release() // hands the slot to the queued request
	if err := <-queued.done; err != nil {
		t.Fatalf("the queued request: %v", err)
	}
	full.Release()
	if noQueue.Active() != 0 || full.Active() != 0 || full.Queued() != 0 {
		t.Fatalf("active %d / %d, queued %d", noQueue.Active(), full.Active(), full.Queued())
	}
}
