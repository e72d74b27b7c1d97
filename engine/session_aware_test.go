package engine

import (
	"errors"
	"testing"

	"switchyard/config"
	"switchyard/load"
)

func TestSessionAwareKeylessUsesPowerOfTwo(t *testing.T) {
	// Two candidates: power-of-two samples both and takes the less loaded one every time.
	ws := testWorkers(t, "llama", StagePrefill, "w", 2)
	tab := loadTable(t, map[*Worker]load.RankReport{ws[0]: native(9, 9, 9000, 0), ws[1]: native(0, 0, 0, 0)})
	store := newMemAffinity()
	p := NewSessionAware(nil, tab, store, testRNG())
	for range 20 {
		got, err := p.Pick(ws, pickReq(StagePrefill))
		if err != nil || got.Worker != ws[1] || got.Reason != ReasonNoSession {
			t.Fatalf("got %v (%v), want w1 by power_of_two with reason no_session", got, err)
		}
	}
	if store.lookups != 0 || store.binds != 0 {
		t.Fatalf("keyless picks used the store: %d lookups, %d binds", store.lookups, store.binds)
	}
}

func TestSessionAwareTurnsStayOnTheirEngine(t *testing.T) {
	// Ten turns of one session stay on the engine of the first turn even when its load grows
	// past every other engine's; another session is placed by power_of_two on its own.
	ws := testWorkers(t, "llama", StagePlain, "w", 4)
	set := mustSet(t, ws)
	tab := load.NewTable()
	p := NewSessionAware(nil, tab, newMemAffinity(), testRNG())
	g := NewEngineGroup("llama", StagePlain, nil, p)
	var home *Worker
	for turn := range 10 {
		req := breq("llama", int64(100*(turn+1)), -1)
		req.Now = t0
		req.SessionKey = "chat-42"
		got, err := g.Pick(set.Load(), "b", req)
		if err != nil {
			t.Fatal(err)
		}
		want := ReasonSessionPrimary
		if turn == 0 {
			home, want = got.Worker, ReasonAssigned
		}
		if got.Worker != home || got.Reason != want {
			t.Fatalf("turn %d: %v (%s), want %v (%s)", turn, got.Worker, got.Reason, home, want)
		}
		// The home engine becomes the most loaded one.
		reports := map[*Worker]load.RankReport{}
		for _, w := range ws {
			reports[w] = native(1, 0, 0, 0)
		}
		reports[home] = native(int64(10*(turn+1)), int64(turn+1), 5000, 0)
		tab.Store(loadTable(t, reports).Load())
	}
}

func TestSessionAwareEmptyKeyIsKeyless(t *testing.T) {
	ws := testWorkers(t, "llama", StageDecode, "w", 3)
	store := newMemAffinity()
	req := pickReq(StageDecode)
	req.SessionKey = ""
	req.RoutingKey = "ignored-by-session-aware"
	got, err := NewSessionAware(nil, nil, store, testRNG()).Pick(ws, req)
	if err != nil || got.Reason != ReasonNoSession || store.binds != 0 {
		t.Fatalf("got %v (%v), binds %d", got, err, store.binds)
	}
}

func TestBuildResolversAffinityPolicies(t *testing.T) {
	pol := func(typ, fallback string) *config.Policy { return &config.Policy{Type: typ, Fallback: fallback} }
	maxIn := int64(4096)
	cfg := &config.Config{Models: map[string]config.Model{"llama": {Buckets: []config.Bucket{
		{ID: "plain", Limits: config.Limits{Max: &maxIn}, Groups: config.Groups{Plain: &config.Group{Policy: pol(PolicySessionAware, "")}}},
		{ID: "pd", Groups: config.Groups{PD: &config.PDGroups{
			Prefill: &config.Group{Policy: pol(PolicySticky, "")},
			Decode:  &config.Group{Policy: pol(PolicySessionAware, "")},
		}}},
	}}}}
	store := newMemAffinity()
	rs, err := BuildResolvers(cfg, Deps{Affinity: store, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]*Bucket{}
	for _, b := range rs["llama"].Buckets() {
		byID[b.ID] = b
	}
	if _, ok := byID["plain"].Plain.Policy().(*SessionAware); !ok {
		t.Fatalf("plain group runs %s", byID["plain"].Plain.Policy().Name())
	}
	st, ok := byID["pd"].Prefill.Policy().(*Sticky)
	if !ok || st.Fallback().Name() != PolicyRoundRobin {
		t.Fatalf("prefill group runs %T, want sticky with the round_robin default fallback", byID["pd"].Prefill.Policy())
	}
	if _, ok := byID["pd"].Decode.Policy().(*SessionAware); !ok {
		t.Fatalf("decode group runs %s", byID["pd"].Decode.Policy().Name())
	}

	for _, fb := range []string{PolicyRoundRobin, PolicyRandom, PolicyPowerOfTwo, PolicyLoadBased} {
		t.Run("sticky fallback "+fb, func(t *testing.T) {
			cfg := &config.Config{Models: map[string]config.Model{"llama": {Buckets: []config.Bucket{
				{ID: "b", Groups: config.Groups{Plain: &config.Group{Policy: &config.Policy{
					Type: PolicySticky, Fallback: fb, Admission: config.Admission{MaxRunningRequests: &maxIn},
				}}}},
			}}}}
			rs, err := BuildResolvers(cfg, Deps{Affinity: store, Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			st := rs["llama"].Buckets()[0].Plain.Policy().(*Sticky)
			if st.Fallback().Name() != fb {
				t.Fatalf("fallback %s, want %s", st.Fallback().Name(), fb)
			}
			if st.admission == nil {
				t.Fatal("sticky lost its configured admission")
			}
			if n := fallbackAdmission(st.Fallback()); n != nil {
				t.Fatalf("fallback %s has admission %v, want the default", fb, n)
			}
		})
	}

	t.Run("without a store", func(t *testing.T) {
		_, err := BuildResolvers(cfg, Deps{Seed: 1})
		if !errors.Is(err, ErrInvalidConfiguration) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("unknown fallback", func(t *testing.T) {
		cfg := &config.Config{Models: map[string]config.Model{"llama": {Buckets: []config.Bucket{
			{ID: "b", Groups: config.Groups{Plain: &config.Group{Policy: pol(PolicySticky, PolicyCacheAware)}}},
		}}}}
		if _, err := BuildResolvers(cfg, Deps{Affinity: store, Seed: 1}); !errors.Is(err, ErrInvalidConfiguration) {
			t.Fatalf("err = %v", err)
		}
	})
}

// fallbackAdmission returns the admission a load policy was built with.
func fallbackAdmission(p Policy) EngineAdmission {
	switch p := p.(type) {
	case *RoundRobin:
		return p.admission
	case *Random:
		return p.admission
	case *PowerOfTwo:
		return p.admission
	case *LoadBased:
		return p.admission
	}
	return AdmissionLimits{MaxRunning: -1}
}

// TestAffinityMissingBindingPrefersPrefixHolder: with PreferPrefixHolders, a key without a
// live binding (new, expired, or lost with a crashed replica's partition) binds to the
// admitted candidate holding the longest cached prefix of the request; without a usable
// holder the fallback chooses as before. Both affinity policies share the rule.
func TestAffinityMissingBindingPrefersPrefixHolder(t *testing.T) {
	tests := []struct {
		name     string
		prefer   bool
		min      int64
		matched  map[string]int64 // by worker index
		status   *fakePrefix      // overrides the lookup's status
		bound    string           // the key's binding before the pick ("" none)
		busy     []int            // workers at the in-flight cap
		want     string           // worker ID, or "" for any fallback choice
		wantWhy  string
		notWorks []string // workers the pick must not return
	}{
		{name: "the longest holder wins", prefer: true, min: 64,
			matched: map[string]int64{"w1": 300, "w2": 900}, want: "w2", wantWhy: ReasonPrefixHolder},
		{name: "a tie goes to the lower ID", prefer: true, min: 64,
			matched: map[string]int64{"w3": 500, "w1": 500}, want: "w1", wantWhy: ReasonPrefixHolder},
		{name: "a holder at its cap yields to the next one", prefer: true, min: 64, busy: []int{2},
			matched: map[string]int64{"w1": 300, "w2": 900}, want: "w1", wantWhy: ReasonPrefixHolder},
		{name: "every holder at its cap: the fallback chooses", prefer: true, min: 64, busy: []int{1, 2},
			matched: map[string]int64{"w1": 300, "w2": 900}, wantWhy: ReasonAssigned, notWorks: []string{"w1", "w2"}},
		{name: "below the minimum: the fallback chooses", prefer: true, min: 1000,
			matched: map[string]int64{"w2": 900}, wantWhy: ReasonAssigned},
		{name: "an out-of-group binding is replaced by the holder", prefer: true, min: 64, bound: "gone",
			matched: map[string]int64{"w3": 900}, want: "w3", wantWhy: ReasonPrefixHolder},
		{name: "a live binding wins over a longer holder", prefer: true, min: 64, bound: "w0",
			matched: map[string]int64{"w3": 900}, want: "w0", wantWhy: "reuse"},
		{name: "an unavailable lookup: the fallback chooses", prefer: true, min: 64,
			matched: map[string]int64{"w3": 900}, status: &fakePrefix{unavailable: true}, wantWhy: ReasonAssigned},
		{name: "a rejected lookup: the fallback chooses", prefer: true, min: 64,
			matched: map[string]int64{"w3": 900}, status: &fakePrefix{err: errors.New("bad tokens")}, wantWhy: ReasonAssigned},
		{name: "not configured: the fallback chooses", prefer: false,
			matched: map[string]int64{"w3": 900}, wantWhy: ReasonAssigned},
	}
	for _, kind := range []string{PolicySessionAware, PolicySticky} {
		for _, tt := range tests {
			t.Run(kind+"/"+tt.name, func(t *testing.T) {
				tr := load.NewTracker()
				ws := make([]*Worker, 4)
				for i := range ws {
					id := "w" + string(rune('0'+i))
					ws[i] = NewWorker(id, "http://127.0.0.1:1", "llama", StagePlain, tr.Counters(id))
				}
				for _, i := range tt.busy {
					inflight(t, tr, ws[i], 1)
				}
				adm := admissionOf(AdmissionLimits{MaxInFlight: 1})
				store := newMemAffinity()
				scope := AffinityScope{Model: "llama", BucketID: "b", Stage: StagePlain}
				if tt.bound != "" {
					store.scope(scope)["k"] = tt.bound
				}
				var p Policy
				var a *affinity
				reuse := ReasonSessionPrimary
				switch kind {
				case PolicySessionAware:
					s := NewSessionAware(adm, nil, store, testRNG())
					p, a = s, &s.affinity
				default:
					s := NewSticky(adm, nil, store, NewRoundRobin(nil, nil))
					p, a, reuse = s, &s.affinity, ReasonHit
				}
				if tt.prefer {
					a.PreferPrefixHolders(nil, tt.min)
				}
				pm := &fakePrefix{matched: tt.matched}
				if tt.status != nil {
					pm.unavailable, pm.err = tt.status.unavailable, tt.status.err
				}
				req := &PickRequest{BucketRequest: &BucketRequest{Model: "llama", InputTokens: 1000, ExpectedPeak: -1, Now: t0,
					SessionKey: "k", RoutingKey: "k", Prefix: pm}, Stage: StagePlain, BucketID: "b"}
				got, err := p.Pick(ws, req)
				if err != nil {
					t.Fatal(err)
				}
				why := tt.wantWhy
				if why == "reuse" {
					why = reuse
				}
				if got.Reason != why {
					t.Fatalf("reason %q, want %q (picked %s)", got.Reason, why, got.Worker.ID)
				}
				if tt.want != "" && got.Worker.ID != tt.want {
					t.Fatalf("picked %s, want %s", got.Worker.ID, tt.want)
				}
				for _, no := range tt.notWorks {
					if got.Worker.ID == no {
						t.Fatalf("picked %s, which is at its cap", no)
					}
				}
				if b := store.scope(scope)["k"]; b != got.Worker.ID {
					t.Fatalf("binding %q after the pick, want %q", b, got.Worker.ID)
				}
			})
		}
	}
}
