package load

import (
	"math"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func nativeRep(rank int, at time.Time, running, waiting, used, capacity, uncached int64) RankReport {
	return RankReport{
		DPRank: rank, At: at,
		Fields:  HasNative | HasRunning | HasWaiting | HasUsedTokens | HasWaitingUncached | HasCapacity,
		Running: running, Waiting: waiting, UsedTokens: used, MaxTotalTokens: capacity, WaitingUncachedTokens: uncached,
	}
}

func TestAggregatorFreshness(t *testing.T) {
	const fresh = 5 * time.Second
	tests := []struct {
		name    string
		dpSize  int
		reports []RankReport
		now     time.Time
		known   bool
	}{
		{
			name:    "complete fresh set",
			dpSize:  2,
			reports: []RankReport{nativeRep(0, t0, 1, 0, 10, 100, 0), nativeRep(1, t0.Add(time.Second), 2, 0, 20, 100, 0)},
			now:     t0.Add(fresh), // oldest rank exactly at the window edge is still fresh
			known:   true,
		},
		{
			name:    "missing rank",
			dpSize:  3,
			reports: []RankReport{nativeRep(0, t0, 1, 0, 10, 100, 0), nativeRep(2, t0, 2, 0, 20, 100, 0)},
			now:     t0,
		},
		{
			name:    "stale rank",
			dpSize:  2,
			reports: []RankReport{nativeRep(0, t0, 1, 0, 10, 100, 0), nativeRep(1, t0.Add(4*time.Second), 2, 0, 20, 100, 0)},
			now:     t0.Add(fresh + time.Nanosecond),
		},
		{
			name:   "no report",
			dpSize: 1,
			now:    t0,
		},
		{
			name:    "rank outside dp size does not complete the set",
			dpSize:  2,
			reports: []RankReport{nativeRep(0, t0, 1, 0, 10, 100, 0), nativeRep(2, t0, 2, 0, 20, 100, 0)},
			now:     t0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewAggregator(fresh)
			a.SetWorker("w", tt.dpSize, nil)
			for _, r := range tt.reports {
				a.Ingest("w", r)
			}
			o := a.Snapshot(tt.now).Observe("w", tt.now)
			if o.Known() != tt.known {
				t.Fatalf("Known() = %v, want %v (%+v)", o.Known(), tt.known, o)
			}
			if !tt.known && o != (Observation{}) {
				t.Fatalf("unknown observation is not the zero value: %+v", o)
			}
		})
	}
}

func TestAggregatorSums(t *testing.T) {
	a := NewAggregator(0)
	if a.Freshness() != DefaultFreshness {
		t.Fatalf("default freshness = %v", a.Freshness())
	}
	tr := NewTracker()
	c := tr.Counters("w")
	a.SetWorker("w", 3, c)
	a.SetWorker("legacy", 2, nil)

	tr.Acquire(c, t0)
	a.Ingest("w", nativeRep(0, t0.Add(2*time.Second), 1, 2, 100, 1000, 30))
	tr.Acquire(c, t0)
	tr.Acquire(c, t0)
	a.Ingest("w", nativeRep(1, t0.Add(1*time.Second), 3, 4, 200, 1000, 40))
	r2 := nativeRep(2, t0.Add(3*time.Second), 5, 6, 300, 2000, 50)
	r2.Fields &^= HasWaitingUncached // one rank lacks a metric: unknown for the worker
	a.Ingest("w", r2)

	a.Ingest("legacy", RankReport{DPRank: 0, At: t0, Fields: HasRunning | HasWaiting | HasUsedTokens, Running: 1, Waiting: 1, UsedTokens: 5})
	a.Ingest("legacy", RankReport{DPRank: 1, At: t0, Fields: HasRunning | HasWaiting | HasUsedTokens, Running: 2, Waiting: 0, UsedTokens: 6})

	now := t0.Add(4 * time.Second)
	s := a.Snapshot(now)
	got := s.Observe("w", now)
	want := Observation{
		Fields:  HasNative | HasRunning | HasWaiting | HasUsedTokens | HasCapacity,
		Running: 9, Waiting: 12, UsedTokens: 600, MaxTotalTokens: 4000,
		CapturedAt:          t0.Add(time.Second), // the oldest rank
		DispatchesAtCapture: 1,                   // lowest dispatch count among the ranks
	}
	if got != want {
		t.Fatalf("\n got %+v\nwant %+v", got, want)
	}
	if !got.Native() || got.KVUsage() != 0.15 {
		t.Fatalf("Native() = %v, KVUsage() = %v", got.Native(), got.KVUsage())
	}

	leg := s.Observe("legacy", now)
	if leg.Native() || leg.Has(HasCapacity) || leg.Running != 3 || leg.Waiting != 1 || leg.UsedTokens != 11 || leg.KVUsage() != 0 {
		t.Fatalf("legacy aggregate = %+v", leg)
	}
	if s.Len() != 2 || !s.At().Equal(now) {
		t.Fatalf("Len() = %d, At() = %v", s.Len(), s.At())
	}
}

func TestAggregatorDropsAndCounts(t *testing.T) {
	a := NewAggregator(time.Second)
	a.SetWorker("w", 2, nil)
	a.Ingest("nobody", nativeRep(0, t0, 1, 0, 0, 1, 0))
	a.Ingest("w", nativeRep(2, t0, 1, 0, 0, 1, 0))
	a.Ingest("w", nativeRep(-1, t0, 1, 0, 0, 1, 0))
	a.Ingest("w", nativeRep(0, time.Time{}, 1, 0, 0, 1, 0))
	a.Ingest("w", nativeRep(0, t0, 1, 0, 0, 1, 0))
	want := AggregatorStats{Ingested: 1, UnknownWorker: 1, RankOutOfRange: 2, NoCaptureTime: 1}
	if got := a.Stats(); got != want {
		t.Fatalf("stats = %+v, want %+v", got, want)
	}

	// Shrinking the DP size keeps the surviving ranks: rank 0 alone completes the set.
	a.SetWorker("w", 1, nil)
	if o := a.Snapshot(t0).Observe("w", t0); o.Running != 1 {
		t.Fatalf("after shrink: %+v", o)
	}
	// Growing it needs the new rank before the worker is known again.
	a.SetWorker("w", 2, nil)
	if o := a.Snapshot(t0).Observe("w", t0); o.Known() {
		t.Fatalf("after grow: %+v", o)
	}
	a.RemoveWorker("w")
	if s := a.Snapshot(t0); s.Len() != 0 || s.Observe("w", t0) != (Observation{}) {
		t.Fatalf("after remove: len %d", s.Len())
	}
}

func TestAggregatorSnapshotsAreImmutable(t *testing.T) {
	a := NewAggregator(time.Minute)
	a.SetWorker("w", 1, nil)
	a.Ingest("w", nativeRep(0, t0, 1, 0, 0, 10, 0))
	s1 := a.Snapshot(t0)
	a.Ingest("w", nativeRep(0, t0, 7, 0, 0, 10, 0))
	a.SetWorker("x", 1, nil)
	s2 := a.Snapshot(t0)
	if s1.Observe("w", t0).Running != 1 || s1.Len() != 1 {
		t.Fatalf("old snapshot changed: %+v", s1.Observe("w", t0))
	}
	if s2.Observe("w", t0).Running != 7 || s2.Len() != 2 {
		t.Fatalf("new snapshot: %+v", s2.Observe("w", t0))
	}
}

func TestPrefillQueueEstimate(t *testing.T) {
	type sample struct {
		uncached, busyUs, waitingUncached int64
		noCounters                        bool
		wantQueue                         float64 // < 0: unavailable
	}
	tests := []struct {
		name       string
		samples    []sample
		wantResets uint64
	}{
		{
			name: "two samples give throughput",
			// 10,000 tokens in 2 s of busy time = 5,000 tok/s; 2,500 waiting = 500 ms.
			samples: []sample{{0, 0, 100, false, -1}, {10000, 2_000_000, 2500, false, 500}},
		},
		{
			name: "counter reset needs two new samples",
			samples: []sample{
				{1000, 1_000_000, 0, false, -1},
				{5000, 2_000_000, 400, false, 100},  // 4,000 tok/s
				{100, 50_000, 400, false, -1},       // restart
				{2100, 1_050_000, 1000, false, 500}, // 2,000 tok/s over the new series
			},
			wantResets: 1,
		},
		{
			name: "one counter backwards is a reset",
			samples: []sample{
				{1000, 1_000_000, 0, false, -1},
				{2000, 900_000, 10, false, -1},
				{3000, 1_900_000, 10, false, 10}, // 1,000 tok/s
			},
			wantResets: 1,
		},
		{
			name: "no busy time is unavailable and keeps the baseline",
			samples: []sample{
				{1000, 1_000_000, 0, false, -1},
				{1000, 1_000_000, 50, false, -1},
				{3000, 2_000_000, 50, false, 25}, // 2,000 tok/s since the first sample
			},
		},
		{
			name: "zero throughput is unavailable",
			samples: []sample{
				{1000, 1_000_000, 0, false, -1},
				{1000, 2_000_000, 50, false, -1},
			},
		},
		{
			name: "report without counters has no estimate",
			samples: []sample{
				{0, 0, 0, false, -1},
				{1000, 1_000_000, 50, true, -1},
				{2000, 2_000_000, 100, false, 100}, // baseline kept across the counterless report
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewAggregator(time.Minute)
			a.SetWorker("w", 1, nil)
			for i, s := range tt.samples {
				r := nativeRep(0, t0, 0, 0, 0, 1000, s.waitingUncached)
				r.HasCounters = !s.noCounters
				r.TotalPrefillUncached, r.TotalPrefillBusyUs = s.uncached, s.busyUs
				a.Ingest("w", r)
				o := a.Snapshot(t0).Observe("w", t0)
				if s.wantQueue < 0 {
					if o.Has(HasPrefillQueue) || o.PrefillQueueMs != 0 {
						t.Fatalf("sample %d: queue %v available, want unavailable", i, o.PrefillQueueMs)
					}
					continue
				}
				if !o.Has(HasPrefillQueue) || math.Abs(o.PrefillQueueMs-s.wantQueue) > 1e-9 {
					t.Fatalf("sample %d: queue = %v (has %v), want %v", i, o.PrefillQueueMs, o.Has(HasPrefillQueue), s.wantQueue)
				}
			}
			if got := a.Stats().CounterResets; got != tt.wantResets {
				t.Fatalf("resets = %d, want %d", got, tt.wantResets)
			}
		})
	}
}

func TestPrefillQueueIsMaxOverRanks(t *testing.T) {
	a := NewAggregator(time.Minute)
	a.SetWorker("w", 2, nil)
	feed := func(rank int, uncached, busy, waiting int64) {
		r := nativeRep(rank, t0, 0, 0, 0, 1000, waiting)
		r.HasCounters, r.TotalPrefillUncached, r.TotalPrefillBusyUs = true, uncached, busy
		a.Ingest("w", r)
	}
	feed(0, 0, 0, 0)
	feed(1, 0, 0, 0)
	feed(0, 1000, 1_000_000, 300) // 1,000 tok/s -> 300 ms
	if o := a.Snapshot(t0).Observe("w", t0); o.Has(HasPrefillQueue) {
		t.Fatalf("queue known with only one rank estimating: %+v", o)
	}
	feed(1, 4000, 1_000_000, 800) // 4,000 tok/s -> 200 ms
	o := a.Snapshot(t0).Observe("w", t0)
	if !o.Has(HasPrefillQueue) || o.PrefillQueueMs != 300 || o.WaitingUncachedTokens != 1100 {
		t.Fatalf("got %+v, want queue 300 ms over 1100 uncached tokens", o)
	}
}

func TestPrefillQueueFromCallerIsIgnored(t *testing.T) {
	a := NewAggregator(time.Minute)
	a.SetWorker("w", 1, nil)
	r := nativeRep(0, t0, 0, 0, 0, 1000, 5)
	r.Fields |= HasPrefillQueue
	a.Ingest("w", r)
	if o := a.Snapshot(t0).Observe("w", t0); o.Has(HasPrefillQueue) {
		t.Fatalf("caller-set HasPrefillQueue survived: %+v", o)
	}
}

func TestTable(t *testing.T) {
	tab := NewTable()
	if s := tab.Load(); s == nil || s.Len() != 0 || s.Observe("w", t0) != (Observation{}) {
		t.Fatal("new table does not hold an empty snapshot")
	}
	var zero Table
	if zero.Load() == nil {
		t.Fatal("zero table returned nil")
	}
	a := NewAggregator(time.Minute)
	a.SetWorker("w", 1, nil)
	a.Ingest("w", nativeRep(0, t0, 2, 0, 0, 10, 0))
	tab.Store(a.Snapshot(t0))
	if o := tab.Load().Observe("w", t0); o.Running != 2 {
		t.Fatalf("stored snapshot: %+v", o)
	}
	tab.Store(nil)
	if s := tab.Load(); s == nil || s.Len() != 0 {
		t.Fatal("Store(nil) did not publish an empty snapshot")
	}
}

func TestUnixNanoSat(t *testing.T) {
	far := time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)
	if unixNanoSat(far) != math.MaxInt64 || unixNanoSat(time.Time{}) != math.MinInt64 {
		t.Fatalf("saturation: %d %d", unixNanoSat(far), unixNanoSat(time.Time{}))
	}
	if unixNanoSat(t0) != t0.UnixNano() || addNanosSat(math.MaxInt64-1, 5) != math.MaxInt64 {
		t.Fatal("in-range conversion")
	}
}

func TestAggregatorRemoveKeepsOthers(t *testing.T) {
	a := NewAggregator(time.Minute)
	for i, id := range []string{"a", "b", "c"} {
		a.SetWorker(id, 1, nil)
		a.Ingest(id, nativeRep(0, t0, int64(i+1), 0, 0, 10, 0))
	}
	before := a.Snapshot(t0)
	a.RemoveWorker("a")
	a.RemoveWorker("missing")
	a.Ingest("c", nativeRep(0, t0, 30, 0, 0, 10, 0))
	after := a.Snapshot(t0)
	if o := before.Observe("a", t0); o.Running != 1 {
		t.Fatalf("earlier snapshot lost a: %+v", o)
	}
	if o := before.Observe("c", t0); o.Running != 3 {
		t.Fatalf("earlier snapshot changed c: %+v", o)
	}
	if after.Len() != 2 || after.Observe("a", t0) != (Observation{}) {
		t.Fatalf("a still present after removal (len %d)", after.Len())
	}
	if b, c := after.Observe("b", t0), after.Observe("c", t0); b.Running != 2 || c.Running != 30 {
		t.Fatalf("b %+v c %+v", b, c)
	}
	if got := a.Stats().UnknownWorker; got != 0 {
		t.Fatalf("UnknownWorker = %d", got)
	}
}

func TestSnapshotObserveRank(t *testing.T) {
	a := NewAggregator(5 * time.Second)
	a.SetWorker("w", 2, nil)
	a.SetWorker("single", 1, nil)
	now := time.Unix(1_800_000_000, 0)
	a.Ingest("w", RankReport{DPRank: 1, Fields: HasRunning | HasWaiting, Running: 3, Waiting: 2, At: now})
	a.Ingest("single", RankReport{Fields: HasRunning, Running: 1, At: now})
	s := a.Snapshot(now)
	if o := s.ObserveRank("w", 1, now); o.Running != 3 || o.Waiting != 2 || !o.Has(HasWaiting) {
		t.Fatalf("rank 1: %+v", o)
	}
	// Rank 0 never reported: unknown, and so is the worker's aggregate.
	if o := s.ObserveRank("w", 0, now); o.Known() {
		t.Fatalf("rank 0 without a report: %+v", o)
	}
	if o := s.Observe("w", now); o.Known() {
		t.Fatalf("incomplete aggregate: %+v", o)
	}
	// Stale, out of range, single-rank and unknown workers are unknown.
	for _, o := range []Observation{
		s.ObserveRank("w", 1, now.Add(6*time.Second)),
		s.ObserveRank("w", 2, now), s.ObserveRank("w", -1, now),
		s.ObserveRank("single", 0, now), s.ObserveRank("nobody", 0, now),
	} {
		if o.Known() {
			t.Fatalf("want unknown, got %+v", o)
		}
	}
}
