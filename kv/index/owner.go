package index

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"switchyard/kv/events"
)

// Tiers is a set of storage tiers holding a block.
type Tiers uint8

// Storage tiers as index bits.
const (
	TierGPU Tiers = 1 << iota
	TierCPUPinned
	TierDisk
	TierExternal

	// AllTiers is every tier: a remove without a (known) medium clears them all.
	AllTiers = TierGPU | TierCPUPinned | TierDisk | TierExternal
)

// StoreTiers is the tier a BlockStored event of medium m fills: a store without a medium
// means GPU. An unknown medium is kept as EXTERNAL (the block is held somewhere the engine can
// load it from).
func StoreTiers(m events.Medium) Tiers {
	switch m {
	case events.MediumNone, events.MediumGPU:
		return TierGPU
	case events.MediumCPUPinned:
		return TierCPUPinned
	case events.MediumDisk:
		return TierDisk
	}
	return TierExternal
}

// RemoveTiers is the set of tiers a BlockRemoved event of medium m clears: without a known
// medium, every tier.
func RemoveTiers(m events.Medium) Tiers {
	switch m {
	case events.MediumGPU:
		return TierGPU
	case events.MediumCPUPinned:
		return TierCPUPinned
	case events.MediumDisk:
		return TierDisk
	case events.MediumExternal:
		return TierExternal
	}
	return AllTiers
}

// OwnerID names one owner of cached blocks: a (worker, DP rank) pair. IDs are small and
// dense; 0 is never a valid owner. An ID is reused after its owner is removed: its epoch
// keeps counting up across reuse, so entries of the former owner stay invalid.
type OwnerID uint32

// MaxOwners bounds the owners registered at once ((worker, DP rank) pairs).
const MaxOwners = 1 << 16

// ErrTooManyOwners is returned when registering more than MaxOwners owners at once.
var ErrTooManyOwners = errors.New("too many KV owners")

// OwnerInfo describes one owner.
type OwnerInfo struct {
	// Worker is the worker ID.
	Worker string
	// Rank is the DP rank.
	Rank int
	// Model is the model the worker serves; lookups are restricted to a model's owners.
	Model string
	// BlockSize is the owner's tokens per block (the engine's page size).
	BlockSize int
}

// Owners registers the owners of cached blocks and their epochs. An owner's entries are
// valid while they carry its current epoch: clearing an owner (engine restart, sequence gap
// without replay, removal) is one atomic increment, visible at once to every lookup that
// starts after it (a lookup reads the epochs of the owners it asks about when it starts), and
// the shards reclaim the stale entries lazily.
//
// Owners is safe for concurrent use. Registration serializes on a mutex and publishes an
// immutable snapshot; epochs are atomics read without locks.
type Owners struct {
	epochs   [MaxOwners]atomic.Uint32
	clearGen atomic.Uint64

	mu   sync.Mutex
	snap atomic.Pointer[ownerSnapshot]
	// Owned under mu.
	free []OwnerID
	next OwnerID
}

// ownerSnapshot is an immutable view of the registered owners.
type ownerSnapshot struct {
	info     []OwnerInfo          // by OwnerID; Worker == "" for a free ID
	byWorker map[string][]OwnerID // by DP rank
	models   map[string][]modelGroup
	maxID    OwnerID
}

// modelGroup is the owners of one model that share a block size.
type modelGroup struct {
	blockSize int
	owners    []OwnerID
}

// NewOwners returns an empty registry.
func NewOwners() *Owners {
	o := &Owners{next: 1}
	o.snap.Store(&ownerSnapshot{info: make([]OwnerInfo, 1), byWorker: map[string][]OwnerID{}, models: map[string][]modelGroup{}})
	return o
}

// Epoch returns owner id's current epoch.
func (o *Owners) Epoch(id OwnerID) uint32 { return o.epochs[id].Load() }

// Valid reports whether an entry of id stamped with epoch is still current.
func (o *Owners) Valid(id OwnerID, epoch uint32) bool { return o.epochs[id].Load() == epoch }

// ClearGen counts clears and removals; shards compare it to know when to sweep.
func (o *Owners) ClearGen() uint64 { return o.clearGen.Load() }

// Clear invalidates every entry of owner id at once.
func (o *Owners) Clear(id OwnerID) {
	if id == 0 || int(id) >= MaxOwners {
		return
	}
	o.epochs[id].Add(1)
	o.clearGen.Add(1)
}

// ClearWorker invalidates every entry of every DP rank of worker.
func (o *Owners) ClearWorker(worker string) {
	for _, id := range o.snap.Load().byWorker[worker] {
		o.Clear(id)
	}
}

// Lookup returns the owner of worker's DP rank, or false.
func (o *Owners) Lookup(worker string, rank int) (OwnerID, bool) {
	ids := o.snap.Load().byWorker[worker]
	if rank < 0 || rank >= len(ids) {
		return 0, false
	}
	return ids[rank], true
}

// Info returns what is known of owner id; Worker is "" for an unregistered ID.
func (o *Owners) Info(id OwnerID) OwnerInfo {
	s := o.snap.Load()
	if int(id) >= len(s.info) {
		return OwnerInfo{}
	}
	return s.info[id]
}

// Workers returns the registered worker IDs, sorted.
func (o *Owners) Workers() []string {
	s := o.snap.Load()
	out := make([]string, 0, len(s.byWorker))
	for w := range s.byWorker {
		out = append(out, w)
	}
	slices.Sort(out)
	return out
}

// Len returns the number of registered owners.
func (o *Owners) Len() int {
	n := 0
	for _, ids := range o.snap.Load().byWorker {
		n += len(ids)
	}
	return n
}

// SetWorker registers worker with dpSize DP ranks (at least 1) serving model with blockSize
// tokens per block, and returns its owners by rank. Re-registering keeps the owners (and
// entries) of ranks that still exist, updates model and block size, and removes the ranks
// beyond dpSize. Changing the model or block size clears the worker's entries.
func (o *Owners) SetWorker(worker, model string, dpSize, blockSize int) ([]OwnerID, error) {
	if worker == "" {
		return nil, fmt.Errorf("cannot register KV owner: empty worker ID")
	}
	if blockSize < 1 {
		return nil, fmt.Errorf("cannot register KV owner %s: block size %d", worker, blockSize)
	}
	dpSize = max(dpSize, 1)
	o.mu.Lock()
	defer o.mu.Unlock()
	old := o.snap.Load()
	ids := slices.Clone(old.byWorker[worker])
	info := slices.Clone(old.info)
	var cleared bool
	for len(ids) > dpSize {
		id := ids[len(ids)-1]
		ids = ids[:len(ids)-1]
		o.release(id, info)
		cleared = true
	}
	for r, id := range ids {
		if info[id].Model != model || info[id].BlockSize != blockSize {
			o.epochs[id].Add(1)
			cleared = true
		}
		info[id] = OwnerInfo{Worker: worker, Rank: r, Model: model, BlockSize: blockSize}
	}
	for r := len(ids); r < dpSize; r++ {
		id, err := o.alloc()
		if err != nil {
			return nil, fmt.Errorf("cannot register KV owner %s rank %d: %w", worker, r, err)
		}
		for int(id) >= len(info) {
			info = append(info, OwnerInfo{})
		}
		info[id] = OwnerInfo{Worker: worker, Rank: r, Model: model, BlockSize: blockSize}
		ids = append(ids, id)
	}
	byWorker := make(map[string][]OwnerID, len(old.byWorker)+1)
	for w, v := range old.byWorker {
		byWorker[w] = v
	}
	byWorker[worker] = ids
	o.publish(info, byWorker)
	if cleared {
		o.clearGen.Add(1)
	}
	return slices.Clone(ids), nil
}

// SetBlockSize changes worker's block size (learned from its events), clearing its entries
// when it changes. It reports whether the worker is registered.
func (o *Owners) SetBlockSize(worker string, blockSize int) bool {
	s := o.snap.Load()
	ids, ok := s.byWorker[worker]
	if !ok || len(ids) == 0 {
		return false
	}
	if s.info[ids[0]].BlockSize == blockSize || blockSize < 1 {
		return true
	}
	_, err := o.SetWorker(worker, s.info[ids[0]].Model, len(ids), blockSize)
	return err == nil
}

// RemoveWorker forgets worker: its entries become invalid at once and its IDs are freed.
// It reports whether the worker was registered.
func (o *Owners) RemoveWorker(worker string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	old := o.snap.Load()
	ids, ok := old.byWorker[worker]
	if !ok {
		return false
	}
	info := slices.Clone(old.info)
	for _, id := range ids {
		o.release(id, info)
	}
	byWorker := make(map[string][]OwnerID, len(old.byWorker))
	for w, v := range old.byWorker {
		if w != worker {
			byWorker[w] = v
		}
	}
	o.publish(info, byWorker)
	o.clearGen.Add(1)
	return true
}

// alloc returns a free ID; called under mu.
func (o *Owners) alloc() (OwnerID, error) {
	if n := len(o.free); n > 0 {
		id := o.free[n-1]
		o.free = o.free[:n-1]
		return id, nil
	}
	if int(o.next) >= MaxOwners {
		return 0, ErrTooManyOwners
	}
	id := o.next
	o.next++
	return id, nil
}

// release invalidates id's entries and frees it; called under mu.
func (o *Owners) release(id OwnerID, info []OwnerInfo) {
	o.epochs[id].Add(1)
	info[id] = OwnerInfo{}
	o.free = append(o.free, id)
}

// publish builds and stores a snapshot; called under mu.
func (o *Owners) publish(info []OwnerInfo, byWorker map[string][]OwnerID) {
	s := &ownerSnapshot{info: info, byWorker: byWorker, models: map[string][]modelGroup{}}
	for id := range info {
		in := &info[id]
		if in.Worker == "" {
			continue
		}
		s.maxID = max(s.maxID, OwnerID(id))
		groups := s.models[in.Model]
		i := slices.IndexFunc(groups, func(g modelGroup) bool { return g.blockSize == in.BlockSize })
		if i < 0 {
			groups = append(groups, modelGroup{blockSize: in.BlockSize})
			i = len(groups) - 1
		}
		groups[i].owners = append(groups[i].owners, OwnerID(id))
		s.models[in.Model] = groups
	}
	for _, groups := range s.models {
		slices.SortFunc(groups, func(a, b modelGroup) int { return cmp.Compare(a.blockSize, b.blockSize) })
	}
	o.snap.Store(s)
}
