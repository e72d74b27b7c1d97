package kv

import (
	"testing"
	"time"
)

// streamFixture is an index holding a 100,000-token prompt (6,250 blocks of 16): "full" holds
// all of it, "half" the first half, "edge" exactly the first wave, and "fork" the first
// 40,000 tokens followed by other tokens.
func streamFixture(t *testing.T) (*Index, []uint32) {
	t.Helper()
	x := newTestIndex(t, 4, 1<<20)
	prompt := seqTokens(7, 100_000)
	hold(t, x, register(t, x, "full", 1, 16)[0], prompt, 16, TierGPU)
	hold(t, x, register(t, x, "half", 1, 16)[0], prompt[:50_000], 16, TierGPU)
	hold(t, x, register(t, x, "edge", 1, 16)[0], prompt[:firstWave*16], 16, TierGPU)
	fork := append(append([]uint32{}, prompt[:40_000]...), seqTokens(1<<30, 20_000)...)
	hold(t, x, register(t, x, "fork", 1, 16)[0], fork, 16, TierGPU)
	return x, prompt
}

func checkStreamed(t *testing.T, got map[string]int64) {
	t.Helper()
	if got["full"] != 100_000 || got["half"] != 50_000 || got["edge"] != 1024 || got["fork"] != 40_000 || len(got) != 4 {
		t.Fatalf("got %v", got)
	}
}

// setHooks installs the stream test hooks for the test's duration.
func setHooks(t *testing.T, start func(), chunk func(*stream, int), stopped func()) {
	testHelperStart, testChunkHashed, testHelperStopped = start, chunk, stopped
	t.Cleanup(func() { testHelperStart, testChunkHashed, testHelperStopped = nil, nil, nil })
}

// waitFor fails the test unless ch delivers within a generous bound.
func awaitSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Errorf("timed out waiting for %s", what)
	}
}

func TestStreamHelperMatchesWhileHashing(t *testing.T) {
	x, prompt := streamFixture(t)
	started := make(chan struct{})
	var chunks int
	setHooks(t, func() { close(started) }, func(_ *stream, to int) {
		if chunks++; chunks == 1 {
			awaitSignal(t, started, "the helper") // the helper claims the matching
		}
	}, nil)
	checkStreamed(t, lookup(t, x, "m", prompt))
	if chunks == 0 {
		t.Fatal("the lookup did not stream")
	}
}

func TestStreamStopsHashingAtPrefixEnd(t *testing.T) {
	x, prompt := streamFixture(t)
	// Past 4,000 blocks only "full" holds the prompt: drop it, so that the prefix ends at
	// "half"'s 3,125 blocks, and check that the hashing stops soon after.
	x.RemoveWorker("full")
	started, stopped := make(chan struct{}), make(chan struct{})
	var last int
	chunks := 0
	setHooks(t, func() { close(started) }, func(_ *stream, to int) {
		if chunks++; chunks == 1 {
			awaitSignal(t, started, "the helper")
		}
		if last < 4000 && to >= 4000 {
			// The helper has all it needs to find the end: wait until it says so.
			awaitSignal(t, stopped, "the helper to stop the hashing")
		}
		last = to
	}, func() { close(stopped) })
	got := lookup(t, x, "m", prompt)
	if got["half"] != 50_000 || got["fork"] != 40_000 || got["edge"] != 1024 || len(got) != 3 {
		t.Fatalf("got %v", got)
	}
	if last >= 4000+streamChunk {
		t.Fatalf("hashed %d of 6250 blocks; the prefix ended at 3125", last)
	}
}

func TestStreamWithdrawsALateHelper(t *testing.T) {
	x, prompt := streamFixture(t)
	release := make(chan struct{})
	exited := make(chan struct{}, 4)
	setHooks(t, func() {
		<-release // the helper's core "wakes up" only after the lookup is over
		exited <- struct{}{}
	}, nil, nil)
	checkStreamed(t, lookup(t, x, "m", prompt))
	// The late helper finds itself withdrawn; the next lookups have a stream of their own.
	close(release)
	awaitSignal(t, exited, "the first helper")
	checkStreamed(t, lookup(t, x, "m", prompt))
	awaitSignal(t, exited, "the second helper")
}
