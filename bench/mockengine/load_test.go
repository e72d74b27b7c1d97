package mockengine

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"switchyard/load"
)

func getLoads(t *testing.T, e *Engine) []load.RankReport {
	t.Helper()
	r := do(t, newClient(t), "GET", e.URL()+"/v1/loads", nil)
	if r.status != 200 {
		t.Fatalf("/v1/loads: %d %s", r.status, r.body)
	}
	reps, err := load.DecodeLoads(r.body, time.Now())
	if err != nil {
		t.Fatalf("DecodeLoads: %v: %s", err, r.body)
	}
	return reps
}

func getLoad(t *testing.T, e *Engine) []load.RankReport {
	t.Helper()
	r := do(t, newClient(t), "GET", e.URL()+"/get_load", nil)
	if r.status != 200 {
		t.Fatalf("/get_load: %d %s", r.status, r.body)
	}
	reps, err := load.DecodeGetLoad(r.body, time.Now())
	if err != nil {
		t.Fatalf("DecodeGetLoad: %v: %s", err, r.body)
	}
	return reps
}

// waitLoad polls /v1/loads until cond holds.
func waitLoad(t *testing.T, e *Engine, what string, cond func(load.RankReport) bool) load.RankReport {
	t.Helper()
	var rep load.RankReport
	poll(t, what, func() bool {
		rep = getLoads(t, e)[0]
		return cond(rep)
	})
	return rep
}

// TestLoadTracksQueueDepth freezes the engine's clock while six requests arrive at an
// engine that runs two at a time, checks the reported queue, then lets the simulation run.
func TestLoadTracksQueueDepth(t *testing.T) {
	clk := NewManualClock(time.Unix(1_800_000_000, 0))
	e := startEngine(t, Config{Clock: clk, MaxRunning: 2, PageSize: 16, LoadPublish: LoadPublish{Disabled: true}})
	c := newClient(t)
	const n, promptLen = 6, 100
	var wg sync.WaitGroup
	results := make([]map[string]any, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := tryDo(c, "POST", e.URL()+"/generate", map[string]any{
				"input_ids": ids(10_000*(i+1), promptLen), "sampling_params": map[string]any{"max_new_tokens": 3},
			})
			if err == nil && r.status == 200 {
				_ = json.Unmarshal(r.body, &results[i])
			}
		}()
	}
	// Nothing completes while the clock stands still. The scheduler admits the first requests
	// when it wakes for their arrival: until then all six may be waiting.
	rep := waitLoad(t, e, "six requests, some admitted", func(r load.RankReport) bool {
		return r.Running+r.Waiting == n && r.Running > 0
	})
	if rep.Running < 1 || rep.Running > 2 || rep.Waiting < 4 {
		t.Fatalf("running %d, waiting %d: want at most 2 running and the rest waiting", rep.Running, rep.Waiting)
	}
	if rep.WaitingUncachedTokens != rep.Waiting*promptLen {
		t.Errorf("num_waiting_uncached_tokens = %d, want %d", rep.WaitingUncachedTokens, rep.Waiting*promptLen)
	}
	if rep.MaxRunningRequests != 2 || rep.MaxTotalTokens != int64(e.Config().CacheTokens) {
		t.Errorf("max_running_requests %d, max_total_num_tokens %d", rep.MaxRunningRequests, rep.MaxTotalTokens)
	}
	if rep.UsedTokens <= 0 || rep.UsedTokens > rep.TotalTokens {
		t.Errorf("num_used_tokens %d, num_total_tokens %d: want 0 < used <= total", rep.UsedTokens, rep.TotalTokens)
	}
	legacy := getLoad(t, e)[0]
	if legacy.Running+legacy.Waiting != n || legacy.Waiting != rep.Waiting {
		t.Errorf("/get_load: running %d waiting %d, want %d in all and %d waiting", legacy.Running, legacy.Waiting, n, rep.Waiting)
	}

	runClock(t, clk)
	wg.Wait()
	queued := 0
	for i, m := range results {
		if m == nil {
			t.Fatalf("request %d failed", i)
		}
		if path(t, m, "meta_info", "queue_time").(float64) > 0 {
			queued++
		}
	}
	if queued < n-2 {
		t.Errorf("%d requests queued before running, want at least %d", queued, n-2)
	}
	rep = getLoads(t, e)[0]
	if rep.Running != 0 || rep.Waiting != 0 || rep.WaitingUncachedTokens != 0 {
		t.Errorf("after the burst: running %d, waiting %d, waiting uncached %d", rep.Running, rep.Waiting, rep.WaitingUncachedTokens)
	}
	if !rep.HasCounters || rep.TotalPrefillUncached != n*promptLen || rep.TotalPrefillBusyUs <= 0 {
		t.Errorf("prefill counters: uncached %d (want %d), busy %dµs", rep.TotalPrefillUncached, n*promptLen, rep.TotalPrefillBusyUs)
	}
	if rep.UsedTokens != 0 || rep.TotalTokens == 0 {
		t.Errorf("idle engine: num_used_tokens %d (want 0: the cache is evictable), num_total_tokens %d", rep.UsedTokens, rep.TotalTokens)
	}
}

// TestLoadGauge reads the ZMQ load gauge with the load package's decoder while requests
// queue behind a long prefill.
func TestLoadGauge(t *testing.T) {
	for _, basic := range []bool{false, true} {
		name := "extended"
		if basic {
			name = "basic"
		}
		t.Run(name, func(t *testing.T) {
			// One second of simulated prefill per token: the first request blocks the others.
			e := startEngine(t, Config{MaxRunning: 1, DPSize: 2, Costs: &Costs{PrefillPerToken: time.Second, DecodeStep: time.Millisecond},
				LoadPublish: LoadPublish{Interval: 10 * time.Millisecond, Basic: basic}})
			c := newClient(t)
			sub := dialSub(t, e.LoadEndpoint(1), "load")
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			t.Cleanup(func() {
				cancel()
				_ = e.Close() // fails the stuck requests
				wg.Wait()
			})
			for range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req, _ := newRequest(ctx, e.URL()+"/generate", map[string]any{"text": "hello", "data_parallel_rank": 1})
					if resp, err := c.Do(req); err == nil {
						resp.Body.Close()
					}
				}()
			}
			deadline := time.Now().Add(testDeadline)
			var last uint64
			for first := true; ; first = false {
				m := sub.next(t)
				if len(m.Frames) != 3 || string(m.Frames[0]) != "load" || len(m.Frames[1]) != 8 {
					t.Fatalf("bad gauge frames %q", m.Frames)
				}
				seq := beUint64(m.Frames[1])
				if !first && seq != last+1 {
					t.Fatalf("gauge seq %d after %d", seq, last)
				}
				last = seq
				rep, err := load.DecodeGauge(m.Frames[2], time.Now())
				if err != nil {
					t.Fatal(err)
				}
				if rep.DPRank != 1 || rep.MaxTotalTokens != int64(e.Config().CacheTokens) || rep.HasCounters == basic {
					t.Fatalf("gauge %+v", rep)
				}
				if rep.Running == 1 && rep.Waiting == 2 {
					if !basic && rep.WaitingUncachedTokens == 0 {
						t.Fatalf("extended gauge without waiting uncached tokens: %+v", rep)
					}
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("gauge never showed 1 running and 2 waiting; last %+v", rep)
				}
			}
		})
	}
}
