//go:build !race

package engine

import (
	"testing"

	"switchyard/kv"
	"switchyard/load"
)

// TestCacheAwarePickAllocations locks in that a cache_aware pick — hit, soft-gate diversion
// and miss fallback, under either decision, the latency one also told to an observer —
// allocates nothing; only a rejection builds its error. The load policies' latency
// comparison allocates nothing either.
func TestCacheAwarePickAllocations(t *testing.T) {
	ws := sortedWorkers(t, 16)
	reports := map[*Worker]load.RankReport{}
	matched := map[string]int64{}
	for i, w := range ws {
		reports[w] = native(1, int64(i%10), 100, 1000)
		if i%3 == 0 {
			matched[w.ID] = int64(1024 + 100*i)
		}
	}
	tab := loadTable(t, reports)
	for i, w := range ws {
		if i%2 == 0 {
			learn(w, 50e-6)
		}
	}
	adm := AdmissionLimits{MaxRunning: 1 << 40}
	latency := NewCacheAware(adm, tab, nil, testCacheSettings(), testRNG(), nil)
	observed := testCacheSettings()
	observed.Observer = nopObserver{}
	policies := map[string]Policy{
		"threshold": newCache(adm, tab, nil), "latency": latency,
		"load_based": NewLoadBased(adm, tab), "power_of_two": NewPowerOfTwo(adm, tab, testRNG()),
	}
	policies["latency observed"] = NewCacheAware(adm, tab, nil, observed, testRNG(), nil)
	for pname, p := range policies {
		for name, prefix := range map[string]PrefixMatcher{
			"hit":      &fakePrefix{matched: matched},
			"miss":     &fakePrefix{matched: map[string]int64{}},
			"no memo":  nil,
			"unavail.": &fakePrefix{unavailable: true},
			// The prompt's tokens: the latency decision remembers its dispatches.
			"memo": kv.NewPrefixMemo("llama", prompt(8000, 4096, 1)),
		} {
			req := cacheReq(8000, prefix)
			if _, err := p.Pick(ws, req); err != nil {
				t.Fatal(err)
			}
			if n := testing.AllocsPerRun(100, func() { _, _ = p.Pick(ws, req) }); n != 0 {
				t.Errorf("%s %s: %v allocations per pick, want 0", pname, name, n)
			}
		}
	}
}

// nopObserver records nothing: a pick told to an observer allocates nothing more.
type nopObserver struct{}

func (nopObserver) LatencyDecided(*PickRequest, *LatencyDecision) {}
