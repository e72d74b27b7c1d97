package config

import (
	"fmt"
	"math"
	"time"
)

// MaxRetries is the largest retry.max_retries: a retried prefill/decode request excludes up
// to two engines per failed attempt, and a request carries at most 16 exclusions.
const MaxRetries = 8

// Retry configures the retries of a dispatch that failed before any response byte reached
// the client (the "retry" section). A retry re-runs the pick in the same bucket without the
// engines that failed, then in the later compatible buckets.
type Retry struct {
	// Enabled turns retries on. Default true.
	Enabled bool `koanf:"enabled" json:"enabled"`
	// MaxRetries is how many times one request is retried after its first attempt, 0..8.
	// Default 2.
	MaxRetries int `koanf:"max_retries" json:"max_retries" unit:"retries"`
	// InitialBackoff is the wait before the first retry. Default 50ms.
	InitialBackoff time.Duration `koanf:"initial_backoff" json:"initial_backoff"`
	// MaxBackoff caps the wait before any retry, jitter included; at least initial_backoff.
	// Default 1s.
	MaxBackoff time.Duration `koanf:"max_backoff" json:"max_backoff"`
	// BackoffMultiplier multiplies the wait from one retry to the next, at least 1.
	// Default 2.
	BackoffMultiplier float64 `koanf:"backoff_multiplier" json:"backoff_multiplier"`
	// Jitter spreads each wait uniformly over ± this fraction of it, 0..1. Default 0.2.
	Jitter float64 `koanf:"jitter" json:"jitter" unit:"fraction of the wait"`
	// RetryableStatuses are the engine answers retried like a transport failure (connect
	// refused, reset, timeout before the first byte, which always are): 408, 429 or
	// 500..599; add 500 to retry internal errors. Default [502, 503, 504].
	RetryableStatuses []int `koanf:"retryable_statuses" json:"retryable_statuses" unit:"HTTP statuses"`
	// Budget bounds the retries of all requests together.
	Budget RetryBudget `koanf:"budget" json:"budget"`
}

// RetryBudget bounds retries across requests, so that a failing fleet does not multiply its
// load: over the last window, retries may number at most ratio × requests plus
// min_retries_per_second × window.
type RetryBudget struct {
	// Ratio is the share of the window's requests that may be retried, 0..1. Default 0.2.
	Ratio float64 `koanf:"ratio" json:"ratio" unit:"fraction of requests"`
	// MinRetriesPerSecond is the retry rate allowed whatever the traffic, so that a quiet
	// router still retries; at least 0. Default 5.
	MinRetriesPerSecond float64 `koanf:"min_retries_per_second" json:"min_retries_per_second" unit:"retries per second"`
	// Window is the sliding window the budget counts over, at least 100ms. Default 10s.
	Window time.Duration `koanf:"window" json:"window"`
}

// RateLimit limits the rate of inference requests with token buckets (the
// "server.rate_limit" section). A request over a limit is answered 429 with Retry-After.
type RateLimit struct {
	// RequestsPerSecond is the router-wide sustained rate; 0 turns the router-wide limit
	// off. Default 0.
	RequestsPerSecond float64 `koanf:"requests_per_second" json:"requests_per_second" unit:"requests per second"`
	// Burst is how many requests may arrive at once; 0 means requests_per_second rounded
	// up (at least 1). Default 0.
	Burst int `koanf:"burst" json:"burst" unit:"requests"`
	// PerKey limits each API key (the Authorization bearer token) on its own.
	PerKey KeyRateLimit `koanf:"per_key" json:"per_key"`
}

// KeyRateLimit is the per-API-key token bucket. Requests without a key share one bucket.
type KeyRateLimit struct {
	// RequestsPerSecond is each key's sustained rate; 0 turns per-key limits off. Default 0.
	RequestsPerSecond float64 `koanf:"requests_per_second" json:"requests_per_second" unit:"requests per second"`
	// Burst is how many requests of one key may arrive at once; 0 means
	// requests_per_second rounded up (at least 1). Default 0.
	Burst int `koanf:"burst" json:"burst" unit:"requests"`
	// MaxKeys bounds the keys tracked at once; beyond it the least recently used key is
	// forgotten (it starts again with a full burst). At least 1. Default 10000.
	MaxKeys int `koanf:"max_keys" json:"max_keys" unit:"keys"`
}

// defaultRetry returns the retry defaults.
func defaultRetry() Retry {
	return Retry{
		Enabled:           true,
		MaxRetries:        2,
		InitialBackoff:    50 * time.Millisecond,
		MaxBackoff:        time.Second,
		BackoffMultiplier: 2,
		Jitter:            0.2,
		RetryableStatuses: []int{502, 503, 504},
		Budget: RetryBudget{
			Ratio:               0.2,
			MinRetriesPerSecond: 5,
			Window:              10 * time.Second,
		},
	}
}

func (c *Config) validateRetry(p *problems) {
	r := c.Retry
	if r.MaxRetries < 0 || r.MaxRetries > MaxRetries {
		p.add("retry.max_retries", ErrInvalid, fmt.Sprintf("must be in 0..%d, got %d", MaxRetries, r.MaxRetries))
	}
	positive(p, "retry.initial_backoff", r.InitialBackoff)
	positive(p, "retry.max_backoff", r.MaxBackoff)
	if r.InitialBackoff > 0 && r.MaxBackoff > 0 && r.MaxBackoff < r.InitialBackoff {
		p.add("retry.max_backoff", ErrInvalid, fmt.Sprintf("must be at least retry.initial_backoff (%s), got %s", r.InitialBackoff, r.MaxBackoff))
	}
	if r.BackoffMultiplier < 1 {
		p.add("retry.backoff_multiplier", ErrInvalid, fmt.Sprintf("must be at least 1, got %g", r.BackoffMultiplier))
	}
	inRange(p, "retry.jitter", r.Jitter, 0, 1)
	for i, s := range r.RetryableStatuses {
		if s != 408 && s != 429 && (s < 500 || s > 599) {
			p.add(joinIndex("retry.retryable_statuses", i), ErrInvalid, fmt.Sprintf("must be 408, 429 or 500..599, got %d", s))
		}
	}
	inRange(p, "retry.budget.ratio", r.Budget.Ratio, 0, 1)
	inRange(p, "retry.budget.min_retries_per_second", r.Budget.MinRetriesPerSecond, 0, math.MaxFloat64)
	if r.Budget.Window < 100*time.Millisecond {
		p.add("retry.budget.window", ErrInvalid, "must be at least 100ms, got "+r.Budget.Window.String())
	}
}

// validateFlow checks the router-wide concurrency limit, queue and rate limits.
func (c *Config) validateFlow(p *problems) {
	s := c.Server
	atLeast(p, "server.max_concurrent_requests", int64(s.MaxConcurrentRequests), 0)
	atLeast(p, "server.queue_size", int64(s.QueueSize), 0)
	positive(p, "server.queue_timeout", s.QueueTimeout)
	rl := s.RateLimit
	inRange(p, "server.rate_limit.requests_per_second", rl.RequestsPerSecond, 0, math.MaxFloat64)
	atLeast(p, "server.rate_limit.burst", int64(rl.Burst), 0)
	inRange(p, "server.rate_limit.per_key.requests_per_second", rl.PerKey.RequestsPerSecond, 0, math.MaxFloat64)
	atLeast(p, "server.rate_limit.per_key.burst", int64(rl.PerKey.Burst), 0)
	atLeast(p, "server.rate_limit.per_key.max_keys", int64(rl.PerKey.MaxKeys), 1)
	for _, h := range []struct{ path, v string }{
		{"server.priority_header", s.PriorityHeader},
		{"server.tenant_header", s.TenantHeader},
	} {
		if h.v != "" && !validHeaderName(h.v) {
			p.add(h.path, ErrInvalid, fmt.Sprintf("must be an HTTP header name or empty, got %q", h.v))
		}
	}
	if s.MaxPriority < 0 || s.MaxPriority > 1000 {
		p.add("server.max_priority", ErrInvalid, fmt.Sprintf("must be in 0..1000, got %d", s.MaxPriority))
	}
	for _, name := range sortedKeys(s.TenantWeights) {
		path := "server.tenant_weights." + name
		if name == "" {
			p.add(path, ErrInvalid, "a tenant name must not be empty")
		}
		if w := s.TenantWeights[name]; w < 1 || w > 1000 {
			p.add(path, ErrInvalid, fmt.Sprintf("must be in 1..1000, got %d", w))
		}
	}
}

// validateModelFlow checks one model's concurrency limit and queue.
func validateModelFlow(p *problems, path string, m Model) {
	atLeast(p, path+".max_concurrent_requests", int64(m.MaxConcurrentRequests), 0)
	if m.QueueSize != nil {
		atLeast(p, path+".queue_size", int64(*m.QueueSize), 0)
	}
	if m.QueueTimeout < 0 {
		p.add(path+".queue_timeout", ErrInvalid, "must not be negative (0 takes server.queue_timeout), got "+m.QueueTimeout.String())
	}
}

// inRange reports v outside [lo, hi].
func inRange(p *problems, path string, v, lo, hi float64) {
	if v < lo || v > hi {
		if hi == math.MaxFloat64 {
			p.add(path, ErrInvalid, fmt.Sprintf("must be at least %g, got %g", lo, v))
			return
		}
		p.add(path, ErrInvalid, fmt.Sprintf("must be in %g..%g, got %g", lo, hi, v))
	}
}

// EffectiveBurst is the burst of a token bucket of rate rps configured with burst: burst
// itself, or when it is 0, rps rounded up and at least 1.
func EffectiveBurst(rps float64, burst int) int {
	if burst > 0 {
		return burst
	}
	return max(1, int(math.Ceil(rps)))
}
