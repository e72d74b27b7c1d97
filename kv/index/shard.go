package index

import (
	"math/bits"
	"runtime"
	"sync/atomic"
	"unsafe"

	"switchyard/kv"
)

// ShardOp is one block operation for a shard: store a block for an owner in some tiers, or
// remove it from some tiers. Epoch is the owner's epoch when the event was ingested; an op
// whose owner was cleared since is dropped when applied, so a clear always wins over the
// events published before it. It is 16 bytes: a batch of 16 operations is four cache lines,
// which the writer fills on one core and the shard reads on another.
type ShardOp struct {
	Hash  int64
	Epoch uint32
	// Owner is an OwnerID, all of which are below MaxOwners; 0 (never a valid owner) stands
	// for an ID out of range, whose operations the shard counts as stale.
	Owner  uint16
	Tiers  Tiers
	Remove bool
}

// opOwner is o as a ShardOp's Owner: 0 when out of range.
func opOwner(o OwnerID) uint16 {
	if o >= MaxOwners {
		return 0
	}
	return uint16(o)
}

// ShardBatch is a list of operations for one shard. The sender fills it and hands it over;
// the shard's host calls Done once it is applied.
type ShardBatch struct {
	Ops  []ShardOp
	done func(*ShardBatch)
}

// Done returns the batch to its pool; the batch must not be used afterwards.
func (b *ShardBatch) Done() {
	if b.done != nil {
		b.done(b)
	}
}

// ShardQuery asks one shard which of some owners hold some blocks of a prompt. Owners are
// numbered for the query: Bits[o] is 1 + owner o's bit, 0 for an owner the query does not
// ask about (Bits is shared by the shards of one lookup and only read). Hash lists blocks in
// prompt order. For Hash[i] the shard writes the set of asked owners currently holding it, in
// any tier, as Words 64-bit words at Sets[i*Words:], up to the first block no asked owner
// holds: every prefix ends there, so the blocks after it are not looked up and their sets
// are empty.
type ShardQuery struct {
	Hash  []int64
	Bits  []uint16
	Words int
	Sets  []uint64

	sink int64 // keeps the read-ahead loads of a match from being optimised away
}

// reset empties q for reuse.
func (q *ShardQuery) reset() {
	q.Hash, q.Sets = q.Hash[:0], q.Sets[:0]
}

// ShardStats are a shard's counters. Counters only grow; Blocks, Spilled and SpillCap are
// current.
type ShardStats struct {
	// Blocks is the number of resident blocks.
	Blocks int64
	// Spilled is the number of extra owner records (blocks held by more than one owner).
	Spilled int64
	// SpillCap is the capacity, in records, of the runs of blocks with several owners.
	SpillCap int64
	// TableSlots is the capacity of the block table (resident blocks use at most 70%).
	TableSlots int64
	// ArenaSlots is the capacity, in records, of the arena the owner runs live in.
	ArenaSlots int64
	// Stored and Removed count applied store and remove operations.
	Stored, Removed uint64
	// Stale counts operations dropped because their owner was cleared after ingest.
	Stale uint64
	// Evicted counts blocks evicted by the memory bound.
	Evicted uint64
	// Pruned counts stale owner records reclaimed by sweeps.
	Pruned uint64
	// Queries and Probes count match requests and the block lookups they made.
	Queries, Probes uint64
	// Fallbacks counts the blocks a lookup could not read consistently beside the writer
	// (maxReadTries reads), whose queries it left to the shard's owner.
	Fallbacks uint64
}

// Flags of an entry, in the flags byte of its meta word: entryLive marks a live entry,
// entryMulti one whose owners are in a run; the CLOCK age is the ageMask bits from ageShift.
const (
	entryLive  uint8 = 1
	ageShift         = 1
	ageMask    uint8 = 3 << ageShift
	entryMulti uint8 = 1 << 3
)

// CLOCK ages: a new block starts young, a stored block is bumped, a matched one (a request
// used it) gets the oldest-surviving age; the hand decrements ages and evicts at zero. Matched
// blocks thus outlive blocks that were only stored.
const (
	ageInserted = 1
	ageStored   = 2
	ageMatched  = 3
)

// slot is one owner of a block. Owner IDs below MaxOwners (1<<16) fit 16 bits: an operation
// of a larger ID is invalid and never stored. In an owner run it is packed in a uint64
// (packSlot).
type slot struct {
	epoch uint32
	owner uint16
	tiers Tiers
}

func (sl slot) ownerID() OwnerID { return OwnerID(sl.owner) }

func packSlot(sl slot) uint64 { return uint64(sl.epoch) | uint64(sl.owner)<<32 | uint64(sl.tiers)<<48 }

func unpackSlot(v uint64) slot { return slot{uint32(v), uint16(v >> 32), Tiers(v >> 48)} }

// entry is one resident block, 16 bytes, so that a table slot never straddles two cache
// lines and four share one: the block hash and a meta word. A block with one owner (most)
// holds it inline in the meta word; a block with several holds them all in a run of
// Shard.arena, and the meta word holds the run's offset and length, so that a reader of the
// block waits for two cache misses (its table line, then its run), not three. An entry with
// no owner is deleted at once, so a live entry always has an owner. Both words are accessed
// with sync/atomic (readers probe beside the writer; see blockTable).
type entry struct {
	hash int64
	meta uint64
}

func (e *entry) key() int64      { return atomic.LoadInt64(&e.hash) }
func (e *entry) setKey(h int64)  { atomic.StoreInt64(&e.hash, h) }
func (e *entry) load() meta      { return meta(atomic.LoadUint64(&e.meta)) }
func (e *entry) put(m meta)      { atomic.StoreUint64(&e.meta, uint64(m)) }
func (e *entry) cas(old, m meta) { atomic.CompareAndSwapUint64(&e.meta, uint64(old), uint64(m)) }

// meta is an entry's meta word. Bits 56-63 are flags (entryLive, entryMulti, the CLOCK
// age); 0 is an empty slot. A block with one owner (entryMulti clear) has bits 0-31 its
// epoch, bits 32-47 the owner (never 0) and bits 48-55 its tiers; a block with several has
// bits 0-31 the offset in Shard.arena of their run and bits 32-55 its length (2 to
// MaxOwners records). A run of n records has room for 1<<runClass(n).
type meta uint64

func newMeta(ref uint32, owner uint16, tiers Tiers, flags uint8) meta {
	return meta(uint64(ref) | uint64(owner)<<32 | uint64(tiers)<<48 | uint64(flags&^entryMulti)<<56)
}

func (m meta) ref() uint32  { return uint32(m) }
func (m meta) flags() uint8 { return uint8(m >> 56) }
func (m meta) live() bool   { return m.flags()&entryLive != 0 }

// multi reports whether the owners are in a run.
func (m meta) multi() bool { return m.flags()&entryMulti != 0 }

// run is the owners' run: arena[off:off+n] (multi only).
func (m meta) run() (off, n uint32) { return uint32(m), uint32(m>>32) & (1<<24 - 1) }

// single is the owner when there is only one.
func (m meta) single() slot { return slot{uint32(m), uint16(m >> 32), Tiers(m >> 48)} }

func (m meta) withSingle(sl slot) meta { return newMeta(sl.epoch, sl.owner, sl.tiers, m.flags()) }

// withRun names the owners' run arena[off:off+n], n from 2 to MaxOwners.
func (m meta) withRun(off, n uint32) meta {
	return meta(uint64(off) | uint64(n)<<32 | uint64(m.flags()|entryMulti)<<56)
}

func (m meta) age() uint8 { return m.flags() & ageMask >> ageShift }

func (m meta) withAge(a uint8) meta {
	return m&^(meta(ageMask)<<56) | meta(a<<ageShift&ageMask)<<56
}

// runClass is the class of a run of n records (2 or more): room for 1<<runClass(n), the
// smallest power of two that holds them. A run grows to the next class when full and gives
// back its upper half when it shrinks below it, so its class follows from its length.
func runClass(n uint32) uint8 { return uint8(bits.Len32(n - 1)) }

// maxRunClass is the largest run class: 1<<16 = 65,536 records (MaxOwners).
const maxRunClass = 16

// Bytes of memory a table slot and an owner record cost.
const (
	entryBytes = int64(unsafe.Sizeof(entry{}))
	slotBytes  = int64(unsafe.Sizeof(uint64(0)))
)

// sweepChunk is how many entries a shard examines for stale owners per message.
const sweepChunk = 4096

// A lookup reads a block that changed under its read at most maxReadTries more times, and
// waits for a write of its stripe in progress for at most maxReadYields rounds of
// maxReadSpins loads of the sequence, yielding its processor between rounds, before it
// leaves the query to the shard's owner.
const (
	maxReadTries  = 16
	maxReadSpins  = 1 << 10
	maxReadYields = 64
)

// Shard is one part of the prefix index: block hash → owners with their storage tiers.
// Blocks are assigned to shards by hash. A block with one owner keeps it in its table entry;
// a block with several keeps them all in a contiguous run, so that a block every engine holds
// (a shared system prompt) is read sequentially. A shard's memory is bounded: past its
// maximum, the least recently used block is evicted, approximated with a CLOCK of small ages
// (a block matched by a request survives longer than one only stored; see ageMatched).
//
// One goroutine at a time owns a Shard and is its only writer (its index shard actor, or a
// mutex in LockedShards): Apply, Match, Prune and Reset. Any goroutine may read it at the
// same time (Index.matchDirect, match.go): every word it reads is written atomically, the arrays are
// published with atomic.Pointer when they are reallocated, and a per-stripe sequence (see
// stripes) tells a reader whether a block changed under it. Stats may be read from any
// goroutine.
type Shard struct {
	owners  *Owners
	max     int
	metrics *kv.Metrics // the index's counters of stale operations and evictions; nil for none

	// Owned by the writer. arena is kept at its full capacity (len == cap), so that readers
	// of a published view may read any record; arenaLen records are in use.
	tab      blockTable
	arena    []uint64 // packed slot
	arenaLen uint32
	runFree  [maxRunClass + 1][]uint32
	hand     uint32
	spilled  int64
	runCap   int64

	// Sweep state: entries of owners cleared since sweepGen are reclaimed in chunks.
	sweepGen    uint64
	sweepTarget uint64
	sweepPos    uint32 // 0: not sweeping

	// touched keeps Apply's read-ahead loads from being optimised away.
	touched int64

	// What readers see: the arrays, republished whenever one is reallocated, and the
	// write sequences.
	view atomic.Pointer[shardView]
	seqs *stripes

	blocks, spilledA, runCapA, slotsA atomic.Int64
	arenaSlotsA                       atomic.Int64
	stored, removed, stale, evicted   atomic.Uint64
	pruned, queries, probes           atomic.Uint64
	fallbacks                         atomic.Uint64
}

// shardView is the shard's arrays as readers find them.
type shardView struct {
	slots []entry
	mask  uint64
	shift uint8
	arena []uint64
}

func (v *shardView) home(h int64) uint64 { return homeSlot(h, v.shift) }

// find returns the slot holding h and its meta word; ok is false when the probe did not end
// (a reader racing the writer: the read is retried).
func (v *shardView) find(h int64) (idx uint32, m meta, found, ok bool) {
	for i, n := v.home(h), 0; n < len(v.slots); i, n = (i+1)&v.mask, n+1 {
		e := &v.slots[i]
		m := e.load() // the meta word first: a live meta's hash is loaded after it
		if !m.live() {
			return 0, 0, false, true
		}
		if e.key() == h {
			return uint32(i), m, true, true
		}
	}
	return 0, 0, false, false
}

// NewShard returns an empty shard of at most maxBlocks blocks (at least 1) whose owners are
// registered in owners.
func NewShard(owners *Owners, maxBlocks int) *Shard {
	s := &Shard{owners: owners, max: max(maxBlocks, 1), seqs: new(stripes)}
	s.Reset()
	return s
}

// Reset empties the shard (after its owner goroutine failed mid-operation, its state cannot
// be trusted; an empty shard only costs misses). Readers of the old arrays keep them.
func (s *Shard) Reset() {
	s.tab = newBlockTable(0, s.seqs)
	s.arena, s.arenaLen = nil, 0
	s.runFree = [maxRunClass + 1][]uint32{}
	s.hand, s.sweepPos, s.spilled, s.runCap = 0, 0, 0, 0
	s.sweepGen = s.owners.ClearGen()
	s.publishView()
	s.seqs.release()
	s.publish()
}

// publishView publishes the current arrays to readers. The writer calls it after every
// reallocation, before it writes anything a reader could reach through the new arrays
// under a stripe sequence.
func (s *Shard) publishView() {
	s.view.Store(&shardView{slots: s.tab.slots, mask: s.tab.mask, shift: s.tab.shift, arena: s.arena})
}

// Stats returns the shard's counters. Safe for concurrent use.
func (s *Shard) Stats() ShardStats {
	return ShardStats{
		Blocks: s.blocks.Load(), Spilled: s.spilledA.Load(), SpillCap: s.runCapA.Load(),
		TableSlots: s.slotsA.Load(), ArenaSlots: s.arenaSlotsA.Load(),
		Stored: s.stored.Load(), Removed: s.removed.Load(), Stale: s.stale.Load(),
		Evicted: s.evicted.Load(), Pruned: s.pruned.Load(),
		Queries: s.queries.Load(), Probes: s.probes.Load(), Fallbacks: s.fallbacks.Load(),
	}
}

// MemoryBytes is the memory of the block table and the arena of owner runs (free runs
// included).
func (st ShardStats) MemoryBytes() int64 {
	return st.TableSlots*entryBytes + st.ArenaSlots*slotBytes
}

// Apply applies a batch of operations in order.
func (s *Shard) Apply(b *ShardBatch) {
	s.maintain()
	var stored, removed, stale uint64
	var touch int64
	evicted := s.evicted.Load()
	for i := range b.Ops {
		if i%matchGroup == 0 {
			// Read ahead: the home slots of the next group of blocks, so that their cache
			// misses overlap (see Match).
			for j := i; j < min(i+matchGroup, len(b.Ops)); j++ {
				touch += s.tab.slots[s.tab.home(b.Ops[j].Hash)].key()
			}
		}
		op := &b.Ops[i]
		if op.Owner == 0 || !s.owners.Valid(OwnerID(op.Owner), op.Epoch) {
			stale++
			continue
		}
		sl := slot{op.Epoch, op.Owner, op.Tiers}
		if op.Remove {
			s.remove(op.Hash, sl)
			removed++
		} else {
			s.store(op.Hash, sl)
			stored++
		}
	}
	s.touched = touch
	s.stored.Add(stored)
	s.removed.Add(removed)
	s.stale.Add(stale)
	if m := s.metrics; m != nil {
		if stale > 0 {
			m.IndexStale.AddInt64(int64(stale))
		}
		if n := s.evicted.Load() - evicted; n > 0 {
			m.IndexEvicted.AddInt64(int64(n))
		}
	}
	s.publish()
}

// matchGroup is how many blocks a match looks up together: it first touches the table slot,
// then the owner run of each block of a group, so that their cache misses overlap instead of
// following one another.
const matchGroup = 16

// Match answers q (see ShardQuery) on the shard's owner goroutine; it also advances a sweep
// of stale owners.
func (s *Shard) Match(q *ShardQuery) {
	s.maintain()
	if !s.match(q) {
		panic("BUG: a shard's owner could not read its own shard")
	}
}

// match answers q from the published view. Each block's owner set is one the block had at
// some moment of the read (the shard's owner reads what it wrote; a reader beside it reads
// each block again while its stripe changes, up to maxReadTries times, then reports false).
func (s *Shard) match(q *ShardQuery) bool {
	w := q.Words
	n := len(q.Hash) * w
	if cap(q.Sets) < n {
		q.Sets = make([]uint64, n)
	} else {
		q.Sets = q.Sets[:n]
		clear(q.Sets)
	}
	bits := q.Bits
	var seq0 [matchGroup]uint64
	var found [matchGroup]uint32 // slot of each block of the group, or noSlot
	var metas [matchGroup]meta
	probes := 0
	done := func(ok bool) bool {
		s.queries.Add(1)
		s.probes.Add(uint64(probes))
		return ok
	}
	// The first block alone, then groups: a wave past the prefix's end (a cold prompt, the
	// rest of a prompt held in part) costs one probe, not a group's read-ahead.
	for base, end := 0, 1; base < len(q.Hash); base, end = end, end+matchGroup {
		group := q.Hash[base:min(end, len(q.Hash))]
		probes += len(group)
		// Fast path: the group's sequences, then the view (loaded after them), a read-ahead
		// of every block's home slot, then every found block's owner run.
		for j, h := range group {
			seq0[j] = s.seqs.of(h).Load()
		}
		v := s.view.Load()
		var touch int64
		for _, h := range group {
			touch += v.slots[v.home(h)].key()
		}
		for j, h := range group {
			idx, m, ok, complete := v.find(h)
			found[j], metas[j] = noSlot, m
			if !complete {
				seq0[j] = 1 // retried alone
				continue
			}
			if ok {
				found[j] = idx
				if off, _ := m.run(); m.multi() && int(off) < len(v.arena) {
					touch += int64(atomic.LoadUint64(&v.arena[off]))
				}
			}
		}
		q.sink = touch
		for j, h := range group {
			set := q.Sets[(base+j)*w : (base+j)*w+w]
			seq := s.seqs.of(h)
			any, ok := s.ownersOf(v, metas[j], found[j] != noSlot, bits, set)
			if !ok || seq0[j]&1 != 0 || seq.Load() != seq0[j] {
				// Slow path: the block changed under the read; read it alone again.
				if any, ok = s.readBlock(h, bits, set); !ok {
					return done(false)
				}
			} else if found[j] != noSlot && metas[j].age() != ageMatched {
				bump(v, found[j], metas[j])
			}
			if any == 0 {
				return done(true) // held by none of the asked owners: the prefix ends here
			}
		}
	}
	return done(true)
}

// bump gives the entry read as m at slot idx the matched age, unless it changed since (a
// bump lost to a concurrent write only approximates LRU a little more).
func bump(v *shardView, idx uint32, m meta) { v.slots[idx].cas(m, m.withAge(ageMatched)) }

// readBlock reads h's owner set alone, retrying while its stripe is being written; false
// after maxReadTries.
func (s *Shard) readBlock(h int64, bits []uint16, set []uint64) (uint64, bool) {
	seq := s.seqs.of(h)
	for tries, spins, yields := 0, 0, 0; tries < maxReadTries; {
		s0 := seq.Load()
		if s0&1 != 0 {
			// A write of the stripe is in progress: wait for it, a while. A writer that
			// takes longer may have lost its processor (preempted mid-write): yield ours.
			if spins++; spins > maxReadSpins {
				if yields++; yields > maxReadYields {
					break
				}
				spins = 0
				runtime.Gosched()
			}
			continue
		}
		tries++
		clear(set)
		v := s.view.Load()
		idx, m, found, complete := v.find(h)
		if !complete {
			continue
		}
		any, ok := s.ownersOf(v, m, found, bits, set)
		if !ok || seq.Load() != s0 {
			continue
		}
		if found && m.age() != ageMatched {
			bump(v, idx, m)
		}
		return any, true
	}
	clear(set)
	return 0, false
}

// ownersOf sets in set the asked owners holding the block read as m (found: the block is
// resident) and returns the union of set's words; ok is false when m names a run the view
// cannot hold (a read racing the writer).
func (s *Shard) ownersOf(v *shardView, m meta, found bool, bits []uint16, set []uint64) (any uint64, ok bool) {
	if !found {
		return 0, true
	}
	var one [1]uint64
	run := one[:]
	if m.multi() {
		off, n := m.run()
		end := int(off) + int(n)
		if end > len(v.arena) {
			return 0, false
		}
		run = v.arena[off:end]
	} else {
		one[0] = packSlot(m.single())
	}
	if len(set) <= 2 {
		lo, hi := s.ownerBits2(bits, run)
		set[0] = lo
		if len(set) == 2 {
			set[1] = hi
		}
		return lo | hi, true
	}
	s.ownerBits(bits, run, set)
	for _, v := range set {
		any |= v
	}
	return any, true
}

// ownerBits sets in set the bits of the asked owners in run that are valid.
func (s *Shard) ownerBits(bits []uint16, run []uint64, set []uint64) {
	for i := range run {
		sl := unpackSlot(atomic.LoadUint64(&run[i]))
		if o := sl.ownerID(); int(o) < len(bits) && bits[o] != 0 && s.owners.Valid(o, sl.epoch) {
			b := bits[o] - 1
			set[b>>6] |= 1 << (b & 63)
		}
	}
}

// ownerBits2 is ownerBits for a query of at most two words (128 owners), returned as the
// low and high word (0 for a one-word query). It accumulates in
// registers: a block every engine holds sets a bit per owner, and a read-modify-write of
// memory per owner would chain on store forwarding.
func (s *Shard) ownerBits2(bits []uint16, run []uint64) (lo, hi uint64) {
	for i := range run {
		sl := unpackSlot(atomic.LoadUint64(&run[i]))
		if o := sl.ownerID(); int(o) < len(bits) && bits[o] != 0 && s.owners.Valid(o, sl.epoch) {
			b := bits[o] - 1
			bit := uint64(1) << (b & 63)
			high := -uint64(b >> 6) // all ones for an owner of the second word
			lo |= bit &^ high
			hi |= bit & high
		}
	}
	return lo, hi
}

// noSlot marks a block a match did not find.
const noSlot = ^uint32(0)

// Prune runs a sweep for stale owners to completion if one is due.
func (s *Shard) Prune() {
	for {
		s.maintain()
		if s.sweepPos == 0 {
			break
		}
	}
	s.publish()
}

// valid reports whether sl's owner is still at sl's epoch.
func (s *Shard) valid(sl slot) bool { return s.owners.Valid(sl.ownerID(), sl.epoch) }

// Writer-side access to the owner records: the writer reads its own arena plainly and
// stores atomically (readers load it).
func (s *Shard) rec(i uint32) slot        { return unpackSlot(s.arena[i]) }
func (s *Shard) putRec(i uint32, sl slot) { atomic.StoreUint64(&s.arena[i], packSlot(sl)) }

// store records that sl.owner (at sl.epoch) holds h in sl.tiers. A change of a single
// owner's record is one store of the entry's meta word; anything else is done under h's
// stripe.
func (s *Shard) store(h int64, sl slot) {
	idx, ok := s.tab.find(h)
	if !ok {
		q := s.seqs.lock(h)
		s.newEntry(h, sl)
		q.unlock()
		return
	}
	e := &s.tab.slots[idx]
	m := e.load()
	m = m.withAge(max(m.age(), ageStored))
	if !m.multi() {
		// Merge into the owner, or replace a stale one, or move both to a run.
		if first := m.single(); merge(&first, sl) || !s.valid(first) {
			if first.owner != sl.owner {
				first = sl
			}
			e.put(m.withSingle(first))
			return
		}
		q := s.seqs.lock(h)
		off := s.allocRun(runClass(2))
		s.putRec(off, m.single())
		s.putRec(off+1, sl)
		s.spilled++
		e.put(m.withRun(off, 2))
		q.unlock()
		return
	}
	if m != e.load() {
		e.put(m)
	}
	q := s.seqs.lock(h)
	s.storeInRun(e, sl)
	q.unlock()
}

// storeInRun records sl in e's run: merged into its owner's record, over a stale record, or
// appended.
func (s *Shard) storeInRun(e *entry, sl slot) {
	off, n := e.load().run()
	for i := off; i < off+n; i++ {
		if r := s.rec(i); merge(&r, sl) {
			s.putRec(i, r)
			return
		}
	}
	// Reuse a stale record before adding one.
	for i := off; i < off+n; i++ {
		if !s.valid(s.rec(i)) {
			s.putRec(i, sl)
			return
		}
	}
	s.appendOwner(e, sl)
}

// merge folds sl into r when r is the same owner: more tiers at the same epoch, or a fresh
// record over one from an older epoch.
func merge(r *slot, sl slot) bool {
	if r.owner != sl.owner {
		return false
	}
	if r.epoch == sl.epoch {
		r.tiers |= sl.tiers
	} else {
		*r = sl
	}
	return true
}

// remove records that sl.owner (at sl.epoch) no longer holds h in sl.tiers; like store, a
// change of a single owner's tiers is one store, anything else is done under h's stripe.
func (s *Shard) remove(h int64, sl slot) {
	idx, ok := s.tab.find(h)
	if !ok {
		return
	}
	e := &s.tab.slots[idx]
	m := e.load()
	if !m.multi() {
		if first := m.single(); first.owner == sl.owner && first.epoch == sl.epoch {
			first.tiers &^= sl.tiers
			if first.tiers == 0 {
				s.deleteEntry(idx)
				return
			}
			e.put(m.withSingle(first))
		}
		return
	}
	off, n := m.run()
	for i := range n {
		r := s.rec(off + i)
		if r.owner != sl.owner || r.epoch != sl.epoch {
			continue
		}
		r.tiers &^= sl.tiers
		q := s.seqs.lock(h)
		if r.tiers == 0 {
			s.removeOwnerAt(idx, i)
		} else {
			s.putRec(off+i, r)
		}
		q.unlock()
		return
	}
}

// appendOwner adds sl to e's run, moving the run to the next class when full. The caller
// holds the entry's stripe.
func (s *Shard) appendOwner(e *entry, sl slot) {
	m := e.load()
	off, n := m.run()
	if n >= MaxOwners {
		return // MaxOwners records: cannot happen with at most MaxOwners owners
	}
	if c := runClass(n); runClass(n+1) != c {
		moved := s.allocRun(c + 1) // may reallocate s.arena
		for i := range n {
			s.putRec(moved+i, s.rec(off+i))
		}
		s.freeRun(off, c)
		off = moved
	}
	s.putRec(off+n, sl)
	s.spilled++
	e.put(m.withRun(off, n+1))
}

// removeOwnerAt removes record i of entry idx's run (the last one moves into its place). A
// run left with one owner is freed and the owner moves inline into the entry; a run left in
// the lower half of its room gives back the upper half. The caller holds the entry's stripe.
func (s *Shard) removeOwnerAt(idx uint32, i uint32) {
	e := &s.tab.slots[idx]
	m := e.load()
	off, n := m.run()
	last := off + n - 1
	if at := off + i; at != last {
		s.putRec(at, s.rec(last))
	}
	s.spilled--
	if n == 2 {
		e.put(m.withSingle(s.rec(off)))
		s.freeRun(off, runClass(2))
		return
	}
	e.put(m.withRun(off, n-1))
	if c := runClass(n); runClass(n-1) != c {
		s.freeRun(off+1<<(c-1), c-1)
	}
}

func (s *Shard) allocRun(class uint8) uint32 {
	s.runCap += 1 << class
	if fl := s.runFree[class]; len(fl) > 0 {
		off := fl[len(fl)-1]
		s.runFree[class] = fl[:len(fl)-1]
		return off
	}
	off, size := s.arenaLen, uint32(1)<<class
	if int(off+size) > len(s.arena) {
		grown := append(s.arena[:off:off], make([]uint64, size)...)
		s.arena = grown[:cap(grown)]
		s.publishView()
	}
	s.arenaLen += size
	return off
}

func (s *Shard) freeRun(off uint32, class uint8) {
	s.runCap -= 1 << class
	s.runFree[class] = append(s.runFree[class], off)
}

// newEntry inserts h with its single owner sl; h's stripe is held.
func (s *Shard) newEntry(h int64, sl slot) {
	if s.tab.n >= s.max {
		s.evict()
	}
	if _, grew := s.tab.insert(h, newMeta(sl.epoch, sl.owner, sl.tiers, entryLive|ageInserted<<ageShift)); grew {
		s.publishView()
	}
}

// deleteEntry frees entry idx's run and removes it from the table (moving later entries of
// its probe run back), under the entry's stripe.
func (s *Shard) deleteEntry(idx uint32) {
	e := &s.tab.slots[idx]
	q := s.seqs.lock(e.key())
	if m := e.load(); m.multi() {
		off, n := m.run()
		s.spilled -= int64(n) - 1
		s.freeRun(off, runClass(n))
	}
	s.tab.remove(idx)
	q.unlock()
}

// evict deletes one block chosen by the CLOCK hand: the first live block whose age is down
// to zero (the hand decrements the ages it passes), or one whose owners are all stale.
func (s *Shard) evict() {
	n := uint32(len(s.tab.slots))
	if s.tab.n == 0 {
		return
	}
	for range (ageMatched+1)*n + 1 {
		s.hand = (s.hand + 1) & uint32(s.tab.mask)
		e := &s.tab.slots[s.hand]
		m := e.load()
		if !m.live() {
			continue
		}
		if a := m.age(); a > 0 && (m.multi() || s.valid(m.single())) {
			e.put(m.withAge(a - 1))
			continue
		}
		s.deleteEntry(s.hand)
		s.evicted.Add(1)
		return
	}
}

// maintain advances a sweep of stale owner records by one chunk, starting one when owners
// were cleared since the last completed sweep.
func (s *Shard) maintain() {
	if s.sweepPos == 0 {
		g := s.owners.ClearGen()
		if g == s.sweepGen {
			return
		}
		s.sweepTarget, s.sweepPos = g, 1
	}
	// Slots are 1-based in sweepPos (0 means not sweeping). A removal shifts later entries
	// back, so a slot whose entry changed is examined again.
	end := min(int(s.sweepPos)+sweepChunk, len(s.tab.slots)+1)
	var pruned uint64
	for i := int(s.sweepPos); i < end; {
		e := &s.tab.slots[i-1]
		if !e.load().live() {
			i++
			continue
		}
		h := e.key()
		pruned += s.pruneEntry(uint32(i - 1))
		if e.load().live() && e.key() != h {
			continue // another entry moved in: examine it too
		}
		i++
	}
	s.pruned.Add(pruned)
	if end > len(s.tab.slots) {
		s.sweepPos, s.sweepGen = 0, s.sweepTarget
	} else {
		s.sweepPos = uint32(end)
	}
	if pruned > 0 {
		s.publish()
	}
}

// pruneEntry drops the stale owner records of entry idx (deleting it when none is left) and
// returns how many it dropped.
func (s *Shard) pruneEntry(idx uint32) uint64 {
	var n uint64
	e := &s.tab.slots[idx]
	q := s.seqs.lock(e.key())
	defer q.unlock()
	for i := uint32(0); ; {
		// A run holds two or more records; removing one may move the last inline.
		m := e.load()
		if !m.multi() {
			break
		}
		off, size := m.run()
		if i >= size {
			break
		}
		if s.valid(s.rec(off + i)) {
			i++
			continue
		}
		n++
		s.removeOwnerAt(idx, i)
	}
	if m := e.load(); !m.multi() && !s.valid(m.single()) {
		s.deleteEntry(idx)
		n++
	}
	return n
}

// publish updates the atomically readable sizes.
func (s *Shard) publish() {
	s.blocks.Store(int64(s.tab.n))
	s.slotsA.Store(int64(len(s.tab.slots)))
	s.spilledA.Store(s.spilled)
	s.runCapA.Store(s.runCap)
	s.arenaSlotsA.Store(int64(len(s.arena)))
}
