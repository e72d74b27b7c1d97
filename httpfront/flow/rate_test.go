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

// TestKeyLimiterKnownKeysTakeNoLock: a key already in the table is found, charged and
// refunded without its shard's lock: every request of known keys completes while every
// shard's lock is held.
func TestKeyLimiterKnownKeysTakeNoLock(t *testing.T) {
	k := NewKeyLimiter(1, 3, 1000)
	keys := make([][]byte, 200)
	for i := range keys {
		keys[i] = []byte("sk-" + strconv.Itoa(i))
		if ok, _ := k.Allow(keys[i], t0); !ok {
			t.Fatalf("key %d refused its first request", i)
		}
	}
	for i := range k.shards {
		k.shards[i].mu.Lock()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, key := range keys {
			k.Allow(key, t0) // the second of the burst of 3
			k.refund(key)    // given back
			k.Allow(key, t0)
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Error("a known key's request waited for its shard's lock")
	}
	for i := range k.shards {
		k.shards[i].mu.Unlock()
	}
	<-done
	for i, key := range keys {
		// 1 + 1 - 1 + 1 = 2 tokens of the burst of 3 taken: one is left, and no key was
		// forgotten (a forgotten key would start with a full bucket again).
		if ok, _ := k.Allow(key, t0); !ok {
			t.Fatalf("key %d: its third token refused", i)
		}
		if ok, _ := k.Allow(key, t0); ok {
			t.Fatalf("key %d got a fourth token of a burst of 3", i)
		}
	}
}

// TestKeyLimiterTableConsistent: through a churn of keys in small tables (keys forgotten
// and added, entries moved back into the holes), each shard's table holds exactly its
// entries, each found from its home slot.
func TestKeyLimiterTableConsistent(t *testing.T) {
	for _, maxKeys := range []int{1, 2, 7, 64, 200} {
		k := NewKeyLimiter(1, 1, maxKeys)
		for i := range 20_000 {
			// Some keys come back (kept or forgotten), most pass once.
			k.Allow([]byte("key-"+strconv.Itoa(i%(3*maxKeys+5))+"-"+strconv.Itoa(i%7)), t0.Add(time.Duration(i)*time.Millisecond))
			if i%997 != 0 && i != 19_999 {
				continue
			}
			for s := range k.shards {
				sh := &k.shards[s]
				held := 0
				for j := range sh.table {
					if sh.table[j].Load() != nil {
						held++
					}
				}
				if held != len(sh.entries) || len(sh.entries) > sh.cap {
					t.Fatalf("max %d, step %d, shard %d: %d slots used for %d entries (cap %d)", maxKeys, i, s, held, len(sh.entries), sh.cap)
				}
				for _, e := range sh.entries {
					if sh.find(e.key) != e {
						t.Fatalf("max %d, step %d, shard %d: an entry is not found from its home", maxKeys, i, s)
					}
				}
			}
		}
	}
}
