package harness

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"switchyard/bench/mockengine"
	"switchyard/bench/report"
	"switchyard/bench/workload"
	"switchyard/config"
)

// ErrInvalidOptions is wrapped by every option error.
var ErrInvalidOptions = errors.New("invalid bench options")

// Scenarios returns every scenario name in the order "all" runs them. The trace and
// instructions scenarios are not among them: they run when named (one needs a trace file,
// the other valgrind and the commands of its processes).
func Scenarios() []string {
	return []string{report.ScenarioOverhead, report.ScenarioRouting, report.ScenarioPD, report.ScenarioBuckets, report.ScenarioMailbox,
		report.ScenarioReplicas, report.ScenarioSLO}
}

// knownScenarios are the names Options.Scenarios accepts.
func knownScenarios() []string {
	return append(Scenarios(), report.ScenarioTrace, report.ScenarioInstructions)
}

// PolicySpec is one row of a policy comparison: a display name and the policy configured
// on the compared group.
type PolicySpec struct {
	Name   string
	Policy config.Policy
	// CacheSource, for cache_aware, is the router's cache_aware.source ("" keeps the
	// default, local: the engines' KV events).
	CacheSource string
	// CacheDecision, when set, is the row's cache_aware.decision.
	CacheDecision string
}

// DefaultPolicies returns the routing scenario's policies: every policy Switchyard has.
// Those the router cannot build yet are reported as skipped rows.
func DefaultPolicies() []PolicySpec {
	return mustPolicies("round_robin,random,power_of_two,load_based,cache_aware,session_aware,sticky,consistent_hash,prefix_hash")
}

// DefaultPDPolicies returns the pd scenario's prefill-group policies.
func DefaultPDPolicies() []PolicySpec {
	return mustPolicies("round_robin,power_of_two,load_based,cache_aware")
}

func mustPolicies(list string) []PolicySpec {
	p, err := ParsePolicies(list)
	if err != nil {
		panic("BUG: " + err.Error())
	}
	return p
}

// ParsePolicies parses a comma-separated policy list. An entry is a policy name,
// "sticky:FALLBACK" for sticky with that fallback (round_robin, random, power_of_two or
// load_based), "cache_aware:SOURCE" for cache_aware with that prefix source (local, the
// engines' KV events, or approximate, the router's tree of what it dispatched), or
// "cache_aware:DECISION" with that cache_aware.decision (latency or threshold).
func ParsePolicies(list string) ([]PolicySpec, error) {
	var out []PolicySpec
	var errs []error
	for _, item := range strings.Split(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, fallback, hasFallback := strings.Cut(item, ":")
		if !slices.Contains(policyNames(), name) {
			errs = append(errs, fmt.Errorf("%w: policies: unknown policy %q (want %s)", ErrInvalidOptions, name, strings.Join(policyNames(), ", ")))
			continue
		}
		spec := PolicySpec{Name: item, Policy: config.Policy{Type: name}}
		switch {
		case hasFallback && name == config.PolicyCacheAware:
			switch fallback {
			case config.CacheSourceLocal, config.CacheSourceApproximate:
				spec.CacheSource = fallback
			case config.CacheDecisionLatency, config.CacheDecisionThreshold:
				spec.CacheDecision = fallback
			default:
				errs = append(errs, fmt.Errorf("%w: policies: %q: cache_aware takes a source, local or approximate, or a decision, latency or threshold", ErrInvalidOptions, item))
				continue
			}
		case hasFallback && name != config.PolicySticky:
			errs = append(errs, fmt.Errorf("%w: policies: %q: only sticky takes a fallback (and cache_aware a source or decision)", ErrInvalidOptions, item))
			continue
		case hasFallback:
			spec.Policy.Fallback = fallback
		}
		if slices.ContainsFunc(out, func(s PolicySpec) bool { return s.Name == spec.Name }) {
			errs = append(errs, fmt.Errorf("%w: policies: %q listed twice", ErrInvalidOptions, item))
			continue
		}
		out = append(out, spec)
	}
	if len(out) == 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("%w: policies: empty list", ErrInvalidOptions))
	}
	return out, errors.Join(errs...)
}

func policyNames() []string {
	return []string{config.PolicyRoundRobin, config.PolicyRandom, config.PolicyPowerOfTwo, config.PolicyLoadBased,
		config.PolicyCacheAware, config.PolicySessionAware, config.PolicySticky, config.PolicyConsistentHash, config.PolicyPrefixHash}
}

// Defaults of Options.
const (
	DefaultEngines         = 4
	DefaultSpeedup         = 4
	DefaultEngineCache     = 32768
	DefaultDuration        = 20 * time.Second
	DefaultConcurrency     = 16
	DefaultOverheadClients = 32
	DefaultMailboxClients  = 512
	DefaultMailboxRequests = 20000
	// DefaultInstructionRequests is the instructions scenario's N2: each target serves
	// N2/5 and then N2 small requests (and a fifth as many streams).
	DefaultInstructionRequests = 5000
	// DefaultInstructionClients is the instructions scenario's closed-loop clients.
	DefaultInstructionClients = 8
	// DefaultReplicas is the replicas scenario's router processes.
	DefaultReplicas           = 3
	DefaultPrefillEngines     = 2
	DefaultDecodeEngines      = 2
	DefaultModel              = "bench"
	DefaultRequestTimeout     = 2 * time.Minute
	DefaultSeed               = 1
	DefaultRouterReadyTimeout = 15 * time.Second
	// DefaultTrace is where the repository's shipped trace lies, seen from the repository's
	// root: a hint for --trace, not a requirement.
	DefaultTrace = "../shared/data/traces/mooncake_synthetic_trace.jsonl"
	// DefaultTraceBlockSize is the tokens per hash ID of a Mooncake trace.
	DefaultTraceBlockSize = 512
	// DefaultTraceEngineCache is each engine's KV cache in the trace scenario when
	// EngineCache is not given: room for the long prompts of a production trace (the
	// Mooncake traces reach 190k tokens), about what an 8B model's KV cache holds on one
	// 80 GB GPU.
	DefaultTraceEngineCache = 524288
)

// DefaultMailboxSizes returns the mailbox scenario's actors.mailbox sizes.
func DefaultMailboxSizes() []int { return []int{1, 4, 16, 64, 256, 1024} }

// DefaultWorkloads returns the routing scenario's workloads.
func DefaultWorkloads() []string { return []string{workload.NameSharedPrefix, workload.NameMultiTurn} }

// Options configure a harness run. Zero fields take their defaults.
type Options struct {
	// Scenarios to run, in order. Default: routing.
	Scenarios []string
	// Target, when set, is a running router's base URL: the routing and trace scenarios measure
	// that router as one row ("target"), and the scenarios that need their own engines are
	// refused.
	Target string
	// Model is the model name served and requested. Default "bench".
	Model string

	// Engines is the number of plain engines. Default 4.
	Engines int
	// Prefill and Decode are the pd scenario's engine counts. Default 2 and 2.
	Prefill, Decode int
	// Speedup divides every simulated duration of the engines; figures of the simulated
	// scenarios are reported in simulated time. Default 4.
	Speedup float64
	// EngineCache is each engine's KV cache capacity, in tokens, and its context length.
	// Default 32768 (trace: DefaultTraceEngineCache).
	EngineCache int
	// MaxRunning is each engine's max_running_requests. Default 64.
	MaxRunning int
	// PageSize is the engines' KV page size, in tokens. Default 16.
	PageSize int
	// Costs is the engines' cost model. Default mockengine.DefaultCosts().
	Costs *mockengine.Costs
	// EngineSpeeds are the plain engines' relative speeds, one per engine: engine i runs
	// its simulation at Speedup × EngineSpeeds[i], so 0.2 is an engine five times slower
	// (a heterogeneous fleet). Default: all 1.
	EngineSpeeds []float64
	// Flavors are the engine flavours each scenario runs on, in order: "sglang" (the mock's
	// SGLang API, load from /v1/loads) and "vllm" (the vLLM API, load from /metrics, workers
	// declared flavor vllm with their KV-event endpoint). Default: sglang.
	Flavors []string

	// Duration bounds each measured row, in wall time. Default 20s (trace: no bound but the
	// trace's own span).
	Duration time.Duration
	// Requests bounds the requests of each row. Default 0: the whole workload (routing, pd,
	// buckets), no bound (overhead), MailboxRequests (mailbox). The instructions scenario's
	// N2 (at least 10; default DefaultInstructionRequests).
	Requests int
	// Concurrency is the number of closed-loop clients. Default 16 (overhead 32, mailbox
	// 512, instructions 8).
	Concurrency int
	// Rate, when positive, sends open-loop Poisson arrivals at this many requests per
	// simulated second instead (routing, pd and buckets).
	Rate float64
	// NoStream sends non-streaming requests in the routing, pd and buckets scenarios (time
	// to first token is then the whole response). Default false: streaming.
	NoStream bool
	// Seed seeds the workloads, the arrivals and the router's policies. Default 1.
	Seed uint64

	// Policies are the routing scenario's rows. Default DefaultPolicies().
	Policies []PolicySpec
	// PDPolicies are the pd scenario's prefill-group policies. Default DefaultPDPolicies().
	PDPolicies []PolicySpec
	// PDBypassTokens, when positive, adds a table to the pd scenario: a short-prompt mix on
	// decode engines that can prefill, with the PD bypass off and then on below this many
	// uncached tokens. Default 0: not measured (the bench command's flag defaults to 256).
	PDBypassTokens int
	// DPRanks, when above 1, adds a table to the routing scenario: plain engines of this
	// many data-parallel ranks under the long-context mix, the ranks chosen by the engines'
	// own balancer and then by the router (dp_dispatch). Default 0: not measured (the bench
	// command's flag defaults to 2).
	DPRanks int
	// FairnessLimit, when above 0, adds a table to the routing scenario: a bulk and an
	// interactive tenant behind a router-wide concurrency limit of this many requests, the
	// queue first in first out and then fair between tenants. Default 0: not measured (the
	// bench command's flag defaults to 8).
	FairnessLimit int
	// LoRAAdapters, when above 0, adds a table to the routing scenario: requests naming this
	// many LoRA adapters, on engines holding them all from the start and then on engines
	// that start with none and have half as many slots, the router loading them on demand.
	// Default 0: not measured (the bench command's flag defaults to 8).
	LoRAAdapters int
	// Workloads are the routing scenario's workloads, one table each. Default
	// DefaultWorkloads().
	Workloads []string
	// Workload configures the generators.
	Workload workload.Config

	// Trace is the request trace the trace scenario replays (Mooncake JSON Lines). Default
	// DefaultTrace.
	Trace string
	// TraceBlockSize is the tokens per hash ID of the trace. Default 512.
	TraceBlockSize int
	// TraceChat sends the trace's prompts as chat text (one user message of the built-in
	// tokenizer's words) instead of token IDs on SGLang's /generate (vLLM: the completions
	// route). Default false.
	TraceChat bool
	// TraceMaxOutput caps each trace request's output length, in tokens. Default 0: as
	// recorded.
	TraceMaxOutput int
	// TraceOracleRow adds the trace scenario's "oracle placement" row: the requests sent
	// straight to the engines (no router), each to the engine the oracle's simulation placed
	// it on, so that the simulated oracle is measured on the engines themselves. Default
	// false.
	TraceOracleRow bool
	// TimeScale divides the trace's recorded arrival times: 2 replays it twice as fast
	// (twice the load). Default 1.
	TimeScale float64
	// MailboxSizes are the mailbox scenario's actors.mailbox sizes (bucket and group).
	// Default DefaultMailboxSizes().
	MailboxSizes []int
	// MailboxRequests is the size of each mailbox row's burst. Default 20000.
	MailboxRequests int
	// SLOTTFT is the slo scenario's time-to-first-token target, in simulated time. Default
	// DefaultSLOTTFT.
	SLOTTFT time.Duration
	// SLORate is the slo scenario's foreground rate, requests per simulated second. Default
	// DefaultSLORate.
	SLORate float64
	// SLOBackgroundRate is the slo scenario's background rate per loaded engine, requests
	// per simulated second. Default DefaultSLOBackgroundRate.
	SLOBackgroundRate float64
	// SLOBackgroundPromptLen is the slo scenario's background prompt length, in tokens.
	// Default DefaultSLOBackgroundPromptLen.
	SLOBackgroundPromptLen int
	// RequestTimeout bounds one request. Default 2 minutes.
	RequestTimeout time.Duration
	// Replicas is the replicas scenario's number of router processes. Default 3.
	Replicas int
	// ReplicaCommand runs one router process (the replicas scenario's routers, the overhead
	// and instructions scenarios' router); the harness appends "--config FILE". switchyard
	// bench sets it to its own binary's serve command. Required by the replicas and
	// instructions scenarios; without it the overhead scenario runs its router in this
	// process.
	ReplicaCommand []string
	// BareCommand runs the overhead and instructions scenarios' bare fasthttp proxy as its
	// own process (reference.StartBareProcess appends its flags). switchyard bench sets it to
	// its own binary's bare-proxy command. Required by the instructions scenario; without it
	// the overhead scenario's bare proxy runs in this process.
	BareCommand []string
	// EvloopCommand runs the overhead and instructions scenarios' event-loop proxy as its
	// own process (reference.StartEvloopProcess appends its flags; Linux). switchyard bench
	// sets it to its own binary's evloop-proxy command on Linux. Without it those scenarios
	// have no event-loop rows.
	EvloopCommand []string

	// Progress receives the progress line; nil prints none.
	Progress io.Writer
	// Logger receives the engines' and the router's logs. Default: discard.
	Logger *slog.Logger
	// Now is the clock of the report's start time. Default time.Now.
	Now func() time.Time

	// flavor is the flavour of the scenario being run (one of Flavors).
	flavor mockengine.Flavor
	// traceCache and traceDuration are the trace scenario's EngineCache and Duration:
	// what was given, else that scenario's defaults (DefaultTraceEngineCache, no bound).
	traceCache    int
	traceDuration time.Duration
}

func (o Options) withDefaults() Options {
	if len(o.Scenarios) == 0 {
		o.Scenarios = []string{report.ScenarioRouting}
	}
	if o.Model == "" {
		o.Model = DefaultModel
	}
	if o.Engines == 0 {
		o.Engines = DefaultEngines
	}
	if o.Prefill == 0 {
		o.Prefill = DefaultPrefillEngines
	}
	if o.Decode == 0 {
		o.Decode = DefaultDecodeEngines
	}
	if o.Speedup == 0 {
		o.Speedup = DefaultSpeedup
	}
	if o.traceCache == 0 {
		o.traceCache, o.traceDuration = o.EngineCache, o.Duration
		if o.traceCache == 0 {
			o.traceCache = DefaultTraceEngineCache
		}
	}
	if o.EngineCache == 0 {
		o.EngineCache = DefaultEngineCache
	}
	if o.MaxRunning == 0 {
		o.MaxRunning = 64
	}
	if o.PageSize == 0 {
		o.PageSize = 16
	}
	if o.Costs == nil {
		c := mockengine.DefaultCosts()
		o.Costs = &c
	}
	if len(o.Flavors) == 0 {
		o.Flavors = []string{string(mockengine.FlavorSGLang)}
	}
	if o.flavor == "" {
		o.flavor = mockengine.Flavor(o.Flavors[0])
	}
	if o.Duration == 0 {
		o.Duration = DefaultDuration
	}
	if o.Trace == "" {
		o.Trace = DefaultTrace
	}
	if o.TraceBlockSize == 0 {
		o.TraceBlockSize = DefaultTraceBlockSize
	}
	if o.TimeScale == 0 {
		o.TimeScale = 1
	}
	if o.Seed == 0 {
		o.Seed = DefaultSeed
	}
	if len(o.Policies) == 0 {
		o.Policies = DefaultPolicies()
	}
	if len(o.PDPolicies) == 0 {
		o.PDPolicies = DefaultPDPolicies()
	}
	if len(o.Workloads) == 0 {
		o.Workloads = DefaultWorkloads()
	}
	if len(o.MailboxSizes) == 0 {
		o.MailboxSizes = DefaultMailboxSizes()
	}
	if o.MailboxRequests == 0 {
		o.MailboxRequests = DefaultMailboxRequests
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.Replicas == 0 {
		o.Replicas = DefaultReplicas
	}
	if o.SLOTTFT == 0 {
		o.SLOTTFT = DefaultSLOTTFT
	}
	if o.SLORate == 0 {
		o.SLORate = DefaultSLORate
	}
	if o.SLOBackgroundRate == 0 {
		o.SLOBackgroundRate = DefaultSLOBackgroundRate
	}
	if o.SLOBackgroundPromptLen == 0 {
		o.SLOBackgroundPromptLen = DefaultSLOBackgroundPromptLen
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// Validate reports every problem of o (after defaults) at once.
func (o Options) Validate() error {
	o = o.withDefaults()
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrInvalidOptions, field, fmt.Sprintf(format, args...)))
	}
	for _, s := range o.Scenarios {
		if !slices.Contains(knownScenarios(), s) {
			bad("scenario", "unknown scenario %q (want %s, or all)", s, strings.Join(knownScenarios(), ", "))
		} else if o.Target != "" && s != report.ScenarioRouting && s != report.ScenarioTrace {
			bad("scenario", "%s starts its own engines and cannot run against --target; only routing and trace can", s)
		}
	}
	if o.TraceBlockSize < 1 || o.TraceBlockSize > workload.MaxTraceTokens {
		bad("trace_block_size", "%d is outside 1..%d", o.TraceBlockSize, workload.MaxTraceTokens)
	}
	if o.TraceMaxOutput < 0 {
		bad("trace_max_output", "%d is negative", o.TraceMaxOutput)
	}
	if !(o.TimeScale > 0) || math.IsInf(o.TimeScale, 0) {
		bad("time_scale", "%v must be a positive number", o.TimeScale)
	}
	if o.traceCache < o.PageSize {
		bad("engine_cache", "%d tokens is below one page", o.traceCache)
	}
	if o.Target != "" && !strings.HasPrefix(o.Target, "http://") && !strings.HasPrefix(o.Target, "https://") {
		bad("target", "%q is not an http(s) URL", o.Target)
	}
	if o.Engines < 1 || o.Engines > 256 {
		bad("engines", "%d is outside 1..256", o.Engines)
	}
	if o.Prefill < 1 || o.Prefill > 128 || o.Decode < 1 || o.Decode > 128 {
		bad("prefill/decode", "%d prefill and %d decode engines: each must be 1..128", o.Prefill, o.Decode)
	}
	if slices.Contains(o.Scenarios, report.ScenarioBuckets) {
		if n := len(o.bucketClasses()); o.Engines < n {
			bad("engines", "the buckets scenario needs at least one engine per length class (%d)", n)
		}
	}
	if !(o.Speedup > 0) || math.IsInf(o.Speedup, 0) {
		bad("speedup", "%v must be a positive number", o.Speedup)
	}
	if o.PageSize < 1 {
		bad("page_size", "%d must be at least 1", o.PageSize)
	}
	if o.EngineCache < o.PageSize {
		bad("engine_cache", "%d tokens is below one page", o.EngineCache)
	}
	if o.MaxRunning < 1 {
		bad("max_running", "%d must be at least 1", o.MaxRunning)
	}
	if len(o.EngineSpeeds) > 0 && len(o.EngineSpeeds) != o.Engines {
		bad("engine_speeds", "%d speeds for %d engines: give one per engine", len(o.EngineSpeeds), o.Engines)
	}
	for _, v := range o.EngineSpeeds {
		if !(v > 0 && v <= 100) {
			bad("engine_speeds", "%v is outside (0, 100]", v)
		}
	}
	for i, f := range o.Flavors {
		switch mockengine.Flavor(f) {
		case mockengine.FlavorSGLang, mockengine.FlavorVLLM:
		default:
			bad("flavors", "unknown flavor %q (want sglang or vllm)", f)
		}
		if slices.Contains(o.Flavors[:i], f) {
			bad("flavors", "%q listed twice", f)
		}
	}
	if o.Target != "" && len(o.Flavors) > 1 {
		bad("flavors", "--target measures one running router: give one flavor at most")
	}
	if o.Duration < 0 {
		bad("duration", "%v is negative", o.Duration)
	}
	if o.Requests < 0 {
		bad("requests", "%d is negative", o.Requests)
	}
	if o.Concurrency < 0 {
		bad("concurrency", "%d is negative", o.Concurrency)
	}
	if o.Rate < 0 || math.IsNaN(o.Rate) || math.IsInf(o.Rate, 0) {
		bad("rate", "%v must be a finite non-negative number", o.Rate)
	}
	for _, w := range o.Workloads {
		if !slices.Contains(workload.Names(), w) {
			bad("workloads", "unknown workload %q (want %s)", w, strings.Join(workload.Names(), ", "))
		}
	}
	for _, m := range o.MailboxSizes {
		if m < 1 {
			bad("mailbox_sizes", "%d must be at least 1", m)
		}
	}
	if slices.Contains(o.Scenarios, report.ScenarioReplicas) {
		if o.Replicas < 2 || o.Replicas > 16 {
			bad("replicas", "%d is outside 2..16", o.Replicas)
		}
		if len(o.ReplicaCommand) == 0 || o.ReplicaCommand[0] == "" {
			bad("replica_command", "the replicas scenario needs the command that runs a router (switchyard bench sets it)")
		}
	}
	if slices.Contains(o.Scenarios, report.ScenarioInstructions) {
		if len(o.ReplicaCommand) == 0 || o.ReplicaCommand[0] == "" {
			bad("replica_command", "the instructions scenario needs the command that runs a router (switchyard bench sets it)")
		}
		if len(o.BareCommand) == 0 || o.BareCommand[0] == "" {
			bad("bare_command", "the instructions scenario needs the command that runs the bare proxy (switchyard bench sets it)")
		}
		if o.Requests != 0 && o.Requests < 10 {
			bad("requests", "the instructions scenario needs at least 10 (N2; N1 is a fifth)")
		}
	}
	if o.MailboxRequests < 1 {
		bad("mailbox_requests", "%d must be at least 1", o.MailboxRequests)
	}
	if slices.Contains(o.Scenarios, report.ScenarioSLO) {
		if o.Engines < 2 {
			bad("engines", "the slo scenario needs at least 2 engines (one bucket with background load, one without)")
		}
		if o.SLOTTFT < 0 {
			bad("slo_ttft", "%v is negative", o.SLOTTFT)
		}
		for name, v := range map[string]float64{"slo_rate": o.SLORate, "slo_background_rate": o.SLOBackgroundRate} {
			if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
				bad(name, "%v must be a finite non-negative number", v)
			}
		}
		if o.SLOBackgroundPromptLen < 1 || o.SLOBackgroundPromptLen+64+sloBackgroundOutputLen > o.EngineCache {
			bad("slo_background_prompt_len", "%d must be at least 1 and fit the engine cache (%d tokens) with its output", o.SLOBackgroundPromptLen, o.EngineCache)
		}
	}
	if slices.Contains(o.Scenarios, report.ScenarioBuckets) || slices.Contains(o.Workloads, workload.NameLongContext) {
		longest := 0
		for _, c := range o.bucketClasses() {
			longest = max(longest, c.Max)
		}
		if need := longest + 64 + o.outputLen(workload.NameLongContext); need > o.EngineCache {
			bad("engine_cache", "%d tokens cannot hold the long-context mix's longest prompt and its output (%d)", o.EngineCache, need)
		}
	}
	return errors.Join(errs...)
}

// bucketClasses are the long-context mix's length classes.
func (o Options) bucketClasses() []workload.LengthClass {
	if len(o.Workload.LongContext.Classes) > 0 {
		return o.Workload.LongContext.Classes
	}
	return workload.DefaultLengthClasses()
}

// outputLen is a workload's configured output length (with its default).
func (o Options) outputLen(name string) int {
	w, err := workload.Build(name, shrink(o.Workload), 1)
	if err != nil || len(w.Requests) == 0 {
		return 0
	}
	return w.Requests[0].MaxTokens
}

// shrink returns c with every generator sized to one request, for reading defaults cheaply.
func shrink(c workload.Config) workload.Config {
	c.SharedPrefix.Groups, c.SharedPrefix.PromptsPerGroup = 1, 1
	c.MultiTurn.Users, c.MultiTurn.Turns = 1, 1
	c.LongContext.Requests = 1
	c.ZeroReuse.Requests = 1
	return c
}
