package mockengine

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"switchyard/kv/events"
	"switchyard/tokenizer"
)

// Role is the engine's serving role.
type Role string

// Engine roles.
const (
	RolePlain   Role = "plain"
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
)

// Flavor is the server the engine imitates on its HTTP side.
type Flavor string

// Flavours.
const (
	// FlavorSGLang serves SGLang's API: the OpenAI routes, /generate, /server_info,
	// /get_load, /v1/loads, the ZMQ load gauge, and /metrics with sglang: names.
	FlavorSGLang Flavor = "sglang"
	// FlavorVLLM serves what a vLLM OpenAI server serves and nothing SGLang-specific: the
	// OpenAI routes, /v1/models, /health, /tokenize, /detokenize, /version,
	// /reset_prefix_cache and /metrics with vllm: names (per DP rank, labelled engine); no
	// /server_info, no /get_load, no /v1/loads, no /generate, no load gauge.
	FlavorVLLM Flavor = "vllm"
)

// DefaultBootstrapPort is the engine default for a prefill engine's bootstrap server, used
// by a decode engine when a request's bootstrap_port is null.
const DefaultBootstrapPort = 8998

// Config configures one mock engine. The zero value of every field selects its default.
type Config struct {
	// Host is the address every listener binds. Default "127.0.0.1".
	Host string
	// Port is the HTTP port. Default 0: chosen by the OS.
	Port int
	// WorkerID names the engine in the X-Worker-Id header. Default "host:port".
	WorkerID string
	// Model is the served model name. Default "switchyard-mock".
	Model string
	// Role is plain, prefill or decode. Default plain.
	Role Role
	// Flavor is the HTTP API imitated: FlavorSGLang or FlavorVLLM. Default sglang.
	Flavor Flavor
	// BootstrapPort is a prefill engine's bootstrap server port. Default 0: chosen by the OS.
	BootstrapPort int
	// DefaultBootstrapPort is what a decode engine contacts when a request's bootstrap_port
	// is null. Default 8998.
	DefaultBootstrapPort int
	// PageSize is the KV page (block) size in tokens. Default 16.
	PageSize int
	// TransferBackend is the KV transfer backend of prefill/decode disaggregation that
	// /server_info reports (disaggregation_transfer_backend). A decode engine refuses the
	// KV of a prefill engine with another backend (the transfer fails with a 500), as
	// engines of two backends cannot exchange KV. Default "mooncake" (SGLang's).
	TransferBackend string
	// KVCacheDType is the KV cache data type /server_info reports (kv_cache_dtype).
	// Default "auto".
	KVCacheDType string
	// TPSize is the tensor-parallel size /server_info reports (tp_size); the simulation does
	// not depend on it. Default 1.
	TPSize int
	// CacheTokens is the KV capacity per DP rank, in tokens. Default 131072.
	CacheTokens int
	// ContextLength caps prompt plus output tokens of one request. Default 32768.
	ContextLength int
	// MaxRunning is max_running_requests per DP rank. Default 64.
	MaxRunning int
	// MaxPrefillTokens caps the uncached tokens of one prefill batch (one request is always
	// admitted). Default 16384.
	MaxPrefillTokens int
	// DPSize is the number of data-parallel ranks, each with its own scheduler, cache and
	// publishers. Default 1.
	DPSize int
	// Speedup divides every simulated duration: 10 runs ten times faster than real time.
	// Default 1.
	Speedup float64
	// ZeroCost answers at once: no simulated prefill or decode time, no scheduling queue.
	// Default false.
	ZeroCost bool
	// EventPerWrite sends every event of a streamed response as its own write: one HTTP
	// chunk per token, as SGLang and vLLM flush each token. Default false: the events
	// produced since the last write go out together (with ZeroCost, the whole answer in one).
	EventPerWrite bool
	// LoRA simulates LoRA adapter slots and loads. Default: off.
	LoRA LoRA
	// DecodeCanPrefill lets a decode engine also serve a request without bootstrap fields
	// alone, prefilling it itself against its own cache (a router's PD bypass). Default
	// false: a decode engine requires bootstrap fields, as SGLang's does.
	DecodeCanPrefill bool
	// Costs is the simulated cost model. Default (nil) DefaultCosts().
	Costs *Costs
	// DefaultMaxTokens is the output length of a chat request without max_tokens. Default 0:
	// a length between 16 and 128 derived from the prompt, finishing with "stop". (Without
	// a limit /v1/completions generates 16 tokens and /generate 128, as the real APIs do.)
	DefaultMaxTokens int
	// KVEvents configures the KV-event publishers.
	KVEvents KVEvents
	// LoadPublish configures the ZMQ load gauge.
	LoadPublish LoadPublish
	// PDTimeout bounds a decode engine's wait for its prefill partner. Default 30s.
	PDTimeout time.Duration
	// Faults are the initial fault switches. Default none.
	Faults Faults
	// Seed seeds the random failure rate and request IDs. Default 1.
	Seed uint64
	// Clock is the time source. Default the wall clock.
	Clock Clock
	// Logger receives the engine's logs. Default: discard.
	Logger *slog.Logger
	// Tokenizer tokenizes prompts and renders chat templates. Default: the tokenizer
	// TokenizerPath names, else tokenizer.NewSimple().
	Tokenizer Tokenizer
	// TokenizerPath is a Hugging Face tokenizer (a directory holding tokenizer.json and
	// tokenizer_config.json, or the tokenizer.json file) that Start loads when Tokenizer is
	// nil, so the engine tokenizes and applies the chat template as a router configured
	// with the same models.<name>.tokenizer.path does. /server_info reports it as
	// tokenizer_path. Default: none.
	TokenizerPath string
}

// Tokenizer is what the engine needs of a tokenizer: token IDs and a chat template.
type Tokenizer interface {
	tokenizer.Tokenizer
	tokenizer.ChatTemplater
}

var _ Tokenizer = (*tokenizer.Simple)(nil)

// Costs is the simulated cost model, in simulated time (divided by Config.Speedup).
type Costs struct {
	// PrefillOverhead is the fixed cost of one prefill batch. Default 5ms.
	PrefillOverhead time.Duration
	// PrefillPerToken is the cost of one uncached prompt token. Default 50µs (20k tokens/s).
	PrefillPerToken time.Duration
	// DecodeStep is the base cost of one decode step. Default 8ms.
	DecodeStep time.Duration
	// DecodePerRequest is the extra cost of one decode step per running request. Default 100µs.
	DecodePerRequest time.Duration
}

// DefaultCosts returns the default cost model, roughly an 8B model on one modern GPU.
func DefaultCosts() Costs {
	return Costs{
		PrefillOverhead:  5 * time.Millisecond,
		PrefillPerToken:  50 * time.Microsecond,
		DecodeStep:       8 * time.Millisecond,
		DecodePerRequest: 100 * time.Microsecond,
	}
}

// KVEvents configures the KV-event publishers: one ZMQ PUB socket per DP rank on
// PortBase+rank.
type KVEvents struct {
	// Disabled turns KV events off. Default false (on).
	Disabled bool
	// PortBase is rank 0's port. Default 0: chosen by the OS (consecutive for DP ranks).
	PortBase int
	// Topic is the first frame of every message. Default "".
	Topic string
	// Shape is the event encoding: events.ShapeArray (default) or events.ShapeMap.
	Shape events.Shape
	// Replay enables the replay ROUTER socket per rank on ReplayPortBase+rank. Default false.
	Replay bool
	// ReplayPortBase is rank 0's replay port. Default 0: chosen by the OS.
	ReplayPortBase int
	// BufferSteps is the number of batches kept for replay. Default 10000.
	BufferSteps int
	// HWM is the per-subscriber send queue, in messages. Default 10000.
	HWM int
	// Format is what the publisher looks like: KVFormatSGLang (the default of the sglang
	// flavour: block hashes the router reproduces, the topic above) or KVFormatVLLM (the
	// default of the vllm flavour), as a current vLLM
	// publisher: block hashes no router can reproduce (the router re-keys from token IDs),
	// topic "kv@<host>:<HTTP port+r>@<model>" per rank, 0 as a first block's parent, two
	// extra trailing elements in array-shaped BlockStored events, and replay replies with
	// a topic frame ending in ("", seq −1, "").
	Format string
	// Connect, when set, makes every rank's PUB dial this endpoint (a router's bound SUB,
	// "tcp://host:port"; rank r dials port+r, as vLLM offsets its endpoint) instead of
	// binding one, redialling when the connection ends. Default: bind.
	Connect string
}

// KV-event formats (KVEvents.Format).
const (
	KVFormatSGLang = "sglang"
	KVFormatVLLM   = "vllm"
)

// LoadPublish configures the ZMQ load gauge: one PUB socket per DP rank on PortBase+rank,
// topic "load".
type LoadPublish struct {
	// Disabled turns the gauge off. Default false (on).
	Disabled bool
	// PortBase is rank 0's port. Default 0: chosen by the OS (consecutive for DP ranks).
	PortBase int
	// Interval is the time between two gauges, on the engine's clock. Default 250ms.
	Interval time.Duration
	// Basic publishes the 6-element form instead of the extended 11-element one.
	// Default false (extended).
	Basic bool
}

// Faults are the fault-injection switches. The zero value injects nothing.
type Faults struct {
	// FailFirst fails the first N inference requests after the faults are set.
	FailFirst int
	// FailRate fails each inference request with this probability, 0..1.
	FailRate float64
	// FailStatus is the status of FailFirst and FailRate failures. Default 500.
	FailStatus int
	// Status, when set, answers every inference request with this status.
	Status int
	// Latency is added before every inference request is queued (engine clock, not scaled).
	Latency time.Duration
	// Drop closes the connection instead of delivering output token DropAfterTokens+1: a
	// stream is cut after DropAfterTokens token chunks, a non-streaming request gets no
	// response once more tokens than that exist. Shorter responses complete.
	Drop            bool
	DropAfterTokens int
	// Hang holds every inference request before its first token until the fault is cleared,
	// the request is aborted or the engine closes.
	Hang bool
	// Unhealthy makes /health and /health_generate answer 503 now; UnhealthyAfter does so
	// once that long has passed since the faults were set.
	Unhealthy      bool
	UnhealthyAfter time.Duration
	// StopEvents stops publishing KV events and load gauges now; StopEventsAfter does so
	// once that long has passed. Withheld KV batches still take a sequence number and stay
	// in the replay buffer, so a subscriber sees a gap when publishing resumes.
	StopEvents      bool
	StopEventsAfter time.Duration
	// RestartEvery restarts the engine (see Engine.Restart) at this interval.
	RestartEvery time.Duration
	// RestartDowntime keeps the engine unavailable (503 on every route but the mock
	// controls) for this long after each restart.
	RestartDowntime time.Duration
}

// withDefaults returns c with every unset field at its default.
func (c Config) withDefaults() Config {
	if c.Host == "" {
		c.Host = "127.0.0.1"
	}
	if c.Model == "" {
		c.Model = "switchyard-mock"
	}
	if c.Role == "" {
		c.Role = RolePlain
	}
	if c.Flavor == "" {
		c.Flavor = FlavorSGLang
	}
	if c.Flavor == FlavorVLLM {
		c.LoadPublish.Disabled = true // vLLM has no load gauge
		if c.KVEvents.Format == "" {
			c.KVEvents.Format = KVFormatVLLM // and publishes its KV events its own way
		}
	}
	if c.DefaultBootstrapPort == 0 {
		c.DefaultBootstrapPort = DefaultBootstrapPort
	}
	if c.PageSize == 0 {
		c.PageSize = 16
	}
	if c.TransferBackend == "" {
		c.TransferBackend = "mooncake"
	}
	if c.KVCacheDType == "" {
		c.KVCacheDType = "auto"
	}
	if c.TPSize == 0 {
		c.TPSize = 1
	}
	if c.CacheTokens == 0 {
		c.CacheTokens = 131072
	}
	if c.ContextLength == 0 {
		c.ContextLength = 32768
	}
	if c.MaxRunning == 0 {
		c.MaxRunning = 64
	}
	if c.MaxPrefillTokens == 0 {
		c.MaxPrefillTokens = 16384
	}
	if c.DPSize == 0 {
		c.DPSize = 1
	}
	if c.Speedup == 0 {
		c.Speedup = 1
	}
	if c.Costs == nil {
		d := DefaultCosts()
		c.Costs = &d
	}
	if c.KVEvents.BufferSteps == 0 {
		c.KVEvents.BufferSteps = 10000
	}
	if c.KVEvents.HWM == 0 {
		c.KVEvents.HWM = 10000
	}
	if c.LoadPublish.Interval == 0 {
		c.LoadPublish.Interval = 250 * time.Millisecond
	}
	if c.PDTimeout == 0 {
		c.PDTimeout = 30 * time.Second
	}
	if c.Faults.FailStatus == 0 {
		c.Faults.FailStatus = 500
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Clock == nil {
		c.Clock = RealClock()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Tokenizer == nil {
		c.Tokenizer = tokenizer.NewSimple()
	}
	return c
}

// ErrInvalidConfig is wrapped by every configuration error.
var ErrInvalidConfig = errors.New("invalid mock engine configuration")

// Validate reports every problem of c (after defaults) at once.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...)))
	}
	port := func(field string, p int) {
		if p < 0 || p > 65535 {
			bad(field, "port %d out of range 0..65535", p)
		}
	}
	port("port", c.Port)
	port("bootstrap_port", c.BootstrapPort)
	port("default_bootstrap_port", c.DefaultBootstrapPort)
	port("kv_events.port_base", c.KVEvents.PortBase)
	port("kv_events.replay_port_base", c.KVEvents.ReplayPortBase)
	port("load_publish.port_base", c.LoadPublish.PortBase)
	switch c.Role {
	case RolePlain, RolePrefill, RoleDecode:
	default:
		bad("role", "unknown role %q (want plain, prefill or decode)", c.Role)
	}
	switch c.Flavor {
	case FlavorSGLang, FlavorVLLM:
	default:
		bad("flavor", "unknown flavor %q (want sglang or vllm)", c.Flavor)
	}
	positive := func(field string, v int) {
		if v < 1 {
			bad(field, "%d must be at least 1", v)
		}
	}
	positive("page_size", c.PageSize)
	positive("tp_size", c.TPSize)
	positive("cache_tokens", c.CacheTokens)
	positive("context_length", c.ContextLength)
	positive("max_running", c.MaxRunning)
	positive("max_prefill_tokens", c.MaxPrefillTokens)
	positive("dp_size", c.DPSize)
	positive("kv_events.buffer_steps", c.KVEvents.BufferSteps)
	positive("kv_events.hwm", c.KVEvents.HWM)
	if c.DPSize > 256 {
		bad("dp_size", "%d exceeds 256", c.DPSize)
	}
	if c.CacheTokens < c.PageSize {
		bad("cache_tokens", "%d is smaller than one page (%d)", c.CacheTokens, c.PageSize)
	}
	if !(c.Speedup > 0) {
		bad("speedup", "%v must be positive", c.Speedup)
	}
	for name, d := range map[string]time.Duration{
		"costs.prefill_overhead": c.Costs.PrefillOverhead, "costs.prefill_per_token": c.Costs.PrefillPerToken,
		"costs.decode_step": c.Costs.DecodeStep, "costs.decode_per_request": c.Costs.DecodePerRequest,
	} {
		if d < 0 {
			bad(name, "%v is negative", d)
		}
	}
	if c.DefaultMaxTokens < 0 {
		bad("default_max_tokens", "%d is negative", c.DefaultMaxTokens)
	}
	if c.LoadPublish.Interval < 0 {
		bad("load_publish.interval", "%v is negative", c.LoadPublish.Interval)
	}
	if c.PDTimeout < 0 {
		bad("pd_timeout", "%v is negative", c.PDTimeout)
	}
	switch c.KVEvents.Format {
	case "", KVFormatSGLang, KVFormatVLLM:
	default:
		bad("kv_events.format", "unknown format %q (sglang or vllm)", c.KVEvents.Format)
	}
	if ep := c.KVEvents.Connect; ep != "" && !strings.HasPrefix(ep, "tcp://") {
		bad("kv_events.connect", "%q is not tcp://host:port", ep)
	}
	if c.KVEvents.Shape != events.ShapeArray && c.KVEvents.Shape != events.ShapeMap {
		bad("kv_events.shape", "unknown shape %d", c.KVEvents.Shape)
	}
	if c.LoRA.Slots < 0 || len(c.LoRA.Adapters) > c.LoRA.Slots {
		bad("lora.slots", "%d must be at least 0 and hold the %d adapters loaded at start", c.LoRA.Slots, len(c.LoRA.Adapters))
	}
	if c.LoRA.LoadTime < 0 {
		bad("lora.load_time", "%v is negative", c.LoRA.LoadTime)
	}
	if err := c.Faults.validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: faults: %w", ErrInvalidConfig, err))
	}
	return errors.Join(errs...)
}

// ErrInvalidFaults is wrapped by every fault-switch error.
var ErrInvalidFaults = errors.New("invalid fault switches")

func (f Faults) validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvalidFaults, fmt.Sprintf(format, args...)))
	}
	if f.FailFirst < 0 {
		bad("fail_first %d is negative", f.FailFirst)
	}
	if !(f.FailRate >= 0 && f.FailRate <= 1) {
		bad("fail_rate %v is outside 0..1", f.FailRate)
	}
	if f.FailStatus != 0 && (f.FailStatus < 400 || f.FailStatus > 599) {
		bad("fail_status %d is not an error status (400..599)", f.FailStatus)
	}
	if f.Status != 0 && (f.Status < 400 || f.Status > 599) {
		bad("status %d is not an error status (400..599)", f.Status)
	}
	if f.DropAfterTokens < 0 {
		bad("drop_after_tokens %d is negative", f.DropAfterTokens)
	}
	for name, d := range map[string]time.Duration{
		"latency": f.Latency, "unhealthy_after": f.UnhealthyAfter, "stop_events_after": f.StopEventsAfter,
		"restart_every": f.RestartEvery, "restart_downtime": f.RestartDowntime,
	} {
		if d < 0 {
			bad("%s %v is negative", name, d)
		}
	}
	return errors.Join(errs...)
}
