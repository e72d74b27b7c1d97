package actors

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/asynkron/protoactor-go/actor"

	"switchyard/actors/clusterpb"
	"switchyard/engine"
)

func newTestNearCache(ttl time.Duration, entries, partitions int) *nearCache {
	set := metrics.NewSet()
	return newNearCache(ttl, entries, partitions, set.NewCounter("hits"), set.NewCounter("invalidations"))
}

func TestNearCache(t *testing.T) {
	const ttl = 30 * time.Second
	scope := engine.AffinityScope{Model: "m", BucketID: "b", Stage: engine.StagePlain}
	decode := engine.AffinityScope{Model: "m", BucketID: "b", Stage: engine.StageDecode}
	h := engine.FNV64(engine.FNVOffset, "k")
	now := affAt(0)

	if newTestNearCache(0, 16, 4) != nil {
		t.Fatal("a near cache with ttl 0 is on; want nil (off)")
	}
	n := newTestNearCache(ttl, 16, 4)
	if _, ok := n.get(1, h, scope, "k", now); ok {
		t.Fatal("empty cache answered")
	}
	g := n.gen(1)
	n.put(1, g, h, scope, "k", "W1", now)
	if w, ok := n.get(1, h, scope, "k", now+int64(ttl)-1); !ok || w != "W1" {
		t.Fatalf("get = %q, %v; want W1 until the ttl is over", w, ok)
	}
	if _, ok := n.get(1, h, scope, "k", now+int64(ttl)); ok {
		t.Fatal("an entry answered at its ttl")
	}
	if _, ok := n.get(1, h, decode, "k", now); ok {
		t.Fatal("another scope's entry answered")
	}
	if _, ok := n.get(1, h, scope, "j", now); ok {
		t.Fatal("another key's entry answered")
	}
	// An invalidation of the partition kills its entries, and only its.
	n.put(2, n.gen(2), engine.FNV64(engine.FNVOffset, "x"), scope, "x", "W2", now)
	n.invalidate(1)
	if _, ok := n.get(1, h, scope, "k", now); ok {
		t.Fatal("an entry answered after its partition was invalidated")
	}
	if w, ok := n.get(2, engine.FNV64(engine.FNVOffset, "x"), scope, "x", now); !ok || w != "W2" {
		t.Fatalf("another partition's entry = %q, %v; want W2", w, ok)
	}
	// An answer read before an invalidation is not kept, whenever it arrives.
	g = n.gen(1)
	n.invalidate(1)
	n.put(1, g, h, scope, "k", "W3", now)
	if _, ok := n.get(1, h, scope, "k", now); ok {
		t.Fatal("an answer read before the invalidation was kept")
	}
	// No binding is not kept; invalidateAll reaches every partition; out of range is ignored.
	n.put(1, n.gen(1), h, scope, "k", "", now)
	if _, ok := n.get(1, h, scope, "k", now); ok {
		t.Fatal("an empty answer was kept")
	}
	n.invalidate(-1)
	n.invalidate(4)
	n.invalidateAll()
	if _, ok := n.get(2, engine.FNV64(engine.FNVOffset, "x"), scope, "x", now); ok {
		t.Fatal("an entry answered after invalidateAll")
	}
	if got := n.hits.Get(); got != 2 {
		t.Fatalf("hits = %d, want 2", got)
	}
}

// The cache is a fixed number of slots whatever the number of keys, and concurrent readers,
// writers and invalidations see only whole entries.
func TestNearCacheBoundedAndConcurrent(t *testing.T) {
	scope := engine.AffinityScope{Model: "m", BucketID: "b"}
	n := newTestNearCache(time.Minute, 100, 8)
	if len(n.slots) != 128 {
		t.Fatalf("slots = %d, want 128 (100 rounded up to a power of two)", len(n.slots))
	}
	now := affAt(0)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				key := fmt.Sprintf("k%d", i)
				h := engine.FNV64(engine.FNVOffset, key)
				p := int(h % 8)
				n.put(p, n.gen(p), h, scope, key, "W"+key, now)
				if w, ok := n.get(p, h, scope, key, now); ok && w != "W"+key {
					t.Errorf("get %s = %q", key, w)
					return
				}
				if i%100 == g {
					n.invalidate(p)
				}
			}
		})
	}
	wg.Wait()
	live := 0
	for i := range n.slots {
		if n.slots[i].Load() != nil {
			live++
		}
	}
	if live > len(n.slots) || live == 0 {
		t.Fatalf("%d entries in %d slots", live, len(n.slots))
	}
}

// The invalidation receiver takes the owners' messages as Proto.Actor hands them over (bare
// or in an envelope) and ignores anything else, a partition out of range included.
func TestNearCacheProcessHandlesHostileMessages(t *testing.T) {
	c := &Cluster{near: newTestNearCache(time.Minute, 16, 4)}
	np := nearCacheProcess{c}
	np.SendUserMessage(nil, &clusterpb.NearCacheInvalidate{Partition: 1})
	np.SendUserMessage(nil, &actor.MessageEnvelope{Message: &clusterpb.NearCacheInvalidate{Partition: 2}})
	for _, m := range []any{nil, "junk", &clusterpb.NearCacheInvalidate{Partition: -5}, &clusterpb.NearCacheInvalidate{Partition: 1 << 30},
		&actor.MessageEnvelope{}, (*actor.MessageEnvelope)(nil), (*clusterpb.NearCacheInvalidate)(nil)} {
		np.SendUserMessage(nil, m)
	}
	np.SendSystemMessage(nil, &actor.Stop{})
	np.Stop(nil)
	if g1, g2, g0 := c.near.gen(1), c.near.gen(2), c.near.gen(0); g1 != 1 || g2 != 1 || g0 != 0 {
		t.Fatalf("generations 0,1,2 = %d,%d,%d; want 0,1,1", g0, g1, g2)
	}
	// Without a near cache (ttl 0) nothing happens.
	nearCacheProcess{&Cluster{}}.SendUserMessage(nil, &clusterpb.NearCacheInvalidate{Partition: 1})
}
