package load

import (
	"runtime"
	"sync"
	"sync/atomic"
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
		if slot(g.state.Load()) == 0 {
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
	wantIdle(t, tr, c)
}

// wantIdle fails t unless c has nothing in flight or pending and tr holds no guard.
func wantIdle(t *testing.T, tr *Tracker, c *Counters) {
	t.Helper()
	if reqs, tokens := c.PendingPrefill(); c.InFlight() != 0 || reqs != 0 || tokens != 0 || tr.Outstanding() != 0 {
		t.Fatalf("inflight %d, pending %d requests of %d tokens, outstanding %d guards", c.InFlight(), reqs, tokens, tr.Outstanding())
	}
}

// TestGuardStorageReused: a guard's storage acquired again after its release is a new
// acquisition to every reference kept from the former one: the due table's entry does not
// give the new one's pending prefill back at the former's expected first token, and a
// sweep that read the former acquisition does not release the new one.
func TestGuardStorageReused(t *testing.T) {
	tr := NewTracker()
	c := tr.Counters("w")
	var g Guard
	tr.AcquirePrefillInto(&g, c, t0, 100)
	if !g.FirstTokenAt(t0.Add(time.Second)) {
		t.Fatal("FirstTokenAt found no room")
	}
	g.Release() // the due entry stays until a settle
	// Before the former's expected first token: no settle yet.
	tr.AcquirePrefillInto(&g, c, t0.Add(time.Millisecond), 40)
	if reqs, tokens := c.PendingPrefill(); reqs != 1 || tokens != 40 {
		t.Fatalf("pending after reuse: %d requests, %d tokens; want 1, 40", reqs, tokens)
	}
	// The former acquisition's expected first token is due: the new one stays pending.
	if left := c.PendingPrefillLeft(nil, t0.Add(2*time.Minute)); left != 40 {
		t.Fatalf("PendingPrefillLeft = %v, want 40", left)
	}
	if reqs, _ := c.PendingPrefill(); reqs != 1 {
		t.Fatalf("the stale due entry gave the new acquisition back: %d pending", reqs)
	}
	g.FirstToken(t0.Add(2 * time.Minute))
	g.Release()
	wantIdle(t, tr, c)

	// A sweep's claim for the former generation fails on the new one.
	tr.AcquirePrefillInto(&g, c, t0, -1)
	former := reg(g.state.Load())
	g.Release()
	tr.AcquirePrefillInto(&g, c, t0, -1)
	if _, ok := g.claim(former); ok {
		t.Fatal("a claim for the former acquisition released the new one")
	}
	if n := tr.ReleaseStale(t0.Add(time.Hour), time.Minute); n != 1 || c.InFlight() != 0 {
		t.Fatalf("ReleaseStale released %d, inflight %d; want 1, 0", n, c.InFlight())
	}
	// Released by the sweep, the storage may be acquired again.
	tr.AcquirePrefillInto(&g, c, t0, -1).Release()
	wantIdle(t, tr, c)
}

// TestGuardStorageLiveReusePanics: acquiring in a guard that holds a slot is a bug.
func TestGuardStorageLiveReusePanics(t *testing.T) {
	tr := NewTracker()
	c := tr.Counters("w")
	var g Guard
	tr.AcquirePrefillInto(&g, c, t0, 1)
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	tr.AcquirePrefillInto(&g, c, t0, 1)
}

// TestGuardStorageReusedConcurrent reuses each goroutine's storage while sweeps and
// settles run: every count returns to zero and no acquisition is released twice. With the
// table full, the guards are registered in the locked lists, whose links a sweep and the
// storage's next acquisition must not both write.
func TestGuardStorageReusedConcurrent(t *testing.T) {
	for _, full := range []bool{false, true} {
		name := "table"
		if full {
			name = "lists"
		}
		t.Run(name, func(t *testing.T) {
			tr := NewTracker()
			c := tr.Counters("w")
			var fill []*Guard
			if full {
				fill = fillTable(t, tr)
			}
			// Each worker goes on until the sweeps released 20 guards of c (a sweep must
			// meet owners releasing and acquiring again), or for at most perWorker requests.
			const workers, perWorker, wantSwept = 4, 5000, 20
			var dispatched atomic.Uint64
			var wg sync.WaitGroup
			stop := make(chan struct{})
			var sweeps sync.WaitGroup
			var swept atomic.Int64
			sweeps.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					// Every guard of c is old to this sweep (the table's fillers are
					// not): it races the owners' releases.
					swept.Add(int64(tr.ReleaseStale(t0.Add(time.Hour), time.Minute)))
					c.PendingPrefillLeft(nil, t0.Add(time.Duration(i)*time.Millisecond))
				}
			})
			for range workers {
				wg.Go(func() {
					var g Guard
					for i := range perWorker {
						if swept.Load() >= wantSwept {
							break
						}
						dispatched.Add(1)
						tr.AcquirePrefillInto(&g, c, t0, 10)
						g.FirstTokenAt(t0.Add(time.Duration(i%7) * time.Millisecond))
						if i%3 == 0 {
							g.FirstToken(t0)
						}
						g.Release()
					}
				})
			}
			wg.Wait()
			close(stop)
			sweeps.Wait()
			for _, g := range fill {
				g.Release()
			}
			c.PendingPrefillLeft(nil, t0.Add(time.Hour))
			t.Logf("swept %d", swept.Load())
			wantIdle(t, tr, c)
			if c.Dispatched() != dispatched.Load() {
				t.Fatalf("dispatched %d", c.Dispatched())
			}
		})
	}
}

// fillTable acquires guards (at t0 plus two hours, on other counters) until every slot of
// tr's table holds one, and returns those; the ones that found no slot are released.
func fillTable(t *testing.T, tr *Tracker) []*Guard {
	t.Helper()
	c := tr.Counters("fill")
	var gs []*Guard
	for range 64 * guardSlots { // bounded: the last free slot is found in about guardSlots/guardProbes
		g := tr.Acquire(c, t0.Add(2*time.Hour))
		if slot(g.state.Load()) == 0 {
			g.Release()
			continue
		}
		if gs = append(gs, g); len(gs) == guardSlots {
			return gs
		}
	}
	t.Fatalf("%d slots still free", guardSlots-len(gs))
	return nil
}

// TestSweepMeetsTheStorageAcquiredAgain: the owner of a guard's storage releases it and
// acquires it again (in another slot) between the sweep's read of the former slot and its
// claim. The sweep leaves the new acquisition alone there (it releases it, old as it is,
// only where that acquisition is registered), and every count returns to zero.
func TestSweepMeetsTheStorageAcquiredAgain(t *testing.T) {
	tr := NewTracker()
	c := tr.Counters("w")
	var g Guard
	tr.AcquirePrefillInto(&g, c, t0, 10)
	former := slot(g.state.Load())
	done := false
	tr.releaseStale(t0.Add(time.Hour), time.Minute, func(found *Guard, claimed bool) {
		if found != &g || claimed || done {
			return
		}
		done = true
		g.Release()
		for range 64 { // bounded: the same slot again is 1 chance in guardSlots
			tr.AcquirePrefillInto(&g, c, t0, 20)
			if slot(g.state.Load()) != former {
				return
			}
			g.Release()
		}
		t.Fatal("64 acquisitions in the former slot")
	})
	if !done {
		t.Fatal("the sweep did not find the guard")
	}
	g.Release() // nothing when the sweep released it
	wantIdle(t, tr, c)
}

// TestSweepOfAListedGuardMeetsItsNextAcquisition: the sweep releases a guard in a list (the
// table is full) and its owner, finding it released, acquires the storage again at once, in
// another list, before the sweep is done with the former registration. Each list keeps its
// own guards, counted right, and every count returns to zero.
func TestSweepOfAListedGuardMeetsItsNextAcquisition(t *testing.T) {
	tr := NewTracker()
	c := tr.Counters("w")
	fill := fillTable(t, tr)
	// Live guards in every list around the owner's, none of them old.
	fc := tr.Counters("fill")
	for range 8 * guardShards {
		fill = append(fill, tr.Acquire(fc, t0.Add(2*time.Hour)))
	}
	var g Guard
	moved := false
	for range 32 { // bounded: the next acquisition lands in the same list 1 time in guardShards
		tr.AcquirePrefillInto(&g, c, t0, 10)
		former := g.state.Load()
		if slot(former) != 0 {
			t.Fatal("the guard found a slot in a full table")
		}
		var done chan struct{}
		tr.releaseStale(t0.Add(time.Hour), time.Minute, func(h *Guard, claimed bool) {
			if h != &g || !claimed {
				return
			}
			g.Release() // the sweep released it: nothing
			// The owner acquires the storage again. Should it pick the list whose lock the
			// sweep holds, it waits for the sweep: its acquisition is published (the state
			// word) before it takes the lock.
			done = make(chan struct{})
			go func() {
				defer close(done)
				tr.AcquirePrefillInto(&g, c, t0.Add(2*time.Hour), 10)
			}()
			deadline := time.Now().Add(time.Minute) // only if the acquisition never comes
			for gen(g.state.Load()) == gen(former) {
				if time.Now().After(deadline) {
					t.Error("the owner's acquisition did not come")
					return
				}
				runtime.Gosched()
			}
			if shard(g.state.Load()) != shard(former) {
				<-done // linked in its new list before the sweep goes on
				moved = true
			}
		})
		if done == nil {
			t.Fatal("the sweep did not release the guard")
		}
		<-done
		wantLists(t, tr)
		g.Release()
		if moved || t.Failed() {
			break
		}
	}
	if !moved {
		t.Fatal("no acquisition in another list")
	}
	for _, f := range fill {
		f.Release()
	}
	wantIdle(t, tr, c)
	wantLists(t, tr)
}

// wantLists fails t unless each of tr's lists links its guards both ways, holds as many as
// it counts, and only guards registered in it.
func wantLists(t *testing.T, tr *Tracker) {
	t.Helper()
	for i := range tr.shards {
		sh := &tr.shards[i]
		sh.mu.Lock()
		n := 0
		var prev *Guard
		for g := sh.head; g != nil && n <= sh.n; g = g.next {
			s := g.state.Load()
			if g.prev != prev || slot(s) != 0 || shard(s) != uint64(i) {
				sh.mu.Unlock()
				t.Fatalf("list %d: guard %d links back to %p, not %p, or is registered in slot %d, list %d", i, n, g.prev, prev, slot(s), shard(s))
			}
			prev = g
			n++
		}
		sh.mu.Unlock()
		if n != sh.n {
			t.Fatalf("list %d holds %d guards (at least), counts %d", i, n, sh.n)
		}
	}
}

// TestWaitingGuard: a guard from AcquireWaiting counts its request in flight, neither as a
// dispatch nor as pending prefill, until its Dispatch, which adds those and keeps the one
// in-flight slot; Release gives everything back once, dispatched or not.
func TestWaitingGuard(t *testing.T) {
	tests := []struct {
		name     string
		dispatch bool
		uncached int64
		// wantPending is the pending prefill (requests, tokens) after the dispatch.
		wantReqs, wantTokens int64
	}{
		{name: "released undispatched"},
		{name: "dispatched for prefill", dispatch: true, uncached: 300, wantReqs: 1, wantTokens: 300},
		{name: "dispatched plain", dispatch: true, uncached: -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker()
			c := tr.Counters("w")
			g := tr.AcquireWaiting(c, t0)
			if c.InFlight() != 1 || c.Dispatched() != 0 || !c.LastDispatch().IsZero() || tr.Outstanding() != 1 {
				t.Fatalf("waiting: inflight %d dispatched %d last %v outstanding %d", c.InFlight(), c.Dispatched(), c.LastDispatch(), tr.Outstanding())
			}
			if r, k := c.PendingPrefill(); r != 0 || k != 0 {
				t.Fatalf("waiting: pending prefill %d requests %d tokens", r, k)
			}
			if tt.dispatch {
				at := t0.Add(time.Second)
				if g.Dispatch(at, tt.uncached) != g {
					t.Fatal("Dispatch did not return its guard")
				}
				if c.InFlight() != 1 || c.Dispatched() != 1 || !c.LastDispatch().Equal(at) || tr.Outstanding() != 1 {
					t.Fatalf("dispatched: inflight %d dispatched %d last %v outstanding %d", c.InFlight(), c.Dispatched(), c.LastDispatch(), tr.Outstanding())
				}
				if r, k := c.PendingPrefill(); r != tt.wantReqs || k != tt.wantTokens {
					t.Fatalf("dispatched: pending prefill %d requests %d tokens, want %d %d", r, k, tt.wantReqs, tt.wantTokens)
				}
			}
			g.Release()
			g.Release()
			if r, k := c.PendingPrefill(); c.InFlight() != 0 || tr.Outstanding() != 0 || r != 0 || k != 0 {
				t.Fatalf("released: inflight %d outstanding %d pending %d/%d", c.InFlight(), tr.Outstanding(), r, k)
			}
		})
	}
}

// TestWaitingGuardReapedBeforeDispatch: a waiting guard the sweep released (leaked) holds
// nothing after a late Dispatch: its pending prefill is given back at once.
func TestWaitingGuardReapedBeforeDispatch(t *testing.T) {
	tr := NewTracker()
	c := tr.Counters("w")
	g := tr.AcquireWaiting(c, t0)
	if n := tr.ReleaseStale(t0.Add(time.Hour), time.Minute); n != 1 {
		t.Fatalf("ReleaseStale released %d, want 1", n)
	}
	g.Dispatch(t0.Add(time.Hour), 100)
	g.FirstToken(t0.Add(time.Hour))
	g.Release()
	if r, k := c.PendingPrefill(); c.InFlight() != 0 || r != 0 || k != 0 || c.Dispatched() != 1 {
		t.Fatalf("inflight %d pending %d/%d dispatched %d", c.InFlight(), r, k, c.Dispatched())
	}
}

// TestWaitingGuardDispatchRacesSweep races each guard's Dispatch and Release with a sweep
// that may release it first: whoever wins, nothing stays counted.
func TestWaitingGuardDispatchRacesSweep(t *testing.T) {
	tr := NewTracker()
	c := tr.Counters("w")
	const guards = 200
	gs := make([]*Guard, guards)
	for i := range gs {
		gs[i] = tr.AcquireWaiting(c, t0)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	wg.Go(func() {
		<-start
		for _, g := range gs {
			g.Dispatch(t0, 10)
			g.Release()
		}
	})
	wg.Go(func() {
		<-start
		tr.ReleaseStale(t0.Add(time.Hour), time.Minute)
	})
	close(start)
	wg.Wait()
	if r, k := c.PendingPrefill(); c.InFlight() != 0 || r != 0 || k != 0 || tr.Outstanding() != 0 || c.Dispatched() != guards {
		t.Fatalf("inflight %d pending %d/%d outstanding %d dispatched %d", c.InFlight(), r, k, tr.Outstanding(), c.Dispatched())
	}
}
