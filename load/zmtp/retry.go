package zmtp

import (
	"context"
	"time"
)

// Backoff is the doubling wait between attempts of Retry.
type Backoff struct {
	// Min is the first wait, and the wait after an attempt that made progress.
	Min time.Duration
	// Max caps the doubling.
	Max time.Duration
}

// Retry is the one reconnect loop of the router's ZeroMQ subscriptions (and of the
// discovery that precedes them): it calls attempt until attempt returns a nil error or ctx
// is done. Between attempts it waits b.Min after an attempt that reported progress (a
// session that delivered something), else twice the last wait, up to b.Max. fail, when
// set, sees each attempt's error before the wait (log it on change). attempt receives the
// number of attempts before it.
func Retry(ctx context.Context, b Backoff, attempt func(ctx context.Context, n int) (progress bool, err error), fail func(error)) {
	b.Min = max(b.Min, time.Millisecond)
	b.Max = max(b.Max, b.Min)
	wait := b.Min
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for n := 0; ; n++ {
		progress, err := attempt(ctx, n)
		if err == nil || ctx.Err() != nil {
			return
		}
		if progress {
			wait = b.Min
		}
		if fail != nil {
			fail(err)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		wait = min(2*wait, b.Max)
	}
}
