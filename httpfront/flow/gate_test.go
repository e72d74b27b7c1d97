package flow

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/config"
	"switchyard/load/series/seriestest"
)

func gateConfig(mutate func(c *config.Config)) *config.Config {
	c := config.Default()
	c.Models = map[string]config.Model{"llama": {}, "qwen": {}}
	mutate(c)
	return c
}

func TestNewGateNilWithoutLimits(t *testing.T) {
	var g *Gate = NewGate(gateConfig(func(*config.Config) {}), Options{})
	if g != nil {
		t.Fatal("a gate without any limit configured")
	}
	// A nil gate admits everything.
	if after, err := g.Allow([]byte("k"), t0); err != nil || after != 0 {
		t.Fatalf("nil Allow: %s %v", after, err)
	}
	tk, err := g.Admit("llama", time.Now(), Class{}, Cancel{})
	if err != nil || tk != (Ticket{}) {
		t.Fatalf("nil Admit: %+v %v", tk, err)
	}
	tk.Release()
	if g.Router() != nil || g.Model("llama") != nil {
		t.Fatal("nil gate has limiters")
	}
}

func TestGateRateLimits(t *testing.T) {
	set := metrics.NewSet()
	g := NewGate(gateConfig(func(c *config.Config) {
		c.Server.RateLimit = config.RateLimit{RequestsPerSecond: 2, Burst: 4,
			PerKey: config.KeyRateLimit{RequestsPerSecond: 1, Burst: 2, MaxKeys: 10}}
	}), Options{Metrics: set})
	// Each key gets its burst of 2; the router's burst of 4 bounds them together.
	for _, key := range []string{"a", "b"} {
		for i := range 2 {
			if _, err := g.Allow([]byte(key), t0); err != nil {
				t.Fatalf("%s request %d: %v", key, i, err)
			}
		}
		after, err := g.Allow([]byte(key), t0)
		var le *LimitError
		if !errors.Is(err, ErrRateLimited) || !errors.As(err, &le) || le.Scope != ScopeKey || after != time.Second {
			t.Fatalf("%s over its key limit: %s %v", key, after, err)
		}
	}
	after, err := g.Allow([]byte("c"), t0)
	var le *LimitError
	if !errors.As(err, &le) || le.Scope != ScopeRouter || after != 500*time.Millisecond {
		t.Fatalf("a fifth request over the router's burst: %s %v", after, err)
	}
	// The router refused c: c's token was given back, so c still has its burst later.
	later := t0.Add(2 * time.Second)
	for i := range 2 {
		if _, err := g.Allow([]byte("c"), later); err != nil {
			t.Fatalf("c request %d after the router refill: %v", i, err)
		}
	}
	out := metricsText(set)
	for _, want := range []string{`switchyard_rate_limited_total{scope="key"} 2`, `switchyard_rate_limited_total{scope="router"} 1`, `switchyard_rate_limit_keys 3`} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %q:\n%s", want, out)
		}
	}
}

// TestGateModelThenRouter: a request waiting for its model's slot holds no router slot, so a
// busy model does not starve the others.
func TestGateModelThenRouter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGate(gateConfig(func(c *config.Config) {
			c.Server.MaxConcurrentRequests = 2
			c.Server.QueueSize = 4
			m := c.Models["llama"]
			m.MaxConcurrentRequests = 1
			c.Models["llama"] = m
		}), Options{})
		if g.Model("qwen") != nil || g.Model("llama").Limit() != 1 || g.Router().Limit() != 2 {
			t.Fatal("limiters not built from the configuration")
		}
		first, err := g.Admit("llama", time.Now(), Class{}, Cancel{})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan Ticket, 1)
		go func() {
			tk, err := g.Admit("llama", time.Now(), Class{}, Cancel{})
			if err != nil {
				t.Error(err)
			}
			done <- tk
		}()
		synctest.Wait()
		if g.Model("llama").Queued() != 1 || g.Router().Active() != 1 {
			t.Fatalf("llama queued %d, router active %d", g.Model("llama").Queued(), g.Router().Active())
		}
		other, err := g.Admit("qwen", time.Now(), Class{}, Cancel{})
		if err != nil || g.Router().Active() != 2 {
			t.Fatalf("qwen while llama waits: %v (router active %d)", err, g.Router().Active())
		}
		other.Release()
		first.Release()
		synctest.Wait()
		second := <-done
		if g.Model("llama").Active() != 1 || g.Router().Active() != 1 {
			t.Fatalf("after the hand-over: llama %d router %d", g.Model("llama").Active(), g.Router().Active())
		}
		second.Release()
		if g.Model("llama").Active() != 0 || g.Router().Active() != 0 {
			t.Fatal("slots leaked")
		}
	})
}

// TestGateRouterRefusalReleasesModelSlot: a request its model admitted but the router's
// queue refused gives its model slot back.
func TestGateRouterRefusalReleasesModelSlot(t *testing.T) {
	g := NewGate(gateConfig(func(c *config.Config) {
		c.Server.MaxConcurrentRequests = 1
		c.Server.QueueSize = 0
		m := c.Models["llama"]
		m.MaxConcurrentRequests = 5
		c.Models["llama"] = m
	}), Options{})
	held, err := g.Admit("qwen", time.Now(), Class{}, Cancel{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.Admit("llama", time.Now(), Class{}, Cancel{})
	var le *LimitError
	if !errors.Is(err, ErrQueueFull) || !errors.As(err, &le) || le.Scope != ScopeRouter {
		t.Fatalf("err %v, want the router's queue full", err)
	}
	if g.Model("llama").Active() != 0 {
		t.Fatal("the model slot of a refused request was kept")
	}
	held.Release()
}

func TestGateModelQueueSettings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := NewGate(gateConfig(func(c *config.Config) {
			c.Server.QueueSize = 10
			c.Server.QueueTimeout = time.Minute
			llama := c.Models["llama"]
			llama.MaxConcurrentRequests = 1
			llama.QueueSize = new(int) // 0: nobody waits
			c.Models["llama"] = llama
			qwen := c.Models["qwen"]
			qwen.MaxConcurrentRequests = 1
			qwen.QueueTimeout = time.Second
			c.Models["qwen"] = qwen
		}), Options{})
		a, _ := g.Admit("llama", time.Now(), Class{}, Cancel{})
		if _, err := g.Admit("llama", time.Now(), Class{}, Cancel{}); !errors.Is(err, ErrQueueFull) {
			t.Fatalf("llama queue_size 0: %v", err)
		}
		b, _ := g.Admit("qwen", time.Now(), Class{}, Cancel{})
		start := time.Now()
		if _, err := g.Admit("qwen", time.Now(), Class{}, Cancel{}); !errors.Is(err, ErrQueueTimeout) || time.Since(start) != time.Second {
			t.Fatalf("qwen queue_timeout 1s: %v after %s", err, time.Since(start))
		}
		a.Release()
		b.Release()
	})
}

func TestGateQueueMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		set := metrics.NewSet()
		rec := &recorder{}
		g := NewGate(gateConfig(func(c *config.Config) {
			c.Server.MaxConcurrentRequests = 1
			c.Server.QueueSize = 1
			c.Server.QueueTimeout = time.Second
			m := c.Models["qwen"]
			m.MaxConcurrentRequests = 3
			c.Models["qwen"] = m
		}), Options{Metrics: set, Observer: rec})
		held, _ := g.Admit("llama", time.Now(), Class{}, Cancel{})
		go g.Admit("llama", time.Now(), Class{}, Cancel{})
		synctest.Wait()
		out := metricsText(set)
		for _, want := range []string{
			`switchyard_queue_depth{scope="router"} 1`,
			`switchyard_concurrent_requests{scope="router"} 1`,
			`switchyard_concurrent_requests{scope="model",model="qwen"} 0`,
		} {
			if !strings.Contains(out, want) {
				t.Errorf("metrics lack %q:\n%s", want, out)
			}
		}
		g.Admit("llama", time.Now(), Class{}, Cancel{}) // queue full
		time.Sleep(time.Second)                         // the waiter times out
		synctest.Wait()
		held.Release()
		out = metricsText(set)
		for _, want := range []string{
			`switchyard_queue_depth{scope="router"} 0`,
			`switchyard_queue_rejections_total{scope="router",reason="queue_full"} 1`,
			`switchyard_queue_rejections_total{scope="router",reason="queue_timeout"} 1`,
			`switchyard_queue_wait_seconds_bucket{scope="router",le="1"} 1`,
			`switchyard_queue_wait_seconds_count{scope="router"} 1`,
		} {
			if !strings.Contains(out, want) {
				t.Errorf("metrics lack %q:\n%s", want, out)
			}
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if rec.queued != 1 || len(rec.done) != 2 {
			t.Fatalf("observer saw queued %d, done %v", rec.queued, rec.done)
		}
	})
}

func metricsText(set *metrics.Set) string {
	var b bytes.Buffer
	set.WritePrometheus(&b)
	return b.String()
}

// TestGateWaitHistogramsExposition: the queue wait histograms (by limit and by class) are
// exposed byte for byte as metrics.PrometheusHistogram exposes the same observations, with
// their names, labels and bounds. The waits are exact (fake time): a model queue, the
// router's queue, a router queue timeout.
func TestGateWaitHistogramsExposition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		set := metrics.NewSet()
		g := NewGate(gateConfig(func(c *config.Config) {
			c.Server.MaxConcurrentRequests = 2
			c.Server.QueueSize = 4
			c.Server.QueueTimeout = 2 * time.Second
			c.Server.MaxPriority = 1
			c.Server.TenantWeights = map[string]int{"acme": 2}
			m := c.Models["qwen"]
			m.MaxConcurrentRequests = 1
			c.Models["qwen"] = m
		}), Options{Metrics: set})
		admitAfter := func(model string, cls Class, d time.Duration, holder Ticket) (Ticket, error) {
			type result struct {
				t   Ticket
				err error
			}
			done := make(chan result, 1)
			go func() {
				tk, err := g.Admit(model, time.Now(), cls, Cancel{})
				done <- result{tk, err}
			}()
			synctest.Wait() // queued
			time.Sleep(d)
			holder.Release()
			r := <-done
			return r.t, r.err
		}
		// qwen's slot held: a request of tenant acme at priority 1 waits 0.5s in qwen's queue.
		h1, err := g.Admit("qwen", time.Now(), Class{}, Cancel{})
		if err != nil {
			t.Fatal(err)
		}
		a, err := admitAfter("qwen", Class{Priority: 1, Tenant: []byte("acme")}, 500*time.Millisecond, h1)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Release()
		// The router's two slots held: a request waits 0.25s in the router's queue.
		h2, err := g.Admit("llama", time.Now(), Class{}, Cancel{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := admitAfter("llama", Class{}, 250*time.Millisecond, h2)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Release()
		// Still full: a request at priority -1 times out after 2s.
		if _, err := admitAfter("llama", Class{Priority: -1}, 0, Ticket{}); !errors.Is(err, ErrQueueTimeout) {
			t.Fatalf("want a queue timeout, got %v", err)
		}

		obs := map[string][]float64{
			`switchyard_queue_wait_seconds{scope="router"}`:                     {0.25, 2},
			`switchyard_queue_wait_seconds{scope="model",model="qwen"}`:         {0.5},
			`switchyard_queue_class_wait_seconds{priority="1",tenant="acme"}`:   {0.5},
			`switchyard_queue_class_wait_seconds{priority="0",tenant="other"}`:  {0.25},
			`switchyard_queue_class_wait_seconds{priority="-1",tenant="other"}`: {2},
		}
		for _, family := range []string{MetricQueueWait, MetricClassWait} {
			got, want := seriestest.FamilyLines(set, family), seriestest.PrometheusLines(family, waitBuckets, obs)
			if strings.Count(want, "_count{") != 2+strings.Count(family, "class") {
				t.Fatalf("the reference lacks %s's series:\n%s", family, want)
			}
			if got != want {
				t.Errorf("%s exposition differs:\n got:\n%s\nwant:\n%s", family, got, want)
			}
		}
	})
}
