package config

import (
	"slices"
	"testing"
	"time"
)

// TestLoadResilienceKeys reads every key of the concurrency limits, queues, rate limits and
// retries from a file, the environment and flags, each overriding the one before.
func TestLoadResilienceKeys(t *testing.T) {
	file := writeFile(t, "resil.yaml", `
server:
  max_concurrent_requests: 64
  queue_size: 8
  queue_timeout: 2s
  rate_limit:
    requests_per_second: 100.5
    burst: 20
    per_key: {requests_per_second: 5, burst: 10, max_keys: 500}
workers:
  - {id: w1, url: "http://127.0.0.1:30001", model: llama}
models:
  llama:
    max_concurrent_requests: 4
    queue_size: 0
    queue_timeout: 500ms
    buckets: [{id: all, groups: {plain: {}}}]
retry:
  max_retries: 3
  initial_backoff: 10ms
  max_backoff: 200ms
  backoff_multiplier: 1.5
  jitter: 0.5
  retryable_statuses: [500, 502]
  budget: {ratio: 0.1, min_retries_per_second: 1, window: 30s}
`)
	cfg, err := Load([]string{"--config", file, "--set", "retry.enabled=false", "--set", "server.queue_size=9"}, []string{
		"SWITCHYARD_SERVER__RATE_LIMIT__PER_KEY__MAX_KEYS=7",
		"SWITCHYARD_RETRY__BUDGET__RATIO=0.3",
		"SWITCHYARD_MODELS__LLAMA__QUEUE_TIMEOUT=750ms",
		"SWITCHYARD_SERVER__QUEUE_SIZE=1",
	})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	s := cfg.Server
	if s.MaxConcurrentRequests != 64 || s.QueueSize != 9 || s.QueueTimeout != 2*time.Second {
		t.Errorf("server limits %d/%d/%s", s.MaxConcurrentRequests, s.QueueSize, s.QueueTimeout)
	}
	want := RateLimit{RequestsPerSecond: 100.5, Burst: 20, PerKey: KeyRateLimit{RequestsPerSecond: 5, Burst: 10, MaxKeys: 7}}
	if s.RateLimit != want {
		t.Errorf("rate_limit = %+v, want %+v", s.RateLimit, want)
	}
	m := cfg.Models["llama"]
	if m.MaxConcurrentRequests != 4 || m.QueueSize == nil || *m.QueueSize != 0 || m.QueueTimeout != 750*time.Millisecond {
		t.Errorf("model limits %d/%v/%s", m.MaxConcurrentRequests, m.QueueSize, m.QueueTimeout)
	}
	r := cfg.Retry
	if r.Enabled || r.MaxRetries != 3 || r.InitialBackoff != 10*time.Millisecond || r.MaxBackoff != 200*time.Millisecond ||
		r.BackoffMultiplier != 1.5 || r.Jitter != 0.5 || !slices.Equal(r.RetryableStatuses, []int{500, 502}) {
		t.Errorf("retry = %+v", r)
	}
	if r.Budget != (RetryBudget{Ratio: 0.3, MinRetriesPerSecond: 1, Window: 30 * time.Second}) {
		t.Errorf("retry.budget = %+v", r.Budget)
	}
}

// TestLoadUpstreamTLSAndMetricsListener reads the upstream TLS (global and per worker) and
// the metrics listener from a file, the environment and flags, and merges a worker's TLS
// over the global one key by key.
func TestLoadUpstreamTLSAndMetricsListener(t *testing.T) {
	file := writeFile(t, "tls.yaml", `
server: {metrics_port: 29000}
upstream:
  tls:
    ca_files: [/etc/switchyard/ca.pem, /etc/switchyard/ca-old.pem]
    cert_file: /etc/switchyard/router.pem
    key_file: /etc/switchyard/router.key
workers:
  - {id: w1, url: "https://10.0.0.1:30001", model: llama}
  - id: w2
    url: "https://10.0.0.2:30001"
    model: llama
    tls: {server_name: engine-2.internal, cert_file: /etc/w2/c.pem, key_file: /etc/w2/k.pem}
models:
  llama: {buckets: [{id: all, groups: {plain: {}}}]}
`)
	cfg, err := Load([]string{"--config", file, "--set", "server.metrics_host=0.0.0.0"}, []string{
		"SWITCHYARD_UPSTREAM__TLS__SERVER_NAME=engines.internal",
		"SWITCHYARD_SERVER__METRICS_PORT=29001",
	})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if s := cfg.Server; s.MetricsHost != "0.0.0.0" || s.MetricsPort == nil || *s.MetricsPort != 29001 {
		t.Errorf("metrics listener %q %v", s.MetricsHost, s.MetricsPort)
	}
	global := cfg.Upstream.TLS
	want := UpstreamTLS{CAFiles: []string{"/etc/switchyard/ca.pem", "/etc/switchyard/ca-old.pem"},
		CertFile: "/etc/switchyard/router.pem", KeyFile: "/etc/switchyard/router.key", ServerName: "engines.internal"}
	if !slices.Equal(global.CAFiles, want.CAFiles) || global.CertFile != want.CertFile || global.KeyFile != want.KeyFile ||
		global.ServerName != want.ServerName {
		t.Errorf("upstream.tls = %+v", global)
	}
	if cfg.Workers[0].TLS != nil {
		t.Errorf("workers[0].tls = %+v, want none", cfg.Workers[0].TLS)
	}
	got := global.Merged(cfg.Workers[1].TLS)
	want.CertFile, want.KeyFile, want.ServerName = "/etc/w2/c.pem", "/etc/w2/k.pem", "engine-2.internal"
	if !slices.Equal(got.CAFiles, want.CAFiles) || got.CertFile != want.CertFile || got.KeyFile != want.KeyFile ||
		got.ServerName != want.ServerName {
		t.Errorf("workers[1]'s merged tls = %+v, want %+v", got, want)
	}
	if d := Default(); d.Server.MetricsPort != nil || d.Server.MetricsHost != "127.0.0.1" || !d.Upstream.TLS.IsZero() {
		t.Errorf("defaults: metrics %q %v, tls %+v", d.Server.MetricsHost, d.Server.MetricsPort, d.Upstream.TLS)
	}
}

func TestLoadResilienceErrors(t *testing.T) {
	file := writeFile(t, "bad.yaml", `
server:
  queue_timeout: 5
  rate_limit: {per_key: {max_key: 3}}
retry:
  retryable_statuses: ["502"]
  budget: {window: 1m, ratios: 0.1}
`)
	_, err := Load([]string{"--config", file}, nil)
	want := []string{
		"retry.budget.ratios: unknown key",
		`retry.retryable_statuses[0]: expected an integer, got string "502"`,
		`server.queue_timeout: expected a duration string such as "5s", got number 5`,
		"server.rate_limit.per_key.max_key: unknown key",
	}
	if got := errLines(err); !equalLines(got, want) {
		t.Fatalf("Load errors:\n  %v\nwant\n  %v", got, want)
	}
}

func TestEffectiveBurst(t *testing.T) {
	tests := []struct {
		rps   float64
		burst int
		want  int
	}{
		{0.5, 0, 1},
		{10, 0, 10},
		{10.2, 0, 11},
		{10, 3, 3},
		{0, 0, 1},
	}
	for _, tt := range tests {
		if got := EffectiveBurst(tt.rps, tt.burst); got != tt.want {
			t.Errorf("EffectiveBurst(%g, %d) = %d, want %d", tt.rps, tt.burst, got, tt.want)
		}
	}
}
