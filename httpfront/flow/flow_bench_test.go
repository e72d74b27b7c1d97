package flow

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"switchyard/config"
)

// BenchmarkAdmit is a request's concurrency slots taken and given back when no limit is
// reached: no gate (the baseline), the router-wide limit, and router plus model limits; one
// goroutine and all cores.
func BenchmarkAdmit(b *testing.B) {
	gates := []struct {
		name string
		g    *Gate
	}{
		{"off", nil},
		{"router", NewGate(gateConfig(func(c *config.Config) { c.Server.MaxConcurrentRequests = 1 << 20 }), Options{})},
		{"router+model", NewGate(gateConfig(func(c *config.Config) {
			c.Server.MaxConcurrentRequests = 1 << 20
			m := c.Models["llama"]
			m.MaxConcurrentRequests = 1 << 20
			c.Models["llama"] = m
		}), Options{})},
	}
	for _, tt := range gates {
		b.Run(tt.name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			now := time.Now()
			for b.Loop() {
				tk, err := tt.g.Admit("llama", now, Class{}, Cancel{})
				if err != nil {
					b.Fatal(err)
				}
				tk.Release()
			}
		})
		b.Run(tt.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			now := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					tk, err := tt.g.Admit("llama", now, Class{}, Cancel{})
					if err != nil {
						b.Error(err)
						return
					}
					tk.Release()
				}
			})
		})
	}
}

// BenchmarkAllow is a request's rate-limit check when no limit is reached: no gate (the
// baseline), the router's bucket, and per-key buckets over a given number of distinct keys
// (beyond max_keys, 10000, keys are forgotten and added again).
func BenchmarkAllow(b *testing.B) {
	b.Run("off", func(b *testing.B) {
		var g *Gate
		b.ReportAllocs()
		for b.Loop() {
			if _, err := g.Allow(nil, t0); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("router/parallel", func(b *testing.B) {
		g := NewGate(gateConfig(func(c *config.Config) {
			c.Server.RateLimit.RequestsPerSecond = 1e12
			c.Server.RateLimit.Burst = 1 << 40
		}), Options{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := g.Allow(nil, t0); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	for _, keys := range []int{1, 1000, 100_000} {
		b.Run(fmt.Sprintf("per_key/keys=%d/parallel", keys), func(b *testing.B) {
			g := NewGate(gateConfig(func(c *config.Config) {
				c.Server.RateLimit.PerKey = config.KeyRateLimit{RequestsPerSecond: 1e12, Burst: 1 << 40, MaxKeys: 10_000}
			}), Options{})
			names := make([][]byte, keys)
			for i := range names {
				names[i] = []byte("sk-" + strconv.Itoa(i))
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					if _, err := g.Allow(names[i%keys], t0); err != nil {
						b.Error(err)
						return
					}
					i += 7
				}
			})
		})
	}
}

// BenchmarkRefuse is a request refused by a Limiter whose one slot is held, from all cores:
// a limit without a queue, and one whose queue (of 1) is full.
func BenchmarkRefuse(b *testing.B) {
	for _, size := range []int{0, 1} {
		b.Run(fmt.Sprintf("queue=%d", size), func(b *testing.B) {
			signal := make(queuedSignal, 1)
			l := NewLimiter("router", 1, size, time.Hour, signal)
			if err := l.Acquire(time.Now(), Class{}, Cancel{}); err != nil {
				b.Fatal(err)
			}
			stop := make(chan struct{})
			done := make(chan error, 1)
			if size > 0 {
				go func() { done <- l.Acquire(time.Now(), Class{}, Cancel{Stop: stop}) }()
				<-signal
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if l.Acquire(time.Now(), Class{}, Cancel{}) == nil {
						b.Error("admitted over a full limit")
						return
					}
				}
			})
			close(stop)
			if size > 0 {
				<-done
			}
			l.Release()
		})
	}
}
