package index

import (
	"context"
	"sync/atomic"
)

// A long cached prompt is streamed: the lookup goroutine hashes the rest of the prompt while
// a helper goroutine matches the blocks already hashed. The SHA-256 chain is sequential and,
// in 16-token blocks, costs about twice as much as matching, so with a second core the lookup
// takes about as long as the hashing alone.
//
// The roles follow the scheduler. A new goroutine waits for an idle core to wake up and take
// it (long on a virtual machine whose cores are busy; docs/benchmarks.md), so the lookup
// goroutine, already running, does the work that cannot wait (the chain), and the helper
// catches up once it runs, matching being faster. The helper reads the shards' tables
// itself (Index.matchDirect), on the second core. It sleeps while it waits for hashes, never spins: the
// system may put its thread on the hashing core, where a spin would steal the chain's time.
// If the hashing ends before the helper has started, or while it sleeps waiting for hashes,
// the lookup goroutine withdraws it and matches the rest itself: the lookup then waits for
// no wake-up of the helper (a sleeping helper woken for the last hashes would take one
// wake-up to run and the lookup goroutine another to learn it is done).
const (
	// streamMinBlocks is how many blocks must remain after the first wave for a lookup to
	// stream: their hashing outlasts the helper's wake-up.
	streamMinBlocks = 1024
	// streamChunk is how many blocks the lookup goroutine hashes between progress reports.
	streamChunk = 64
	// streamWave is the least the helper asks the shards about at once (unless the hashing
	// is over), and streamMaxWave the most: the helper keeps close behind the hashing, so
	// the wave left after it is short. Each wave may wake the helper; when the system runs
	// it on the hashing core, fewer wake-ups cost less (512 against 256 lowers the p99 of a
	// 100k-token lookup; docs/benchmarks.md).
	streamWave    = 512
	streamMaxWave = 1024
)

// Helper states.
const (
	helperPending   int32 = iota // started, not yet running
	helperRunning                // matching
	helperSleeping               // waiting for hashes; blocks [0, matched) are matched
	helperWithdrawn              // the lookup goroutine matches instead
)

// stream is the state a streamed lookup shares with its helper.
type stream struct {
	hashed   atomic.Int64 // blocks hashed: hashes[:hashed] may be read
	stop     atomic.Bool  // the helper found the prefix's end: stop hashing
	state    atomic.Int32
	matched  atomic.Int64  // while the helper sleeps: the blocks it matched
	want     atomic.Int64  // the block count the helper sleeps for, 0 if it does not
	wake     chan struct{} // capacity 1: hashed reached want
	finished chan struct{} // capacity 1: the helper is done; err is set
	err      error

	// With a hash cache, the helper computes, while it waits for hashes, the bodies
	// (hashCache.body) of the chunks the hashing has yet to reach: the lookup goroutine keys
	// chunk c from bodies[c] once ready[c] is set, without reading its tokens (a chunk's body
	// is a tenth of its SHA-256 chain in 16-token blocks). bodyNext is the helper's: the
	// first chunk whose body it has not computed.
	bodies   []uint64
	ready    []atomic.Bool
	bodyNext int

	// The helper's arguments, set before it starts: the lookup's context, scratch, owner
	// words and blocks [lo, n) to match. run starts it (x.streamHelper(st)): made once with
	// the stream, so that starting a helper allocates nothing.
	ctx      context.Context
	sc       *lookupScratch
	w, lo, n int
	run      func()
	// users is how many of the lookup goroutine and its helper still use the stream; the
	// last to let go (releaseStream) returns it to the index's pool. A withdrawn helper may
	// look at the stream after its lookup is over, so neither side pools it alone.
	users atomic.Int32
}

// getStream returns a pooled stream, or a new one.
func (x *Index) getStream() *stream {
	if st, _ := x.streams.Get().(*stream); st != nil {
		return st
	}
	st := &stream{wake: make(chan struct{}, 1), finished: make(chan struct{}, 1)}
	st.run = func() { x.streamHelper(st) }
	return st
}

// releaseStream lets go of st for one of its users; the last returns it to the pool.
func (x *Index) releaseStream(st *stream) {
	if st.users.Add(-1) != 0 {
		return
	}
	st.ctx, st.sc = nil, nil // do not retain the lookup
	x.streams.Put(st)
}

// matchStream matches blocks [lo, n) of sc's prompt, blocks [0, sc.hashed) being hashed and
// blocks [0, lo) matched (see the comment above streamMinBlocks).
func (x *Index) matchStream(ctx context.Context, sc *lookupScratch, w, lo, n int) error {
	sc.reserveHashes(n)
	hashes := sc.hashes[:n]
	sc.hashes = hashes
	st := x.getStream()
	st.hashed.Store(int64(sc.hashed))
	st.stop.Store(false)
	st.state.Store(helperPending)
	st.want.Store(0)
	select { // a stale wake-up from the previous lookup
	case <-st.wake:
	default:
	}
	st.err = nil
	st.bodyNext = 0
	st.bodies, st.ready = st.bodies[:0], st.ready[:0]
	if sc.cache != nil && sc.keyed {
		chunks := len(sc.tokens) / sc.blockSize / chunkBlocks
		if cap(st.ready) < chunks {
			st.bodies, st.ready = make([]uint64, chunks), make([]atomic.Bool, chunks)
		}
		st.bodies, st.ready = st.bodies[:chunks], st.ready[:chunks]
		for i := range st.ready {
			st.ready[i].Store(false)
		}
		sc.ahead = st
	}
	st.ctx, st.sc, st.w, st.lo, st.n = ctx, sc, w, lo, n
	st.users.Store(2)
	go st.run()

	for from := sc.hashed; from < n && !st.stop.Load(); from += streamChunk {
		to := min(n, from+streamChunk)
		sc.hashInto(hashes[from:from], to) // within capacity: in place
		st.hashed.Store(int64(to))
		if x.obs != nil {
			x.obs.chunkHashed(st, to)
		}
		if w := st.want.Load(); w != 0 && int64(to) >= w && st.want.CompareAndSwap(w, 0) {
			select {
			case st.wake <- struct{}{}:
			default:
			}
		}
	}
	sc.ahead = nil // the chain is hashed
	withdrawn := st.state.CompareAndSwap(helperPending, helperWithdrawn)
	if !withdrawn && st.state.CompareAndSwap(helperSleeping, helperWithdrawn) {
		// The helper wrote sc last before it went to sleep. Wake it to exit.
		withdrawn, lo = true, int(st.matched.Load())
		select {
		case st.wake <- struct{}{}:
		default:
		}
	}
	if withdrawn {
		// The helper may still be about to look at st: it returns st to the pool if it is
		// the last to let go.
		x.releaseStream(st)
		for size := streamMaxWave; lo < n; lo += size {
			if alive, err := x.matchWave(ctx, sc, w, lo, min(n, lo+size)); err != nil || !alive {
				return err
			}
		}
		sc.holdAll(n)
		return nil
	}
	// The helper runs: its shard queries are bounded by ctx, so it finishes.
	<-st.finished
	err := st.err
	x.releaseStream(st)
	return err
}

// streamHelper is the helper goroutine of a streamed lookup: it matches st's hashed blocks
// from st.lo in waves, and tells the hashing to stop when the prefix ends.
func (x *Index) streamHelper(st *stream) {
	defer x.releaseStream(st)
	ctx, sc, w, lo, n := st.ctx, st.sc, st.w, st.lo, st.n
	if x.obs != nil {
		x.obs.helperStarted()
	}
	if !st.state.CompareAndSwap(helperPending, helperRunning) {
		return // withdrawn: the lookup goroutine matched without us
	}
	var err error
	alive := true
	for lo < n {
		// Sleep until a wave's worth is hashed (or all of it). Not a spin: the system may
		// run this goroutine's thread on the hashing core.
		need := int64(min(n, lo+streamWave))
		for err == nil && st.hashed.Load() < need {
			x.bodiesAhead(st, sc)
			// Sleep: from here until the helper is running again, the lookup goroutine may
			// withdraw it and match from lo itself.
			st.matched.Store(int64(lo))
			st.state.Store(helperSleeping)
			st.want.Store(need)
			if x.obs != nil {
				x.obs.helperSleeps()
			}
			if st.hashed.Load() < need { // else hashed before want was visible
				select {
				case <-st.wake:
				case <-ctx.Done():
					err = ctx.Err()
				}
			}
			st.want.Store(0)
			if x.obs != nil {
				x.obs.helperWoke()
			}
			if !st.state.CompareAndSwap(helperSleeping, helperRunning) {
				return // withdrawn: sc and st belong to the lookup goroutine now
			}
		}
		hi := min(int(st.hashed.Load()), lo+streamMaxWave)
		if err != nil {
			break
		}
		if alive, err = x.matchWave(ctx, sc, w, lo, hi); err != nil || !alive {
			break
		}
		lo = hi
	}
	if alive && err == nil {
		sc.holdAll(n)
	}
	st.stop.Store(true)
	if x.obs != nil {
		x.obs.helperStopped()
	}
	st.err = err
	st.finished <- struct{}{}
}

// aheadChunks is how many chunks past the one being hashed the helper computes the bodies of:
// two of its largest waves, so that the hashing does not catch up between its sleeps.
const aheadChunks = 2 * streamMaxWave / chunkBlocks

// bodiesAhead computes the bodies of the chunks up to aheadChunks past the one being hashed
// (see stream.bodies). The helper calls it when it has nothing to match.
func (x *Index) bodiesAhead(st *stream, sc *lookupScratch) {
	if len(st.ready) == 0 {
		return
	}
	bs := sc.blockSize
	next := int(st.hashed.Load())/chunkBlocks + 1 // the chunk being hashed is keyed already
	c := max(st.bodyNext, next)
	end := min(next+aheadChunks, len(st.ready))
	for ; c < end; c++ {
		if int(st.hashed.Load())/chunkBlocks >= c {
			break // the hashing caught up (its chunks came from the cache): back to matching
		}
		st.bodies[c] = sc.cache.body(sc.tokens[c*chunkBlocks*bs : (c+1)*chunkBlocks*bs])
		st.ready[c].Store(true)
		if x.obs != nil {
			x.obs.bodyComputed(st, c)
		}
	}
	st.bodyNext = c
}

// streamObserver sees a streamed lookup's progress: helperStarted runs first in a streamed
// lookup's helper, chunkHashed after each chunk the lookup goroutine hashes (to: blocks
// hashed so far), helperSleeps each time the helper is about to sleep for hashes (the
// lookup goroutine may withdraw it from then on), helperWoke each time it is done sleeping
// (before it checks whether it was withdrawn meanwhile), helperStopped once the helper has told the
// hashing to stop, bodyComputed each time the helper computed the body of a chunk c ahead of
// the hashing. It is a seam for tests (Config.observer), nil otherwise.
type streamObserver interface {
	helperStarted()
	chunkHashed(st *stream, to int)
	helperSleeps()
	helperWoke()
	helperStopped()
	bodyComputed(st *stream, c int)
}
