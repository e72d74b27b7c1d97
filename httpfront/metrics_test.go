package httpfront

import (
	"sync"
	"testing"

	"github.com/VictoriaMetrics/metrics"
)

// TestCounterMapCreatesOnce: concurrent first uses of a key create one counter, and every
// key keeps its own.
func TestCounterMapCreatesOnce(t *testing.T) {
	var m counterMap[string]
	set := metrics.NewSet()
	var created sync.Map
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for _, k := range []string{"a", "b", "c"} {
				m.get(k, func() *metrics.Counter {
					if _, dup := created.LoadOrStore(k, g); dup {
						t.Errorf("key %s created twice", k)
					}
					return set.NewCounter("c_" + k)
				}).Inc()
			}
		})
	}
	wg.Wait()
	for _, k := range []string{"a", "b", "c"} {
		if n := m.get(k, nil).Get(); n != 8 {
			t.Errorf("counter %s: %d, want 8", k, n)
		}
	}
}
