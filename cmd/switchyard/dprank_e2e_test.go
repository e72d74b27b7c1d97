package main

import (
	"context"
	"encoding/json"
	"testing"

	"switchyard/bench/mockengine"
	"switchyard/config"
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
