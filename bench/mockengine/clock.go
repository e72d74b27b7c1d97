package mockengine

import (
	"context"
	"sort"
	"sync"
	"time"
)

// Clock is the engine's source of time: timestamps, simulated step durations, added
// latency and the delayed faults all go through it.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer of a Clock.
type Timer interface {
	// C delivers the fire time once.
	C() <-chan time.Time
	// Stop prevents the timer from firing and reports whether it was still pending.
	Stop() bool
}

var (
	_ Clock = realClock{}
	_ Timer = realTimer{}
	_ Timer = (*manualTimer)(nil)
)

// RealClock returns the wall clock.
func RealClock() Clock { return realClock{} }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time { return t.t.C }
func (t realTimer) Stop() bool          { return t.t.Stop() }

// ManualClock is a Clock that moves only when told to. Tests use it to freeze an engine
// mid-step (Advance), or to run it as a discrete-event simulation (Run), which jumps to
// each timer's deadline as soon as one is pending so that reported latencies equal the
// simulated costs exactly.
type ManualClock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*manualTimer
	changed chan struct{} // closed and replaced whenever a timer is added
}

var _ Clock = (*ManualClock)(nil)

// NewManualClock returns a ManualClock reading start.
func NewManualClock(start time.Time) *ManualClock {
	return &ManualClock{now: start, changed: make(chan struct{})}
}

type manualTimer struct {
	c        *ManualClock
	deadline time.Time
	ch       chan time.Time
	pending  bool
}

func (t *manualTimer) C() <-chan time.Time { return t.ch }

func (t *manualTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if !t.pending {
		return false
	}
	t.pending = false
	t.c.remove(t)
	return true
}

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTimer returns a timer firing once the clock has advanced by d; d <= 0 fires at once.
func (c *ManualClock) NewTimer(d time.Duration) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{c: c, deadline: c.now.Add(d), ch: make(chan time.Time, 1)}
	if d <= 0 {
		t.ch <- c.now
		return t
	}
	t.pending = true
	c.timers = append(c.timers, t)
	close(c.changed)
	c.changed = make(chan struct{})
	return t
}

func (c *ManualClock) remove(t *manualTimer) {
	for i, x := range c.timers {
		if x == t {
			c.timers = append(c.timers[:i], c.timers[i+1:]...)
			return
		}
	}
}

// Advance moves the clock forward by d and fires every timer due by then, in deadline order.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advanceLocked(c.now.Add(d))
}

func (c *ManualClock) advanceLocked(to time.Time) {
	sort.SliceStable(c.timers, func(i, j int) bool { return c.timers[i].deadline.Before(c.timers[j].deadline) })
	n := 0
	for _, t := range c.timers {
		if t.deadline.After(to) {
			break
		}
		n++
		if t.deadline.After(c.now) {
			c.now = t.deadline
		}
		t.pending = false
		t.ch <- c.now
	}
	c.timers = append(c.timers[:0], c.timers[n:]...)
	if to.After(c.now) {
		c.now = to
	}
}

// Pending returns the number of timers waiting to fire.
func (c *ManualClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// Next returns the earliest deadline of the pending timers, and false when none is pending.
func (c *ManualClock) Next() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.timers) == 0 {
		return time.Time{}, false
	}
	next := c.timers[0].deadline
	for _, t := range c.timers[1:] {
		if t.deadline.Before(next) {
			next = t.deadline
		}
	}
	return next, true
}

// WaitForTimers blocks until at least n timers are pending or ctx is done.
func (c *ManualClock) WaitForTimers(ctx context.Context, n int) error {
	for {
		c.mu.Lock()
		ok, ch := len(c.timers) >= n, c.changed
		c.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// AdvanceToNext waits until a timer is pending, then advances the clock to the earliest
// deadline, firing it, and returns the step taken.
func (c *ManualClock) AdvanceToNext(ctx context.Context) (time.Duration, error) {
	if err := c.WaitForTimers(ctx, 1); err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.timers) == 0 {
		return 0, nil
	}
	next := c.timers[0].deadline
	for _, t := range c.timers[1:] {
		if t.deadline.Before(next) {
			next = t.deadline
		}
	}
	from := c.now
	c.advanceLocked(next)
	return c.now.Sub(from), nil
}

// Run advances to each pending timer as soon as one exists, until ctx is done: the engine
// then runs as a discrete-event simulation whose time only moves by simulated costs.
func (c *ManualClock) Run(ctx context.Context) {
	for {
		if _, err := c.AdvanceToNext(ctx); err != nil {
			return
		}
	}
}
