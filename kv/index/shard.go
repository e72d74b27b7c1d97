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
// ask about (Bits is shared by the shards of one lookup and only read). For Hash[i] the shard
// writes the set of asked owners currently holding it, in any tier, as Words 64-bit words at
// Sets[i*Words:].
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

// entryLive flags a slot of Shard.entries that holds a block.
const entryLive uint8 = 1

// CLOCK ages: a new block starts young, a stored block is bumped, a matched one (a request
// used it) gets the oldest-surviving age; the hand decrements ages and evicts at zero. Matched
// blocks thus outlive blocks that were only stored.
const (
	ageInserted = 1
	ageStored   = 2
	ageMatched  = 3
)

// slot is one owner of a block.
type slot struct {
	owner OwnerID
	epoch uint32
	tiers Tiers
}

// entry is one resident block: its first owner inline, further owners in a run (set).
// An entry with no owner is deleted at once, so a live entry always has a first owner.
type entry struct {
	hash int64
	// The first owner, its fields inline so that the entry packs into 24 bytes.
	owner OwnerID
	epoch uint32
	set   uint32 // index in Shard.sets of the further owners, 0 for none
	tiers Tiers
	flags uint8
	age   uint8 // CLOCK age, 0..ageMatched
}

func (e *entry) firstSlot() slot { return slot{e.owner, e.epoch, e.tiers} }

func (e *entry) setFirst(sl slot) { e.owner, e.epoch, e.tiers = sl.owner, sl.epoch, sl.tiers }

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
)

// sweepChunk is how many entries a shard examines for stale owners per message.
const sweepChunk = 4096

// Shard is one part of the prefix index: block hash → owners with their storage tiers.
// Blocks are assigned to shards by hash. A block's first owner lives in its entry; further
// owners in a contiguous run, so that a block every engine holds (a shared system prompt) is
// read sequentially. A shard's memory is bounded: past its maximum, the least recently used
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
		Stored: s.stored.Load(), Removed: s.removed.Load(), Stale: s.stale.Load(),
		Evicted: s.evicted.Load(), Pruned: s.pruned.Load(),
		Queries: s.queries.Load(), Probes: s.probes.Load(),
	}
}

// MemoryBytes is the memory of the block table and the owner runs.
func (st ShardStats) MemoryBytes() int64 {
	return st.TableSlots*entryBytes + st.SpillCap*slotBytes
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
		if op.Owner == 0 || !s.owners.Valid(op.Owner, op.Epoch) {
			stale++
			continue
		}
		if op.Remove {
			s.remove(op.Hash, slot{op.Owner, op.Epoch, op.Tiers})
			removed++
		} else {
			s.store(op.Hash, slot{op.Owner, op.Epoch, op.Tiers})
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
	for base := 0; base < len(q.Hash); base += matchGroup {
		group := q.Hash[base:min(base+matchGroup, len(q.Hash))]
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
			if set := s.tab.slots[idx].set; set != 0 {
				touch += int64(s.arena[s.sets[set].off].owner)
			}
		}
		s.touched = touch
		for j := range group {
			if found[j] == noSlot {
				continue
			}
			e := &s.tab.slots[found[j]]
			e.age = ageMatched
			set := q.Sets[(base+j)*w : (base+j)*w+w]
			var run []slot
			if e.set != 0 {
				rs := s.sets[e.set]
				run = s.arena[rs.off : rs.off+uint32(rs.n)]
			}
			if w <= 2 {
				lo, hi := s.ownerBits2(bits, e.firstSlot(), run)
				set[0] = lo
				if w == 2 {
					set[1] = hi
				}
			} else {
				s.ownerBits(bits, e.firstSlot(), run, set)
			}
		}
	}
	s.queries.Add(1)
	s.probes.Add(uint64(len(q.Hash)))
}

// ownerBits sets in set the bits of the asked owners among first and run that are valid.
func (s *Shard) ownerBits(bits []uint16, first slot, run []slot, set []uint64) {
	if o := first.owner; int(o) < len(bits) && bits[o] != 0 && s.owners.Valid(o, first.epoch) {
		b := bits[o] - 1
		set[b>>6] |= 1 << (b & 63)
	}
	for _, sl := range run {
		if o := sl.owner; int(o) < len(bits) && bits[o] != 0 && s.owners.Valid(o, sl.epoch) {
			b := bits[o] - 1
			set[b>>6] |= 1 << (b & 63)
		}
	}
}

// ownerBits2 is ownerBits for a query of at most two words (128 owners), returned as the
// low and high word (0 for a one-word query). It accumulates in
// registers: a block every engine holds sets a bit per owner, and a read-modify-write of
// memory per owner would chain on store forwarding.
func (s *Shard) ownerBits2(bits []uint16, first slot, run []slot) (lo, hi uint64) {
	add := func(sl slot) {
		if o := sl.owner; int(o) < len(bits) && bits[o] != 0 && s.owners.Valid(o, sl.epoch) {
			b := bits[o] - 1
			bit := uint64(1) << (b & 63)
			high := -uint64(b >> 6) // all ones for an owner of the second word
			lo |= bit &^ high
			hi |= bit & high
		}
	}
	add(first)
	for _, sl := range run {
		add(sl)
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

// store records that sl.owner (at sl.epoch) holds h in sl.tiers.
func (s *Shard) store(h int64, sl slot) {
	idx, ok := s.tab.find(h)
	if !ok {
		idx = s.newEntry(h)
		s.tab.slots[idx].setFirst(sl)
		return
	}
	e := &s.tab.slots[idx]
	e.age = max(e.age, ageStored)
	if first := e.firstSlot(); merge(&first, sl) {
		e.setFirst(first)
		return
	}
	var run []slot
	if e.set != 0 {
		rs := s.sets[e.set]
		run = s.arena[rs.off : rs.off+uint32(rs.n)]
		for i := range run {
			if merge(&run[i], sl) {
				return
			}
		}
	}
	// Reuse a stale record before adding one.
	if !s.owners.Valid(e.owner, e.epoch) {
		e.setFirst(sl)
		return
	}
	for i := range run {
		if !s.owners.Valid(run[i].owner, run[i].epoch) {
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
	if e.owner == sl.owner && e.epoch == sl.epoch {
		e.tiers &^= sl.tiers
		if e.tiers == 0 {
			s.dropFirst(idx)
		}
		return
	}
	if e.set == 0 {
		return
	}
	rs := s.sets[e.set]
	run := s.arena[rs.off : rs.off+uint32(rs.n)]
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

// dropFirst removes an entry's first owner: the last further owner takes its place, or the
// entry is deleted.
func (s *Shard) dropFirst(idx uint32) {
	e := &s.tab.slots[idx]
	if e.set == 0 {
		s.deleteEntry(idx)
		return
	}
	rs := s.sets[e.set]
	e.setFirst(s.arena[rs.off+uint32(rs.n)-1])
	s.removeOwnerAt(idx, int(rs.n)-1)
}

// appendOwner adds sl to entry idx's run, growing it to the next class when full.
func (s *Shard) appendOwner(idx uint32, sl slot) {
	e := &s.tab.slots[idx]
	if e.set == 0 {
		e.set = s.newSet(0)
	}
	rs := &s.sets[e.set]
	if int(rs.n) == 1<<rs.class {
		if rs.class == maxSetClass {
			return // MaxOwners records: cannot happen with at most MaxOwners owners
		}
		off := s.allocRun(rs.class + 1)
		rs = &s.sets[e.set] // allocRun may grow s.arena, never s.sets
		copy(s.arena[off:], s.arena[rs.off:rs.off+uint32(rs.n)])
		s.freeRun(rs.off, rs.class)
		rs.off, rs.class = off, rs.class+1
	}
	s.arena[rs.off+uint32(rs.n)] = sl
	rs.n++
	s.spilled++
}

// removeOwnerAt removes record i of entry idx's run (the last one moves into its place) and
// frees an emptied run.
func (s *Shard) removeOwnerAt(idx uint32, i int) {
	e := &s.tab.slots[idx]
	rs := &s.sets[e.set]
	last := rs.off + uint32(rs.n) - 1
	s.arena[rs.off+uint32(i)] = s.arena[last]
	s.arena[last] = slot{}
	rs.n--
	s.spilled--
	if rs.n == 0 {
		s.freeRun(rs.off, rs.class)
		s.setFree = append(s.setFree, e.set)
		*rs = ownerSet{}
		e.set = 0
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
	s.tab.slots[idx].age = ageInserted
	return idx
}

// deleteEntry frees entry idx's run and removes it from the table (moving later entries of
// its probe run back).
func (s *Shard) deleteEntry(idx uint32) {
	e := &s.tab.slots[idx]
	if e.set != 0 {
		rs := &s.sets[e.set]
		clear(s.arena[rs.off : rs.off+uint32(rs.n)])
		s.spilled -= int64(rs.n)
		s.freeRun(rs.off, rs.class)
		*rs = ownerSet{}
		s.setFree = append(s.setFree, e.set)
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
		if e.age > 0 && (e.set != 0 || s.owners.Valid(e.owner, e.epoch)) {
			e.age--
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
	if set := s.tab.slots[idx].set; set != 0 {
		for i := 0; i < int(s.sets[set].n); {
			rs := s.sets[set]
			sl := s.arena[rs.off+uint32(i)]
			if s.owners.Valid(sl.owner, sl.epoch) {
				i++
				continue
			}
			n++
			last := rs.n == 1
			s.removeOwnerAt(idx, i)
			if last {
				break
			}
		}
	}
	for {
		e := &s.tab.slots[idx]
		if e.flags&entryLive == 0 || s.owners.Valid(e.owner, e.epoch) {
			return n
		}
		s.dropFirst(idx)
		n++
	}
}

// publish updates the atomically readable sizes.
func (s *Shard) publish() {
	s.blocks.Store(int64(s.tab.n))
	s.slotsA.Store(int64(len(s.tab.slots)))
	s.spilledA.Store(s.spilled)
	s.runCapA.Store(s.runCap)
}
