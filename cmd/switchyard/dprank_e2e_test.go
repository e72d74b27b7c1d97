package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"switchyard/bench/mockengine"
	"switchyard/config"
	"switchyard/kv"
)

// TestDPRankDispatchEndToEnd: with dp_dispatch on, the router sends data_parallel_rank to a
// mock engine of two ranks; the engine serves each request on the rank it was sent (its
// meta_info says which) and the router shares the requests between the ranks.
func TestDPRankDispatchEndToEnd(t *testing.T) {
	e, err := mockengine.Start(context.Background(), mockengine.Config{
		WorkerID: "DP", Model: affModel, ZeroCost: true, DPSize: 2,
		KVEvents: mockengine.KVEvents{Disabled: true}, LoadPublish: mockengine.LoadPublish{Disabled: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	cfg := hashConfig([]*mockengine.Engine{e}, config.PolicyRoundRobin)
	cfg.Workers[0].DPSize = 2
	cfg.DPDispatch.Enabled = true
	_, base := startRouter(t, cfg)
	// One request straight to the engine moves its own round robin to rank 1: the ranks
	// below are the router's only if they start at rank 0.
	generate(t, e.URL(), 99)
	var order []int
	for i := range 20 {
		order = append(order, generate(t, base, i))
	}
	for i, r := range order {
		if r != i%2 {
			t.Fatalf("ranks %v, want the router's alternation from rank 0", order)
		}
	}
}

// generate sends one /generate request to base and returns the rank that served it.
func generate(t *testing.T, base string, i int) int {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": affModel, "input_ids": []int{1, 2, 3, i}, "sampling_params": map[string]any{"max_new_tokens": 2}})
	_, raw := postOK(t, base+"/generate", string(body))
	var out struct {
		MetaInfo struct {
			DPRank *int `json:"dp_rank"`
		} `json:"meta_info"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || out.MetaInfo.DPRank == nil {
		t.Fatalf("no dp_rank in %s: %v", raw, err)
	}
	return *out.MetaInfo.DPRank
}

// TestDPRankPrefixEndToEnd: a cache_aware router with rank dispatch in front of a mock engine
// of two data-parallel ranks whose ranks hold different prefixes (one prompt prefilled on
// rank 1, another on rank 0, each rank publishing its own KV events): a request continuing
// either prompt goes to the rank holding it, whatever the rotation of load alone would say;
// the lookup (kv.Lookup) names that rank, from the router's own index and from a
// `switchyard indexer`.
func TestDPRankPrefixEndToEnd(t *testing.T) {
	for _, source := range []string{config.CacheSourceLocal, config.CacheSourceRemote} {
		t.Run(source, func(t *testing.T) { dpRankPrefix(t, source) })
	}
}

// dpRankPrefix is TestDPRankPrefixEndToEnd with the index in the router (local) or in
// `switchyard indexer` (remote: the ranks travel in its answers).
func dpRankPrefix(t *testing.T, source string) {
	e, err := mockengine.Start(context.Background(), mockengine.Config{
		WorkerID: "DP", Model: cacheModel, ZeroCost: true, DPSize: 2,
		KVEvents: mockengine.KVEvents{Replay: true}, LoadPublish: mockengine.LoadPublish{Disabled: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	cfg := cacheRouterConfig([]*mockengine.Engine{e})
	cfg.Workers[0].DPSize = 2
	cfg.CacheAware.MinLoadChoices = 2
	cfg.DPDispatch.Enabled = true
	if source == config.CacheSourceRemote {
		cfg.CacheAware.Source = config.CacheSourceRemote
		cfg.CacheAware.RemoteURL = startIndexer(t, []*mockengine.Engine{e})
		cfg.CacheAware.QueryTimeout = 2 * time.Second // generous under -race on a shared machine
	}
	r := startCacheRouter(t, cfg)
	env := &cacheEnv{routers: []*cacheRouter{r}, engines: map[string]*mockengine.Engine{"DP": e}}
	prompt := func(seed uint32) []int {
		out := make([]int, 256)
		for i := range out {
			out[i] = int(seed*1000) + i
		}
		return out
	}
	ids := func(p []int) []uint32 {
		out := make([]uint32, len(p))
		for i, v := range p {
			out[i] = uint32(v)
		}
		return out
	}
	ranksOf := func(p []int) uint64 {
		var l kv.Lookup
		if err := r.srv.Cache().Source().Lookup(context.Background(), cacheModel, ids(p), &l); err != nil {
			return 0
		}
		return l.Ranks("DP")
	}
	// Each rank publishes on a subscription of its own, which misses what was published
	// before it joined: warm each up until a prompt prefilled on the rank reaches the index.
	for rank := range 2 {
		seed := uint32(100 + 10*rank)
		waitFor(t, fmt.Sprintf("rank %d's KV events reach the index", rank), func() (bool, string) {
			seed++
			w := prompt(seed)
			generateRank(t, e.URL(), w, rank)
			for range 40 {
				if ranksOf(w) == kv.RankBit(rank) {
					return true, ""
				}
				pause(5 * time.Millisecond)
			}
			return false, fmt.Sprintf("warm-up prompt %d not indexed", seed)
		})
	}
	a, b := prompt(7), prompt(9)
	// Prefilled straight on the engine: a on rank 1, b on rank 0.
	if got := generateRank(t, e.URL(), a, 1); got != 1 {
		t.Fatalf("the engine served the rank-1 request on rank %d", got)
	}
	if got := generateRank(t, e.URL(), b, 0); got != 0 {
		t.Fatalf("the engine served the rank-0 request on rank %d", got)
	}
	for _, p := range [][]int{a, b} {
		env.waitHeld(t, "DP", ids(p), "the index learns the prompt", func(n int64) bool { return n >= int64(len(p))-16 })
	}
	var l kv.Lookup
	if err := r.srv.Cache().Source().Lookup(context.Background(), cacheModel, ids(a), &l); err != nil || len(l.Matches) != 1 || l.Matches[0].Ranks != 1<<1 {
		t.Fatalf("lookup of a: %+v %v, want rank 1 named", l.Matches, err)
	}
	// Through the router, continuations of each prompt, interleaved: each goes to its holder.
	var got, want []int
	for i, c := range []struct {
		p    []int
		rank int
	}{{a, 1}, {a, 1}, {b, 0}, {a, 1}, {b, 0}, {b, 0}} {
		got = append(got, generateRank(t, r.base, append(slices.Clone(c.p), 90000+i), -1))
		want = append(want, c.rank)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("ranks %v, want each prompt's holder %v", got, want)
	}
}

// generateRank sends /generate with input_ids ids to base, naming data_parallel_rank when
// rank >= 0, and returns the rank that served it.
func generateRank(t *testing.T, base string, ids []int, rank int) int {
	t.Helper()
	req := map[string]any{"model": cacheModel, "input_ids": ids, "sampling_params": map[string]any{"max_new_tokens": 1}}
	if rank >= 0 {
		req["data_parallel_rank"] = rank
	}
	body, _ := json.Marshal(req)
	_, raw := postOK(t, base+"/generate", string(body))
	var out struct {
		MetaInfo struct {
			DPRank *int `json:"dp_rank"`
		} `json:"meta_info"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || out.MetaInfo.DPRank == nil {
		t.Fatalf("no dp_rank in %s: %v", raw, err)
	}
	return *out.MetaInfo.DPRank
}
