package actors

import "time"

// bindingTable is one affinity scope's bindings: key → worker ID with the time of last use,
// kept in least-recently-used order (an intrusive doubly linked list) and bounded. It is
// owned by one goroutine — its scope actor — and takes no locks.
//
// A binding is live while now - lastUse < idle. An expired binding reads as absent: lookups
// and binds drop it on sight, and sweep drops the rest. Times come from the callers
// (requests carry their own observation time); lastUse never moves backwards, so the list
// stays ordered by last use up to the skew between concurrent requests' clocks, which sweep
// tolerates (it stops at the first live entry from the cold end; lookups check every entry
// they return).
type bindingTable struct {
	idle int64 // idle timeout in nanoseconds
	max  int   // bound on len(byKey)

	byKey map[string]*binding
	// head is the most recently used binding, tail the least.
	head, tail *binding
	// free recycles removed entries so that a steady stream of first binds does not allocate.
	free  *binding
	nfree int

	stats *scopeStats

	// watch is how recently (nanoseconds) another replica must have read a binding for its
	// change or removal to call onRemoteChange: a partition grain of a cluster tells the
	// replicas that keep copies (their near cache, cluster.near_cache_ttl). 0: not watched.
	watch          int64
	onRemoteChange func()
}

// binding is one key's entry.
type binding struct {
	key, worker string
	lastUse     int64 // UnixNano
	// remoteRead is when another replica last read the binding (UnixNano; 0 never).
	remoteRead int64
	prev, next *binding
}

// maxFree bounds the recycled entries kept per scope.
const maxFree = 1024

func newBindingTable(idle time.Duration, maxBindings int, stats *scopeStats) *bindingTable {
	return &bindingTable{
		idle:  int64(idle),
		max:   max(maxBindings, 1),
		byKey: make(map[string]*binding),
		stats: stats,
	}
}

// len returns the number of bindings held, live or not yet swept.
func (t *bindingTable) len() int { return len(t.byKey) }

// live returns key's entry when it is live at now; an expired entry is removed.
func (t *bindingTable) live(key string, now int64) *binding {
	b := t.byKey[key]
	if b == nil {
		return nil
	}
	if now-b.lastUse >= t.idle {
		t.remove(b)
		t.stats.expired.Inc()
		return nil
	}
	return b
}

// lookup returns key's live binding, or "", and refreshes it as used at now.
func (t *bindingTable) lookup(key string, now int64) string {
	b := t.live(key, now)
	if b == nil {
		t.stats.misses.Inc()
		return ""
	}
	t.stats.hits.Inc()
	t.touch(b, now)
	return b.worker
}

// bind is the compare-and-set of engine.AffinityStore.Bind: when key's live binding is
// expect ("" for none) it becomes worker and (worker, true) is returned; otherwise nothing
// changes and the live binding ("" for none) is returned with false (and refreshed: the
// caller adopts it).
func (t *bindingTable) bind(key, expect, worker string, now int64) (string, bool) {
	b := t.live(key, now)
	cur := ""
	if b != nil {
		cur = b.worker
	}
	if cur != expect {
		t.stats.conflicts.Inc()
		if b != nil {
			t.touch(b, now)
		}
		return cur, false
	}
	t.stats.binds.Inc()
	if b != nil {
		if b.worker != worker {
			t.changed(b, now)
		}
		b.worker = worker
		t.touch(b, now)
		return worker, true
	}
	if len(t.byKey) >= t.max {
		t.evictOldest(now)
	}
	b = t.alloc()
	b.key, b.worker, b.lastUse = key, worker, now
	t.byKey[key] = b
	t.pushFront(b)
	t.stats.bindings.Add(1)
	return worker, true
}

// invalidate removes every binding to worker and returns how many there were.
func (t *bindingTable) invalidate(worker string) int {
	n := 0
	for b := t.head; b != nil; {
		next := b.next
		if b.worker == worker {
			t.changed(b, 0)
			t.remove(b)
			n++
		}
		b = next
	}
	t.stats.invalidated.Add(n)
	return n
}

// sweep removes the bindings expired at now, from the least recently used end, and returns
// how many it removed.
func (t *bindingTable) sweep(now int64) int {
	n := 0
	for b := t.tail; b != nil && now-b.lastUse >= t.idle; b = t.tail {
		t.remove(b)
		n++
	}
	t.stats.expired.Add(n)
	return n
}

// clear drops every binding (the actor stopped or restarts).
func (t *bindingTable) clear() {
	t.stats.bindings.Add(-int64(len(t.byKey)))
	clear(t.byKey)
	t.head, t.tail, t.free, t.nfree = nil, nil, nil, 0
}

// evictOldest makes room for one binding: the least recently used one goes, counted as
// expired when it was, else as evicted.
func (t *bindingTable) evictOldest(now int64) {
	b := t.tail
	if b == nil {
		return
	}
	if now-b.lastUse >= t.idle {
		t.stats.expired.Inc()
	} else {
		t.stats.evicted.Inc()
		t.changed(b, now)
	}
	t.remove(b)
}

// readRemotely records that another replica read key's binding at now (it may keep a copy).
func (t *bindingTable) readRemotely(key string, now int64) {
	if b := t.byKey[key]; b != nil && now > b.remoteRead {
		b.remoteRead = now
	}
}

// changed reports the change or removal of b at now (0: whenever it was read) to
// onRemoteChange when another replica read b within watch. An expired binding needs no
// report: a copy lives at most half the idle timeout.
func (t *bindingTable) changed(b *binding, now int64) {
	if t.onRemoteChange == nil || b.remoteRead == 0 || (now != 0 && now-b.remoteRead >= t.watch) {
		return
	}
	t.onRemoteChange()
}

func (t *bindingTable) touch(b *binding, now int64) {
	if now > b.lastUse {
		b.lastUse = now
	}
	if t.head == b {
		return
	}
	t.unlink(b)
	t.pushFront(b)
}

func (t *bindingTable) remove(b *binding) {
	delete(t.byKey, b.key)
	t.unlink(b)
	t.stats.bindings.Add(-1)
	*b = binding{}
	if t.nfree < maxFree {
		b.next = t.free
		t.free = b
		t.nfree++
	}
}

func (t *bindingTable) alloc() *binding {
	b := t.free
	if b == nil {
		return new(binding)
	}
	t.free = b.next
	t.nfree--
	b.next = nil
	return b
}

func (t *bindingTable) pushFront(b *binding) {
	b.prev, b.next = nil, t.head
	if t.head != nil {
		t.head.prev = b
	}
	t.head = b
	if t.tail == nil {
		t.tail = b
	}
}

func (t *bindingTable) unlink(b *binding) {
	if b.prev != nil {
		b.prev.next = b.next
	} else if t.head == b {
		t.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else if t.tail == b {
		t.tail = b.prev
	}
	b.prev, b.next = nil, nil
}
