package flow

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/config"
)

// served is one queued request of a class that records when it got its slot.
type served struct {
	name string
	*attempt
}

func startClass(l *Limiter, name string, cls Class) served {
	a := &attempt{done: make(chan error, 1)}
	go func() { a.done <- l.Acquire(time.Now(), cls, Cancel{}) }()
	return served{name, a}
}

// drain releases the held slot once per waiter and returns the waiters' names in the order
// they got the slot. Each release happens one second after the previous one (fake time), so
// a waiter's position is its queue wait in seconds.
func drain(t *testing.T, l *Limiter, ws []served) []string {
	t.Helper()
	var order []string
	left := append([]served(nil), ws...)
	for len(left) > 0 {
		time.Sleep(time.Second)
		l.Release()
		synctest.Wait()
		got := -1
		for i, w := range left {
			if !w.waiting() {
				if got >= 0 {
					t.Fatal("one release served two waiters")
				}
				got = i
			}
		}
		if got < 0 {
			t.Fatal("a release served nobody")
		}
		if err := left[got].result(t); err != nil {
			t.Fatalf("%s: %v", left[got].name, err)
		}
		order = append(order, left[got].name)
		left = append(left[:got], left[got+1:]...)
	}
	l.Release()
	return order
}

func TestLimiterServesHigherPriorityFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLimiter("router", 1, 10, time.Hour, nil)
		if err := l.Acquire(time.Now(), Class{}, Cancel{}); err != nil {
			t.Fatal(err)
		}
		var ws []served
		for i, p := range []int{0, -3, 0, 7, 2, 7} {
			ws = append(ws, startClass(l, fmt.Sprintf("p%d#%d", p, i), Class{Priority: p}))
			synctest.Wait()
		}
		got := strings.Join(drain(t, l, ws), " ")
		if want := "p7#3 p7#5 p2#4 p0#0 p0#2 p-3#1"; got != want {
			t.Fatalf("served %s, want %s", got, want)
		}
		if levels(l) != 0 || l.Queued() != 0 {
			t.Fatalf("levels %d queued %d after draining", levels(l), l.Queued())
		}
	})
}

// TestLimiterBulkTenantDoesNotStarveInteractive is issue 24's fairness check: a bulk tenant
// fills the queue with 40 requests, then an interactive tenant sends 4, one after another.
// Served first come first served, the interactive requests would wait behind the whole
// backlog (41 s and more at one release a second); with fair sharing the i-th one waits no
// longer than its fair share, 2(i+1) releases.
func TestLimiterBulkTenantDoesNotStarveInteractive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLimiter("router", 1, 100, time.Hour, nil)
		if err := l.Acquire(time.Now(), Class{}, Cancel{}); err != nil {
			t.Fatal(err)
		}
		var ws []served
		for i := range 40 {
			ws = append(ws, startClass(l, fmt.Sprintf("bulk%d", i), Class{Tenant: []byte("bulk")}))
			synctest.Wait() // queued in index order
		}
		for i := range 4 {
			ws = append(ws, startClass(l, fmt.Sprintf("chat%d", i), Class{Tenant: []byte("chat")}))
			synctest.Wait()
		}
		order := drain(t, l, ws)
		for i := range 4 {
			pos := indexOf(order, fmt.Sprintf("chat%d", i)) + 1 // releases (seconds) waited
			if pos > 2*(i+1) {
				t.Errorf("chat%d was served by release %d, beyond its fair share %d: %v", i, pos, 2*(i+1), order[:12])
			}
		}
		// The bulk tenant's own requests keep their arrival order.
		last := -1
		for i := range 40 {
			p := indexOf(order, fmt.Sprintf("bulk%d", i))
			if p < last {
				t.Fatalf("bulk%d served before an earlier bulk request", i)
			}
			last = p
		}
	})
}

func TestLimiterWeightedTenants(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLimiter("router", 1, 100, time.Hour, nil)
		if err := l.Acquire(time.Now(), Class{}, Cancel{}); err != nil {
			t.Fatal(err)
		}
		var ws []served
		for i := range 40 {
			ws = append(ws, startClass(l, "gold", Class{Tenant: []byte("gold"), Weight: 3}))
			ws = append(ws, startClass(l, "free", Class{Tenant: []byte("free"), Weight: 1}))
			_ = i
		}
		synctest.Wait()
		order := drain(t, l, ws)
		gold := 0
		for _, n := range order[:40] {
			if n == "gold" {
				gold++
			}
		}
		// While both wait, gold gets three slots to free's one.
		if gold < 29 || gold > 31 {
			t.Fatalf("gold got %d of the first 40 slots, want 30 ± 1", gold)
		}
	})
}

func TestLimiterClassQueueForgetsLeavers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLimiter("router", 1, 100, time.Second, nil)
		if err := l.Acquire(time.Now(), Class{}, Cancel{}); err != nil {
			t.Fatal(err)
		}
		var ws []served
		for i := range 20 {
			ws = append(ws, startClass(l, "x", Class{Priority: i % 5, Tenant: []byte(fmt.Sprint("t", i))}))
		}
		synctest.Wait()
		if levels(l) != 5 {
			t.Fatalf("%d levels for 5 priorities", levels(l))
		}
		time.Sleep(2 * time.Second) // every waiter times out
		synctest.Wait()
		for _, w := range ws {
			if err := w.result(t); err == nil {
				t.Fatal("a waiter got a slot nobody released")
			}
		}
		if levels(l) != 0 || l.Queued() != 0 {
			t.Fatalf("levels %d, queued %d after every waiter left", levels(l), l.Queued())
		}
		l.Release()
	})
}

func TestGateClassMetricsAndWeights(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		set := metrics.NewSet()
		g := NewGate(gateConfig(func(c *config.Config) {
			c.Server.MaxConcurrentRequests = 1
			c.Server.TenantWeights = map[string]int{"gold": 3}
		}), Options{Metrics: set})
		held, err := g.Admit("llama", time.Now(), Class{Priority: 2, Tenant: []byte("gold")}, Cancel{})
		if err != nil {
			t.Fatal(err)
		}
		// A key-named tenant never gets a configured weight or its own label.
		done := make(chan error, 2)
		go func() {
			tk, err := g.Admit("llama", time.Now(), Class{Tenant: []byte("gold"), Keyed: true}, Cancel{})
			if err == nil {
				tk.Release()
			}
			done <- err
		}()
		synctest.Wait()
		time.Sleep(3 * time.Second)
		held.Release()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		out := metricsText(set)
		for _, want := range []string{
			`switchyard_queue_class_requests_total{priority="2",tenant="gold",outcome="admitted"} 1`,
			`switchyard_queue_class_requests_total{priority="0",tenant="other",outcome="admitted"} 1`,
			`switchyard_queue_class_wait_seconds_count{priority="0",tenant="other"} 1`,
			`switchyard_queue_class_wait_seconds_bucket{priority="0",tenant="other",le="2.5"} 0`,
			`switchyard_queue_class_wait_seconds_bucket{priority="0",tenant="other",le="5"} 1`,
		} {
			if !strings.Contains(out, want) {
				t.Errorf("metrics lack %q:\n%s", want, out)
			}
		}
		if !strings.Contains(out, `switchyard_queue_class_wait_seconds_count{priority="2",tenant="gold"} 0`) {
			t.Error("a request that did not queue has a wait")
		}
	})
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// levels counts l's non-empty priority levels.
func levels(l *Limiter) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.q.levels)
}
