package actors

import (
	"fmt"
	"testing"

	"switchyard/config"
	"switchyard/kv/index"
	"switchyard/kv/indexer"
	"switchyard/kv/subscribe"
	"switchyard/load"
	"switchyard/load/zmtp"
)

// TestLowerFallbacksAgreeWithConfig: kv and load may not import config, so a zero field of
// their own configurations falls back to a constant of theirs. The router always passes
// config's values; this test keeps the constants that stand for a configuration key equal to
// config.Default's, so that the default has one source of truth.
func TestLowerFallbacksAgreeWithConfig(t *testing.T) {
	d := config.Default()
	tests := []struct {
		key       string
		got, want any
	}{
		{"kv.block_size", subscribe.DefaultBlockSize, d.KV.BlockSize},
		{"kv.shards", index.DefaultShards, d.KV.Shards},
		{"kv.max_blocks", index.DefaultMaxBlocks, d.KV.MaxBlocks},
		{"kv.reconnect_backoff", subscribe.DefaultMinBackoff, d.KV.ReconnectBackoff},
		{"kv.max_message_bytes", zmtp.DefaultMaxMessage, d.KV.MaxMessageBytes},
		{"cache_aware.query_timeout", indexer.DefaultQueryTimeout, d.CacheAware.QueryTimeout},
		{"cache_aware.max_inflight_queries", indexer.DefaultMaxInflight, d.CacheAware.MaxInflightQueries},
		{"load.freshness", load.DefaultFreshness, d.Load.Freshness},
		{"load.poll_interval", load.DefaultPollInterval, d.Load.PollInterval},
		{"workers[].metrics_path", load.DefaultMetricsPath, config.DefaultMetricsPath},
	}
	for _, tt := range tests {
		if fmt.Sprint(tt.got) != fmt.Sprint(tt.want) {
			t.Errorf("%s: the lower package falls back to %v, config.Default says %v", tt.key, tt.got, tt.want)
		}
	}
}
