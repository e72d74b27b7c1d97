package flow

import (
	"slices"
	"strconv"
)

// Class is what a Limiter's queue orders a waiting request by: its priority and its tenant.
type Class struct {
	// Priority: a higher priority is served first; 0 is the default.
	Priority int
	// Tenant names whose fair share the request counts against (a tenant header's value, or
	// the API key); nil is one shared tenant. It may alias the caller's buffers: the Limiter
	// copies it only when the request queues.
	Tenant []byte
	// Keyed reports that Tenant is an API key: it weighs 1 and is labelled "other" in
	// metrics, whatever server.tenant_weights names.
	Keyed bool
	// Weight is the tenant's share within its priority, relative to the other tenants
	// waiting there; below 1 counts as 1. Gate.Admit sets it.
	Weight int
}

// tagScale is the virtual time one request of a weight-1 tenant costs.
const tagScale = 1 << 20

// classQueue is a Limiter's queue: one level per priority (the highest non-empty level is
// served first), and within a level one FIFO per tenant served by start-time fair queueing.
// A request that queues is tagged with the later of the level's virtual time and its
// tenant's last finish tag; its tenant's finish tag then advances by tagScale / weight.
// Pop serves the smallest tag (then the earliest arrival) and moves the level's virtual time
// to it. So a tenant with a thousand requests queued gets its weighted share of the slots
// and no more: a tenant that arrives later is served after at most about weight-ratio
// requests of the others, not after the whole backlog. Levels and tenants exist only while
// they have waiters, so the queue's memory is bounded by its size.
//
// It is guarded by the Limiter's mutex.
type classQueue struct {
	levels []*level // non-empty, highest priority first
	n      int
	seq    uint64
}

// level is one priority's waiters.
type level struct {
	prio    int
	vtime   uint64
	n       int
	tenants map[string]*tenantQueue
}

// tenantQueue is one tenant's waiters at one priority.
type tenantQueue struct {
	fifo
	name   string
	finish uint64
}

func (q *classQueue) push(w *waiter, cls Class) {
	i, found := slices.BinarySearchFunc(q.levels, cls.Priority, func(l *level, p int) int {
		switch {
		case l.prio > p:
			return -1
		case l.prio < p:
			return 1
		}
		return 0
	})
	if !found {
		q.levels = slices.Insert(q.levels, i, &level{prio: cls.Priority, tenants: make(map[string]*tenantQueue, 1)})
	}
	lv := q.levels[i]
	t := lv.tenants[string(cls.Tenant)]
	if t == nil {
		t = &tenantQueue{name: string(cls.Tenant)}
		lv.tenants[t.name] = t
	}
	start := max(lv.vtime, t.finish)
	t.finish = start + tagScale/uint64(max(cls.Weight, 1))
	q.seq++
	w.lvl, w.ten, w.tag, w.seq = lv, t, start, q.seq
	t.push(w)
	lv.n++
	q.n++
}

// pop takes the next waiter to serve; the queue must not be empty.
func (q *classQueue) pop() *waiter {
	lv := q.levels[0]
	var best *waiter
	for _, t := range lv.tenants {
		h := t.head
		if best == nil || h.tag < best.tag || h.tag == best.tag && h.seq < best.seq {
			best = h
		}
	}
	lv.vtime = best.tag
	q.remove(best)
	return best
}

// remove takes w out and reports whether it was queued.
func (q *classQueue) remove(w *waiter) bool {
	if !w.queued {
		return false
	}
	lv, t := w.lvl, w.ten
	t.remove(w)
	lv.n--
	q.n--
	if t.n == 0 {
		delete(lv.tenants, t.name)
	}
	if lv.n == 0 {
		q.levels = slices.DeleteFunc(q.levels, func(l *level) bool { return l == lv })
	}
	return true
}

// PriorityLabel is a priority as a metric label value.
func PriorityLabel(p int) string { return strconv.Itoa(p) }
