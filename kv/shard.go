package kv

import (
	"sync/atomic"
	"unsafe"
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

// ShardQuery asks one shard for the owners of some blocks of a prompt: Pos[i] is the block
// position of Hash[i], in increasing order. The shard appends one ShardHit per current owner
// of each block it holds, in position order.
type ShardQuery struct {
	Pos  []uint32
	Hash []int64
	Hits []ShardHit
}

// ShardHit is one owner of the block at a queried position.
type ShardHit struct {
	Pos   uint32
	Owner OwnerID
	Tiers Tiers
}

// reset empties q for reuse.
func (q *ShardQuery) reset() {
	q.Pos, q.Hash, q.Hits = q.Pos[:0], q.Hash[:0], q.Hits[:0]
}

// ShardStats are a shard's counters. Counters only grow; Blocks and Spilled are current.
type ShardStats struct {
	// Blocks is the number of resident blocks.
	Blocks int64
	// Spilled is the number of extra owner records (blocks held by more than one owner).
	Spilled int64
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

// entry is one resident block: its first owner inline, further owners in a spill chain.
// An entry with no owner is deleted at once, so a live entry always has a first owner.
type entry struct {
	hash  int64
	owner OwnerID
	epoch uint32
	more  uint32 // first spill node, 0 for none
	tiers Tiers
	flags uint8
	age   uint8 // CLOCK age, 0..ageMatched
}

// spillNode is one more owner of a block.
type spillNode struct {
	owner OwnerID
	epoch uint32
	next  uint32
	tiers Tiers
}

// Bytes of memory a resident block and a spilled owner record cost, used for the memory
// estimate: the entry, its map slot (key, value and the Swiss table's control byte at the
// 7/8 maximum load), and the spill node.
const (
	entryBytes     = int64(unsafe.Sizeof(entry{}))
	tableSlotBytes = 8 + 4 + 4 + 1
	spillBytes     = int64(unsafe.Sizeof(spillNode{}))
)

// sweepChunk is how many entries a shard examines for stale owners per message.
const sweepChunk = 4096

// Shard is one part of the prefix index: block hash → owners with their storage tiers.
// Blocks are assigned to shards by hash. A shard's memory is bounded: past its maximum, the
// least recently used block is evicted, approximated with a CLOCK of small ages (a block
// matched by a request survives longer than one only stored; see ageMatched).
//
// A Shard is NOT safe for concurrent use: it is owned by one goroutine at a time (its index
// shard actor, or a mutex in LockedShards). Stats may be read from any goroutine.
type Shard struct {
	owners *Owners
	max    int

	table   map[int64]uint32
	entries []entry // entries[0] is never used
	free    []uint32
	spill   []spillNode // spill[0] is never used
	spFree  []uint32
	hand    uint32
	live    int

	// Sweep state: entries of owners cleared since sweepGen are reclaimed in chunks.
	sweepGen    uint64
	sweepTarget uint64
	sweepPos    uint32 // 0: not sweeping

	blocks, spilled                 atomic.Int64
	stored, removed, stale, evicted atomic.Uint64
	pruned, queries, probes         atomic.Uint64
}

// NewShard returns an empty shard of at most maxBlocks blocks (at least 1) whose owners are
// registered in owners.
func NewShard(owners *Owners, maxBlocks int) *Shard {
	maxBlocks = max(maxBlocks, 1)
	return &Shard{
		owners:  owners,
		max:     maxBlocks,
		table:   make(map[int64]uint32),
		entries: make([]entry, 1, 1+min(maxBlocks, 1024)),
		spill:   make([]spillNode, 1, 64),
	}
}

// Stats returns the shard's counters. Safe for concurrent use.
func (s *Shard) Stats() ShardStats {
	return ShardStats{
		Blocks: s.blocks.Load(), Spilled: s.spilled.Load(),
		Stored: s.stored.Load(), Removed: s.removed.Load(), Stale: s.stale.Load(),
		Evicted: s.evicted.Load(), Pruned: s.pruned.Load(),
		Queries: s.queries.Load(), Probes: s.probes.Load(),
	}
}

// MemoryBytes estimates the shard's memory from its current counts.
func (st ShardStats) MemoryBytes() int64 {
	return st.Blocks*(entryBytes+tableSlotBytes*8/7) + st.Spilled*spillBytes
}

// Apply applies a batch of operations in order.
func (s *Shard) Apply(b *ShardBatch) {
	s.maintain()
	var stored, removed, stale uint64
	for i := range b.Ops {
		op := &b.Ops[i]
		if op.Owner == 0 || !s.owners.Valid(op.Owner, op.Epoch) {
			stale++
			continue
		}
		if op.Remove {
			s.remove(op.Hash, op.Owner, op.Epoch, op.Tiers)
			removed++
		} else {
			s.store(op.Hash, op.Owner, op.Epoch, op.Tiers)
			stored++
		}
	}
	s.stored.Add(stored)
	s.removed.Add(removed)
	s.stale.Add(stale)
	s.publish()
}

// Match answers q: for each queried block the shard holds, one hit per current owner.
func (s *Shard) Match(q *ShardQuery) {
	s.maintain()
	for i, h := range q.Hash {
		idx, ok := s.table[h]
		if !ok {
			continue
		}
		e := &s.entries[idx]
		e.age = ageMatched
		pos := q.Pos[i]
		if s.owners.Valid(e.owner, e.epoch) {
			q.Hits = append(q.Hits, ShardHit{Pos: pos, Owner: e.owner, Tiers: e.tiers})
		}
		for n := e.more; n != 0; n = s.spill[n].next {
			sp := &s.spill[n]
			if s.owners.Valid(sp.owner, sp.epoch) {
				q.Hits = append(q.Hits, ShardHit{Pos: pos, Owner: sp.owner, Tiers: sp.tiers})
			}
		}
	}
	s.queries.Add(1)
	s.probes.Add(uint64(len(q.Hash)))
}

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

// Reset empties the shard (after its owner goroutine failed mid-operation, its state cannot
// be trusted; an empty shard only costs misses).
func (s *Shard) Reset() {
	s.table = make(map[int64]uint32)
	s.entries = append(make([]entry, 0, 1024), entry{})
	s.free, s.spill, s.spFree = nil, make([]spillNode, 1, 64), nil
	s.hand, s.live, s.sweepPos = 0, 0, 0
	s.sweepGen = s.owners.ClearGen()
	s.publish()
}

// store records that owner (at epoch) holds h in tiers t.
func (s *Shard) store(h int64, owner OwnerID, epoch uint32, t Tiers) {
	idx, ok := s.table[h]
	if !ok {
		idx = s.newEntry(h)
		e := &s.entries[idx]
		e.owner, e.epoch, e.tiers = owner, epoch, t
		return
	}
	e := &s.entries[idx]
	e.age = max(e.age, ageStored)
	if e.owner == owner {
		if e.epoch == epoch {
			e.tiers |= t
		} else {
			e.epoch, e.tiers = epoch, t
		}
		return
	}
	for n := e.more; n != 0; n = s.spill[n].next {
		sp := &s.spill[n]
		if sp.owner == owner {
			if sp.epoch == epoch {
				sp.tiers |= t
			} else {
				sp.epoch, sp.tiers = epoch, t
			}
			return
		}
	}
	// Reuse a stale record before adding one.
	if !s.owners.Valid(e.owner, e.epoch) {
		e.owner, e.epoch, e.tiers = owner, epoch, t
		return
	}
	for n := e.more; n != 0; n = s.spill[n].next {
		sp := &s.spill[n]
		if !s.owners.Valid(sp.owner, sp.epoch) {
			sp.owner, sp.epoch, sp.tiers = owner, epoch, t
			return
		}
	}
	n := s.newSpill()
	s.spill[n] = spillNode{owner: owner, epoch: epoch, tiers: t, next: e.more}
	e.more = n // newSpill grows s.spill, never s.entries: e is still valid
}

// remove records that owner (at epoch) no longer holds h in tiers t.
func (s *Shard) remove(h int64, owner OwnerID, epoch uint32, t Tiers) {
	idx, ok := s.table[h]
	if !ok {
		return
	}
	e := &s.entries[idx]
	if e.owner == owner && e.epoch == epoch {
		e.tiers &^= t
		if e.tiers == 0 {
			s.dropFirst(idx)
		}
		return
	}
	prev := uint32(0)
	for n := e.more; n != 0; prev, n = n, s.spill[n].next {
		sp := &s.spill[n]
		if sp.owner != owner || sp.epoch != epoch {
			continue
		}
		sp.tiers &^= t
		if sp.tiers == 0 {
			s.unlinkSpill(idx, prev, n)
		}
		return
	}
}

// dropFirst removes an entry's first owner: the next spilled owner takes its place, or the
// entry is deleted.
func (s *Shard) dropFirst(idx uint32) {
	e := &s.entries[idx]
	if n := e.more; n != 0 {
		sp := s.spill[n]
		e.owner, e.epoch, e.tiers, e.more = sp.owner, sp.epoch, sp.tiers, sp.next
		s.freeSpill(n)
		return
	}
	s.deleteEntry(idx)
}

// unlinkSpill removes spill node n (after prev, or first when prev is 0) from entry idx.
func (s *Shard) unlinkSpill(idx, prev, n uint32) {
	next := s.spill[n].next
	if prev == 0 {
		s.entries[idx].more = next
	} else {
		s.spill[prev].next = next
	}
	s.freeSpill(n)
}

func (s *Shard) newEntry(h int64) uint32 {
	if s.live >= s.max {
		s.evict()
	}
	var idx uint32
	if n := len(s.free); n > 0 {
		idx = s.free[n-1]
		s.free = s.free[:n-1]
	} else {
		s.entries = append(s.entries, entry{})
		idx = uint32(len(s.entries) - 1)
	}
	s.entries[idx] = entry{hash: h, flags: entryLive, age: ageInserted}
	s.table[h] = idx
	s.live++
	return idx
}

func (s *Shard) deleteEntry(idx uint32) {
	e := &s.entries[idx]
	for n := e.more; n != 0; {
		next := s.spill[n].next
		s.freeSpill(n)
		n = next
	}
	delete(s.table, e.hash)
	*e = entry{}
	s.free = append(s.free, idx)
	s.live--
}

func (s *Shard) newSpill() uint32 {
	if n := len(s.spFree); n > 0 {
		idx := s.spFree[n-1]
		s.spFree = s.spFree[:n-1]
		return idx
	}
	s.spill = append(s.spill, spillNode{})
	return uint32(len(s.spill) - 1)
}

func (s *Shard) freeSpill(n uint32) {
	s.spill[n] = spillNode{}
	s.spFree = append(s.spFree, n)
}

// evict deletes one block chosen by the CLOCK hand: the first live block whose age is down
// to zero (the hand decrements the ages it passes), or one whose owners are all stale.
func (s *Shard) evict() {
	n := uint32(len(s.entries))
	if n <= 1 || s.live == 0 {
		return
	}
	for range (ageMatched+1)*n + 1 {
		s.hand++
		if s.hand >= n {
			s.hand = 1
		}
		e := &s.entries[s.hand]
		if e.flags&entryLive == 0 {
			continue
		}
		if e.age > 0 && (e.more != 0 || s.owners.Valid(e.owner, e.epoch)) {
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
	end := min(int(s.sweepPos)+sweepChunk, len(s.entries))
	var pruned uint64
	for i := int(s.sweepPos); i < end; i++ {
		if s.entries[i].flags&entryLive != 0 {
			pruned += s.pruneEntry(uint32(i))
		}
	}
	s.pruned.Add(pruned)
	if end >= len(s.entries) {
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
	prev := uint32(0)
	for sp := s.entries[idx].more; sp != 0; {
		next := s.spill[sp].next
		if !s.owners.Valid(s.spill[sp].owner, s.spill[sp].epoch) {
			s.unlinkSpill(idx, prev, sp)
			n++
		} else {
			prev = sp
		}
		sp = next
	}
	if e := &s.entries[idx]; !s.owners.Valid(e.owner, e.epoch) {
		s.dropFirst(idx)
		n++
	}
	return n
}

// publish updates the atomically readable sizes.
func (s *Shard) publish() {
	s.blocks.Store(int64(s.live))
	s.spilled.Store(int64(len(s.spill) - 1 - len(s.spFree)))
}
