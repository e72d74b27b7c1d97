package engine

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"switchyard/load"
)

// hashKeyed sets a consistent_hash key on every request.
type hashKeyed struct {
	Policy
	key string
}

func (k hashKeyed) Pick(c []*Worker, req *PickRequest) (Pick, error) {
	br := *req.BucketRequest
	br.HashKey = k.key
	pr := *req
	pr.BucketRequest = &br
	return k.Policy.Pick(c, &pr)
}

// tokensKeyed sets token IDs on every request.
type tokensKeyed struct {
	Policy
	ids []uint32
}

func (k tokensKeyed) Pick(c []*Worker, req *PickRequest) (Pick, error) {
	br := *req.BucketRequest
	br.TokenIDs = k.ids
	pr := *req
	pr.BucketRequest = &br
	return k.Policy.Pick(c, &pr)
}

func hashReq(key string) *PickRequest {
	r := pickReq(StagePlain)
	r.HashKey = key
	return r
}

// assign places every key on the candidates with a fresh policy (no in-flight anywhere).
func assign(t *testing.T, c []*Worker, keys int) map[string]*Worker {
	t.Helper()
	p := NewConsistentHash(nil, nil, 160, 1.25)
	out := make(map[string]*Worker, keys)
	for i := range keys {
		k := fmt.Sprintf("session-%d", i)
		got, err := p.Pick(c, hashReq(k))
		if err != nil {
			t.Fatal(err)
		}
		if got.Reason != ReasonHashHome {
			t.Fatalf("key %s: reason %s without any load", k, got.Reason)
		}
		out[k] = got.Worker
	}
	return out
}

func TestConsistentHashReplicasAgree(t *testing.T) {
	// Two replicas (two policy instances, two sets of *Worker values with the same IDs)
	// place every key on the same engine ID.
	a := testWorkers(t, "llama", StagePlain, "w", 7)
	b := testWorkers(t, "llama", StagePlain, "w", 7)
	pa, pb := assign(t, a, 2000), assign(t, b, 2000)
	for k, w := range pa {
		if pb[k].ID != w.ID {
			t.Fatalf("key %s: replica a picks %s, replica b %s", k, w.ID, pb[k].ID)
		}
	}
}

func TestConsistentHashMovesOnlyTheChangedEnginesShare(t *testing.T) {
	const keys = 20000
	all := testWorkers(t, "llama", StagePlain, "w", 11)
	ten, eleven := all[:10], all
	before := assign(t, ten, keys)
	counts := map[string]int{}
	for _, w := range before {
		counts[w.ID]++
	}
	for _, w := range ten {
		// 160 points per engine keep every share within 25% of the average.
		if share := float64(counts[w.ID]) / (keys / 10); share < 0.75 || share > 1.25 {
			t.Errorf("engine %s holds %.2f of the average share", w.ID, share)
		}
	}
	t.Run("adding an engine", func(t *testing.T) {
		after := assign(t, eleven, keys)
		moved := 0
		for k, w := range after {
			if w != before[k] {
				moved++
				if w != all[10] {
					t.Fatalf("key %s moved from %s to %s, not to the new engine", k, before[k], w)
				}
			}
		}
		// The new engine takes about 1/11 of the keys, and nothing else moves.
		frac, ideal := float64(moved)/keys, 1.0/11
		t.Logf("adding 1 engine to 10 moved %.4f of the keys (ideal %.4f)", frac, ideal)
		if math.Abs(frac-ideal) > 0.25*ideal {
			t.Fatalf("moved %.4f of the keys, want %.4f ± 25%%", frac, ideal)
		}
	})
	t.Run("removing an engine", func(t *testing.T) {
		gone := ten[3]
		rest := append(append([]*Worker{}, ten[:3]...), ten[4:]...)
		after := assign(t, rest, keys)
		moved := 0
		for k, w := range after {
			if w != before[k] {
				moved++
				if before[k] != gone {
					t.Fatalf("key %s moved from %s, which is still there", k, before[k])
				}
			}
		}
		if moved != counts[gone.ID] {
			t.Fatalf("%d keys moved, the removed engine held %d", moved, counts[gone.ID])
		}
		t.Logf("removing 1 engine of 10 moved %.4f of the keys (ideal 0.1)", float64(moved)/keys)
	})
}

func TestConsistentHashBoundedLoad(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 4)
	p := NewConsistentHash(nil, nil, 160, 1.25)
	home, err := p.Pick(ws, hashReq("hot"))
	if err != nil || home.Reason != ReasonHashHome {
		t.Fatalf("first pick %+v %v", home, err)
	}
	// One hot key: every request holds its engine. No engine may pass
	// ceil(1.25 × (total+1) / 4) when it is chosen, so the key spills over in ring order.
	tr := load.NewTracker()
	var guards []*load.Guard
	spilled := 0
	for i := range 40 {
		got, err := p.Pick(ws, hashReq("hot"))
		if err != nil {
			t.Fatal(err)
		}
		var total int64
		for _, w := range ws {
			total += w.Counters.InFlight()
		}
		bound := int64(math.Ceil(1.25 * float64(total+1) / 4))
		if got.Worker.Counters.InFlight()+1 > bound {
			t.Fatalf("pick %d: %s at %d in flight passes the bound %d", i, got.Worker, got.Worker.Counters.InFlight(), bound)
		}
		if got.Worker != home.Worker {
			spilled++
			if got.Reason != ReasonHashBounded {
				t.Fatalf("pick %d spilled to %s with reason %s", i, got.Worker, got.Reason)
			}
		}
		guards = append(guards, tr.Acquire(got.Worker.Counters, t0))
	}
	if spilled == 0 || home.Worker.Counters.InFlight() < 10 {
		t.Fatalf("spilled %d, home holds %d", spilled, home.Worker.Counters.InFlight())
	}
	// Once the home engine is idle again, the key goes home.
	for _, g := range guards {
		g.Release()
	}
	if got, _ := p.Pick(ws, hashReq("hot")); got.Worker != home.Worker || got.Reason != ReasonHashHome {
		t.Fatalf("after the load left: %+v", got)
	}
}

func TestConsistentHashWithoutKey(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 3)
	tr := load.NewTracker()
	inflight(t, tr, ws[0], 2)
	inflight(t, tr, ws[2], 1)
	got, err := NewConsistentHash(nil, nil, 160, 1.25).Pick(ws, pickReq(StagePlain))
	if err != nil || got.Worker != ws[1] || got.Reason != ReasonNoHashKey {
		t.Fatalf("got %+v %v, want %s (least in flight)", got, err, ws[1])
	}
}

func TestConsistentHashAdmissionKeepsKeyHome(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 3)
	home, _ := NewConsistentHash(nil, nil, 160, 1.25).Pick(ws, hashReq("k"))
	adm := &countingAdmission{reject: map[string]bool{home.Worker.ID: true}}
	_, err := NewConsistentHash(adm, nil, 160, 1.25).Pick(ws, hashReq("k"))
	if !errors.Is(err, ErrAdmissionRejected) || adm.calls != 1 {
		t.Fatalf("err %v calls %d: a rejected home engine is AdmissionRejected", err, adm.calls)
	}
}

func TestPrefixHash(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 8)
	p := NewPrefixHash(nil, nil, 4, 160, 1.25)
	req := func(ids ...uint32) *PickRequest {
		r := pickReq(StagePlain)
		r.TokenIDs = ids
		return r
	}
	a, _ := p.Pick(ws, req(1, 2, 3, 4, 100, 101))
	b, _ := p.Pick(ws, req(1, 2, 3, 4, 900))
	if a.Worker != b.Worker || a.Reason != ReasonHashHome {
		t.Fatalf("same first 4 tokens: %+v and %+v", a, b)
	}
	// Different prefixes spread over the engines.
	seen := map[*Worker]bool{}
	for i := range uint32(200) {
		got, _ := p.Pick(ws, req(i, i+1, i+2, i+3))
		seen[got.Worker] = true
	}
	if len(seen) != len(ws) {
		t.Fatalf("200 prefixes reached %d of %d engines", len(seen), len(ws))
	}
	// A fresh instance (another replica) agrees.
	if c, _ := NewPrefixHash(nil, nil, 4, 160, 1.25).Pick(testWorkers(t, "llama", StagePlain, "w", 8), req(1, 2, 3, 4)); c.Worker.ID != a.Worker.ID {
		t.Fatalf("another replica picks %s, not %s", c.Worker, a.Worker)
	}
	// Without token IDs: the least in-flight engine.
	if got, _ := p.Pick(ws, req()); got.Reason != ReasonNoTokenIDs || got.Worker != ws[0] {
		t.Fatalf("untokenized: %+v", got)
	}
}
