package flow

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Sentinel reasons a Limiter refuses or ends a wait; a *LimitError unwraps to one of them.
var (
	// ErrQueueFull: the limit is reached and the queue is full.
	ErrQueueFull = errors.New("queue full")
	// ErrQueueTimeout: the request waited in the queue until its deadline.
	ErrQueueTimeout = errors.New("queue timeout")
	// ErrClientGone: the client left while the request waited.
	ErrClientGone = errors.New("client gone")
	// ErrStopped: the router stopped while the request waited.
	ErrStopped = errors.New("stopped")
)

// LimitError is a refusal by one Limiter. Each Limiter keeps one value per reason, so a
// refusal allocates nothing; do not modify it.
type LimitError struct {
	// Scope names the limit: "router" or "model <name>".
	Scope string
	Err   error
}

func (e *LimitError) Error() string { return e.Scope + ": " + e.Err.Error() }

// Unwrap returns the reason.
func (e *LimitError) Unwrap() error { return e.Err }

// Cancel holds what ends a queued request's wait early.
type Cancel struct {
	// Client, when set, tells when the request's client leaves. It is asked only when the
	// request starts to wait, so the fast path costs nothing.
	Client Watcher
	// Stop is closed when the router stops serving; nil never fires.
	Stop <-chan struct{}
}

// Watcher tells when a waiting request's client has left.
type Watcher interface {
	// Watch starts watching: gone is closed when the client has left. A Limiter calls stop
	// once when the wait ends, before Acquire returns; stop must end the watch and release
	// what it holds.
	Watch() (gone <-chan struct{}, stop func())
}

// Limiter is one concurrency limit with a bounded queue ordered by priority and tenant.
type Limiter struct {
	scope   string
	limit   int64
	size    int
	timeout time.Duration

	active  atomic.Int64 // slots held
	waiting atomic.Int64 // requests past the fast path that may queue: taken under mu
	queued  atomic.Int64 // q.n, stored under mu: read without it to refuse when the queue is full
	mu      sync.Mutex
	q       classQueue

	full, timedOut, gone, stopped *LimitError
	obs                           Observer
}

// Observer receives a Limiter's slow-path events: a request queued, and a queued request
// leaving the queue after waiting wait (err nil when it got its slot), or refused at once
// with ErrQueueFull (wait 0). Calls come from the requests' goroutines, outside the
// Limiter's lock; an Observer must be safe for concurrent use and must not block.
type Observer interface {
	Queued(l *Limiter)
	Dequeued(l *Limiter, wait time.Duration, err error)
}

// NewLimiter returns a limit of limit concurrent requests (at least 1) whose queue holds up
// to size requests (0: none wait) for up to timeout each; scope names it in errors and
// metrics. obs may be nil.
func NewLimiter(scope string, limit, size int, timeout time.Duration, obs Observer) *Limiter {
	l := &Limiter{scope: scope, limit: int64(max(limit, 1)), size: max(size, 0), timeout: timeout, obs: obs}
	l.full = &LimitError{Scope: scope, Err: ErrQueueFull}
	l.timedOut = &LimitError{Scope: scope, Err: ErrQueueTimeout}
	l.gone = &LimitError{Scope: scope, Err: ErrClientGone}
	l.stopped = &LimitError{Scope: scope, Err: ErrStopped}
	return l
}

// Scope names the limit.
func (l *Limiter) Scope() string { return l.scope }

// Limit is the number of concurrent requests allowed.
func (l *Limiter) Limit() int { return int(l.limit) }

// Active is the number of slots held.
func (l *Limiter) Active() int { return int(l.active.Load()) }

// Queued is the number of requests waiting in the queue.
func (l *Limiter) Queued() int { return int(l.queued.Load()) }

// Acquire takes a slot for a request of class cls. Under the limit with nobody waiting it
// returns at once (fast path: one compare-and-swap; cls is not looked at). Otherwise the
// request queues, unless the queue is full, and waits until a Release hands it a slot, until
// arrived plus the Limiter's timeout, or until c fires; Release serves the highest priority
// first and, within a priority, tenants by weighted fair sharing (see classQueue). arrived
// is when the request reached the router, on the wall clock. A nil error means the caller
// holds a slot and must Release it once.
func (l *Limiter) Acquire(arrived time.Time, cls Class, c Cancel) error {
	_, _, err := l.acquire(arrived, cls, c)
	return err
}

// acquire is Acquire that also tells whether the request queued and how long it waited.
func (l *Limiter) acquire(arrived time.Time, cls Class, c Cancel) (queued bool, wait time.Duration, err error) {
	if l.waiting.Load() == 0 && l.tryAcquire() {
		return false, 0, nil
	}
	if l.size == 0 || l.queued.Load() >= int64(l.size) {
		// Refused without the lock when the request could not wait anyway: there is no
		// queue (a free slot is taken, nobody waits for one), or the queue is full (then
		// nobody may take a free slot ahead of it; the request would be refused under the
		// lock as it is here).
		if l.size == 0 && l.tryAcquire() {
			return false, 0, nil
		}
		if l.obs != nil {
			l.obs.Dequeued(l, 0, l.full)
		}
		return false, 0, l.full
	}
	return l.wait(arrived, cls, c)
}

// tryAcquire takes a slot if one is free.
func (l *Limiter) tryAcquire() bool {
	for {
		n := l.active.Load()
		if n >= l.limit {
			return false
		}
		if l.active.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// wait is Acquire's slow path.
//
// A request counts itself in waiting before it looks for a free slot under the lock, and
// Release frees its slot before it looks at waiting; so either this request sees the freed
// slot, or that Release sees this request and hands it the slot under the lock. Requests
// already queued go first: a free slot is taken here only when the queue is empty.
func (l *Limiter) wait(arrived time.Time, cls Class, c Cancel) (bool, time.Duration, error) {
	l.mu.Lock()
	l.waiting.Add(1)
	if l.q.n == 0 && l.tryAcquire() {
		l.waiting.Add(-1)
		l.mu.Unlock()
		return false, 0, nil
	}
	if l.q.n >= l.size {
		l.waiting.Add(-1)
		l.mu.Unlock()
		if l.obs != nil {
			l.obs.Dequeued(l, 0, l.full)
		}
		return false, 0, l.full
	}
	w := &waiter{ready: make(chan struct{}, 1)}
	l.q.push(w, cls)
	l.queued.Store(int64(l.q.n))
	l.mu.Unlock()
	if l.obs != nil {
		l.obs.Queued(l)
	}
	queued := time.Now()

	timer := time.NewTimer(time.Until(arrived.Add(l.timeout)))
	var gone <-chan struct{}
	if c.Client != nil {
		var stop func()
		gone, stop = c.Client.Watch()
		defer stop()
	}
	defer timer.Stop()
	var err *LimitError
	select {
	case <-w.ready:
	case <-timer.C:
		err = l.timedOut
	case <-gone:
		err = l.gone
	case <-c.Stop:
		err = l.stopped
	}
	if err != nil {
		l.mu.Lock()
		removed := l.q.remove(w)
		if removed {
			l.waiting.Add(-1)
			l.queued.Store(int64(l.q.n))
		}
		l.mu.Unlock()
		if !removed {
			// A Release handed this request its slot as the wait ended. At its deadline
			// it takes the slot after all; a client that left or a router that stops
			// passes it on.
			if err == l.timedOut {
				err = nil
			} else {
				l.Release()
			}
		}
	}
	waited := time.Since(queued)
	if l.obs != nil {
		l.obs.Dequeued(l, waited, errOrNil(err))
	}
	return true, waited, errOrNil(err)
}

// errOrNil keeps a nil *LimitError a nil error.
func errOrNil(e *LimitError) error {
	if e == nil {
		return nil
	}
	return e
}

// Release gives back a slot taken by Acquire, handing it to the next waiter (classQueue.pop) when
// someone waits.
func (l *Limiter) Release() {
	if n := l.active.Add(-1); n < 0 {
		panic("BUG: flow: Release without Acquire on " + l.scope)
	}
	if l.waiting.Load() > 0 {
		// Slow path: hand free slots to the queue, in order.
		l.mu.Lock()
		for l.q.n > 0 && l.tryAcquire() {
			w := l.q.pop()
			l.waiting.Add(-1)
			w.ready <- struct{}{}
		}
		l.queued.Store(int64(l.q.n))
		l.mu.Unlock()
	}
}

// waiter is one queued request.
type waiter struct {
	prev, next *waiter
	queued     bool
	// ready receives once when the waiter is handed a slot (capacity 1: never blocks).
	ready chan struct{}
	// Where the waiter is queued, and its fair-queueing tags (see classQueue).
	lvl      *level
	ten      *tenantQueue
	tag, seq uint64
}

// fifo is one tenant's queue at one priority: an intrusive doubly linked list in arrival
// order, so that a request that leaves is taken out in constant time. It is guarded by the
// Limiter's mutex.
type fifo struct {
	head, tail *waiter
	n          int
}

func (q *fifo) push(w *waiter) {
	w.prev, w.next, w.queued = q.tail, nil, true
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
	q.n++
}

// remove takes w out and reports whether it was queued.
func (q *fifo) remove(w *waiter) bool {
	if !w.queued {
		return false
	}
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.prev, w.next, w.queued = nil, nil, false
	q.n--
	return true
}
