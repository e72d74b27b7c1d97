package config

import (
	"fmt"
	"net"
	"strconv"
	"time"
)

// Cluster membership providers (cluster.provider).
const (
	// ClusterProviderAutomanaged: a static list of replicas (cluster.members), each serving
	// its membership over HTTP on cluster.provider_port. Needs nothing else installed.
	ClusterProviderAutomanaged = "automanaged"
	// ClusterProviderEtcd: replicas register under a lease in etcd (cluster.etcd_endpoints),
	// for membership that changes at run time.
	ClusterProviderEtcd = "etcd"
)

// Cluster makes router replicas one Proto.Actor cluster (the "cluster" section): session and
// routing-key bindings live in partition grains that every replica resolves alike, per-engine
// in-flight counts and worker changes are shared by gossip. Off by default: a single router
// needs none of it.
type Cluster struct {
	// Enabled joins this router to the cluster. Default false.
	Enabled bool `koanf:"enabled" json:"enabled"`
	// Name is the cluster's name; replicas with another name are not members. Default
	// "switchyard".
	Name string `koanf:"name" json:"name"`
	// Listen is the host:port this replica's remote endpoint (gRPC) binds; port 0 lets the
	// OS choose. Default "127.0.0.1:0".
	Listen string `koanf:"listen" json:"listen"`
	// Advertise is the host:port other replicas reach the remote endpoint at, when it
	// differs from listen (a bind on 0.0.0.0, NAT). Default: none (listen).
	Advertise string `koanf:"advertise" json:"advertise"`
	// Provider is the membership provider: automanaged or etcd. Default automanaged.
	Provider string `koanf:"provider" json:"provider"`
	// ProviderPort is the automanaged provider's HTTP port of this replica; it binds the
	// host of listen (every interface when that host is empty or 0.0.0.0). Default 6330.
	ProviderPort int `koanf:"provider_port" json:"provider_port" unit:"TCP port"`
	// Members are every replica's automanaged provider address, host:provider_port, this
	// one included: required with provider automanaged. Default: none.
	Members []string `koanf:"members" json:"members" unit:"host:port list"`
	// EtcdEndpoints are the etcd client URLs: required with provider etcd. Default: none.
	EtcdEndpoints []string `koanf:"etcd_endpoints" json:"etcd_endpoints" unit:"URL list"`
	// EtcdPrefix is the key prefix the etcd provider registers replicas under. Default
	// "/switchyard".
	EtcdPrefix string `koanf:"etcd_prefix" json:"etcd_prefix"`
	// Partitions is the number of affinity partitions (grains) each binding scope is split
	// into by key hash; every replica must use the same number. Default 64.
	Partitions int `koanf:"partitions" json:"partitions" unit:"partitions"`
	// RefreshInterval is how often the automanaged provider polls the members: a crashed
	// replica leaves the membership within about this long. Default 1s.
	RefreshInterval time.Duration `koanf:"refresh_interval" json:"refresh_interval"`
	// GossipInterval is how often a replica shares its per-engine in-flight counts and
	// worker changes with the others. Default 100ms.
	GossipInterval time.Duration `koanf:"gossip_interval" json:"gossip_interval"`
	// RequestTimeout bounds one remote binding lookup or bind; at most actors.pick_timeout.
	// Default 250ms.
	RequestTimeout time.Duration `koanf:"request_timeout" json:"request_timeout"`
	// HandoffTimeout bounds the hand-off of this replica's bindings to their new owners on
	// a graceful stop. Default 10s.
	HandoffTimeout time.Duration `koanf:"handoff_timeout" json:"handoff_timeout"`
	// NearCacheTTL is how long a replica answers a key's lookup from the binding it last
	// read from the partition's owner on another replica, without asking again; 0 asks the
	// owner every time. The owner tells the replicas that read a binding when it changes,
	// and every replica forgets a partition's copies when its owner changes. At most half
	// of affinity.idle_timeout (an owner that saw no lookup for this long still holds the
	// binding); the same on every replica. Default 30s.
	NearCacheTTL time.Duration `koanf:"near_cache_ttl" json:"near_cache_ttl"`
	// NearCacheEntries bounds the bindings a replica keeps read from other owners (one
	// slot per scope and key hash; a newer entry takes an older one's slot). Default 65536.
	NearCacheEntries int `koanf:"near_cache_entries" json:"near_cache_entries" unit:"bindings"`
}

// defaultCluster returns the cluster section's defaults.
func defaultCluster() Cluster {
	return Cluster{
		Name:             "switchyard",
		Listen:           "127.0.0.1:0",
		Provider:         ClusterProviderAutomanaged,
		ProviderPort:     6330,
		EtcdPrefix:       "/switchyard",
		Partitions:       64,
		RefreshInterval:  time.Second,
		GossipInterval:   100 * time.Millisecond,
		RequestTimeout:   250 * time.Millisecond,
		HandoffTimeout:   10 * time.Second,
		NearCacheTTL:     30 * time.Second,
		NearCacheEntries: 1 << 16,
	}
}

// validateCluster checks the cluster section; with cluster.enabled false only the values
// that are always checked (none) are, so a disabled section may hold anything.
func (c *Config) validateCluster(p *problems) {
	cl := c.Cluster
	if !cl.Enabled {
		return
	}
	if cl.Name == "" {
		p.add("cluster.name", ErrInvalid, "must not be empty")
	}
	if msg := checkHostPort(cl.Listen, true); msg != "" {
		p.add("cluster.listen", ErrInvalid, msg)
	}
	if cl.Advertise != "" {
		if msg := checkHostPort(cl.Advertise, false); msg != "" {
			p.add("cluster.advertise", ErrInvalid, msg)
		}
	}
	switch cl.Provider {
	case ClusterProviderAutomanaged:
		if cl.ProviderPort < 1 || cl.ProviderPort > 65535 {
			p.add("cluster.provider_port", ErrInvalid, fmt.Sprintf("must be a TCP port (1..65535), got %d", cl.ProviderPort))
		}
		if len(cl.Members) == 0 {
			p.add("cluster.members", ErrInvalid, "required with cluster.provider automanaged: every replica's host:provider_port")
		}
		for i, m := range cl.Members {
			if msg := checkHostPort(m, false); msg != "" {
				p.add(fmt.Sprintf("cluster.members[%d]", i), ErrInvalid, msg)
			}
		}
		if len(cl.EtcdEndpoints) > 0 {
			p.add("cluster.etcd_endpoints", ErrInvalid, "only used with cluster.provider etcd")
		}
	case ClusterProviderEtcd:
		if len(cl.EtcdEndpoints) == 0 {
			p.add("cluster.etcd_endpoints", ErrInvalid, "required with cluster.provider etcd")
		}
		for i, e := range cl.EtcdEndpoints {
			if msg := checkHTTPURL(e); msg != "" {
				p.add(fmt.Sprintf("cluster.etcd_endpoints[%d]", i), ErrInvalid, msg)
			}
		}
		if len(cl.Members) > 0 {
			p.add("cluster.members", ErrInvalid, "only used with cluster.provider automanaged")
		}
		if cl.EtcdPrefix == "" || cl.EtcdPrefix[0] != '/' {
			p.add("cluster.etcd_prefix", ErrInvalid, fmt.Sprintf("must start with /, got %q", cl.EtcdPrefix))
		}
	default:
		p.add("cluster.provider", ErrInvalid, fmt.Sprintf("unknown provider %q (automanaged or etcd; on Kubernetes list the pods in cluster.members or run etcd)", cl.Provider))
	}
	atLeast(p, "cluster.partitions", int64(cl.Partitions), 1)
	if cl.Partitions > 4096 {
		p.add("cluster.partitions", ErrInvalid, fmt.Sprintf("must be at most 4096, got %d", cl.Partitions))
	}
	positive(p, "cluster.refresh_interval", cl.RefreshInterval)
	positive(p, "cluster.gossip_interval", cl.GossipInterval)
	positive(p, "cluster.request_timeout", cl.RequestTimeout)
	if cl.RequestTimeout > c.Actors.PickTimeout && c.Actors.PickTimeout > 0 {
		p.add("cluster.request_timeout", ErrInvalid, fmt.Sprintf("must be at most actors.pick_timeout (%s), got %s", c.Actors.PickTimeout, cl.RequestTimeout))
	}
	positive(p, "cluster.handoff_timeout", cl.HandoffTimeout)
	if cl.NearCacheTTL < 0 {
		p.add("cluster.near_cache_ttl", ErrInvalid, "must not be negative (0 turns the near cache off), got "+cl.NearCacheTTL.String())
	} else if cl.NearCacheTTL > c.Affinity.IdleTimeout/2 && c.Affinity.IdleTimeout > 0 {
		p.add("cluster.near_cache_ttl", ErrInvalid, fmt.Sprintf("must be at most half of affinity.idle_timeout (%s), got %s", c.Affinity.IdleTimeout/2, cl.NearCacheTTL))
	}
	if cl.NearCacheTTL > 0 {
		atLeast(p, "cluster.near_cache_entries", int64(cl.NearCacheEntries), 1)
		if cl.NearCacheEntries > maxNearCacheEntries {
			p.add("cluster.near_cache_entries", ErrInvalid, fmt.Sprintf("must be at most %d, got %d", maxNearCacheEntries, cl.NearCacheEntries))
		}
	}
}

// maxNearCacheEntries bounds cluster.near_cache_entries (8 bytes a slot, plus the entries).
const maxNearCacheEntries = 1 << 24

// checkHostPort returns why s is not a host:port ("" when it is); port 0 is allowed when
// anyPort is set.
func checkHostPort(s string, anyPort bool) string {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Sprintf("must be host:port, got %q", s)
	}
	if host == "" {
		return fmt.Sprintf("must name a host, got %q", s)
	}
	n, err := strconv.Atoi(port)
	least := 1
	if anyPort {
		least = 0
	}
	if err != nil || n < least || n > 65535 {
		return fmt.Sprintf("port must be %d..65535, got %q", least, port)
	}
	return ""
}
