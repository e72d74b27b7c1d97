package httpfront

import (
	"testing"

	"switchyard/config"
)

// BenchmarkServeCacheAware is BenchmarkServePlainChat through a cache_aware group over two
// engines, with the admission limits on (a router-wide concurrency limit and per-key rate
// limits, neither reached): a prefix lookup in the local index (no KV events: every lookup
// misses) or in the approximate tree of dispatched prompts (the same prompt: every lookup
// after the first hits). Its mutex profile shows the locks a cache_aware request takes.
func BenchmarkServeCacheAware(b *testing.B) {
	for _, source := range []string{config.CacheSourceLocal, config.CacheSourceApproximate} {
		b.Run(source, func(b *testing.B) {
			client, uri, body := servePlainChatWith(b, func(cfg *config.Config) {
				a := cfg.Workers[0]
				second := plainWorker("B", a.URL, a.Model)
				cfg.Workers = append(cfg.Workers, second)
				policy := config.Policy{Type: config.PolicyCacheAware}
				cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{{ID: "all",
					Groups: config.Groups{Plain: &config.Group{Policy: &policy}}}}}}
				cfg.CacheAware.Source = source
				cfg.KV.Enabled = false
				cfg.Server.MaxConcurrentRequests = 1 << 20
				cfg.Server.RateLimit.PerKey = config.KeyRateLimit{RequestsPerSecond: 1e12, Burst: 1 << 40, MaxKeys: 10_000}
			})
			postLoop(b, client, uri, body)
		})
	}
}
