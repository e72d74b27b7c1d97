package approx

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

	"switchyard/kv"
	"switchyard/load/series"
)

// The approximate source: for engines that publish no KV events, the router keeps a prefix
// tree of the prompts it dispatched itself (token IDs when the model has a tokenizer, else
// the bytes of the prompt's text) and takes the engine each prompt went to as holding it —
// the approximation of sgl-router's cache-aware policy. One tree per model, sharded by the
// first ShardPrefix symbols of each prompt: prompts that share at least that much
// share a shard; prompts that share less lose that short match.

// ShardPrefix is how many leading symbols choose a prompt's shard.
const ShardPrefix = 64

// MaxSymbols caps the symbols of one prompt the tree looks at or keeps: longer prompts
// are matched and recorded up to this length.
const MaxSymbols = 1 << 20

// Shard is one shard of an Index: the trees of every model for the prompts whose
// first symbols hash to it. It belongs to one goroutine at a time (an approximate-tree actor
// in the router, or a mutex in LockedShards).
type Shard struct {
	idx    *Index
	trees  map[string]*approxTree
	budget int64 // each tenant's symbols after an eviction

	symbols, nodes atomic.Int64
}

// Op is a write to a shard: a recorded dispatch, a removed worker or an eviction.
type Op interface {
	apply(s *Shard)
}

// OpInsert records that Seq (owned by the op) of Model was sent to Worker.
type OpInsert struct {
	Model, Worker string
	Seq           []uint32
}

// OpRemove forgets Worker in every tree of the shard.
type OpRemove struct{ Worker string }

// OpEvict trims every worker's part of the shard's trees to the shard's budget.
type OpEvict struct{}

// Query asks a shard for the workers holding a prefix of Seq (owned by the query).
// The shard appends to Matches.
type Query struct {
	Model   string
	Seq     []uint32
	Matches []kv.Match
}

func (op *OpInsert) apply(s *Shard) { s.insert(op.Model, op.Worker, op.Seq) }
func (op *OpRemove) apply(s *Shard) { s.remove(op.Worker) }
func (*OpEvict) apply(s *Shard)     { s.evict() }

// Apply runs op on the shard.
func (s *Shard) Apply(op Op) {
	op.apply(s)
	s.publish()
}

// Match answers q.
func (s *Shard) Match(q *Query) {
	if t := s.trees[q.Model]; t != nil {
		q.Matches = t.match(q.Seq, q.Matches)
	}
}

// Reset empties the shard (its goroutine failed mid-operation: its state cannot be trusted).
func (s *Shard) Reset() {
	for _, t := range s.trees {
		t.reset()
	}
	s.trees = map[string]*approxTree{}
	s.publish()
}

// Symbols is the number of symbols the shard stores.
func (s *Shard) Symbols() int64 { return s.symbols.Load() }

func (s *Shard) insert(model, worker string, seq []uint32) {
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

func (s *Shard) remove(worker string) {
	for _, t := range s.trees {
		t.remove(worker)
	}
}

func (s *Shard) evict() {
	for _, t := range s.trees {
		s.idx.evicted.AddInt64(t.evict(s.budget))
	}
}

func (s *Shard) publish() {
	var sym, nodes int64
	for _, t := range s.trees {
		sym += t.total
		nodes += t.nodes
	}
	s.symbols.Store(sym)
	s.nodes.Store(nodes)
}

// Host runs the shards of an Index, each touched by one goroutine at a time.
// The router hosts them on actors (package actors); LockedShards hosts them behind
// mutexes on the caller's goroutine.
type Host interface {
	// Post hands op to shard i without blocking, or refuses it with ErrShardBusy.
	Post(i int, op Op) error
	// Ask runs q on shard i and returns once it is answered, or with an error when ctx ends
	// first or the shard cannot take it; the shard may then still write q.
	Ask(ctx context.Context, i int, q *Query) error
}

// LockedShards hosts shards behind one mutex each. Safe for concurrent use.
type LockedShards struct {
	mu     []sync.Mutex
	shards []*Shard
}

var _ Host = (*LockedShards)(nil)

// NewLockedShards hosts shards.
func NewLockedShards(shards []*Shard) *LockedShards {
	return &LockedShards{mu: make([]sync.Mutex, len(shards)), shards: shards}
}

// Post implements Host.
func (h *LockedShards) Post(i int, op Op) error {
	h.mu[i].Lock()
	defer h.mu[i].Unlock()
	h.shards[i].Apply(op)
	return nil
}

// Ask implements Host.
func (h *LockedShards) Ask(_ context.Context, i int, q *Query) error {
	h.mu[i].Lock()
	defer h.mu[i].Unlock()
	h.shards[i].Match(q)
	return nil
}

// Config configures an Index.
type Config struct {
	// Shards is the number of shards. Default (0 or less): one per core, GOMAXPROCS.
	Shards int
	// MaxTreeSize is each worker's symbols kept by an eviction, over all shards (each shard
	// keeps its share); at least 1024.
	MaxTreeSize int
	// Host starts the shards' host. Default: LockedShards.
	Host func(shards []*Shard) (Host, error)
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

// Index is the approximate prefix source (a CacheSource): Record adds a dispatched
// prompt, Lookup returns every worker's longest recorded prefix of a prompt, Resident how
// much of the tree a worker holds. Safe for concurrent use.
type Index struct {
	shards  []*Shard
	host    Host
	logger  *slog.Logger
	metrics *series.Owned // unregistered by Close

	mu       sync.Mutex
	counters atomic.Pointer[map[string]*atomic.Int64]

	recorded, dropped, evicted, inline, unavailable *metrics.Counter
	queries                                         sync.Pool // *Query
}

var _ kv.CacheSource = (*Index)(nil)

// New builds an empty index and starts its host.
func New(cfg Config) (*Index, error) {
	if cfg.Shards <= 0 {
		cfg.Shards = runtime.GOMAXPROCS(0)
	}
	if cfg.MaxTreeSize < 1024 {
		return nil, fmt.Errorf("cannot build the approximate prefix tree: max tree size %d (at least 1024)", cfg.MaxTreeSize)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	x := &Index{logger: cfg.Logger, metrics: series.Own(cfg.Metrics)}
	x.counters.Store(&map[string]*atomic.Int64{})
	x.queries.New = func() any { return &Query{} }
	budget := int64((cfg.MaxTreeSize + cfg.Shards - 1) / cfg.Shards)
	for range cfg.Shards {
		x.shards = append(x.shards, &Shard{idx: x, trees: map[string]*approxTree{}, budget: budget})
	}
	if cfg.Host == nil {
		x.host = NewLockedShards(x.shards)
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
func (x *Index) shardOf(model string, seq []uint32) int {
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
	for _, s := range seq[:min(len(seq), ShardPrefix)] {
		h = (h ^ uint64(s)) * prime
	}
	return int(h % uint64(len(x.shards)))
}

// resident returns worker's counter, creating it.
func (x *Index) resident(worker string) *atomic.Int64 {
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
func (x *Index) Resident(worker string) int64 {
	if c := (*x.counters.Load())[worker]; c != nil {
		return max(c.Load(), 0)
	}
	return 0
}

// Symbols returns the number of symbols the index stores.
func (x *Index) Symbols() int64 {
	var n int64
	for _, s := range x.shards {
		n += s.Symbols()
	}
	return n
}

// Record adds that seq of model was sent to worker. It copies seq (up to MaxSymbols)
// and never blocks: a shard that cannot take it drops it (counted).
func (x *Index) Record(model, worker string, seq []uint32) {
	if len(seq) == 0 {
		return
	}
	seq = seq[:min(len(seq), MaxSymbols)]
	op := &OpInsert{Model: model, Worker: worker, Seq: append([]uint32(nil), seq...)}
	if err := x.host.Post(x.shardOf(model, seq), op); err != nil {
		x.dropped.Inc()
		return
	}
	x.recorded.Inc()
}

// Lookup implements CacheSource: every worker holding a recorded prefix of tokens, and
// QueryTokens the prompt's length (capped at MaxSymbols).
func (x *Index) Lookup(ctx context.Context, model string, tokens []uint32, dst *kv.Lookup) error {
	dst.Reset()
	tokens = tokens[:min(len(tokens), MaxSymbols)]
	dst.QueryTokens = len(tokens)
	if len(tokens) == 0 {
		return nil
	}
	q := x.queries.Get().(*Query)
	q.Model = model
	q.Seq = append(q.Seq[:0], tokens...)
	q.Matches = q.Matches[:0]
	if err := x.host.Ask(ctx, x.shardOf(model, tokens), q); err != nil {
		// The shard may still write q: it is not pooled again.
		x.unavailable.Inc()
		if errors.Is(err, kv.ErrRejected) {
			return err
		}
		return fmt.Errorf("cannot look up the approximate prefix tree: %w: %w", kv.ErrUnavailable, err)
	}
	dst.Matches = append(dst.Matches, q.Matches...)
	dst.Normalize()
	q.Model = ""
	if cap(q.Seq) > 1<<16 {
		q.Seq = nil
	}
	x.queries.Put(q)
	return nil
}

// RemoveWorker forgets worker in every shard (best effort: a shard that cannot take it now
// forgets it at its next eviction only if it is posted again).
func (x *Index) RemoveWorker(worker string) {
	for i := range x.shards {
		if err := x.host.Post(i, &OpRemove{Worker: worker}); err != nil {
			x.logger.Warn("approximate prefix tree shard refused a worker removal", slog.Int("shard", i),
				slog.String("worker", worker), slog.Any("error", err))
		}
	}
}

// Evict asks every shard to trim each worker's part to its budget.
func (x *Index) Evict() {
	for i := range x.shards {
		if err := x.host.Post(i, &OpEvict{}); err != nil {
			x.logger.Warn("approximate prefix tree shard refused an eviction", slog.Int("shard", i), slog.Any("error", err))
		}
	}
}

// Stats are an Index's counters.
type Stats struct {
	Recorded, Dropped, EvictedSymbols, BoundEvictedSymbols, Unavailable uint64
	Symbols                                                             int64
}

// Stats returns the index's counters.
func (x *Index) Stats() Stats {
	return Stats{Recorded: x.recorded.Get(), Dropped: x.dropped.Get(), EvictedSymbols: x.evicted.Get(),
		BoundEvictedSymbols: x.inline.Get(), Unavailable: x.unavailable.Get(), Symbols: x.Symbols()}
}

// Close stops the host (when it is an io.Closer) and unregisters the metrics.
func (x *Index) Close() error {
	var err error
	if c, ok := x.host.(io.Closer); ok {
		err = c.Close()
	}
	x.metrics.Unregister()
	return err
}

// TextSymbols appends the symbols of text to dst: one per byte.
func TextSymbols(dst []uint32, text []byte) []uint32 {
	for _, b := range text[:min(len(text), MaxSymbols)] {
		dst = append(dst, uint32(b))
	}
	return dst
}
