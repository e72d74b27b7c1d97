package index

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// The lookup on two cores, an operator's switch (Config.SplitBlocks, kv.lookup_split_blocks;
// off by default). A long prompt keyed by the router's keys (at least SplitBlocks blocks) is
// offered to the index's twin, a goroutine started with the first long lookup and stopped
// by Close, while the lookup goroutine matches the prompt as it would alone, from the front,
// in chunks of twinChunk blocks that it claims one at a time (twin.claim). When the twin
// starts (a wake-up that takes what the system takes to run a thread on an idle core), it
// cuts the blocks nobody claimed yet in two, at m: it takes the back part, [m, n), and the
// lookup goroutine stops at m. The twin follows every owner of the group from block m,
// where each one's run of held blocks ends, keying the back part itself from the last key
// the lookup goroutine published (twin.keyed): the keys chain. Then an owner that holds the
// whole front part holds m blocks and its run from m; any other, what the front part found
// (joinBack).
//
// The lookup never waits for the twin's wake-up: a twin that has not started when the
// lookup goroutine is done is withdrawn, and one that starts late finds little left to cut
// and takes nothing (twinMinCut). There is one twin per index; a lookup that finds it busy
// matches alone. The hand-off allocates nothing once the twin's buffers have grown.
//
// The trade: on a core otherwise idle the split lowers the lookup's tail; on a busy one the
// twin's wake-up shares or takes the lookup's own core and raises its median
// (docs/benchmarks.md, "The lookup on two cores, an operator switch").
const (
	// MinSplitBlocks is the least Config.SplitBlocks other than 0: a shorter prompt leaves
	// the twin little to cut (twinMinCut) once the lookup goroutine's first chunk is claimed.
	MinSplitBlocks = 1024
	// twinChunk is how many blocks the lookup goroutine claims at a time: how far past the
	// twin's cut it may have gone.
	twinChunk = 256
	// twinMinCut is the least number of unclaimed blocks the twin cuts: with fewer left, the
	// back part would not outweigh its keying and the join.
	twinMinCut = 512
	// twinCut marks twin.claim once the split is decided.
	twinCut = int64(1) << 62
)

// Twin job states.
const (
	twinIdle      int32 = iota // no job
	twinPending                // offered, not yet taken
	twinRunning                // the twin took it
	twinWithdrawn              // the lookup goroutine matched without the twin
)

// twin is an index's second matcher (Config.SplitBlocks).
type twin struct {
	// minBlocks is the least number of blocks a lookup offers the twin (Config.SplitBlocks):
	// shorter prompts are matched on the lookup goroutine, with no hand-off.
	minBlocks int
	// busy is held by a lookup from the offer until it has read the result or withdrawn
	// the job. The job's state tells the twin whether to take it: a wake-up on jobs whose
	// job was withdrawn (the twin's goroutine may run long after it was woken) does nothing,
	// and a later job's wake-up that finds one still queued adds none, the queued one
	// serving it.
	busy  atomic.Bool
	state atomic.Int32
	jobs  chan struct{} // capacity 1: a job may be pending
	done  chan struct{} // capacity 1: the job ran; lo, end and alive are set
	quit  chan struct{}
	ended chan struct{} // closed when the goroutine returns

	// claim is the block up to which the lookup goroutine has claimed the prompt, with
	// twinCut set once no more may be claimed: by the twin, which takes the blocks from
	// there on, or by the lookup goroutine when it is done.
	claim atomic.Int64
	// keyed is how many of the prompt's keys (front) the lookup goroutine has written.
	keyed atomic.Int64

	// The job: the prompt's n blocks over w words; front's elements [0, keyed) may be read.
	front []int64
	w, n  int
	sc    lookupScratch // the back part's: its own keys, alive set and counts
	buf   []int64       // sc.hashes' array
	// The result: where the back part starts (-1: the twin took none), and matchDirect's
	// answer for it.
	lo    int
	end   int
	alive bool

	live    atomic.Bool // started and not closed: a lookup need not lock mu
	mu      sync.Mutex  // start and stop
	started bool
	closed  bool
}

// newTwin returns the twin of an index whose lookups of at least minBlocks blocks it splits.
func newTwin(minBlocks int) *twin {
	return &twin{minBlocks: minBlocks, jobs: make(chan struct{}, 1), done: make(chan struct{}, 1), quit: make(chan struct{}), ended: make(chan struct{})}
}

// acquire reserves the twin for a lookup of n blocks, starting its goroutine the first time.
// It returns false when the lookup should match alone: too short a prompt, the twin busy
// with another lookup, or the index closed.
func (t *twin) acquire(x *Index, n int) bool {
	if t == nil || n < t.minBlocks || !t.busy.CompareAndSwap(false, true) {
		return false
	}
	if t.live.Load() {
		return true // fast path: the goroutine runs
	}
	// Slow path: the first long lookup starts the goroutine; after Close, none does.
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		t.busy.Store(false)
		return false
	}
	if !t.started {
		t.started = true
		t.live.Store(true)
		go t.run(x)
	}
	return true
}

// stop ends the twin's goroutine, if it started, and waits for it. A job offered before is
// either run or left pending, which its lookup then withdraws.
func (t *twin) stop() {
	if t == nil {
		return
	}
	t.mu.Lock()
	started := t.started && !t.closed
	t.closed = true
	t.live.Store(false)
	t.mu.Unlock()
	if started {
		close(t.quit)
		<-t.ended
	}
}

// run is the twin's goroutine.
func (t *twin) run(x *Index) {
	defer close(t.ended)
	for {
		select {
		case <-t.quit:
			return
		case <-t.jobs:
		}
		if !t.state.CompareAndSwap(twinPending, twinRunning) {
			continue // withdrawn, or served by an earlier wake-up: not ours to touch
		}
		t.runJob(x)
		t.done <- struct{}{}
	}
}

// runJob cuts the unclaimed blocks and matches the back part. A panic leaves the back part
// unmatched: the lookup asks the shards' host about it (joinBack, end lo, every owner alive).
func (t *twin) runJob(x *Index) {
	t.lo = -1
	defer func() {
		if recover() != nil {
			t.end, t.alive = t.lo, true
			fillAlive(t.sc.alive, len(t.sc.count))
		}
	}()
	var m int
	for {
		v := t.claim.Load()
		if v&twinCut != 0 || t.n-int(v) < twinMinCut {
			return // the lookup goroutine is done, or nearly
		}
		m = int(v) + (t.n-int(v))/2&^(pipeBatch-1)
		if t.claim.CompareAndSwap(v, int64(m)|twinCut) {
			break
		}
	}
	t.matchBack(x, m)
}

// matchBack matches the back part, [m, n), keying it from the last key published before m.
func (t *twin) matchBack(x *Index, m int) {
	t.lo = m
	k := min(int(t.keyed.Load()), m) // ≥ 1: block 0 is keyed before the offer
	ts := &t.sc
	ts.hashes, ts.hashed, ts.lastKey = t.buf[:k], k, t.front[k-1]
	t.end, t.alive = x.matchDirect(ts, t.w, m, t.n, true)
}

// matchTwin matches blocks [1, n) of sc's prompt, keyed by the router's keys, block 0 being
// matched and keyed, with the twin (acquired). It returns what matchDirect does for them,
// with sc's alive set and counts as after it; sc's keys are complete up to end when end < n.
func (x *Index) matchTwin(t *twin, sc *lookupScratch, w, n int) (end int, alive bool) {
	sc.reserveHashes(n)
	t.offer(sc, w, n)
	c, stop := 1, n // blocks [1, c) are matched; the front part ends at stop
	end, alive = 1, true
	for c < stop {
		e := min(stop, c+twinChunk)
		if v := t.claim.Load(); v&twinCut != 0 {
			stop, e = int(v&^twinCut), int(v&^twinCut) // the twin took [stop, n)
		} else if !t.claim.CompareAndSwap(v, int64(e)) {
			continue // cut meanwhile
		}
		end, alive = x.matchDirect(sc, w, c, e, true)
		t.keyed.Store(int64(sc.hashed))
		if !alive || end < e {
			break // the prefix ends here, or the rest is left to the host
		}
		c = e
	}
	for stop == n { // done: keep the twin from cutting now
		v := t.claim.Load()
		if v&twinCut != 0 {
			stop = int(v &^ twinCut)
		} else if t.claim.CompareAndSwap(v, v|twinCut) {
			break
		}
	}
	if t.state.CompareAndSwap(twinPending, twinWithdrawn) {
		t.release()
		return end, alive
	}
	<-t.done
	if t.lo >= 0 {
		end, alive = sc.joinBack(&t.sc, end, alive, t.lo, t.end, t.alive)
	}
	t.release()
	return end, alive
}

// offer hands the twin the job of sc's prompt of n blocks over w words and wakes it.
func (t *twin) offer(sc *lookupScratch, w, n int) {
	ts := &t.sc
	ts.tokens, ts.blockSize, ts.keys, ts.cache = sc.tokens, sc.blockSize, sc.keys, nil
	ts.bits, ts.asked = sc.bits, sc.asked
	ts.startSets(len(sc.count), w)
	if cap(t.buf) < n {
		t.buf = make([]int64, n)
	}
	t.front, t.w, t.n = sc.hashes[:n], w, n
	t.claim.Store(1)
	t.keyed.Store(int64(sc.hashed))
	t.state.Store(twinPending)
	select {
	case t.jobs <- struct{}{}:
	default: // a wake-up is queued already
	}
}

// release frees the twin for the next lookup, dropping its references to this one's prompt.
func (t *twin) release() {
	t.sc.tokens, t.sc.hashes, t.front = nil, nil, nil
	t.busy.Store(false)
}

// fillAlive sets the first k bits of alive, the rest clear.
func fillAlive(alive []uint64, k int) {
	for i := range alive {
		alive[i] = 0
		if n := min(64, k-64*i); n > 0 {
			alive[i] = ^uint64(0) >> (64 - n)
		}
	}
}

// joinBack joins the front part's match (blocks [1, m): frontEnd and frontAlive, as
// matchDirect returned them, in sc) and the back part's (blocks [m, n): backEnd and
// backAlive, in ts) into what matchDirect over [1, n) returns. The owners alive after the
// front part that do not hold the back part's run to backEnd drop out where their run from
// m ends. A front part that ended early (nobody left, or a block left to the host) is the
// answer, the back part's work unused. When the back part left blocks from backEnd to the
// host, sc's keys are completed up to ts's.
func (sc *lookupScratch) joinBack(ts *lookupScratch, frontEnd int, frontAlive bool, m, backEnd int, backAlive bool) (end int, alive bool) {
	if !frontAlive || frontEnd < m {
		return frontEnd, frontAlive
	}
	var any uint64
	for k, a := range sc.alive {
		na := a & ts.alive[k]
		for d := a &^ na; d != 0; d &= d - 1 {
			b := k*64 + bits.TrailingZeros64(d)
			sc.count[b] = ts.count[b]
		}
		sc.alive[k] = na
		any |= na
	}
	if any == 0 {
		return backEnd, false
	}
	return backEnd, backAlive // sc's chain, keyed past m, goes on from where it is
}
