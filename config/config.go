package config

import "time"

// Role is the serving role of an engine.
type Role string

// Engine roles.
const (
	RolePlain   Role = "plain"
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
)

// Policy type names, as written in configuration.
const (
	PolicyRoundRobin     = "round_robin"
	PolicyRandom         = "random"
	PolicyPowerOfTwo     = "power_of_two"
	PolicyLoadBased      = "load_based"
	PolicySessionAware   = "session_aware"
	PolicySticky         = "sticky"
	PolicyCacheAware     = "cache_aware"
	PolicyConsistentHash = "consistent_hash"
	PolicyPrefixHash     = "prefix_hash"
)

// Config is the router's whole configuration. Load fills it from defaults, a file, the
// environment and flags; Validate checks it.
type Config struct {
	// Server holds listener, auth and timeout settings.
	Server Server `koanf:"server" json:"server"`
	// Workers lists the engines known at startup. Default: none.
	Workers []Worker `koanf:"workers" json:"workers"`
	// Models maps a model name to its routing. Default: none.
	Models map[string]Model `koanf:"models" json:"models"`
	// Actors sizes the actor system.
	Actors Actors `koanf:"actors" json:"actors"`
	// Load configures engine-reported load ingestion.
	Load LoadSettings `koanf:"load" json:"load"`
	// KV configures KV-event subscriptions and the prefix index.
	KV KV `koanf:"kv" json:"kv"`
	// Affinity configures session and routing-key bindings.
	Affinity Affinity `koanf:"affinity" json:"affinity"`
	// CacheAware tunes every group whose policy is cache_aware.
	CacheAware CacheAware `koanf:"cache_aware" json:"cache_aware"`
	// DPDispatch makes the router choose the data-parallel rank of engines with dp_size > 1.
	DPDispatch DPDispatch `koanf:"dp_dispatch" json:"dp_dispatch"`
	// LoRA configures LoRA-adapter routing.
	LoRA LoRA `koanf:"lora" json:"lora"`
	// Hashing tunes every group whose policy is consistent_hash or prefix_hash.
	Hashing Hashing `koanf:"hashing" json:"hashing"`
	// Health configures active health checks and circuit breakers.
	Health Health `koanf:"health" json:"health"`
	// Retry configures dispatch retries (same bucket first, failed engines excluded).
	Retry Retry `koanf:"retry" json:"retry"`
	// Upstream configures the router's connections to engines.
	Upstream Upstream `koanf:"upstream" json:"upstream"`
	// Discovery configures the sources of workers beyond workers[] and the admin API.
	Discovery Discovery `koanf:"discovery" json:"discovery"`
	// Abort configures how engines are stopped on requests whose client left or timed out.
	Abort Abort `koanf:"abort" json:"abort"`
	// Tracing configures OpenTelemetry tracing of requests. Off by default.
	Tracing Tracing `koanf:"tracing" json:"tracing"`
	// DefaultPolicy is the policy of every group that sets no policy and whose model sets
	// no default for the group's stage. Default round_robin with default admission (no caps).
	// The --policy flag sets its type.
	DefaultPolicy Policy `koanf:"default_policy" json:"default_policy"`
	// Log configures the router's own logging.
	Log Log `koanf:"log" json:"log"`
	// Cluster joins router replicas into one cluster. Off by default.
	Cluster Cluster `koanf:"cluster" json:"cluster"`
}

// Log configures the router's own logging.
type Log struct {
	// Level is the minimum level logged: debug, info, warn or error. Default info.
	Level string `koanf:"level" json:"level"`
}

// Server holds listener, auth and timeout settings.
type Server struct {
	// Host is the listen address. Default "127.0.0.1".
	Host string `koanf:"host" json:"host"`
	// Port is the listen port, 0..65535; 0 lets the OS choose. Default 8080.
	Port int `koanf:"port" json:"port"`
	// APIKey, when set, is the bearer key required on the data plane. Default: none.
	APIKey string `koanf:"api_key" json:"api_key"`
	// AdminAPIKey, when set, is the bearer key required on the admin API (/workers); without
	// it the admin API takes api_key, and with neither see admin_open. Default: none.
	AdminAPIKey string `koanf:"admin_api_key" json:"admin_api_key"`
	// MaxBodyBytes caps a request body, also after decompression. Default 32 MiB.
	MaxBodyBytes int64 `koanf:"max_body_bytes" json:"max_body_bytes" unit:"bytes"`
	// RequestTimeout bounds one request end to end. Default 600s.
	RequestTimeout time.Duration `koanf:"request_timeout" json:"request_timeout"`
	// StreamIdleTimeout bounds the gap between two chunks of a stream. Default 60s.
	StreamIdleTimeout time.Duration `koanf:"stream_idle_timeout" json:"stream_idle_timeout"`
	// DrainTimeout bounds graceful shutdown. Default 30s.
	DrainTimeout time.Duration `koanf:"drain_timeout" json:"drain_timeout"`
	// MaxConcurrentRequests caps the inference requests served at once, router wide
	// (streams count until they end); 0 means no limit. Default 0.
	MaxConcurrentRequests int `koanf:"max_concurrent_requests" json:"max_concurrent_requests" unit:"requests"`
	// QueueSize is how many requests over a concurrency limit wait for a slot, served by
	// priority, then tenants in fair shares, then arrival; a full queue answers 429, and 0
	// answers 429 at once. Default 100.
	QueueSize int `koanf:"queue_size" json:"queue_size" unit:"requests"`
	// QueueTimeout is the longest a request waits in the queue before it is answered 408.
	// Default 60s.
	QueueTimeout time.Duration `koanf:"queue_timeout" json:"queue_timeout"`
	// RateLimit limits the inference request rate, router wide and per API key.
	RateLimit RateLimit `koanf:"rate_limit" json:"rate_limit"`
	// WriteTimeout bounds one write to a client: a client that stops reading for this long
	// loses its connection, and its stream ends (the engine request is cancelled, the
	// in-flight slot released). A stream's writes are also bounded by its request_timeout
	// (plus 2 s to deliver the timeout's error event). Default 30s.
	WriteTimeout time.Duration `koanf:"write_timeout" json:"write_timeout"`
	// MaxConnections caps the open client connections. At the cap a new connection takes
	// the place of one that is idle (opened without a request yet, or between keep-alive
	// requests), else it is answered 503 and closed. 0 means half the process's open-file
	// limit at start-up, leaving the rest for engine connections. Default 0 (auto).
	MaxConnections int `koanf:"max_connections" json:"max_connections" unit:"connections"`
	// MaxConnectionsPerIP caps the open connections from one client IP address; more are
	// answered 503 and closed. 0 disables the cap (the right choice behind a load balancer,
	// whose connections all share its address). Default 0.
	MaxConnectionsPerIP int `koanf:"max_connections_per_ip" json:"max_connections_per_ip" unit:"connections"`
	// MaxHeaderBytes caps the request line and headers of one request, in bytes; more is
	// answered 431. Each connection reading a request holds a buffer of this size.
	// Default 8192.
	MaxHeaderBytes int `koanf:"max_header_bytes" json:"max_header_bytes" unit:"bytes"`
	// MaxBodyBytesInFlight is the router-wide budget of request-body memory held at once:
	// received bodies, their decompressed form and the decompressors' working memory. A
	// request waits up to one second for room; a chunked or compressed body is admitted with
	// room for its expected size and takes more only when it is free. Either way, no room:
	// 503 body_budget_exhausted. At least max_body_bytes. Default 128 MiB.
	MaxBodyBytesInFlight int64 `koanf:"max_body_bytes_in_flight" json:"max_body_bytes_in_flight" unit:"bytes"`
	// AdminOpen serves the admin API (/workers) without any key on a router that listens
	// beyond loopback. Without it, and with neither admin_api_key nor api_key set, such a
	// router refuses the admin routes (403 admin_disabled). Default false.
	AdminOpen bool `koanf:"admin_open" json:"admin_open"`
	// MetricsAPIKey, when set, is the bearer key required on GET /metrics. Default: none
	// (/metrics is open).
	MetricsAPIKey string `koanf:"metrics_api_key" json:"metrics_api_key"`
	// MetricsHost is the listen address of the separate metrics listener (metrics_port;
	// sgl-router's --prometheus-host). Default "127.0.0.1".
	MetricsHost string `koanf:"metrics_host" json:"metrics_host"`
	// MetricsPort, when set, serves GET /metrics on a listener of its own at
	// metrics_host:metrics_port, 0..65535 (0 lets the OS choose), apart from the data
	// plane, whose /metrics then answers 404 (sgl-router's --prometheus-port). It must
	// differ from port. Default: none (/metrics is served on the data plane).
	MetricsPort *int `koanf:"metrics_port" json:"metrics_port"`
	// PriorityHeader carries a request's priority when its body has no "priority" field; a
	// higher priority leaves the queues first. Empty reads the body alone. Default
	// "x-priority".
	PriorityHeader string `koanf:"priority_header" json:"priority_header"`
	// MaxPriority bounds priorities: a request's priority must be an integer in
	// [-max_priority, max_priority], else it is refused with 400. 0..1000. Default 10.
	MaxPriority int `koanf:"max_priority" json:"max_priority" unit:"levels"`
	// TenantHeader carries a request's tenant, whose requests share the queues fairly with
	// other tenants' within a priority; a request without it counts as the tenant of its
	// API key (requests without either share one tenant). Empty uses the API key alone.
	// Default: none.
	TenantHeader string `koanf:"tenant_header" json:"tenant_header"`
	// TenantWeights gives tenants named by tenant_header a weight, at least 1: a tenant of
	// weight 3 gets three queue slots to a weight-1 tenant's one while both wait. Named
	// tenants get their own metric label; every other tenant weighs 1 and is labelled
	// "other". Default: none.
	TenantWeights map[string]int `koanf:"tenant_weights" json:"tenant_weights" unit:"relative share"`
}

// Worker is one engine known from configuration.
type Worker struct {
	// ID is the stable, unique worker ID. Required.
	ID string `koanf:"id" json:"id"`
	// URL is the engine's base URL, http or https with a host, e.g. "http://127.0.0.1:30001".
	// Required.
	URL string `koanf:"url" json:"url"`
	// Model is the served model name; a model's workers are all plain or all
	// prefill/decode. Required.
	Model string `koanf:"model" json:"model"`
	// Role is plain, prefill or decode. Default plain.
	Role Role `koanf:"role" json:"role"`
	// BootstrapPort is a prefill engine's PD bootstrap port, 1..65535. Default: none (null
	// on the wire).
	BootstrapPort *int `koanf:"bootstrap_port" json:"bootstrap_port"`
	// DPSize is the engine's data-parallel size, 1..4096. Default 1 (or introspected).
	DPSize int `koanf:"dp_size" json:"dp_size" unit:"ranks"`
	// CanPrefill declares a decode engine that can also serve a request alone, prefill
	// included (SGLang decode servers cannot; a mock engine with --decode-can-prefill can):
	// the target of its PD buckets' bypass (groups.pd.bypass_below_tokens). Only valid on
	// a decode worker. Default false.
	CanPrefill bool `koanf:"can_prefill" json:"can_prefill"`
	// KVEvents, when set, is the engine's KV-event publisher endpoint (tcp://HOST:PORT or
	// ipc://PATH), overriding introspection. Default: introspected.
	KVEvents string `koanf:"kv_events" json:"kv_events"`
	// LoadPublish, when set, is the engine's ZMQ load-gauge endpoint (tcp://HOST:PORT or
	// ipc://PATH). Default: introspected.
	LoadPublish string `koanf:"load_publish" json:"load_publish"`
	// Flavor is the engine's kind: auto, sglang or vllm (empty is auto). vllm means the
	// engine has no introspection (/server_info) and no native load route: the router asks
	// it for neither, takes model, role and DP size from this entry, and reads its load from
	// the Prometheus page at metrics_path. sglang reads load from /v1/loads or /get_load (or
	// the ZMQ gauge). auto introspects and detects the load route once. Default auto.
	Flavor string `koanf:"flavor" json:"flavor"`
	// MetricsPath is the path of the engine's Prometheus text page (empty is the default).
	// Default "/metrics".
	MetricsPath string `koanf:"metrics_path" json:"metrics_path"`
	// KVReplay, when set, is the engine's KV-event replay endpoint ("tcp://host:port",
	// rank r on port+r), for engines that do not advertise one (vLLM: no /server_info);
	// used on kv_events subscriptions and on the bound SUB (kv.bind_endpoint) alike.
	// Default: introspected, else none (a sequence gap clears the rank).
	KVReplay string `koanf:"kv_replay" json:"kv_replay"`
	// KVBlockSize is the engine's KV block size in tokens, for engines that do not
	// advertise it. Default 0: introspected, else kv.block_size (events carrying a block
	// size override either).
	KVBlockSize int `koanf:"kv_block_size" json:"kv_block_size" unit:"tokens"`
	// KVHashScheme says how the engine's block hashes relate to the router's: "auto"
	// (verified from the first block without a parent; a mismatch switches to re-keying),
	// "sglang" (the router's own: used as they are) or "rekey" (not reproducible, as
	// vLLM's: blocks are keyed by router hashes recomputed from their token IDs).
	// Default auto (rekey for a worker of flavor vllm).
	KVHashScheme string `koanf:"kv_hash_scheme" json:"kv_hash_scheme"`
	// TLS overrides upstream.tls for this worker, key by key: each key set here replaces
	// the global one (cert_file and key_file as a pair). Only for an https:// url. Default:
	// none (upstream.tls).
	TLS *UpstreamTLS `koanf:"tls" json:"tls"`
	// Labels are the worker's labels, name to value, that a prefill/decode bucket's
	// groups.pd.compatibility compares (for example zone: us-east-1a). A configured label
	// wins over the same label introspected from /server_info (transfer_backend,
	// page_size, kv_cache_dtype, tp_size). At most 64; names are letters, digits, '_', '-',
	// '.' or '/' (at most 63 bytes), values at most 256 bytes. Default: none (the introspected
	// labels only).
	Labels map[string]string `koanf:"labels" json:"labels"`
}

// Model is one model's routing: default policies per stage and its buckets.
type Model struct {
	// Policies are the default policies per stage, used by groups that set none.
	Policies StagePolicies `koanf:"policies" json:"policies"`
	// Buckets are the model's length buckets. At least one is required.
	Buckets []Bucket `koanf:"buckets" json:"buckets"`
	// Tokenizer configures exact token counting for this model. Default: body-size estimate.
	Tokenizer Tokenizer `koanf:"tokenizer" json:"tokenizer"`
	// MaxConcurrentRequests caps this model's inference requests served at once, on top of
	// server.max_concurrent_requests; 0 means no per-model limit. Default 0.
	MaxConcurrentRequests int `koanf:"max_concurrent_requests" json:"max_concurrent_requests" unit:"requests"`
	// QueueSize is how many of this model's requests over its limit wait. Default
	// server.queue_size (when absent).
	QueueSize *int `koanf:"queue_size" json:"queue_size" unit:"requests"`
	// QueueTimeout is the longest one of this model's requests waits for its slot; 0 takes
	// server.queue_timeout. Default 0.
	QueueTimeout time.Duration `koanf:"queue_timeout" json:"queue_timeout"`
	// SLO holds the model's default latency targets.
	SLO SLO `koanf:"slo" json:"slo"`
	// BucketOrder is how the model's compatible buckets are ordered for a request:
	// capacity (ascending capacity, then rank, then ID) or slo (for a request with a
	// latency target: the buckets expected to meet it first, in capacity order, then the
	// others by least expected violation; a request without a target keeps capacity
	// order). Default capacity.
	BucketOrder string `koanf:"bucket_order" json:"bucket_order"`
	// LoRAAdapters are this model's LoRA adapters the router knows by name, each with the
	// path an engine loads it from (lora.auto_load): a request whose model names one is
	// routed by this model's buckets to an engine holding the adapter. Adapters the engines
	// list in /v1/models are routable without being named here. Needs lora.enabled.
	// Default: none.
	LoRAAdapters map[string]string `koanf:"lora_adapters" json:"lora_adapters"`
}

// SLO are a model's default latency targets, for the requests that do not carry their own
// in the x-slo-ttft-ms and x-slo-tpot-ms headers. A target decides the bucket order under
// bucket_order slo and is counted as met or missed in the SLO metrics.
type SLO struct {
	// TTFTMs is the time-to-first-token target, in milliseconds, more than 0 and at most
	// 10,000,000. Default: none.
	TTFTMs *float64 `koanf:"ttft_ms" json:"ttft_ms" unit:"milliseconds"`
	// TPOTMs is the time-per-output-token target (the mean gap between output tokens after
	// the first), in milliseconds, more than 0 and at most 10,000,000. Default: none.
	TPOTMs *float64 `koanf:"tpot_ms" json:"tpot_ms" unit:"milliseconds"`
}

// ModelPath returns the configuration path of model name, as FieldError paths spell it:
// "models.llama", or `models["org/Model-1.5"]` for a name that is not a plain key.
func ModelPath(name string) string { return joinKey("models", name) }

// Tokenizer locates a model's tokenizer files and says how the router uses them.
type Tokenizer struct {
	// Path is a directory holding tokenizer.json (and tokenizer_config.json with the chat
	// template), or the tokenizer.json file itself. It is loaded at start-up; a file that
	// cannot be loaded stops the start. Default: none (the body-size estimate).
	Path string `koanf:"path" json:"path"`
	// CacheBytes bounds the tokenizer's prefix cache, which spares re-encoding the history
	// a multi-turn conversation resends, in bytes of text plus token IDs; 0 disables it.
	// Requires path. Default 64 MiB (when absent).
	CacheBytes *int64 `koanf:"cache_bytes" json:"cache_bytes" unit:"bytes"`
	// ForwardInputIDs makes the router send a /generate request that carries text to the
	// engine with the token IDs it computed (input_ids) in place of the text, so the engine
	// cannot tokenize differently. It applies to /generate only: the OpenAI routes
	// (/v1/chat/completions, /v1/completions) are forwarded as received. Requires path.
	// Default false.
	ForwardInputIDs bool `koanf:"forward_input_ids" json:"forward_input_ids"`
	// OnError says how a request is answered when the tokenizer cannot count it exactly
	// (the chat template refuses or fails to render the conversation, or the tokenizer has
	// no chat template): "estimate" routes it by the body-size estimate, "reject" answers it
	// with an error. Either way the failure is counted in
	// switchyard_tokenizer_errors_total{model,stage} and logged once per cause. Empty picks
	// by policy: reject for a model that some group routes with cache_aware, where an
	// estimate has no token IDs and silently defeats the cache; estimate otherwise.
	// Requires path. Default: empty (by policy).
	OnError string `koanf:"on_error" json:"on_error"`
}

// Values of Tokenizer.OnError.
const (
	TokenizerOnErrorEstimate = "estimate"
	TokenizerOnErrorReject   = "reject"
)

// StagePolicies are a model's default policies per stage. A nil entry defaults to
// the configuration's DefaultPolicy (round_robin with default admission unless set).
type StagePolicies struct {
	// Plain is the default policy of the model's plain groups. Default: none.
	Plain *Policy `koanf:"plain" json:"plain"`
	// Prefill is the default policy of the model's prefill groups. Default: none.
	Prefill *Policy `koanf:"prefill" json:"prefill"`
	// Decode is the default policy of the model's decode groups; cache_aware is not
	// allowed. Default: none.
	Decode *Policy `koanf:"decode" json:"decode"`
}

// Bucket is a token-length bucket holding one plain group or a PD pair of groups.
type Bucket struct {
	// ID is unique within the model and non-empty. Required.
	ID string `koanf:"id" json:"id"`
	// Rank breaks capacity ties, lower first. Default 0.
	Rank int `koanf:"rank" json:"rank"`
	// Limits is the inclusive input-token range.
	Limits Limits `koanf:"limits" json:"limits"`
	// MaxContextTokens caps input plus requested output, in tokens; positive and at least
	// limits.min. Default: unbounded.
	MaxContextTokens *int64 `koanf:"max_context_tokens" json:"max_context_tokens" unit:"tokens"`
	// Groups holds exactly one of plain or pd.
	Groups Groups `koanf:"groups" json:"groups"`
}

// Limits is an inclusive input-token range.
type Limits struct {
	// Min is the smallest input length, in tokens, at least 0. Default 0.
	Min int64 `koanf:"min" json:"min" unit:"tokens"`
	// Max is the largest input length, in tokens; positive and at least min. Default:
	// unbounded.
	Max *int64 `koanf:"max" json:"max" unit:"tokens"`
}

// Groups is either a plain group or a prefill/decode pair: exactly one is set.
type Groups struct {
	// Plain is the bucket's plain engine group; a bucket has exactly one of plain or pd.
	// Default: none.
	Plain *Group `koanf:"plain" json:"plain"`
	// PD is the bucket's prefill/decode pair of groups. Default: none.
	PD *PDGroups `koanf:"pd" json:"pd"`
}

// PDGroups is a prefill group and a decode group; both are required.
type PDGroups struct {
	// Prefill is the prefill group. Required.
	Prefill *Group `koanf:"prefill" json:"prefill"`
	// Decode is the decode group. Required.
	Decode *Group `koanf:"decode" json:"decode"`
	// Compatibility lists the worker labels a prefill engine and a decode engine must share
	// to form a pair (for example [transfer_backend, page_size, zone]): the decode engine
	// is picked among those whose every listed label equals the chosen prefill engine's (a
	// label a worker lacks counts as empty). Default: none (any prefill and decode engine
	// of the model pair).
	Compatibility []string `koanf:"compatibility" json:"compatibility"`
	// BypassBelowTokens turns on the PD bypass: a request whose uncached prefill (its input
	// less what the prefix index says the picked decode engine holds; the whole input when
	// unknown) is below this many tokens goes to that decode engine alone, when the engine
	// declares can_prefill. The decode engine is still the decode group's pick; with the
	// bypass on, the decode group picks first. 0 turns it off. At least 0. Default 0.
	BypassBelowTokens int64 `koanf:"bypass_below_tokens" json:"bypass_below_tokens" unit:"tokens"`
}

// Group is an engine group: its membership and its policy.
type Group struct {
	// WorkerIDs lists members by worker ID, each a known worker of the group's model and
	// role; an empty list means none. Default: absent, every healthy engine of the model
	// and role.
	WorkerIDs *[]string `koanf:"worker_ids" json:"worker_ids"`
	// Policy is the group's policy. Default: the model's default for the group's stage
	// (models.<name>.policies), else default_policy (see Config.EffectivePolicy).
	Policy *Policy `koanf:"policy" json:"policy"`
}

// Policy names a policy type with its admission caps and policy settings.
type Policy struct {
	// Type is the policy: round_robin, random, power_of_two, load_based, session_aware,
	// sticky, cache_aware, consistent_hash or prefix_hash. Required.
	Type string `koanf:"type" json:"type"`
	// Admission holds the per-engine caps. Default: every cap unset (admit all).
	Admission Admission `koanf:"admission" json:"admission"`
	// Fallback is sticky's policy for new or missing keys: round_robin, random,
	// power_of_two or load_based. Default round_robin. Only valid on sticky.
	Fallback string `koanf:"fallback" json:"fallback"`
}

// Admission holds the five optional per-engine caps. A nil cap is not checked; a cap
// admits while the engine's metric is below it. A set cap must be at least 1.
type Admission struct {
	// MaxRunningRequests caps reported running requests. Default: unset.
	MaxRunningRequests *int64 `koanf:"max_running_requests" json:"max_running_requests" unit:"requests"`
	// MaxWaitingRequests caps reported waiting requests. Default: unset.
	MaxWaitingRequests *int64 `koanf:"max_waiting_requests" json:"max_waiting_requests" unit:"requests"`
	// MaxKVTokens caps reported used KV tokens, in tokens. Default: unset.
	MaxKVTokens *int64 `koanf:"max_kv_tokens" json:"max_kv_tokens" unit:"tokens"`
	// MaxPendingPrefillTokens caps reported waiting uncached tokens, in tokens. Default: unset.
	MaxPendingPrefillTokens *int64 `koanf:"max_pending_prefill_tokens" json:"max_pending_prefill_tokens" unit:"tokens"`
	// MaxInflightRequests caps router-local in-flight requests. Default: unset. The
	// --max-in-flight flag sets it on every policy.
	MaxInflightRequests *int64 `koanf:"max_inflight_requests" json:"max_inflight_requests" unit:"requests"`
}

// Actors sizes the actor system.
type Actors struct {
	// Mailbox holds the bounded mailbox size per actor kind.
	Mailbox Mailbox `koanf:"mailbox" json:"mailbox"`
	// PickTimeout bounds the wait for a bucket actor's reply. Default 1s.
	PickTimeout time.Duration `koanf:"pick_timeout" json:"pick_timeout"`
}

// Mailbox sizes, in messages. A full mailbox rejects at once.
type Mailbox struct {
	// Bucket is each bucket actor's mailbox size, at least 1. Default 1024.
	Bucket int `koanf:"bucket" json:"bucket" unit:"messages"`
	// Group is each group actor's mailbox size, at least 1. Default 1024.
	Group int `koanf:"group" json:"group" unit:"messages"`
	// Telemetry is each telemetry actor's mailbox size, at least 1. Default 256.
	Telemetry int `koanf:"telemetry" json:"telemetry" unit:"messages"`
	// IndexShard is each prefix-index shard actor's mailbox size, at least 1. Default 4096.
	IndexShard int `koanf:"index_shard" json:"index_shard" unit:"messages"`
	// Affinity is each affinity scope actor's mailbox size, at least 1. Default 1024.
	Affinity int `koanf:"affinity" json:"affinity" unit:"messages"`
}

// LoadSettings configures engine-reported load ingestion (the "load" section). It is not
// named Load because the package's Load function builds the whole configuration.
type LoadSettings struct {
	// Freshness is how long a rank's report stays usable. Default 5s.
	Freshness time.Duration `koanf:"freshness" json:"freshness"`
	// PollInterval is the HTTP poll period of /v1/loads (or /get_load, or the Prometheus
	// page), shorter than freshness. Default 1s.
	PollInterval time.Duration `koanf:"poll_interval" json:"poll_interval"`
	// Source is "http" (/v1/loads, else /get_load), "prometheus" (every worker's metrics
	// page), "zmq" (the load gauge) or "auto": the ZMQ gauge when advertised, else HTTP,
	// detecting once per engine whether it has /v1/loads, /get_load or only a Prometheus
	// page; a vllm-flavoured worker is always scraped. Default auto.
	Source string `koanf:"source" json:"source"`
	// ScrapeTimeout bounds one HTTP load request (poll or scrape); the poll interval bounds
	// it too. Default 2s.
	ScrapeTimeout time.Duration `koanf:"scrape_timeout" json:"scrape_timeout"`
	// ScrapeMaxBytes bounds one HTTP load response body, 4096..1073741824; a larger answer
	// is a failed poll. Default 4194304 (4 MiB).
	ScrapeMaxBytes int `koanf:"scrape_max_bytes" json:"scrape_max_bytes" unit:"bytes"`
	// GuardMaxAge is the age after which the janitor releases a leaked in-flight guard.
	// Default 1h.
	GuardMaxAge time.Duration `koanf:"guard_max_age" json:"guard_max_age"`
}

// KV configures KV-event subscriptions and the prefix index.
type KV struct {
	// Enabled subscribes to engines' KV events when a cache_aware policy uses the local
	// index. Default true.
	Enabled bool `koanf:"enabled" json:"enabled"`
	// BindEndpoint, when set, is a SUB endpoint the router binds for engines that connect
	// to it, tcp://HOST:PORT (e.g. "tcp://127.0.0.1:5557"). Default: none.
	BindEndpoint string `koanf:"bind_endpoint" json:"bind_endpoint"`
	// BlockSize is the block size, in tokens, when an engine does not advertise one. Default 16.
	BlockSize int `koanf:"block_size" json:"block_size" unit:"tokens"`
	// Shards is the number of prefix-index shard actors; 0 means one per core
	// (GOMAXPROCS), which measured fastest: more shards than cores only add hand-offs.
	// Default 0.
	Shards int `koanf:"shards" json:"shards" unit:"actors"`
	// MaxBlocks bounds the resident blocks of the index; LRU beyond. Default 4,000,000.
	MaxBlocks int `koanf:"max_blocks" json:"max_blocks" unit:"blocks"`
	// ReconnectBackoff is the first reconnect delay, doubled up to 30s. Default 500ms.
	ReconnectBackoff time.Duration `koanf:"reconnect_backoff" json:"reconnect_backoff"`
	// HashCacheChunks is how many prompt chunks (64 blocks, about 560 bytes each) keep their
	// block hashes for later lookups; 0 turns the cache off. Default 16384 (about 9 MiB).
	HashCacheChunks int `koanf:"hash_cache_chunks" json:"hash_cache_chunks" unit:"chunks of 64 blocks"`
	// BlockKey is what the index keys blocks by: "engine" (the engines' SHA-256 block
	// hashes, SGLang's, reproduced from the prompt at lookup; engines whose hashes differ are
	// re-keyed from their token IDs) or "router" (the router's own chained 64-bit keys,
	// computed from every BlockStored's token IDs and from the prompt: a cheaper lookup, for
	// more ingest work and a map entry per held block; hash_cache_chunks is not used).
	// Default "engine".
	BlockKey string `koanf:"block_key" json:"block_key"`
	// LookupSplitBlocks, when not 0, splits a lookup of at least this many blocks across two
	// goroutines with block_key router: one more goroutine per index matches the back part
	// of the prompt while the lookup's own goroutine matches the front. It lowers the tail
	// of long lookups when a core is to spare, and raises their median when none is; at
	// least 1024 when set. Not used with block_key engine, nor on one core. Default 0 (off).
	LookupSplitBlocks int `koanf:"lookup_split_blocks" json:"lookup_split_blocks" unit:"blocks"`
	// MaxMessageBytes bounds one ZeroMQ message (its frames together) read from any
	// engine or peer: KV events, replays, the bound SUB and the load gauge. A peer that
	// announces more is disconnected and counted in switchyard_zmq_peer_drops_total.
	// Default 16777216 (16 MiB), in bytes; at least 4096.
	MaxMessageBytes int64 `koanf:"max_message_bytes" json:"max_message_bytes" unit:"bytes"`
}

// Affinity configures session and routing-key bindings.
type Affinity struct {
	// SessionHeader carries the session key. Default "x-session-id".
	SessionHeader string `koanf:"session_header" json:"session_header"`
	// RoutingKeyHeader carries the sticky routing key. Default "x-sgl-routing-key".
	RoutingKeyHeader string `koanf:"routing_key_header" json:"routing_key_header"`
	// IdleTimeout expires a binding unused this long. Default 600s.
	IdleTimeout time.Duration `koanf:"idle_timeout" json:"idle_timeout"`
	// SweepInterval is the expiry sweep period. Default 60s.
	SweepInterval time.Duration `koanf:"sweep_interval" json:"sweep_interval"`
	// MaxBindings bounds the bindings per scope; LRU beyond. Default 100,000.
	MaxBindings int `koanf:"max_bindings" json:"max_bindings" unit:"bindings per scope"`
	// PrefixRebind binds a session or routing key that has no live binding (new, expired,
	// evicted, or lost with a crashed cluster replica's partition) to the engine holding the
	// longest cached prefix of the request, at least cache_aware.min_matched_tokens, within
	// admission, before the policy's fallback chooses. It builds the KV-event prefix index
	// for models with a session_aware or sticky group (plain or prefill). Default false.
	PrefixRebind bool `koanf:"prefix_rebind" json:"prefix_rebind"`
}

// LoRA configures routing of requests that name a LoRA adapter served on a base model: the
// router learns which engines hold which adapters (each engine's /v1/models, where an
// adapter lists its base model as parent), sends an adapter's requests to engines holding
// it, and, with auto_load, loads it onto an engine with a free slot when none does.
type LoRA struct {
	// Enabled turns adapter routing on: the router asks every engine for its adapters.
	// Default false.
	Enabled bool `koanf:"enabled" json:"enabled"`
	// AutoLoad loads a requested adapter that no candidate engine holds onto one of those
	// with the most free slots (the group's policy picks it) through the engine's API (vLLM
	// /v1/load_lora_adapter, SGLang /load_lora_adapter), from the path in the model's
	// lora_adapters. Default false.
	AutoLoad bool `koanf:"auto_load" json:"auto_load"`
	// Evict, with auto_load, makes room on an engine whose every slot is full: the least
	// recently used of its adapters that no request uses and that the router can load again
	// (one of the model's lora_adapters) is unloaded through the engine's API (vLLM
	// /v1/unload_lora_adapter, SGLang /unload_lora_adapter) before the requested one is
	// loaded. Off, a request for an adapter no engine holds is refused (503) while every
	// slot is full. Default true.
	Evict bool `koanf:"evict" json:"evict"`
	// SlotsPerEngine is how many adapters an engine holds at once when it does not say
	// (SGLang's server info max_loaded_loras or max_loras_per_batch); 0 sets no bound.
	// At least 0. Default 8.
	SlotsPerEngine int `koanf:"slots_per_engine" json:"slots_per_engine" unit:"adapters"`
	// RefreshInterval is how often the router asks each engine which adapters it holds.
	// Default 10s.
	RefreshInterval time.Duration `koanf:"refresh_interval" json:"refresh_interval"`
	// LoadTimeout bounds one adapter load, how long the engine picked for it keeps the slot
	// reserved for the load, and a request's waits for a slot (max_slot_waiters). Default
	// 60s.
	LoadTimeout time.Duration `koanf:"load_timeout" json:"load_timeout"`
	// ReplicateAbove, with auto_load, loads an adapter that engines hold already onto one
	// more engine when the adapter has more than this many requests in flight on its
	// holders together and every holder more than this many requests in flight beyond that
	// engine: the least busy one with a free slot to spare (a replica never takes an
	// engine's last free slot, and never evicts). That engine joins the adapter's candidates
	// and, when the policy picks it, the router loads the adapter there before it forwards
	// the request; one such load of an adapter at a time. 0 turns replication off. At least
	// 0. Default 4.
	ReplicateAbove int64 `koanf:"replicate_above" json:"replicate_above" unit:"requests"`
	// MaxSlotWaiters, with auto_load and evict, is how many requests at once may wait for an
	// adapter slot when every slot that could take their adapter is taken by an adapter in
	// use (or a load under way): such a request waits until a slot may have freed on an
	// engine of its model (a request using an adapter ends, a load ends, a pick that was
	// not dispatched gives back its reserved slot, a load's reservation lapses, the
	// engine's adapter list drops one or its facts bring more slots), then is selected again and evicts the now idle adapter, for at most
	// load_timeout (and server.request_timeout). A request beyond this many, or past that
	// bound, is refused (503). 0 refuses every such request at once. At least 0. Default 64.
	MaxSlotWaiters int `koanf:"max_slot_waiters" json:"max_slot_waiters" unit:"requests"`
}

// DPDispatch configures data-parallel rank dispatch: the router picks the rank inside an
// engine of dp_size > 1 by the ranks' reported load and sends it with the request
// (data_parallel_rank; for a PD pair the decode request also carries prefill_dp_rank).
type DPDispatch struct {
	// Enabled turns rank dispatch on for every group; off, the engine's own balancer picks
	// the rank. Default false.
	Enabled bool `koanf:"enabled" json:"enabled"`
	// MaxWaitingPerRank caps each rank's waiting requests (reported, plus those the router
	// sent since the report): a rank at the cap is passed over, and an engine whose every
	// rank is at it rejects the request (admission, max_waiting_per_rank); 0 sets no cap.
	// At least 0. Default 0.
	MaxWaitingPerRank int64 `koanf:"max_waiting_per_rank" json:"max_waiting_per_rank" unit:"requests"`
	// PreferPrefix makes a cache_aware group send a request to the rank holding its longest
	// prefix on the engine picked, within cache_aware.pressure_guard waiting requests of the
	// least loaded rank; off, the rank is chosen by load alone. Default true.
	PreferPrefix bool `koanf:"prefer_prefix" json:"prefer_prefix"`
}

// Hashing tunes the stateless hashing policies, consistent_hash and prefix_hash: both place
// engines on a consistent-hash ring by worker ID and bound each engine's load.
type Hashing struct {
	// KeyHeaders are the request headers consistent_hash reads its key from, in order; the
	// first one present counts. Each a valid header name; at least one. Default
	// ["x-sgl-routing-key", "x-session-id"].
	KeyHeaders []string `koanf:"key_headers" json:"key_headers"`
	// LoadFactor bounds each engine's router-local in-flight requests at load_factor times
	// the group's average (rounded up, counting the request being placed); a key whose
	// engine is at the bound goes to the next engine on the ring. At least 1; 1 is strict
	// balance, larger keeps more keys home. Default 1.25.
	LoadFactor float64 `koanf:"load_factor" json:"load_factor" unit:"times the average in-flight"`
	// VirtualNodes is how many points each engine has on the ring, 1..4096; more spreads
	// keys more evenly. Default 160.
	VirtualNodes int `koanf:"virtual_nodes" json:"virtual_nodes" unit:"points per engine"`
	// PrefixTokens is how many leading prompt tokens prefix_hash hashes, at least 1.
	// Default 256.
	PrefixTokens int `koanf:"prefix_tokens" json:"prefix_tokens" unit:"tokens"`
}

// CacheAware tunes the cache_aware policy.
type CacheAware struct {
	// Source is "local" (the router's own index of the engines' KV events), "remote" (a
	// switchyard indexer) or "approximate" (a prefix tree of the requests the router itself
	// dispatched, for engines that publish no KV events: sgl-router's cache-aware policy,
	// tuned by cache_aware.approximate). Default local.
	Source string `koanf:"source" json:"source"`
	// RemoteURL is the indexer's base URL: required when source is remote, rejected when
	// it is local. Default: none.
	RemoteURL string `koanf:"remote_url" json:"remote_url"`
	// QueryTimeout bounds one remote lookup. Default 100ms.
	QueryTimeout time.Duration `koanf:"query_timeout" json:"query_timeout"`
	// MaxInflightQueries bounds concurrent remote lookups. Default 32.
	MaxInflightQueries int `koanf:"max_inflight_queries" json:"max_inflight_queries" unit:"queries"`
	// Decision is the decision rule: "latency" sends a request where its expected time to
	// first token is lowest (queued prefill work plus the uncached part of its prompt, at
	// the engine's learned rate; admission checked once, on the winner), or "threshold"
	// prefers a holder of at least min_matched_tokens under the queue, margin and pressure
	// rules below (the settings from min_matched_tokens on apply to threshold only). It
	// applies to the local and remote sources; the approximate source keeps its own rule.
	// Default latency.
	Decision string `koanf:"decision" json:"decision"`
	// MinMatchedTokens is the minimum prefix hit, in tokens, to prefer a holder. Default 1024.
	MinMatchedTokens int `koanf:"min_matched_tokens" json:"min_matched_tokens" unit:"tokens"`
	// MinMatchRatio is the optional minimum matched/input ratio, in [0, 1]; 0 disables.
	// Default 0.
	MinMatchRatio float64 `koanf:"min_match_ratio" json:"min_match_ratio" unit:"matched / input tokens"`
	// MinCandidates is the lower bound of the candidate set, at least 1. Default 8.
	MinCandidates int `koanf:"min_candidates" json:"min_candidates" unit:"engines"`
	// CandidateRatio sizes the candidate set as a fraction of the group, in (0, 1].
	// Default 0.05.
	CandidateRatio float64 `koanf:"candidate_ratio" json:"candidate_ratio" unit:"fraction of the group"`
	// MaxCandidates is the upper bound of the candidate set, at least min_candidates.
	// Default 32.
	MaxCandidates int `koanf:"max_candidates" json:"max_candidates" unit:"engines"`
	// WorkerQueueLimit is the soft queue gate: waiting requests beyond which a holder is
	// avoided when another is available. Default 8.
	WorkerQueueLimit int `koanf:"worker_queue_limit" json:"worker_queue_limit" unit:"waiting requests"`
	// SaturationFloor is the fraction of candidates that must be past the soft gate before
	// the best holder is pinned anyway, in [0, 1]. Default 1.0 (all).
	SaturationFloor float64 `koanf:"saturation_floor" json:"saturation_floor" unit:"fraction of the group"`
	// SwitchMargin is the uncached-token advantage, in tokens, a holder needs over the
	// best-matching holder to be chosen instead. Default 256.
	SwitchMargin int `koanf:"switch_margin" json:"switch_margin" unit:"tokens"`
	// PressureGuard is the waiting-request gap beyond which a less-loaded holder wins
	// despite more uncached work; with dp_dispatch, also the gap beyond which the least
	// loaded rank of the engine picked wins over the ranks holding the prefix (any
	// decision). Default 4.
	PressureGuard int `koanf:"pressure_guard" json:"pressure_guard" unit:"waiting requests"`
	// MinLoadChoices is k of the power-of-k fallback on a miss; at least 2. Default 2.
	MinLoadChoices int `koanf:"min_load_choices" json:"min_load_choices" unit:"engines"`
	// DispatchWindow is how long the latency decision counts a prompt it dispatched as held
	// by the engine it went to (its prefix to whole 1,024-token steps, the last 128 prompts),
	// until the engine's KV events show it: a request sharing the prefix of a prompt still
	// queued or prefilled there finds that engine as a holder. 0 disables. Decision latency,
	// sources local and remote. Default 10s.
	DispatchWindow time.Duration `koanf:"dispatch_window" json:"dispatch_window"`
	// Approximate tunes source approximate, with the meanings of sgl-router's cache-aware
	// flags; the keys above do not apply to it.
	Approximate ApproximateCache `koanf:"approximate" json:"approximate"`
}

// ApproximateCache tunes cache_aware with source approximate: a prefix tree, per model, of
// the prompts the router dispatched (token IDs with a tokenizer, else the prompt's text),
// whose holders are the engines each prompt went to.
type ApproximateCache struct {
	// CacheThreshold is the share of the prompt an engine must hold, more than which the
	// request goes to the engine holding the longest prefix; at or below it, to the engine
	// holding the least (sgl-router's --cache-threshold), in [0, 1]. Default 0.3.
	CacheThreshold float64 `koanf:"cache_threshold" json:"cache_threshold" unit:"matched / prompt length"`
	// BalanceAbsThreshold: the group is imbalanced, and a request goes to the engine with
	// the fewest requests in flight whatever it holds, when the most and the least loaded
	// engines differ by more than this many in-flight requests and balance_rel_threshold
	// holds too (sgl-router's --balance-abs-threshold); at least 0. Default 64.
	BalanceAbsThreshold int `koanf:"balance_abs_threshold" json:"balance_abs_threshold" unit:"requests"`
	// BalanceRelThreshold: the second condition of imbalance, the most loaded engine's
	// in-flight count above this multiple of the least loaded one's (sgl-router's
	// --balance-rel-threshold); at least 1. Default 1.5.
	BalanceRelThreshold float64 `koanf:"balance_rel_threshold" json:"balance_rel_threshold" unit:"ratio"`
	// EvictionInterval is the period of the eviction that trims every engine's part of the
	// tree to max_tree_size, least recently used prefixes first (sgl-router's
	// --eviction-interval-secs). Default 120s.
	EvictionInterval time.Duration `koanf:"eviction_interval" json:"eviction_interval"`
	// MaxTreeSize is how much of the tree one engine keeps after an eviction, in tokens (or
	// bytes of text without a tokenizer) (sgl-router's --max-tree-size). Between evictions
	// the whole tree never holds more than twice this per engine: beyond, it is trimmed at
	// once. At least 1024. Default 4194304 (2^22; sgl-router's is 2^26).
	MaxTreeSize int `koanf:"max_tree_size" json:"max_tree_size" unit:"tokens per engine"`
}

// Health configures active health checks and circuit breakers.
type Health struct {
	// Interval is the health-check period. Default 5s.
	Interval time.Duration `koanf:"interval" json:"interval"`
	// Timeout bounds one health check. Default 2s.
	Timeout time.Duration `koanf:"timeout" json:"timeout"`
	// StartupTimeout bounds how long the router waits for an engine it must learn the model
	// of: a worker added through POST /workers without a model, and, with sgl-router's
	// command line (serve --compat sgl-router), the engines of a launch that names no model
	// (sgl-router's --worker-startup-timeout-secs). Default 600s.
	StartupTimeout time.Duration `koanf:"startup_timeout" json:"startup_timeout"`
	// StartupCheckInterval is the wait between two attempts to reach such an engine
	// (sgl-router's --worker-startup-check-interval). Default 5s (sgl-router's is 30s).
	StartupCheckInterval time.Duration `koanf:"startup_check_interval" json:"startup_check_interval"`
	// Endpoint is the route a health check asks with GET, answered 200 by a healthy engine
	// (sgl-router's --health-check-endpoint); it starts with "/". Default "/health".
	Endpoint string `koanf:"endpoint" json:"endpoint"`
	// FailureThreshold consecutive failures mark a worker unhealthy; at least 1. Default 3.
	FailureThreshold int `koanf:"failure_threshold" json:"failure_threshold" unit:"health checks"`
	// SuccessThreshold consecutive successes mark it healthy again; at least 1. Default 2.
	SuccessThreshold int `koanf:"success_threshold" json:"success_threshold" unit:"health checks"`
	// BreakerEnabled turns the per-worker circuit breakers on (sgl-router's
	// --disable-circuit-breaker is false here). Default true.
	BreakerEnabled bool `koanf:"breaker_enabled" json:"breaker_enabled"`
	// BreakerFailures consecutive dispatch failures the engine is answerable for
	// (connection failures, timeouts, 502, 503, 504, a stream the engine broke) open a
	// worker's breaker (sgl-router's --cb-failure-threshold); at least 1. Default 5.
	BreakerFailures int `koanf:"breaker_failures" json:"breaker_failures" unit:"dispatch failures"`
	// BreakerErrorRate is the share of failed dispatches — the failures above plus other
	// 5xx answers, such as a 500 to a request the engine cannot serve — over breaker_window
	// that opens a worker's breaker, once breaker_min_requests dispatches were counted in
	// it; in (0, 1]. Answers that say nothing of the engine (4xx, a client that left, the
	// router's own failures) count neither as failed nor as dispatches. Default 0.5.
	BreakerErrorRate float64 `koanf:"breaker_error_rate" json:"breaker_error_rate" unit:"fraction of dispatches"`
	// BreakerMinRequests is the least number of dispatches in breaker_window (4xx answers
	// and the other outcomes that say nothing of the engine left out) before
	// breaker_error_rate is applied; at least 1. Default 20.
	BreakerMinRequests int `koanf:"breaker_min_requests" json:"breaker_min_requests" unit:"dispatches"`
	// BreakerWindow is the sliding window of breaker_error_rate (sgl-router's
	// --cb-window-duration-secs). Default 60s.
	BreakerWindow time.Duration `koanf:"breaker_window" json:"breaker_window"`
	// BreakerCooldown is how long an open breaker stays open; it then turns half-open and
	// lets one probe request at a time through (sgl-router's --cb-timeout-duration-secs).
	// Default 30s.
	BreakerCooldown time.Duration `koanf:"breaker_cooldown" json:"breaker_cooldown"`
	// BreakerSuccesses consecutive successful probes close a half-open breaker
	// (sgl-router's --cb-success-threshold); at least 1. Default 1.
	BreakerSuccesses int `koanf:"breaker_successes" json:"breaker_successes" unit:"probes"`
}

// Upstream configures the router's connections to engines.
type Upstream struct {
	// MaxIdleConnDuration closes a keep-alive connection to an engine idle this long. Keep
	// it below the engines' own keep-alive timeout: uvicorn, which serves SGLang and vLLM,
	// closes an idle connection after 5s. Default 3s.
	MaxIdleConnDuration time.Duration `koanf:"max_idle_conn_duration" json:"max_idle_conn_duration"`
	// ConnectTimeout bounds opening one connection to an engine (TCP, and the TLS handshake
	// of an https worker). Default 10s.
	ConnectTimeout time.Duration `koanf:"connect_timeout" json:"connect_timeout"`
	// ResponseHeaderTimeout bounds the wait for an engine's response headers once a request
	// is sent; 0 leaves only server.request_timeout. An engine answers a streaming request's
	// headers as soon as it takes the request, but a non-streaming one's only when the whole
	// completion is done: this also bounds non-streaming generation time. Default 60s.
	ResponseHeaderTimeout time.Duration `koanf:"response_header_timeout" json:"response_header_timeout"`
	// MaxConnsPerWorker caps the router's open connections to one engine; a request that
	// finds them all busy goes at once to another engine of its selection, else fails with
	// 503 upstream_connection_limit, which is not charged to the engine; at least 1.
	// Default 4096.
	MaxConnsPerWorker int `koanf:"max_conns_per_worker" json:"max_conns_per_worker" unit:"connections"`
	// MaxResponseBytes caps an engine's answer that the router reads whole before relaying
	// it: a non-streaming answer (completion, embeddings), a prefill answer, the answers of
	// /get_model_info, /flush_cache and adapter loads. An answer announced or grown past it
	// fails with 502 upstream_error and its connection is closed. Streamed answers are
	// relayed event by event and not bounded by it. 4096..1073741824; above 100 MiB a
	// chunked answer is copied again at each chunk as it grows. Default 64 MiB.
	MaxResponseBytes int64 `koanf:"max_response_bytes" json:"max_response_bytes" unit:"bytes"`
	// TLS is the client TLS of the router's connections to https:// workers: dispatch,
	// health checks, introspection and load polls alike. workers[].tls overrides it per
	// worker. Default: none (the system's roots, no client certificate).
	TLS UpstreamTLS `koanf:"tls" json:"tls"`
	// APIKey, when set, is sent to every engine as "Authorization: Bearer KEY" — on
	// dispatch, health checks, introspection and load polls — in place of the client's
	// Authorization header (sgl-router's --api-key, the key of the workers). It is not the
	// router's own key: that is server.api_key. Default: none (the client's header is
	// forwarded unless server.api_key is set).
	APIKey string `koanf:"api_key" json:"api_key"`
}

// UpstreamTLS is the client TLS of the router's connections to https:// workers: whom the
// router trusts, the certificate it shows (mutual TLS), the name it expects. The files are
// read once, when the router starts; switchyard check reads them too. An http:// worker
// never uses TLS.
type UpstreamTLS struct {
	// CAFiles are PEM files of certificate authorities trusted to sign the engines'
	// certificates, in addition to the system's roots (sgl-router's --ca-cert-paths).
	// Default: none (the system's roots).
	CAFiles []string `koanf:"ca_files" json:"ca_files"`
	// CertFile is the PEM client certificate (chain) the router presents to engines that
	// require one (mutual TLS; sgl-router's --client-cert-path); it requires key_file.
	// Default: none.
	CertFile string `koanf:"cert_file" json:"cert_file"`
	// KeyFile is the PEM private key of cert_file (sgl-router's --client-key-path); it
	// requires cert_file. Default: none.
	KeyFile string `koanf:"key_file" json:"key_file"`
	// ServerName is the name the engines' certificates must carry, also sent as SNI.
	// Default: none (the host of each worker's url).
	ServerName string `koanf:"server_name" json:"server_name"`
}

// IsZero reports whether t sets nothing.
func (t *UpstreamTLS) IsZero() bool {
	return t == nil || len(t.CAFiles) == 0 && t.CertFile == "" && t.KeyFile == "" && t.ServerName == ""
}

// Merged returns t with every key over set: the worker's TLS over the global one. The
// client certificate and its key are one setting: over replaces both when it sets either.
func (t UpstreamTLS) Merged(over *UpstreamTLS) UpstreamTLS {
	if over == nil {
		return t
	}
	if len(over.CAFiles) > 0 {
		t.CAFiles = over.CAFiles
	}
	if over.CertFile != "" || over.KeyFile != "" {
		t.CertFile, t.KeyFile = over.CertFile, over.KeyFile
	}
	if over.ServerName != "" {
		t.ServerName = over.ServerName
	}
	return t
}
