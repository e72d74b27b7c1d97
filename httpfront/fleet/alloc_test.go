//go:build !race

package fleet

import (
	"testing"
	"time"

	"switchyard/engine"
)

// TestDispatchAccountingAllocations locks in an allocation-free Admit and Done on the
// request path of a closed breaker, whatever the outcome counted.
func TestDispatchAccountingAllocations(t *testing.T) {
	s := testSettings()
	s.MinRequests = 1 << 30 // stays closed: the test measures the counting, not a transition
	w := engine.NewWorker("A", "http://a", "m", engine.StagePlain, nil)
	m := &Member{f: &Fleet{clock: SystemClock{}}, breaker: NewBreaker(s, time.Now, w.Counters.Dispatched)}
	w.Handle = m
	for _, o := range []Outcome{OutcomeSuccess, OutcomeNeutral, OutcomeError} {
		allocs := testing.AllocsPerRun(1000, func() {
			tk, ok := MemberOf(w).Admit(t0)
			if !ok {
				t.Fatal("refused")
			}
			tk.Done(o)
		})
		if allocs != 0 {
			t.Errorf("%v: %.1f allocations per dispatch, want 0", o, allocs)
		}
	}
}
