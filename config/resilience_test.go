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
