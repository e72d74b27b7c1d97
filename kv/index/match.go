package index

import (
	"math/bits"
	"sync/atomic"
	"unsafe"
)

// The lookup's direct matcher reads a run of the prompt's blocks in prompt order, across
// shards, on the lookup goroutine, as a software pipeline over batches of pipeBatch blocks:
// while it resolves batch k (each block's owners, folded into the set of owners still
// holding the whole prefix), it has already found batch k+1 (their table slots read, the
// first lines of their owner runs requested) and requested the table lines of batch k+2.
// Each block waits for two dependent cache misses (its table line, then its owner run); in
// the pipeline those of the batches ahead are in flight while the current one is resolved,
// across shards and waves. The loads of a batch are issued together, so that their misses
// overlap one another too. Shard.match, which answers a ShardQuery per shard, is the slow
// path: a block whose stripe kept changing under the read leaves the rest of the run to the
// shards' host.
const (
	// pipeBatch is how many blocks a stage of the pipeline handles at once.
	pipeBatch = 16
	// pipeRing is the ring of blocks in flight: three batches, rounded up to a power of two.
	pipeRing = 4 * pipeBatch
	// keyAhead is how many blocks the matcher keys at once when it keys the prompt as it
	// goes (router keys): a prompt held for one block costs this many keys, not its length.
	keyAhead = 64
)

// pipeBlock is a block in the matcher's pipeline.
type pipeBlock struct {
	h     int64
	v     *shardView // its shard's view, loaded after seq0
	seq0  uint64     // its stripe's sequence before the read
	m     meta
	idx   uint32
	shard uint32
	found bool // resident, at slot idx with meta m
	whole bool // find's probe ended (else the block is read again alone)
}

// pipeline is the direct matcher's state, kept with a lookup's scratch.
type pipeline struct {
	ring   [pipeRing]pipeBlock
	touch  int64                     // sums the loads nobody waits for, so that they are not optimised away
	probes []uint32                  // blocks resolved per shard
	set    []uint64                  // a block's owner set, for queries of more than two words
	addrs  [pipeBatch]unsafe.Pointer // lines to prefetch
}

// matchDirect matches blocks [lo, hi) of sc's prompt on this goroutine, folding each into
// sc.alive and sc.count in prompt order; sc.hashes holds at least [lo, hi), unless keyed, in
// which case the matcher keys the prompt (sc.hashInto) as it goes, keyAhead blocks at a time.
// It returns alive false when no owner holds the prefix through some block, and end < hi
// when block end could not be read beside its shard's writer (maxReadTries reads): blocks
// [lo, end) are matched and the caller asks the host about the rest.
func (x *Index) matchDirect(sc *lookupScratch, w, lo, hi int, keyed bool) (end int, alive bool) {
	pl := &sc.pipe
	if cap(pl.probes) < len(x.shards) {
		pl.probes = make([]uint32, len(x.shards))
	}
	if cap(pl.set) < w {
		pl.set = make([]uint64, w)
	}
	probes, set := pl.probes[:len(x.shards)], pl.set[:w]
	clear(probes)
	bitsOf, asked := sc.bits, sc.asked
	// The first two words of the alive set are kept in registers.
	var a0, a1 uint64
	a0 = sc.alive[0]
	if w > 1 {
		a1 = sc.alive[1]
	}
	end, alive = hi, true
	pl.request(x, sc, lo, min(hi, lo+pipeBatch), keyed)
	pl.request(x, sc, lo+pipeBatch, min(hi, lo+2*pipeBatch), keyed)
	pl.find(lo, min(hi, lo+pipeBatch))
resolve:
	for base := lo; base < hi; base += pipeBatch {
		pl.request(x, sc, base+2*pipeBatch, min(hi, base+3*pipeBatch), keyed)
		pl.find(base+pipeBatch, min(hi, base+2*pipeBatch))
		for p := base; p < min(hi, base+pipeBatch); p++ {
			b := &pl.ring[p&(pipeRing-1)]
			s := x.shards[b.shard]
			probes[b.shard]++
			// Fast path: the owners read with the block, kept if no write of its stripe
			// overlapped the read.
			var lo2, hi2 uint64 // the set's first two words
			ok := b.whole
			if b.found && w <= 2 {
				if !b.m.multi() {
					lo2, hi2 = asked.bits1(uint64(b.m))
				} else if off, n := b.m.run(); int(off)+int(n) <= len(b.v.arena) {
					lo2, hi2 = asked.bits2(b.v.arena[off : off+n])
				} else {
					ok = false
				}
			} else if w > 2 {
				clear(set)
				ok = (!b.found || asked.set(b.v, b.m, set)) && b.whole
			}
			if !ok || b.seq0&1 != 0 || s.seqs.of(b.h).Load() != b.seq0 {
				// Slow path: the block changed under the read; read it alone again.
				if _, ok = s.readBlock(b.h, bitsOf, set); !ok {
					s.fallbacks.Add(1)
					end = p
					break resolve
				}
				if w <= 2 {
					lo2 = set[0]
					if w == 2 {
						hi2 = set[1]
					}
				}
			} else if b.found && b.m.age() != ageMatched {
				bump(b.v, b.idx, b.m)
			}
			if w <= 2 {
				n0, n1 := a0&lo2, a1&hi2
				for d := a0 &^ n0; d != 0; d &= d - 1 {
					sc.count[bits.TrailingZeros64(d)] = uint32(p)
				}
				for d := a1 &^ n1; d != 0; d &= d - 1 {
					sc.count[64+bits.TrailingZeros64(d)] = uint32(p)
				}
				a0, a1 = n0, n1
				if a0|a1 == 0 {
					end, alive = p+1, false // nobody holds the prefix through block p
					break resolve
				}
			} else if sc.drop(p, set) == 0 {
				end, alive = p+1, false
				break resolve
			}
		}
	}
	if w <= 2 {
		sc.alive[0] = a0
		if w == 2 {
			sc.alive[1] = a1
		}
	}
	for i, n := range probes {
		if n > 0 {
			x.shards[i].queries.Add(1)
			x.shards[i].probes.Add(uint64(n))
		}
	}
	sc.sink = pl.touch
	return end, alive
}

// request is the first stage for blocks [from, to): each block's stripe sequence, then its
// shard's view, then a load of its table line, whose result nobody waits for. keyed: key the
// prompt up to them first.
func (pl *pipeline) request(x *Index, sc *lookupScratch, from, to int, keyed bool) {
	if from >= to {
		return
	}
	if keyed && to > sc.hashed {
		sc.hashes = sc.hashInto(sc.hashes, min(x.keyEnd(sc), from+keyAhead))
	}
	n := 0
	for q := from; q < to; q++ {
		b := &pl.ring[q&(pipeRing-1)]
		h := sc.hashes[q]
		i := x.shardOf(h)
		s := x.shards[i]
		b.h, b.shard = h, uint32(i)
		b.seq0 = s.seqs.of(h).Load()
		v := s.view.Load()
		b.v = v
		pl.addrs[n] = unsafe.Pointer(&v.slots[v.home(h)])
		n++
	}
	pl.touch += int64(prefetch(&pl.addrs, n))
}

// find is the second stage for blocks [from, to): each block's slot, from the line requested
// a batch earlier, and a load of its owner run's first line.
func (pl *pipeline) find(from, to int) {
	n := 0
	for q := from; q < to; q++ {
		b := &pl.ring[q&(pipeRing-1)]
		b.idx, b.m, b.found, b.whole = b.v.find(b.h)
		if off, _ := b.m.run(); b.found && b.m.multi() && int(off) < len(b.v.arena) {
			pl.addrs[n] = unsafe.Pointer(&b.v.arena[off])
			n++
		}
	}
	pl.touch += int64(prefetch(&pl.addrs, n))
}

// drop folds block p's owner set into sc.alive: the owners alive that do not hold it hold p
// leading blocks. It returns the union of the owners still alive.
func (sc *lookupScratch) drop(p int, set []uint64) (any uint64) {
	for k, a := range sc.alive {
		na := a & set[k]
		for d := a &^ na; d != 0; d &= d - 1 {
			sc.count[k*64+bits.TrailingZeros64(d)] = uint32(p)
		}
		sc.alive[k] = na
		any |= na
	}
	return any
}

// keyEnd is the number of blocks of sc's prompt.
func (x *Index) keyEnd(sc *lookupScratch) int {
	return (len(sc.tokens) + sc.blockSize - 1) / sc.blockSize
}

// askTable is a lookup's table of the owners it asks about, by owner ID: for an owner of
// the block-size group being matched, its ID and bit number with its epoch as of the
// group's match's start (askEntry; lookupScratch.ask), so that judging a record of a
// block's owners takes one load of its entry; the zero entry for every other owner, but for
// askTable[0], which names no owner ID (askNone), so that no record matches it.
//
// A record is judged against the owner's epoch at the start of the group, not the live one
// (Owners.Valid): a clear that lands during the lookup is not seen by it, as it is not seen
// by a lookup that returns just before it. A lookup is not linearizable with writes anyway:
// it reads each block at a different moment, and its result names the workers of the owner
// snapshot it started with. The shards' host (Shard.match, and the read of a block alone
// after a racing write, readBlock) still judges records live, as they ask by ShardQuery.Bits.
type askTable []askEntry

// askEntry is an owner's entry in an askTable: key, its askRef, and its bit in the form the
// query's width folds fastest: for a query of at most two words, the two words of the owner's
// bit (one of them 0), so that a record folds into a block's set with two ORs (bits2); for a
// wider one, the bit's mask in its word and the word's index (set). 24 bytes an owner ID: a
// shift to pick the word costs the matcher more than the wider table.
type askEntry struct {
	key  uint64
	bits [2]uint64
}

// setAsked makes o the owner of bit, at epoch, in t, for a query of words words. (It and
// unask write the entry's words one by one: a copy of a whole entry goes through the stack in
// overlapping 16-byte moves, whose loads wait on a store they cannot be forwarded from.)
func (t askTable) setAsked(o OwnerID, epoch uint32, bit, words int) {
	e := &t[o]
	e.key = askRef(o, epoch, bit)
	mask := uint64(1) << (bit & 63)
	switch {
	case words > 2:
		e.bits[0], e.bits[1] = mask, uint64(bit>>6)
	case bit < 64:
		e.bits[0], e.bits[1] = mask, 0
	default:
		e.bits[0], e.bits[1] = 0, mask
	}
}

// unask gives o the zero entry again.
func (t askTable) unask(o OwnerID) {
	e := &t[o]
	e.key, e.bits[0], e.bits[1] = 0, 0, 0
}

// askNone is askTable[0]'s key: owner field 0xffff, so that a record of owner 0 (none is
// stored) never matches it.
const askNone = uint64(0xffff) << 32

// askRef is the entry of owner o, asked about as bit, at epoch: laid out as a record
// (packSlot) over its epoch and owner fields, bits 0-47, with the bit number in bits 48-63.
func askRef(o OwnerID, epoch uint32, bit int) uint64 {
	return uint64(epoch) | uint64(o)<<32 | uint64(bit)<<48
}

// bits1 is bits2 of one record.
func (t askTable) bits1(v uint64) (lo, hi uint64) {
	if o := uint16(v >> 32); int(o) < len(t) {
		if e := &t[o]; (v^e.key)<<16 == 0 {
			return e.bits[0], e.bits[1]
		}
	}
	return 0, 0
}

// bits2 is the set of the owners asked about holding run, for a query of at most two words
// (128 owners), as its low and high word. It accumulates in registers: a block every engine
// holds sets a bit per owner, and a read-modify-write of memory per owner would chain on
// store forwarding.
func (t askTable) bits2(run []uint64) (lo, hi uint64) {
	for i := range run {
		v := atomic.LoadUint64(&run[i])
		if o := uint16(v >> 32); int(o) < len(t) {
			if e := &t[o]; (v^e.key)<<16 == 0 {
				lo |= e.bits[0]
				hi |= e.bits[1]
			}
		}
	}
	return lo, hi
}

// set sets in set the owners asked about holding the resident block read as m, for a query of
// more than two words (len(set)); false when m names a run the view cannot hold (a read
// racing the writer).
func (t askTable) set(v *shardView, m meta, set []uint64) bool {
	if !m.multi() {
		t.setOne(uint64(m), set)
		return true
	}
	off, n := m.run()
	if int(off)+int(n) > len(v.arena) {
		return false
	}
	run := v.arena[off : off+n]
	for i := range run {
		t.setOne(atomic.LoadUint64(&run[i]), set)
	}
	return true
}

// setOne is set for one record v.
func (t askTable) setOne(v uint64, set []uint64) {
	if o := uint16(v >> 32); int(o) < len(t) {
		if e := &t[o]; (v^e.key)<<16 == 0 && e.bits[1] < uint64(len(set)) {
			set[e.bits[1]] |= e.bits[0]
		}
	}
}
