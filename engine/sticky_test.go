package engine

import (
	"errors"
	"fmt"
	"testing"
)

// stickyGroup returns a plain group of every healthy llama engine running sticky with a
// round_robin fallback (the default) over store.
func stickyGroup(store AffinityStore, adm EngineAdmission) (*EngineGroup, *Sticky) {
	p := NewSticky(adm, nil, store, NewRoundRobin(nil, nil))
	return NewEngineGroup("llama", StagePlain, nil, p), p
}

func routed(key string) *BucketRequest {
	r := breq("llama", 10, -1)
	r.Now = t0
	r.RoutingKey = key
	return r
}

func TestStickyNewKeysFollowTheFallback(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 3)
	set := mustSet(t, ws)
	g, _ := stickyGroup(newMemAffinity(), nil)
	// Round-robin assigns new keys in rotation; every later request of a key is a hit.
	for round, wantReason := range []string{ReasonAssigned, ReasonHit, ReasonHit} {
		for i := range 6 {
			got, err := g.Pick(set.Load(), "b", routed(fmt.Sprintf("k%d", i)))
			if err != nil {
				t.Fatal(err)
			}
			if got.Worker != ws[i%3] || got.Reason != wantReason {
				t.Fatalf("round %d key k%d: got %v (%s), want %v (%s)", round, i, got.Worker, got.Reason, ws[i%3], wantReason)
			}
		}
	}
	// No routing key: the fallback keeps rotating, and nothing is bound.
	for i := range 4 {
		got, err := g.Pick(set.Load(), "b", routed(""))
		if err != nil || got.Reason != ReasonNoRoutingKey || got.Worker != ws[i%3] {
			t.Fatalf("keyless %d: %v (%v)", i, got, err)
		}
	}
}

func TestStickyAddingEnginesNeverMovesKeys(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 3)
	set := mustSet(t, ws)
	g, _ := stickyGroup(newMemAffinity(), nil)
	first := map[string]*Worker{}
	for i := range 30 {
		k := fmt.Sprintf("key-%d", i)
		got, err := g.Pick(set.Load(), "b", routed(k))
		if err != nil {
			t.Fatal(err)
		}
		first[k] = got.Worker
	}
	for _, w := range testWorkers(t, "llama", StagePlain, "x", 2) {
		if err := set.Add(w); err != nil {
			t.Fatal(err)
		}
	}
	for k, w := range first {
		got, err := g.Pick(set.Load(), "b", routed(k))
		if err != nil || got.Worker != w || got.Reason != ReasonHit {
			t.Fatalf("%s moved from %v to %v (%s, %v) after engines were added", k, w, got.Worker, got.Reason, err)
		}
	}
	// New keys do reach the new engines.
	seen := map[*Worker]bool{}
	for i := range 10 {
		got, _ := g.Pick(set.Load(), "b", routed(fmt.Sprintf("new-%d", i)))
		seen[got.Worker] = true
	}
	if len(seen) != 5 {
		t.Fatalf("new keys reached %d engines, want all 5", len(seen))
	}
}

func TestStickyRemapsOnlyWhenTheEngineLeaves(t *testing.T) {
	tests := []struct {
		name  string
		leave func(set *WorkerSet, w *Worker)
		back  func(set *WorkerSet, w *Worker)
	}{
		{"engine removed", func(s *WorkerSet, w *Worker) { s.Remove(w.ID) }, func(s *WorkerSet, w *Worker) { _ = s.Add(w) }},
		{"engine unhealthy", func(s *WorkerSet, w *Worker) { s.SetHealthy(w.ID, false) }, func(s *WorkerSet, w *Worker) { s.SetHealthy(w.ID, true) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := testWorkers(t, "llama", StagePlain, "w", 3)
			set := mustSet(t, ws)
			g, _ := stickyGroup(newMemAffinity(), nil)
			first := map[string]*Worker{}
			for i := range 9 {
				k := fmt.Sprintf("key-%d", i)
				got, _ := g.Pick(set.Load(), "b", routed(k))
				first[k] = got.Worker
			}
			tt.leave(set, ws[1])
			moved := map[string]*Worker{}
			for k, w := range first {
				got, err := g.Pick(set.Load(), "b", routed(k))
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case w == ws[1] && (got.Reason != ReasonRemap || got.Worker == ws[1]):
					t.Fatalf("%s on the departed engine: got %v (%s), want remap", k, got.Worker, got.Reason)
				case w != ws[1] && (got.Reason != ReasonHit || got.Worker != w):
					t.Fatalf("%s moved from %v to %v (%s)", k, w, got.Worker, got.Reason)
				}
				moved[k] = got.Worker
			}
			// The engine's return does not move anything back: re-pinned keys stay re-pinned.
			tt.back(set, ws[1])
			for k, w := range moved {
				got, _ := g.Pick(set.Load(), "b", routed(k))
				if got.Worker != w || got.Reason != ReasonHit {
					t.Fatalf("%s moved from %v to %v after the engine returned", k, w, got.Worker)
				}
			}
		})
	}
}

func TestStickyRejectedHitKeepsBindingAndSkipsFallback(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 3)
	set := mustSet(t, ws)
	store := newMemAffinity()
	adm := rejectIDs{}
	g, _ := stickyGroup(store, adm)
	if got, _ := g.Pick(set.Load(), "b", routed("pinned")); got.Worker != ws[0] {
		t.Fatalf("first key went to %v, want w0 (round-robin start)", got.Worker)
	}
	adm[ws[0].ID] = true
	_, err := g.Pick(set.Load(), "b", routed("pinned"))
	var pe *PickError
	if !errors.As(err, &pe) || pe.Outcome != OutcomeAdmissionRejected || pe.Rejections[0].WorkerID != ws[0].ID {
		t.Fatalf("err = %v, want AdmissionRejected on w0", err)
	}
	if b := store.bound(AffinityScope{"llama", "b", StagePlain}, "pinned"); b != ws[0].ID {
		t.Fatalf("binding %q after rejection, want w0", b)
	}
	// The rejection did not consult the fallback: the next new key is w1, the cursor's next.
	if got, _ := g.Pick(set.Load(), "b", routed("other")); got.Worker != ws[1] {
		t.Fatalf("next new key went to %v, want w1", got.Worker)
	}
	delete(adm, ws[0].ID)
	if got, err := g.Pick(set.Load(), "b", routed("pinned")); err != nil || got.Worker != ws[0] || got.Reason != ReasonHit {
		t.Fatalf("after admission recovers: %v (%v)", got, err)
	}
}

func TestStickyFallbackOwnerChecksAdmission(t *testing.T) {
	// The fallback runs with default admission; sticky checks its engine exactly once and
	// binds nothing on rejection.
	ws := testWorkers(t, "llama", StagePlain, "w", 3)
	store := newMemAffinity()
	adm := &countingAdmission{reject: map[string]bool{ws[0].ID: true}}
	p := NewSticky(adm, nil, store, NewRoundRobin(nil, nil))
	req := pickReq(StagePlain)
	req.RoutingKey = "k"
	if _, err := p.Pick(ws, req); !errors.Is(err, ErrAdmissionRejected) || adm.calls != 1 || store.binds != 0 {
		t.Fatalf("err %v, admission calls %d, binds %d", err, adm.calls, store.binds)
	}
	got, err := p.Pick(ws, req)
	if err != nil || got.Worker != ws[1] || got.Reason != ReasonAssigned || adm.calls != 2 {
		t.Fatalf("second pick %v (%v), calls %d", got, err, adm.calls)
	}
}
