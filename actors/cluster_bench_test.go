//go:build !race

// The in-process cluster tests run without the race detector: Proto.Actor's cluster
// (v0.0.0-20240822202345, the newest the module proxy serves) races inside itself (gossip
// state, block list, member list, endpoint shutdown, the etcd provider, grpclog's global
// logger), and the detector fails any test that starts a member. make test runs them in a
// separate step; docs/cluster.md (Testing) lists the races with their stack locations.

package actors

import (
	"fmt"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"switchyard/actors/clusterpb"
)

// BenchmarkClusterLookup measures a binding lookup through the cluster store of a
// two-member cluster on loopback, for keys whose partition this member owns (in process)
// and keys the other member owns (the near cache, or one remote round trip), beside the
// local store (AffinityStore, the single-router baseline). p50-µs and p99-µs are the
// percentiles of one lookup.
func BenchmarkClusterLookup(b *testing.B) {
	ms := startMembers(b, 2)
	now := time.Now()
	pl := ms[0].cl.placement.Load()
	var local, remote []string
	for k := 0; len(local) < 64 || len(remote) < 64; k++ {
		key := fmt.Sprintf("bench-%d", k)
		if pl.owners[ms[0].cl.partitionOf(key)] == pl.self {
			local = append(local, key)
		} else {
			remote = append(remote, key)
		}
		if _, _, err := ms[0].cl.Bind(clusterScope, key, "", "W1", now); err != nil {
			b.Fatal(err)
		}
	}
	store, _, _ := newAffStore(b, AffinityOptions{})
	for _, key := range local {
		if _, _, err := store.Bind(clusterScope, key, "", "W1", now); err != nil {
			b.Fatal(err)
		}
	}
	run := func(b *testing.B, lookup func(key string) (string, error), keys []string) {
		lat := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			start := time.Now()
			if w, err := lookup(keys[i%len(keys)]); err != nil || w != "W1" {
				b.Fatalf("lookup = %q, %v", w, err)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
	}
	b.Run("local-store", func(b *testing.B) {
		run(b, func(k string) (string, error) { return store.Lookup(clusterScope, k, now) }, local)
	})
	b.Run("cluster/owner-local", func(b *testing.B) {
		run(b, func(k string) (string, error) { return ms[0].cl.Lookup(clusterScope, k, now) }, local)
	})
	// A repeat lookup of a key the other member owns: answered by the near cache
	// (cluster.near_cache_ttl), and with the partition's copies forgotten before each
	// lookup (as after an invalidation): one remote round trip.
	b.Run("cluster/owner-remote/near-cache", func(b *testing.B) {
		run(b, func(k string) (string, error) { return ms[0].cl.Lookup(clusterScope, k, now) }, remote)
	})
	b.Run("cluster/owner-remote/uncached", func(b *testing.B) {
		run(b, func(k string) (string, error) {
			ms[0].cl.near.invalidate(ms[0].cl.partitionOf(k))
			return ms[0].cl.Lookup(clusterScope, k, now)
		}, remote)
	})
	// Baselines of the remote lookup: the same request and reply through Proto.Actor's
	// remote to a plain actor on the other member (no cluster, no partition table), and
	// the same bytes as a TCP round trip on loopback.
	echo, err := ms[1].sys.sys.Root.SpawnNamed(actor.PropsFromFunc(func(ctx actor.Context) {
		if _, ok := ctx.Message().(*clusterpb.LookupBinding); ok {
			ctx.Respond(&clusterpb.BindingResult{WorkerId: "W1"})
		}
	}), "bench-echo")
	if err != nil {
		b.Fatal(err)
	}
	b.Run("baseline/proto-actor-remote-request", func(b *testing.B) {
		msg := &clusterpb.LookupBinding{Scope: pbScope(clusterScope), Key: remote[0], NowUnixNano: now.UnixNano()}
		run(b, func(string) (string, error) {
			res, err := ms[0].sys.sys.Root.RequestFuture(echo, msg, time.Second).Result()
			if err != nil {
				return "", err
			}
			return res.(*clusterpb.BindingResult).WorkerId, nil
		}, remote)
	})
	b.Run("baseline/tcp-loopback-round-trip", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			buf := make([]byte, 64)
			for {
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		buf := make([]byte, 64)
		run(b, func(string) (string, error) {
			if _, err := c.Write(buf); err != nil {
				return "", err
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				return "", err
			}
			return "W1", nil
		}, remote)
	})
}
