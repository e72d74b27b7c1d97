package mockengine

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"switchyard/kv/events"
)

// Offsets of the ports derived from the HTTP port when a ZMQ endpoint flag is "auto".
const (
	kvPortOffset     = 1000
	loadPortOffset   = 2000
	replayPortOffset = 3000
)

// commandFlags are the flags of `switchyard mockengine`.
type commandFlags struct {
	host, workerID, model, role, flavor            string
	port, count, bootstrapPort                     int
	pageSize, cacheTokens, contextLength           int
	maxRunning, maxPrefillTokens, dpSize           int
	speedup                                        float64
	zeroCost, decodeCanPrefill                     bool
	eventPerWrite                                  bool
	prefillOverhead, prefillPerToken               time.Duration
	decodeStep, decodePerRequest                   time.Duration
	defaultMaxTokens                               int
	kvEvents, kvTopic, kvShape, kvReplay           string
	kvFormat, kvConnect                            string
	kvBufferSteps                                  int
	loadPublish                                    string
	loadInterval                                   time.Duration
	loadBasic                                      bool
	pdTimeout                                      time.Duration
	seed                                           uint64
	logLevel                                       string
	failFirst, failStatus, status, dropAfterTokens int
	failRate                                       float64
	latency, unhealthyAfter, stopEventsAfter       time.Duration
	restartEvery, restartDowntime                  time.Duration
	hang                                           bool
	tokenizer                                      string
	transferBackend, kvCacheDType                  string
	tpSize                                         int
	loraSlots                                      int
	loraLoadTime                                   time.Duration
	loraAdapters                                   string
}

func newFlagSet(stderr io.Writer) (*flag.FlagSet, *commandFlags) {
	fs := flag.NewFlagSet("mockengine", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &commandFlags{}
	d := DefaultCosts()
	fs.StringVar(&f.host, "host", "127.0.0.1", "address every listener binds")
	fs.IntVar(&f.port, "port", 30000, "HTTP port of the first engine; engine i listens on port+i (0: chosen by the OS)")
	fs.IntVar(&f.count, "count", 1, "number of engines to run, on consecutive ports")
	fs.StringVar(&f.workerID, "worker-id", "", `X-Worker-Id of the engines, suffixed "-i" when count > 1; empty means "host:port"`)
	fs.StringVar(&f.model, "model", "switchyard-mock", "served model name")
	fs.StringVar(&f.tokenizer, "tokenizer", "", "Hugging Face tokenizer (directory with tokenizer.json and tokenizer_config.json, or the tokenizer.json file) used to tokenize prompts and apply the chat template, as the router does with the same models.<name>.tokenizer.path; empty: the built-in Simple tokenizer")
	fs.StringVar(&f.role, "role", "plain", "serving role: plain, prefill or decode")
	fs.StringVar(&f.flavor, "flavor", string(FlavorSGLang), "HTTP API imitated: sglang (OpenAI routes, /generate, /server_info, /get_load, /v1/loads, load gauge, /metrics with sglang: names) or vllm (OpenAI routes, /tokenize, /metrics with vllm: names; no /server_info, no /get_load, no load gauge)")
	fs.IntVar(&f.bootstrapPort, "bootstrap-port", DefaultBootstrapPort, "prefill engines: bootstrap server port of the first engine, +i for engine i; decode engines: the port used when a request's bootstrap_port is null")
	fs.IntVar(&f.pageSize, "page-size", 16, "KV page (block) size in tokens")
	fs.StringVar(&f.transferBackend, "transfer-backend", "mooncake", "KV transfer backend /server_info reports (disaggregation_transfer_backend); a decode engine refuses a prefill engine of another backend")
	fs.StringVar(&f.kvCacheDType, "kv-cache-dtype", "auto", "KV cache data type /server_info reports (kv_cache_dtype)")
	fs.IntVar(&f.tpSize, "tp-size", 1, "tensor-parallel size /server_info reports (tp_size)")
	fs.IntVar(&f.cacheTokens, "cache-tokens", 131072, "KV cache capacity per DP rank, in tokens")
	fs.IntVar(&f.contextLength, "context-length", 32768, "maximum prompt plus output tokens of one request")
	fs.IntVar(&f.maxRunning, "max-running", 64, "max_running_requests per DP rank; more requests wait in the queue")
	fs.IntVar(&f.maxPrefillTokens, "max-prefill-tokens", 16384, "uncached tokens per prefill batch")
	fs.IntVar(&f.dpSize, "dp-size", 1, "data-parallel ranks per engine, each with its own scheduler, cache and publishers")
	fs.Float64Var(&f.speedup, "speedup", 1, "divides every simulated duration (10: ten times faster than real time)")
	fs.IntVar(&f.loraSlots, "lora-slots", 0, "LoRA adapter slots per engine (0: no LoRA; any model name is the base model)")
	fs.DurationVar(&f.loraLoadTime, "lora-load-time", 0, "simulated time of one LoRA adapter load (divided by --speedup)")
	fs.StringVar(&f.loraAdapters, "lora-adapters", "", "LoRA adapters loaded at start, NAME=PATH,...")
	fs.BoolVar(&f.decodeCanPrefill, "decode-can-prefill", false, "a decode engine also serves requests without bootstrap fields alone, prefilling them itself")
	fs.BoolVar(&f.zeroCost, "zero-cost", false, "answer at once: no simulated prefill or decode time, no queue (for measuring the router itself)")
	fs.BoolVar(&f.eventPerWrite, "event-per-write", false, "streams: send every event as its own write (one HTTP chunk per token, as real engines flush)")
	fs.DurationVar(&f.prefillOverhead, "prefill-overhead", d.PrefillOverhead, "simulated fixed cost of one prefill batch")
	fs.DurationVar(&f.prefillPerToken, "prefill-per-token", d.PrefillPerToken, "simulated cost of one uncached prompt token")
	fs.DurationVar(&f.decodeStep, "decode-step", d.DecodeStep, "simulated base cost of one decode step")
	fs.DurationVar(&f.decodePerRequest, "decode-per-request", d.DecodePerRequest, "simulated extra cost of one decode step per running request")
	fs.IntVar(&f.defaultMaxTokens, "default-max-tokens", 0, "output tokens of a chat request without max_tokens (0: 16..128, derived from the prompt)")
	fs.StringVar(&f.kvEvents, "kv-events", "auto", "KV-event publisher port base: auto (HTTP port + 1000, + i×dp-size for engine i), off, PORT or tcp://HOST:PORT")
	fs.StringVar(&f.kvTopic, "kv-events-topic", "", "first frame of every KV-event message")
	fs.StringVar(&f.kvShape, "kv-events-shape", "array", "KV-event encoding: array (tagged arrays) or map (tagged maps)")
	fs.StringVar(&f.kvFormat, "kv-format", "", "KV-event publisher: sglang (router-reproducible hashes) or vllm (a current vLLM publisher: its own hashes, topic kv@host:port+rank@model, replay with a topic frame); default: the --flavor's")
	fs.StringVar(&f.kvConnect, "kv-connect", "", "dial this tcp://host:port (a router's kv.bind_endpoint; rank r dials port+r) instead of binding the KV-event PUB")
	fs.StringVar(&f.kvReplay, "kv-replay", "off", "KV-event replay ROUTER port base: off, auto (HTTP port + 3000) or PORT")
	fs.IntVar(&f.kvBufferSteps, "kv-buffer-steps", 10000, "KV-event batches kept for replay")
	fs.StringVar(&f.loadPublish, "load-publish", "auto", "ZMQ load-gauge publisher port base: auto (HTTP port + 2000, + i×dp-size for engine i), off, PORT or tcp://HOST:PORT")
	fs.DurationVar(&f.loadInterval, "load-publish-interval", 250*time.Millisecond, "time between two load gauges")
	fs.BoolVar(&f.loadBasic, "load-publish-basic", false, "publish the 6-element load gauge instead of the extended 11-element one")
	fs.DurationVar(&f.pdTimeout, "pd-timeout", 30*time.Second, "decode engines: how long to wait for the prefill partner's KV")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the random failure rate and request IDs")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.IntVar(&f.failFirst, "fault-fail-first", 0, "fail the first N inference requests")
	fs.Float64Var(&f.failRate, "fault-fail-rate", 0, "fail each inference request with this probability (0..1)")
	fs.IntVar(&f.failStatus, "fault-fail-status", 500, "HTTP status of --fault-fail-first and --fault-fail-rate failures")
	fs.IntVar(&f.status, "fault-status", 0, "answer every inference request with this error status (0: off)")
	fs.DurationVar(&f.latency, "fault-latency", 0, "latency added before every inference request (real time, not divided by --speedup)")
	fs.IntVar(&f.dropAfterTokens, "fault-drop-after-tokens", -1, "close the connection instead of sending output token N+1 (-1: off; a non-streaming request gets no response)")
	fs.BoolVar(&f.hang, "fault-hang", false, "hold every inference request before its first token")
	fs.DurationVar(&f.unhealthyAfter, "fault-unhealthy-after", 0, "answer 503 on /health and /health_generate after this long (0: off)")
	fs.DurationVar(&f.stopEventsAfter, "fault-stop-events-after", 0, "stop publishing KV events and load gauges after this long (0: off)")
	fs.DurationVar(&f.restartEvery, "fault-restart-every", 0, "restart (fail requests, drop every ZMQ peer connection, clear the cache, reset counters and sequence numbers) at this interval (0: off)")
	fs.DurationVar(&f.restartDowntime, "fault-restart-downtime", 0, "answer 503 for this long after each restart")
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "usage: switchyard mockengine [flags]\n\n"+
			"Runs one or more simulated SGLang (or, with --flavor vllm, vLLM) engines: the OpenAI and native HTTP APIs, a paged prefix\n"+
			"cache with LRU eviction, a scheduler with time-scaled prefill and decode costs, load reports,\n"+
			"KV events and load gauges over ZMQ, PD roles with a bootstrap handshake, and fault injection.\n"+
			"Runs until interrupted.\n\nFlags:\n")
		fs.VisitAll(func(fl *flag.Flag) {
			name, usage := flag.UnquoteUsage(fl)
			def := fl.DefValue
			if def == "" {
				def = `""`
			}
			if name != "" {
				name = " " + name
			}
			fmt.Fprintf(out, "  --%s%s\n    \t%s (default %s)\n", fl.Name, name, usage, def)
		})
	}
	return fs, f
}

// Command runs `switchyard mockengine` with args (without the subcommand name) until ctx
// is done. It prints one line per engine to stdout and logs to stderr. --help prints the
// flags and returns flag.ErrHelp.
func Command(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, f := newFlagSet(stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("cannot run mockengine: unexpected arguments %q", fs.Args())
	}
	cfg, err := f.config(stderr)
	if err != nil {
		return fmt.Errorf("cannot run mockengine: %w", err)
	}
	engines, err := StartMany(ctx, cfg, f.count)
	if err != nil {
		return fmt.Errorf("cannot run mockengine: %w", err)
	}
	for _, e := range engines {
		fmt.Fprintln(stdout, e.describe())
	}
	<-ctx.Done()
	var errs []error
	for _, e := range engines {
		errs = append(errs, e.Close())
	}
	return errors.Join(errs...)
}

// describe is the engine's one-line summary printed by Command.
func (e *Engine) describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "mockengine %s listening on %s flavor=%s role=%s model=%s dp_size=%d", e.workerID, e.url, e.cfg.Flavor, e.cfg.Role, e.cfg.Model, e.cfg.DPSize)
	if p := e.BootstrapPort(); p != 0 {
		fmt.Fprintf(&b, " bootstrap_port=%d", p)
	}
	if ep := e.KVEventsEndpoint(0); ep != "" {
		fmt.Fprintf(&b, " kv_events=%s", ep)
	}
	if ep := e.ReplayEndpoint(0); ep != "" {
		fmt.Fprintf(&b, " kv_replay=%s", ep)
	}
	if ep := e.LoadEndpoint(0); ep != "" {
		fmt.Fprintf(&b, " load=%s", ep)
	}
	return b.String()
}

// config turns the flags into the first engine's Config, checking every problem at once.
func (f *commandFlags) config(stderr io.Writer) (Config, error) {
	var errs []error
	bad := func(flagName, format string, args ...any) {
		errs = append(errs, fmt.Errorf("--%s: %s", flagName, fmt.Sprintf(format, args...)))
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		bad("log-level", "%v", err)
	}
	shape, err := events.ParseShape(f.kvShape)
	if err != nil {
		bad("kv-events-shape", "%v", err)
	}
	if f.count < 1 {
		bad("count", "%d must be at least 1", f.count)
	}
	adapters := map[string]string{}
	for _, item := range strings.Split(f.loraAdapters, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		name, path, ok := strings.Cut(item, "=")
		if !ok || name == "" || path == "" {
			bad("lora-adapters", "%q is not NAME=PATH", item)
			continue
		}
		adapters[name] = path
	}
	cfg := Config{
		Host: f.host, Port: f.port, WorkerID: f.workerID, Model: f.model, Role: Role(f.role), Flavor: Flavor(f.flavor),
		PageSize: f.pageSize, CacheTokens: f.cacheTokens, ContextLength: f.contextLength,
		TransferBackend: f.transferBackend, KVCacheDType: f.kvCacheDType, TPSize: f.tpSize,
		MaxRunning: f.maxRunning, MaxPrefillTokens: f.maxPrefillTokens, DPSize: f.dpSize,
		Speedup: f.speedup, ZeroCost: f.zeroCost, EventPerWrite: f.eventPerWrite, DecodeCanPrefill: f.decodeCanPrefill, DefaultMaxTokens: f.defaultMaxTokens,
		LoRA: LoRA{Slots: f.loraSlots, LoadTime: f.loraLoadTime, Adapters: adapters},
		Costs: &Costs{
			PrefillOverhead: f.prefillOverhead, PrefillPerToken: f.prefillPerToken,
			DecodeStep: f.decodeStep, DecodePerRequest: f.decodePerRequest,
		},
		KVEvents:      KVEvents{Topic: f.kvTopic, Shape: shape, BufferSteps: f.kvBufferSteps, Format: f.kvFormat, Connect: f.kvConnect},
		LoadPublish:   LoadPublish{Interval: f.loadInterval, Basic: f.loadBasic},
		PDTimeout:     f.pdTimeout,
		Seed:          f.seed,
		TokenizerPath: f.tokenizer,
		Logger:        slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})),
		Faults: Faults{
			FailFirst: f.failFirst, FailRate: f.failRate, FailStatus: f.failStatus, Status: f.status,
			Latency: f.latency, Drop: f.dropAfterTokens >= 0, DropAfterTokens: max(f.dropAfterTokens, 0),
			Hang: f.hang, UnhealthyAfter: f.unhealthyAfter, StopEventsAfter: f.stopEventsAfter,
			RestartEvery: f.restartEvery, RestartDowntime: f.restartDowntime,
		},
	}
	switch cfg.Role {
	case RolePrefill:
		cfg.BootstrapPort = f.bootstrapPort
		if f.port == 0 {
			cfg.BootstrapPort = 0
		}
	case RoleDecode:
		cfg.DefaultBootstrapPort = f.bootstrapPort
	}
	stride := max(f.dpSize, 1)
	var events, load, replay int
	var off bool
	if events, off, err = endpointPort(f.kvEvents, f.port, kvPortOffset); err != nil {
		bad("kv-events", "%v", err)
	}
	cfg.KVEvents.Disabled = off
	cfg.KVEvents.PortBase = events
	if load, off, err = endpointPort(f.loadPublish, f.port, loadPortOffset); err != nil {
		bad("load-publish", "%v", err)
	}
	cfg.LoadPublish.Disabled = off || cfg.Flavor == FlavorVLLM // vLLM has no load gauge
	cfg.LoadPublish.PortBase = load
	if replay, off, err = endpointPort(f.kvReplay, f.port, replayPortOffset); err != nil {
		bad("kv-replay", "%v", err)
	}
	cfg.KVEvents.Replay = !off && !cfg.KVEvents.Disabled
	cfg.KVEvents.ReplayPortBase = replay

	// The port ranges of all engines must not overlap or leave the port space.
	type span struct {
		flag       string
		base, size int
	}
	spans := []span{{"port", f.port, f.count}}
	if !cfg.KVEvents.Disabled {
		spans = append(spans, span{"kv-events", events, f.count * stride})
	}
	if cfg.KVEvents.Replay {
		spans = append(spans, span{"kv-replay", replay, f.count * stride})
	}
	if !cfg.LoadPublish.Disabled {
		spans = append(spans, span{"load-publish", load, f.count * stride})
	}
	if cfg.Role == RolePrefill {
		spans = append(spans, span{"bootstrap-port", cfg.BootstrapPort, f.count})
	}
	for i, a := range spans {
		if a.base == 0 {
			continue
		}
		if a.base+a.size-1 > 65535 {
			bad(a.flag, "ports %d..%d exceed 65535", a.base, a.base+a.size-1)
		}
		for _, b := range spans[i+1:] {
			if b.base != 0 && a.base < b.base+b.size && b.base < a.base+a.size {
				bad(a.flag, "ports %d..%d overlap --%s ports %d..%d", a.base, a.base+a.size-1, b.flag, b.base, b.base+b.size-1)
			}
		}
	}
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		// Loaded once here rather than by every engine StartMany starts.
		if err := cfg.loadTokenizer(); err != nil {
			bad("tokenizer", "%v", err)
		}
	}
	return cfg, errors.Join(errs...)
}

// endpointPort reads a ZMQ endpoint flag: "auto" (httpPort + offset, or 0 when httpPort is
// 0), "off", a port, or "tcp://HOST:PORT".
func endpointPort(v string, httpPort, offset int) (port int, off bool, err error) {
	switch v {
	case "off", "":
		return 0, true, nil
	case "auto":
		if httpPort == 0 {
			return 0, false, nil
		}
		return httpPort + offset, false, nil
	}
	s := v
	if rest, ok := strings.CutPrefix(v, "tcp://"); ok {
		_, p, err := net.SplitHostPort(rest)
		if err != nil {
			return 0, false, fmt.Errorf("cannot parse endpoint %q: %w", v, err)
		}
		s = p
	}
	port, err = strconv.Atoi(s)
	if err != nil || port < 0 || port > 65535 {
		return 0, false, fmt.Errorf("cannot parse %q: want auto, off, a port or tcp://HOST:PORT", v)
	}
	return port, false, nil
}
