package retry

import (
	"sync/atomic"
	"time"

	"switchyard/config"
)

// Layout of a budget counter: the slot's epoch (its window slot number, modulo 2^24) in the
// upper bits, the count in the lower 40.
const (
	numSlots  = 10
	countBits = 40
	countMask = 1<<countBits - 1
	epochMask = 1<<(64-countBits) - 1
)

// Budget bounds the retries of all requests together over a sliding window: a retry is
// allowed while the window's retries are fewer than ratio × the window's requests plus the
// minimum allowance (min_retries_per_second × window). The window is numSlots slots; each
// slot's counters restart when time reaches the slot again. Concurrent retries decided at the
// same instant may each see the last unit of allowance, so the bound holds to within the
// number of such retries. Safe for concurrent use; no mutex.
type Budget struct {
	ratio     float64
	allowance float64
	slotNanos int64
	slots     [numSlots]budgetSlot
	refused   atomic.Uint64
}

// budgetSlot is one slot's counters, on a cache line of its own.
type budgetSlot struct {
	requests atomic.Uint64
	retries  atomic.Uint64
	_        [48]byte
}

// NewBudget returns the budget of cfg (window at least 100ms, ratio and minimum at least 0;
// config.Validate checks them).
func NewBudget(cfg config.RetryBudget) *Budget {
	window := max(cfg.Window, 100*time.Millisecond)
	return &Budget{
		ratio:     max(cfg.Ratio, 0),
		allowance: max(cfg.MinRetriesPerSecond, 0) * window.Seconds(),
		slotNanos: int64(window / numSlots),
	}
}

// Request counts one request's first attempt at now; every request that may be retried
// must be counted once. Fast path: one compare-and-swap.
func (b *Budget) Request(now time.Time) {
	e := b.epoch(now)
	bump(&b.slots[e%numSlots].requests, e&epochMask)
}

// Withdraw reports whether a retry at now fits the budget, and if so counts it. A refusal is
// counted (Refused).
func (b *Budget) Withdraw(now time.Time) bool {
	e := b.epoch(now)
	var requests, retries uint64
	for i := range b.slots {
		requests += live(&b.slots[i].requests, e&epochMask)
		retries += live(&b.slots[i].retries, e&epochMask)
	}
	if float64(retries) >= b.ratio*float64(requests)+b.allowance {
		b.refused.Add(1)
		return false
	}
	bump(&b.slots[e%numSlots].retries, e&epochMask)
	return true
}

// Refused is the number of retries the budget refused.
func (b *Budget) Refused() uint64 { return b.refused.Load() }

// epoch is now's slot number; it picks the slot, and modulo 2^24 it tags the slot's counters.
func (b *Budget) epoch(now time.Time) uint64 {
	return uint64(now.UnixNano() / b.slotNanos)
}

// bump adds one to c for (masked) epoch e, restarting it when it holds an older epoch.
func bump(c *atomic.Uint64, e uint64) {
	for {
		v := c.Load()
		n := e<<countBits | 1
		if v>>countBits == e {
			if v&countMask == countMask {
				return // saturated
			}
			n = v + 1
		}
		if c.CompareAndSwap(v, n) {
			return
		}
	}
}

// live returns c's count when its epoch is within the window ending at (masked) epoch e.
func live(c *atomic.Uint64, e uint64) uint64 {
	v := c.Load()
	if (e-v>>countBits)&epochMask < numSlots {
		return v & countMask
	}
	return 0
}
