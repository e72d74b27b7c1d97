package engine

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/config"
	"switchyard/kv"
	"switchyard/load"
)

// Deps are the shared services policies are built with. Application wiring starts them once;
// policies retain handles and never create their own.
type Deps struct {
	// Loads is the engine-reported load table. Nil means no reports (every metric unknown).
	Loads LoadReader
	// Seed seeds the policies' random sources; 0 draws a random seed.
	Seed uint64
	// Affinity is the shared session and routing-key binding store of session_aware and
	// sticky. Nil makes those policies an InvalidConfiguration.
	Affinity AffinityStore
	// Cache is the prefix source of cache_aware, and of session_aware and sticky with
	// affinity.prefix_rebind: the local index (*index.Index) or the remote indexer client
	// (*indexer.RemoteSource). Nil makes cache_aware an InvalidConfiguration.
	Cache kv.CacheSource
	// Metrics receives the policies' metrics (cache_aware decisions). Nil keeps them private.
	Metrics *metrics.Set
	// CacheAwareObserver, when set, is told of every latency decision of every cache_aware
	// policy (a diagnostic seam: the bench records why requests left their prefix's
	// holder). Nil records nothing.
	CacheAwareObserver CacheAwareObserver
}

// WorkersFromConfig builds the configured workers, taking each one's router-local counters
// from counters (nil gives private counters).
func WorkersFromConfig(cfg *config.Config, counters func(id string) *load.Counters) ([]*Worker, error) {
	out := make([]*Worker, 0, len(cfg.Workers))
	for i, wc := range cfg.Workers {
		stage, ok := StageOf(wc.Role)
		if !ok {
			return nil, fmt.Errorf("cannot build workers[%d]: unknown role %q", i, wc.Role)
		}
		var c *load.Counters
		if counters != nil {
			c = counters(wc.ID)
		}
		w := NewWorker(wc.ID, wc.URL, wc.Model, stage, c)
		if len(wc.Labels) > 0 {
			w.SetLabels(maps.Clone(wc.Labels))
		}
		if wc.BootstrapPort != nil {
			w.BootstrapPort = *wc.BootstrapPort
		}
		if wc.DPSize > 0 {
			w.DPSize = wc.DPSize
		}
		w.CanPrefill = wc.CanPrefill && stage == StageDecode
		out = append(out, w)
	}
	return out, nil
}

// BuildResolvers builds one BucketResolver per configured model, with a fresh policy instance
// per group. The configuration must have passed Validate.
func BuildResolvers(cfg *config.Config, deps Deps) (map[string]*BucketResolver, error) {
	seed := deps.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	b := &builder{cfg: cfg, deps: deps, seed: seed}
	out := make(map[string]*BucketResolver, len(cfg.Models))
	var errs []error
	for name, m := range cfg.Models {
		buckets := make([]*Bucket, 0, len(m.Buckets))
		for i, bc := range m.Buckets {
			path := fmt.Sprintf("models.%s.buckets[%d]", name, i)
			bk, err := b.bucket(name, &m, &bc, path)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			buckets = append(buckets, bk)
		}
		var opts []ResolverOption
		if m.BucketOrder == config.BucketOrderSLO {
			opts = append(opts, WithSLOOrder(deps.Loads))
		}
		out[name] = NewBucketResolver(name, buckets, opts...)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

type builder struct {
	cfg          *config.Config
	deps         Deps
	seed         uint64
	stream       uint64
	cacheMetrics *CacheAwareMetrics // created with the first cache_aware policy
}

func (b *builder) bucket(model string, m *config.Model, bc *config.Bucket, path string) (*Bucket, error) {
	bk := &Bucket{ID: bc.ID, Rank: bc.Rank, MinInput: bc.Limits.Min, MaxInput: Unbounded, MaxContext: Unbounded}
	if bc.Limits.Max != nil {
		bk.MaxInput = *bc.Limits.Max
	}
	if bc.MaxContextTokens != nil {
		bk.MaxContext = *bc.MaxContextTokens
	}
	var err error
	switch {
	case bc.Groups.Plain != nil && bc.Groups.PD == nil:
		bk.Plain, err = b.group(model, m, StagePlain, bc.Groups.Plain, path+".groups.plain")
	case bc.Groups.PD != nil && bc.Groups.Plain == nil && bc.Groups.PD.Prefill != nil && bc.Groups.PD.Decode != nil:
		var errP, errD error
		bk.Prefill, errP = b.group(model, m, StagePrefill, bc.Groups.PD.Prefill, path+".groups.pd.prefill")
		bk.Decode, errD = b.group(model, m, StageDecode, bc.Groups.PD.Decode, path+".groups.pd.decode")
		bk.BypassBelow = bc.Groups.PD.BypassBelowTokens
		err = errors.Join(errP, errD)
		if len(bc.Groups.PD.Compatibility) > 0 {
			bk.Compat = slices.Clone(Compatibility(bc.Groups.PD.Compatibility))
		}
	default:
		err = fmt.Errorf("%s.groups: need exactly one of plain or pd (with prefill and decode)", path)
	}
	if err != nil {
		return nil, err
	}
	return bk, nil
}

func (b *builder) group(model string, m *config.Model, stage Stage, g *config.Group, path string) (*EngineGroup, error) {
	pc := b.cfg.EffectivePolicy(model, roleOf(stage), g)
	p, err := b.policy(pc, stage, path+".policy")
	if err != nil {
		return nil, err
	}
	var members []string
	if g.WorkerIDs != nil {
		members = append([]string{}, *g.WorkerIDs...)
	}
	g2 := NewEngineGroup(model, stage, members, p)
	if d := b.cfg.DPDispatch; d.Enabled {
		g2.SetRankDispatch(b.deps.Loads, d.MaxWaitingPerRank)
		if d.PreferPrefix && pc.Type == config.PolicyCacheAware {
			g2.SetRankPrefix(int64(b.cfg.CacheAware.PressureGuard))
		}
	}
	if l := b.cfg.LoRA; l.Enabled && l.AutoLoad {
		var evictable map[string]struct{}
		if l.Evict {
			// The adapters the router can load again: those with a configured path.
			evictable = make(map[string]struct{}, len(m.LoRAAdapters))
			for name := range m.LoRAAdapters {
				evictable[name] = struct{}{}
			}
		}
		g2.SetAdapterLoading(l.LoadTimeout, evictable)
		g2.SetAdapterReplication(l.ReplicateAbove)
	}
	return g2, nil
}

// roleOf maps a stage back to its configured role.
func roleOf(s Stage) config.Role {
	switch s {
	case StagePrefill:
		return config.RolePrefill
	case StageDecode:
		return config.RoleDecode
	}
	return config.RolePlain
}

func (b *builder) rng() *rand.Rand {
	b.stream++
	return rand.New(rand.NewPCG(b.seed, b.stream))
}

// NewPolicy builds one policy instance from its configuration. Policies that need a state
// service (affinity store, cache source) not present in deps are an InvalidConfiguration.
func (b *builder) policy(pc config.Policy, stage Stage, path string) (Policy, error) {
	adm := admissionOf(LimitsFromConfig(pc.Admission))
	switch pc.Type {
	case PolicyRoundRobin:
		return NewRoundRobin(adm, b.deps.Loads), nil
	case PolicyRandom:
		return NewRandom(adm, b.deps.Loads, b.rng()), nil
	case PolicyPowerOfTwo:
		return NewPowerOfTwo(adm, b.deps.Loads, b.rng()), nil
	case PolicyLoadBased:
		return NewLoadBased(adm, b.deps.Loads), nil
	case PolicySessionAware, PolicySticky:
		return b.affinityPolicy(pc, adm, stage, path)
	case PolicyCacheAware:
		return b.cacheAware(adm, stage, path)
	case PolicyConsistentHash:
		h := b.cfg.Hashing
		return NewConsistentHash(adm, b.deps.Loads, h.VirtualNodes, h.LoadFactor), nil
	case PolicyPrefixHash:
		h := b.cfg.Hashing
		return NewPrefixHash(adm, b.deps.Loads, h.PrefixTokens, h.VirtualNodes, h.LoadFactor), nil
	}
	return nil, fmt.Errorf("%s.type: unknown policy %q: %w", path, pc.Type, ErrInvalidConfiguration)
}

// affinityPolicy builds session_aware or sticky. Sticky's fallback (default round_robin) is
// built with default admission; sticky checks the engine it returns.
func (b *builder) affinityPolicy(pc config.Policy, adm EngineAdmission, stage Stage, path string) (Policy, error) {
	if b.deps.Affinity == nil {
		return nil, fmt.Errorf("%s.type: policy %q needs an affinity store: %w", path, pc.Type, ErrInvalidConfiguration)
	}
	if pc.Type == PolicySessionAware {
		p := NewSessionAware(adm, b.deps.Loads, b.deps.Affinity, b.rng())
		b.preferPrefix(&p.affinity, stage)
		return p, nil
	}
	fb := pc.Fallback
	if fb == "" {
		fb = PolicyRoundRobin
	}
	switch fb {
	case PolicyRoundRobin, PolicyRandom, PolicyPowerOfTwo, PolicyLoadBased:
	default:
		return nil, fmt.Errorf("%s.fallback: unknown sticky fallback %q: %w", path, fb, ErrInvalidConfiguration)
	}
	fallback, err := b.policy(config.Policy{Type: fb}, stage, path+".fallback")
	if err != nil {
		return nil, err
	}
	p := NewSticky(adm, b.deps.Loads, b.deps.Affinity, fallback)
	b.preferPrefix(&p.affinity, stage)
	return p, nil
}

// preferPrefix turns on affinity.prefix_rebind for an affinity policy of a plain or prefill
// group when the process has a cache source (decode engines are not indexed).
func (b *builder) preferPrefix(a *affinity, stage Stage) {
	if b.cfg.Affinity.PrefixRebind && b.deps.Cache != nil && stage != StageDecode {
		a.PreferPrefixHolders(b.deps.Cache, int64(b.cfg.CacheAware.MinMatchedTokens))
	}
}

// cacheAware builds cache_aware from the configuration's cache_aware section; it is valid on
// plain and prefill groups only and needs the cache source.
func (b *builder) cacheAware(adm EngineAdmission, stage Stage, path string) (Policy, error) {
	if stage == StageDecode {
		return nil, fmt.Errorf("%s.type: cache_aware is only valid on plain or prefill groups: %w", path, ErrInvalidConfiguration)
	}
	if b.deps.Cache == nil {
		return nil, fmt.Errorf("%s.type: policy %q needs a cache source: %w", path, PolicyCacheAware, ErrInvalidConfiguration)
	}
	if b.cacheMetrics == nil {
		b.cacheMetrics = NewCacheAwareMetrics(b.deps.Metrics)
	}
	s := CacheAwareSettingsFromConfig(b.cfg.CacheAware)
	s.Observer = b.deps.CacheAwareObserver
	return NewCacheAware(adm, b.deps.Loads, b.deps.Cache, s, b.rng(), b.cacheMetrics), nil
}
