package harness

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"switchyard/bench/loadgen"
	"switchyard/bench/mockengine"
	"switchyard/bench/report"
	"switchyard/bench/workload"
	"switchyard/tokenizer"
)

// Run runs the scenarios of opts and returns their report. On error it returns the
// scenarios completed so far with the error. Every engine and router it starts is stopped
// before it returns.
func Run(ctx context.Context, opts Options) (*report.Report, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	h := &harness{opts: opts, tok: tokenizer.NewSimple(), progress: newProgress(opts.Progress)}
	rep := &report.Report{
		Tool:    "switchyard bench",
		Started: opts.Now().UTC().Truncate(time.Second),
		Machine: report.Machine{OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(), GoVersion: runtime.Version(),
			LoadAverage: loadAverage()},
		Settings: opts.settings(),
	}
	for _, flavor := range opts.Flavors {
		h.opts.flavor = mockengine.Flavor(flavor)
		for _, name := range opts.Scenarios {
			var scs []*report.Scenario
			var err error
			switch name {
			case report.ScenarioOverhead:
				scs, err = h.overhead(ctx)
			case report.ScenarioRouting:
				scs, err = h.routing(ctx)
			case report.ScenarioPD:
				scs, err = h.pd(ctx)
			case report.ScenarioBuckets:
				scs, err = h.buckets(ctx)
			case report.ScenarioMailbox:
				scs, err = h.mailbox(ctx)
			case report.ScenarioTrace:
				scs, err = h.trace(ctx)
			case report.ScenarioReplicas:
				scs, err = h.replicas(ctx)
			case report.ScenarioSLO:
				scs, err = h.slo(ctx)
			case report.ScenarioInstructions:
				scs, err = h.instructions(ctx)
			}
			if h.opts.showFlavor() {
				for _, sc := range scs {
					sc.Flavor = flavor
				}
			}
			rep.Scenarios = append(rep.Scenarios, scs...)
			if err != nil {
				return rep, fmt.Errorf("cannot run scenario %s (%s): %w", name, flavor, err)
			}
		}
	}
	return rep, nil
}

// loadAverage returns the first three fields of /proc/loadavg, or "" where there is none.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// harness is one Run.
type harness struct {
	opts     Options
	tok      *tokenizer.Simple
	progress *progress
}

// settings is the JSON form of the options in a report.
type settings struct {
	Scenarios       []string  `json:"scenarios"`
	Target          string    `json:"target,omitempty"`
	Model           string    `json:"model"`
	Engines         int       `json:"engines"`
	Prefill         int       `json:"prefill_engines"`
	Decode          int       `json:"decode_engines"`
	Speedup         float64   `json:"speedup"`
	EngineCache     int       `json:"engine_cache_tokens"`
	MaxRunning      int       `json:"max_running"`
	PageSize        int       `json:"page_size"`
	DurationS       float64   `json:"duration_s"`
	Requests        int       `json:"requests,omitempty"`
	Concurrency     int       `json:"concurrency,omitempty"`
	Rate            float64   `json:"rate,omitempty"`
	Stream          bool      `json:"stream"`
	Seed            uint64    `json:"seed"`
	Policies        []string  `json:"policies"`
	PDPolicies      []string  `json:"pd_policies"`
	PDBypassTokens  int       `json:"pd_bypass_tokens,omitempty"`
	DPRanks         int       `json:"dp_ranks,omitempty"`
	FairnessLimit   int       `json:"fairness_limit,omitempty"`
	LoRAAdapters    int       `json:"lora_adapters,omitempty"`
	Workloads       []string  `json:"workloads"`
	MailboxSizes    []int     `json:"mailbox_sizes"`
	MailboxRequests int       `json:"mailbox_requests"`
	Trace           string    `json:"trace,omitempty"`
	TraceBlockSize  int       `json:"trace_block_size,omitempty"`
	TraceChat       bool      `json:"trace_chat,omitempty"`
	TraceMaxOutput  int       `json:"trace_max_output,omitempty"`
	TimeScale       float64   `json:"time_scale,omitempty"`
	Replicas        int       `json:"replicas,omitempty"`
	EngineSpeeds    []float64 `json:"engine_speeds,omitempty"`
	Flavors         []string  `json:"flavors"`
	SLO             struct {
		TTFTMs              float64 `json:"ttft_ms"`
		Rate                float64 `json:"rate"`
		BackgroundRate      float64 `json:"background_rate"`
		BackgroundPromptLen int     `json:"background_prompt_len"`
	} `json:"slo"`
	Costs struct {
		PrefillOverheadMs  float64 `json:"prefill_overhead_ms"`
		PrefillPerTokenUs  float64 `json:"prefill_per_token_us"`
		DecodeStepMs       float64 `json:"decode_step_ms"`
		DecodePerRequestUs float64 `json:"decode_per_request_us"`
	} `json:"costs"`
}

func (o Options) settings() settings {
	names := func(ps []PolicySpec) []string {
		out := make([]string, len(ps))
		for i, p := range ps {
			out[i] = p.Name
		}
		return out
	}
	s := settings{
		Scenarios: o.Scenarios, Target: o.Target, Model: o.Model, Engines: o.Engines, Prefill: o.Prefill, Decode: o.Decode,
		Speedup: o.Speedup, EngineCache: o.EngineCache, MaxRunning: o.MaxRunning, PageSize: o.PageSize,
		DurationS: o.Duration.Seconds(), Requests: o.Requests, Concurrency: o.Concurrency, Rate: o.Rate, Stream: !o.NoStream,
		Seed: o.Seed, Policies: names(o.Policies), PDPolicies: names(o.PDPolicies), PDBypassTokens: o.PDBypassTokens, DPRanks: o.DPRanks, FairnessLimit: o.FairnessLimit, LoRAAdapters: o.LoRAAdapters, Workloads: o.Workloads,
		MailboxSizes: o.MailboxSizes, MailboxRequests: o.MailboxRequests, Replicas: o.replicasSetting(), EngineSpeeds: o.EngineSpeeds, Flavors: o.Flavors,
	}
	if slices.Contains(o.Scenarios, report.ScenarioTrace) {
		s.Trace, s.TraceBlockSize, s.TraceChat, s.TraceMaxOutput, s.TimeScale = o.Trace, o.TraceBlockSize, o.TraceChat, o.TraceMaxOutput, o.TimeScale
	}
	s.SLO.TTFTMs = float64(o.SLOTTFT) / float64(time.Millisecond)
	s.SLO.Rate, s.SLO.BackgroundRate, s.SLO.BackgroundPromptLen = o.SLORate, o.SLOBackgroundRate, o.SLOBackgroundPromptLen
	s.Costs.PrefillOverheadMs = float64(o.Costs.PrefillOverhead) / float64(time.Millisecond)
	s.Costs.PrefillPerTokenUs = float64(o.Costs.PrefillPerToken) / float64(time.Microsecond)
	s.Costs.DecodeStepMs = float64(o.Costs.DecodeStep) / float64(time.Millisecond)
	s.Costs.DecodePerRequestUs = float64(o.Costs.DecodePerRequest) / float64(time.Microsecond)
	return s
}

// load describes one measured run of a row.
type load struct {
	label     string // progress label
	urls      []string
	route     func(i int) string // chooses request i's URL; nil rotates over urls
	reqs      []workload.Request
	stream    bool
	simulated bool // convert Rate from simulated to wall time
	// rate, when positive, is this load's own open-loop rate in requests per simulated
	// second (instead of Options.Rate).
	rate        float64
	concurrency int
	maxRequests int
	repeat      bool
	duration    time.Duration
	// path is the route (default chat); replay, when positive, sends the requests at
	// their arrival times divided by it.
	path   string
	replay float64
}

// measure runs one load and reports its progress.
func (h *harness) measure(ctx context.Context, l load) (*loadgen.Measurement, error) {
	cfg := loadgen.Config{
		URLs:        l.urls,
		Route:       l.route,
		Model:       h.opts.Model,
		Stream:      l.stream,
		Concurrency: l.concurrency,
		MaxRequests: l.maxRequests,
		Repeat:      l.repeat,
		Duration:    l.duration,
		Seed:        h.opts.Seed,
		Timeout:     h.opts.RequestTimeout,
		Path:        l.path,
		Replay:      l.replay,
	}
	switch {
	case l.rate > 0:
		cfg.Rate = l.rate * h.opts.Speedup
	case l.simulated && h.opts.Rate > 0:
		cfg.Rate = h.opts.Rate * h.opts.Speedup
	}
	if h.progress != nil {
		cfg.Progress = h.progress.reporter(l.label, l.duration)
	}
	m, err := loadgen.Measure(ctx, cfg, l.reqs)
	h.progress.finish()
	if err != nil {
		return m, fmt.Errorf("cannot measure %s: %w", l.label, err)
	}
	return m, nil
}

// arrivals describes how a simulated scenario's requests arrive.
func (h *harness) arrivals() string {
	mode := "streaming"
	if h.opts.NoStream {
		mode = "non-streaming"
	}
	if h.opts.Rate > 0 {
		return fmt.Sprintf("open-loop Poisson arrivals at %g requests per simulated second, %s", h.opts.Rate, mode)
	}
	return fmt.Sprintf("%d closed-loop clients, %s", h.concurrency(DefaultConcurrency), mode)
}

// concurrency is the closed-loop client count of a scenario.
func (h *harness) concurrency(def int) int {
	if h.opts.Concurrency > 0 {
		return h.opts.Concurrency
	}
	return def
}

// skipReason shortens a router build error to the part a reader needs.
func skipReason(err error) string {
	msg := err.Error()
	for _, p := range []string{errRouterBuild.Error() + ": ", "cannot create server: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	return msg
}

// oracles memoises the oracle of a workload's first n requests.
type oracles struct {
	h        *harness
	reqs     []workload.Request
	capacity int
	fleet    *workload.FleetConfig // the fleet oracle's engines, nil for the pooled oracle
	sim      *traceSim             // the engines simulated, with fleet: the trace's oracle
	mu       sync.Mutex
	byN      map[int]*workload.OracleResult
}

func (h *harness) newOracles(reqs []workload.Request, capacityTokens int) *oracles {
	return &oracles{h: h, reqs: reqs, capacity: capacityTokens, byN: make(map[int]*workload.OracleResult)}
}

// newFleetOracles memoises the oracle of a replayed workload on opts.Engines engines of
// opts.EngineCache tokens at opts.Costs: with simulate, the holder placement on the engines
// simulated as they run (traceSim), with the fleet oracle without queues
// (workload.FleetOracle) and the pooled upper bound beside it; without (engines the harness
// does not run, whose speed it does not know), the fleet oracle with the pooled bound.
func (h *harness) newFleetOracles(reqs []workload.Request, simulate bool) (*oracles, error) {
	o := &h.opts
	orc := h.newOracles(reqs, o.Engines*o.EngineCache)
	orc.fleet = &workload.FleetConfig{
		Engines: o.Engines, CacheTokens: o.EngineCache, PageSize: o.PageSize, TimeScale: o.TimeScale,
		PrefillOverhead: o.Costs.PrefillOverhead, PrefillPerToken: o.Costs.PrefillPerToken,
		DecodeStep: o.Costs.DecodeStep, DecodePerRequest: o.Costs.DecodePerRequest,
	}
	if !simulate {
		return orc, nil
	}
	sim, err := h.newTraceSim(reqs)
	if err != nil {
		return nil, err
	}
	orc.sim = sim
	return orc, nil
}

func (o *oracles) of(n int) (*workload.OracleResult, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if r, ok := o.byN[n]; ok {
		return r, nil
	}
	r, err := workload.Oracle(o.reqs[:n], o.h.tok, o.h.opts.PageSize, o.capacity)
	if err != nil {
		return nil, err
	}
	if o.fleet != nil {
		pooled := r
		if r, err = workload.FleetOracle(o.reqs[:n], o.h.tok, *o.fleet); err != nil {
			return nil, err
		}
		r.Pooled = &pooled
	}
	if o.sim != nil {
		out, err := o.sim.holder(n)
		if err != nil {
			return nil, err
		}
		noQueue := r
		r = o.sim.result(out)
		r.Pooled, noQueue.Pooled = noQueue.Pooled, nil
		r.NoQueue = &noQueue
	}
	o.byN[n] = &r
	return &r, nil
}

// longest returns the oracle of the most requests any row sent.
func (o *oracles) longest() *workload.OracleResult {
	o.mu.Lock()
	defer o.mu.Unlock()
	best := -1
	for n := range o.byN {
		best = max(best, n)
	}
	if best < 0 {
		return nil
	}
	return o.byN[best]
}

// progress prints one line per measured run: rewritten in place on a terminal; elsewhere
// every few seconds and once at the end of the run.
type progress struct {
	w       io.Writer
	tty     bool
	mu      sync.Mutex
	open    bool   // a terminal line is being rewritten
	pending string // the latest line not yet printed (not a terminal)
	last    time.Time
}

func newProgress(w io.Writer) *progress {
	if w == nil {
		return nil
	}
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

func (p *progress) reporter(label string, bound time.Duration) func(loadgen.Progress) {
	return func(pr loadgen.Progress) {
		line := fmt.Sprintf("%s: %d sent, %d done, %d errors, %.0fs", label, pr.Issued, pr.Done, pr.Errors, pr.Elapsed.Seconds())
		if bound > 0 {
			line += fmt.Sprintf(" of %.0fs", bound.Seconds())
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.tty {
			fmt.Fprintf(p.w, "\r\033[K%s", line)
			p.open = true
			return
		}
		p.pending = line
		if now := time.Now(); now.Sub(p.last) >= 5*time.Second {
			p.last = now
			fmt.Fprintln(p.w, line)
			p.pending = ""
		}
	}
}

// finish ends the current run's line.
func (p *progress) finish() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open {
		fmt.Fprintln(p.w)
		p.open = false
	}
	if p.pending != "" {
		fmt.Fprintln(p.w, p.pending)
		p.pending = ""
	}
	p.last = time.Time{}
}

// note prints a line outside of a measurement.
func (p *progress) note(format string, args ...any) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format+"\n", args...)
}

// replicasSetting is the replica count the report's settings show: only when the replicas
// scenario runs.
func (o *Options) replicasSetting() int {
	if slices.Contains(o.Scenarios, report.ScenarioReplicas) {
		return o.Replicas
	}
	return 0
}
