package index

import (
	"context"
	"fmt"
	"io"
	"math/bits"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"switchyard/kv"
	"switchyard/kv/hashing"
)

// Index defaults.
const (
	// DefaultShards (0) means one shard per core: runtime.GOMAXPROCS(0) when New runs.
	DefaultShards        = 0
	DefaultMaxBlocks     = 4_000_000
	DefaultLookupTimeout = 100 * time.Millisecond
)

// Lookup waves: the first wave asks the shards about this many leading blocks, each next wave
// about waveGrowth times more, and a lookup stops after the first wave in which no owner still
// holds the whole prefix. A cold prompt costs one small wave; a long cached one is streamed
// after the first (see matchStream).
const (
	firstWave  = 64
	waveGrowth = 4
)

// nextWave is the size of the wave after one of size blocks.
func nextWave(size int) int { return size * waveGrowth }

// maxBatchOps bounds one shard message of a Writer.
const maxBatchOps = 4096

// Config configures an Index.
type Config struct {
	// Shards is the number of shards. Default (0 or less): one per core, GOMAXPROCS (more
	// shard actors than cores only add hand-offs; docs/benchmarks.md).
	Shards int
	// MaxBlocks bounds the resident blocks over all shards; past it, the least recently
	// used (CLOCK approximation) are evicted. Default DefaultMaxBlocks (4,000,000).
	MaxBlocks int
	// LookupTimeout bounds a lookup whose context has no deadline: how long it may wait for
	// the shards it could not read directly to answer through their host. Default
	// DefaultLookupTimeout (100 ms).
	LookupTimeout time.Duration
	// Host starts the goroutines (or locks) that own the shards. Default NewLockedShards.
	Host func(shards []*Shard) (ShardHost, error)
	// Metrics receives the index's metrics. Default: a private set.
	Metrics *kv.Metrics
	// HashCacheChunks is the number of prompt chunks (64 blocks each, about 560 bytes) whose
	// block hashes lookups remember, so that a prompt sharing a prefix with a recent one is
	// not hashed again. 0 (the default here; the router's kv.hash_cache_chunks is 16384)
	// turns the cache off.
	HashCacheChunks int
	// BlockKey is what blocks are keyed by: BlockKeyEngine (the default, also "") or
	// BlockKeyRouter. With BlockKeyRouter there is no hash cache (HashCacheChunks is not
	// used): a chunk's cache key costs about what its router keys do.
	BlockKey string
	// SplitBlocks, when not 0, splits a lookup keyed by the router's keys (BlockKeyRouter) of
	// at least this many blocks across two goroutines: the index's twin (twin.go), one more
	// goroutine per index started by the first such lookup and stopped by Close, matches the
	// back part of the prompt while the lookup goroutine matches the front. It buys a lower
	// tail with a spare core, at a higher median on a busy one (docs/benchmarks.md). 0 (the
	// default) keeps every lookup on its own goroutine; otherwise at least MinSplitBlocks.
	// Not used with BlockKeyEngine, nor with GOMAXPROCS 1.
	SplitBlocks int

	// observer sees streamed lookups (tests in this package); nil: none.
	observer streamObserver
	// matchRest, when not nil, matches blocks [1, n) of a lookup keyed by the router's keys
	// instead of the matcher or the twin, as matchDirect does (tests in this package).
	matchRest func(x *Index, sc *lookupScratch, w, n int) (end int, alive bool)
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
	obs     streamObserver // see Config.observer
	owners  *Owners
	shards  []*Shard
	host    ShardHost
	n       uint64
	timeout time.Duration
	metrics *kv.Metrics
	hcache  *hashCache                                              // nil: none
	keys    *RouterKeys                                             // nil: BlockKeyEngine
	twin    *twin                                                   // nil: none (Config.SplitBlocks)
	rest    func(x *Index, sc *lookupScratch, w, n int) (int, bool) // see Config.matchRest

	scratch sync.Pool // *lookupScratch
	streams sync.Pool // *stream
	batches sync.Pool // *ShardBatch
}

var _ kv.CacheSource = (*Index)(nil)

// New returns an empty index.
func New(cfg Config) (*Index, error) {
	if cfg.Shards <= 0 {
		cfg.Shards = runtime.GOMAXPROCS(0)
	}
	if cfg.MaxBlocks <= 0 {
		cfg.MaxBlocks = DefaultMaxBlocks
	}
	if cfg.LookupTimeout <= 0 {
		cfg.LookupTimeout = DefaultLookupTimeout
	}
	if cfg.Metrics == nil {
		cfg.Metrics = kv.NewMetrics(nil)
	}
	var keys *RouterKeys
	switch cfg.BlockKey {
	case "", BlockKeyEngine:
	case BlockKeyRouter:
		keys, cfg.HashCacheChunks = NewRouterKeys(), 0
	default:
		return nil, fmt.Errorf("cannot build the index: unknown block key %q (%s or %s)", cfg.BlockKey, BlockKeyEngine, BlockKeyRouter)
	}
	if cfg.SplitBlocks != 0 && cfg.SplitBlocks < MinSplitBlocks {
		return nil, fmt.Errorf("cannot build the index: split blocks must be 0 (off) or at least %d, got %d", MinSplitBlocks, cfg.SplitBlocks)
	}
	x := &Index{
		keys:    keys,
		owners:  NewOwners(),
		n:       uint64(cfg.Shards),
		timeout: cfg.LookupTimeout,
		metrics: cfg.Metrics,
		obs:     cfg.observer,
		rest:    cfg.matchRest,
	}
	x.hcache = newHashCache(cfg.HashCacheChunks, cfg.Metrics)
	if keys != nil && cfg.SplitBlocks > 0 && runtime.GOMAXPROCS(0) > 1 {
		x.twin = newTwin(cfg.SplitBlocks)
	}
	per := (cfg.MaxBlocks + cfg.Shards - 1) / cfg.Shards
	x.shards = make([]*Shard, cfg.Shards)
	for i := range x.shards {
		x.shards[i] = NewShard(x.owners, per)
		x.shards[i].metrics = cfg.Metrics
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
	set := cfg.Metrics.Set()
	set.GetOrCreateGauge(`switchyard_kv_index_blocks`, func() float64 { return float64(x.Stats().Blocks) })
	set.GetOrCreateGauge(`switchyard_kv_index_memory_bytes`, func() float64 { return float64(x.Stats().MemoryBytes) })
	set.GetOrCreateGauge(`switchyard_kv_index_owners`, func() float64 { return float64(x.owners.Len()) })
	return x, nil
}

// Owners returns the index's owner registry.
func (x *Index) Owners() *Owners { return x.owners }

// RouterKeys returns the index's own block keys when blocks are keyed by them
// (BlockKeyRouter), nil when they are keyed by the engines' hashes (BlockKeyEngine).
func (x *Index) RouterKeys() *RouterKeys { return x.keys }

// SplitBlocks returns the least number of blocks of a lookup the index splits across two
// goroutines (Config.SplitBlocks), 0 when it has no twin: switched off, keyed by the
// engines' hashes, or on one processor.
func (x *Index) SplitBlocks() int {
	if x.twin == nil {
		return 0
	}
	return x.twin.minBlocks
}

// AppendBlockKeys appends to dst the keys the index holds tokens' blocks of blockSize under:
// the router's keys (BlockKeyRouter) or SGLang's wire hashes (BlockKeyEngine).
func (x *Index) AppendBlockKeys(dst []int64, tokens []uint32, blockSize int) []int64 {
	if x.keys != nil {
		dst, _ = x.keys.AppendChain(dst, 0, tokens, blockSize)
		return dst
	}
	return hashing.AppendBlockHashes(dst, tokens, blockSize)
}

// Metrics returns the index's metric handles.
func (x *Index) Metrics() *kv.Metrics { return x.metrics }

// Shards returns the number of shards.
func (x *Index) Shards() int { return len(x.shards) }

// Close stops the twin (Config.SplitBlocks) and the shard host when it has anything to stop.
func (x *Index) Close() error {
	x.twin.stop()
	if c, ok := x.host.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// Stats sums the shards' statistics.
type Stats struct {
	ShardStats
	// MemoryBytes is the estimated memory of the resident blocks.
	MemoryBytes int64
	// Owners is the number of registered owners.
	Owners int
}

// Stats returns the index's statistics. Safe for concurrent use.
func (x *Index) Stats() Stats {
	var st Stats
	for _, s := range x.shards {
		ss := s.Stats()
		st.Blocks += ss.Blocks
		st.Spilled += ss.Spilled
		st.SpillCap += ss.SpillCap
		st.TableSlots += ss.TableSlots
		st.ArenaSlots += ss.ArenaSlots
		st.Stored += ss.Stored
		st.Removed += ss.Removed
		st.Stale += ss.Stale
		st.Evicted += ss.Evicted
		st.Pruned += ss.Pruned
		st.Queries += ss.Queries
		st.Probes += ss.Probes
		st.Fallbacks += ss.Fallbacks
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
	x.metrics.Clears[kv.ClearRemoved].Inc()
	x.Prune()
	return true
}

// ClearWorker invalidates every entry of worker's DP ranks.
func (x *Index) ClearWorker(worker string) {
	x.owners.ClearWorker(worker)
	x.Prune()
}

// ClearOwner invalidates owner's entries for reason.
func (x *Index) ClearOwner(id OwnerID, reason kv.ClearReason) {
	x.owners.Clear(id)
	x.metrics.Clears[reason].Inc()
}

// Prune asks every shard to reclaim the records of cleared owners now.
func (x *Index) Prune() {
	for i := range x.shards {
		_ = x.host.Prune(i)
	}
}

// Sync waits until every shard has applied the operations handed to it before Sync was
// called. A host may apply writes asynchronously (the shard actors do) and a lookup reads
// what its shards have applied, not what is still queued for them.
func (x *Index) Sync(ctx context.Context) error {
	qs := make([]*ShardQuery, len(x.shards))
	for i := range qs {
		qs[i] = &ShardQuery{}
	}
	if err := x.host.Match(ctx, qs); err != nil {
		return fmt.Errorf("cannot sync index shards: %w", err)
	}
	return nil
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

// Writer batches block operations per shard for one ingesting goroutine. It is not safe
// for concurrent use.
type Writer struct {
	x       *Index
	batches []*ShardBatch
	pending int
	dropped []OwnerID
}

// NewWriter returns a writer for one ingesting goroutine.
func (x *Index) NewWriter() *Writer {
	return &Writer{x: x, batches: make([]*ShardBatch, len(x.shards))}
}

// Store queues: owner (at epoch) holds block h in tiers t.
func (w *Writer) Store(owner OwnerID, epoch uint32, h int64, t Tiers) {
	w.add(ShardOp{Hash: h, Owner: opOwner(owner), Epoch: epoch, Tiers: t})
}

// Remove queues: owner (at epoch) no longer holds block h in tiers t.
func (w *Writer) Remove(owner OwnerID, epoch uint32, h int64, t Tiers) {
	w.add(ShardOp{Hash: h, Owner: opOwner(owner), Epoch: epoch, Tiers: t, Remove: true})
}

func (w *Writer) add(op ShardOp) {
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
func (w *Writer) Pending() int { return w.pending }

// Flush hands every queued operation to the shards and returns how many were refused by a
// busy shard. The owners of a refused batch are cleared: a partly applied history could
// leave stale ownership, and a stale index is worse than an empty one.
func (w *Writer) Flush() (dropped int) {
	for i := range w.batches {
		if w.batches[i] != nil {
			dropped += w.send(i)
		}
	}
	return dropped
}

// send hands shard i's batch over; it returns the number of operations dropped.
func (w *Writer) send(i int) int {
	b := w.batches[i]
	w.batches[i] = nil
	n := len(b.Ops)
	w.pending -= n
	if err := w.x.host.Apply(i, b); err == nil {
		w.x.metrics.OpsApplied.Add(n)
		return 0
	}
	w.dropped = w.dropped[:0]
	for k := range b.Ops {
		o := OwnerID(b.Ops[k].Owner)
		if len(w.dropped) == 0 || w.dropped[len(w.dropped)-1] != o {
			w.dropped = append(w.dropped, o)
		}
	}
	b.Done()
	w.x.metrics.OpsDroppedBusy.Add(n)
	for k, o := range w.dropped {
		if o != 0 && !containsOwner(w.dropped[:k], o) {
			w.x.ClearOwner(o, kv.ClearDropped)
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
	// bits numbers the owners of the block-size group being matched: bits[o] = 1 + o's
	// bit, 0 for every other owner. asked is the same owners with their epochs, for the
	// direct matcher (askTable). Both are kept between matches for the next match of the
	// same owners (ask): askedFor are those owners, askedGen the Owners.ClearGen they were
	// asked at.
	bits     []uint16
	asked    askTable
	askedFor []OwnerID
	askedGen uint64
	// alive is the set of owners holding every block so far; count[b] is the number of
	// leading blocks owner bit b holds.
	alive []uint64
	count []uint32
	// Incremental hashing: the prompt's blocks are hashed a wave at a time (hashes holds
	// the first hashed of them), chaining from last.
	tokens    []uint32
	blockSize int
	hashed    int
	last      hashing.Digest
	// keys, when not nil, keys the blocks instead of the SHA-256 chain (BlockKeyRouter);
	// lastKey is the last block's key.
	keys    *RouterKeys
	lastKey int64
	// The hash cache (nil: none) and the key of the chunks hashed so far; keyed is false
	// once a partial chunk was hashed.
	cache *hashCache
	key   chunkKey
	keyed bool
	// ahead is the stream of a streamed lookup with a hash cache: its helper computes the
	// bodies of the chunks ahead of the hashing (stream.bodies).
	ahead *stream
	// start is when the lookup started (its LookupTimeout runs from there).
	start time.Time
	// The direct matcher's state (match.go) and the sum of its read-ahead loads.
	pipe pipeline
	sink int64
}

// hashUpTo hashes the prompt's blocks up to block hi (exclusive) into sc.hashes.
func (sc *lookupScratch) hashUpTo(hi int) { sc.hashes = sc.hashInto(sc.hashes, hi) }

// hashInto appends the hashes of blocks [sc.hashed, hi) to dst and advances the chain. Whole
// chunks go through the index's hash cache, if any.
func (sc *lookupScratch) hashInto(dst []int64, hi int) []int64 {
	if sc.tokens == nil {
		return dst
	}
	bs := sc.blockSize
	if sc.keys != nil && sc.hashed < hi {
		if sc.hashed == 0 {
			sc.lastKey = 0
		}
		dst, sc.lastKey = sc.keys.AppendChain(dst, sc.lastKey, sc.tokens[sc.hashed*bs:min(hi*bs, len(sc.tokens))], bs)
		sc.hashed = hi
		return dst
	}
	for sc.hashed < hi {
		from := sc.hashed
		var parent *hashing.Digest
		if from > 0 {
			parent = &sc.last
		}
		end := min(hi, (from/chunkBlocks+1)*chunkBlocks)
		toks := sc.tokens[from*bs : min(end*bs, len(sc.tokens))]
		if c := sc.cache; c != nil && sc.keyed && from%chunkBlocks == 0 && len(toks) == chunkBlocks*bs {
			var body uint64
			if st, ch := sc.ahead, from/chunkBlocks; st != nil && ch < len(st.ready) && st.ready[ch].Load() {
				body = st.bodies[ch] // the streamed lookup's helper read the tokens
			} else {
				body = c.body(toks)
			}
			k := c.keyOf(sc.key, bs, body)
			if e := c.get(k); e != nil {
				dst = append(dst, e.hashes[:]...)
				sc.last = e.last
			} else {
				dst, sc.last = hashing.AppendChainHashes(dst, parent, toks, bs)
				c.put(k, dst[len(dst)-chunkBlocks:], sc.last)
			}
			sc.key = k
		} else {
			dst, sc.last = hashing.AppendChainHashes(dst, parent, toks, bs)
			sc.keyed = false // keys chain over whole chunks only
		}
		sc.hashed = end
	}
	return dst
}

// reserveHashes makes room in sc.hashes for n keys, keeping those computed.
func (sc *lookupScratch) reserveHashes(n int) {
	if cap(sc.hashes) < n {
		grown := make([]int64, len(sc.hashes), n)
		copy(grown, sc.hashes)
		sc.hashes = grown
	}
}

// startChain points sc at the prompt tokens, hashed in blocks of blockSize from the start,
// with keys (nil: the SHA-256 chain, through cache if any).
func (sc *lookupScratch) startChain(tokens []uint32, blockSize int, cache *hashCache, keys *RouterKeys) {
	sc.hashes, sc.tokens, sc.blockSize, sc.hashed = sc.hashes[:0], tokens, blockSize, 0
	sc.cache, sc.key, sc.keyed = cache, chunkKey{}, true
	sc.keys, sc.lastKey = keys, 0
	sc.ahead = nil
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
	if need := int(maxID) + 1; len(sc.bits) < need {
		sc.bits = make([]uint16, need+need/2)
		sc.asked = make(askTable, len(sc.bits))
		sc.asked[0].key = askNone
		sc.askedFor = nil
	}
	return sc
}

// Lookup implements CacheSource.
func (x *Index) Lookup(ctx context.Context, model string, tokens []uint32, dst *kv.Lookup) error {
	start := time.Now()
	err := x.lookup(ctx, start, model, tokens, dst)
	x.metrics.ObserveLookup(kv.SourceLocal, start, err)
	return err
}

func (x *Index) lookup(ctx context.Context, start time.Time, model string, tokens []uint32, dst *kv.Lookup) error {
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
	sc := x.getScratch(snap.maxID)
	sc.start = start
	for _, g := range groups {
		sc.startChain(tokens, g.blockSize, x.hcache, x.keys)
		if err := x.matchGroup(ctx, sc, g.owners, (len(tokens)+g.blockSize-1)/g.blockSize); err != nil {
			// A shard may still read or write the queries: drop the scratch instead of pooling it.
			dst.Reset()
			return fmt.Errorf("cannot look up prefix of %d tokens: %w: %w", len(tokens), kv.ErrUnavailable, err)
		}
		bs := int64(g.blockSize)
		for i, o := range g.owners[:len(sc.count)] {
			if c := sc.count[i]; c > 0 {
				info := &snap.info[o]
				dst.Matches = append(dst.Matches, kv.Match{Worker: info.Worker, Tokens: min(int64(c)*bs, int64(len(tokens))), Ranks: kv.RankBit(info.Rank)})
			}
		}
	}
	sc.tokens, sc.cache = nil, nil // do not retain the prompt
	x.scratch.Put(sc)
	dst.Normalize()
	return nil
}

// MatchHashes is Lookup for a caller that already hashed the prompt with blockSize: it
// matches hashes, the index's keys of the prompt's blocks (AppendBlockKeys: SGLang's hashes,
// or the router's own keys with BlockKeyRouter), against the owners of model with that block
// size only. queryTokens is the prompt length (a match is capped by it).
func (x *Index) MatchHashes(ctx context.Context, model string, blockSize int, hashes []int64, queryTokens int, dst *kv.Lookup) error {
	dst.Reset()
	dst.QueryTokens = queryTokens
	snap := x.owners.snap.Load()
	var owners []OwnerID
	for _, g := range snap.models[model] {
		if g.blockSize == blockSize {
			owners = g.owners
		}
	}
	if len(hashes) == 0 || len(owners) == 0 {
		return nil
	}
	sc := x.getScratch(snap.maxID)
	sc.start = time.Now()
	sc.hashes = append(sc.hashes[:0], hashes...)
	sc.tokens, sc.hashed, sc.keys = nil, len(hashes), nil
	if err := x.matchGroup(ctx, sc, owners, len(hashes)); err != nil {
		dst.Reset()
		return fmt.Errorf("cannot match %d block hashes: %w: %w", len(hashes), kv.ErrUnavailable, err)
	}
	for i, o := range owners[:len(sc.count)] {
		if c := sc.count[i]; c > 0 {
			info := &snap.info[o]
			dst.Matches = append(dst.Matches, kv.Match{Worker: info.Worker, Tokens: min(int64(c)*int64(blockSize), int64(queryTokens)), Ranks: kv.RankBit(info.Rank)})
		}
	}
	x.scratch.Put(sc)
	dst.Normalize()
	return nil
}

// maxQueryOwners is how many owners one block-size group can ask about (bit numbers are
// uint16, 0 reserved); owners beyond are not matched.
const maxQueryOwners = 1<<16 - 1

// matchGroup sets sc.count[i] to the number of the prompt's n leading blocks owners[i]
// holds. On error a shard may still read sc.bits: the caller drops sc instead of pooling it.
func (x *Index) matchGroup(ctx context.Context, sc *lookupScratch, owners []OwnerID, n int) error {
	owners = owners[:min(len(owners), maxQueryOwners)]
	k := len(owners)
	w := (k + 63) / 64
	sc.ask(x.owners, owners)
	sc.startSets(k, w)
	return x.matchWaves(ctx, sc, w, n)
}

// ask numbers owners for a match in sc.bits and sc.asked, with their epochs as of now. The
// tables are kept after the match: the next match of the same owners (the same snapshot's
// slice) on sc, with no owner cleared since (Owners.ClearGen: it counts every epoch change,
// after the change), finds them as they are; a match of other owners clears them first.
// Reused, the tables judge by epochs read before this lookup started; but no clear was
// counted since, so a clear they miss is one still under way, which the lookup may be
// ordered before.
func (sc *lookupScratch) ask(reg *Owners, owners []OwnerID) {
	gen := reg.ClearGen() // before the epochs: a clear counted after it builds the tables again
	if sc.askedGen == gen && len(sc.askedFor) == len(owners) && unsafe.SliceData(sc.askedFor) == unsafe.SliceData(owners) {
		return
	}
	for _, o := range sc.askedFor {
		sc.bits[o] = 0
		sc.asked.unask(o)
	}
	words := (len(owners) + 63) / 64
	for i, o := range owners {
		sc.bits[o] = uint16(i + 1)
		sc.asked.setAsked(o, reg.Epoch(o), i, words)
	}
	sc.askedFor, sc.askedGen = owners, gen
}

// startSets sets sc's counts of k owners to zero and all k alive, in w words.
func (sc *lookupScratch) startSets(k, w int) {
	if cap(sc.count) < k {
		sc.count = make([]uint32, k)
	}
	sc.count = sc.count[:k]
	clear(sc.count)
	if cap(sc.alive) < w {
		sc.alive = make([]uint64, w)
	}
	sc.alive = sc.alive[:w]
	fillAlive(sc.alive, k)
}

// matchWaves asks the shards about the prompt's n blocks in growing waves, following the
// set of owners that hold every block so far, and stops at the first block nobody left
// holds. A wave's first block is asked about alone before the wave is hashed (see
// probeNext). A prompt still held after its first wave with at least streamMinBlocks to go
// is streamed (see matchStream). A prompt keyed by the router's keys, whose keying is too
// short a part of the lookup for waves or a helper's wake-up to pay, is matched in one pass
// (matchKeyed).
func (x *Index) matchWaves(ctx context.Context, sc *lookupScratch, w, n int) error {
	if sc.keys != nil && sc.tokens != nil {
		return x.matchKeyed(ctx, sc, w, n)
	}
	size := firstWave
	for lo := 0; lo < n; lo, size = lo+size, nextWave(size) {
		if lo > 0 && sc.tokens != nil && sc.keys == nil && n-lo >= streamMinBlocks {
			return x.matchStream(ctx, sc, w, lo, n)
		}
		hi := min(n, lo+size)
		if hi-lo > 1 {
			if alive, err := x.probeNext(ctx, sc, w); err != nil || !alive {
				return err
			}
		}
		sc.hashUpTo(hi)
		if alive, err := x.matchWave(ctx, sc, w, lo, hi); err != nil || !alive {
			return err
		}
	}
	sc.holdAll(n)
	return nil
}

// probeNext asks the shards about the prompt's next block to hash alone, hashed beside the
// chain (which it leaves as it was, with the hash cache's key): a prefix that ends there
// (a prompt nobody holds, one held up to the end of a wave) costs one block's hash, not
// the next wave's (64 blocks at first) nor a chunk of the hash cache. It reports whether
// some owner still holds every block so far.
func (x *Index) probeNext(ctx context.Context, sc *lookupScratch, w int) (bool, error) {
	lo, bs := sc.hashed, sc.blockSize
	if sc.tokens == nil || len(sc.hashes) != lo || lo*bs >= len(sc.tokens) {
		return true, nil // hashes given (MatchHashes), or nothing left to probe
	}
	block := sc.tokens[lo*bs : min((lo+1)*bs, len(sc.tokens))]
	if sc.keys != nil {
		parent := int64(0)
		if lo > 0 {
			parent = sc.lastKey
		}
		sc.hashes = append(sc.hashes, sc.keys.Block(parent, block))
	} else {
		var parent *hashing.Digest
		if lo > 0 {
			parent = &sc.last
		}
		sc.hashes, _ = hashing.AppendChainHashes(sc.hashes, parent, block, bs)
	}
	alive, err := x.matchWave(ctx, sc, w, lo, lo+1)
	sc.hashes = sc.hashes[:lo]
	return alive, err
}

// matchKeyed matches the prompt's n blocks keyed by the router's keys in one pass
// (matchDirect), keying them as it goes: keying is a small part of such a lookup, so there
// are no waves and no probe ahead of each. The first block is matched alone, so that a
// prompt nobody holds costs one key and one probe. A long prompt is matched on two cores when
// the index has a twin (Config.SplitBlocks) and it is free (twin.go: it takes the back part
// of what is left when it starts).
// A block read beside a busy writer leaves the rest to the shards' host.
func (x *Index) matchKeyed(ctx context.Context, sc *lookupScratch, w, n int) error {
	sc.reserveHashes(n) // one allocation for a scratch the pool made anew, not a growing series
	sc.hashUpTo(1)
	end, alive := x.matchDirect(sc, w, 0, 1, false)
	if alive && end == 1 {
		switch {
		case x.rest != nil:
			end, alive = x.rest(x, sc, w, n)
		case x.twin.acquire(x, n):
			end, alive = x.matchTwin(x.twin, sc, w, n) // a long prompt: on two cores
		default:
			end, alive = x.matchDirect(sc, w, 1, n, true)
		}
	}
	if !alive {
		return nil
	}
	if end < n {
		sc.hashUpTo(n)
		for lo := end; lo < n; lo += streamMaxWave {
			if alive, err := x.matchHost(ctx, sc, w, lo, min(n, lo+streamMaxWave)); err != nil || !alive {
				return err
			}
		}
	}
	sc.holdAll(n)
	return nil
}

// matchWave asks the shards about blocks [lo, hi), which are hashed, and folds the answers
// into sc.alive and sc.count. It reports whether some owner still holds every block so far.
// Fast path: the blocks are read on this goroutine (matchDirect). Slow path: from a block
// whose stripe kept changing under the read, the shards' host answers.
func (x *Index) matchWave(ctx context.Context, sc *lookupScratch, w, lo, hi int) (bool, error) {
	end, alive := x.matchDirect(sc, w, lo, hi, false)
	if !alive || end == hi {
		return alive, nil
	}
	return x.matchHost(ctx, sc, w, end, hi)
}

// matchHost has the shards' host answer about blocks [lo, hi), which are hashed, and folds the
// answers as matchWave does.
func (x *Index) matchHost(ctx context.Context, sc *lookupScratch, w, lo, hi int) (bool, error) {
	for i := range sc.qs {
		sc.qs[i].reset()
		sc.qs[i].Bits, sc.qs[i].Words = sc.bits, w
		sc.qp[i] = nil
		sc.cursor[i] = 0
	}
	for p := lo; p < hi; p++ {
		h := sc.hashes[p]
		i := x.shardOf(h)
		q := &sc.qs[i]
		q.Hash = append(q.Hash, h)
		sc.qp[i] = q
	}
	if err := x.hostMatch(ctx, sc); err != nil {
		return false, err
	}
	for p := lo; p < hi; p++ {
		i := x.shardOf(sc.hashes[p])
		c := sc.cursor[i]
		sc.cursor[i] = c + 1
		set := sc.qs[i].Sets[c*w : c*w+w]
		var any uint64
		for k := range w {
			a := sc.alive[k]
			na := a & set[k]
			for d := a &^ na; d != 0; d &= d - 1 {
				sc.count[k*64+bits.TrailingZeros64(d)] = uint32(p)
			}
			sc.alive[k] = na
			any |= na
		}
		if any == 0 {
			return false, nil // nobody holds the prefix through block p
		}
	}
	return true, nil
}

// hostMatch has the shard host answer the non-nil queries of sc.qp, within the lookup's
// deadline: ctx's, or LookupTimeout from the lookup's start.
func (x *Index) hostMatch(ctx context.Context, sc *lookupScratch) error {
	if _, ok := ctx.Deadline(); !ok {
		if _, locked := x.host.(*LockedShards); !locked {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, sc.start.Add(x.timeout))
			defer cancel()
		}
	}
	return x.host.Match(ctx, sc.qp)
}

// holdAll records that the owners still alive hold all n blocks.
func (sc *lookupScratch) holdAll(n int) {
	for k, a := range sc.alive {
		for ; a != 0; a &= a - 1 {
			sc.count[k*64+bits.TrailingZeros64(a)] = uint32(n)
		}
	}
}
