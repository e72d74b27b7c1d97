package harness

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"switchyard/bench/loadgen"
	"switchyard/bench/mockengine"
	"switchyard/bench/report"
	"switchyard/bench/workload"
	"switchyard/config"
	"switchyard/engine"
)

// policyRun is what measuring one policy row needs beyond the policy.
type policyRun struct {
	scenario string
	wl       *workload.Workload
	spec     clusterSpec
	// model lays out the model's buckets for the cluster with policy p.
	model func(c *cluster, p config.Policy) config.Model
	// serving and prefill name the engines the spreads are over.
	serving, prefill func(c *cluster) []string
	oracles          *oracles
	// path is the route requests take (default: chat); replay, when positive, sends them
	// open-loop at their arrival times divided by it (a trace).
	path   string
	replay float64
	// router, when set, adjusts the router's configuration.
	router func(cfg *config.Config)
	// done, when set, reads the measurement, the engines and the router after the row was
	// measured, before they stop.
	done func(c *cluster, r *router, m *loadgen.Measurement) error
	// loss, when set, explains the row's hits against the oracle (report.Row.Loss), with
	// the router's decisions when decisions is set (nil otherwise).
	loss      func(c *cluster, m *loadgen.Measurement, d *decisionLog) (*report.HitLoss, error)
	decisions bool
}

// plainRun is a policy comparison on the plain engines behind one bucket.
func (o *Options) plainRun(scenario string, wl *workload.Workload, orc *oracles) policyRun {
	return policyRun{
		scenario: scenario, wl: wl, spec: clusterSpec{plain: o.Engines}, oracles: orc,
		model: func(c *cluster, p config.Policy) config.Model {
			return config.Model{Buckets: []config.Bucket{plainBucket("all", ids(c.plain), p)}}
		},
		serving: func(c *cluster) []string { return ids(c.plain) },
	}
}

// routing runs every workload of opts.Workloads under every policy of opts.Policies on
// plain engines behind one bucket.
func (h *harness) routing(ctx context.Context) ([]*report.Scenario, error) {
	var out []*report.Scenario
	o := &h.opts
	for _, name := range o.Workloads {
		wl, err := workload.Build(name, o.Workload, o.Seed)
		if err != nil {
			return out, err
		}
		sc := &report.Scenario{
			Name: report.ScenarioRouting, Workload: name, Description: wl.Description,
			TimeBase: report.TimeSimulated, Speedup: o.Speedup,
		}
		out = append(out, sc)
		orc := h.newOracles(wl.Requests, o.Engines*o.EngineCache)
		if o.Target != "" {
			sc.Deployment = fmt.Sprintf("router at %s; oracle assumes %d engines × %d cache tokens; %s", o.Target, o.Engines, o.EngineCache, h.arrivals())
			sc.TimeBase, sc.Speedup = report.TimeWall, 1
			row, err := h.targetRow(ctx, wl, orc, load{})
			if err != nil {
				return out, err
			}
			sc.Rows = append(sc.Rows, row)
		} else {
			sc.Deployment = h.plainDeployment(o.Engines) + "; router: one bucket, the policy under test; " + h.arrivals()
			sc.SlowWorkers = o.slowEngines()
			pr := o.plainRun(report.ScenarioRouting, wl, orc)
			for _, spec := range o.Policies {
				row, err := h.policyRow(ctx, pr, spec)
				if err != nil {
					return out, err
				}
				sc.Rows = append(sc.Rows, row)
			}
		}
		sc.Oracle = orc.longest()
		sc.Notes = append(sc.Notes, routingNotes(sc, wl)...)
	}
	if o.DPRanks > 1 && o.Target == "" {
		sc, err := h.dpRanks(ctx)
		out = append(out, sc)
		if err != nil {
			return out, err
		}
		if sc, err = h.dpPrefix(ctx); sc != nil {
			out = append(out, sc)
		}
		if err != nil {
			return out, err
		}
	}
	if o.FairnessLimit > 0 && o.Target == "" {
		sc, err := h.fairness(ctx)
		out = append(out, sc)
		if err != nil {
			return out, err
		}
	}
	if o.LoRAAdapters > 0 && o.Target == "" {
		scs, err := h.loraAdapters(ctx)
		out = append(out, scs...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// loraLoadTime is the simulated time a mock engine takes to load one LoRA adapter.
const loraLoadTime = time.Second

// loraAdapters measures LoRA-adapter routing: unique prompts naming LoRAAdapters adapters
// (adapter i requested in proportion to 1/(i+1)) on plain engines, power_of_two, lora.enabled
// and auto_load; first every engine holds every adapter from the start, then the engines
// start with none and half as many slots, and the router loads adapters where it sends them.
// With at least two adapters per engine, a second table (loraPhases) measures eviction.
func (h *harness) loraAdapters(ctx context.Context) ([]*report.Scenario, error) {
	o := &h.opts
	n := o.LoRAAdapters
	const requests = 800
	adapters := make(map[string]string, n)
	for i := range n {
		name := loraName(o.Model, i)
		adapters[name] = "/adapters/" + name
	}
	wl, err := adapterMix("adapter_mix", fmt.Sprintf("%d unique prompts of 256 tokens naming %d LoRA adapters, adapter i in proportion to 1/(i+1), shuffled; output 16", requests, n),
		o.Model, 0, n, requests, o.Seed)
	if err != nil {
		return nil, err
	}
	slots := max(n/2, 1)
	sc := &report.Scenario{
		Name: report.ScenarioRouting, Workload: wl.Name, Description: wl.Description,
		TimeBase: report.TimeSimulated, Speedup: o.Speedup,
		Deployment: h.plainDeployment(o.Engines) + fmt.Sprintf("; an adapter load takes %v; router: one bucket, power_of_two, lora.enabled and auto_load; preloaded: every engine holds the %d adapters from the start; on demand: none at start, %d slots per engine; ",
			loraLoadTime, n, slots) + h.arrivals(),
	}
	for _, v := range []loraVariant{
		{"preloaded", mockengine.LoRA{Slots: n, LoadTime: loraLoadTime, Adapters: adapters}, true},
		{"on demand", mockengine.LoRA{Slots: slots, LoadTime: loraLoadTime}, true},
	} {
		if err := h.loraRow(ctx, sc, wl, adapters, v); err != nil {
			return []*report.Scenario{sc}, err
		}
	}
	out := []*report.Scenario{sc}
	if n >= 2*o.Engines {
		ph, err := h.loraPhases(ctx, adapters)
		out = append(out, ph)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// loraPhases measures LoRA eviction: the adapters requested change half-way (the first half
// of the requests name the first half of the adapters, the rest the others) on engines whose
// slots hold one half (n/2 in the whole fleet); without lora.evict the second half's adapters
// find every slot taken, with it the router unloads the first half's idle adapters.
func (h *harness) loraPhases(ctx context.Context, adapters map[string]string) (*report.Scenario, error) {
	o := &h.opts
	n := o.LoRAAdapters
	const requests = 800
	first, err := adapterMix("", "", o.Model, 0, n/2, requests/2, o.Seed)
	if err != nil {
		return nil, err
	}
	second, err := adapterMix("", "", o.Model, n/2, n, requests/2, o.Seed+uint64(n))
	if err != nil {
		return nil, err
	}
	wl := &workload.Workload{Name: "adapter_phases", Description: fmt.Sprintf("%d unique prompts of 256 tokens: the first half naming adapters 0..%d, the second half adapters %d..%d, each in proportion to 1/(rank+1), shuffled within its half; output 16",
		requests, n/2-1, n/2, n-1), Requests: append(first.Requests, second.Requests...)}
	for i := range wl.Requests {
		wl.Requests[i].Index = i
	}
	slots := max(n/(2*o.Engines), 1)
	sc := &report.Scenario{
		Name: report.ScenarioRouting, Workload: wl.Name, Description: wl.Description,
		TimeBase: report.TimeSimulated, Speedup: o.Speedup,
		Deployment: h.plainDeployment(o.Engines) + fmt.Sprintf("; an adapter load takes %v; router: one bucket, power_of_two, lora.enabled and auto_load; none at start, %d slots per engine; lora.evict off, then on; ",
			loraLoadTime, slots) + h.arrivals(),
	}
	for _, v := range []loraVariant{
		{"no eviction", mockengine.LoRA{Slots: slots, LoadTime: loraLoadTime}, false},
		{"eviction", mockengine.LoRA{Slots: slots, LoadTime: loraLoadTime}, true},
	} {
		if err := h.loraRow(ctx, sc, wl, adapters, v); err != nil {
			return sc, err
		}
	}
	return sc, nil
}

func loraName(model string, i int) string { return fmt.Sprintf("%s-lora-%d", model, i) }

// adapterMix is requests unique prompts of 256 tokens (output 16) naming the adapters
// lo..hi-1, adapter lo+i in proportion to 1/(i+1), shuffled.
func adapterMix(name, description, model string, lo, hi, requests int, seed uint64) (*workload.Workload, error) {
	n := hi - lo
	harmonic := 0.0
	for i := range n {
		harmonic += 1 / float64(i+1)
	}
	parts := make([]mixPart, n)
	left := requests
	for i := n - 1; i >= 0; i-- {
		k := max(int(float64(requests)/harmonic/float64(i+1)), 1)
		if i == 0 {
			k = max(left, 1)
		}
		left -= k
		a := loraName(model, lo+i)
		parts[i] = mixPart{class: a, model: a, cfg: workload.ZeroReuseConfig{Requests: k, PromptLen: 256, OutputLen: 16}}
	}
	return promptMix(name, description, seed, parts...)
}

// loraVariant is one row of a LoRA table: the engines' adapter slots and start, and whether
// the router evicts.
type loraVariant struct {
	name  string
	lora  mockengine.LoRA
	evict bool
}

// loraRow runs wl on fresh engines of v with power_of_two and appends the row and its note
// to sc.
func (h *harness) loraRow(ctx context.Context, sc *report.Scenario, wl *workload.Workload, adapters map[string]string, v loraVariant) error {
	var fig report.LoRAFigures
	pr := policyRun{
		scenario: report.ScenarioRouting, wl: wl, spec: clusterSpec{plain: h.opts.Engines, lora: v.lora},
		model: func(c *cluster, p config.Policy) config.Model {
			m := config.Model{Buckets: []config.Bucket{plainBucket("all", ids(c.plain), p)}}
			m.LoRAAdapters = adapters
			return m
		},
		serving: func(c *cluster) []string { return ids(c.plain) },
		router: func(cfg *config.Config) {
			cfg.LoRA.Enabled, cfg.LoRA.AutoLoad, cfg.LoRA.SlotsPerEngine, cfg.LoRA.Evict = true, true, v.lora.Slots, v.evict
		},
		done: func(c *cluster, r *router, _ *loadgen.Measurement) error {
			for _, e := range c.plain {
				fig.EngineLoads += e.LoRALoads()
			}
			var err error
			if fig.Hits, err = r.counter(ctx, "switchyard_lora_picks_total", `result="hit"`); err != nil {
				return err
			}
			if fig.Loads, err = r.counter(ctx, "switchyard_lora_picks_total", `result="load"`); err != nil {
				return err
			}
			joined, err := r.counter(ctx, "switchyard_lora_picks_total", `result="joined"`)
			if err != nil {
				return err
			}
			fig.Loads += joined // the selections that waited for a load count with those that loaded
			if fig.Replicas, err = r.counter(ctx, "switchyard_lora_picks_total", `result="replica"`); err != nil {
				return err
			}
			if fig.Evictions, err = r.counter(ctx, "switchyard_lora_evictions_total", `result="ok"`); err != nil {
				return err
			}
			fig.SlotWaits, err = r.counter(ctx, "switchyard_lora_slot_waits_total", `result="freed"`)
			return err
		},
	}
	row, err := h.policyRow(ctx, pr, PolicySpec{Name: v.name, Policy: config.Policy{Type: config.PolicyPowerOfTwo}})
	if err != nil {
		return err
	}
	if row.Summary != nil {
		row.LoRA = &fig
		if picks := fig.Hits + fig.Loads + fig.Replicas; picks > 0 {
			sc.Notes = append(sc.Notes, fmt.Sprintf("%s: %d of %d requests served (%d refused); %d of %d picks (%.1f%%) found their adapter on the engine picked; %d adapter loads (%d of them replicas beside busy holders), %d evictions, %d waits for a slot in use",
				v.name, row.Summary.OK, row.Summary.Requests, row.Summary.ErrorCount(), fig.Hits, picks, 100*float64(fig.Hits)/float64(picks), fig.EngineLoads, fig.Replicas, fig.Evictions, fig.SlotWaits))
		}
	}
	sc.Rows = append(sc.Rows, row)
	return nil
}

// Tenants of the fairness table.
const (
	tenantBulk = "bulk"
	tenantChat = "chat"
)

// fairness measures the queue's fair sharing between tenants: a bulk tenant (three requests
// of four, long prompts) and an interactive one (short prompts) behind a router-wide limit
// of FairnessLimit requests, both at priority 0, first in first out (no tenant header: one
// tenant) and then by tenant (server.tenant_header). Each deployment is reported whole and
// per tenant.
func (h *harness) fairness(ctx context.Context) (*report.Scenario, error) {
	o := &h.opts
	wl, err := promptMix("tenant_mix", "800 unique prompts: tenant bulk 600 of 1,024 tokens (output 64), tenant chat 200 of 64 tokens (output 16), shuffled", o.Seed,
		mixPart{class: tenantBulk, tenant: tenantBulk, cfg: workload.ZeroReuseConfig{Requests: 600, PromptLen: 1024, OutputLen: 64}},
		mixPart{class: tenantChat, tenant: tenantChat, cfg: workload.ZeroReuseConfig{Requests: 200, PromptLen: 64, OutputLen: 16}})
	if err != nil {
		return nil, err
	}
	clients := h.concurrency(DefaultConcurrency)
	sc := &report.Scenario{
		Name: report.ScenarioRouting, Workload: wl.Name, Description: wl.Description,
		TimeBase: report.TimeSimulated, Speedup: o.Speedup,
		Deployment: h.plainDeployment(o.Engines) + fmt.Sprintf("; router: one bucket, power_of_two, server.max_concurrent_requests %d (queue %d); fifo: one tenant; fair: tenants by the x-tenant header; ",
			o.FairnessLimit, clients) + h.arrivals(),
	}
	p2 := config.Policy{Type: config.PolicyPowerOfTwo}
	for _, fair := range []bool{false, true} {
		name := "fifo"
		if fair {
			name = "fair"
		}
		var parts []report.Row
		pr := policyRun{
			scenario: report.ScenarioRouting, wl: wl, spec: clusterSpec{plain: o.Engines},
			model: func(c *cluster, p config.Policy) config.Model {
				return config.Model{Buckets: []config.Bucket{plainBucket("all", ids(c.plain), p)}}
			},
			serving: func(c *cluster) []string { return ids(c.plain) },
			router: func(cfg *config.Config) {
				cfg.Server.MaxConcurrentRequests = o.FairnessLimit
				cfg.Server.QueueSize = clients
				cfg.Server.QueueTimeout = o.RequestTimeout
				if fair {
					cfg.Server.TenantHeader = "x-tenant"
				}
			},
			done: func(c *cluster, _ *router, m *loadgen.Measurement) error {
				for _, tenant := range []string{tenantBulk, tenantChat} {
					part := report.Filter(m.Results, func(r *loadgen.Result) bool { return r.Class == tenant })
					parts = append(parts, report.Row{Name: name + "/" + tenant,
						Summary: report.Summarize(part, report.SummaryOptions{Workers: ids(c.plain), TimeScale: o.Speedup, Elapsed: m.Elapsed})})
				}
				return nil
			},
		}
		row, err := h.policyRow(ctx, pr, PolicySpec{Name: name, Policy: p2})
		if err != nil {
			return sc, err
		}
		sc.Rows = append(sc.Rows, row)
		sc.Rows = append(sc.Rows, parts...)
	}
	sc.Notes = append(sc.Notes, "rows name/tenant cover that tenant's requests; the time to first token includes the wait in the router's queue")
	return sc, nil
}

// dpRanks measures data-parallel rank dispatch: two plain engines of DPRanks ranks each under
// the long-context mix, power_of_two over the engines, the rank left to the engines' own
// balancer (round robin), then chosen by the router from each rank's load (dp_dispatch).
func (h *harness) dpRanks(ctx context.Context) (*report.Scenario, error) {
	return h.dpScenario(ctx, workload.NameLongContext, config.Policy{Type: config.PolicyPowerOfTwo}, []dpVariant{
		{"engine's balancer", false, true}, {"router's ranks", true, true}}) // prefer_prefix at its default: no effect outside cache_aware
}

// dpPrefix measures rank choice by prefix holdings: the shared-prefix workload on two plain
// engines of DPRanks ranks each (each rank its own cache and KV events), cache_aware; the rank
// chosen by the engine's balancer, by the router from the ranks' load alone
// (dp_dispatch.prefer_prefix off), then preferring the ranks holding the prompt's prefix.
func (h *harness) dpPrefix(ctx context.Context) (*report.Scenario, error) {
	return h.dpScenario(ctx, workload.NameSharedPrefix, config.Policy{Type: config.PolicyCacheAware}, []dpVariant{
		{"engine's balancer", false, false}, {"router's ranks by load", true, false}, {"router's ranks by prefix", true, true}})
}

// dpVariant is one row of a rank-dispatch table: who chooses the rank.
type dpVariant struct {
	name          string
	ranks, prefix bool // dp_dispatch.enabled, dp_dispatch.prefer_prefix
}

// dpScenario runs workload wl on two plain engines of DPRanks ranks each, policy over the
// engines, one row per variant, with each row's prompt tokens per rank.
func (h *harness) dpScenario(ctx context.Context, wlName string, policy config.Policy, variants []dpVariant) (*report.Scenario, error) {
	o := &h.opts
	wl, err := workload.Build(wlName, o.Workload, o.Seed)
	if err != nil {
		return nil, err
	}
	const engines = 2
	sc := &report.Scenario{
		Name: report.ScenarioRouting, Workload: wl.Name + "_dp", Description: wl.Description,
		TimeBase: report.TimeSimulated, Speedup: o.Speedup,
		Deployment: fmt.Sprintf("%d plain engines × %d data-parallel ranks (cache %d tokens and max running %d per rank), speedup %g; router: one bucket, %s; %s",
			engines, o.DPRanks, o.EngineCache, o.MaxRunning, o.Speedup, policy.Type, h.arrivals()),
	}
	for _, v := range variants {
		var ranks []int64
		pr := policyRun{
			scenario: report.ScenarioRouting, wl: wl, spec: clusterSpec{plain: engines, dpSize: o.DPRanks},
			model: func(c *cluster, p config.Policy) config.Model {
				return config.Model{Buckets: []config.Bucket{plainBucket("all", ids(c.plain), p)}}
			},
			serving: func(c *cluster) []string { return ids(c.plain) },
			router: func(cfg *config.Config) {
				cfg.DPDispatch.Enabled, cfg.DPDispatch.PreferPrefix = v.ranks, v.prefix
			},
			done: func(c *cluster, _ *router, _ *loadgen.Measurement) error {
				for _, e := range c.plain {
					ranks = append(ranks, e.RankPromptTokens()...)
				}
				return nil
			},
		}
		row, err := h.policyRow(ctx, pr, PolicySpec{Name: v.name, Policy: policy})
		if err != nil {
			return sc, err
		}
		row.RankPromptTokens = ranks
		sc.Rows = append(sc.Rows, row)
		fr := make([]float64, len(ranks))
		for i, n := range ranks {
			fr[i] = float64(n)
		}
		sc.Notes = append(sc.Notes, fmt.Sprintf("%s: prompt tokens per rank %v, spread (max/mean) %.2f", v.name, ranks, report.Spread(fr)))
	}
	return sc, nil
}

// pd compares the prefill group's policies on one PD bucket (decode: power_of_two) under the
// shared-prefix workload.
func (h *harness) pd(ctx context.Context) ([]*report.Scenario, error) {
	o := &h.opts
	wl, err := workload.Build(workload.NameSharedPrefix, o.Workload, o.Seed)
	if err != nil {
		return nil, err
	}
	sc := &report.Scenario{
		Name: report.ScenarioPD, Workload: wl.Name, Description: wl.Description,
		TimeBase: report.TimeSimulated, Speedup: o.Speedup,
		Deployment: fmt.Sprintf("%d prefill + %d decode engines (cache %d tokens, max running %d), speedup %g; router: one PD bucket, decode power_of_two, prefill the policy under test; %s",
			o.Prefill, o.Decode, o.EngineCache, o.MaxRunning, o.Speedup, h.arrivals()),
	}
	orc := h.newOracles(wl.Requests, o.Prefill*o.EngineCache)
	decode := config.Policy{Type: config.PolicyPowerOfTwo}
	pr := policyRun{
		scenario: report.ScenarioPD, wl: wl, spec: clusterSpec{prefill: o.Prefill, decode: o.Decode}, oracles: orc,
		model: func(c *cluster, p config.Policy) config.Model {
			pre, dec := ids(c.prefill), ids(c.decode)
			return config.Model{Buckets: []config.Bucket{{ID: "pd", Groups: config.Groups{PD: &config.PDGroups{
				Prefill: &config.Group{WorkerIDs: &pre, Policy: &p},
				Decode:  &config.Group{WorkerIDs: &dec, Policy: &decode},
			}}}}}
		},
		serving: func(c *cluster) []string { return ids(c.decode) },
		prefill: func(c *cluster) []string { return ids(c.prefill) },
	}
	for _, spec := range o.PDPolicies {
		row, err := h.policyRow(ctx, pr, spec)
		if err != nil {
			return []*report.Scenario{sc}, err
		}
		sc.Rows = append(sc.Rows, row)
	}
	sc.Oracle = orc.longest()
	sc.Notes = append(sc.Notes, routingNotes(sc, wl)...)
	sc.Notes = append(sc.Notes, "spread req is over the decode engines, spread prefill over the prefill engines; the oracle pools the prefill engines' caches")
	out := []*report.Scenario{sc}
	if o.PDBypassTokens > 0 {
		bsc, err := h.pdBypass(ctx)
		out = append(out, bsc)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// pdBypass measures the PD bypass on a short-prompt mix: one PD bucket (power_of_two in both
// groups) over decode engines that can prefill, with the bypass off, then on below
// PDBypassTokens uncached tokens.
func (h *harness) pdBypass(ctx context.Context) (*report.Scenario, error) {
	o := &h.opts
	wl, err := shortPromptMix(o.Seed)
	if err != nil {
		return nil, err
	}
	sc := &report.Scenario{
		Name: report.ScenarioPD, Workload: wl.Name, Description: wl.Description,
		TimeBase: report.TimeSimulated, Speedup: o.Speedup,
		Deployment: fmt.Sprintf("%d prefill + %d decode engines that can also prefill alone (cache %d tokens, max running %d), speedup %g; router: one PD bucket, power_of_two in both groups; %s",
			o.Prefill, o.Decode, o.EngineCache, o.MaxRunning, o.Speedup, h.arrivals()),
	}
	p2 := config.Policy{Type: config.PolicyPowerOfTwo}
	for _, below := range []int{0, o.PDBypassTokens} {
		name := "pair (no bypass)"
		if below > 0 {
			name = fmt.Sprintf("bypass < %d tokens", below)
		}
		pr := policyRun{
			scenario: report.ScenarioPD, wl: wl, spec: clusterSpec{prefill: o.Prefill, decode: o.Decode, decodeCanPrefill: true},
			model: func(c *cluster, p config.Policy) config.Model {
				pre, dec := ids(c.prefill), ids(c.decode)
				return config.Model{Buckets: []config.Bucket{{ID: "pd", Groups: config.Groups{PD: &config.PDGroups{
					Prefill:           &config.Group{WorkerIDs: &pre, Policy: &p},
					Decode:            &config.Group{WorkerIDs: &dec, Policy: &p2},
					BypassBelowTokens: int64(below),
				}}}}}
			},
			serving: func(c *cluster) []string { return ids(c.decode) },
			prefill: func(c *cluster) []string { return ids(c.prefill) },
		}
		row, err := h.policyRow(ctx, pr, PolicySpec{Name: name, Policy: p2})
		if err != nil {
			return sc, err
		}
		sc.Rows = append(sc.Rows, row)
		if s := row.Summary; s != nil && s.OK > 0 {
			sc.Notes = append(sc.Notes, fmt.Sprintf("%s: %d of %d requests (%.0f%%) served by a decode engine alone",
				name, s.Bypassed, s.OK, 100*float64(s.Bypassed)/float64(s.OK)))
		}
	}
	sc.Notes = append(sc.Notes, "spread prefill counts a bypassed request's prompt on no prefill engine")
	return sc, nil
}

// shortPromptMix is the bypass table's workload: unique prompts, three of four short
// (64 tokens) and one long (1,024 tokens), shuffled.
func shortPromptMix(seed uint64) (*workload.Workload, error) {
	return promptMix("short_mix", "800 unique prompts: 600 of 64 tokens, 200 of 1,024 tokens, shuffled; output 16", seed,
		mixPart{class: "short", cfg: workload.ZeroReuseConfig{Requests: 600, PromptLen: 64, OutputLen: 16}},
		mixPart{class: "long", cfg: workload.ZeroReuseConfig{Requests: 200, PromptLen: 1024, OutputLen: 16}})
}

// mixPart is one class of a mix: unique prompts of one length, of one tenant, naming one
// model (empty: the run's).
type mixPart struct {
	class, tenant, model string
	cfg                  workload.ZeroReuseConfig
}

// promptMix shuffles the parts' unique prompts (part i generated with seed+i) into one workload.
func promptMix(name, description string, seed uint64, parts ...mixPart) (*workload.Workload, error) {
	var reqs []workload.Request
	for i, p := range parts {
		w, err := workload.ZeroReuse(p.cfg, seed+uint64(i))
		if err != nil {
			return nil, err
		}
		for _, r := range w.Requests {
			r.Class, r.Tenant, r.Model = p.class, p.tenant, p.model
			reqs = append(reqs, r)
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0xb1a5))
	rng.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
	for i := range reqs {
		reqs[i].Index = i
	}
	return &workload.Workload{Name: name, Description: description, Requests: reqs}, nil
}

func (h *harness) plainDeployment(n int) string {
	o := &h.opts
	d := fmt.Sprintf("%d plain %s engines (cache %d tokens, max running %d), speedup %g", n, o.flavor, o.EngineCache, o.MaxRunning, o.Speedup)
	if len(o.EngineSpeeds) > 0 {
		speeds := make([]string, len(o.EngineSpeeds))
		for i, v := range o.EngineSpeeds {
			speeds[i] = fmt.Sprintf("e%d %g×", i, v)
		}
		d += ", engine speeds " + strings.Join(speeds, " ")
	}
	return d
}

// showFlavor reports whether scenarios and progress lines name their flavour: when the run
// compares flavours or uses a non-default one.
func (o *Options) showFlavor() bool {
	return len(o.Flavors) > 1 || o.flavor != mockengine.FlavorSGLang
}

// flavorPrefix labels progress lines with the flavour when showFlavor.
func (o *Options) flavorPrefix() string {
	if o.showFlavor() {
		return "[" + string(o.flavor) + "] "
	}
	return ""
}

// slowEngines are the IDs of the plain engines slower than the fastest (e0, e1, ...).
func (o *Options) slowEngines() []string {
	var out []string
	for i, v := range o.EngineSpeeds {
		if v < slices.Max(o.EngineSpeeds) {
			out = append(out, "e"+strconv.Itoa(i))
		}
	}
	return out
}

func routingNotes(sc *report.Scenario, wl *workload.Workload) []string {
	var notes []string
	for i := range sc.Rows {
		if sc.Rows[i].Truncated {
			notes = append(notes, "* the duration bound ended this row before the whole workload was sent; vs ORACLE compares each row with the oracle of the requests it sent")
			break
		}
	}
	if wl.Name != workload.NameMultiTurn {
		for i := range sc.Rows {
			if sc.Rows[i].Name == config.PolicySessionAware && sc.Rows[i].Skipped == "" {
				notes = append(notes, "this workload sets no session header: session_aware places every request like power_of_two")
				break
			}
		}
	}
	if wl.Name == workload.NameSharedPrefix && slices.ContainsFunc(sc.Rows, func(r report.Row) bool {
		return strings.HasPrefix(r.Name, config.PolicySticky) && r.Skipped == ""
	}) {
		notes = append(notes, "the routing key (x-sgl-routing-key) is the prompt's group, so sticky pins each group to one engine")
	}
	return notes
}

// policyRow measures one policy on fresh engines and a fresh router. A policy the router
// cannot build becomes a skipped row.
func (h *harness) policyRow(ctx context.Context, pr policyRun, spec PolicySpec) (row report.Row, err error) {
	o := &h.opts
	row.Name = spec.Name
	c, err := o.startCluster(ctx, pr.spec)
	if err != nil {
		return row, err
	}
	defer func() { err = errors.Join(err, c.close()) }()
	cfg := o.routerConfig(c)
	cfg.Models = map[string]config.Model{o.Model: pr.model(c, spec.Policy)}
	if spec.CacheSource != "" {
		cfg.CacheAware.Source = spec.CacheSource
	}
	if spec.CacheDecision != "" {
		cfg.CacheAware.Decision = spec.CacheDecision
	}
	if pr.router != nil {
		pr.router(cfg)
	}
	var log *decisionLog
	if pr.decisions {
		log = newDecisionLog()
	}
	var obs engine.CacheAwareObserver
	if log != nil {
		obs = log
	}
	r, err := o.startObservedRouter(ctx, cfg, obs)
	if errors.Is(err, errRouterBuild) {
		row.Skipped = skipReason(err)
		h.progress.note("%s %s %s: skipped: %s", pr.scenario, pr.wl.Name, spec.Name, row.Skipped)
		return row, nil
	}
	if err != nil {
		return row, err
	}
	defer func() { err = errors.Join(err, r.close()) }()
	m, err := h.measure(ctx, load{
		label: o.flavorPrefix() + pr.scenario + " " + pr.wl.Name + " " + spec.Name, urls: []string{r.url}, reqs: pr.wl.Requests,
		stream: !o.NoStream, simulated: true, concurrency: h.concurrency(DefaultConcurrency),
		maxRequests: o.Requests, duration: o.Duration, path: pr.path, replay: pr.replay,
	})
	if err != nil {
		return row, err
	}
	opts := report.SummaryOptions{Workers: pr.serving(c), TimeScale: o.Speedup, Elapsed: m.Elapsed}
	if pr.prefill != nil {
		opts.PrefillWorkers = pr.prefill(c)
	}
	row.Summary = report.Summarize(m.Results, opts)
	row.Truncated = m.Truncated
	if pr.done != nil {
		if err := pr.done(c, r, m); err != nil {
			return row, err
		}
	}
	if pr.oracles != nil && len(m.Results) > 0 {
		if row.Oracle, err = pr.oracles.of(len(m.Results)); err != nil {
			return row, err
		}
	}
	if pr.loss != nil {
		if row.Loss, err = pr.loss(c, m, log); err != nil {
			return row, err
		}
	}
	return row, nil
}

// targetRow measures the router at opts.Target as one row; route (path, replay) says how
// requests are sent when not as closed-loop chat requests.
func (h *harness) targetRow(ctx context.Context, wl *workload.Workload, orc *oracles, route load) (report.Row, error) {
	o := &h.opts
	row := report.Row{Name: "target"}
	scenario := report.ScenarioRouting
	if wl.Replay {
		scenario = report.ScenarioTrace
	}
	m, err := h.measure(ctx, load{
		label: scenario + " " + wl.Name + " target", urls: []string{o.Target}, reqs: wl.Requests,
		stream: !o.NoStream, simulated: false, concurrency: h.concurrency(DefaultConcurrency),
		maxRequests: o.Requests, duration: o.Duration, path: route.path, replay: route.replay,
	})
	if err != nil {
		return row, err
	}
	// The deployment is unknown: spread is over the engines that served something.
	var workers []string
	seen := map[string]bool{}
	for _, r := range m.Results {
		if r.Worker != "" && !seen[r.Worker] {
			seen[r.Worker] = true
			workers = append(workers, r.Worker)
		}
	}
	row.Summary = report.Summarize(m.Results, report.SummaryOptions{Workers: workers, TimeScale: 1, Elapsed: m.Elapsed})
	row.Truncated = m.Truncated
	if len(m.Results) > 0 {
		if row.Oracle, err = orc.of(len(m.Results)); err != nil {
			return row, err
		}
	}
	return row, nil
}
