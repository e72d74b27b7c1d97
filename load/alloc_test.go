//go:build !race

package load

import (
	"testing"
	"time"
	"unsafe"
)

// TestAllocationBudget locks in the request-path allocation budget.
func TestAllocationBudget(t *testing.T) {
	tr := NewTracker()
	c := tr.Counters("w")
	now := time.Now()
	if n := testing.AllocsPerRun(1000, func() {
		tr.Acquire(c, now).Release()
	}); n > 1 {
		t.Errorf("Acquire+Release: %v allocs, want <= 1 (the Guard)", n)
	}
	if n := testing.AllocsPerRun(1000, func() {
		g := tr.AcquirePrefill(c, now, 100)
		g.FirstToken(now)
		g.Release()
	}); n > 1 {
		t.Errorf("AcquirePrefill+FirstToken+Release: %v allocs, want <= 1 (the Guard)", n)
	}
	var own Guard
	if n := testing.AllocsPerRun(1000, func() {
		g := tr.AcquirePrefillInto(&own, c, now, 100)
		g.FirstTokenAt(now.Add(time.Second))
		g.Release()
	}); n != 0 {
		t.Errorf("AcquirePrefillInto+FirstTokenAt+Release: %v allocs, want 0", n)
	}
	var o Observation
	if n := testing.AllocsPerRun(1000, func() {
		c.Rates().Prefill.Observe(1000, 0.05)
		c.Rates().Decode.Observe(3, 0.01)
		_, _ = EstimateTTFT(&o, c, 1000, now)
		_, _ = EstimateTPOT(&o, c)
	}); n != 0 {
		t.Errorf("learning and estimating: %v allocs, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() { _ = tr.Counters("w") }); n != 0 {
		t.Errorf("Counters (existing): %v allocs, want 0", n)
	}

	a := NewAggregator(time.Minute)
	a.SetWorker("w", 2, c)
	a.Ingest("w", nativeRep(0, now, 1, 2, 3, 4, 5))
	a.Ingest("w", nativeRep(1, now, 1, 2, 3, 4, 5))
	s := a.Snapshot(now)
	var sink Observation
	if n := testing.AllocsPerRun(1000, func() { sink = s.Observe("w", now) }); n != 0 {
		t.Errorf("Observe: %v allocs, want 0", n)
	}
	if !sink.Known() {
		t.Fatal("observation unknown")
	}
	if n := testing.AllocsPerRun(1000, func() { a.Ingest("w", nativeRep(0, now, 1, 2, 3, 4, 5)) }); n != 0 {
		t.Errorf("Ingest: %v allocs, want 0", n)
	}
}

// TestGuardSize keeps a Guard in the 64-byte allocation class (a buffered request's guard
// is the caller's storage, AcquirePrefillInto; a stream's is allocated).
func TestGuardSize(t *testing.T) {
	if n := unsafe.Sizeof(Guard{}); n > 64 {
		t.Fatalf("Guard is %d bytes, want at most 64", n)
	}
}
