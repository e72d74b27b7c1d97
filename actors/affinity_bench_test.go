package actors

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"switchyard/engine"
)

// affKeys returns n distinct keys.
func affKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("session-%08d", i)
	}
	return keys
}

// Keys cycle through a pool larger than the per-scope bound, so a key comes back only after
// it was evicted: every Bind of the first-bind benchmarks is a first assignment (plus one
// eviction, the steady state of a full scope).
const (
	benchKeyPool     = 1 << 16
	benchMaxBindings = 4096
)

// BenchmarkAffinityLookupBound measures the lookup of a bound key: directly on a scope's
// table (the baseline without an actor), and as a round trip to the scope actor, serial and
// from parallel callers contending for one scope.
func BenchmarkAffinityLookupBound(b *testing.B) {
	now := affT0
	b.Run("table-direct", func(b *testing.B) {
		tab, _ := newTestTable(time.Hour, benchMaxBindings)
		tab.bind("k", "", "W1", now.UnixNano())
		b.ReportAllocs()
		for b.Loop() {
			if tab.lookup("k", now.UnixNano()) != "W1" {
				b.Fatal("miss")
			}
		}
	})
	b.Run("actor/serial", func(b *testing.B) {
		s, _, _ := newAffStore(b, AffinityOptions{})
		mustBind(b, s, affScope, "k", "", "W1", now)
		b.ReportAllocs()
		for b.Loop() {
			if w, err := s.Lookup(affScope, "k", now); err != nil || w != "W1" {
				b.Fatal(w, err)
			}
		}
	})
	b.Run("actor/parallel", func(b *testing.B) {
		s, _, _ := newAffStore(b, AffinityOptions{})
		mustBind(b, s, affScope, "k", "", "W1", now)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if w, err := s.Lookup(affScope, "k", now); err != nil || w != "W1" {
					b.Error(w, err)
					return
				}
			}
		})
	})
}

// BenchmarkAffinityFirstBind measures a first assignment (Bind with expect "") of a new key,
// directly on a table and through the scope actor, serial and under parallel load on one
// scope.
func BenchmarkAffinityFirstBind(b *testing.B) {
	now := affT0
	keys := affKeys(benchKeyPool)
	b.Run("table-direct", func(b *testing.B) {
		tab, _ := newTestTable(time.Hour, benchMaxBindings)
		i := 0
		b.ReportAllocs()
		for b.Loop() {
			if _, set := tab.bind(keys[i%benchKeyPool], "", "W1", now.UnixNano()); !set {
				b.Fatal("not a first bind")
			}
			i++
		}
	})
	b.Run("actor/serial", func(b *testing.B) {
		s, _, _ := newAffStore(b, AffinityOptions{MaxBindings: benchMaxBindings})
		i := 0
		b.ReportAllocs()
		for b.Loop() {
			if _, set, err := s.Bind(affScope, keys[i%benchKeyPool], "", "W1", now); err != nil || !set {
				b.Fatal(set, err)
			}
			i++
		}
	})
	b.Run("actor/parallel", func(b *testing.B) {
		s, _, _ := newAffStore(b, AffinityOptions{MaxBindings: benchMaxBindings})
		var next atomic.Uint64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				k := keys[next.Add(1)%benchKeyPool]
				if _, set, err := s.Bind(affScope, k, "", "W1", now); err != nil || !set {
					b.Error(set, err)
					return
				}
			}
		})
	})
}

// BenchmarkSessionAwarePick measures whole session_aware picks calling the store from the
// picking goroutine (as a group actor does): a bound session (lookup + admission), and a new
// session (lookup miss + power_of_two + compare-and-set bind). Parallel runs give each
// goroutine its own policy instance (one per group actor or replica) sharing one scope.
func BenchmarkSessionAwarePick(b *testing.B) {
	keys := affKeys(benchKeyPool)
	for _, n := range []int{8, 64} {
		ws := workers("w", n, engine.StagePlain)
		adm := engine.AdmissionLimits{MaxInFlight: 1 << 40}
		newReq := func(key string) *engine.PickRequest {
			return &engine.PickRequest{
				BucketRequest: &engine.BucketRequest{Model: testModel, InputTokens: 100, ExpectedPeak: -1, Now: affT0, SessionKey: key},
				Stage:         engine.StagePlain, BucketID: "b",
			}
		}
		b.Run(fmt.Sprintf("bound/serial/engines=%d", n), func(b *testing.B) {
			s, _, _ := newAffStore(b, AffinityOptions{})
			p := engine.NewSessionAware(adm, nil, s, rand.New(rand.NewPCG(1, 1)))
			req := newReq("chat")
			if _, err := p.Pick(ws, req); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if pk, err := p.Pick(ws, req); err != nil || pk.Reason != engine.ReasonSessionPrimary {
					b.Fatal(pk, err)
				}
			}
		})
		b.Run(fmt.Sprintf("bound/parallel/engines=%d", n), func(b *testing.B) {
			s, _, _ := newAffStore(b, AffinityOptions{})
			var seed atomic.Uint64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				id := seed.Add(1)
				p := engine.NewSessionAware(adm, nil, s, rand.New(rand.NewPCG(id, id)))
				req := newReq(fmt.Sprintf("chat-%d", id))
				for pb.Next() {
					if _, err := p.Pick(ws, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
		b.Run(fmt.Sprintf("first/serial/engines=%d", n), func(b *testing.B) {
			s, _, _ := newAffStore(b, AffinityOptions{MaxBindings: benchMaxBindings})
			p := engine.NewSessionAware(adm, nil, s, rand.New(rand.NewPCG(1, 1)))
			reqs := make([]*engine.PickRequest, benchKeyPool)
			for i := range reqs {
				reqs[i] = newReq(keys[i])
			}
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				if pk, err := p.Pick(ws, reqs[i%benchKeyPool]); err != nil || pk.Reason != engine.ReasonAssigned {
					b.Fatal(pk, err)
				}
				i++
			}
		})
		b.Run(fmt.Sprintf("first/parallel/engines=%d", n), func(b *testing.B) {
			s, _, _ := newAffStore(b, AffinityOptions{MaxBindings: benchMaxBindings})
			reqs := make([]*engine.PickRequest, benchKeyPool)
			for i := range reqs {
				reqs[i] = newReq(keys[i])
			}
			var next, seed atomic.Uint64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				id := seed.Add(1)
				p := engine.NewSessionAware(adm, nil, s, rand.New(rand.NewPCG(id, id)))
				for pb.Next() {
					if _, err := p.Pick(ws, reqs[next.Add(1)%benchKeyPool]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
