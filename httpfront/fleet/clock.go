package fleet

import "time"

// Clock is the lifecycle's time: breakers read Now and schedule their cool-down with
// AfterFunc. Tests pass a manual clock.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f on its own goroutine once d has passed; the returned function
	// cancels the call and reports whether it did.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// SystemClock is the wall clock.
type SystemClock struct{}

var _ Clock = SystemClock{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (SystemClock) AfterFunc(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }
