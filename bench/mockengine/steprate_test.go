package mockengine

import (
	"testing"
	"time"
)

// lateClock is a ManualClock whose timers fire late after their deadline, as a busy host
// wakes a sleeping goroutine late.
type lateClock struct {
	*ManualClock
	late time.Duration
}

func (c lateClock) NewTimer(d time.Duration) Timer { return c.ManualClock.NewTimer(d + c.late) }

// TestStepsKeepTheirRateOnALateClock checks that a step whose timer fires late is made up
// for by the next one: a request's decode steps end on the cost model's schedule, not one
// wake-up delay later each. Only the last step's delay shows, unless the delay is a stall.
func TestStepsKeepTheirRateOnALateClock(t *testing.T) {
	for _, tc := range []struct {
		name   string
		late   time.Duration
		madeUp bool
	}{
		{name: "on time", late: 0, madeUp: true},
		{name: "3ms late", late: 3 * time.Millisecond, madeUp: true},
		{name: "late by more than a step", late: 30 * time.Millisecond, madeUp: true},
		// A delay beyond maxStepLag is a stall: the engine goes on at its own pace.
		{name: "stalled", late: maxStepLag + time.Millisecond, madeUp: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := lateClock{NewManualClock(time.Unix(1_800_000_000, 0)), tc.late}
			costs := &Costs{PrefillOverhead: 5 * time.Millisecond, PrefillPerToken: 100 * time.Microsecond,
				DecodeStep: 10 * time.Millisecond, DecodePerRequest: time.Millisecond}
			e := startEngine(t, Config{Clock: clk, Costs: costs, LoadPublish: LoadPublish{Disabled: true}})
			runClock(t, clk.ManualClock)

			const tokens = 50
			m := generate(t, e, ids(1000, 1000), tokens, nil)
			seconds := func(key string) time.Duration {
				return time.Duration(path(t, m, "meta_info", key).(float64) * float64(time.Second))
			}
			prefill := costs.PrefillOverhead + 1000*costs.PrefillPerToken
			model := prefill + (tokens-1)*(costs.DecodeStep+costs.DecodePerRequest)
			got := seconds("e2e_latency")
			if tc.madeUp {
				// At most the last step's delay shows: the steps before it were made up for.
				if got < model-time.Microsecond || got > model+tc.late+time.Microsecond {
					t.Errorf("e2e = %v, want the cost model's %v plus at most one delay of %v", got, model, tc.late)
				}
				return
			}
			if want := model + tokens*tc.late; !near(got, want) {
				t.Errorf("e2e = %v, want %v: every step's delay (a stall) shows", got, want)
			}
		})
	}
}
