package flow

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func TestTokenBucket(t *testing.T) {
	tb := NewTokenBucket(10, 3) // one token per 100ms, three at once
	for i := range 3 {
		if ok, _ := tb.Allow(t0); !ok {
			t.Fatalf("burst request %d refused", i)
		}
	}
	ok, after := tb.Allow(t0)
	if ok || after != 100*time.Millisecond {
		t.Fatalf("fourth at once: ok %v, retry after %s; want refused, 100ms", ok, after)
	}
	if ok, after := tb.Allow(t0.Add(40 * time.Millisecond)); ok || after != 60*time.Millisecond {
		t.Fatalf("40ms later: ok %v after %s", ok, after)
	}
	if ok, _ := tb.Allow(t0.Add(100 * time.Millisecond)); !ok {
		t.Fatal("refused once a token was back")
	}
	if ok, _ := tb.Allow(t0.Add(100 * time.Millisecond)); ok {
		t.Fatal("two requests on one token")
	}
	// A long pause refills the bucket to its burst, never beyond.
	later := t0.Add(time.Hour)
	n := 0
	for range 10 {
		if ok, _ := tb.Allow(later); ok {
			n++
		}
	}
	if n != 3 {
		t.Fatalf("%d requests after a long pause, want the burst of 3", n)
	}
	if !tb.full(later.Add(300*time.Millisecond)) || tb.full(later.Add(299*time.Millisecond)) {
		t.Fatal("full() wrong")
	}
}

func TestTokenBucketExtremes(t *testing.T) {
	tests := []struct {
		name  string
		rate  float64
		burst int
		n     int // requests allowed at t0
	}{
		{"very slow rate", 1e-12, 2, 2},
		{"very fast rate", 1e12, 5, 5},
		{"huge burst", 1, 1 << 40, 100},
		{"zero burst means one", 1, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := NewTokenBucket(tt.rate, tt.burst)
			got := 0
			for range 100 {
				if ok, after := tb.Allow(t0); ok {
					got++
				} else if after <= 0 {
					t.Fatalf("refused with retry after %s", after)
				}
			}
			if got != tt.n {
				t.Fatalf("allowed %d, want %d", got, tt.n)
			}
		})
	}
}

func TestTokenBucketConcurrent(t *testing.T) {
	tb := NewTokenBucket(1, 500)
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				if ok, _ := tb.Allow(t0); ok {
					allowed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := allowed.Load(); n != 500 {
		t.Fatalf("allowed %d of 1600 concurrent requests, want exactly the burst of 500", n)
	}
}

func TestKeyLimiter(t *testing.T) {
	t.Run("each key has its own bucket", func(t *testing.T) {
		k := NewKeyLimiter(1, 2, 100)
		for _, key := range []string{"alice", "bob", ""} {
			for i := range 2 {
				if ok, _ := k.Allow([]byte(key), t0); !ok {
					t.Fatalf("%q request %d refused", key, i)
				}
			}
			if ok, after := k.Allow([]byte(key), t0); ok || after != time.Second {
				t.Fatalf("%q third request: ok %v after %s", key, ok, after)
			}
		}
		if k.Len() != 3 {
			t.Fatalf("%d keys tracked, want 3", k.Len())
		}
	})
	t.Run("the table stays bounded", func(t *testing.T) {
		k := NewKeyLimiter(1, 1, 50)
		for i := range 10_000 {
			k.Allow([]byte("key-"+strconv.Itoa(i)), t0)
		}
		if n := k.Len(); n > 50 || n < 40 {
			t.Fatalf("%d keys tracked, want at most 50 (and the table used)", n)
		}
	})
	t.Run("a single key table", func(t *testing.T) {
		k := NewKeyLimiter(1, 1, 1)
		k.Allow([]byte("a"), t0)
		k.Allow([]byte("b"), t0)
		if k.Len() != 1 {
			t.Fatalf("%d keys", k.Len())
		}
	})
	t.Run("a key in use outlives a churn of one-off keys", func(t *testing.T) {
		k := NewKeyLimiter(1, 5, 64)
		hot := []byte("hot")
		for range 5 {
			k.Allow(hot, t0)
		}
		// One-off keys pass through while the hot key keeps sending: its empty bucket
		// must be remembered, or it would get a fresh burst.
		for i := range 1000 {
			k.Allow([]byte("cold-"+strconv.Itoa(i)), t0)
			if ok, _ := k.Allow(hot, t0); ok {
				t.Fatalf("the hot key got a fresh burst after %d cold keys: it was forgotten", i)
			}
		}
	})
	t.Run("refilled buckets are forgotten first", func(t *testing.T) {
		k := NewKeyLimiter(1, 1, 1)
		k.Allow([]byte("a"), t0)
		// a's bucket is full again 1s later: replacing it loses nothing.
		k.Allow([]byte("b"), t0.Add(2*time.Second))
		if ok, _ := k.Allow([]byte("a"), t0.Add(2*time.Second)); !ok {
			t.Fatal("a forgotten key did not start with a full bucket")
		}
	})
	t.Run("concurrent keys", func(t *testing.T) {
		k := NewKeyLimiter(1, 1, 16)
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 500 {
					k.Allow([]byte(strconv.Itoa(g*1000+i%40)), t0)
				}
			}()
		}
		wg.Wait()
		if k.Len() > 16 {
			t.Fatalf("%d keys tracked, bound 16", k.Len())
		}
	})
}
