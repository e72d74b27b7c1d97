package engine

import (
	"errors"
	"testing"
	"time"
)

// TestAdapterReservationShares: picks that rely on one reservation each hold a share; the
// slot frees when the last share is given back, not before, and never once a dispatch began
// the load (the load's end frees it then).
func TestAdapterReservationShares(t *testing.T) {
	now := time.Unix(1000, 0)
	tests := []struct {
		name     string
		begin    bool // the first pick's dispatch began the load
		abandon  []int
		wantFree int
	}{
		{name: "one of two abandoned", abandon: []int{0}, wantFree: 0},
		{name: "the other of two abandoned", abandon: []int{1}, wantFree: 0},
		{name: "both abandoned", abandon: []int{0, 1}, wantFree: 1},
		{name: "both abandoned twice", abandon: []int{0, 1, 0, 1}, wantFree: 1},
		{name: "one began its load, the other abandoned", begin: true, abandon: []int{0, 1}, wantFree: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := testWorkers(t, "llama", StagePlain, "w", 1)[0]
			w.SetAdapters(NewAdapterSet([]string{"sql"}, 2))
			woken := 0
			w.AdapterRoom = func(model string) {
				if model != "llama" {
					t.Errorf("AdapterRoom(%q), want llama", model)
				}
				woken++
			}
			var picks [2]Pick
			for i := range picks {
				r, ok := w.ReserveAdapter("math", now, now.Add(time.Minute), nil)
				if !ok || r == (AdapterReservation{}) {
					t.Fatalf("pick %d: reserved %v, share %+v", i, ok, r)
				}
				picks[i] = Pick{Worker: w, LoadAdapter: true, Reservation: r}
			}
			if picks[0].Reservation != picks[1].Reservation {
				t.Fatal("the second pick did not share the load under way")
			}
			if n := w.Adapters().FreeSlots(now); n != 0 {
				t.Fatalf("%d free slots after two picks of one load, want 0", n)
			}
			if tt.begin {
				picks[0].BeginAdapterLoad(now)
			}
			for _, i := range tt.abandon {
				picks[i].AbandonAdapter()
			}
			if n := w.Adapters().FreeSlots(now); n != tt.wantFree {
				t.Fatalf("%d free slots, want %d", n, tt.wantFree)
			}
			if woken != tt.wantFree {
				t.Fatalf("AdapterRoom called %d times, want %d", woken, tt.wantFree)
			}
			if got := w.Adapters().Loading("math", now); got != (tt.wantFree == 0) {
				t.Fatalf("Loading = %v with %d free slots", got, tt.wantFree)
			}
		})
	}
}

// TestAdapterReservationAbandonAfterLoadEnds: a share of a reservation whose load ended (or
// that lapsed) gives back nothing: it never frees the slot of another load of the adapter.
func TestAdapterReservationAbandonAfterLoadEnds(t *testing.T) {
	now := time.Unix(1000, 0)
	w := testWorkers(t, "llama", StagePlain, "w", 1)[0]
	w.SetAdapters(NewAdapterSet(nil, 1))
	r1, _ := w.ReserveAdapter("math", now, now.Add(time.Minute), nil)
	w.ReleaseAdapter("math") // its load failed
	r2, ok := w.ReserveAdapter("math", now, now.Add(time.Minute), nil)
	if !ok || r2 == r1 {
		t.Fatalf("a new reservation: %v, share %+v (the old one %+v)", ok, r2, r1)
	}
	stale := Pick{Worker: w, LoadAdapter: true, Reservation: r1}
	stale.AbandonAdapter()
	if w.Adapters().Free(now) {
		t.Fatal("a share of an ended reservation freed the slot of the next load")
	}
	held := Pick{Worker: w, Reservation: AdapterReservation{}}
	held.AbandonAdapter() // a pick of an engine that held the adapter reserved nothing
	if w.Adapters().Free(now) {
		t.Fatal("a pick without a share freed a slot")
	}
}

// TestAdapterReservationAbandonRestoresVictim: a reservation that evicted an adapter and is
// abandoned before its load gives the adapter back (it was never unloaded).
func TestAdapterReservationAbandonRestoresVictim(t *testing.T) {
	now := time.Unix(1000, 0)
	w := testWorkers(t, "llama", StagePlain, "w", 1)[0]
	w.SetAdapters(NewAdapterSet([]string{"a"}, 1))
	r, ok := w.ReserveAdapter("b", now, now.Add(time.Minute), map[string]struct{}{"a": {}})
	if !ok || w.Adapters().Has("a") || w.Adapters().Evicting("b") != "a" {
		t.Fatalf("b did not evict a: %v %+v", ok, w.Adapters())
	}
	p := Pick{Worker: w, LoadAdapter: true, Reservation: r}
	p.AbandonAdapter()
	s := w.Adapters()
	if !s.Has("a") || s.Loading("b", now) || s.Free(now) {
		t.Fatalf("after the abandon: has a %v, loading b %v, free %v; want a back and the one slot its", s.Has("a"), s.Loading("b", now), s.Free(now))
	}
	if _, ok := w.HoldAdapter("a", now); !ok {
		t.Fatal("a request cannot hold the restored adapter")
	}
	// The engine's list asked for after the eviction still names a: it stays.
	if w.LearnAdapters([]string{"a"}, 1, now.Add(time.Second)); !w.Adapters().Has("a") {
		t.Fatal("the engine's list dropped the restored adapter")
	}
}

// TestGroupRankRefusalGivesBackSlot: a pick that reserved a slot and is then refused by the
// data-parallel rank admission gives the slot back at once.
func TestGroupRankRefusalGivesBackSlot(t *testing.T) {
	w := dpWorker(t, 2)
	w.SetAdapters(NewAdapterSet(nil, 1))
	woken := 0
	w.AdapterRoom = func(string) { woken++ }
	tab := rankTable(t, w, native(4, 2, 0, 100), native(4, 2, 0, 100)) // every rank at the cap
	g, reg := rankGroup(w, tab, 2)
	g.SetAdapterLoading(time.Minute, nil)
	_, err := g.Pick(reg, "b", &BucketRequest{Model: "llama", ExpectedPeak: -1, Adapter: "math", Now: t0})
	if !errors.Is(err, ErrAdmissionRejected) {
		t.Fatalf("err = %v, want a rank admission rejection", err)
	}
	if s := w.Adapters(); !s.Free(t0) || s.Loading("math", t0) {
		t.Fatalf("the refused pick's slot is still reserved: free %v, loading %v", s.Free(t0), s.Loading("math", t0))
	}
	if woken != 1 {
		t.Fatalf("AdapterRoom called %d times, want 1", woken)
	}
}

// TestPDDecodeFailureGivesBackPrefillSlot: a PD bucket whose decode side fails after the
// prefill side reserved a slot gives it back at once, and the decode side's own reservation
// likewise when the prefill side fails after it (bypass order).
func TestPDDecodeFailureGivesBackPrefillSlot(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, bypass := range []bool{false, true} {
		name := "prefill first"
		if bypass {
			name = "decode first"
		}
		t.Run(name, func(t *testing.T) {
			pre := labelled(t, StagePrefill, "P", "nixl")
			dec := labelled(t, StageDecode, "D", "mooncake") // no decode engine pairs with P0
			for _, w := range append(pre, dec...) {
				w.SetAdapters(NewAdapterSet(nil, 1))
			}
			set := mustSet(t, pre, dec)
			b := pdBucketOf("b", 0, pre, dec, Compatibility{"transfer_backend"})
			b.Prefill.SetAdapterLoading(time.Minute, nil)
			b.Decode.SetAdapterLoading(time.Minute, nil)
			first := pre[0]
			if bypass {
				b.BypassBelow = 1 // D0 cannot prefill: the pair goes on to the prefill group
				first = dec[0]
			}
			_, err := pickEngines(b, set.Load(), &BucketRequest{Model: "llama", ExpectedPeak: -1, Adapter: "math", Now: now})
			if !errors.Is(err, ErrPDIncompatible) {
				t.Fatalf("err = %v, want no compatible pair", err)
			}
			if s := first.Adapters(); !s.Free(now) || s.Loading("math", now) {
				t.Fatalf("%s's slot is still reserved after the pair failed", first.ID)
			}
		})
	}
}

// TestAdapterReservationLapseRestoresVictim: a reservation that evicted an adapter and lapses
// before any dispatch began its load gives the adapter back (the engine was never asked to
// unload it): the next pick for it finds it held. Once a dispatch began the load, the
// victim may be unloaded already and stays out.
func TestAdapterReservationLapseRestoresVictim(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, began := range []bool{false, true} {
		name := "load never began"
		if began {
			name = "load began"
		}
		t.Run(name, func(t *testing.T) {
			w := testWorkers(t, "llama", StagePlain, "w", 1)[0]
			w.SetAdapters(NewAdapterSet([]string{"a"}, 1))
			evictable := map[string]struct{}{"a": {}, "b": {}}
			r, ok := w.ReserveAdapter("b", now, now.Add(time.Minute), evictable)
			if !ok || w.Adapters().Has("a") {
				t.Fatalf("b did not evict a: %v %v", ok, w.Adapters().Names())
			}
			if began {
				if p := (Pick{Worker: w, LoadAdapter: true, Reservation: r}); !p.BeginAdapterLoad(now) {
					t.Fatal("a live reservation's load could not begin")
				}
			}
			g := NewEngineGroup("llama", StagePlain, nil, NewRoundRobin(nil, nil))
			g.SetAdapterLoading(time.Minute, evictable)
			later := now.Add(2 * time.Minute) // b's reservation has lapsed
			p, err := g.Pick(mustSet(t, []*Worker{w}).Load(), "b", &BucketRequest{Model: "llama", ExpectedPeak: -1, Adapter: "a", Now: later})
			if err != nil {
				t.Fatal(err)
			}
			if p.LoadAdapter == !began || w.Adapters().Has("a") == began {
				t.Fatalf("the pick for a after the lapse: load %v, a held %v; want load %v", p.LoadAdapter, w.Adapters().Has("a"), began)
			}
			if w.Adapters().Loading("b", later) {
				t.Fatal("the lapsed reservation of b still counts")
			}
		})
	}
}

// TestBeginAdapterLoad: a pick's load begins only while its reservation holds its slot;
// one whose reservation was dropped (the load it shared failed) or lapsed must not load,
// and keeps its share for the caller to give back.
func TestBeginAdapterLoad(t *testing.T) {
	now := time.Unix(1000, 0)
	tests := []struct {
		name string
		// before runs between the pick's reservation and its dispatch.
		before    func(w *Worker)
		at        time.Duration // after now
		want      bool
		wantShare bool
	}{
		{name: "reservation held", want: true},
		{name: "the shared load failed", before: func(w *Worker) { w.ReleaseAdapter("math") }, wantShare: true},
		{name: "reservation lapsed", at: 2 * time.Minute, wantShare: true},
		{name: "the failed load's slot taken by another", before: func(w *Worker) {
			w.ReleaseAdapter("math")
			w.ReserveAdapter("sql", now, now.Add(time.Minute), nil)
		}, wantShare: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := testWorkers(t, "llama", StagePlain, "w", 1)[0]
			w.SetAdapters(NewAdapterSet(nil, 1))
			r, _ := w.ReserveAdapter("math", now, now.Add(time.Minute), nil)
			p := Pick{Worker: w, LoadAdapter: true, Reservation: r}
			if tt.before != nil {
				tt.before(w)
			}
			if got := p.BeginAdapterLoad(now.Add(tt.at)); got != tt.want {
				t.Fatalf("BeginAdapterLoad = %v, want %v", got, tt.want)
			}
			if share := p.Reservation != (AdapterReservation{}); share != tt.wantShare {
				t.Fatalf("share kept %v, want %v", share, tt.wantShare)
			}
		})
	}
	p := Pick{Worker: testWorkers(t, "llama", StagePlain, "v", 1)[0]}
	if !p.BeginAdapterLoad(now) {
		t.Fatal("a pick that reserved nothing cannot begin")
	}
}

// TestGroupAdapterHeldAtReserve: a pick offered to load an adapter whose engine holds it by
// the time the slot is reserved (a load ended meanwhile) is a plain hit: it reserves
// nothing and says not to load.
func TestGroupAdapterHeldAtReserve(t *testing.T) {
	w := testWorkers(t, "llama", StagePlain, "w", 1)[0]
	w.SetAdapters(NewAdapterSet(nil, 2))
	g := NewEngineGroup("llama", StagePlain, nil, &fixedPolicy{fn: func(c []*Worker, _ *PickRequest) (Pick, error) {
		c[0].AddAdapter("math", t0) // another load of it ends while this pick is made
		return Pick{Worker: c[0]}, nil
	}})
	g.SetAdapterLoading(time.Minute, nil)
	p, err := g.Pick(mustSet(t, []*Worker{w}).Load(), "b", &BucketRequest{Model: "llama", ExpectedPeak: -1, Adapter: "math", Now: t0})
	if err != nil {
		t.Fatal(err)
	}
	if p.LoadAdapter || p.ReplicateAdapter || p.Reservation != (AdapterReservation{}) {
		t.Fatalf("pick %+v, want a hit with no load and no share", p)
	}
}
