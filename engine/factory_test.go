package engine

import (
	"context"
	"errors"
	"slices"
	"testing"

	"switchyard/config"
	"switchyard/kv"
)

const factoryYAML = `
workers:
  - {id: P1, url: "http://127.0.0.1:1", model: llama, role: prefill, bootstrap_port: 8998}
  - {id: P2, url: "http://127.0.0.1:2", model: llama, role: prefill}
  - {id: D1, url: "http://127.0.0.1:3", model: llama, role: decode, dp_size: 2}
  - {id: Q1, url: "http://127.0.0.1:4", model: qwen}
  - {id: Q2, url: "http://127.0.0.1:5", model: qwen}
models:
  llama:
    policies:
      decode: {type: load_based}
    buckets:
      - id: long
        rank: 1
        limits: {min: 0}
        groups:
          pd:
            prefill: {worker_ids: [P2], policy: {type: random}}
            decode: {}
      - id: short
        rank: 5
        limits: {min: 0, max: 100}
        max_context_tokens: 200
        groups:
          pd:
            prefill: {policy: {type: power_of_two, admission: {max_inflight_requests: 3}}}
            decode: {worker_ids: []}
  qwen:
    buckets:
      - id: only
        groups:
          plain: {}
`

// configWorkers decodes and validates a YAML configuration and builds its workers.
func configWorkers(t *testing.T, doc string) (*config.Config, []*Worker) {
	t.Helper()
	cfg, err := config.Decode([]byte(doc), config.FormatYAML)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	workers, err := WorkersFromConfig(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, workers
}

func TestBuildResolvers(t *testing.T) {
	cfg, workers := configWorkers(t, factoryYAML)
	set := mustSet(t, workers)
	reg := set.Load()
	if w := reg.Worker("P1"); w.BootstrapPort != 8998 || w.Stage != StagePrefill {
		t.Fatalf("P1 = %+v", w)
	}
	if w := reg.Worker("D1"); w.DPSize != 2 || w.Stage != StageDecode {
		t.Fatalf("D1 = %+v", w)
	}
	rs, err := BuildResolvers(cfg, Deps{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	llama := rs["llama"]
	if got := ids(llama.Buckets()); !slices.Equal(got, []string{"short", "long"}) {
		t.Fatalf("bucket order %v", got)
	}
	short, long := llama.Buckets()[0], llama.Buckets()[1]
	if short.MaxInput != 100 || short.MaxContext != 200 || long.MaxInput != Unbounded || long.MaxContext != Unbounded {
		t.Fatalf("limits: short %+v long %+v", short, long)
	}
	checks := []struct {
		name       string
		group      *EngineGroup
		policy     string
		candidates []string
	}{
		{"explicit member with own policy", long.Prefill, PolicyRandom, []string{"P2"}},
		{"absent members inherit the model's stage default", long.Decode, PolicyLoadBased, []string{"D1"}},
		{"absent members are every prefill engine", short.Prefill, PolicyPowerOfTwo, []string{"P1", "P2"}},
		{"empty member list is none", short.Decode, PolicyLoadBased, nil},
		{"default policy is round_robin", rs["qwen"].Buckets()[0].Plain, PolicyRoundRobin, []string{"Q1", "Q2"}},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			if c.group.Policy().Name() != c.policy {
				t.Fatalf("policy %s, want %s", c.group.Policy().Name(), c.policy)
			}
			var got []string
			for _, w := range c.group.Candidates(reg) {
				got = append(got, w.ID)
			}
			if !slices.Equal(got, c.candidates) {
				t.Fatalf("candidates %v, want %v", got, c.candidates)
			}
		})
	}
	// The short bucket's decode group is empty: selection falls through to the long bucket.
	bs, _ := llama.Resolve(nil, 50, 60)
	p, err := selectEngines(bs, nil, func(b *Bucket) (BucketPick, error) { return pickEngines(b, reg, breq("llama", 50, 60)) })
	if err != nil || p.BucketID != "long" || p.Prefill.Worker.ID != "P2" || p.Decode.Worker.ID != "D1" {
		t.Fatalf("pick %+v err %v", p, err)
	}
}

func TestBuildResolversRejectsUnavailablePolicy(t *testing.T) {
	cfg := config.Default()
	cfg.Workers = []config.Worker{{ID: "W", URL: "http://127.0.0.1:1", Model: "m", Role: config.RolePlain, DPSize: 1}}
	cfg.Models = map[string]config.Model{"m": {Buckets: []config.Bucket{{ID: "b", Groups: config.Groups{
		Plain: &config.Group{Policy: &config.Policy{Type: "no_such_policy"}}}}}}}
	_, err := BuildResolvers(cfg, Deps{})
	if !errors.Is(err, ErrInvalidConfiguration) {
		t.Fatalf("err = %v", err)
	}
}

// noCache is a prefix source that never answers (the factory only hands it on).
type noCache struct{}

func (noCache) Lookup(context.Context, string, []uint32, *kv.Lookup) error { return kv.ErrUnavailable }

// TestBuildResolversPrefixRebind: affinity.prefix_rebind turns on the prefix-holder
// preference of session_aware and sticky on plain and prefill groups when the process has
// a cache source, never on decode groups.
func TestBuildResolversPrefixRebind(t *testing.T) {
	const y = `
workers:
  - {id: P1, url: "http://127.0.0.1:1", model: llama, role: prefill}
  - {id: D1, url: "http://127.0.0.1:2", model: llama, role: decode}
  - {id: Q1, url: "http://127.0.0.1:3", model: qwen}
models:
  llama:
    buckets:
      - id: pd
        groups:
          pd:
            prefill: {policy: {type: sticky}}
            decode: {policy: {type: session_aware}}
  qwen:
    buckets:
      - id: only
        groups:
          plain: {policy: {type: session_aware}}
`
	cfg, err := config.Decode([]byte(y), config.FormatYAML)
	if err != nil {
		t.Fatal(err)
	}
	prefixOn := func(g *EngineGroup) bool {
		switch p := g.Policy().(type) {
		case *SessionAware:
			return p.prefixOn
		case *Sticky:
			return p.prefixOn
		}
		t.Fatalf("policy %T", g.Policy())
		return false
	}
	for _, tt := range []struct {
		name                   string
		rebind                 bool
		cache                  kv.CacheSource
		prefill, decode, plain bool
	}{
		{"off by default", false, noCache{}, false, false, false},
		{"on with a cache source", true, noCache{}, true, false, true},
		{"without a cache source nothing to read", true, nil, false, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg.Affinity.PrefixRebind = tt.rebind
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			rs, err := BuildResolvers(cfg, Deps{Seed: 1, Affinity: newMemAffinity(), Cache: tt.cache})
			if err != nil {
				t.Fatal(err)
			}
			pd, plain := rs["llama"].Buckets()[0], rs["qwen"].Buckets()[0]
			if got := [3]bool{prefixOn(pd.Prefill), prefixOn(pd.Decode), prefixOn(plain.Plain)}; got != [3]bool{tt.prefill, tt.decode, tt.plain} {
				t.Fatalf("prefix preference (prefill, decode, plain) = %v, want %v", got, [3]bool{tt.prefill, tt.decode, tt.plain})
			}
		})
	}
}

// TestBuildResolversSLOAndCompatibility: bucket_order slo gives the resolver the slo rule,
// groups.pd.compatibility becomes the bucket's rule, and worker labels are copied.
func TestBuildResolversSLOAndCompatibility(t *testing.T) {
	cfg, workers := configWorkers(t, `
workers:
  - {id: P1, url: "http://127.0.0.1:1", model: llama, role: prefill, labels: {transfer_backend: nixl}}
  - {id: D1, url: "http://127.0.0.1:2", model: llama, role: decode, labels: {transfer_backend: nixl}}
  - {id: Q1, url: "http://127.0.0.1:3", model: qwen}
models:
  llama:
    bucket_order: slo
    buckets:
      - id: b
        groups: {pd: {prefill: {}, decode: {}, compatibility: [transfer_backend]}}
  qwen:
    buckets:
      - id: only
        groups: {plain: {}}
`)
	cfg.Workers[0].Labels["transfer_backend"] = "changed" // the worker keeps its own copy
	set := mustSet(t, workers)
	if got := set.Load().Worker("P1").Label("transfer_backend"); got != "nixl" {
		t.Fatalf("P1 label %q", got)
	}
	rs, err := BuildResolvers(cfg, Deps{})
	if err != nil {
		t.Fatal(err)
	}
	b := rs["llama"].Buckets()[0]
	if !slices.Equal(b.Compat, Compatibility{"transfer_backend"}) {
		t.Fatalf("compat %v", b.Compat)
	}
	req := &BucketRequest{Model: "llama", InputTokens: 1, ExpectedPeak: -1, SLO: SLOTargets{TTFT: 1}}
	if o := rs["llama"].Order(rs["llama"].Buckets(), req, set.Load()); o != OrderSLO {
		t.Fatalf("llama order %v", o)
	}
	if o := rs["qwen"].Order(rs["qwen"].Buckets(), req, set.Load()); o != OrderCapacity {
		t.Fatalf("qwen order %v", o)
	}
}
