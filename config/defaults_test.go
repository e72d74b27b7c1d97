package config

import (
	"fmt"
	"testing"
	"time"
)

func TestDefault(t *testing.T) {
	d := Default()
	tests := []struct {
		name      string
		got, want any
	}{
		{"server.host", d.Server.Host, "127.0.0.1"},
		{"server.port", d.Server.Port, 8080},
		{"server.api_key", d.Server.APIKey, ""},
		{"server.admin_api_key", d.Server.AdminAPIKey, ""},
		{"server.max_body_bytes", d.Server.MaxBodyBytes, int64(32 * 1024 * 1024)},
		{"server.request_timeout", d.Server.RequestTimeout, 600 * time.Second},
		{"server.stream_idle_timeout", d.Server.StreamIdleTimeout, 60 * time.Second},
		{"server.drain_timeout", d.Server.DrainTimeout, 30 * time.Second},
		{"server.write_timeout", d.Server.WriteTimeout, 30 * time.Second},
		{"server.max_connections", d.Server.MaxConnections, 0},
		{"server.max_connections_per_ip", d.Server.MaxConnectionsPerIP, 0},
		{"server.max_header_bytes", d.Server.MaxHeaderBytes, 8192},
		{"server.max_body_bytes_in_flight", d.Server.MaxBodyBytesInFlight, int64(128 << 20)},
		{"server.admin_open", d.Server.AdminOpen, false},
		{"server.metrics_api_key", d.Server.MetricsAPIKey, ""},
		{"server.max_concurrent_requests", d.Server.MaxConcurrentRequests, 0},
		{"server.queue_size", d.Server.QueueSize, 100},
		{"server.queue_timeout", d.Server.QueueTimeout, 60 * time.Second},
		{"server.rate_limit.requests_per_second", d.Server.RateLimit.RequestsPerSecond, 0.0},
		{"server.rate_limit.burst", d.Server.RateLimit.Burst, 0},
		{"server.rate_limit.per_key.requests_per_second", d.Server.RateLimit.PerKey.RequestsPerSecond, 0.0},
		{"server.rate_limit.per_key.burst", d.Server.RateLimit.PerKey.Burst, 0},
		{"server.rate_limit.per_key.max_keys", d.Server.RateLimit.PerKey.MaxKeys, 10_000},
		{"server.metrics_host", d.Server.MetricsHost, "127.0.0.1"},
		{"server.metrics_port", d.Server.MetricsPort == nil, true},
		{"upstream.tls", d.Upstream.TLS.IsZero(), true},
		{"retry.enabled", d.Retry.Enabled, true},
		{"retry.max_retries", d.Retry.MaxRetries, 2},
		{"retry.initial_backoff", d.Retry.InitialBackoff, 50 * time.Millisecond},
		{"retry.max_backoff", d.Retry.MaxBackoff, time.Second},
		{"retry.backoff_multiplier", d.Retry.BackoffMultiplier, 2.0},
		{"retry.jitter", d.Retry.Jitter, 0.2},
		{"retry.retryable_statuses", fmt.Sprint(d.Retry.RetryableStatuses), "[502 503 504]"},
		{"retry.budget.ratio", d.Retry.Budget.Ratio, 0.2},
		{"retry.budget.min_retries_per_second", d.Retry.Budget.MinRetriesPerSecond, 5.0},
		{"retry.budget.window", d.Retry.Budget.Window, 10 * time.Second},
		{"discovery.kubernetes.enabled", d.Discovery.Kubernetes.Enabled, false},
		{"discovery.kubernetes.scheme", d.Discovery.Kubernetes.Scheme, "http"},
		{"discovery.kubernetes.bootstrap_port_annotation", d.Discovery.Kubernetes.BootstrapPortAnnotation, "sglang.ai/bootstrap-port"},
		{"discovery.kubernetes.flavor", d.Discovery.Kubernetes.Flavor, "auto"},
		{"discovery.kubernetes.port", d.Discovery.Kubernetes.Port, 0},
		{"abort.enabled", d.Abort.Enabled, true},
		{"abort.prefill_to_completion", d.Abort.PrefillToCompletion, false},
		{"abort.timeout", d.Abort.Timeout, 2 * time.Second},
		{"workers", len(d.Workers), 0},
		{"models", len(d.Models), 0},
		{"actors.mailbox.bucket", d.Actors.Mailbox.Bucket, 1024},
		{"actors.mailbox.group", d.Actors.Mailbox.Group, 1024},
		{"actors.mailbox.telemetry", d.Actors.Mailbox.Telemetry, 256},
		{"actors.mailbox.index_shard", d.Actors.Mailbox.IndexShard, 4096},
		{"actors.mailbox.affinity", d.Actors.Mailbox.Affinity, 1024},
		{"actors.pick_timeout", d.Actors.PickTimeout, time.Second},
		{"load.freshness", d.Load.Freshness, 5 * time.Second},
		{"load.poll_interval", d.Load.PollInterval, time.Second},
		{"load.source", d.Load.Source, "auto"},
		{"load.guard_max_age", d.Load.GuardMaxAge, time.Hour},
		{"kv.enabled", d.KV.Enabled, true},
		{"kv.bind_endpoint", d.KV.BindEndpoint, ""},
		{"kv.block_size", d.KV.BlockSize, 16},
		{"kv.shards", d.KV.Shards, 0},
		{"kv.max_blocks", d.KV.MaxBlocks, 4_000_000},
		{"kv.hash_cache_chunks", d.KV.HashCacheChunks, 16384},
		{"kv.block_key", d.KV.BlockKey, "engine"},
		{"kv.lookup_split_blocks", d.KV.LookupSplitBlocks, 0},
		{"kv.max_message_bytes", d.KV.MaxMessageBytes, int64(16 << 20)},
		{"kv.reconnect_backoff", d.KV.ReconnectBackoff, 500 * time.Millisecond},
		{"affinity.session_header", d.Affinity.SessionHeader, "x-session-id"},
		{"affinity.routing_key_header", d.Affinity.RoutingKeyHeader, "x-sgl-routing-key"},
		{"affinity.idle_timeout", d.Affinity.IdleTimeout, 600 * time.Second},
		{"affinity.sweep_interval", d.Affinity.SweepInterval, 60 * time.Second},
		{"affinity.max_bindings", d.Affinity.MaxBindings, 100_000},
		{"cache_aware.source", d.CacheAware.Source, "local"},
		{"cache_aware.remote_url", d.CacheAware.RemoteURL, ""},
		{"cache_aware.query_timeout", d.CacheAware.QueryTimeout, 100 * time.Millisecond},
		{"cache_aware.max_inflight_queries", d.CacheAware.MaxInflightQueries, 32},
		{"cache_aware.min_matched_tokens", d.CacheAware.MinMatchedTokens, 1024},
		{"cache_aware.min_match_ratio", d.CacheAware.MinMatchRatio, 0.0},
		{"cache_aware.min_candidates", d.CacheAware.MinCandidates, 8},
		{"cache_aware.candidate_ratio", d.CacheAware.CandidateRatio, 0.05},
		{"cache_aware.max_candidates", d.CacheAware.MaxCandidates, 32},
		{"cache_aware.worker_queue_limit", d.CacheAware.WorkerQueueLimit, 8},
		{"cache_aware.saturation_floor", d.CacheAware.SaturationFloor, 1.0},
		{"cache_aware.switch_margin", d.CacheAware.SwitchMargin, 256},
		{"cache_aware.pressure_guard", d.CacheAware.PressureGuard, 4},
		{"cache_aware.min_load_choices", d.CacheAware.MinLoadChoices, 2},
		{"cache_aware.dispatch_window", d.CacheAware.DispatchWindow, 10 * time.Second},
		{"health.interval", d.Health.Interval, 5 * time.Second},
		{"health.timeout", d.Health.Timeout, 2 * time.Second},
		{"health.endpoint", d.Health.Endpoint, "/health"},
		{"health.failure_threshold", d.Health.FailureThreshold, 3},
		{"health.success_threshold", d.Health.SuccessThreshold, 2},
		{"health.breaker_enabled", d.Health.BreakerEnabled, true},
		{"health.breaker_failures", d.Health.BreakerFailures, 5},
		{"health.breaker_error_rate", d.Health.BreakerErrorRate, 0.5},
		{"health.breaker_min_requests", d.Health.BreakerMinRequests, 20},
		{"health.breaker_window", d.Health.BreakerWindow, 60 * time.Second},
		{"health.breaker_cooldown", d.Health.BreakerCooldown, 30 * time.Second},
		{"health.breaker_successes", d.Health.BreakerSuccesses, 1},
		{"upstream.max_idle_conn_duration", d.Upstream.MaxIdleConnDuration, 3 * time.Second},
		{"upstream.connect_timeout", d.Upstream.ConnectTimeout, 10 * time.Second},
		{"upstream.response_header_timeout", d.Upstream.ResponseHeaderTimeout, 60 * time.Second},
		{"upstream.max_conns_per_worker", d.Upstream.MaxConnsPerWorker, 4096},
		{"upstream.max_response_bytes", d.Upstream.MaxResponseBytes, int64(64 << 20)},
		{"default_policy.type", d.DefaultPolicy.Type, PolicyRoundRobin},
		{"default_policy.admission.max_inflight_requests", d.DefaultPolicy.Admission.MaxInflightRequests == nil, true},
		{"log.level", d.Log.Level, "info"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("%s = %v (%T), want %v (%T)", tt.name, tt.got, tt.got, tt.want, tt.want)
			}
		})
	}
	if err := d.Validate(); err != nil {
		t.Errorf("Default().Validate() = %v, want nil", err)
	}
}

func TestDefaultIsFresh(t *testing.T) {
	a := Default()
	a.Server.Port = 1
	a.DefaultPolicy.Type = PolicyRandom
	a.Retry.RetryableStatuses[0] = 500
	if b := Default(); b.Server.Port != 8080 || b.DefaultPolicy.Type != PolicyRoundRobin || b.Retry.RetryableStatuses[0] != 502 {
		t.Errorf("Default() shares state between calls: %+v", b.Server)
	}
}

func TestDecodedWorkerDefaults(t *testing.T) {
	cfg := mustDecodeYAML(t, `
workers:
  - {id: w1, url: "http://127.0.0.1:1", model: m}
  - {id: w2, url: "http://127.0.0.1:2", model: m, role: plain, dp_size: 4}
  - {id: w3, url: "http://127.0.0.1:3", model: m, dp_size: 0}
`)
	tests := []struct {
		i      int
		role   Role
		dpSize int
	}{{0, RolePlain, 1}, {1, RolePlain, 4}, {2, RolePlain, 0}}
	for _, tt := range tests {
		w := cfg.Workers[tt.i]
		if w.Role != tt.role || w.DPSize != tt.dpSize || w.BootstrapPort != nil {
			t.Errorf("workers[%d] = role %q dp_size %d bootstrap %v, want %q %d nil", tt.i, w.Role, w.DPSize, w.BootstrapPort, tt.role, tt.dpSize)
		}
	}
	// An explicit dp_size 0 is kept so that Validate reports it.
	if got := errLines(cfg.Validate()); !equalLines(got, []string{"workers[2].dp_size: must be in 1..4096, got 0"}) {
		t.Errorf("Validate = %q", got)
	}
}
