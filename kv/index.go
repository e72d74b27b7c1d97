package kv

import (
	"context"
	"fmt"
	"io"
	"math/bits"
	"sync"
	"time"
)

// Index defaults.
const (
	DefaultShards        = 8
	DefaultMaxBlocks     = 4_000_000
	DefaultLookupTimeout = 100 * time.Millisecond
)

// Lookup waves: the first wave asks the shards about this many leading blocks, each next wave
// about waveGrowth times more, and a lookup stops after the first wave in which no owner still
// holds the whole prefix. A cold prompt costs one small wave; a fully cached one a few.
const (
	firstWave  = 64
	waveGrowth = 4
)

// maxBatchOps bounds one shard message of an IndexWriter.
const maxBatchOps = 4096

// IndexConfig configures an Index.
type IndexConfig struct {
	// Shards is the number of shards. Default DefaultShards (8).
	Shards int
	// MaxBlocks bounds the resident blocks over all shards; past it, the least recently
	// used (CLOCK approximation) are evicted. Default DefaultMaxBlocks (4,000,000).
	MaxBlocks int
	// LookupTimeout bounds a lookup whose context has no deadline. Default
	// DefaultLookupTimeout (100 ms).
	LookupTimeout time.Duration
	// Host starts the goroutines (or locks) that own the shards. Default NewLockedShards.
	Host func(shards []*Shard) (ShardHost, error)
	// Metrics receives the index's metrics. Default: a private set.
	Metrics *Metrics
}

// Index is the prefix index: block hash → owners ((worker, DP rank) pairs) per storage tier,
// sharded by block hash. It is the local CacheSource, and the state the remote indexer
// serves.
//
// Writes go through IndexWriters (one per ingesting goroutine), which batch block
// operations per shard and hand them to the shard host. Lookups hash the prompt with each
// block size the model's engines use, ask the shards in waves, and compute every owner's
// longest held prefix. Index is safe for concurrent use.
type Index struct {
	owners  *Owners
	shards  []*Shard
	host    ShardHost
	n       uint64
	timeout time.Duration
	metrics *Metrics

	scratch sync.Pool // *lookupScratch
	batches sync.Pool // *ShardBatch
}

var _ CacheSource = (*Index)(nil)

// NewIndex returns an empty index.
func NewIndex(cfg IndexConfig) (*Index, error) {
	if cfg.Shards <= 0 {
		cfg.Shards = DefaultShards
	}
	if cfg.MaxBlocks <= 0 {
		cfg.MaxBlocks = DefaultMaxBlocks
	}
	if cfg.LookupTimeout <= 0 {
		cfg.LookupTimeout = DefaultLookupTimeout
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	x := &Index{
		owners:  NewOwners(),
		n:       uint64(cfg.Shards),
		timeout: cfg.LookupTimeout,
		metrics: cfg.Metrics,
	}
	per := (cfg.MaxBlocks + cfg.Shards - 1) / cfg.Shards
	x.shards = make([]*Shard, cfg.Shards)
	for i := range x.shards {
		x.shards[i] = NewShard(x.owners, per)
	}
	if cfg.Host == nil {
		x.host = NewLockedShards(x.shards)
	} else {
		h, err := cfg.Host(x.shards)
		if err != nil {
			return nil, fmt.Errorf("cannot start index shards: %w", err)
		}
		x.host = h
	}
	x.batches.New = func() any {
		b := &ShardBatch{Ops: make([]ShardOp, 0, 64)}
		b.done = x.putBatch
		return b
	}
	set := cfg.Metrics.set
	set.GetOrCreateGauge(`switchyard_kv_index_blocks`, func() float64 { return float64(x.Stats().Blocks) })
	set.GetOrCreateGauge(`switchyard_kv_index_memory_bytes`, func() float64 { return float64(x.Stats().MemoryBytes) })
	set.GetOrCreateGauge(`switchyard_kv_index_owners`, func() float64 { return float64(x.owners.Len()) })
	set.GetOrCreateGauge(`switchyard_kv_index_stale_ops_total`, func() float64 { return float64(x.Stats().Stale) })
	set.GetOrCreateGauge(`switchyard_kv_index_evicted_blocks_total`, func() float64 { return float64(x.Stats().Evicted) })
	return x, nil
}

// Owners returns the index's owner registry.
func (x *Index) Owners() *Owners { return x.owners }

// Metrics returns the index's metric handles.
func (x *Index) Metrics() *Metrics { return x.metrics }

// Shards returns the number of shards.
func (x *Index) Shards() int { return len(x.shards) }

// Close stops the shard host when it has anything to stop.
func (x *Index) Close() error {
	if c, ok := x.host.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// IndexStats sums the shards' statistics.
type IndexStats struct {
	ShardStats
	// MemoryBytes is the estimated memory of the resident blocks.
	MemoryBytes int64
	// Owners is the number of registered owners.
	Owners int
}

// Stats returns the index's statistics. Safe for concurrent use.
func (x *Index) Stats() IndexStats {
	var st IndexStats
	for _, s := range x.shards {
		ss := s.Stats()
		st.Blocks += ss.Blocks
		st.Spilled += ss.Spilled
		st.Stored += ss.Stored
		st.Removed += ss.Removed
		st.Stale += ss.Stale
		st.Evicted += ss.Evicted
		st.Pruned += ss.Pruned
		st.Queries += ss.Queries
		st.Probes += ss.Probes
	}
	st.MemoryBytes = st.ShardStats.MemoryBytes()
	st.Owners = x.owners.Len()
	return st
}

// SetWorker registers (or updates) a worker's owners; see Owners.SetWorker.
func (x *Index) SetWorker(worker, model string, dpSize, blockSize int) ([]OwnerID, error) {
	return x.owners.SetWorker(worker, model, dpSize, blockSize)
}

// RemoveWorker forgets worker and prunes its entries from every shard (best effort: a busy
// shard reclaims them with its next message). It reports whether the worker was known.
func (x *Index) RemoveWorker(worker string) bool {
	if !x.owners.RemoveWorker(worker) {
		return false
	}
	x.metrics.clears[clearRemoved].Inc()
	x.Prune()
	return true
}

// ClearWorker invalidates every entry of worker's DP ranks.
func (x *Index) ClearWorker(worker string) {
	x.owners.ClearWorker(worker)
	x.Prune()
}

// clearOwner invalidates owner's entries for reason.
func (x *Index) clearOwner(id OwnerID, reason clearReason) {
	x.owners.Clear(id)
	x.metrics.clears[reason].Inc()
}

// Prune asks every shard to reclaim the records of cleared owners now.
func (x *Index) Prune() {
	for i := range x.shards {
		_ = x.host.Prune(i)
	}
}

func (x *Index) shardOf(h int64) int {
	hi, _ := bits.Mul64(uint64(h), x.n)
	return int(hi)
}

func (x *Index) getBatch() *ShardBatch { return x.batches.Get().(*ShardBatch) }

func (x *Index) putBatch(b *ShardBatch) {
	if cap(b.Ops) > 4*maxBatchOps {
		return
	}
	b.Ops = b.Ops[:0]
	x.batches.Put(b)
}

// IndexWriter batches block operations per shard for one ingesting goroutine. It is not safe
// for concurrent use.
type IndexWriter struct {
	x       *Index
	batches []*ShardBatch
	pending int
	dropped []OwnerID
}

// NewWriter returns a writer for one ingesting goroutine.
func (x *Index) NewWriter() *IndexWriter {
	return &IndexWriter{x: x, batches: make([]*ShardBatch, len(x.shards))}
}

// Store queues: owner (at epoch) holds block h in tiers t.
func (w *IndexWriter) Store(owner OwnerID, epoch uint32, h int64, t Tiers) {
	w.add(ShardOp{Hash: h, Owner: owner, Epoch: epoch, Tiers: t})
}

// Remove queues: owner (at epoch) no longer holds block h in tiers t.
func (w *IndexWriter) Remove(owner OwnerID, epoch uint32, h int64, t Tiers) {
	w.add(ShardOp{Hash: h, Owner: owner, Epoch: epoch, Tiers: t, Remove: true})
}

func (w *IndexWriter) add(op ShardOp) {
	i := w.x.shardOf(op.Hash)
	b := w.batches[i]
	if b == nil {
		b = w.x.getBatch()
		w.batches[i] = b
	}
	b.Ops = append(b.Ops, op)
	w.pending++
	if len(b.Ops) >= maxBatchOps {
		w.send(i)
	}
}

// Pending is the number of queued operations.
func (w *IndexWriter) Pending() int { return w.pending }

// Flush hands every queued operation to the shards and returns how many were refused by a
// busy shard. The owners of a refused batch are cleared: a partly applied history could
// leave stale ownership, and a stale index is worse than an empty one.
func (w *IndexWriter) Flush() (dropped int) {
	for i := range w.batches {
		if w.batches[i] != nil {
			dropped += w.send(i)
		}
	}
	return dropped
}

// send hands shard i's batch over; it returns the number of operations dropped.
func (w *IndexWriter) send(i int) int {
	b := w.batches[i]
	w.batches[i] = nil
	n := len(b.Ops)
	w.pending -= n
	if err := w.x.host.Apply(i, b); err == nil {
		w.x.metrics.opsApplied.Add(n)
		return 0
	}
	w.dropped = w.dropped[:0]
	for k := range b.Ops {
		o := b.Ops[k].Owner
		if len(w.dropped) == 0 || w.dropped[len(w.dropped)-1] != o {
			w.dropped = append(w.dropped, o)
		}
	}
	b.Done()
	w.x.metrics.opsDroppedBusy.Add(n)
	for k, o := range w.dropped {
		if o != 0 && !containsOwner(w.dropped[:k], o) {
			w.x.clearOwner(o, clearDropped)
		}
	}
	return n
}

func containsOwner(ids []OwnerID, o OwnerID) bool {
	for _, id := range ids {
		if id == o {
			return true
		}
	}
	return false
}

// lookupScratch is one lookup's reusable state.
type lookupScratch struct {
	hashes []int64
	qs     []ShardQuery
	qp     []*ShardQuery
	cursor []int
	// Per owner: count is the owner's held leading blocks; want marks the owners of the
	// block-size group being matched (want[o] == gen).
	count []uint32
	want  []uint32
	gen   uint32
}

func (x *Index) getScratch(maxID OwnerID) *lookupScratch {
	sc, _ := x.scratch.Get().(*lookupScratch)
	if sc == nil {
		sc = &lookupScratch{
			qs:     make([]ShardQuery, len(x.shards)),
			qp:     make([]*ShardQuery, len(x.shards)),
			cursor: make([]int, len(x.shards)),
		}
	}
	if need := int(maxID) + 1; len(sc.count) < need {
		sc.count = make([]uint32, need+need/2)
		sc.want = make([]uint32, need+need/2)
		sc.gen = 0
	}
	return sc
}

// Lookup implements CacheSource.
func (x *Index) Lookup(ctx context.Context, model string, tokens []uint32, dst *Lookup) error {
	start := time.Now()
	err := x.lookup(ctx, model, tokens, dst)
	x.metrics.observeLookup(sourceLocal, start, err)
	return err
}

func (x *Index) lookup(ctx context.Context, model string, tokens []uint32, dst *Lookup) error {
	dst.Reset()
	dst.QueryTokens = len(tokens)
	if len(tokens) == 0 {
		return nil
	}
	snap := x.owners.snap.Load()
	groups := snap.models[model]
	if len(groups) == 0 {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		if _, locked := x.host.(*LockedShards); !locked {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, x.timeout)
			defer cancel()
		}
	}
	sc := x.getScratch(snap.maxID)
	for _, g := range groups {
		sc.hashes = AppendBlockHashes(sc.hashes[:0], tokens, g.blockSize)
		sc.gen++
		if sc.gen == 0 {
			clear(sc.want)
			sc.gen = 1
		}
		for _, o := range g.owners {
			sc.want[o] = sc.gen
			sc.count[o] = 0
		}
		if err := x.matchWaves(ctx, sc); err != nil {
			// A shard may still write to the queries: drop the scratch instead of pooling it.
			dst.Reset()
			return fmt.Errorf("cannot look up prefix of %d tokens: %w: %w", len(tokens), ErrUnavailable, err)
		}
		bs := int64(g.blockSize)
		for _, o := range g.owners {
			if c := sc.count[o]; c > 0 {
				dst.Matches = append(dst.Matches, Match{Worker: snap.info[o].Worker, Tokens: min(int64(c)*bs, int64(len(tokens)))})
			}
		}
	}
	x.scratch.Put(sc)
	dst.normalize()
	return nil
}

// matchWaves asks the shards about sc.hashes in growing waves and leaves in sc.count the
// number of leading blocks each wanted owner holds.
func (x *Index) matchWaves(ctx context.Context, sc *lookupScratch) error {
	n := len(sc.hashes)
	size := firstWave
	for lo := 0; lo < n; lo, size = lo+size, size*waveGrowth {
		hi := min(n, lo+size)
		for i := range sc.qs {
			sc.qs[i].reset()
			sc.qp[i] = nil
			sc.cursor[i] = 0
		}
		for p := lo; p < hi; p++ {
			h := sc.hashes[p]
			i := x.shardOf(h)
			q := &sc.qs[i]
			q.Pos = append(q.Pos, uint32(p))
			q.Hash = append(q.Hash, h)
			sc.qp[i] = q
		}
		if err := x.host.Match(ctx, sc.qp); err != nil {
			return err
		}
		for p := lo; p < hi; p++ {
			i := x.shardOf(sc.hashes[p])
			hits := sc.qs[i].Hits
			c := sc.cursor[i]
			advanced := false
			for ; c < len(hits) && hits[c].Pos == uint32(p); c++ {
				o := hits[c].Owner
				if int(o) < len(sc.want) && sc.want[o] == sc.gen && sc.count[o] == uint32(p) {
					sc.count[o] = uint32(p) + 1
					advanced = true
				}
			}
			sc.cursor[i] = c
			if !advanced {
				return nil // no owner holds the prefix through block p
			}
		}
	}
	return nil
}
