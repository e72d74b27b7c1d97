package config

import "time"

// Default returns a new Config holding every documented default. It has no workers and
// no models. Each call returns a fresh value the caller owns.
func Default() *Config {
	return &Config{
		Server: Server{
			Host:              "127.0.0.1",
			Port:              8080,
			MaxBodyBytes:      32 << 20,
			RequestTimeout:    600 * time.Second,
			StreamIdleTimeout: 60 * time.Second,
			DrainTimeout:      30 * time.Second,
			QueueSize:         100,
			QueueTimeout:      60 * time.Second,
			RateLimit:         RateLimit{PerKey: KeyRateLimit{MaxKeys: 10_000}},
			WriteTimeout:      30 * time.Second,
			MaxHeaderBytes:    8 << 10,
			// Four bodies at the 32 MiB cap.
			MaxBodyBytesInFlight: 128 << 20,
			MetricsHost:          "127.0.0.1",
			PriorityHeader:       "x-priority",
			MaxPriority:          10,
		},
		Actors: Actors{
			Mailbox: Mailbox{
				Bucket:     1024,
				Group:      1024,
				Telemetry:  256,
				IndexShard: 4096,
				Affinity:   1024,
			},
			PickTimeout: time.Second,
		},
		Load: LoadSettings{
			Freshness:      5 * time.Second,
			PollInterval:   time.Second,
			Source:         LoadSourceAuto,
			GuardMaxAge:    time.Hour,
			ScrapeTimeout:  2 * time.Second,
			ScrapeMaxBytes: 4 << 20,
		},
		KV: KV{
			Enabled:          true,
			BlockSize:        16,
			Shards:           0, // one per core
			MaxBlocks:        4_000_000,
			ReconnectBackoff: 500 * time.Millisecond,
			HashCacheChunks:  16384,
			BlockKey:         BlockKeyEngine,
			MaxMessageBytes:  16 << 20,
		},
		Affinity: Affinity{
			SessionHeader:    "x-session-id",
			RoutingKeyHeader: "x-sgl-routing-key",
			IdleTimeout:      600 * time.Second,
			SweepInterval:    60 * time.Second,
			MaxBindings:      100_000,
		},
		DPDispatch: DPDispatch{PreferPrefix: true},
		LoRA: LoRA{
			Evict:           true,
			SlotsPerEngine:  8,
			RefreshInterval: 10 * time.Second,
			LoadTimeout:     60 * time.Second,
			ReplicateAbove:  4,
			MaxSlotWaiters:  64,
		},
		Hashing: Hashing{
			KeyHeaders:   []string{"x-sgl-routing-key", "x-session-id"},
			LoadFactor:   1.25,
			VirtualNodes: 160,
			PrefixTokens: 256,
		},
		CacheAware: CacheAware{
			Source:             CacheSourceLocal,
			Decision:           CacheDecisionLatency,
			QueryTimeout:       100 * time.Millisecond,
			MaxInflightQueries: 32,
			MinMatchedTokens:   1024,
			MinMatchRatio:      0,
			MinCandidates:      8,
			CandidateRatio:     0.05,
			MaxCandidates:      32,
			WorkerQueueLimit:   8,
			SaturationFloor:    1.0,
			SwitchMargin:       256,
			PressureGuard:      4,
			MinLoadChoices:     2,
			DispatchWindow:     10 * time.Second,
			Approximate: ApproximateCache{
				CacheThreshold:      0.3,
				BalanceAbsThreshold: 64,
				BalanceRelThreshold: 1.5,
				EvictionInterval:    120 * time.Second,
				MaxTreeSize:         1 << 22,
			},
		},
		Health: Health{
			Interval:             5 * time.Second,
			Timeout:              2 * time.Second,
			StartupTimeout:       600 * time.Second,
			StartupCheckInterval: 5 * time.Second,
			Endpoint:             "/health",
			FailureThreshold:     3,
			SuccessThreshold:     2,
			BreakerEnabled:       true,
			BreakerFailures:      5,
			BreakerErrorRate:     0.5,
			BreakerMinRequests:   20,
			BreakerWindow:        60 * time.Second,
			BreakerCooldown:      30 * time.Second,
			BreakerSuccesses:     1,
		},
		Upstream: Upstream{
			MaxIdleConnDuration:   3 * time.Second,
			ConnectTimeout:        10 * time.Second,
			ResponseHeaderTimeout: 60 * time.Second,
			MaxConnsPerWorker:     4096,
			MaxResponseBytes:      64 << 20,
		},
		Retry:         defaultRetry(),
		Discovery:     defaultDiscovery(),
		Abort:         defaultAbort(),
		Tracing:       defaultTracing(),
		DefaultPolicy: Policy{Type: PolicyRoundRobin},
		Log:           Log{Level: LogLevelInfo},
		Cluster:       defaultCluster(),
	}
}

// defaultWorker is the starting value of every worker decoded from a file: role plain,
// DP size 1, flavor auto, metrics path /metrics.
func defaultWorker() Worker {
	return Worker{Role: RolePlain, DPSize: 1, Flavor: FlavorAuto, MetricsPath: DefaultMetricsPath}
}

// Engine flavours (workers[].flavor) and the default metrics path.
const (
	FlavorAuto   = "auto"
	FlavorSGLang = "sglang"
	FlavorVLLM   = "vllm"

	DefaultMetricsPath = "/metrics"
)

// KV hash schemes of workers[].kv_hash_scheme.
const (
	KVHashAuto   = "auto"
	KVHashSGLang = "sglang"
	KVHashRekey  = "rekey"
)

// kv.block_key: what the prefix index keys blocks by (index.BlockKeyEngine,
// index.BlockKeyRouter).
const (
	BlockKeyEngine = "engine"
	BlockKeyRouter = "router"
)

// MinLookupSplitBlocks is the least kv.lookup_split_blocks other than 0 (off): the prefix
// index's index.MinSplitBlocks.
const MinLookupSplitBlocks = 1024

// Load sources, cache sources, bucket orders and log levels, as written in configuration.
const (
	LoadSourceHTTP = "http"
	LoadSourceZMQ  = "zmq"
	LoadSourceAuto = "auto"
	// LoadSourcePrometheus scrapes every worker's Prometheus page.
	LoadSourcePrometheus = "prometheus"

	CacheSourceLocal  = "local"
	CacheSourceRemote = "remote"
	// CacheSourceApproximate is a prefix tree of the requests the router dispatched.
	CacheSourceApproximate = "approximate"

	BucketOrderCapacity = "capacity"
	BucketOrderSLO      = "slo"

	CacheDecisionLatency   = "latency"
	CacheDecisionThreshold = "threshold"

	LogLevelDebug = "debug"
	LogLevelInfo  = "info"
	LogLevelWarn  = "warn"
	LogLevelError = "error"
)

// Worker labels that introspection reads from an engine's /server_info (SGLang server
// arguments): the KV transfer backend of prefill/decode disaggregation
// (disaggregation_transfer_backend), the KV page size, the KV cache data type and the
// tensor-parallel size. Any other label comes from configuration only.
const (
	LabelTransferBackend = "transfer_backend"
	LabelPageSize        = "page_size"
	LabelKVCacheDType    = "kv_cache_dtype"
	LabelTPSize          = "tp_size"
)

// IntrospectedLabels returns the labels introspection may fill, in documentation order.
func IntrospectedLabels() []string {
	return []string{LabelTransferBackend, LabelPageSize, LabelKVCacheDType, LabelTPSize}
}
