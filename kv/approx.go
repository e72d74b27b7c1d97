package kv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/load/series"
)

// The approximate source: for engines that publish no KV events, the router keeps a prefix
// tree of the prompts it dispatched itself (token IDs when the model has a tokenizer, else
// the bytes of the prompt's text) and takes the engine each prompt went to as holding it —
// the approximation of sgl-router's cache-aware policy. One tree per model, sharded by the
// first ApproxShardPrefix symbols of each prompt: prompts that share at least that much
// share a shard; prompts that share less lose that short match.

// ApproxShardPrefix is how many leading symbols choose a prompt's shard.
const ApproxShardPrefix = 64

// MaxApproxSymbols caps the symbols of one prompt the tree looks at or keeps: longer prompts
// are matched and recorded up to this length.
const MaxApproxSymbols = 1 << 20

// ApproxShard is one shard of an ApproxIndex: the trees of every model for the prompts whose
// first symbols hash to it. It belongs to one goroutine at a time (an approximate-tree actor
// in the router, or a mutex in LockedApproxShards).
type ApproxShard struct {
	idx    *ApproxIndex
	trees  map[string]*approxTree
	budget int64 // each tenant's symbols after an eviction

	symbols, nodes atomic.Int64
}

// ApproxOp is a write to a shard: a recorded dispatch, a removed worker or an eviction.
type ApproxOp interface {
	apply(s *ApproxShard)
}

// ApproxInsert records that Seq (owned by the op) of Model was sent to Worker.
type ApproxInsert struct {
	Model, Worker string
	Seq           []uint32
}

// ApproxRemove forgets Worker in every tree of the shard.
type ApproxRemove struct{ Worker string }

// ApproxEvict trims every worker's part of the shard's trees to the shard's budget.
type ApproxEvict struct{}

// ApproxQuery asks a shard for the workers holding a prefix of Seq (owned by the query).
// The shard appends to Matches.
type ApproxQuery struct {
	Model   string
	Seq     []uint32
	Matches []Match
}

func (op *ApproxInsert) apply(s *ApproxShard) { s.insert(op.Model, op.Worker, op.Seq) }
func (op *ApproxRemove) apply(s *ApproxShard) { s.remove(op.Worker) }
func (*ApproxEvict) apply(s *ApproxShard)     { s.evict() }

// Apply runs op on the shard.
func (s *ApproxShard) Apply(op ApproxOp) {
	op.apply(s)
	s.publish()
}

// Match answers q.
func (s *ApproxShard) Match(q *ApproxQuery) {
	if t := s.trees[q.Model]; t != nil {
		q.Matches = t.match(q.Seq, q.Matches)
	}
}

// Reset empties the shard (its goroutine failed mid-operation: its state cannot be trusted).
func (s *ApproxShard) Reset() {
	for _, t := range s.trees {
		t.reset()
	}
	s.trees = map[string]*approxTree{}
	s.publish()
}

// Symbols is the number of symbols the shard stores.
func (s *ApproxShard) Symbols() int64 { return s.symbols.Load() }

func (s *ApproxShard) insert(model, worker string, seq []uint32) {
	t := s.trees[model]
	if t == nil {
		t = newApproxTree()
		s.trees[model] = t
	}
	t.insert(seq, t.tenant(worker, s.idx.resident))
	// The bound between evictions: twice the budget of every tenant of the tree.
	if limit := 2 * s.budget * int64(max(len(t.tenantIdx), 1)); t.total > limit {
		s.idx.inline.AddInt64(t.evict(s.budget))
	}
}

func (s *ApproxShard) remove(worker string) {
	for _, t := range s.trees {
		t.remove(worker)
	}
}

func (s *ApproxShard) evict() {
	for _, t := range s.trees {
		s.idx.evicted.AddInt64(t.evict(s.budget))
	}
}

func (s *ApproxShard) publish() {
	var sym, nodes int64
	for _, t := range s.trees {
		sym += t.total
		nodes += t.nodes
	}
	s.symbols.Store(sym)
	s.nodes.Store(nodes)
}

// ApproxHost runs the shards of an ApproxIndex, each touched by one goroutine at a time.
// The router hosts them on actors (package actors); LockedApproxShards hosts them behind
// mutexes on the caller's goroutine.
type ApproxHost interface {
	// Post hands op to shard i without blocking, or refuses it with ErrShardBusy.
	Post(i int, op ApproxOp) error
	// Ask runs q on shard i and returns once it is answered, or with an error when ctx ends
	// first or the shard cannot take it; the shard may then still write q.
	Ask(ctx context.Context, i int, q *ApproxQuery) error
}

// LockedApproxShards hosts shards behind one mutex each. Safe for concurrent use.
type LockedApproxShards struct {
	mu     []sync.Mutex
	shards []*ApproxShard
}

var _ ApproxHost = (*LockedApproxShards)(nil)

// NewLockedApproxShards hosts shards.
func NewLockedApproxShards(shards []*ApproxShard) *LockedApproxShards {
	return &LockedApproxShards{mu: make([]sync.Mutex, len(shards)), shards: shards}
}

// Post implements ApproxHost.
func (h *LockedApproxShards) Post(i int, op ApproxOp) error {
	h.mu[i].Lock()
	defer h.mu[i].Unlock()
	h.shards[i].Apply(op)
	return nil
}

// Ask implements ApproxHost.
func (h *LockedApproxShards) Ask(_ context.Context, i int, q *ApproxQuery) error {
	h.mu[i].Lock()
	defer h.mu[i].Unlock()
	h.shards[i].Match(q)
	return nil
}

// ApproxConfig configures an ApproxIndex.
type ApproxConfig struct {
	// Shards is the number of shards. Default (0 or less): one per core, GOMAXPROCS.
	Shards int
	// MaxTreeSize is each worker's symbols kept by an eviction, over all shards (each shard
	// keeps its share); at least 1024.
	MaxTreeSize int
	// Host starts the shards' host. Default: LockedApproxShards.
	Host func(shards []*ApproxShard) (ApproxHost, error)
	// Metrics receives the switchyard_cache_approx_* series. Default: a private set.
	Metrics *metrics.Set
	// Logger receives refused writes. Default: discarded.
	Logger *slog.Logger
}

// Metric names of the approximate source.
const (
	metricApproxSymbols     = "switchyard_cache_approx_symbols"
	metricApproxNodes       = "switchyard_cache_approx_nodes"
	metricApproxRecorded    = "switchyard_cache_approx_recorded_total"
	metricApproxDropped     = "switchyard_cache_approx_dropped_total"
	metricApproxEvicted     = `switchyard_cache_approx_evicted_symbols_total{trigger="interval"}`
	metricApproxInline      = `switchyard_cache_approx_evicted_symbols_total{trigger="bound"}`
	metricApproxUnavailable = "switchyard_cache_approx_lookups_unavailable_total"
)

// ApproxIndex is the approximate prefix source (a CacheSource): Record adds a dispatched
// prompt, Lookup returns every worker's longest recorded prefix of a prompt, Resident how
// much of the tree a worker holds. Safe for concurrent use.
type ApproxIndex struct {
	shards  []*ApproxShard
	host    ApproxHost
	logger  *slog.Logger
	metrics *series.Owned // unregistered by Close

	mu       sync.Mutex
	counters atomic.Pointer[map[string]*atomic.Int64]

	recorded, dropped, evicted, inline, unavailable *metrics.Counter
	queries                                         sync.Pool // *ApproxQuery
}

var _ CacheSource = (*ApproxIndex)(nil)

// NewApproxIndex builds an empty index and starts its host.
func NewApproxIndex(cfg ApproxConfig) (*ApproxIndex, error) {
	if cfg.Shards <= 0 {
		cfg.Shards = runtime.GOMAXPROCS(0)
	}
	if cfg.MaxTreeSize < 1024 {
		return nil, fmt.Errorf("cannot build the approximate prefix tree: max tree size %d (at least 1024)", cfg.MaxTreeSize)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	x := &ApproxIndex{logger: cfg.Logger, metrics: series.Own(cfg.Metrics)}
	x.counters.Store(&map[string]*atomic.Int64{})
	x.queries.New = func() any { return &ApproxQuery{} }
	budget := int64((cfg.MaxTreeSize + cfg.Shards - 1) / cfg.Shards)
	for range cfg.Shards {
		x.shards = append(x.shards, &ApproxShard{idx: x, trees: map[string]*approxTree{}, budget: budget})
	}
	if cfg.Host == nil {
		x.host = NewLockedApproxShards(x.shards)
	} else {
		h, err := cfg.Host(x.shards)
		if err != nil {
			return nil, fmt.Errorf("cannot build the approximate prefix tree: %w", err)
		}
		x.host = h
	}
	x.metrics.Gauge(metricApproxSymbols, func() float64 { return float64(x.Symbols()) })
	x.metrics.Gauge(metricApproxNodes, func() float64 {
		var n int64
		for _, s := range x.shards {
			n += s.nodes.Load()
		}
		return float64(n)
	})
	x.recorded = x.metrics.Counter(metricApproxRecorded)
	x.dropped = x.metrics.Counter(metricApproxDropped)
	x.evicted = x.metrics.Counter(metricApproxEvicted)
	x.inline = x.metrics.Counter(metricApproxInline)
	x.unavailable = x.metrics.Counter(metricApproxUnavailable)
	return x, nil
}

// shardOf returns the shard of model's prompt seq.
func (x *ApproxIndex) shardOf(model string, seq []uint32) int {
	if len(x.shards) == 1 {
		return 0
	}
	// FNV-1a over the model and the leading symbols: deterministic, so that a prompt's
	// shard does not change between runs.
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for i := 0; i < len(model); i++ {
		h = (h ^ uint64(model[i])) * prime
	}
	for _, s := range seq[:min(len(seq), ApproxShardPrefix)] {
		h = (h ^ uint64(s)) * prime
	}
	return int(h % uint64(len(x.shards)))
}

// resident returns worker's counter, creating it.
func (x *ApproxIndex) resident(worker string) *atomic.Int64 {
	if c := (*x.counters.Load())[worker]; c != nil {
		return c
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	old := *x.counters.Load()
	if c := old[worker]; c != nil {
		return c
	}
	m := make(map[string]*atomic.Int64, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	c := new(atomic.Int64)
	m[worker] = c
	x.counters.Store(&m)
	return c
}

// Resident returns how many symbols of the tree worker holds (over every model and shard).
func (x *ApproxIndex) Resident(worker string) int64 {
	if c := (*x.counters.Load())[worker]; c != nil {
		return max(c.Load(), 0)
	}
	return 0
}

// Symbols returns the number of symbols the index stores.
func (x *ApproxIndex) Symbols() int64 {
	var n int64
	for _, s := range x.shards {
		n += s.Symbols()
	}
	return n
}

// Record adds that seq of model was sent to worker. It copies seq (up to MaxApproxSymbols)
// and never blocks: a shard that cannot take it drops it (counted).
func (x *ApproxIndex) Record(model, worker string, seq []uint32) {
	if len(seq) == 0 {
		return
	}
	seq = seq[:min(len(seq), MaxApproxSymbols)]
	op := &ApproxInsert{Model: model, Worker: worker, Seq: append([]uint32(nil), seq...)}
	if err := x.host.Post(x.shardOf(model, seq), op); err != nil {
		x.dropped.Inc()
		return
	}
	x.recorded.Inc()
}

// Lookup implements CacheSource: every worker holding a recorded prefix of tokens, and
// QueryTokens the prompt's length (capped at MaxApproxSymbols).
func (x *ApproxIndex) Lookup(ctx context.Context, model string, tokens []uint32, dst *Lookup) error {
	dst.Reset()
	tokens = tokens[:min(len(tokens), MaxApproxSymbols)]
	dst.QueryTokens = len(tokens)
	if len(tokens) == 0 {
		return nil
	}
	q := x.queries.Get().(*ApproxQuery)
	q.Model = model
	q.Seq = append(q.Seq[:0], tokens...)
	q.Matches = q.Matches[:0]
	if err := x.host.Ask(ctx, x.shardOf(model, tokens), q); err != nil {
		// The shard may still write q: it is not pooled again.
		x.unavailable.Inc()
		if errors.Is(err, ErrRejected) {
			return err
		}
		return fmt.Errorf("cannot look up the approximate prefix tree: %w: %w", ErrUnavailable, err)
	}
	dst.Matches = append(dst.Matches, q.Matches...)
	dst.normalize()
	q.Model = ""
	if cap(q.Seq) > 1<<16 {
		q.Seq = nil
	}
	x.queries.Put(q)
	return nil
}

// RemoveWorker forgets worker in every shard (best effort: a shard that cannot take it now
// forgets it at its next eviction only if it is posted again).
func (x *ApproxIndex) RemoveWorker(worker string) {
	for i := range x.shards {
		if err := x.host.Post(i, &ApproxRemove{Worker: worker}); err != nil {
			x.logger.Warn("approximate prefix tree shard refused a worker removal", slog.Int("shard", i),
				slog.String("worker", worker), slog.Any("error", err))
		}
	}
}

// Evict asks every shard to trim each worker's part to its budget.
func (x *ApproxIndex) Evict() {
	for i := range x.shards {
		if err := x.host.Post(i, &ApproxEvict{}); err != nil {
			x.logger.Warn("approximate prefix tree shard refused an eviction", slog.Int("shard", i), slog.Any("error", err))
		}
	}
}

// ApproxStats are an ApproxIndex's counters.
type ApproxStats struct {
	Recorded, Dropped, EvictedSymbols, BoundEvictedSymbols, Unavailable uint64
	Symbols                                                             int64
}

// Stats returns the index's counters.
func (x *ApproxIndex) Stats() ApproxStats {
	return ApproxStats{Recorded: x.recorded.Get(), Dropped: x.dropped.Get(), EvictedSymbols: x.evicted.Get(),
		BoundEvictedSymbols: x.inline.Get(), Unavailable: x.unavailable.Get(), Symbols: x.Symbols()}
}

// Close stops the host (when it is an io.Closer) and unregisters the metrics.
func (x *ApproxIndex) Close() error {
	var err error
	if c, ok := x.host.(io.Closer); ok {
		err = c.Close()
	}
	x.metrics.Unregister()
	return err
}

// TextSymbols appends the symbols of text to dst: one per byte.
func TextSymbols(dst []uint32, text []byte) []uint32 {
	for _, b := range text[:min(len(text), MaxApproxSymbols)] {
		dst = append(dst, uint32(b))
	}
	return dst
}
