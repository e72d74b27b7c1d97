package httpfront

import (
	"sync"
	"time"
)

// BreakerState is a circuit breaker's state; its numeric value is exported as the
// switchyard_worker_breaker_state gauge.
type BreakerState int

// Breaker states.
const (
	BreakerClosed   BreakerState = 0
	BreakerOpen     BreakerState = 1
	BreakerHalfOpen BreakerState = 2
)

func (s BreakerState) String() string {
	switch s {
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half_open"
	}
	return "closed"
}

// breaker is one worker's circuit breaker over dispatch outcomes: it opens after threshold
// consecutive failures; after cooldown the owner moves it to half-open, where the next
// dispatch is the probe: a success closes it, a failure opens it again for another cooldown.
// It is safe for concurrent use.
type breaker struct {
	mu        sync.Mutex
	state     BreakerState
	failures  int
	openedAt  time.Time
	threshold int
	cooldown  time.Duration
}

func newBreaker(threshold int, cooldown time.Duration) *breaker {
	return &breaker{threshold: max(threshold, 1), cooldown: cooldown}
}

// State returns the current state.
func (b *breaker) State() BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// success records a successful dispatch and reports whether the state changed.
func (b *breaker) success() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures = 0
	if b.state == BreakerClosed {
		return false
	}
	b.state = BreakerClosed
	return true
}

// failure records a failed dispatch at now and reports whether the breaker opened.
func (b *breaker) failure(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures++
	if b.state == BreakerOpen {
		return false
	}
	if b.state == BreakerHalfOpen || b.failures >= b.threshold {
		b.state = BreakerOpen
		b.openedAt = now
		return true
	}
	return false
}

// probe moves an open breaker whose cooldown has passed at now to half-open and reports
// whether it did.
func (b *breaker) probe(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state != BreakerOpen || now.Sub(b.openedAt) < b.cooldown {
		return false
	}
	b.state = BreakerHalfOpen
	return true
}
