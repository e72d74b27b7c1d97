package actors

import (
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/asynkron/protoactor-go/actor"

	"switchyard/actors/clusterpb"
	"switchyard/engine"
)

// nearCacheName is the process name every replica registers to receive its near cache's
// invalidations from partition owners.
const nearCacheName = "switchyard-near-cache"

// maxReaders bounds the replicas a partition grain remembers as readers of its bindings;
// past it the grain invalidates them all and starts over.
const maxReaders = 1024

// nearCache keeps the bindings this replica read from partitions other replicas own, so that
// a repeat lookup of a key answers without a remote round trip (cluster.near_cache_ttl).
//
// It stays correct by generations: gens[p] counts the reasons to distrust partition p's
// copies, bumped when the owner says one of its bindings this replica read changed or went
// (NearCacheInvalidate), when p's owner changes (topology, suspicion, leave), and when a
// worker is removed. A request reads gens[p] before it asks the owner, and its entry carries
// that value: an entry answers only while gens[p] still equals it, so a change that the
// owner made after answering (its invalidation travels behind the answer) kills the entry
// whatever the order in which the answer and the invalidation are handled. An entry also
// expires ttl after the request that read it: until then the owner's binding cannot expire,
// since ttl is at most half of affinity.idle_timeout.
//
// Slots are a direct-mapped table of immutable entries behind atomic pointers: lookups take
// no lock and allocate nothing; an insertion allocates one entry and may take the slot of
// another key. Safe for concurrent use.
type nearCache struct {
	ttl   int64 // nanoseconds
	gens  []atomic.Uint64
	slots []atomic.Pointer[nearEntry]
	mask  uint64

	hits, invalidations *metrics.Counter
}

// nearEntry is one binding read from an owner; immutable once published.
type nearEntry struct {
	scope       engine.AffinityScope
	key, worker string
	gen         uint64
	expires     int64 // UnixNano
}

// newNearCache returns a cache of at least entries slots (a power of two) over partitions
// partitions, or nil when ttl is not positive (the near cache is off).
func newNearCache(ttl time.Duration, entries, partitions int, hits, invalidations *metrics.Counter) *nearCache {
	if ttl <= 0 || entries <= 0 {
		return nil
	}
	n := 1
	for n < entries {
		n <<= 1
	}
	return &nearCache{ttl: int64(ttl), gens: make([]atomic.Uint64, partitions), slots: make([]atomic.Pointer[nearEntry], n),
		mask: uint64(n - 1), hits: hits, invalidations: invalidations}
}

// slot returns the slot index of scope and key, whose FNV-1a hash is h.
func (n *nearCache) slot(h uint64, scope engine.AffinityScope) uint64 {
	h = engine.FNV64(engine.FNV64(h, scope.Model)^0xff, scope.BucketID)
	h = engine.FNV64(h, stageByte[scope.Stage&3:scope.Stage&3+1])
	return (h ^ h>>29) & n.mask
}

// stageByte gives a stage one byte to hash.
const stageByte = "0123"

// gen returns partition p's generation; read it before asking the owner.
func (n *nearCache) gen(p int) uint64 { return n.gens[p].Load() }

// get returns key's binding in scope as last read from partition p's owner, when it is
// still trusted at now.
func (n *nearCache) get(p int, h uint64, scope engine.AffinityScope, key string, now int64) (string, bool) {
	e := n.slots[n.slot(h, scope)].Load()
	if e == nil || e.key != key || e.scope != scope || e.gen != n.gens[p].Load() || now >= e.expires {
		return "", false
	}
	n.hits.Inc()
	return e.worker, true
}

// put keeps worker as key's binding in scope, read from partition p's owner by a request
// made at now that read generation gen before it asked. An empty worker (no binding) is not
// kept: a new binding is made by a bind, which goes to the owner anyway.
func (n *nearCache) put(p int, gen uint64, h uint64, scope engine.AffinityScope, key, worker string, now int64) {
	if worker == "" || gen != n.gens[p].Load() {
		return
	}
	n.slots[n.slot(h, scope)].Store(&nearEntry{scope: scope, key: key, worker: worker, gen: gen, expires: now + n.ttl})
}

// invalidate forgets every copy of partition p's bindings.
func (n *nearCache) invalidate(p int) {
	if p >= 0 && p < len(n.gens) {
		n.gens[p].Add(1)
	}
}

// invalidateAll forgets every copy (a worker was removed).
func (n *nearCache) invalidateAll() {
	for p := range n.gens {
		n.gens[p].Add(1)
	}
}

// nearCacheProcess receives the owners' NearCacheInvalidate messages. It is a process of the
// actor system, not an actor: Proto.Actor's remote reader hands it each message on its own
// goroutine, in the order the owner sent them, and handling one is an atomic increment, so
// no mailbox is needed (and none can fill up and drop an invalidation).
type nearCacheProcess struct{ c *Cluster }

var _ actor.Process = nearCacheProcess{}

// SendUserMessage implements actor.Process. Anything but an invalidation of a partition in
// range is ignored.
func (np nearCacheProcess) SendUserMessage(_ *actor.PID, message any) {
	if env, ok := message.(*actor.MessageEnvelope); ok && env != nil {
		message = env.Message
	}
	m, ok := message.(*clusterpb.NearCacheInvalidate)
	if !ok || m == nil || np.c.near == nil {
		return
	}
	np.c.near.invalidate(int(m.Partition))
	np.c.near.invalidations.Inc()
}

// SendSystemMessage implements actor.Process: there is nothing to watch or stop.
func (nearCacheProcess) SendSystemMessage(*actor.PID, any) {}

// Stop implements actor.Process.
func (nearCacheProcess) Stop(*actor.PID) {}
