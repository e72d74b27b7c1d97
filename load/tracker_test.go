package load

import (
	"sync"
	"testing"
	"time"
)

func TestTrackerCounters(t *testing.T) {
	tr := NewTracker()
	a, b := tr.Counters("a"), tr.Counters("b")
	if a == b || tr.Counters("a") != a {
		t.Fatal("Counters is not a stable per-ID pointer")
	}
	if !a.LastDispatch().IsZero() || a.InFlight() != 0 || a.Dispatched() != 0 {
		t.Fatal("fresh counters are not zero")
	}
	g1 := tr.Acquire(a, t0)
	g2 := tr.Acquire(a, t0.Add(time.Second))
	if a.InFlight() != 2 || a.Dispatched() != 2 || !a.LastDispatch().Equal(t0.Add(time.Second)) {
		t.Fatalf("after two acquires: inflight %d dispatched %d last %v", a.InFlight(), a.Dispatched(), a.LastDispatch())
	}
	if tr.Outstanding() != 2 {
		t.Fatalf("Outstanding() = %d", tr.Outstanding())
	}
	g1.Release()
	g1.Release()
	if a.InFlight() != 1 || a.Dispatched() != 2 || tr.Outstanding() != 1 {
		t.Fatalf("after double release: inflight %d dispatched %d outstanding %d", a.InFlight(), a.Dispatched(), tr.Outstanding())
	}
	g2.Release()
	var nilGuard *Guard
	nilGuard.Release() // no-op
	if a.InFlight() != 0 || b.InFlight() != 0 || tr.Outstanding() != 0 {
		t.Fatalf("after release: a %d b %d outstanding %d", a.InFlight(), b.InFlight(), tr.Outstanding())
	}
}

func TestTrackerCountersConcurrentCreate(t *testing.T) {
	tr := NewTracker()
	const n = 16
	got := make([]*Counters, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i] = tr.Counters("same") })
	}
	wg.Wait()
	for i := range got {
		if got[i] != got[0] {
			t.Fatalf("goroutine %d got a different *Counters", i)
		}
	}
}

func TestAcquireNilCountersPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Acquire(nil) did not panic")
		}
	}()
	NewTracker().Acquire(nil, t0)
}

// TestGuardReleaseExactlyOnce races many Release calls (and the janitor) on every guard.
func TestGuardReleaseExactlyOnce(t *testing.T) {
	tr := NewTracker()
	c := tr.Counters("w")
	const guards, callers = 200, 4
	gs := make([]*Guard, guards)
	for i := range gs {
		gs[i] = tr.Acquire(c, t0)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range callers {
		wg.Go(func() {
			<-start
			for _, g := range gs {
				g.Release()
			}
		})
	}
	var reaped int
	wg.Go(func() {
		<-start
		reaped = tr.ReleaseStale(t0.Add(time.Hour), time.Minute)
	})
	close(start)
	wg.Wait()
	if c.InFlight() != 0 {
		t.Fatalf("InFlight() = %d after releasing %d guards %d times each", c.InFlight(), guards, callers)
	}
	if tr.Outstanding() != 0 || tr.StaleReleased() != uint64(reaped) {
		t.Fatalf("Outstanding() = %d, StaleReleased() = %d, reaped %d", tr.Outstanding(), tr.StaleReleased(), reaped)
	}
}

// TestAcquireReleaseConcurrent mixes acquires and releases from many goroutines.
func TestAcquireReleaseConcurrent(t *testing.T) {
	tr := NewTracker()
	c := tr.Counters("w")
	const workers, perWorker = 8, 500
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range perWorker {
				g := tr.Acquire(c, t0)
				g.Release()
			}
		})
	}
	wg.Wait()
	if c.InFlight() != 0 || c.Dispatched() != workers*perWorker || tr.Outstanding() != 0 {
		t.Fatalf("inflight %d dispatched %d outstanding %d", c.InFlight(), c.Dispatched(), tr.Outstanding())
	}
}

func TestReleaseStale(t *testing.T) {
	tr := NewTracker()
	a, b := tr.Counters("a"), tr.Counters("b")
	old1 := tr.Acquire(a, t0)
	old2 := tr.Acquire(b, t0.Add(time.Minute))
	young := tr.Acquire(a, t0.Add(50*time.Minute))
	done := tr.Acquire(b, t0)
	done.Release()

	now := t0.Add(time.Hour)
	if n := tr.ReleaseStale(now, 30*time.Minute); n != 2 {
		t.Fatalf("ReleaseStale released %d, want 2", n)
	}
	if a.InFlight() != 1 || b.InFlight() != 0 || tr.Outstanding() != 1 || tr.StaleReleased() != 2 {
		t.Fatalf("a %d b %d outstanding %d stale %d", a.InFlight(), b.InFlight(), tr.Outstanding(), tr.StaleReleased())
	}
	// The leaked guards' late owners release nothing more.
	old1.Release()
	old2.Release()
	if a.InFlight() != 1 || b.InFlight() != 0 {
		t.Fatalf("late release changed counts: a %d b %d", a.InFlight(), b.InFlight())
	}
	if n := tr.ReleaseStale(now, 30*time.Minute); n != 0 {
		t.Fatalf("second sweep released %d", n)
	}
	young.Release()
	if a.InFlight() != 0 || tr.Outstanding() != 0 {
		t.Fatalf("a %d outstanding %d", a.InFlight(), tr.Outstanding())
	}
}

func TestCountersPeers(t *testing.T) {
	var c Counters
	c.inflight.Store(2)
	c.dispatched.Store(5)
	c.SetPeers(3, 10)
	if c.InFlight() != 5 || c.LocalInFlight() != 2 || c.Dispatched() != 15 || c.LocalDispatched() != 5 {
		t.Fatalf("inflight %d (local %d), dispatched %d (local %d)", c.InFlight(), c.LocalInFlight(), c.Dispatched(), c.LocalDispatched())
	}
	// A replica leaving lowers the in-flight count but never the dispatch total.
	c.SetPeers(-1, 4)
	if c.InFlight() != 2 || c.Dispatched() != 15 {
		t.Fatalf("after a peer left: inflight %d, dispatched %d", c.InFlight(), c.Dispatched())
	}
}

// TestAcquireReleaseTakeNoLock: acquiring and releasing guards takes no lock while fewer
// than the table's slots are in flight: they complete while every shard's lock is held.
func TestAcquireReleaseTakeNoLock(t *testing.T) {
	tr := NewTracker()
	c := tr.Counters("w")
	for i := range tr.shards {
		tr.shards[i].mu.Lock()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		held := make([]*Guard, 100)
		for i := range held {
			held[i] = tr.AcquirePrefill(c, t0, 10)
		}
		held[0].FirstToken(t0)
		for _, g := range held {
			g.Release()
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Error("Acquire or Release waited for a shard's lock")
	}
	for i := range tr.shards {
		tr.shards[i].mu.Unlock()
	}
	<-done
	if reqs, toks := c.PendingPrefill(); c.InFlight() != 0 || reqs != 0 || toks != 0 || tr.Outstanding() != 0 {
		t.Fatalf("inflight %d pending %d/%d outstanding %d", c.InFlight(), reqs, toks, tr.Outstanding())
	}
}

// TestGuardsBeyondTheTable: guards that find no free slot (more in flight than the table
// holds) are registered in the locked lists: counted, released and reaped alike.
func TestGuardsBeyondTheTable(t *testing.T) {
	tr := NewTracker()
	c := tr.Counters("w")
	const n = guardSlots + 2000
	gs := make([]*Guard, n)
	for i := range gs {
		gs[i] = tr.Acquire(c, t0.Add(time.Duration(i%2)*time.Hour))
	}
	listed := 0
	for _, g := range gs {
		if g.state.Load()>>guardSlotShift == 0 {
			listed++
		}
	}
	if listed == 0 {
		t.Fatal("every guard found a slot: the lists were not exercised")
	}
	if tr.Outstanding() != n || c.InFlight() != n {
		t.Fatalf("outstanding %d inflight %d, want %d", tr.Outstanding(), c.InFlight(), n)
	}
	// Half are stale (acquired at t0), in slots and lists alike.
	if got := tr.ReleaseStale(t0.Add(90*time.Minute), time.Hour); got != n/2 {
		t.Fatalf("ReleaseStale released %d, want %d", got, n/2)
	}
	for _, g := range gs {
		g.Release()
	}
	if tr.Outstanding() != 0 || c.InFlight() != 0 {
		t.Fatalf("outstanding %d inflight %d after every release", tr.Outstanding(), c.InFlight())
	}
}
