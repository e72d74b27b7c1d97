package actors

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/kv"
	"switchyard/kv/approx"
	"switchyard/kv/index"
	"switchyard/kv/indexer"
	"switchyard/kv/subscribe"
	"switchyard/load/zmtp"
)

// CacheOptions are CacheState's collaborators beyond the configuration.
type CacheOptions struct {
	// Logger receives the index's and subscriptions' logs. Default: discarded.
	Logger *slog.Logger
	// Metrics receives the switchyard_kv_* series. Default: a private set.
	Metrics *metrics.Set
	// System is the actor system the index (or approximate tree) shard actors run on.
	// Default: a private one.
	System *System
	// OnApplied, when set, is called after each KV-event batch is applied (see
	// subscribe.ManagerConfig.OnApplied). For tests and tracing; it must not block.
	OnApplied func(worker string, rank int, seq uint64)
}

// CacheState is the router's cache state, built once from the configuration: the prefix
// source that cache_aware policies read (engine.Deps.Cache), and with a local source the
// index on shard actors plus the KV-event subscriptions feeding it. The serving path:
//
//	cs, _ := actors.NewCacheState(cfg, opts)            // when actors.NeedsCache(cfg)
//	deps.Cache = cs.Source()                            // engine.BuildResolvers
//	go cs.Run(ctx)                                      // subscriptions, until shutdown
//	if memo := cs.Prepare(ctx, model, tokens); memo != nil {  // per request, before the picks
//		breq.Prefix = memo                              // engine.BucketRequest
//	}
//	cs.AddWorker(spec) / cs.RemoveWorker(id)            // worker lifecycle (httpfront/fleet)
//	cs.Close()
//
// Safe for concurrent use.
type CacheState struct {
	source     kv.CacheSource
	index      *index.Index
	approx     *approx.Index
	evictEvery time.Duration
	manager    *subscribe.Manager
	timeout    time.Duration
	prepare    map[string]bool // models whose requests need a prefix lookup (cacheModels)
}

// NeedsCache reports whether any group's effective policy is cache_aware, or session_aware
// or sticky with affinity.prefix_rebind.
func NeedsCache(cfg *config.Config) bool { return len(cacheModels(cfg)) > 0 }

// cacheModels returns the models whose requests need a prefix lookup: at least one
// cache_aware group, or (with affinity.prefix_rebind) a session_aware or sticky group on
// plain or prefill engines.
func cacheModels(cfg *config.Config) map[string]bool {
	type roleGroup struct {
		role config.Role
		g    *config.Group
	}
	out := map[string]bool{}
	for name, m := range cfg.Models {
		for _, b := range m.Buckets {
			var groups []roleGroup
			if b.Groups.Plain != nil {
				groups = append(groups, roleGroup{config.RolePlain, b.Groups.Plain})
			}
			if b.Groups.PD != nil && b.Groups.PD.Prefill != nil {
				groups = append(groups, roleGroup{config.RolePrefill, b.Groups.PD.Prefill})
			}
			for _, g := range groups {
				switch cfg.EffectivePolicy(name, g.role, g.g).Type {
				case config.PolicyCacheAware:
					out[name] = true
				case config.PolicySessionAware, config.PolicySticky:
					if cfg.Affinity.PrefixRebind {
						out[name] = true // a lost binding returns to the prefix holder
					}
				}
			}
		}
	}
	return out
}

// NewCacheState builds the cache state cfg describes: cache_aware.source approximate (a
// prefix tree of the dispatched prompts on kv.shards approximate-tree actors, bounded by
// cache_aware.approximate.max_tree_size), local (an index of
// kv.shards shards on index shard actors, bounded by kv.max_blocks, fed by subscriptions to
// every configured worker of a model with a cache_aware group unless kv.enabled is false,
// and by the kv.bind_endpoint SUB) or
// remote (an indexer.RemoteSource of cache_aware.remote_url with cache_aware.query_timeout and
// cache_aware.max_inflight_queries).
func NewCacheState(cfg *config.Config, opts CacheOptions) (*CacheState, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.NewSet()
	}
	km := kv.NewMetrics(opts.Metrics)
	cs := &CacheState{prepare: cacheModels(cfg), timeout: cfg.CacheAware.QueryTimeout}
	switch cfg.CacheAware.Source {
	case config.CacheSourceRemote:
		r, err := indexer.NewRemoteSource(indexer.RemoteConfig{URL: cfg.CacheAware.RemoteURL, Timeout: cfg.CacheAware.QueryTimeout,
			MaxInflight: cfg.CacheAware.MaxInflightQueries, Metrics: km})
		if err != nil {
			return nil, fmt.Errorf("cannot build the cache state: %w", err)
		}
		cs.source = r
		return cs, nil
	case config.CacheSourceApproximate:
		ap := cfg.CacheAware.Approximate
		io := IndexOptionsFrom(cfg)
		io.Logger, io.Metrics, io.System = opts.Logger, opts.Metrics, opts.System
		x, err := approx.New(approx.Config{Shards: cfg.KV.Shards, MaxTreeSize: ap.MaxTreeSize,
			Host: ApproxHost(io), Metrics: opts.Metrics, Logger: opts.Logger})
		if err != nil {
			return nil, fmt.Errorf("cannot build the cache state: %w", err)
		}
		cs.approx, cs.source, cs.evictEvery = x, x, ap.EvictionInterval
		return cs, nil
	case config.CacheSourceLocal, "":
	default:
		return nil, fmt.Errorf("cannot build the cache state: unknown cache_aware.source %q", cfg.CacheAware.Source)
	}
	io := IndexOptionsFrom(cfg)
	io.Logger, io.Metrics, io.System = opts.Logger, opts.Metrics, opts.System
	x, err := index.New(index.Config{Shards: cfg.KV.Shards, MaxBlocks: cfg.KV.MaxBlocks, HashCacheChunks: cfg.KV.HashCacheChunks, BlockKey: cfg.KV.BlockKey,
		SplitBlocks: cfg.KV.LookupSplitBlocks, LookupTimeout: cfg.CacheAware.QueryTimeout, Host: IndexHost(io), Metrics: km})
	if err != nil {
		return nil, fmt.Errorf("cannot build the cache state: %w", err)
	}
	cs.index, cs.source = x, x
	if !cfg.KV.Enabled {
		return cs, nil
	}
	m, err := subscribe.NewManager(ManagerConfigFrom(cfg, x, opts.Logger.With(slog.String("component", "kv")), opts.OnApplied))
	if err != nil {
		_ = x.Close()
		return nil, fmt.Errorf("cannot build the cache state: %w", err)
	}
	cs.manager = m
	for _, w := range cfg.Workers {
		if !cs.prepare[w.Model] {
			continue // no group reads this worker's blocks
		}
		if err := m.AddWorker(WorkerSpecFrom(w)); err != nil {
			_ = x.Close()
			return nil, fmt.Errorf("cannot build the cache state: %w", err)
		}
	}
	return cs, nil
}

// WorkerSpecFrom is the KV subscription of a configured worker: its kv_events endpoint when
// set, else the publishers the worker lifecycle names once it has introspected the engine
// (and the bound SUB for engines that dial it), with the KV facts the worker declares
// (replay endpoint, block size, hash scheme).
//
// A vllm-flavoured worker is never asked for its publishers (it has no /server_info: its
// publisher is configured or dials the bound SUB), and its block hashes are re-keyed
// unless its kv_hash_scheme says otherwise.
func WorkerSpecFrom(w config.Worker) subscribe.WorkerSpec {
	spec := subscribe.WorkerSpec{ID: w.ID, URL: w.URL, Model: w.Model, DPSize: w.DPSize, KVEvents: w.KVEvents,
		Replay: w.KVReplay, BlockSize: w.KVBlockSize, HashScheme: w.KVHashScheme}
	if w.Flavor == config.FlavorVLLM {
		spec.NoDiscovery = true
		if spec.HashScheme == "" {
			spec.HashScheme = subscribe.HashSchemeRekey
		}
	}
	return spec
}

// ManagerConfigFrom is the KV subscription manager of cfg's kv section over index x.
func ManagerConfigFrom(cfg *config.Config, x *index.Index, log *slog.Logger, onApplied func(string, int, uint64)) subscribe.ManagerConfig {
	return subscribe.ManagerConfig{Index: x, BindEndpoint: cfg.KV.BindEndpoint, DefaultBlockSize: cfg.KV.BlockSize,
		MinBackoff: cfg.KV.ReconnectBackoff, Logger: log, OnApplied: onApplied,
		Limits: zmtp.Limits{MaxMessage: cfg.KV.MaxMessageBytes}}
}

// Source is the prefix source for engine.Deps.Cache.
func (c *CacheState) Source() kv.CacheSource { return c.source }

// Index is the local index, nil with a remote or approximate source.
func (c *CacheState) Index() *index.Index { return c.index }

// Approximate is the approximate prefix tree, nil unless cache_aware.source is approximate.
func (c *CacheState) Approximate() *approx.Index { return c.approx }

// Record tells the approximate source that the request of memo was dispatched to worker
// (its prompt's symbols are then held by worker). A no-op with another source or without
// a memo.
func (c *CacheState) Record(memo *kv.PrefixMemo, worker string) {
	if c.approx == nil || memo == nil {
		return
	}
	c.approx.Record(memo.Model(), worker, memo.Tokens())
}

// Manager is the local index's subscriptions, nil with a remote source or kv.enabled false.
func (c *CacheState) Manager() *subscribe.Manager { return c.manager }

// NeedsPrefix reports whether requests for model need a prefix lookup (one of its groups
// runs cache_aware, or an affinity policy with affinity.prefix_rebind).
func (c *CacheState) NeedsPrefix(model string) bool { return c.prepare[model] }

// Prepare makes the request's one prefix lookup, in the request goroutine before any pick
// (the only place a remote lookup's I/O happens), bounded by cache_aware.query_timeout.
// It returns nil when the model needs none or there are no tokens; otherwise the memo to
// put in engine.BucketRequest.Prefix. An unavailable source or a rejected query is recorded
// in the memo; the policy turns them into a miss or an invalid signal.
func (c *CacheState) Prepare(ctx context.Context, model string, tokens []uint32) *kv.PrefixMemo {
	if !c.prepare[model] || len(tokens) == 0 {
		return nil
	}
	memo := kv.NewPrefixMemo(model, tokens)
	c.Resolve(ctx, memo)
	return memo
}

// Resolve makes memo's lookup for the state's source (a pooled memo's counterpart of
// Prepare).
func (c *CacheState) Resolve(ctx context.Context, memo *kv.PrefixMemo) *kv.PrefixResult {
	if _, ok := ctx.Deadline(); !ok && c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	return memo.Resolve(ctx, c.source)
}

// Run follows the workers' KV events until ctx is done, then closes every subscription
// socket; with the approximate source it evicts every cache_aware.approximate.
// eviction_interval; otherwise (remote source, kv.enabled false) it only waits for ctx.
func (c *CacheState) Run(ctx context.Context) error {
	if c.approx != nil {
		t := time.NewTicker(c.evictEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				c.approx.Evict()
			}
		}
	}
	if c.manager == nil {
		<-ctx.Done()
		return nil
	}
	return c.manager.Run(ctx)
}

// AddWorker starts (or changes) following a worker's KV events: a worker added at run time,
// or one whose publishers its introspection found. A no-op without local subscriptions or
// when no cache_aware group of the worker's model reads its blocks.
func (c *CacheState) AddWorker(spec subscribe.WorkerSpec) error {
	if c.manager == nil || !c.prepare[spec.Model] {
		return nil
	}
	return c.manager.AddWorker(spec)
}

// RemoveWorker stops following a removed worker and drops its entries.
func (c *CacheState) RemoveWorker(id string) {
	switch {
	case c.approx != nil:
		c.approx.RemoveWorker(id)
	case c.manager != nil:
		c.manager.RemoveWorker(id)
	case c.index != nil:
		c.index.RemoveWorker(id)
	}
}

// Close stops the index's shard actors. Run must have returned.
func (c *CacheState) Close() error {
	if c.approx != nil {
		return c.approx.Close()
	}
	if c.index == nil {
		return nil
	}
	return c.index.Close()
}

// Deps adds the cache source to deps (engine.BuildResolvers).
func (c *CacheState) Deps(deps engine.Deps) engine.Deps {
	deps.Cache = c.source
	return deps
}
