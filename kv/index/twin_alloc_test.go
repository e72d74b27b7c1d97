//go:build !race

package index

import (
	"context"
	"runtime"
	"testing"

	"switchyard/kv"
)

// TestSplitLookupAllocations locks in the allocation budget of a split lookup
// (Config.SplitBlocks) once the pool and the twin's buffers are warm: none, whether the twin
// takes the back part or the lookup withdraws it (testing.AllocsPerRun runs on one thread,
// so mostly the latter; each run yields once so that the twin also runs).
func TestSplitLookupAllocations(t *testing.T) {
	x := newSplitIndex(t)
	prompt := seqTokens(11, 100_000)
	hold(t, x, register(t, x, "full", 1, 16)[0], prompt, 16, TierGPU)
	hold(t, x, register(t, x, "half", 1, 16)[0], prompt[:50_000], 16, TierGPU)
	var l kv.Lookup
	run := func() {
		if err := x.Lookup(context.Background(), "m", prompt, &l); err != nil {
			t.Fatal(err)
		}
		runtime.Gosched() // the twin, woken, runs
	}
	run() // warm the pool and the twin's buffers
	if !x.twin.started {
		t.Fatal("a 6,250-block lookup did not start the twin")
	}
	if n := testing.AllocsPerRun(50, run); n != 0 {
		t.Errorf("a split lookup allocates %v times, want 0", n)
	}
	if full, half := l.Tokens("full"), l.Tokens("half"); full != 100_000 || half != 50_000 {
		t.Errorf("full holds %d tokens, half %d: want 100000, 50000", full, half)
	}
}
