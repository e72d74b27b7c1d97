package load

import (
	"testing"
)

// Seed corpora live in testdata/fuzz/<FuzzName>/; the f.Add seeds below cover the shapes a
// reader sees first.

func FuzzDecodeLoads(f *testing.F) {
	f.Add([]byte(`{"timestamp":1772366409.5,"version":"0.5","loads":[` + nativeRank0 + `]}`))
	f.Add([]byte(`{"timestamp":"2026-03-01T12:00:09Z","loads":[{"dp_rank":0},{"dp_rank":1,"total_prefill_uncached_tokens":1,"total_prefill_busy_us":2}]}`))
	f.Add([]byte(`{"loads":null}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		reps, err := DecodeLoads(body, recvAt)
		if err != nil {
			return
		}
		checkDecoded(t, reps)
		for i := range reps {
			r := &reps[i]
			if !r.Has(HasNative) || r.At.After(recvAt) || r.At.IsZero() {
				t.Fatalf("rank %d: fields %b at %v", i, r.Fields, r.At)
			}
			if r.TotalTokens < 0 || r.MaxRunningRequests < 0 || r.TotalPrefillUncached < 0 || r.TotalPrefillBusyUs < 0 {
				t.Fatalf("rank %d: negative value %+v", i, r)
			}
		}
	})
}

func FuzzDecodeGetLoad(f *testing.F) {
	f.Add([]byte(`[{"dp_rank":0,"num_reqs":5,"num_waiting_reqs":2,"num_tokens":900}]`))
	f.Add([]byte(`[{"dp_rank":0,"num_reqs":1,"num_waiting_reqs":4},{"dp_rank":1}]`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		reps, err := DecodeGetLoad(body, recvAt)
		if err != nil {
			return
		}
		checkDecoded(t, reps)
		for i := range reps {
			r := &reps[i]
			if r.Fields&(HasNative|HasCapacity|HasWaitingUncached) != 0 || !r.At.Equal(recvAt) || r.HasCounters {
				t.Fatalf("rank %d: legacy report %+v", i, r)
			}
		}
	})
}

func FuzzDecodeGauge(f *testing.F) {
	f.Add(AppendGauge(nil, RankReport{Running: 3, Waiting: 2, UsedTokens: 1500, MaxTotalTokens: 100000, DPRank: 1}, false))
	f.Add(AppendGauge(nil, RankReport{Running: 3, WaitingUncachedTokens: 64, HasCounters: true, TotalPrefillUncached: 1 << 40, TotalPrefillBusyUs: 7}, true))
	f.Add([]byte{0x96, 0xa8, 'L', 'o', 'a', 'd', 'S', 't', 'a', 't', 0xcb, 0x40, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, payload []byte) {
		r, err := DecodeGauge(payload, recvAt)
		if err != nil {
			return
		}
		checkDecoded(t, []RankReport{r})
		again, err := DecodeGauge(AppendGauge(nil, r, r.Has(HasNative)), recvAt)
		if err != nil {
			t.Fatalf("re-encoded report does not decode: %v", err)
		}
		if again != r {
			t.Fatalf("round trip changed the report:\n got %+v\nwant %+v", again, r)
		}
	})
}

// checkDecoded checks the invariants every successfully decoded report set holds.
func checkDecoded(t *testing.T, reps []RankReport) {
	t.Helper()
	if len(reps) == 0 || len(reps) > MaxRanks {
		t.Fatalf("%d reports", len(reps))
	}
	seen := make(map[int]bool, len(reps))
	for i := range reps {
		r := &reps[i]
		if r.DPRank < 0 || r.DPRank >= MaxRanks || seen[r.DPRank] {
			t.Fatalf("report %d: bad or duplicate rank %d", i, r.DPRank)
		}
		seen[r.DPRank] = true
		if r.Running < 0 || r.Waiting < 0 || r.UsedTokens < 0 || r.MaxTotalTokens < 0 || r.WaitingUncachedTokens < 0 {
			t.Fatalf("report %d: negative count %+v", i, r)
		}
		if r.Has(HasCapacity) != (r.MaxTotalTokens > 0) {
			t.Fatalf("report %d: HasCapacity %v with capacity %d", i, r.Has(HasCapacity), r.MaxTotalTokens)
		}
		if r.Has(HasPrefillQueue) {
			t.Fatalf("report %d: a decoder set HasPrefillQueue", i)
		}
	}
}
