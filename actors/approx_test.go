package actors

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/config"
	"switchyard/kv"
	"switchyard/kv/approx"
)

func approxSeq(from, n int) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = uint32(from + i)
	}
	return s
}

// TestApproxShardsServeTheTree: the approximate tree on shard actors answers lookups after
// the writes posted before them, from any goroutine, and refuses everything once closed.
func TestApproxShardsServeTheTree(t *testing.T) {
	var host *ApproxShards
	x, err := approx.New(approx.Config{Shards: 3, MaxTreeSize: 1 << 16,
		Host: func(shards []*approx.Shard) (approx.Host, error) {
			h, err := NewApproxShards(shards, IndexOptions{Mailbox: 64})
			host = h
			return h, err
		}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	for g := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 50 {
				seq := approxSeq((g*100+i)*1000, 80)
				x.Record("m", fmt.Sprint("w", g), seq)
				var l kv.Lookup
				if err := x.Lookup(context.Background(), "m", seq, &l); err != nil || l.Tokens(fmt.Sprint("w", g)) != 80 {
					t.Errorf("lookup right after its record: %v %v", l.Matches, err)
					return
				}
			}
		}()
	}
	for range 4 {
		<-done
	}
	if st := x.Stats(); st.Recorded != 200 || st.Symbols != 200*80 {
		t.Errorf("stats %+v, want 200 recorded, %d symbols", st, 200*80)
	}
	x.RemoveWorker("w0")
	var l kv.Lookup
	if err := x.Lookup(context.Background(), "m", approxSeq(0, 80), &l); err != nil || len(l.Matches) != 0 {
		t.Errorf("after the removal: %v %v", l.Matches, err)
	}
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	if err := host.Post(0, &approx.OpEvict{}); !errors.Is(err, ErrIndexClosed) {
		t.Errorf("Post after Close: %v", err)
	}
	if err := host.Ask(context.Background(), 0, &approx.Query{}); !errors.Is(err, ErrIndexClosed) {
		t.Errorf("Ask after Close: %v", err)
	}
}

// TestCacheStateApproximate: cache_aware.source approximate builds the tree on actors,
// records dispatches, and Run returns when its context ends.
func TestCacheStateApproximate(t *testing.T) {
	cfg := config.Default()
	cfg.CacheAware.Source = config.CacheSourceApproximate
	cfg.KV.Shards = 2
	cs, err := NewCacheState(cfg, CacheOptions{Metrics: metrics.NewSet()})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if cs.Approximate() == nil || cs.Index() != nil || cs.Source() != kv.CacheSource(cs.Approximate()) {
		t.Fatal("the approximate source was not built as the cache source")
	}
	memo := kv.NewPrefixMemo("m", approxSeq(0, 100))
	cs.Record(memo, "w1")
	cs.Record(nil, "w1") // no lookup made: nothing to record
	memo = kv.NewPrefixMemo("m", approxSeq(0, 120))
	// A deadline of its own: without one the lookup is bounded by cache_aware.query_timeout
	// (100 ms), which a loaded machine can spend before the shard actors run.
	lookupCtx, cancelLookup := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelLookup()
	if r := cs.Resolve(lookupCtx, memo); r.Err != nil || r.MatchedTokens("w1") != 100 || r.QueryTokens() != 120 {
		t.Fatalf("lookup = %+v", r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- cs.Run(ctx) }()
	cancel()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
}
