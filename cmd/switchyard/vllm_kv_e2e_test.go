package main

import (
	"context"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"switchyard/bench/mockengine"
	"switchyard/config"
	"switchyard/kv/subscribe"
)

// End-to-end tests of the router's KV subscriptions against vLLM-format publishers (the mock
// engine's KVEvents.Format "vllm"): block hashes the router cannot reproduce, per-rank
// topics and publishers, 0 as a first parent, extra trailing elements, the current replay
// layout, a late joiner, and a publisher that dials the router's bound SUB.

// startVLLMEngine starts a mock engine publishing as vLLM with dp DP ranks.
func startVLLMEngine(t *testing.T, id string, dp int, kve mockengine.KVEvents) *mockengine.Engine {
	t.Helper()
	kve.Format = mockengine.KVFormatVLLM
	e, err := mockengine.Start(context.Background(), mockengine.Config{
		WorkerID: id, Model: cacheModel, CacheTokens: 8192, DPSize: dp, ZeroCost: true,
		KVEvents: kve, LoadPublish: mockengine.LoadPublish{Disabled: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// vllmRouterConfig is a cache_aware router in front of workers, declared as a vLLM fleet is:
// endpoints, replay and DP size from configuration.
func vllmRouterConfig(workers ...config.Worker) *config.Config {
	cfg := config.Default()
	cfg.Server.Host = "127.0.0.1"
	cfg.Server.DrainTimeout = 5 * time.Second
	cfg.KV.ReconnectBackoff = 20 * time.Millisecond
	cfg.CacheAware.MinMatchedTokens = cacheMinMatched
	cfg.CacheAware.QueryTimeout = cacheQueryTimeout
	cfg.Workers = workers
	policy := config.Policy{Type: config.PolicyCacheAware}
	cfg.Models = map[string]config.Model{cacheModel: {Buckets: []config.Bucket{{ID: "all", Groups: config.Groups{Plain: &config.Group{Policy: &policy}}}}}}
	return cfg
}

// publisherStatus is the router's subscription state of worker's rank.
func publisherStatus(r *cacheRouter, worker string, rank int) (subscribe.PublisherStatus, bool) {
	for _, w := range r.srv.Cache().Manager().Status() {
		if w.ID != worker {
			continue
		}
		for _, p := range w.Publishers {
			if p.Rank == rank {
				return p, true
			}
		}
	}
	return subscribe.PublisherStatus{}, false
}

// TestVLLMPublisherWithDPRanksAndReplay: a vLLM-format engine with two DP ranks, whose
// endpoints, replay socket and DP size come from configuration: both ranks' blocks are
// re-keyed into the index under the one worker, and a gap is repaired by a replay in the
// current layout (topic frame, end marker seq 2^64-1).
func TestVLLMPublisherWithDPRanksAndReplay(t *testing.T) {
	e := startVLLMEngine(t, "V", 2, mockengine.KVEvents{Replay: true})
	r := startCacheRouter(t, vllmRouterConfig(config.Worker{
		ID: "V", URL: e.URL(), Model: cacheModel, Role: config.RolePlain, DPSize: 2,
		KVEvents: e.KVEventsEndpoint(0), KVReplay: e.ReplayEndpoint(0), KVHashScheme: config.KVHashAuto,
	}))
	env := &cacheEnv{routers: []*cacheRouter{r}, kvMetrics: r.base + "/metrics"}
	waitFor(t, "both ranks subscribed", func() (bool, string) {
		p0, _ := publisherStatus(r, "V", 0)
		p1, _ := publisherStatus(r, "V", 1)
		return p0.Connected && p1.Connected, "not yet"
	})
	// The engine hands requests to its ranks in turn: two prompts, one per rank. The
	// subscription may join a moment after connecting, so repeat until the index has both.
	// New prompts each round: a prompt an engine already cached publishes nothing.
	round := 0
	waitFor(t, "both ranks' prompts indexed", func() (bool, string) {
		round++
		held := 0
		for _, p := range []string{cachePrefix("rank-a" + strconv.Itoa(round)), cachePrefix("rank-b" + strconv.Itoa(round))} {
			chatEngine(t, e, p, "q")
			if env.held("V", promptIDs(t, cacheMessages(p, "q"))) >= cacheMinMatched {
				held++
			}
		}
		return held == 2, strconv.Itoa(held) + " of 2 held"
	})
	for rank := range 2 {
		if p, _ := publisherStatus(r, "V", rank); p.Received == 0 {
			t.Fatalf("rank %d: nothing received", rank)
		}
	}
	// Once per rank's subscription (the worker lifecycle's introspection finds nothing new
	// and keeps them running).
	if n := env.routerMetric(t, `switchyard_kv_hash_mismatches_total`); n < 2 {
		t.Fatalf("hash mismatches %v, want at least 2 (vLLM hashes detected on each rank's subscription)", n)
	}
	// Detecting them on one rank must not clear what the other rank had re-keyed.
	if n := env.routerMetric(t, `switchyard_kv_owner_clears_total{reason="rekey"}`); n != 0 {
		t.Fatalf("%v owners cleared on detecting vLLM hashes, want 0 (nothing was keyed by them)", n)
	}
	// A gap: the engine withholds its batches for a while (they keep their sequence
	// numbers and stay in the replay buffer), then publishes again.
	if err := e.SetFaults(mockengine.Faults{StopEvents: true}); err != nil {
		t.Fatal(err)
	}
	lost := cachePrefix("withheld")
	chatEngine(t, e, lost, "q")
	chatEngine(t, e, lost, "q") // both ranks
	if err := e.SetFaults(mockengine.Faults{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the withheld prompt replayed", func() (bool, string) {
		round++
		chatEngine(t, e, cachePrefix("after"+strconv.Itoa(round)), "q") // a live batch reveals the gap
		n := env.held("V", promptIDs(t, cacheMessages(lost, "q")))
		return n >= cacheMinMatched, strconv.FormatInt(n, 10) + " tokens held"
	})
	// The replayed batches are applied before the end marker is read and the replay counted.
	waitFor(t, "the replay counted", func() (bool, string) {
		ok := env.routerMetric(t, seriesReplayed)
		return ok >= 1, "no replay counted"
	})
	if fail := env.routerMetric(t, `switchyard_kv_replays_total{result="failed"}`); fail != 0 {
		t.Fatalf("%v replays failed", fail)
	}
	if n := env.routerMetric(t, seriesClearGap); n != 0 {
		t.Fatalf("%v ranks cleared for a gap the replay filled", n)
	}
}

// TestVLLMLateJoiner: the router starts after the engine cached a conversation; the next
// turn's events have parents the router never saw. They must not enter the index under the
// engine's own hashes (a lookup of that conversation finds nothing), and a new conversation
// is indexed once seen.
func TestVLLMLateJoiner(t *testing.T) {
	e := startVLLMEngine(t, "L", 1, mockengine.KVEvents{})
	early := cachePrefix("early")
	chatEngine(t, e, early, "turn one")
	r := startCacheRouter(t, vllmRouterConfig(config.Worker{
		ID: "L", URL: e.URL(), Model: cacheModel, Role: config.RolePlain, DPSize: 1, KVEvents: e.KVEventsEndpoint(0),
	}))
	env := &cacheEnv{routers: []*cacheRouter{r}, kvMetrics: r.base + "/metrics"}
	waitFor(t, "subscribed", func() (bool, string) {
		p, _ := publisherStatus(r, "L", 0)
		return p.Connected, "not connected"
	})
	second := cacheMessages(early, "turn one")
	second = append(second, cacheMessage{Role: "assistant", Content: "an answer"}, cacheMessage{Role: "user", Content: "turn two"})
	// Each round extends the early conversation (parents the router never saw) and starts a
	// new one: what is published before the subscription is live is lost, and a prompt
	// the engine already cached publishes nothing.
	round := 0
	waitFor(t, "a fresh conversation indexed", func() (bool, string) {
		round++
		turn := append(slices.Clone(second), cacheMessage{Role: "assistant", Content: "more"},
			cacheMessage{Role: "user", Content: "turn " + strconv.Itoa(round+2)})
		chatEngineMsgs(t, e, turn)
		fresh := cachePrefix("fresh" + strconv.Itoa(round))
		chatEngine(t, e, fresh, "q")
		n := env.held("L", promptIDs(t, cacheMessages(fresh, "q")))
		return n >= cacheMinMatched, strconv.FormatInt(n, 10) + " tokens held"
	})
	if n := env.held("L", promptIDs(t, second)); n != 0 {
		t.Fatalf("the late-joined conversation holds %d tokens in the index, want 0", n)
	}
}

// TestVLLMPublisherDialsBoundSub: a vLLM-format engine that dials the router's bound SUB
// (kv.bind_endpoint) is identified by its topic kv@host:port@model and re-keyed.
func TestVLLMPublisherDialsBoundSub(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a port for kv.bind_endpoint, which takes no 0
	if err != nil {
		t.Fatal(err)
	}
	bind := "tcp://" + ln.Addr().String()
	_ = ln.Close() // the router binds it; the engine dials it until then
	e := startVLLMEngine(t, "B", 1, mockengine.KVEvents{Connect: bind})
	cfg := vllmRouterConfig(config.Worker{ID: "B", URL: e.URL(), Model: cacheModel, Role: config.RolePlain, DPSize: 1})
	cfg.KV.BindEndpoint = bind
	r := startCacheRouter(t, cfg)
	env := &cacheEnv{routers: []*cacheRouter{r}, kvMetrics: r.base + "/metrics"}
	// Each round caches a new prompt: what is published before the engine's connection is
	// up is lost, as it is for a real PUB.
	var p string
	round := 0
	waitFor(t, "the bound engine's prompt indexed", func() (bool, string) {
		round++
		p = cachePrefix("bound" + strconv.Itoa(round))
		chatEngine(t, e, p, "q")
		n := env.held("B", promptIDs(t, cacheMessages(p, "q")))
		return n >= cacheMinMatched, strconv.FormatInt(n, 10) + " tokens held"
	})
	if got := chatRouter(t, r, p, "another question"); got.worker != "B" || got.cached < cacheMinMatched {
		t.Fatalf("served by %s with %d cached tokens", got.worker, got.cached)
	}
	if n := env.routerMetric(t, `switchyard_kv_event_batches_total{result="unknown_engine"}`); n != 0 {
		t.Fatalf("%v batches of an unknown engine", n)
	}
}
