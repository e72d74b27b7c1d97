package index

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"switchyard/kv"
	"switchyard/kv/hashing"
)

// streamFixture is an index holding a 100,000-token prompt (6,250 blocks of 16): "full" holds
// all of it, "half" the first half, "edge" exactly the first wave, and "fork" the first
// 40,000 tokens followed by other tokens. cacheChunks is its HashCacheChunks.
func streamFixture(t *testing.T, cacheChunks int) (*Index, []uint32, *streamHooks) {
	t.Helper()
	h := &streamHooks{}
	x, err := New(Config{Shards: 4, MaxBlocks: 1 << 20, HashCacheChunks: cacheChunks, observer: h})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Close() })
	prompt := seqTokens(7, 100_000)
	hold(t, x, register(t, x, "full", 1, 16)[0], prompt, 16, TierGPU)
	hold(t, x, register(t, x, "half", 1, 16)[0], prompt[:50_000], 16, TierGPU)
	hold(t, x, register(t, x, "edge", 1, 16)[0], prompt[:firstWave*16], 16, TierGPU)
	fork := append(append([]uint32{}, prompt[:40_000]...), seqTokens(1<<30, 20_000)...)
	hold(t, x, register(t, x, "fork", 1, 16)[0], fork, 16, TierGPU)
	return x, prompt, h
}

func checkStreamed(t *testing.T, got map[string]int64) {
	t.Helper()
	if got["full"] != 100_000 || got["half"] != 50_000 || got["edge"] != 1024 || got["fork"] != 40_000 || len(got) != 4 {
		t.Fatalf("got %v", got)
	}
}

// streamCaches are the hash caches the streamed lookups are tested with: none, and one so
// large that a prompt's chunks practically never share both their slots.
var streamCaches = []int{0, 1 << 20}

// cachedChunks returns how many of prompt's leading whole chunks (16-token blocks) x's hash
// cache holds, and fails the test if one it holds has other hashes than the prompt's.
func cachedChunks(t *testing.T, x *Index, prompt []uint32) int {
	t.Helper()
	var k chunkKey
	var last hashing.Digest
	var parent *hashing.Digest
	c := 0
	for ; (c+1)*chunkBlocks*16 <= len(prompt); c++ {
		toks := prompt[c*chunkBlocks*16 : (c+1)*chunkBlocks*16]
		k = x.hcache.key(k, 16, toks)
		e := x.hcache.get(k)
		if e == nil {
			break
		}
		var want []int64
		want, last = hashing.AppendChainHashes(nil, parent, toks, 16)
		parent = &last
		if !slices.Equal(e.hashes[:], want) || e.last != last {
			t.Fatalf("the cache's chunk %d has other hashes than the prompt's", c)
		}
	}
	return c
}

// checkCache checks, on an index with a hash cache, that the streamed lookup just done
// missed the cache for each of the first chunks chunks of the prompt and hashed them, that the
// cache holds them now, and that a lookup of the prompt again finds at least its first again
// chunks there (those it needs to find where the held prefix ends).
func checkCache(t *testing.T, x *Index, prompt []uint32, chunks, again int) {
	t.Helper()
	if x.hcache == nil {
		return
	}
	if hits, misses := x.Metrics().HashCacheChunks(); hits != 0 || misses != uint64(chunks) {
		t.Fatalf("the lookup: %d hits, %d misses in the hash cache; want 0, %d", hits, misses, chunks)
	}
	if got := cachedChunks(t, x, prompt); got < chunks {
		t.Fatalf("the cache holds the prompt's first %d chunks, want %d", got, chunks)
	}
	hits0, _ := x.Metrics().HashCacheChunks()
	lookup(t, x, "m", prompt)
	if hits, _ := x.Metrics().HashCacheChunks(); hits-hits0 < uint64(again) {
		t.Fatalf("a second lookup hit %d chunks, want at least %d", hits-hits0, again)
	}
}

// streamHooks is the stream observer of streamFixture's index; a test sets its functions
// before its lookups (nil: nothing).
type streamHooks struct {
	start    func()
	chunk    func(*stream, int)
	sleeps   func()
	woke     func()
	stopped  func()
	computed func(*stream, int)
}

func (h *streamHooks) helperStarted() {
	if h.start != nil {
		h.start()
	}
}

func (h *streamHooks) chunkHashed(st *stream, to int) {
	if h.chunk != nil {
		h.chunk(st, to)
	}
}

func (h *streamHooks) helperSleeps() {
	if h.sleeps != nil {
		h.sleeps()
	}
}

func (h *streamHooks) helperWoke() {
	if h.woke != nil {
		h.woke()
	}
}

func (h *streamHooks) helperStopped() {
	if h.stopped != nil {
		h.stopped()
	}
}

func (h *streamHooks) bodyComputed(st *stream, c int) {
	if h.computed != nil {
		h.computed(st, c)
	}
}

// setHooks sets the functions of h.
func setHooks(h *streamHooks, start func(), chunk func(*stream, int), stopped func()) {
	h.start, h.chunk, h.stopped = start, chunk, stopped
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
	for _, cache := range streamCaches {
		t.Run(fmt.Sprintf("cache=%d", cache), func(t *testing.T) {
			x, prompt, h := streamFixture(t, cache)
			started := make(chan struct{})
			var chunks int
			setHooks(h, func() { close(started) }, func(_ *stream, to int) {
				if chunks++; chunks == 1 {
					awaitSignal(t, started, "the helper") // the helper claims the matching
				}
			}, nil)
			checkStreamed(t, lookup(t, x, "m", prompt))
			if chunks == 0 {
				t.Fatal("the lookup did not stream")
			}
			setHooks(h, nil, nil, nil)
			checkCache(t, x, prompt, len(prompt)/16/chunkBlocks, len(prompt)/16/chunkBlocks)
		})
	}
}

func TestStreamStopsHashingAtPrefixEnd(t *testing.T) {
	for _, cache := range streamCaches {
		t.Run(fmt.Sprintf("cache=%d", cache), func(t *testing.T) {
			x, prompt, h := streamFixture(t, cache)
			// Past 4,000 blocks only "full" holds the prompt: drop it, so that the prefix ends at
			// "half"'s 3,125 blocks, and check that the hashing stops soon after.
			x.RemoveWorker("full")
			started, stopped := make(chan struct{}), make(chan struct{})
			var last int
			chunks := 0
			setHooks(h, func() { close(started) }, func(_ *stream, to int) {
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
			setHooks(h, nil, nil, nil)
			// Every chunk hashed is cached; a second lookup, whose hashing the test does not
			// hold, may stop sooner, but not before the chunk where the prefix ends.
			checkCache(t, x, prompt, last/chunkBlocks, 3125/chunkBlocks)
		})
	}
}

func TestStreamWithdrawsALateHelper(t *testing.T) {
	for _, cache := range streamCaches {
		t.Run(fmt.Sprintf("cache=%d", cache), func(t *testing.T) {
			x, prompt, h := streamFixture(t, cache)
			release := make(chan struct{})
			exited := make(chan struct{}, 4)
			setHooks(h, func() {
				<-release // the helper's core "wakes up" only after the lookup is over
				exited <- struct{}{}
			}, nil, nil)
			checkStreamed(t, lookup(t, x, "m", prompt))
			// The late helper finds itself withdrawn; the next lookups have a stream of their own.
			close(release)
			awaitSignal(t, exited, "the first helper")
			checkCache(t, x, prompt, len(prompt)/16/chunkBlocks, len(prompt)/16/chunkBlocks)
			checkStreamed(t, lookup(t, x, "m", prompt))
			awaitSignal(t, exited, "the second helper")
		})
	}
}

func TestStreamTakesOverFromASleepingHelper(t *testing.T) {
	for _, cache := range streamCaches {
		t.Run(fmt.Sprintf("cache=%d", cache), func(t *testing.T) {
			x, prompt, h := streamFixture(t, cache)
			started, release := make(chan struct{}), make(chan struct{})
			woke, sleeps := make(chan struct{}, 4), make(chan struct{}, 1)
			chunks := 0
			setHooks(h, func() { close(started) }, func(_ *stream, to int) {
				if chunks++; chunks == 1 {
					// The helper runs before the second chunk: it finds too few hashes and sleeps.
					// Wait until it does: a helper whose thread the system holds back until the
					// hashing is past its first wave never sleeps.
					awaitSignal(t, started, "the helper")
					awaitSignal(t, sleeps, "the helper to sleep")
				}
			}, nil)
			h.sleeps = func() {
				select {
				case sleeps <- struct{}{}:
				default:
				}
			}
			h.woke = func() {
				// The helper's core "wakes up" only after the lookup is over.
				<-release
				woke <- struct{}{}
			}
			done := make(chan error, 1)
			var l kv.Lookup
			go func() { done <- x.Lookup(context.Background(), "m", prompt, &l) }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
				if l.Tokens("full") != 100_000 || l.Tokens("fork") != 40_000 || len(l.Matches) != 4 {
					t.Fatalf("got %v", l.Matches)
				}
			case <-time.After(10 * time.Second):
				close(release)
				t.Fatal("the lookup waited for its sleeping helper to wake up")
			}
			close(release)
			awaitSignal(t, woke, "the withdrawn helper")
			setHooks(h, nil, nil, nil)
			h.woke, h.sleeps = nil, nil
			checkCache(t, x, prompt, len(prompt)/16/chunkBlocks, len(prompt)/16/chunkBlocks)
			checkStreamed(t, lookup(t, x, "m", prompt))
		})
	}
}

// A streamed lookup's helper reads the tokens of the chunks ahead of the hashing for their
// hash-cache keys while it waits for hashes, and the lookup goroutine keys those chunks with
// what the helper computed. The test alters one chunk's body after the helper computed it:
// that chunk's entry lands under another key (and the chunks' after it, whose keys chain
// from it), so the cache then holds the prompt's chunks up to that one only.
func TestStreamHelperKeysTheChunksAhead(t *testing.T) {
	x, prompt, h := streamFixture(t, streamCaches[1])
	started, computed := make(chan struct{}), make(chan int, 128)
	altered, chunks := -1, 0
	setHooks(h, func() { close(started) }, func(st *stream, to int) {
		if chunks++; chunks > 1 {
			return
		}
		awaitSignal(t, started, "the helper")
		// The helper finds too few hashes to match and reads ahead: take a chunk it read
		// that the hashing, held here, has yet to key.
		for altered < 0 {
			select {
			case c := <-computed:
				if c > to/chunkBlocks {
					altered = c
					st.bodies[altered] ^= 1
				}
			case <-time.After(10 * time.Second):
				t.Error("timed out waiting for the helper to read ahead")
				return
			}
		}
	}, nil)
	h.computed = func(_ *stream, c int) {
		select {
		case computed <- c:
		default:
		}
	}
	checkStreamed(t, lookup(t, x, "m", prompt))
	if altered < 0 {
		t.FailNow()
	}
	h.computed = nil
	setHooks(h, nil, nil, nil)
	if hits, misses := x.Metrics().HashCacheChunks(); hits != 0 || misses != uint64(len(prompt)/16/chunkBlocks) {
		t.Fatalf("the lookup: %d hits, %d misses in the hash cache; want 0, %d", hits, misses, len(prompt)/16/chunkBlocks)
	}
	if got := cachedChunks(t, x, prompt); got != altered {
		t.Fatalf("the cache holds the prompt's first %d chunks; want %d, the chunk whose body the test altered", got, altered)
	}
}

// The helper reads chunks ahead only while it is ahead: once the hashing passes the chunk it
// would read next (as a prompt whose chunks come from the cache does), it stops and goes back
// to matching. The test holds the helper after its first chunk until the hashing is past the
// next few.
func TestStreamHelperStopsReadingAheadOnceOvertaken(t *testing.T) {
	x, prompt, h := streamFixture(t, streamCaches[1])
	started, first, passed := make(chan struct{}), make(chan int, 1), make(chan struct{})
	var st *stream
	chunks, firstChunk := 0, -1
	setHooks(h, func() { close(started) }, func(s *stream, to int) {
		if chunks++; chunks == 1 {
			st = s
			awaitSignal(t, started, "the helper")
			select {
			case firstChunk = <-first:
			case <-time.After(10 * time.Second):
				t.Error("timed out waiting for the helper to read ahead")
			}
		}
		if firstChunk >= 0 && to/chunkBlocks == firstChunk+4 {
			close(passed) // the hashing is three chunks past the helper's next
		}
	}, nil)
	var held atomic.Bool
	h.computed = func(_ *stream, c int) {
		if !held.Swap(true) {
			first <- c
			awaitSignal(t, passed, "the hashing to pass the helper")
		}
	}
	checkStreamed(t, lookup(t, x, "m", prompt))
	if firstChunk < 0 {
		t.FailNow()
	}
	for c := firstChunk + 1; c <= firstChunk+4; c++ {
		if st.ready[c].Load() {
			t.Errorf("the helper read chunk %d after the hashing passed it", c)
		}
	}
}
