package config

import (
	"strings"
	"testing"
	"time"
)

func TestValidateCluster(t *testing.T) {
	automanaged := func(c *Config) {
		c.Cluster.Enabled = true
		c.Cluster.Members = []string{"127.0.0.1:6330", "127.0.0.1:6331"}
	}
	tests := []struct {
		name   string
		mutate func(c *Config)
		want   []string // substrings of the error, each naming its field; nil: valid
	}{
		{name: "disabled section is not checked", mutate: func(c *Config) { c.Cluster.Provider = "zookeeper" }},
		{name: "automanaged", mutate: automanaged},
		{name: "etcd", mutate: func(c *Config) {
			c.Cluster.Enabled = true
			c.Cluster.Provider = ClusterProviderEtcd
			c.Cluster.EtcdEndpoints = []string{"http://127.0.0.1:2379"}
		}},
		{name: "automanaged without members", mutate: func(c *Config) { c.Cluster.Enabled = true },
			want: []string{"cluster.members: required with cluster.provider automanaged"}},
		{name: "bad addresses", mutate: func(c *Config) {
			automanaged(c)
			c.Cluster.Listen = "nohost"
			c.Cluster.Advertise = "127.0.0.1:0"
			c.Cluster.Members[1] = "127.0.0.1:99999"
			c.Cluster.ProviderPort = 0
		}, want: []string{"cluster.listen:", "cluster.advertise:", "cluster.members[1]:", "cluster.provider_port:"}},
		{name: "unknown provider", mutate: func(c *Config) { automanaged(c); c.Cluster.Provider = "consul" },
			want: []string{`cluster.provider: unknown provider "consul"`}},
		{name: "etcd without endpoints, with members", mutate: func(c *Config) {
			automanaged(c)
			c.Cluster.Provider = ClusterProviderEtcd
			c.Cluster.EtcdPrefix = "switchyard"
		}, want: []string{"cluster.etcd_endpoints: required", "cluster.members: only used", "cluster.etcd_prefix:"}},
		{name: "timeouts and partitions", mutate: func(c *Config) {
			automanaged(c)
			c.Cluster.Partitions = 0
			c.Cluster.GossipInterval = 0
			c.Cluster.RequestTimeout = 2 * time.Second
		}, want: []string{"cluster.partitions:", "cluster.gossip_interval:", "cluster.request_timeout: must be at most actors.pick_timeout"}},
		{name: "near cache off", mutate: func(c *Config) {
			automanaged(c)
			c.Cluster.NearCacheTTL = 0
			c.Cluster.NearCacheEntries = 0
		}},
		{name: "near cache longer than half the idle timeout", mutate: func(c *Config) {
			automanaged(c)
			c.Affinity.IdleTimeout = time.Minute
			c.Cluster.NearCacheTTL = 31 * time.Second
		}, want: []string{"cluster.near_cache_ttl: must be at most half of affinity.idle_timeout (30s), got 31s"}},
		{name: "near cache sizes", mutate: func(c *Config) {
			automanaged(c)
			c.Cluster.NearCacheEntries = 0
		}, want: []string{"cluster.near_cache_entries: must be at least 1"}},
		{name: "negative near cache ttl", mutate: func(c *Config) {
			automanaged(c)
			c.Cluster.NearCacheTTL = -time.Second
			c.Cluster.NearCacheEntries = 1<<24 + 1
		}, want: []string{"cluster.near_cache_ttl: must not be negative"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validBase()
			tt.mutate(c)
			err := c.Validate()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %v\nwant it to contain %q", err, w)
				}
			}
		})
	}
}
