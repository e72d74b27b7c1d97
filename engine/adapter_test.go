package engine

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestAdapterSet(t *testing.T) {
	var none *AdapterSet
	now := time.Unix(1000, 0)
	if none.Has("a") || !none.Free(now) || none.Names() != nil {
		t.Fatal("a nil set holds nothing and has room")
	}
	s := NewAdapterSet([]string{"b", "a", "b"}, 2)
	if !s.Has("a") || !s.Has("b") || s.Has("c") || s.Free(now) || len(s.Names()) != 2 {
		t.Fatalf("set %v slots %d", s.Names(), s.Slots)
	}
	if s.With("a", now) != s {
		t.Fatal("With of a held adapter made a new set")
	}
	if u := NewAdapterSet(nil, 0).With("x", now); !u.Has("x") || !u.Free(now) {
		t.Fatal("an unbounded set")
	}
	w := NewWorker("w", "http://127.0.0.1:1", "llama", StagePlain, nil)
	w.AddAdapter("x", now)
	w.AddAdapter("x", now)
	if got := w.Adapters().Names(); len(got) != 1 || got[0] != "x" {
		t.Fatalf("worker adapters %v", got)
	}
}

func TestGroupAdapterCandidates(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 4)
	ws[1].SetAdapters(NewAdapterSet([]string{"sql"}, 2))
	ws[2].SetAdapters(NewAdapterSet([]string{"sql", "math"}, 2))
	ws[3].SetAdapters(NewAdapterSet([]string{"code", "chat"}, 2)) // full
	reg, _ := NewRegistry(ws)
	req := func(adapter string) *BucketRequest {
		return &BucketRequest{Model: "llama", ExpectedPeak: -1, Adapter: adapter}
	}
	t.Run("holders only, by the policy", func(t *testing.T) {
		g := NewEngineGroup("llama", StagePlain, nil, NewRoundRobin(nil, nil))
		seen := map[*Worker]int{}
		for range 6 {
			p, err := g.Pick(reg, "b", req("sql"))
			if err != nil || p.LoadAdapter {
				t.Fatalf("%+v %v", p, err)
			}
			seen[p.Worker]++
		}
		if seen[ws[1]] != 3 || seen[ws[2]] != 3 {
			t.Fatalf("picks %v: want w1 and w2 in turn", seen)
		}
	})
	t.Run("no holder, no loading", func(t *testing.T) {
		g := NewEngineGroup("llama", StagePlain, nil, NewRoundRobin(nil, nil))
		_, err := g.Pick(reg, "b", req("poems"))
		if !errors.Is(err, ErrNoCandidates) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("no holder, loading onto a free slot", func(t *testing.T) {
		g := NewEngineGroup("llama", StagePlain, nil, NewRoundRobin(nil, nil))
		g.SetAdapterLoading(time.Minute, nil)
		for range 4 {
			p, err := g.Pick(reg, "b", req("poems"))
			if err != nil || !p.LoadAdapter || p.Worker == ws[2] || p.Worker == ws[3] {
				t.Fatalf("%+v %v: want a load on w0 (nothing learned) or w1 (a free slot)", p, err)
			}
		}
		// Every slot full: nothing to load onto.
		for _, w := range ws {
			w.SetAdapters(NewAdapterSet([]string{"x", "y"}, 2))
		}
		if _, err := g.Pick(reg, "b", req("poems")); !errors.Is(err, ErrNoCandidates) {
			t.Fatalf("full slots: %v", err)
		}
	})
}

// TestAdapterReservations: a load under way holds its slot, so an engine with one free slot
// takes one load, not one per adapter requested meanwhile; a completed load turns the
// reservation into the adapter, a failed one frees it, and one never completed lapses.
func TestAdapterReservations(t *testing.T) {
	now := time.Unix(1000, 0)
	w := NewWorker("w", "http://127.0.0.1:1", "llama", StagePlain, nil)
	w.SetAdapters(NewAdapterSet([]string{"sql"}, 2))
	if !reserve(w, "math", now, now.Add(time.Minute), nil) {
		t.Fatal("the free slot was not reserved")
	}
	if s := w.Adapters(); s.Free(now) || !s.Loading("math", now) || s.Has("math") {
		t.Fatalf("after the reservation: free %v, loading %v", s.Free(now), s.Loading("math", now))
	}
	if reserve(w, "code", now, now.Add(time.Minute), nil) {
		t.Fatal("a second adapter was given the slot a load holds")
	}
	if !reserve(w, "math", now, now.Add(time.Minute), nil) {
		t.Fatal("a second request for the adapter being loaded was refused")
	}
	// The engine's list, learned while the load is under way, keeps the reservation.
	w.LearnAdapters([]string{"sql"}, 2, time.Now())
	if w.Adapters().Free(now) {
		t.Fatal("learning the engine's adapters dropped the load's reservation")
	}
	w.AddAdapter("math", now)
	if s := w.Adapters(); !s.Has("math") || s.Loading("math", now) || s.Free(now) {
		t.Fatalf("after the load: %v, loading %v", s.Names(), s.Loading("math", now))
	}
	w.SetAdapters(NewAdapterSet([]string{"sql"}, 2))
	reserve(w, "code", now, now.Add(time.Minute), nil)
	w.ReleaseAdapter("code")
	if s := w.Adapters(); !s.Free(now) || s.Loading("code", now) {
		t.Fatal("a failed load kept its slot")
	}
	reserve(w, "code", now, now.Add(time.Minute), nil)
	if later := now.Add(time.Minute); !w.Adapters().Free(later) || !reserve(w, "chat", later, later.Add(time.Minute), nil) {
		t.Fatal("a load never completed kept its slot past its bound")
	}
}

// TestGroupAdapterLoadsHoldSlots: requests for two adapters that no engine holds, picked
// before either load completes, go to different engines when each engine has one free slot;
// a further request for one of them waits for its load, though an engine the policy prefers
// has a free slot.
func TestGroupAdapterLoadsHoldSlots(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 3)
	ws[0].SetAdapters(NewAdapterSet([]string{"sql", "x"}, 2)) // full
	ws[1].SetAdapters(NewAdapterSet([]string{"sql"}, 2))
	ws[2].SetAdapters(NewAdapterSet([]string{"sql"}, 2))
	reg, _ := NewRegistry(ws)
	now := time.Unix(1000, 0)
	lowest := &fixedPolicy{fn: func(c []*Worker, _ *PickRequest) (Pick, error) {
		return Pick{Worker: slices.MinFunc(c, func(a, b *Worker) int { return strings.Compare(a.ID, b.ID) })}, nil
	}}
	g := NewEngineGroup("llama", StagePlain, nil, lowest)
	g.SetAdapterLoading(time.Minute, nil)
	pick := func(adapter string) *Worker {
		t.Helper()
		p, err := g.Pick(reg, "b", &BucketRequest{Model: "llama", ExpectedPeak: -1, Adapter: adapter, Now: now})
		if err != nil || !p.LoadAdapter {
			t.Fatalf("%s: %+v %v", adapter, p, err)
		}
		return p.Worker
	}
	if first, second := pick("math"), pick("code"); first != ws[1] || second != ws[2] {
		t.Fatalf("math went to %s and code to %s; want w1 then w2 (w1's one free slot is math's)", first.ID, second.ID)
	}
	ws[0].SetAdapters(NewAdapterSet([]string{"sql"}, 2)) // a slot frees on w0
	if again := pick("math"); again != ws[1] {
		t.Fatalf("a second request for math went to %s, not to w1 that is loading it", again.ID)
	}
	if third := pick("chat"); third != ws[0] {
		t.Fatalf("chat went to %s, want w0, the one free slot", third.ID)
	}
	if _, err := g.Pick(reg, "b", &BucketRequest{Model: "llama", ExpectedPeak: -1, Adapter: "poems", Now: now}); !errors.Is(err, ErrNoCandidates) {
		t.Fatalf("a fourth adapter with every slot held: %v", err)
	}
}

// TestAdapterEviction: with every slot full, a reservation evicts the least recently used
// adapter that no request holds and that may be evicted, names it for dispatch to unload,
// and keeps it out of the engine's list learned while the load is under way; an adapter in
// use, or one the router could not load again, stays.
func TestAdapterEviction(t *testing.T) {
	t0 := time.Unix(1000, 0)
	evictable := map[string]struct{}{"a": {}, "b": {}, "c": {}}
	t.Run("least recently used, not in use", func(t *testing.T) {
		w := NewWorker("w", "http://127.0.0.1:1", "llama", StagePlain, nil)
		w.SetAdapters(NewAdapterSet([]string{"a", "b", "pinned"}, 3))
		ha, _ := w.HoldAdapter("a", t0)
		ha.Release(t0.Add(2 * time.Second)) // a: used last at t0+2s
		hb, _ := w.HoldAdapter("b", t0.Add(time.Second))
		hb.Release(t0.Add(time.Second)) // b: used last at t0+1s
		if !reserve(w, "c", t0.Add(3*time.Second), t0.Add(time.Minute), evictable) {
			t.Fatal("no room made on a full engine")
		}
		s := w.Adapters()
		if got := s.Evicting("c"); got != "b" {
			t.Fatalf("evicting %q, want b (a was used later, pinned is not evictable)", got)
		}
		if s.Has("b") || !s.Has("a") || !s.Has("pinned") || !s.Loading("c", t0) || s.Free(t0) {
			t.Fatalf("after the eviction: %v, loading c %v, free %v", s.Names(), s.Loading("c", t0), s.Free(t0))
		}
		if _, ok := w.HoldAdapter("b", t0); ok {
			t.Fatal("a hold was taken on the evicted adapter")
		}
		// The engine still lists b until the unload is done: it stays out.
		w.LearnAdapters([]string{"a", "b", "pinned"}, 3, time.Now())
		if s := w.Adapters(); s.Has("b") || s.Evicting("c") != "b" {
			t.Fatalf("relearned %v, evicting %q", s.Names(), s.Evicting("c"))
		}
		w.AddAdapter("c", t0)
		if s := w.Adapters(); !slices.Equal(s.Names(), []string{"a", "c", "pinned"}) || s.Evicting("c") != "" {
			t.Fatalf("after the load: %v", s.Names())
		}
	})
	t.Run("in use or not evictable", func(t *testing.T) {
		w := NewWorker("w", "http://127.0.0.1:1", "llama", StagePlain, nil)
		w.SetAdapters(NewAdapterSet([]string{"a", "pinned"}, 2))
		h, ok := w.HoldAdapter("a", t0)
		if !ok || w.Adapters().CanEvict(evictable) {
			t.Fatal("an adapter in use counts as evictable")
		}
		if reserve(w, "c", t0, t0.Add(time.Minute), evictable) || reserve(w, "c", t0, t0.Add(time.Minute), nil) {
			t.Fatal("room made though a is in use and pinned may not be evicted")
		}
		// The engine's list, learned again, keeps a's use.
		w.LearnAdapters([]string{"a", "pinned"}, 2, time.Now())
		if n := w.Adapters().InFlight("a"); n != 1 {
			t.Fatalf("in flight on a after relearning: %d", n)
		}
		h.Release(t0)
		if !w.Adapters().CanEvict(evictable) || !reserve(w, "c", t0, t0.Add(time.Minute), evictable) {
			t.Fatal("a, released, was not evicted")
		}
	})
	t.Run("holds race the eviction", func(t *testing.T) {
		// Requests take and give back holds on a while a reservation evicts it: either the
		// eviction waits for a moment with no hold, or it fails; a hold never survives it.
		for range 20 {
			w := NewWorker("w", "http://127.0.0.1:1", "llama", StagePlain, nil)
			w.SetAdapters(NewAdapterSet([]string{"a"}, 1))
			u := w.Adapters().use("a")
			start := make(chan struct{})
			var wg sync.WaitGroup
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					for range 200 {
						if h, ok := w.HoldAdapter("a", t0); ok {
							h.Release(t0)
						}
					}
				}()
			}
			close(start)
			evicted := false
			for range 200 {
				if evicted = reserve(w, "c", t0, t0.Add(time.Minute), evictable); evicted {
					break
				}
			}
			wg.Wait()
			switch n := u.inflight.Load(); {
			case evicted && n != evictedUse:
				t.Fatalf("evicted, yet a's use reads %d (a hold outlived the eviction)", n)
			case !evicted && n != 0:
				t.Fatalf("not evicted, a's use reads %d", n)
			}
		}
	})
}

// TestGroupAdapterEviction: with every slot of every candidate full, a group that may evict
// offers the engines holding an adapter no request uses, and the pick names the victim; a
// group that may not refuses.
func TestGroupAdapterEviction(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 2)
	now := time.Unix(1000, 0)
	ws[0].SetAdapters(NewAdapterSet([]string{"a", "b"}, 2))
	ws[1].SetAdapters(NewAdapterSet([]string{"c", "d"}, 2))
	for _, n := range []string{"a", "b"} {
		if _, ok := ws[0].HoldAdapter(n, now); !ok { // w0: both in use
			t.Fatal(n)
		}
	}
	h, _ := ws[1].HoldAdapter("d", now) // w1: c idle
	reg, _ := NewRegistry(ws)
	req := &BucketRequest{Model: "llama", ExpectedPeak: -1, Adapter: "e", Now: now}
	g := NewEngineGroup("llama", StagePlain, nil, NewRoundRobin(nil, nil))
	g.SetAdapterLoading(time.Minute, nil)
	if _, err := g.Pick(reg, "b", req); !errors.Is(err, ErrNoCandidates) {
		t.Fatalf("no eviction: %v", err)
	}
	g.SetAdapterLoading(time.Minute, map[string]struct{}{"a": {}, "b": {}, "c": {}, "d": {}})
	p, err := g.Pick(reg, "b", req)
	if err != nil || p.Worker != ws[1] || !p.LoadAdapter || ws[1].Adapters().Evicting("e") != "c" {
		t.Fatalf("%+v %v, evicting %q: want a load on w1 evicting c", p, err, ws[1].Adapters().Evicting("e"))
	}
	// Nothing left to evict: d is in use on w1, a and b on w0.
	if _, err := g.Pick(reg, "b", &BucketRequest{Model: "llama", ExpectedPeak: -1, Adapter: "f", Now: now}); !errors.Is(err, ErrNoCandidates) {
		t.Fatalf("nothing to evict: %v", err)
	}
	h.Release(now)
}

// TestAdapterStaleEngineList: an engine's list asked for before the router loaded or evicted
// an adapter does not undo it (the load would otherwise look like a free slot, and the
// eviction like an adapter still held); a list asked for afterwards is the truth.
func TestAdapterStaleEngineList(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	w := NewWorker("w", "http://127.0.0.1:1", "llama", StagePlain, nil)
	w.SetAdapters(NewAdapterSet([]string{"a"}, 2))
	w.AddAdapter("b", at(1)) // loaded after the question
	w.LearnAdapters([]string{"a"}, 2, at(0))
	if s := w.Adapters(); !slices.Equal(s.Names(), []string{"a", "b"}) || s.Free(at(1)) {
		t.Fatalf("after a stale list: %v, free %v", s.Names(), s.Free(at(1)))
	}
	if !reserve(w, "c", at(3), at(60), map[string]struct{}{"a": {}, "b": {}}) || w.Adapters().Evicting("c") == "" {
		t.Fatal("no eviction")
	}
	victim := w.Adapters().Evicting("c")
	w.AddAdapter("c", at(4))
	w.LearnAdapters([]string{"a", "b"}, 2, at(2)) // asked before the eviction: still lists the victim
	if s := w.Adapters(); s.Has(victim) || !s.Has("c") || len(s.Names()) != 2 {
		t.Fatalf("after a stale list naming the evicted %s: %v", victim, s.Names())
	}
	w.LearnAdapters([]string{victim}, 2, at(5)) // the engine's word, asked after everything
	if s := w.Adapters(); !slices.Equal(s.Names(), []string{victim}) {
		t.Fatalf("after a fresh list: %v", s.Names())
	}
}

// TestAdapterTimesOnCallersClock: the times a set records of what the router did (an
// adapter loaded, one evicted) are on the caller's clock, the one its engine's lists are
// asked on (LearnAdapters' asOf), not the wall clock: with a clock far from the wall's, a
// list asked after a load and an eviction is the engine's word (here: it unloaded the
// adapter loaded, and holds the one evicted again).
func TestAdapterTimesOnCallersClock(t *testing.T) {
	t0 := time.Unix(1_000_000, 0) // far before the wall clock
	w := NewWorker("w", "http://127.0.0.1:1", "llama", StagePlain, nil)
	w.SetAdapters(NewAdapterSet([]string{"a"}, 1))
	if !reserve(w, "b", t0, t0.Add(time.Minute), map[string]struct{}{"a": {}}) || w.Adapters().Evicting("b") != "a" {
		t.Fatal("no eviction of a for b")
	}
	w.AddAdapter("b", t0)
	w.LearnAdapters([]string{"a"}, 1, t0.Add(time.Second)) // asked after the load and the eviction
	if s := w.Adapters(); !slices.Equal(s.Names(), []string{"a"}) {
		t.Fatalf("after a list asked after everything: %v, want [a]", s.Names())
	}
}

// TestGroupAdapterReplication: with lora.replicate_above, a held adapter's candidates gain
// the least busy engine that has a free slot to spare, only when every holder is busier than
// it by more than the margin, with more than the margin of the adapter's own requests, and no
// load of the adapter is under way; a pick of it reserves a free slot (never evicting) and
// says to load, a pick of a holder does not.
func TestGroupAdapterReplication(t *testing.T) {
	now := time.Unix(1000, 0)
	all := map[string]struct{}{"sql": {}, "x": {}, "y": {}, "z": {}}
	tests := []struct {
		name     string
		above    int64
		inflight [4]int64 // requests in flight on each engine
		own      int64    // of which sql's on each holder; 0: all of them
		sets     [4]*AdapterSet
		pickLast bool // the policy picks the last candidate, else the first
		want     []int
		wantLoad bool
	}{
		{name: "holder busy, replica offered and picked", above: 2, inflight: [4]int64{5, 2, 1, 3},
			sets:     [4]*AdapterSet{NewAdapterSet([]string{"sql"}, 4), NewAdapterSet(nil, 4), NewAdapterSet([]string{"x"}, 4), NewAdapterSet(nil, 4)},
			pickLast: true, want: []int{0, 2}, wantLoad: true},
		{name: "replica offered, holder picked", above: 2, inflight: [4]int64{5, 2, 1, 3},
			sets: [4]*AdapterSet{NewAdapterSet([]string{"sql"}, 4), NewAdapterSet(nil, 4), NewAdapterSet([]string{"x"}, 4), NewAdapterSet(nil, 4)},
			want: []int{0, 2}},
		{name: "the margin not exceeded", above: 4, inflight: [4]int64{5, 2, 1, 3},
			sets:     [4]*AdapterSet{NewAdapterSet([]string{"sql"}, 4), NewAdapterSet(nil, 4), NewAdapterSet([]string{"x"}, 4), NewAdapterSet(nil, 4)},
			pickLast: true, want: []int{0}},
		{name: "replication off", above: 0, inflight: [4]int64{50, 0, 0, 0},
			sets:     [4]*AdapterSet{NewAdapterSet([]string{"sql"}, 4), NewAdapterSet(nil, 4), NewAdapterSet(nil, 4), NewAdapterSet(nil, 4)},
			pickLast: true, want: []int{0}},
		{name: "an engine's last free slot is spared", above: 1, inflight: [4]int64{9, 0, 4, 0},
			sets:     [4]*AdapterSet{NewAdapterSet([]string{"sql"}, 4), NewAdapterSet([]string{"x", "y", "z"}, 4), NewAdapterSet(nil, 4), NewAdapterSet([]string{"x", "y", "z", "q"}, 4)},
			pickLast: true, want: []int{0, 2}, wantLoad: true},
		{name: "full engines are not evicted for a replica", above: 1, inflight: [4]int64{9, 0, 0, 0},
			sets:     [4]*AdapterSet{NewAdapterSet([]string{"sql"}, 2), NewAdapterSet([]string{"x", "y"}, 2), NewAdapterSet([]string{"x"}, 2), NewAdapterSet([]string{"z", "y"}, 2)},
			pickLast: true, want: []int{0}},
		{name: "a cold adapter on a busy engine stays", above: 2, inflight: [4]int64{9, 0, 0, 0}, own: 2,
			sets:     [4]*AdapterSet{NewAdapterSet([]string{"sql"}, 4), NewAdapterSet(nil, 4), NewAdapterSet(nil, 4), NewAdapterSet(nil, 4)},
			pickLast: true, want: []int{0}},
		{name: "the adapter's requests count over its holders", above: 3, inflight: [4]int64{9, 8, 0, 0}, own: 2,
			sets:     [4]*AdapterSet{NewAdapterSet([]string{"sql"}, 4), NewAdapterSet([]string{"sql"}, 4), NewAdapterSet(nil, 4), NewAdapterSet(nil, 4)},
			pickLast: true, want: []int{0, 1, 2}, wantLoad: true},
		{name: "every holder must be busy", above: 1, inflight: [4]int64{9, 1, 0, 0},
			sets:     [4]*AdapterSet{NewAdapterSet([]string{"sql"}, 4), NewAdapterSet([]string{"sql"}, 4), NewAdapterSet(nil, 4), NewAdapterSet(nil, 4)},
			pickLast: true, want: []int{0, 1}},
		{name: "two busy holders", above: 1, inflight: [4]int64{9, 3, 0, 1},
			sets:     [4]*AdapterSet{NewAdapterSet([]string{"sql"}, 4), NewAdapterSet([]string{"sql"}, 4), NewAdapterSet(nil, 4), NewAdapterSet(nil, 4)},
			pickLast: true, want: []int{0, 1, 2}, wantLoad: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := testWorkers(t, "llama", StagePlain, "w", 4)
			for i, w := range ws {
				w.SetAdapters(tt.sets[i])
				w.Counters.SetPeers(tt.inflight[i], 0)
				if w.Adapters().Has("sql") {
					n := tt.inflight[i]
					if tt.own > 0 {
						n = tt.own
					}
					for range n {
						w.HoldAdapter("sql", now)
					}
				}
			}
			reg, _ := NewRegistry(ws)
			var offered []*Worker
			policy := &fixedPolicy{fn: func(c []*Worker, _ *PickRequest) (Pick, error) {
				offered = slices.Clone(c)
				if tt.pickLast {
					return Pick{Worker: c[len(c)-1]}, nil
				}
				return Pick{Worker: c[0]}, nil
			}}
			g := NewEngineGroup("llama", StagePlain, nil, policy)
			g.SetAdapterLoading(time.Minute, all)
			g.SetAdapterReplication(tt.above)
			p, err := g.Pick(reg, "b", &BucketRequest{Model: "llama", ExpectedPeak: -1, Adapter: "sql", Now: now})
			if err != nil {
				t.Fatal(err)
			}
			var want []*Worker
			for _, i := range tt.want {
				want = append(want, ws[i])
			}
			if !slices.Equal(offered, want) {
				t.Fatalf("candidates %v, want %v", offered, want)
			}
			if p.LoadAdapter != tt.wantLoad || p.ReplicateAdapter != tt.wantLoad {
				t.Fatalf("pick %s: load %v replicate %v, want %v", p.Worker.ID, p.LoadAdapter, p.ReplicateAdapter, tt.wantLoad)
			}
			for _, w := range ws {
				if v := w.Adapters().Evicting("sql"); v != "" {
					t.Fatalf("%s evicts %s for a replica", w.ID, v)
				}
				if loading := w.Adapters().Loading("sql", now); loading != (tt.wantLoad && w == p.Worker) {
					t.Fatalf("%s loading sql: %v", w.ID, loading)
				}
			}
		})
	}
}

// TestGroupAdapterReplicaLoadsOnce: while a replica load of an adapter is under way, the
// adapter's requests go to its holders only (no second replica, no request herding onto the
// load); once the load completes the replica is a holder like any other.
func TestGroupAdapterReplicaLoadsOnce(t *testing.T) {
	now := time.Unix(1000, 0)
	ws := testWorkers(t, "llama", StagePlain, "w", 3)
	ws[0].SetAdapters(NewAdapterSet([]string{"sql"}, 4))
	ws[1].SetAdapters(NewAdapterSet(nil, 4))
	ws[2].SetAdapters(NewAdapterSet(nil, 4))
	ws[0].Counters.SetPeers(10, 0)
	for range 10 {
		ws[0].HoldAdapter("sql", now)
	}
	reg, _ := NewRegistry(ws)
	var offered []*Worker
	last := &fixedPolicy{fn: func(c []*Worker, _ *PickRequest) (Pick, error) {
		offered = slices.Clone(c)
		return Pick{Worker: c[len(c)-1]}, nil
	}}
	g := NewEngineGroup("llama", StagePlain, nil, last)
	g.SetAdapterLoading(time.Minute, nil)
	g.SetAdapterReplication(2)
	pick := func() Pick {
		t.Helper()
		p, err := g.Pick(reg, "b", &BucketRequest{Model: "llama", ExpectedPeak: -1, Adapter: "sql", Now: now})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := pick(); p.Worker != ws[1] || !p.ReplicateAdapter {
		t.Fatalf("first pick %s replicate %v of %v: want a replica load on w1", p.Worker.ID, p.ReplicateAdapter, offered)
	}
	for range 3 {
		if p := pick(); p.Worker != ws[0] || p.LoadAdapter {
			t.Fatalf("during w1's load: %s load %v of %v, want w0 alone", p.Worker.ID, p.LoadAdapter, offered)
		}
	}
	ws[1].AddAdapter("sql", now)
	ws[1].Counters.SetPeers(10, 0)
	for range 10 {
		ws[1].HoldAdapter("sql", now)
	}
	if p := pick(); p.Worker != ws[2] || !p.ReplicateAdapter {
		t.Fatalf("both holders busy: %s replicate %v of %v, want a replica load on w2", p.Worker.ID, p.ReplicateAdapter, offered)
	}
}

// TestGroupAdapterFirstLoadsSpread: adapters no engine holds are loaded onto the engines with
// the most free slots, so a policy that prefers one engine while all are idle does not gather
// every first load there.
func TestGroupAdapterFirstLoadsSpread(t *testing.T) {
	now := time.Unix(1000, 0)
	ws := testWorkers(t, "llama", StagePlain, "w", 3)
	for _, w := range ws {
		w.SetAdapters(NewAdapterSet(nil, 4))
	}
	ws[2].SetAdapters(NewAdapterSet([]string{"x"}, 4))
	reg, _ := NewRegistry(ws)
	first := &fixedPolicy{fn: func(c []*Worker, _ *PickRequest) (Pick, error) { return Pick{Worker: c[0]}, nil }}
	g := NewEngineGroup("llama", StagePlain, nil, first)
	g.SetAdapterLoading(time.Minute, nil)
	var got []int
	for _, a := range []string{"a", "b", "c", "d", "e"} {
		p, err := g.Pick(reg, "b", &BucketRequest{Model: "llama", ExpectedPeak: -1, Adapter: a, Now: now})
		if err != nil || !p.LoadAdapter {
			t.Fatalf("%s: %+v %v", a, p, err)
		}
		got = append(got, slices.Index(ws, p.Worker))
	}
	// w0 and w1 have 4 free slots, w2 3: a to w0, b to w1, then each has 3.
	if want := []int{0, 1, 0, 1, 2}; !slices.Equal(got, want) {
		t.Fatalf("loads went to %v, want %v", got, want)
	}
}

// TestGroupAdapterReplicaRaceFallsBackToHolders: when the replica's free slots go to other
// adapters between reading the candidates and reserving (another group's loads), the request
// is served by a holder of its adapter rather than refused by the group.
func TestGroupAdapterReplicaRaceFallsBackToHolders(t *testing.T) {
	now := time.Unix(1000, 0)
	ws := testWorkers(t, "llama", StagePlain, "w", 2)
	ws[0].SetAdapters(NewAdapterSet([]string{"sql"}, 4))
	ws[1].SetAdapters(NewAdapterSet(nil, 2))
	ws[0].Counters.SetPeers(10, 0)
	for range 10 {
		ws[0].HoldAdapter("sql", now)
	}
	reg, _ := NewRegistry(ws)
	var offers [][]*Worker
	last := &fixedPolicy{fn: func(c []*Worker, _ *PickRequest) (Pick, error) {
		offers = append(offers, slices.Clone(c))
		if len(offers) == 1 {
			// Another group fills the replica's slots before this pick reserves one.
			for _, a := range []string{"a", "b"} {
				if !reserve(ws[1], a, now, now.Add(time.Minute), nil) {
					t.Fatalf("reserving %s on w1", a)
				}
			}
		}
		return Pick{Worker: c[len(c)-1]}, nil
	}}
	g := NewEngineGroup("llama", StagePlain, nil, last)
	g.SetAdapterLoading(time.Minute, nil)
	g.SetAdapterReplication(2)
	p, err := g.Pick(reg, "b", &BucketRequest{Model: "llama", ExpectedPeak: -1, Adapter: "sql", Now: now})
	if err != nil {
		t.Fatalf("pick after the replica lost its slots: %v", err)
	}
	if p.Worker != ws[0] || p.LoadAdapter || p.ReplicateAdapter {
		t.Fatalf("pick %s load %v replicate %v, want the holder w0 without a load", p.Worker.ID, p.LoadAdapter, p.ReplicateAdapter)
	}
	if len(offers) != 2 || !slices.Equal(offers[0], ws) || !slices.Equal(offers[1], ws[:1]) {
		t.Fatalf("offers %v, want [w0 w1] then [w0]", offers)
	}
	if ws[1].Adapters().Loading("sql", now) {
		t.Fatal("w1 loads sql after losing its slots")
	}
}

// TestGroupAdapterSlotsInUse: a group that may evict fails with ErrAdapterSlotsInUse when
// every slot of its candidates is taken by an evictable adapter in use or a load under way
// (the end of either may free one), not when the slots hold only adapters it may not evict,
// nor without eviction; a hold's Release says whether it was the adapter's last.
func TestGroupAdapterSlotsInUse(t *testing.T) {
	now := time.Unix(1000, 0)
	all := map[string]struct{}{"a": {}, "b": {}, "x": {}}
	tests := []struct {
		name      string
		evictable map[string]struct{}
		// hold holds adapter a on the engine; reserve reserves its slot for a load of x
		// (then it holds nothing) until now+reserve.
		hold    bool
		reserve time.Duration
		want    bool
	}{
		{name: "in use", evictable: all, hold: true, want: true},
		{name: "a load under way", evictable: all, reserve: time.Minute, want: true},
		{name: "no eviction", evictable: nil, hold: true, want: false},
		{name: "not evictable", evictable: map[string]struct{}{"b": {}}, hold: true, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := testWorkers(t, "llama", StagePlain, "w", 1)
			w := ws[0]
			if tt.reserve > 0 {
				w.SetAdapters(NewAdapterSet(nil, 1))
				if !reserve(w, "x", now, now.Add(tt.reserve), nil) {
					t.Fatal("cannot reserve the slot")
				}
			} else {
				w.SetAdapters(NewAdapterSet([]string{"a"}, 1))
			}
			var holds []AdapterHold
			if tt.hold {
				for range 2 {
					h, ok := w.HoldAdapter("a", now)
					if !ok {
						t.Fatal("cannot hold a")
					}
					holds = append(holds, h)
				}
			}
			reg, _ := NewRegistry(ws)
			g := NewEngineGroup("llama", StagePlain, nil, NewRoundRobin(nil, nil))
			g.SetAdapterLoading(time.Minute, tt.evictable)
			_, err := g.Pick(reg, "b", &BucketRequest{Model: "llama", ExpectedPeak: -1, Adapter: "b", Now: now})
			if !errors.Is(err, ErrNoCandidates) || errors.Is(err, ErrAdapterSlotsInUse) != tt.want {
				t.Fatalf("err = %v, want no candidates, slots in use %v", err, tt.want)
			}
			if tt.reserve > 0 {
				// Once the reservation lapsed, nothing will free the slot.
				later := now.Add(tt.reserve)
				if w.Adapters().InUse(all, later) {
					t.Fatal("a lapsed reservation counts as in use")
				}
			}
			for i, h := range holds {
				if idle := h.Release(now); idle != (i == len(holds)-1) {
					t.Fatalf("release %d of %d said idle %v", i+1, len(holds), idle)
				}
			}
			if tt.hold {
				if w.Adapters().InUse(all, now) {
					t.Fatal("an adapter no request holds counts as in use")
				}
				_, evicts := tt.evictable["a"]
				if _, err := g.Pick(reg, "b", &BucketRequest{Model: "llama", ExpectedPeak: -1, Adapter: "b", Now: now}); evicts == (err != nil) {
					t.Fatalf("after the holds ended (a evictable: %v): %v", evicts, err)
				}
			}
		})
	}
}

// TestLearnAdaptersRoom: learning an engine's list reports room when the list drops an
// adapter, names one the router did not know, or brings more slots; the same list again, or
// fewer slots, does not.
func TestLearnAdaptersRoom(t *testing.T) {
	tests := []struct {
		name  string
		names []string
		slots int
		want  bool
	}{
		{name: "the same list", names: []string{"a", "b"}, slots: 2},
		{name: "fewer slots", names: []string{"a", "b"}, slots: 1},
		{name: "an adapter gone", names: []string{"a"}, slots: 2, want: true},
		{name: "an adapter not known", names: []string{"a", "b", "c"}, slots: 2, want: true},
		{name: "more slots", names: []string{"a", "b"}, slots: 3, want: true},
		{name: "unbounded slots", names: []string{"a", "b"}, slots: 0, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := NewWorker("w", "http://127.0.0.1:1", "llama", StagePlain, nil)
			if w.LearnAdapters([]string{"a", "b"}, 2, time.Now()) {
				t.Fatal("the first list of a worker that knew nothing reported room")
			}
			if got := w.LearnAdapters(tt.names, tt.slots, time.Now()); got != tt.want {
				t.Fatalf("room %v, want %v", got, tt.want)
			}
			if s := w.Adapters(); !slices.Equal(s.Names(), tt.names) || s.Slots != tt.slots {
				t.Fatalf("learned %v with %d slots, want %v with %d", s.Names(), s.Slots, tt.names, tt.slots)
			}
		})
	}
}

// TestSetAdapterSlots: the slots of an engine's facts replace the ones counted, keeping its
// adapters, their use and the loads under way, and report more room only when there is.
func TestSetAdapterSlots(t *testing.T) {
	now := time.Unix(1000, 0)
	w := NewWorker("w", "http://127.0.0.1:1", "llama", StagePlain, nil)
	if w.SetAdapterSlots(4) || w.Adapters() != nil {
		t.Fatal("slots set on a worker whose adapters are not known")
	}
	w.SetAdapters(NewAdapterSet([]string{"a"}, 8))
	h, ok := w.HoldAdapter("a", now)
	if !ok || !reserve(w, "b", now, now.Add(time.Minute), nil) {
		t.Fatal("no hold or reservation")
	}
	if w.SetAdapterSlots(2) {
		t.Fatal("fewer slots reported as more")
	}
	s := w.Adapters()
	if s.Slots != 2 || !s.Has("a") || s.InFlight("a") != 1 || !s.Loading("b", now) || s.Free(now) {
		t.Fatalf("after 2 slots: %d slots, %v, a in flight %d, loading b %v, free %v",
			s.Slots, s.Names(), s.InFlight("a"), s.Loading("b", now), s.Free(now))
	}
	if w.SetAdapterSlots(2) {
		t.Fatal("the same slots reported as more")
	}
	if !w.SetAdapterSlots(3) || !w.Adapters().Free(now) {
		t.Fatal("a third slot was not reported, or is not free")
	}
	if !w.SetAdapterSlots(0) || w.SetAdapterSlots(5) {
		t.Fatal("unbounded slots: more than 3 and than 5")
	}
	if !h.Release(now) {
		t.Fatal("the hold taken before the slots changed was not the adapter's last")
	}
}

// TestAdapterNextLapse: the earliest reservation still held at now lapses next.
func TestAdapterNextLapse(t *testing.T) {
	now := time.Unix(1000, 0)
	var none *AdapterSet
	if !none.NextLapse(now).IsZero() || !NewAdapterSet(nil, 4).NextLapse(now).IsZero() {
		t.Fatal("a lapse without reservations")
	}
	w := NewWorker("w", "http://127.0.0.1:1", "llama", StagePlain, nil)
	w.SetAdapters(NewAdapterSet(nil, 4))
	reserve(w, "a", now, now.Add(3*time.Second), nil)
	reserve(w, "b", now, now.Add(time.Second), nil)
	reserve(w, "c", now, now.Add(2*time.Second), nil)
	for _, tt := range []struct {
		at, want time.Duration // after now; want 0: none
	}{{0, time.Second}, {time.Second, 2 * time.Second}, {2500 * time.Millisecond, 3 * time.Second}, {3 * time.Second, 0}} {
		want := time.Time{}
		if tt.want > 0 {
			want = now.Add(tt.want)
		}
		if got := w.Adapters().NextLapse(now.Add(tt.at)); !got.Equal(want) {
			t.Errorf("at +%v: next lapse %v, want %v", tt.at, got, want)
		}
	}
}

// reserve is Worker.ReserveAdapter for a test that keeps its share.
func reserve(w *Worker, name string, now, until time.Time, evictable map[string]struct{}) bool {
	_, ok := w.ReserveAdapter(name, now, until, evictable)
	return ok
}
