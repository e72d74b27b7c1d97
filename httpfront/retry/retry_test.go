package retry

import (
	"errors"
	"sync"
	"testing"
	"time"

	"switchyard/config"
)

// fixed returns a random source that always answers v.
func fixed(v float64) func() float64 { return func() float64 { return v } }

func mustPolicy(t *testing.T, cfg config.Retry, random func() float64) *Policy {
	t.Helper()
	p, err := New(cfg, random)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBackoff(t *testing.T) {
	cfg := config.Default().Retry // 50ms, ×2, max 1s, jitter 0.2
	tests := []struct {
		name   string
		jitter float64
		random float64
		want   []time.Duration // retries 1, 2, ...
	}{
		{"no jitter doubles up to the cap", 0, 0.9, []time.Duration{50, 100, 200, 400, 800, 1000, 1000}},
		{"jitter at the middle of the range", 0.2, 0.5, []time.Duration{50, 100, 200, 400, 800, 1000}},
		{"lowest jitter", 0.2, 0, []time.Duration{40, 80, 160, 320, 640, 800}},
		{"highest jitter stays under the cap", 0.2, 0.999999, []time.Duration{60, 120, 240, 480, 960, 1000}},
		{"full jitter can wait nothing", 1, 0, []time.Duration{0, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := cfg
			c.Jitter = tt.jitter
			p := mustPolicy(t, c, fixed(tt.random))
			for i, want := range tt.want {
				got := p.Backoff(i + 1)
				want *= time.Millisecond
				if d := got - want; d < -time.Microsecond || d > time.Microsecond {
					t.Errorf("Backoff(%d) = %s, want %s", i+1, got, want)
				}
			}
		})
	}
	t.Run("multiplier 1 keeps the initial wait", func(t *testing.T) {
		c := cfg
		c.BackoffMultiplier, c.Jitter = 1, 0
		p := mustPolicy(t, c, nil)
		if got := p.Backoff(8); got != 50*time.Millisecond {
			t.Fatalf("Backoff(8) = %s", got)
		}
	})
	t.Run("default random source stays within the jitter", func(t *testing.T) {
		p := mustPolicy(t, cfg, nil)
		for range 1000 {
			if d := p.Backoff(2); d < 80*time.Millisecond || d > 120*time.Millisecond {
				t.Fatalf("Backoff(2) = %s outside 100ms ± 20%%", d)
			}
		}
	})
}

func TestRetryable(t *testing.T) {
	def := config.Default().Retry
	with500 := def
	with500.RetryableStatuses = []int{500, 502, 429, 408, 599}
	off := def
	off.Enabled = false
	none := def
	none.MaxRetries = 0
	tests := []struct {
		name string
		cfg  config.Retry
		f    Failure
		want bool
	}{
		{"transport", def, Failure{Kind: KindTransport}, true},
		{"timeout", def, Failure{Kind: KindTimeout}, true},
		{"502", def, Failure{Kind: KindStatus, Status: 502}, true},
		{"503", def, Failure{Kind: KindStatus, Status: 503}, true},
		{"504", def, Failure{Kind: KindStatus, Status: 504}, true},
		{"500 by default", def, Failure{Kind: KindStatus, Status: 500}, false},
		{"500 when configured", with500, Failure{Kind: KindStatus, Status: 500}, true},
		{"429 when configured", with500, Failure{Kind: KindStatus, Status: 429}, true},
		{"408 when configured", with500, Failure{Kind: KindStatus, Status: 408}, true},
		{"599 when configured", with500, Failure{Kind: KindStatus, Status: 599}, true},
		{"503 not configured", with500, Failure{Kind: KindStatus, Status: 503}, false},
		{"a client error", with500, Failure{Kind: KindStatus, Status: 400}, false},
		{"a status below the set", with500, Failure{Kind: KindStatus, Status: 200}, false},
		{"a status above the set", with500, Failure{Kind: KindStatus, Status: 700}, false},
		{"a negative status", with500, Failure{Kind: KindStatus, Status: -1}, false},
		{"unknown kind", def, Failure{}, false},
		{"retries disabled", off, Failure{Kind: KindTransport}, false},
		{"no retries allowed", none, Failure{Kind: KindTransport}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := mustPolicy(t, tt.cfg, nil).Retryable(tt.f); got != tt.want {
				t.Fatalf("Retryable(%+v) = %v, want %v", tt.f, got, tt.want)
			}
		})
	}
	if n := mustPolicy(t, off, nil).MaxRetries(); n != 0 {
		t.Errorf("disabled MaxRetries = %d", n)
	}
	if n := mustPolicy(t, def, nil).MaxRetries(); n != 2 {
		t.Errorf("default MaxRetries = %d", n)
	}
}

func TestNewRejectsInvalid(t *testing.T) {
	def := config.Default().Retry
	tests := []struct {
		name   string
		mutate func(*config.Retry)
	}{
		{"max retries", func(c *config.Retry) { c.MaxRetries = config.MaxRetries + 1 }},
		{"zero backoff", func(c *config.Retry) { c.InitialBackoff = 0 }},
		{"max below initial", func(c *config.Retry) { c.MaxBackoff = c.InitialBackoff / 2 }},
		{"multiplier", func(c *config.Retry) { c.BackoffMultiplier = 0.9 }},
		{"jitter", func(c *config.Retry) { c.Jitter = 1.1 }},
		{"status", func(c *config.Retry) { c.RetryableStatuses = []int{404} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := def
			tt.mutate(&c)
			if _, err := New(c, nil); !errors.Is(err, ErrInvalid) {
				t.Fatalf("New = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestFailureReason(t *testing.T) {
	tests := []struct {
		f    Failure
		want string
	}{
		{Failure{Kind: KindTransport}, "transport"},
		{Failure{Kind: KindTimeout}, "timeout"},
		{Failure{Kind: KindStatus, Status: 500}, "status_500"},
		{Failure{Kind: KindStatus, Status: 502}, "status_502"},
		{Failure{Kind: KindStatus, Status: 503}, "status_503"},
		{Failure{Kind: KindStatus, Status: 504}, "status_504"},
		{Failure{Kind: KindStatus, Status: 429}, "status_429"},
		{Failure{}, "unknown"},
	}
	for _, tt := range tests {
		if got := tt.f.Reason(); got != tt.want {
			t.Errorf("%+v.Reason() = %q, want %q", tt.f, got, tt.want)
		}
	}
}

var t0 = time.Unix(1_700_000_000, 0)

func budget(ratio, minPerSecond float64, window time.Duration) *Budget {
	return NewBudget(config.RetryBudget{Ratio: ratio, MinRetriesPerSecond: minPerSecond, Window: window})
}

// withdrawAll withdraws at now until the budget refuses (bounded) and returns how many it
// allowed.
func withdrawAll(t *testing.T, b *Budget, now time.Time) int {
	t.Helper()
	for n := range 100_000 {
		if !b.Withdraw(now) {
			return n
		}
	}
	t.Fatal("the budget never refused")
	return 0
}

func TestBudget(t *testing.T) {
	t.Run("the minimum allowance without traffic", func(t *testing.T) {
		b := budget(0.2, 1, 10*time.Second) // 10 retries per window
		if n := withdrawAll(t, b, t0); n != 10 {
			t.Fatalf("allowed %d retries, want 10", n)
		}
		if b.Refused() != 1 {
			t.Fatalf("refused = %d", b.Refused())
		}
	})
	t.Run("the ratio of the window's requests", func(t *testing.T) {
		b := budget(0.2, 0, 10*time.Second)
		for i := range 100 {
			b.Request(t0.Add(time.Duration(i) * 90 * time.Millisecond)) // spread over 9s
		}
		if n := withdrawAll(t, b, t0.Add(9*time.Second)); n != 20 {
			t.Fatalf("allowed %d retries for 100 requests, want 20", n)
		}
	})
	t.Run("requests and retries leave the window", func(t *testing.T) {
		b := budget(0.5, 0, time.Second) // slots of 100ms
		for range 10 {
			b.Request(t0)
		}
		if n := withdrawAll(t, b, t0.Add(500*time.Millisecond)); n != 5 {
			t.Fatalf("allowed %d, want 5", n)
		}
		// 999ms later the first slot is still in the window: nothing more.
		if b.Withdraw(t0.Add(999 * time.Millisecond)) {
			t.Fatal("allowed a retry while the window still holds 5 retries for 10 requests")
		}
		// The requests' slot has left; the retries' slot has not: 0 requests, 5 retries.
		if b.Withdraw(t0.Add(1400 * time.Millisecond)) {
			t.Fatal("allowed a retry with no request left in the window")
		}
		// Everything has left.
		for range 4 {
			b.Request(t0.Add(1600 * time.Millisecond))
		}
		if n := withdrawAll(t, b, t0.Add(1600*time.Millisecond)); n != 2 {
			t.Fatalf("allowed %d after the window moved on, want 2", n)
		}
	})
	t.Run("a slot reused by a later lap starts from zero", func(t *testing.T) {
		b := budget(1, 0, time.Second)
		for range 50 {
			b.Request(t0)
		}
		later := t0.Add(3 * time.Second) // the same slot, three laps later
		b.Request(later)
		if n := withdrawAll(t, b, later); n != 1 {
			t.Fatalf("allowed %d, want 1: the old lap's requests still counted", n)
		}
	})
	t.Run("a clock that goes back ignores the future slots", func(t *testing.T) {
		b := budget(1, 0, time.Second)
		for range 5 {
			b.Request(t0.Add(time.Hour))
		}
		if b.Withdraw(t0) {
			t.Fatal("requests stamped in the future counted")
		}
	})
	t.Run("across the wrap of the slot tag", func(t *testing.T) {
		b := budget(1, 0, time.Second)
		slot := int64(100 * time.Millisecond)
		// The last slot before the tag wraps, then the first after it.
		before := time.Unix(0, (int64(1)<<(64-countBits))*slot*1000-slot)
		after := before.Add(100 * time.Millisecond)
		b.Request(before)
		b.Request(after)
		if n := withdrawAll(t, b, after); n != 2 {
			t.Fatalf("allowed %d across the wrap, want 2", n)
		}
	})
}

// TestBudgetStopsRetryStorm: the whole fleet fails and every request would retry as often as
// it may; the budget keeps the retries to the ratio plus the minimum allowance.
func TestBudgetStopsRetryStorm(t *testing.T) {
	b := budget(0.2, 5, 10*time.Second)
	p := mustPolicy(t, config.Default().Retry, fixed(0.5))
	retries := 0
	now := t0
	for i := range 5000 {
		now = t0.Add(time.Duration(i) * time.Millisecond) // 1000 requests per second
		b.Request(now)
		for r := 1; r <= p.MaxRetries(); r++ {
			if !p.Retryable(Failure{Kind: KindTransport}) || !b.Withdraw(now) {
				break
			}
			retries++
		}
	}
	// 5000 requests in 5s, all within the 10s window: 0.2 × 5000 + 5 × 10.
	if retries != 1050 {
		t.Fatalf("%d retries for 5000 failing requests, want 1050 (without a budget: 10000)", retries)
	}
	if b.Refused() == 0 {
		t.Fatal("no retry was refused")
	}
}

func TestBudgetConcurrent(t *testing.T) {
	b := budget(1, 0, 10*time.Second)
	const goroutines, each = 8, 500
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				b.Request(t0)
			}
		}()
	}
	wg.Wait()
	allowed := 0
	var mu sync.Mutex
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for range each * 2 {
				if b.Withdraw(t0) {
					n++
				}
			}
			mu.Lock()
			allowed += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	// Every request was counted; concurrent withdrawals may overshoot by at most one each.
	if allowed < goroutines*each || allowed > goroutines*each+goroutines {
		t.Fatalf("allowed %d retries for %d requests at ratio 1", allowed, goroutines*each)
	}
}
