package subscribe

import (
	"fmt"
	"log/slog"
	"time"

	"switchyard/kv"
	"switchyard/kv/events"
	"switchyard/kv/hashing"
	"switchyard/kv/index"
	"switchyard/load"
)

// maxRekeyBlocks bounds the engine-hash → router-key map of one re-keyed owner; past it,
// new blocks are not indexed (a miss, never a stale hit).
const maxRekeyBlocks = 1 << 21

// msgUnkeyed is the throttled log of BlockStored events whose token IDs do not cover their
// blocks, so that they cannot be keyed.
const msgUnkeyed = "KV blocks not indexed: their token IDs do not cover them"

// seqVerdict is what a sequence number says about the messages before it.
type seqVerdict uint8

const (
	seqNext      seqVerdict = iota // the first message, or the one after the last
	seqGap                         // messages were lost
	seqRestart                     // the sequence went back: the publisher restarted
	seqDuplicate                   // already applied (replayed, then received live)
)

// seqTracker follows one publisher's sequence numbers, which count up from 0.
type seqTracker struct {
	known bool
	last  uint64
	// After a replay, live messages in [dupFrom, last] were already applied from the replay
	// socket and are skipped; anything below dupFrom is a restart as usual.
	dedupe  bool
	dupFrom uint64
}

// observe classifies seq; it does not advance the tracker (advance does, once applied).
func (t *seqTracker) observe(seq uint64) seqVerdict {
	switch {
	case !t.known || seq == t.last+1:
		return seqNext
	case seq > t.last+1:
		return seqGap
	case t.dedupe && seq >= t.dupFrom:
		return seqDuplicate
	}
	return seqRestart
}

func (t *seqTracker) advance(seq uint64) {
	t.known, t.last = true, seq
	t.dedupe = false
}

// replayed marks the batches up to last as applied by a replay that live message from
// revealed: live messages from..last that are still queued are duplicates.
func (t *seqTracker) replayed(from uint64) {
	t.dedupe, t.dupFrom = true, from
}

// reset forgets the sequence: the next message starts afresh.
func (t *seqTracker) reset() { *t = seqTracker{} }

// applier turns one worker's decoded event batches into index operations. It keys blocks
// by the engine's own hashes once they are verified to be the router's (SGLang), or re-keys
// them from the token IDs carried by BlockStored (vLLM-style engines, whose hashes the
// router cannot reproduce), mapping the engine's hashes to the router's for later removes.
// An index keyed by the router's own keys (index.BlockKeyRouter) has every engine re-keyed
// to them, whatever its hashes.
//
// An applier is owned by one goroutine.
type applier struct {
	x      *index.Index
	w      *index.Writer
	m      *kv.Metrics
	log    *slog.Logger
	worker string
	// rekey: key by router hashes recomputed from token IDs. verified: a first block's hash
	// matched the router's (or the scheme says so), so engine hashes are used as they are.
	rekey, verified bool
	keys            map[int][]rekeyMap // by DP rank
	// routerKeys, when not nil, are the index's own keys (index.BlockKeyRouter): rekey is
	// set, and blocks are re-keyed to them rather than to the SHA-256 chain.
	routerKeys *index.RouterKeys
	// maxKeys bounds each owner's map (maxRekeyBlocks).
	maxKeys int
	unkeyed load.LogThrottle // msgUnkeyed
	// rawRanks are the ranks this applier indexed under the engine's own hashes before
	// they were verified: a mismatch clears them (and no other applier's).
	rawRanks map[int]bool
	// touched keeps touchKeys's loads from being optimised away.
	touched int64
}

// rekeyMap maps an engine's block hashes to the router's keys for one owner: d to the
// SHA-256 chain's digests (index.BlockKeyEngine; a block's key is its digest's wire hash,
// and its children's digests chain from the whole digest), r to the router's own keys
// (index.BlockKeyRouter, which chain from the key itself). One of them is set.
type rekeyMap struct {
	owner index.OwnerID
	epoch uint32
	d     *keyTable[hashing.Digest]
	r     *keyTable[int64]
}

// newApplier returns the applier of worker's events on x, its engine's hashes declared by
// scheme; unkeyed is the throttled log of blocks whose token IDs do not cover them.
func newApplier(x *index.Index, worker, scheme string, log *slog.Logger, unkeyed load.LogThrottle) *applier {
	rk := x.RouterKeys()
	unkeyed.Msg = msgUnkeyed
	return &applier{x: x, w: x.NewWriter(), m: x.Metrics(), log: log, worker: worker,
		rekey: scheme == HashSchemeRekey || rk != nil, verified: scheme == HashSchemeSGLang && rk == nil,
		routerKeys: rk, maxKeys: maxRekeyBlocks, unkeyed: unkeyed,
		keys: map[int][]rekeyMap{}, rawRanks: map[int]bool{}}
}

// needsTokens reports whether the applier reads events' token IDs: to verify an engine's
// hashes, or to re-key its blocks. An engine whose hashes are the router's needs none, and
// its batches are decoded without them (events.Decoder.SkipTokenIDs).
func (a *applier) needsTokens() bool { return a.rekey || !a.verified }

// keysFor returns the re-key map of owner at epoch, emptied when the owner's epoch moved on.
func (a *applier) keysFor(rank int, owner index.OwnerID, epoch uint32) *rekeyMap {
	ks := a.keys[rank]
	if len(ks) == 0 {
		ks = []rekeyMap{{}}
		a.keys[rank] = ks
	}
	k := &ks[0]
	if (k.d == nil && k.r == nil) || k.owner != owner || k.epoch != epoch {
		*k = rekeyMap{owner: owner, epoch: epoch}
		if a.routerKeys != nil {
			k.r = &keyTable[int64]{}
		} else {
			k.d = &keyTable[hashing.Digest]{}
		}
	}
	return k
}

// key returns the index key engine hash h was re-keyed to.
func (k *rekeyMap) key(h int64) (int64, bool) {
	if k.r != nil {
		return k.r.get(h)
	}
	d, ok := k.d.get(h)
	return d.Hash(), ok
}

// forget drops engine hash h.
func (k *rekeyMap) forget(h int64) {
	if k.r != nil {
		k.r.del(h)
		return
	}
	k.d.del(h)
}

// apply applies one batch of the publisher of defaultRank (a batch's own DP rank wins). It
// returns an error for a batch naming an unknown rank; the batch is then dropped.
func (a *applier) apply(b *events.EventBatch, defaultRank int) error {
	rank := defaultRank
	if b.HasDPRank {
		rank = b.DPRank
	}
	owners := a.x.Owners()
	owner, ok := owners.Lookup(a.worker, rank)
	if !ok && rank > 0 && rank < maxDPRanks {
		// A rank the router was not told of (a vLLM engine's DP size comes from no
		// /server_info): register the ranks up to it, keeping the others' entries.
		if r0, ok0 := owners.Lookup(a.worker, 0); ok0 {
			info := owners.Info(r0)
			if _, err := a.x.SetWorker(a.worker, info.Model, rank+1, info.BlockSize); err == nil {
				owner, ok = owners.Lookup(a.worker, rank)
			}
		}
	}
	if !ok {
		return fmt.Errorf("cannot apply KV events of %s: unknown DP rank %d", a.worker, rank)
	}
	epoch := owners.Epoch(owner)
	info := owners.Info(owner)
	for i := range b.Events {
		if i%keyAhead == 0 {
			a.touchKeys(rank, b.Events[i:min(i+keyAhead, len(b.Events))])
		}
		ev := &b.Events[i]
		switch ev.Kind {
		case events.EventAllBlocksCleared:
			a.x.ClearOwner(owner, kv.ClearAllBlocks)
			epoch = owners.Epoch(owner)
		case events.EventBlockStored:
			if ev.BlockSize > 0 && ev.BlockSize != info.BlockSize {
				owners.SetBlockSize(a.worker, ev.BlockSize)
				info = owners.Info(owner)
				epoch = owners.Epoch(owner)
			}
			if !a.rekey && !a.verified {
				a.verify(ev, info.BlockSize, rank)
				epoch = owners.Epoch(owner)
			}
			t := index.StoreTiers(ev.Medium)
			if a.rekey {
				a.rekeyStore(ev, rank, owner, epoch, info.BlockSize, t)
				continue
			}
			if !a.verified && ev.HasParent && len(ev.TokenIDs) > 0 {
				// Not yet known to be the router's hashes, and not checkable (the parent's
				// digest is unknown: the router joined late): indexing the engine's hashes
				// could store a vLLM engine's raw hashes as if they were the router's. A
				// miss until a block without a parent settles the scheme.
				a.m.OpsDroppedUnkey.Add(len(ev.BlockHashes))
				continue
			}
			if !a.verified {
				a.rawRanks[rank] = true
			}
			for _, h := range ev.BlockHashes {
				a.w.Store(owner, epoch, h, t)
			}
		case events.EventBlockRemoved:
			t := index.RemoveTiers(ev.Medium)
			if a.rekey {
				k := a.keysFor(rank, owner, epoch)
				for _, h := range ev.BlockHashes {
					if key, ok := k.key(h); ok {
						a.w.Remove(owner, epoch, key, t)
						if t == index.AllTiers {
							k.forget(h)
						}
					}
				}
				continue
			}
			for _, h := range ev.BlockHashes {
				a.w.Remove(owner, epoch, h, t)
			}
		}
	}
	a.w.Flush()
	a.m.ObserveLag(b.TS, time.Now())
	return nil
}

// keyAhead is how many events' re-key lines apply loads ahead (touchKeys): their cache
// misses overlap, where a Go map's would follow one another.
const keyAhead = 8

// touchKeys loads, ahead of their events, the lines of rank's re-key table (if there is
// one) that evs will read or write: their parents' and their blocks'.
func (a *applier) touchKeys(rank int, evs []events.Event) {
	ks := a.keys[rank]
	if len(ks) == 0 {
		return
	}
	if ks[0].r != nil {
		a.touched = touchEvents(ks[0].r, evs, a.touched)
	} else if ks[0].d != nil {
		a.touched = touchEvents(ks[0].d, evs, a.touched)
	}
}

// touchEvents loads t's lines of evs's parents and blocks, adding a word of each to sum.
func touchEvents[V any](t *keyTable[V], evs []events.Event, sum int64) int64 {
	for i := range evs {
		ev := &evs[i]
		if ev.HasParent {
			sum += t.touch(ev.ParentHash)
		}
		for _, h := range ev.BlockHashes {
			sum += t.touch(h)
		}
	}
	return sum
}

// verify checks a first block's hash against the router's and switches to re-keying, clearing
// what this applier keyed by the engine's hashes (rawRanks), when they differ. Blocks with a
// parent or an adapter cannot be checked.
func (a *applier) verify(ev *events.Event, blockSize, rank int) {
	if ev.HasParent || ev.HasLoRA || len(ev.BlockHashes) == 0 || len(ev.TokenIDs) == 0 || blockSize < 1 {
		return
	}
	d := hashing.HashBlock(nil, ev.TokenIDs[:min(blockSize, len(ev.TokenIDs))])
	if d.Hash() == ev.BlockHashes[0] {
		a.verified = true
		return
	}
	a.rekey = true
	a.m.HashMismatches.Inc()
	for r := range a.rawRanks {
		if id, ok := a.x.Owners().Lookup(a.worker, r); ok {
			a.x.ClearOwner(id, kv.ClearRekey)
		}
	}
	clear(a.rawRanks)
	a.log.Warn("engine block hashes differ from the router's; re-keying from token IDs", slog.String("worker", a.worker))
}

// rekeyStore indexes a BlockStored under router keys chained from the parent's.
func (a *applier) rekeyStore(ev *events.Event, rank int, owner index.OwnerID, epoch uint32, blockSize int, t index.Tiers) {
	k := a.keysFor(rank, owner, epoch)
	n := len(ev.BlockHashes)
	if n == 0 {
		return
	}
	if blockSize < 1 || len(ev.TokenIDs) > n*blockSize || len(ev.TokenIDs) <= (n-1)*blockSize {
		a.m.OpsDroppedUnkey.Add(n)
		a.unkeyed.Note(fmt.Errorf("%d token IDs for %d blocks of %d tokens", len(ev.TokenIDs), n, blockSize))
		return
	}
	if k.r != nil {
		a.routerStore(ev, k, owner, epoch, blockSize, t)
		return
	}
	// The chain's last digest lives in one variable outside the loop: a pointer to a digest
	// declared in the loop would move each block's digest to the heap.
	var last hashing.Digest
	var parent *hashing.Digest
	if ev.HasParent {
		d, ok := k.d.get(ev.ParentHash)
		if !ok {
			a.m.OpsDroppedUnkey.Add(n) // parent stored before we subscribed, or evicted
			return
		}
		last, parent = d, &last
	}
	for i, h := range ev.BlockHashes {
		if k.d.len() >= a.maxKeys {
			a.m.OpsDroppedUnkey.Add(n - i)
			return
		}
		last = hashing.HashBlock(parent, ev.TokenIDs[i*blockSize:min((i+1)*blockSize, len(ev.TokenIDs))])
		k.d.put(h, last)
		a.w.Store(owner, epoch, last.Hash(), t)
		parent = &last
	}
}

// routerStore indexes a BlockStored, whose token IDs cover its blocks, under the index's own
// keys (index.BlockKeyRouter) chained from the parent's.
func (a *applier) routerStore(ev *events.Event, k *rekeyMap, owner index.OwnerID, epoch uint32, blockSize int, t index.Tiers) {
	n := len(ev.BlockHashes)
	var parent int64
	if ev.HasParent {
		p, ok := k.r.get(ev.ParentHash)
		if !ok {
			a.m.OpsDroppedUnkey.Add(n) // parent stored before we subscribed, or evicted
			return
		}
		parent = p
	}
	for i, h := range ev.BlockHashes {
		if k.r.len() >= a.maxKeys {
			a.m.OpsDroppedUnkey.Add(n - i)
			return
		}
		key := a.routerKeys.Block(parent, ev.TokenIDs[i*blockSize:min((i+1)*blockSize, len(ev.TokenIDs))])
		k.r.put(h, key)
		a.w.Store(owner, epoch, key, t)
		parent = key
	}
}
