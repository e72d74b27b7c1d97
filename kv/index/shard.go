package index

import (
	"sync/atomic"
	"unsafe"

	"switchyard/kv"
)

// ShardOp is one block operation for a shard: store a block for an owner in some tiers, or
// remove it from some tiers. Epoch is the owner's epoch when the event was ingested; an op
// whose owner was cleared since is dropped when applied, so a clear always wins over the
// events published before it.
type ShardOp struct {
	Hash   int64
	Owner  OwnerID
	Epoch  uint32
	Tiers  Tiers
	Remove bool
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
	// SpillCap is the capacity, in records, of the runs holding them.
	SpillCap int64
	// TableSlots is the capacity of the block table (resident blocks use at most 70%).
	TableSlots int64
	// SetSlots is the capacity of the owner-set table (one set per block with several
	// owners), and ArenaSlots the capacity, in records, of the arena its runs live in.
	SetSlots, ArenaSlots int64
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
}

// entryLive flags a slot of the block table that holds a block; the CLOCK age is in the
// flags' bits ageShift and up.
const (
	entryLive uint8 = 1
	ageShift        = 1
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
// of a larger ID is invalid and never stored.
type slot struct {
	epoch uint32
	owner uint16
	tiers Tiers
}

func (sl slot) ownerID() OwnerID { return OwnerID(sl.owner) }

// entry is one resident block, 16 bytes, so that a table slot never straddles two cache
// lines and four share one. A block with one owner (most) holds it inline; a block with
// several owners holds them all in a run of Shard.arena, and ref names the run. An entry
// with no owner is deleted at once, so a live entry always has an owner.
type entry struct {
	hash int64
	// ref is the single owner's epoch, or the index in Shard.sets of the owners' run when
	// owner is 0 (OwnerID 0 is never valid).
	ref   uint32
	owner uint16 // the single owner, 0 when the owners are in a run
	tiers Tiers  // the single owner's tiers
	flags uint8  // entryLive, and the CLOCK age (0..ageMatched) from bit ageShift
}

// multi reports whether e's owners are in a run.
func (e *entry) multi() bool { return e.owner == 0 }

// single is e's owner when it has only one.
func (e *entry) single() slot { return slot{e.ref, e.owner, e.tiers} }

func (e *entry) setSingle(sl slot) { e.ref, e.owner, e.tiers = sl.epoch, sl.owner, sl.tiers }

func (e *entry) age() uint8 { return e.flags >> ageShift }

func (e *entry) setAge(a uint8) { e.flags = e.flags&entryLive | a<<ageShift }

// ownerSet is a run of arena[off:off+n] with room for 1<<class records.
type ownerSet struct {
	off   uint32
	n     uint16
	class uint8
}

// maxSetClass is the largest run class: 1<<16 = 65,536 records (MaxOwners).
const maxSetClass = 16

// Bytes of memory a table slot and a further owner record cost.
const (
	entryBytes = int64(unsafe.Sizeof(entry{}))
	slotBytes  = int64(unsafe.Sizeof(slot{}))
	setBytes   = int64(unsafe.Sizeof(ownerSet{}))
)

// sweepChunk is how many entries a shard examines for stale owners per message.
const sweepChunk = 4096

// Shard is one part of the prefix index: block hash → owners with their storage tiers.
// Blocks are assigned to shards by hash. A block with one owner keeps it in its table entry;
// a block with several keeps them all in a contiguous run, so that a block every engine holds
// (a shared system prompt) is read sequentially. A shard's memory is bounded: past its maximum, the least recently used
// block is evicted, approximated with a CLOCK of small ages (a block matched by a request
// survives longer than one only stored; see ageMatched).
//
// A Shard is NOT safe for concurrent use: it is owned by one goroutine at a time (its index
// shard actor, or a mutex in LockedShards). Stats may be read from any goroutine.
type Shard struct {
	owners  *Owners
	max     int
	metrics *kv.Metrics // the index's counters of stale operations and evictions; nil for none

	tab     blockTable
	sets    []ownerSet // sets[0] is never used
	setFree []uint32
	arena   []slot
	runFree [maxSetClass + 1][]uint32
	hand    uint32
	spilled int64
	runCap  int64

	// Sweep state: entries of owners cleared since sweepGen are reclaimed in chunks.
	sweepGen    uint64
	sweepTarget uint64
	sweepPos    uint32 // 0: not sweeping

	// touched keeps Match's read-ahead loads from being optimised away.
	touched int64

	blocks, spilledA, runCapA, slotsA atomic.Int64
	setSlotsA, arenaSlotsA            atomic.Int64
	stored, removed, stale, evicted   atomic.Uint64
	pruned, queries, probes           atomic.Uint64
}

// NewShard returns an empty shard of at most maxBlocks blocks (at least 1) whose owners are
// registered in owners.
func NewShard(owners *Owners, maxBlocks int) *Shard {
	s := &Shard{owners: owners, max: max(maxBlocks, 1)}
	s.Reset()
	return s
}

// Reset empties the shard (after its owner goroutine failed mid-operation, its state cannot
// be trusted; an empty shard only costs misses).
func (s *Shard) Reset() {
	s.tab = newBlockTable(0)
	s.setFree = nil
	s.sets = append(make([]ownerSet, 0, 64), ownerSet{})
	s.arena = s.arena[:0]
	s.runFree = [maxSetClass + 1][]uint32{}
	s.hand, s.sweepPos, s.spilled, s.runCap = 0, 0, 0, 0
	s.sweepGen = s.owners.ClearGen()
	s.publish()
}

// Stats returns the shard's counters. Safe for concurrent use.
func (s *Shard) Stats() ShardStats {
	return ShardStats{
		Blocks: s.blocks.Load(), Spilled: s.spilledA.Load(), SpillCap: s.runCapA.Load(), TableSlots: s.slotsA.Load(),
		SetSlots: s.setSlotsA.Load(), ArenaSlots: s.arenaSlotsA.Load(),
		Stored: s.stored.Load(), Removed: s.removed.Load(), Stale: s.stale.Load(),
		Evicted: s.evicted.Load(), Pruned: s.pruned.Load(),
		Queries: s.queries.Load(), Probes: s.probes.Load(),
	}
}

// MemoryBytes is the memory of the block table, the owner-set table and the arena of owner
// runs (free runs included).
func (st ShardStats) MemoryBytes() int64 {
	return st.TableSlots*entryBytes + st.SetSlots*setBytes + st.ArenaSlots*slotBytes
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
				touch += s.tab.slots[s.tab.home(b.Ops[j].Hash)].hash
			}
		}
		op := &b.Ops[i]
		if op.Owner == 0 || op.Owner >= MaxOwners || !s.owners.Valid(op.Owner, op.Epoch) {
			stale++
			continue
		}
		sl := slot{op.Epoch, uint16(op.Owner), op.Tiers}
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

// matchGroup is how many blocks Match looks up together: it first touches the table slot,
// then the owner run of each block of a group, so that their cache misses overlap instead of
// following one another.
const matchGroup = 16

// Match answers q (see ShardQuery).
func (s *Shard) Match(q *ShardQuery) {
	s.maintain()
	w := q.Words
	n := len(q.Hash) * w
	if cap(q.Sets) < n {
		q.Sets = make([]uint64, n)
	} else {
		q.Sets = q.Sets[:n]
		clear(q.Sets)
	}
	bits := q.Bits
	var found [matchGroup]uint32 // slot of each block of the group, or noSlot
	probes := 0
	// The first block alone, then groups: a wave past the prefix's end (a cold prompt, the
	// rest of a prompt held in part) costs one probe, not a group's read-ahead.
	for base, end := 0, 1; base < len(q.Hash); base, end = end, end+matchGroup {
		group := q.Hash[base:min(end, len(q.Hash))]
		probes += len(group)
		// Read ahead: every block's home slot, then every found block's owner run.
		var touch int64
		for _, h := range group {
			touch += s.tab.slots[s.tab.home(h)].hash
		}
		for j, h := range group {
			idx, ok := s.tab.find(h)
			if !ok {
				found[j] = noSlot
				continue
			}
			found[j] = idx
			if e := &s.tab.slots[idx]; e.multi() {
				touch += int64(s.arena[s.sets[e.ref].off].owner)
			}
		}
		s.touched = touch
		for j := range group {
			if found[j] == noSlot {
				s.queries.Add(1)
				s.probes.Add(uint64(probes))
				return // nobody holds it: the prefix ends here
			}
			e := &s.tab.slots[found[j]]
			e.setAge(ageMatched)
			set := q.Sets[(base+j)*w : (base+j)*w+w]
			var one [1]slot
			run := one[:]
			if e.multi() {
				run = s.run(e.ref)
			} else {
				one[0] = e.single()
			}
			var any uint64
			if w <= 2 {
				lo, hi := s.ownerBits2(bits, run)
				set[0] = lo
				if w == 2 {
					set[1] = hi
				}
				any = lo | hi
			} else {
				s.ownerBits(bits, run, set)
				for _, v := range set {
					any |= v
				}
			}
			if any == 0 {
				s.queries.Add(1)
				s.probes.Add(uint64(probes))
				return // held by none of the asked owners (or only stale records)
			}
		}
	}
	s.queries.Add(1)
	s.probes.Add(uint64(probes))
}

// run is the owner run of set id.
func (s *Shard) run(id uint32) []slot {
	rs := s.sets[id]
	return s.arena[rs.off : rs.off+uint32(rs.n)]
}

// ownerBits sets in set the bits of the asked owners in run that are valid.
func (s *Shard) ownerBits(bits []uint16, run []slot, set []uint64) {
	for _, sl := range run {
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
func (s *Shard) ownerBits2(bits []uint16, run []slot) (lo, hi uint64) {
	for _, sl := range run {
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

// noSlot marks a block Match did not find.
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

// store records that sl.owner (at sl.epoch) holds h in sl.tiers.
func (s *Shard) store(h int64, sl slot) {
	idx, ok := s.tab.find(h)
	if !ok {
		idx = s.newEntry(h)
		s.tab.slots[idx].setSingle(sl)
		return
	}
	e := &s.tab.slots[idx]
	e.setAge(max(e.age(), ageStored))
	if !e.multi() {
		// Merge into the owner, or replace a stale one, or move both to a run.
		if first := e.single(); merge(&first, sl) || !s.valid(first) {
			if first.owner != sl.owner {
				first = sl
			}
			e.setSingle(first)
			return
		}
		first := e.single()
		id := s.newSet(1)
		rs := &s.sets[id]
		s.arena[rs.off], s.arena[rs.off+1] = first, sl
		rs.n = 2
		s.spilled++
		e.ref, e.owner, e.tiers = id, 0, 0
		return
	}
	run := s.run(e.ref)
	for i := range run {
		if merge(&run[i], sl) {
			return
		}
	}
	// Reuse a stale record before adding one.
	for i := range run {
		if !s.valid(run[i]) {
			run[i] = sl
			return
		}
	}
	s.appendOwner(idx, sl)
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

// remove records that sl.owner (at sl.epoch) no longer holds h in sl.tiers.
func (s *Shard) remove(h int64, sl slot) {
	idx, ok := s.tab.find(h)
	if !ok {
		return
	}
	e := &s.tab.slots[idx]
	if !e.multi() {
		if e.owner == sl.owner && e.ref == sl.epoch {
			e.tiers &^= sl.tiers
			if e.tiers == 0 {
				s.deleteEntry(idx)
			}
		}
		return
	}
	run := s.run(e.ref)
	for i := range run {
		if run[i].owner != sl.owner || run[i].epoch != sl.epoch {
			continue
		}
		run[i].tiers &^= sl.tiers
		if run[i].tiers == 0 {
			s.removeOwnerAt(idx, i)
		}
		return
	}
}

// appendOwner adds sl to entry idx's run, growing it to the next class when full.
func (s *Shard) appendOwner(idx uint32, sl slot) {
	e := &s.tab.slots[idx]
	rs := &s.sets[e.ref]
	if int(rs.n) == 1<<rs.class {
		if rs.class == maxSetClass {
			return // MaxOwners records: cannot happen with at most MaxOwners owners
		}
		off := s.allocRun(rs.class + 1)
		rs = &s.sets[e.ref] // allocRun may grow s.arena, never s.sets
		copy(s.arena[off:], s.arena[rs.off:rs.off+uint32(rs.n)])
		s.freeRun(rs.off, rs.class)
		rs.off, rs.class = off, rs.class+1
	}
	s.arena[rs.off+uint32(rs.n)] = sl
	rs.n++
	s.spilled++
}

// removeOwnerAt removes record i of entry idx's run (the last one moves into its place). A
// run left with one owner is freed and the owner moves inline into the entry.
func (s *Shard) removeOwnerAt(idx uint32, i int) {
	e := &s.tab.slots[idx]
	rs := &s.sets[e.ref]
	last := rs.off + uint32(rs.n) - 1
	s.arena[rs.off+uint32(i)] = s.arena[last]
	s.arena[last] = slot{}
	rs.n--
	s.spilled--
	if rs.n == 1 {
		only := s.arena[rs.off]
		s.arena[rs.off] = slot{}
		s.freeSet(e.ref)
		e.setSingle(only)
	}
}

func (s *Shard) newSet(class uint8) uint32 {
	off := s.allocRun(class)
	var id uint32
	if n := len(s.setFree); n > 0 {
		id = s.setFree[n-1]
		s.setFree = s.setFree[:n-1]
	} else {
		s.sets = append(s.sets, ownerSet{})
		id = uint32(len(s.sets) - 1)
	}
	s.sets[id] = ownerSet{off: off, class: class}
	return id
}

// freeSet frees set id and its run, whose records the caller cleared.
func (s *Shard) freeSet(id uint32) {
	rs := &s.sets[id]
	s.freeRun(rs.off, rs.class)
	*rs = ownerSet{}
	s.setFree = append(s.setFree, id)
}

func (s *Shard) allocRun(class uint8) uint32 {
	s.runCap += 1 << class
	if fl := s.runFree[class]; len(fl) > 0 {
		off := fl[len(fl)-1]
		s.runFree[class] = fl[:len(fl)-1]
		return off
	}
	off := uint32(len(s.arena))
	s.arena = append(s.arena, make([]slot, 1<<class)...)
	return off
}

func (s *Shard) freeRun(off uint32, class uint8) {
	s.runCap -= 1 << class
	s.runFree[class] = append(s.runFree[class], off)
}

func (s *Shard) newEntry(h int64) uint32 {
	if s.tab.n >= s.max {
		s.evict()
	}
	idx := s.tab.insert(h)
	s.tab.slots[idx].setAge(ageInserted)
	return idx
}

// deleteEntry frees entry idx's run and removes it from the table (moving later entries of
// its probe run back).
func (s *Shard) deleteEntry(idx uint32) {
	if e := &s.tab.slots[idx]; e.multi() {
		rs := &s.sets[e.ref]
		clear(s.arena[rs.off : rs.off+uint32(rs.n)])
		s.spilled -= int64(rs.n) - 1
		s.freeSet(e.ref)
	}
	s.tab.remove(idx)
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
		if e.flags&entryLive == 0 {
			continue
		}
		if a := e.age(); a > 0 && (e.multi() || s.valid(e.single())) {
			e.setAge(a - 1)
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
		if e.flags&entryLive == 0 {
			i++
			continue
		}
		h := e.hash
		pruned += s.pruneEntry(uint32(i - 1))
		if e.flags&entryLive != 0 && e.hash != h {
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
	for i := 0; e.multi(); {
		// A run holds two or more records; removing one may move the last inline.
		run := s.run(e.ref)
		if i >= len(run) {
			break
		}
		if s.valid(run[i]) {
			i++
			continue
		}
		n++
		s.removeOwnerAt(idx, i)
	}
	if !e.multi() && !s.valid(e.single()) {
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
	s.setSlotsA.Store(int64(cap(s.sets)))
	s.arenaSlotsA.Store(int64(cap(s.arena)))
}
