package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"switchyard/bench/harness"
	"switchyard/bench/report"
	"switchyard/bench/workload"
)

// benchFlags are the flags of switchyard bench.
type benchFlags struct {
	scenario, policies, pdPolicies, workloads, mailboxSizes, longClasses string
	flavors, engineSpeeds                                                string
	jsonPath, chartDir, routerBinary                                     string
	quiet, verbose, noStream                                             bool
	opts                                                                 harness.Options
	// set holds the flags given on the command line: the trace scenario has its own
	// defaults for --engine-cache and --duration.
	set map[string]bool
}

func newBenchFlagSet(stderr io.Writer) (*flag.FlagSet, *benchFlags) {
	f := &benchFlags{}
	o := &f.opts
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.scenario, "scenario", report.ScenarioRouting, "scenarios to run, comma-separated: "+strings.Join(harness.Scenarios(), ", ")+", trace, instructions, or all (every one but trace and instructions)")
	fs.StringVar(&o.Target, "target", "", "measure the router at this URL instead of starting engines and a router (routing and trace scenarios only; one row, wall time)")
	fs.StringVar(&o.Model, "model", harness.DefaultModel, "model name served by the engines and requested")

	fs.IntVar(&o.Engines, "engines", harness.DefaultEngines, "plain mock engines (routing, overhead, buckets, mailbox)")
	fs.IntVar(&o.Prefill, "prefill", harness.DefaultPrefillEngines, "prefill engines of the pd scenario")
	fs.IntVar(&o.Decode, "decode", harness.DefaultDecodeEngines, "decode engines of the pd scenario")
	fs.IntVar(&o.DPRanks, "dp-ranks", 2, "routing scenario: also measure engines of this many data-parallel ranks, ranks chosen by the engines then by the router (0 or 1: skip)")
	fs.IntVar(&o.FairnessLimit, "fairness-limit", 8, "routing scenario: also measure a bulk and an interactive tenant behind a router-wide limit of this many requests, the queue first come first served then fair between tenants (0: skip)")
	fs.IntVar(&o.LoRAAdapters, "lora-adapters", 8, "routing scenario: also measure requests naming this many LoRA adapters, preloaded on every engine then loaded on demand into half as many slots, and with at least two per engine the adapters changing half-way in slots for half of them, without and with eviction (0: skip)")
	fs.IntVar(&o.PDBypassTokens, "pd-bypass-tokens", 256, "pd scenario: also measure a short-prompt mix with the PD bypass off and on below this many uncached tokens (0: skip)")
	fs.Float64Var(&o.Speedup, "speedup", harness.DefaultSpeedup, "engine simulation speedup: simulated time runs this many times faster than wall time; routing, pd and buckets report simulated time")
	fs.IntVar(&o.EngineCache, "engine-cache", harness.DefaultEngineCache, "KV cache capacity (and context length) of each engine, in tokens; trace default "+strconv.Itoa(harness.DefaultTraceEngineCache))
	fs.IntVar(&o.MaxRunning, "max-running", 64, "max_running_requests of each engine")
	fs.StringVar(&f.flavors, "flavor", "sglang", "engine flavours, comma-separated, each running every scenario: sglang (SGLang API, load from /v1/loads) or vllm (vLLM API, load scraped from /metrics, workers declared flavor vllm)")
	fs.StringVar(&f.engineSpeeds, "engine-speeds", "", "relative speed of each plain engine, comma-separated, one per engine (e.g. 1,1,1,0.2: the last five times slower); empty: all 1")

	fs.DurationVar(&o.Duration, "duration", harness.DefaultDuration, "wall-time bound of each measured row (each policy, variant or mailbox size); trace default: none (the replay ends the row)")
	fs.IntVar(&o.Requests, "requests", 0, "request bound of each row; 0: the whole workload (routing, pd, buckets, trace), none (overhead), --mailbox-requests (mailbox); trace: its first N requests; instructions: N2, 0: 5000 (N1 is a fifth; streams a fifth as many)")
	fs.IntVar(&o.Concurrency, "concurrency", 0, "closed-loop clients; 0: 16 (overhead 32, mailbox 512, instructions 8)")
	fs.Float64Var(&o.Rate, "rate", 0, "open-loop Poisson arrivals at this many requests per simulated second instead of a closed loop (routing, pd, buckets)")
	fs.BoolVar(&f.noStream, "no-stream", false, "send non-streaming requests (time to first token is then the whole response)")
	fs.Uint64Var(&o.Seed, "seed", harness.DefaultSeed, "seed of the workloads, the arrivals and the router's policies")
	fs.DurationVar(&o.RequestTimeout, "timeout", harness.DefaultRequestTimeout, "bound on one request")

	fs.StringVar(&f.policies, "policies", names(harness.DefaultPolicies()), "routing scenario policies, in order; sticky:FALLBACK picks sticky's fallback, cache_aware:approximate the router's own prefix tree")
	fs.StringVar(&f.pdPolicies, "pd-policies", names(harness.DefaultPDPolicies()), "pd scenario prefill-group policies (decode uses power_of_two)")
	fs.StringVar(&f.workloads, "workloads", strings.Join(harness.DefaultWorkloads(), ","), "routing scenario workloads: "+strings.Join(workload.Names(), ", "))
	fs.StringVar(&f.mailboxSizes, "mailbox-sizes", ints(harness.DefaultMailboxSizes()), "mailbox scenario actors.mailbox sizes (bucket and group)")
	fs.IntVar(&o.MailboxRequests, "mailbox-requests", harness.DefaultMailboxRequests, "requests in each mailbox row's burst")
	fs.IntVar(&o.Replicas, "replicas", harness.DefaultReplicas, "replicas scenario: router processes forming one cluster")
	fs.StringVar(&f.routerBinary, "router-binary", "", "replicas, overhead and instructions scenarios: the switchyard binary each router process runs (default: this one)")
	fs.DurationVar(&o.SLOTTFT, "slo-ttft", harness.DefaultSLOTTFT, "slo scenario: the foreground requests' time-to-first-token target, simulated time")
	fs.Float64Var(&o.SLORate, "slo-rate", harness.DefaultSLORate, "slo scenario: foreground open-loop arrivals, requests per simulated second")
	fs.Float64Var(&o.SLOBackgroundRate, "slo-background-rate", harness.DefaultSLOBackgroundRate, "slo scenario: background arrivals per engine of the loaded bucket, requests per simulated second")
	fs.IntVar(&o.SLOBackgroundPromptLen, "slo-background-prompt-len", harness.DefaultSLOBackgroundPromptLen, "slo scenario: background prompt length, tokens")

	sp, mt, lc, zr := &o.Workload.SharedPrefix, &o.Workload.MultiTurn, &o.Workload.LongContext, &o.Workload.ZeroReuse
	fs.IntVar(&sp.Groups, "groups", 32, "shared_prefix: number of shared system prompts")
	fs.IntVar(&sp.PromptsPerGroup, "prompts-per-group", 96, "shared_prefix: questions per system prompt")
	fs.IntVar(&sp.SystemPromptLen, "system-prompt-len", 2048, "shared_prefix: system prompt length, tokens")
	fs.IntVar(&sp.QuestionLen, "question-len", 128, "shared_prefix: question length, tokens")
	fs.IntVar(&sp.OutputLen, "output-len", 32, "shared_prefix: output length, tokens")
	fs.IntVar(&mt.Users, "users", 48, "multi_turn: conversations")
	fs.IntVar(&mt.Turns, "turns", 10, "multi_turn: turns per conversation")
	fs.IntVar(&mt.SystemPromptLen, "turn-system-len", 256, "multi_turn: each user's system prompt length, tokens")
	fs.IntVar(&mt.QuestionLen, "turn-question-len", 128, "multi_turn: each turn's question length, tokens")
	fs.IntVar(&mt.OutputLen, "turn-output-len", 64, "multi_turn: each turn's answer length, tokens")
	fs.IntVar(&lc.Requests, "long-requests", 600, "long_context: requests")
	fs.StringVar(&f.longClasses, "long-classes", classes(workload.DefaultLengthClasses()), "long_context: length classes NAME:MIN-MAX:WEIGHT, comma-separated")
	fs.IntVar(&lc.OutputLen, "long-output-len", 32, "long_context: output length, tokens")
	fs.IntVar(&zr.Requests, "zero-requests", 1000, "zero_reuse (and the slo scenario's foreground): requests")
	fs.IntVar(&zr.PromptLen, "zero-prompt-len", 1024, "zero_reuse: prompt length, tokens")
	fs.IntVar(&zr.OutputLen, "zero-output-len", 32, "zero_reuse: output length, tokens")

	fs.StringVar(&o.Trace, "trace", harness.DefaultTrace, "trace scenario: the request trace to replay, Mooncake JSON Lines (timestamp ms, input_length, output_length, hash_ids)")
	fs.IntVar(&o.TraceBlockSize, "trace-block-size", harness.DefaultTraceBlockSize, "trace scenario: tokens per hash ID of the trace")
	fs.BoolVar(&o.TraceChat, "trace-chat", false, "trace scenario: send prompts as chat text of the built-in tokenizer instead of token IDs on /generate (vLLM flavour: /v1/completions)")
	fs.IntVar(&o.TraceMaxOutput, "trace-max-output", 0, "trace scenario: cap each request's output length, tokens; 0: as recorded")
	fs.BoolVar(&o.TraceOracleRow, "trace-oracle-row", false, "trace scenario: add the 'oracle placement' row, each request sent straight to the engine the simulated oracle placed it on")
	fs.Float64Var(&o.TimeScale, "time-scale", 1, "trace scenario: divide the recorded arrival times by this (2: twice the request rate)")

	fs.StringVar(&f.jsonPath, "json", "", "also write the report as JSON to this file")
	fs.StringVar(&f.chartDir, "chart", "", "also write one SVG chart per scenario into this directory")
	fs.BoolVar(&f.quiet, "quiet", false, "no progress line on stderr")
	fs.BoolVar(&f.verbose, "verbose", false, "log the engines' and the router's warnings to stderr")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: switchyard bench [flags]

Starts mock engines and a router in this process (or targets a running router), drives a
seeded workload through them and prints one table per scenario; --json and --chart write
the report for machines and an SVG chart per scenario. Scenarios:
  overhead  the router vs the same zero-cost engines reached directly, through a bare
            fasthttp proxy and through nginx (when installed), interleaved in one run:
            small requests and 64-event streams; requests/s, added latency, CPU seconds
            per 1,000 requests; router, bare proxy and nginx each its own process
  routing   each workload of --workloads under each policy of --policies, with the oracle
            (the best hit rate any placement reaches for the workload and the cache size)
  pd        the prefill group's policy on a PD bucket (shared_prefix workload)
  buckets   the long-context mix on one pool against length buckets, per length class
  mailbox   an overload burst at each actors.mailbox size: accepted req/s, 429 rate, p99
  trace     a request trace (--trace) replayed open-loop at its recorded times under each
            policy of --policies, with the oracle; run it by name (all leaves it out)
  replicas  multi_turn through 1 router, then --replicas router processes as one cluster
            (each turn to a random one), then the same with one stopped (SIGTERM) and one
            killed (SIGKILL) mid-run: session agreement, hit rate vs 1 router, TTFT,
            router CPU per 1,000 requests per process
  slo       two buckets over the same lengths, one also fed background load; requests
            with a TTFT target under capacity and slo bucket order: SLO attainment,
            goodput, TTFT percentiles and the router's TTFT estimate error
  instructions
            user-space instructions per request (valgrind cachegrind, Linux; needs
            valgrind) of the router, the bare proxy and the event-loop proxy, each its own
            process run twice (a fifth of --requests, then --requests): small requests
            and 64-event streams; deterministic where CPU time is noisy; run it by name

flags:
`)
		fs.PrintDefaults()
	}
	return fs, f
}

func names(ps []harness.PolicySpec) string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return strings.Join(out, ",")
}

func ints(v []int) string {
	out := make([]string, len(v))
	for i, n := range v {
		out[i] = strconv.Itoa(n)
	}
	return strings.Join(out, ",")
}

func classes(cs []workload.LengthClass) string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = fmt.Sprintf("%s:%d-%d:%g", c.Name, c.Min, c.Max, c.Weight)
	}
	return strings.Join(out, ",")
}

// errBenchFlags is wrapped by flag values that do not parse.
var errBenchFlags = errors.New("invalid flag")

// options completes the harness options from the list flags.
func (f *benchFlags) options(stderr io.Writer) (harness.Options, error) {
	o := f.opts
	var errs []error
	if f.scenario == "all" {
		o.Scenarios = harness.Scenarios()
	} else {
		o.Scenarios = splitList(f.scenario)
	}
	var err error
	if o.Policies, err = harness.ParsePolicies(f.policies); err != nil {
		errs = append(errs, err)
	}
	if o.PDPolicies, err = harness.ParsePolicies(f.pdPolicies); err != nil {
		errs = append(errs, err)
	}
	o.Workloads = splitList(f.workloads)
	if slices.Contains(o.Scenarios, report.ScenarioReplicas) || slices.Contains(o.Scenarios, report.ScenarioOverhead) ||
		slices.Contains(o.Scenarios, report.ScenarioInstructions) {
		bin := f.routerBinary
		if bin == "" {
			if bin, err = os.Executable(); err != nil {
				errs = append(errs, fmt.Errorf("%w: cannot find this binary for the router processes (pass --router-binary): %w", errBenchFlags, err))
			}
		}
		o.ReplicaCommand = []string{bin, "serve"}
		// The bare proxy is this binary's, whatever router is measured.
		self, err := os.Executable()
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: cannot find this binary for the bare proxy process: %w", errBenchFlags, err))
		}
		o.BareCommand = []string{self, "bare-proxy"}
		if runtime.GOOS == "linux" {
			o.EvloopCommand = []string{self, "evloop-proxy"}
		}
	}
	o.MailboxSizes = nil
	for _, s := range splitList(f.mailboxSizes) {
		n, err := strconv.Atoi(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: --mailbox-sizes: %q is not a number", errBenchFlags, s))
			continue
		}
		o.MailboxSizes = append(o.MailboxSizes, n)
	}
	for _, s := range splitList(f.longClasses) {
		c, err := parseClass(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		o.Workload.LongContext.Classes = append(o.Workload.LongContext.Classes, c)
	}
	o.Flavors = splitList(f.flavors)
	for _, v := range splitList(f.engineSpeeds) {
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: --engine-speeds: %q is not a number", errBenchFlags, v))
			continue
		}
		o.EngineSpeeds = append(o.EngineSpeeds, x)
	}
	o.NoStream = f.noStream
	// Left at their defaults, the cache and the row bound are the scenarios' own.
	if !f.set["engine-cache"] {
		o.EngineCache = 0
	}
	if !f.set["duration"] {
		o.Duration = 0
	}
	if !f.quiet {
		o.Progress = stderr
	}
	if f.verbose {
		o.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return o, errors.Join(append(errs, o.Validate())...)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// parseClass parses NAME:MIN-MAX:WEIGHT.
func parseClass(s string) (workload.LengthClass, error) {
	bad := fmt.Errorf("%w: --long-classes: %q is not NAME:MIN-MAX:WEIGHT", errBenchFlags, s)
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return workload.LengthClass{}, bad
	}
	lo, hi, ok := strings.Cut(parts[1], "-")
	if !ok {
		return workload.LengthClass{}, bad
	}
	minLen, err1 := strconv.Atoi(lo)
	maxLen, err2 := strconv.Atoi(hi)
	w, err3 := strconv.ParseFloat(parts[2], 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return workload.LengthClass{}, bad
	}
	return workload.LengthClass{Name: parts[0], Min: minLen, Max: maxLen, Weight: w}, nil
}

// runBench is the bench subcommand.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, f := newBenchFlagSet(stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errBenchFlags, fs.Arg(0))
	}
	f.set = map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	opts, err := f.options(stderr)
	if err != nil {
		printProblems(stderr, err)
		return errReported
	}
	rep, runErr := harness.Run(ctx, opts)
	if rep == nil {
		return runErr
	}
	return errors.Join(runErr, writeReport(rep, stdout, f.jsonPath, f.chartDir))
}

// runBenchDemo is issue 5's demo: it starts mock engines and the router in this process,
// runs a short routing comparison on the shared-prefix workload (every policy, one after the
// other, on fresh engines), prints the table and writes the chart.
func runBenchDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	duration := fs.Duration("duration", 30*time.Second, "total length of the comparison, split evenly over the policies")
	chartDir := fs.String("chart", filepath.Join(os.TempDir(), "switchyard-demo"), "directory the SVG chart is written to")
	jsonPath := fs.String("json", "", "also write the report as JSON to this file")
	engines := fs.Int("engines", harness.DefaultEngines, "mock engines")
	speedup := fs.Float64("speedup", harness.DefaultSpeedup, "engine simulation speedup (figures are in simulated time)")
	seed := fs.Uint64("seed", harness.DefaultSeed, "seed of the workload and the policies")
	quiet := fs.Bool("quiet", false, "no progress line on stderr")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: switchyard demo [flags]

Starts mock engines and the router on 127.0.0.1, sends the shared-prefix workload through
the router under each routing policy in turn (fresh engines for each), prints the table and
writes the chart. switchyard bench runs the full scenarios.

flags:
`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *duration <= 0 {
		return fmt.Errorf("%w: --duration %v must be positive", errBenchFlags, *duration)
	}
	policies := harness.DefaultPolicies()
	opts := harness.Options{
		Scenarios: []string{report.ScenarioRouting},
		Workloads: []string{workload.NameSharedPrefix},
		Engines:   *engines,
		Speedup:   *speedup,
		Seed:      *seed,
		Policies:  policies,
		Duration:  *duration / time.Duration(len(policies)),
	}
	if !*quiet {
		opts.Progress = stderr
	}
	if err := opts.Validate(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "switchyard demo: %d mock engines and the router on 127.0.0.1; the shared-prefix workload under %d policies, up to %v each\n\n",
		*engines, len(policies), opts.Duration.Round(100*time.Millisecond))
	rep, runErr := harness.Run(ctx, opts)
	if rep == nil {
		return runErr
	}
	return errors.Join(runErr, writeReport(rep, stdout, *jsonPath, *chartDir))
}

// writeReport prints every scenario's table and writes the JSON and the charts when asked.
func writeReport(rep *report.Report, stdout io.Writer, jsonPath, chartDir string) error {
	for _, sc := range rep.Scenarios {
		if err := report.WriteTable(stdout, sc); err != nil {
			return err
		}
	}
	var errs []error
	if jsonPath != "" {
		errs = append(errs, writeFile(jsonPath, func(w io.Writer) error { return report.WriteJSON(w, rep) }))
		fmt.Fprintf(stdout, "report: %s\n", jsonPath)
	}
	if chartDir != "" {
		if err := os.MkdirAll(chartDir, 0o755); err != nil {
			return errors.Join(append(errs, fmt.Errorf("cannot create chart directory: %w", err))...)
		}
		for _, sc := range rep.Scenarios {
			path := filepath.Join(chartDir, sc.FileStem()+".svg")
			errs = append(errs, writeFile(path, func(w io.Writer) error { return report.WriteSVG(w, sc) }))
			fmt.Fprintf(stdout, "chart: %s\n", path)
		}
	}
	return errors.Join(errs...)
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("cannot create %s: %w", path, err)
	}
	werr := write(f)
	if err := f.Close(); err != nil && werr == nil {
		werr = fmt.Errorf("cannot write %s: %w", path, err)
	}
	return werr
}
