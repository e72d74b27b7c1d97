package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"switchyard/bench/mockengine"
	"switchyard/config"
	"switchyard/httpfront"
	"switchyard/kv"
	"switchyard/load"
	"switchyard/tokenizer"
)

// End-to-end tests of cache_aware: the real router (httpfront.New and Run) in front of
// in-process mock engines that publish real KV events over ZMQ, with the index in the router
// (this file) or in `switchyard indexer` shared by two routers (indexer_e2e_test.go).

const (
	cacheModel = "switchyard-mock"
	// cacheMinMatched is cache_aware.min_matched_tokens in these tests: small, so that
	// prompts stay short.
	cacheMinMatched = 128
	// cacheQueueLimit is cache_aware.worker_queue_limit, the soft gate.
	cacheQueueLimit = 2
	// cacheWait bounds every wait on observable state.
	cacheWait = 15 * time.Second
	// cacheQueryTimeout is cache_aware.query_timeout in these tests. A lookup past it routes
	// as a miss; the default 100 ms passes on a loaded machine before the index's shard
	// actors run, and a check of a hit then sees the miss.
	cacheQueryTimeout = 10 * time.Second
)

// startCacheEngines starts n mock engines E0..En-1 with KV events and a replay socket, a
// 2,048-token cache (so that a few prompts evict older ones), one running request at a time
// (so that a queue forms) and costs that answer a one-token request in a few milliseconds but
// take 200 ms per decode step (so that a longer request holds the engine).
func startCacheEngines(t *testing.T, n int) []*mockengine.Engine {
	t.Helper()
	out := make([]*mockengine.Engine, n)
	for i := range out {
		costs := mockengine.Costs{PrefillOverhead: time.Millisecond, PrefillPerToken: 5 * time.Microsecond, DecodeStep: 200 * time.Millisecond}
		e, err := mockengine.Start(context.Background(), mockengine.Config{
			WorkerID: "E" + strconv.Itoa(i), Model: cacheModel, CacheTokens: 2048, MaxRunning: 1, Costs: &costs,
			KVEvents: mockengine.KVEvents{Replay: true}, LoadPublish: mockengine.LoadPublish{Disabled: true},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		out[i] = e
	}
	return out
}

// cacheRouterConfig is a router in front of engines, one plain bucket whose group runs
// cache_aware. The workers name no kv_events endpoint: the router (or the indexer)
// discovers each engine's publisher and replay socket through /server_info.
func cacheRouterConfig(engines []*mockengine.Engine) *config.Config {
	cfg := config.Default()
	cfg.Server.Host = "127.0.0.1"
	cfg.Server.DrainTimeout = 5 * time.Second
	cfg.Load.PollInterval = 50 * time.Millisecond
	cfg.KV.ReconnectBackoff = 20 * time.Millisecond
	// The tests check the threshold decision's rules: the minimum hit and the soft gate.
	cfg.CacheAware.Decision = config.CacheDecisionThreshold
	cfg.CacheAware.MinMatchedTokens = cacheMinMatched
	cfg.CacheAware.WorkerQueueLimit = cacheQueueLimit
	cfg.CacheAware.MinLoadChoices = len(engines) // the exact minimum on a miss
	cfg.CacheAware.QueryTimeout = cacheQueryTimeout
	for _, e := range engines {
		cfg.Workers = append(cfg.Workers, config.Worker{ID: e.WorkerID(), URL: e.URL(), Model: cacheModel, Role: config.RolePlain, DPSize: 1})
	}
	policy := config.Policy{Type: config.PolicyCacheAware}
	cfg.Models = map[string]config.Model{cacheModel: {Buckets: []config.Bucket{{ID: "all", Groups: config.Groups{Plain: &config.Group{Policy: &policy}}}}}}
	return cfg
}

// cacheRouter is one running router.
type cacheRouter struct {
	base  string
	srv   *httpfront.Server
	loads *load.Table
}

// startCacheRouter validates cfg, starts the router with no tokenizer configured (so the
// built-in one, which the mock engines use, counts and hashes prompts), waits until it is
// ready and stops it when the test ends.
func startCacheRouter(t *testing.T, cfg *config.Config) *cacheRouter {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &cacheRouter{base: "http://" + ln.Addr().String(), loads: load.NewTable()}
	r.srv, err = httpfront.New(cfg, httpfront.Options{Listener: ln, SkipStartupChecks: true, Seed: 1, Loads: r.loads})
	if err != nil {
		_ = ln.Close()
		t.Fatal(err)
	}
	if r.srv.Cache() == nil {
		t.Fatal("a cache_aware router has no cache state")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("router stopped with %v", err)
		}
	})
	waitFor(t, "router ready", func() (bool, string) {
		status, _, err := httpGet(r.base + "/readiness")
		return err == nil && status == http.StatusOK, fmt.Sprintf("status %d, %v", status, err)
	})
	return r
}

// cacheEnv is one deployment under test: the routers and where the index's metrics are.
type cacheEnv struct {
	routers []*cacheRouter
	// kvMetrics is the /metrics URL of the process holding the index (its switchyard_kv_*).
	kvMetrics string
	engines   map[string]*mockengine.Engine
	// warmups counts warmSubscription calls; checks run one at a time.
	warmups int
}

// router returns the i-th router, cycling: with two routers, consecutive requests of a
// check go through different routers.
func (e *cacheEnv) router(i int) *cacheRouter { return e.routers[i%len(e.routers)] }

// held returns how many leading tokens of ids the index says worker holds, asked through
// the prefix source the routers read (their index, or the indexer); -1 when unavailable.
func (e *cacheEnv) held(worker string, ids []uint32) int64 {
	var l kv.Lookup
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := e.routers[0].srv.Cache().Source().Lookup(ctx, cacheModel, ids, &l); err != nil {
		return -1
	}
	return l.Tokens(worker)
}

// waitHeld waits until the index's answer for worker and ids satisfies ok.
func (e *cacheEnv) waitHeld(t *testing.T, worker string, ids []uint32, what string, ok func(int64) bool) {
	t.Helper()
	waitFor(t, what, func() (bool, string) {
		n := e.held(worker, ids)
		return n >= 0 && ok(n), fmt.Sprintf("%s holds %d of %d tokens", worker, n, len(ids))
	})
}

// routerMetric sums a series over every router's /metrics.
func (e *cacheEnv) routerMetric(t *testing.T, series string) float64 {
	t.Helper()
	sum := 0.0
	for _, r := range e.routers {
		sum += metricValue(t, r.base+"/metrics", series)
	}
	return sum
}

// waitLoads waits until every router's load table satisfies ok for every engine.
func (e *cacheEnv) waitLoads(t *testing.T, what string, ok func(id string, o load.Observation) bool) {
	t.Helper()
	waitFor(t, what, func() (bool, string) {
		var last string
		for _, r := range e.routers {
			snap := r.loads.Load()
			for id := range e.engines {
				o := snap.Observe(id, time.Now())
				if !ok(id, o) {
					last = fmt.Sprintf("%s: waiting %d (fields %b)", id, o.Waiting, o.Fields)
					return false, last
				}
			}
		}
		return true, last
	})
}

// Series the checks read.
const (
	seriesCandidate = `switchyard_cache_aware_decisions_total{outcome="cache_candidate"}`
	seriesFallback  = `switchyard_cache_aware_decisions_total{outcome="cache_miss_fallback"}`
	seriesQueued    = `switchyard_cache_aware_fallbacks_total{reason="holders_queued"}`
	seriesRemoteOK  = `switchyard_kv_lookups_total{source="remote",outcome="ok"}`
	seriesGaps      = `switchyard_kv_sequence_gaps_total`
	seriesReplayed  = `switchyard_kv_replays_total{result="ok"}`
	seriesClearGap  = `switchyard_kv_owner_clears_total{reason="gap"}`
	seriesClearRst  = `switchyard_kv_owner_clears_total{reason="restart"}`
	seriesClearRec  = `switchyard_kv_owner_clears_total{reason="reconnect"}`
)

// TestCacheAwareEndToEnd: the router with its own index in front of three mock engines.
func TestCacheAwareEndToEnd(t *testing.T) {
	engines := startCacheEngines(t, 3)
	r := startCacheRouter(t, cacheRouterConfig(engines))
	env := &cacheEnv{routers: []*cacheRouter{r}, kvMetrics: r.base + "/metrics", engines: byID(engines)}
	runCacheScenario(t, env)
}

// TestCacheAwareAdminWorkers: a worker added through the admin API has its KV events
// followed (publisher discovered through /server_info) and wins its prefix; removing it drops
// its blocks from the index.
func TestCacheAwareAdminWorkers(t *testing.T) {
	engines := startCacheEngines(t, 3)
	r := startCacheRouter(t, cacheRouterConfig(engines[:2]))
	env := &cacheEnv{routers: []*cacheRouter{r}, kvMetrics: r.base + "/metrics", engines: byID(engines[:2])}
	added := engines[2]
	if _, body, err := httpPost(r.base+"/workers", `{"id":"`+added.WorkerID()+`","url":"`+added.URL()+`"}`); err != nil {
		t.Fatalf("POST /workers: %v %s", err, body)
	}
	warmSubscription(t, env, added, added.WorkerID())
	p := cachePrefix("echo")
	chatEngine(t, added, p, "question one")
	probe := promptIDs(t, cacheMessages(p, "question two"))
	env.waitHeld(t, added.WorkerID(), probe, "the index learns what the added worker cached", func(n int64) bool { return n >= cacheMinMatched })
	if got := chatRouter(t, r, p, "question two"); got.worker != added.WorkerID() || got.cached < cacheMinMatched {
		t.Fatalf("served by %s with %d cached tokens, want %s", got.worker, got.cached, added.WorkerID())
	}
	req, err := http.NewRequest(http.MethodDelete, r.base+"/workers/"+added.WorkerID(), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("DELETE /workers/%s: %d", added.WorkerID(), resp.StatusCode)
	}
	if n := env.held(added.WorkerID(), probe); n != 0 {
		t.Fatalf("the removed worker still holds %d tokens in the index", n)
	}
	if got := chatRouter(t, r, p, "question three"); got.worker == added.WorkerID() {
		t.Fatal("a removed worker was picked")
	}
}

// runCacheScenario runs issue 7's end-to-end checks against env: a warmed engine wins a long
// shared prefix; past the soft gate the request goes elsewhere; eviction on the engine moves
// it back to the fallback; a sequence gap is repaired by replay; an engine whose publisher
// stopped and which restarted leaves no stale ownership. Each check uses its own system
// prompt, so that what one check cached elsewhere does not decide the next.
func runCacheScenario(t *testing.T, env *cacheEnv) {
	t.Helper()
	ctx := context.Background()
	for id, e := range env.engines {
		warmSubscription(t, env, e, id)
	}
	var a *mockengine.Engine // the engine the first request warmed

	t.Run("a request sharing a long prefix goes to the engine it warmed", func(t *testing.T) {
		p := cachePrefix("alpha")
		first := chatRouter(t, env.router(0), p, "question one: what is a page?")
		a = env.engines[first.worker]
		if a == nil {
			t.Fatalf("the first request was served by %q", first.worker)
		}
		next := cacheMessages(p, "question two: what is a block?")
		env.waitHeld(t, a.WorkerID(), promptIDs(t, next), "the index learns what "+a.WorkerID()+" cached",
			func(n int64) bool { return n >= cacheMinMatched })
		before := env.routerMetric(t, seriesCandidate)
		for i := 1; i <= len(env.routers); i++ { // through every router
			got := chatRouter(t, env.router(i), p, fmt.Sprintf("question two (%d): what is a block?", i))
			if got.worker != a.WorkerID() || got.cached < cacheMinMatched {
				t.Fatalf("router %d: served by %s with %d cached tokens, want %s with at least %d", i%len(env.routers), got.worker, got.cached, a.WorkerID(), cacheMinMatched)
			}
			t.Logf("router %d: %s served it with %d of %d prompt tokens cached", i%len(env.routers), got.worker, got.cached, got.prompt)
		}
		if d := env.routerMetric(t, seriesCandidate) - before; d != float64(len(env.routers)) {
			t.Fatalf("cache_candidate decisions grew by %v, want %d", d, len(env.routers))
		}
	})
	if a == nil {
		t.FailNow()
	}
	aID := a.WorkerID()

	t.Run("past the soft queue gate the request goes elsewhere", func(t *testing.T) {
		p := cachePrefix("alpha") // A holds it
		// Four long requests straight to A: one runs, three wait.
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				_, _ = postChat(ctx, a.URL(), cacheMessages(fmt.Sprintf("blocker %d keeps the engine busy for a while.", i), "go on"), 100)
			})
		}
		defer func() {
			if _, _, err := httpPost(a.URL()+"/abort_request", `{"abort_all":true}`); err != nil {
				t.Errorf("cannot abort the blockers: %v", err)
			}
			wg.Wait()
			env.waitLoads(t, "A's queue drains", func(id string, o load.Observation) bool {
				return o.Has(load.HasWaiting) && o.Waiting == 0
			})
		}()
		env.waitLoads(t, "the routers see A's queue past the gate and the others' loads", func(id string, o load.Observation) bool {
			if id == aID {
				return o.Has(load.HasWaiting) && o.Waiting >= 3
			}
			return o.Has(load.HasWaiting) && o.Waiting == 0
		})
		before := env.routerMetric(t, seriesQueued)
		got := chatRouter(t, env.router(0), p, "question three: what is an eviction?")
		if got.worker == aID || env.engines[got.worker] == nil {
			t.Fatalf("served by %q: want another engine than %s, whose queue is past the gate", got.worker, aID)
		}
		if d := env.routerMetric(t, seriesQueued) - before; d != 1 {
			t.Fatalf("holders_queued fallbacks grew by %v, want 1", d)
		}
	})

	t.Run("eviction on the engine moves the request back to the fallback", func(t *testing.T) {
		p := cachePrefix("bravo")
		chatEngine(t, a, p, "question one")
		probe := promptIDs(t, cacheMessages(p, "question two"))
		env.waitHeld(t, aID, probe, "the index learns what A cached", func(n int64) bool { return n >= cacheMinMatched })
		if got := chatRouter(t, env.router(1), p, "question two"); got.worker != aID {
			t.Fatalf("before the eviction: served by %s, want %s", got.worker, aID)
		}
		// Three long prompts straight to A overflow its 2,048-token cache: LRU eviction,
		// BlockRemoved events.
		for i := range 3 {
			chatEngine(t, a, cacheFiller(fmt.Sprintf("filler %d", i)), "go on")
		}
		env.waitHeld(t, aID, probe, "the index learns of A's eviction", func(n int64) bool { return n < cacheMinMatched })
		candidates, fallbacks := env.routerMetric(t, seriesCandidate), env.routerMetric(t, seriesFallback)
		chatRouter(t, env.router(0), p, "question three")
		if c, f := env.routerMetric(t, seriesCandidate)-candidates, env.routerMetric(t, seriesFallback)-fallbacks; c != 0 || f != 1 {
			t.Fatalf("decisions grew by %v cache_candidate and %v cache_miss_fallback, want 0 and 1", c, f)
		}
	})

	t.Run("a sequence gap is repaired by replay", func(t *testing.T) {
		gaps, replays, clears := metricValue(t, env.kvMetrics, seriesGaps), metricValue(t, env.kvMetrics, seriesReplayed),
			metricValue(t, env.kvMetrics, seriesClearGap)
		p := cachePrefix("charlie")
		// A's publisher goes silent: the batches of this prefill take sequence numbers and
		// stay in the replay buffer, but nobody receives them.
		if err := a.SetFaults(mockengine.Faults{StopEvents: true}); err != nil {
			t.Fatal(err)
		}
		chatEngine(t, a, p, "question one")
		if err := a.SetFaults(mockengine.Faults{}); err != nil {
			t.Fatal(err)
		}
		// The next live batch reveals the gap.
		chatEngine(t, a, cacheFiller("after the silence"), "go on")
		env.waitHeld(t, aID, promptIDs(t, cacheMessages(p, "question two")), "the replay restores what A cached while silent",
			func(n int64) bool { return n >= cacheMinMatched })
		got := chatRouter(t, env.router(1), p, "question two")
		if got.worker != aID || got.cached < cacheMinMatched {
			t.Fatalf("served by %s with %d cached tokens, want %s with at least %d", got.worker, got.cached, aID, cacheMinMatched)
		}
		// The replayed batches are applied before the replay socket's end marker is read and
		// the replay counted: wait for the count.
		waitFor(t, "the replay counted", func() (bool, string) {
			g, r, c := metricValue(t, env.kvMetrics, seriesGaps)-gaps, metricValue(t, env.kvMetrics, seriesReplayed)-replays,
				metricValue(t, env.kvMetrics, seriesClearGap)-clears
			return g >= 1 && r >= 1, fmt.Sprintf("gaps +%v, replays +%v, gap clears +%v", g, r, c)
		})
		if c := metricValue(t, env.kvMetrics, seriesClearGap) - clears; c != 0 {
			t.Fatalf("gap clears +%v: want a gap repaired by a replay, nothing cleared", c)
		}
	})

	t.Run("a silenced and restarted engine leaves no stale ownership", func(t *testing.T) {
		restarts := metricValue(t, env.kvMetrics, seriesClearRst) + metricValue(t, env.kvMetrics, seriesClearRec)
		p := cachePrefix("delta")
		chatEngine(t, a, p, "question one")
		probe := promptIDs(t, cacheMessages(p, "question two"))
		env.waitHeld(t, aID, probe, "the index learns what A cached", func(n int64) bool { return n >= cacheMinMatched })
		// The publisher stops mid-run, then the engine restarts: its cache empties, its
		// sequence starts again from 0, the subscription's connection drops, and the
		// AllBlocksCleared it publishes is withheld.
		if err := a.SetFaults(mockengine.Faults{StopEvents: true}); err != nil {
			t.Fatal(err)
		}
		a.Restart()
		if err := a.SetFaults(mockengine.Faults{}); err != nil {
			t.Fatal(err)
		}
		// The first batch the subscription receives once it is back has a sequence number
		// below the last one seen.
		warmSubscription(t, env, a, aID)
		if n := env.held(aID, probe); n != 0 {
			t.Fatalf("after the restart the index says A holds %d tokens of the old prefix", n)
		}
		candidates := env.routerMetric(t, seriesCandidate)
		got := chatRouter(t, env.router(0), p, "question two")
		if got.cached != 0 || env.routerMetric(t, seriesCandidate) != candidates {
			t.Fatalf("served by %s with %d cached tokens as a cache candidate: stale ownership", got.worker, got.cached)
		}
		// The restart dropped the connection, so the reconnection clears (a restart seen on
		// a surviving connection would clear as "restart").
		if d := metricValue(t, env.kvMetrics, seriesClearRst) + metricValue(t, env.kvMetrics, seriesClearRec) - restarts; d < 1 {
			t.Fatalf("restart and reconnect clears grew by %v, want at least 1", d)
		}
	})

	t.Run("a restarted engine that published past the last sequence seen leaves no stale ownership", func(t *testing.T) {
		clears := metricValue(t, env.kvMetrics, seriesClearRst) + metricValue(t, env.kvMetrics, seriesClearGap) +
			metricValue(t, env.kvMetrics, seriesClearRec)
		replays := metricValue(t, env.kvMetrics, seriesReplayed)
		p := cachePrefix("golf")
		chatEngine(t, a, p, "question one")
		probe := promptIDs(t, cacheMessages(p, "question two"))
		env.waitHeld(t, aID, probe, "the index learns what A cached", func(n int64) bool { return n >= cacheMinMatched })
		last := replayedSeq(t, a)
		// Silenced, A restarts and publishes more batches than it had before: its new
		// sequence passes the last one the index saw, and its replay buffer holds batches
		// of the new run under the numbers the index would ask for. Only the dropped
		// connection tells the subscription that these are not the batches it missed.
		if err := a.SetFaults(mockengine.Faults{StopEvents: true}); err != nil {
			t.Fatal(err)
		}
		a.Restart()
		for i := 0; replayedSeq(t, a) <= last+1; i++ {
			chatEngine(t, a, cacheFiller(fmt.Sprintf("golf filler %d", i)), "go on")
		}
		if err := a.SetFaults(mockengine.Faults{}); err != nil {
			t.Fatal(err)
		}
		warmSubscription(t, env, a, aID)
		if n := env.held(aID, probe); n != 0 {
			t.Fatalf("after the restart the index says A holds %d tokens of the old prefix", n)
		}
		if d := metricValue(t, env.kvMetrics, seriesClearRst) + metricValue(t, env.kvMetrics, seriesClearGap) +
			metricValue(t, env.kvMetrics, seriesClearRec) - clears; d < 1 {
			t.Fatalf("restart, gap and reconnect clears grew by %v, want at least 1", d)
		}
		if d := metricValue(t, env.kvMetrics, seriesReplayed) - replays; d != 0 {
			t.Fatalf("replays grew by %v: the index repaired from the new run's buffer", d)
		}
	})

	t.Run("a killed and restarted engine process leaves no stale ownership", func(t *testing.T) {
		p := cachePrefix("foxtrot")
		chatEngine(t, a, p, "question one")
		probe := promptIDs(t, cacheMessages(p, "question two"))
		env.waitHeld(t, aID, probe, "the index learns what A cached", func(n int64) bool { return n >= cacheMinMatched })
		// The process goes away with its sockets, and a new one takes its ports: the
		// subscription loses its connection, reconnects, and sees a sequence from 0.
		// What the new process publishes before the subscription is back is lost (a ZMQ
		// subscriber receives nothing before it is connected), so probe until a batch lands.
		warmSubscription(t, env, restartEngine(t, a), aID)
		if n := env.held(aID, probe); n != 0 {
			t.Fatalf("after the process restart the index says A holds %d tokens of the old prefix", n)
		}
	})
}

// restartEngine closes e and starts a new engine with its configuration on its ports (HTTP,
// KV events, replay), as a restarted engine process comes back; it is closed when the test
// ends.
func restartEngine(t *testing.T, e *mockengine.Engine) *mockengine.Engine {
	t.Helper()
	cfg := e.Config()
	port := func(endpoint string) int {
		_, p, err := net.SplitHostPort(strings.TrimPrefix(endpoint, "tcp://"))
		if err != nil {
			t.Fatalf("endpoint %q: %v", endpoint, err)
		}
		n, err := strconv.Atoi(p)
		if err != nil {
			t.Fatalf("endpoint %q: %v", endpoint, err)
		}
		return n
	}
	cfg.Port = e.Port()
	cfg.KVEvents.PortBase = port(e.KVEventsEndpoint(0))
	cfg.KVEvents.ReplayPortBase = port(e.ReplayEndpoint(0))
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	n, err := mockengine.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// replayedSeq asks e's replay socket for every retained batch of rank 0 and returns the
// newest sequence number: the last one e published.
func replayedSeq(t *testing.T, e *mockengine.Engine) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cacheWait)
	defer cancel()
	sock := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithLogger(log.New(io.Discard, "", 0)))
	defer sock.Close()
	if err := sock.Dial(e.ReplayEndpoint(0)); err != nil {
		t.Fatal(err)
	}
	if err := sock.Send(zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, 0))); err != nil {
		t.Fatal(err)
	}
	last, found := uint64(0), false
	for {
		msg, err := sock.Recv()
		if err != nil {
			t.Fatalf("replay from %s: %v", e.ReplayEndpoint(0), err)
		}
		f := msg.Frames
		if len(f) > 0 && len(f[0]) == 0 {
			f = f[1:]
		}
		if len(f) < 1 || len(f[0]) != 8 {
			t.Fatalf("malformed replay message %q", msg.Frames)
		}
		seq := binary.BigEndian.Uint64(f[0])
		if seq == math.MaxUint64 {
			if !found {
				t.Fatal("the replay buffer is empty")
			}
			return last
		}
		last, found = seq, true
	}
}

// warmSubscription waits until the index receives e's KV events: a ZMQ subscriber misses
// what is published before its subscription reaches the publisher, so it sends distinct
// small requests straight to the engine until one's blocks show up in the index. Each call's
// prompts start with its own number, so that a warm-up of an earlier call, still in the
// index, shares no block with them and cannot end the wait.
func warmSubscription(t *testing.T, env *cacheEnv, e *mockengine.Engine, id string) {
	t.Helper()
	env.warmups++
	deadline := time.Now().Add(cacheWait)
	for i := 0; ; i++ {
		msgs := cacheMessages(fmt.Sprintf("%d.%d: warm-up of %s, the subscription must carry this prompt's blocks to the index.", env.warmups, i, id), "ok")
		chatEngineMsgs(t, e, msgs)
		ids := promptIDs(t, msgs)
		poll := time.Now().Add(200 * time.Millisecond)
		for time.Now().Before(poll) {
			if env.held(id, ids) > 0 {
				return
			}
			pause(5 * time.Millisecond)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the index never received %s's KV events", id)
		}
	}
}

func byID(es []*mockengine.Engine) map[string]*mockengine.Engine {
	m := make(map[string]*mockengine.Engine, len(es))
	for _, e := range es {
		m[e.WorkerID()] = e
	}
	return m
}

// cachePrefix is a system prompt of about 370 tokens, distinct per tag.
func cachePrefix(tag string) string {
	var b strings.Builder
	for i := 0; b.Len() < 1400; i++ {
		fmt.Fprintf(&b, "%s rule %d: answer briefly, cite the manual and never guess. ", tag, i)
	}
	return b.String()
}

// cacheFiller is a system prompt of about 1,000 tokens, distinct per tag.
func cacheFiller(tag string) string {
	var b strings.Builder
	for i := 0; b.Len() < 3800; i++ {
		fmt.Fprintf(&b, "%s line %d fills the cache with text nobody asks about again. ", tag, i)
	}
	return b.String()
}

type cacheMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

func cacheMessages(system, user string) []cacheMessage {
	return []cacheMessage{{Role: "system", Content: system}, {Role: "user", Content: user}}
}

// promptIDs are the token IDs router and engine compute for msgs: the built-in tokenizer's
// chat template, encoded.
func promptIDs(t *testing.T, msgs []cacheMessage) []uint32 {
	t.Helper()
	tk := tokenizer.NewSimple()
	tm := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		tm[i] = tokenizer.Message{Role: m.Role, Content: m.Content}
	}
	text, err := tk.ApplyChatTemplate(tm)
	if err != nil {
		t.Fatal(err)
	}
	return tk.Encode(text)
}

// cacheReply is what a chat answer tells the checks.
type cacheReply struct {
	worker         string // the router's X-Switchyard-Worker, else the engine's X-Worker-Id
	prompt, cached int
}

// postChat sends one non-streaming chat request to base and decodes the answer.
func postChat(ctx context.Context, base string, msgs []cacheMessage, maxTokens int) (cacheReply, error) {
	body, _ := json.Marshal(map[string]any{"model": cacheModel, "messages": msgs, "max_tokens": maxTokens})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return cacheReply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return cacheReply{}, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return cacheReply{}, fmt.Errorf("status %d: %s", resp.StatusCode, raw)
	}
	var out struct {
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return cacheReply{}, fmt.Errorf("cannot decode %s: %w", raw, err)
	}
	w := resp.Header.Get("X-Switchyard-Worker")
	if w == "" {
		w = resp.Header.Get("X-Worker-Id")
	}
	return cacheReply{worker: w, prompt: out.Usage.PromptTokens, cached: out.Usage.PromptTokensDetails.CachedTokens}, nil
}

// chatRouter sends a one-token chat request (system prompt, question) through r.
func chatRouter(t *testing.T, r *cacheRouter, system, user string) cacheReply {
	t.Helper()
	got, err := postChat(context.Background(), r.base, cacheMessages(system, user), 1)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// chatEngine sends a one-token chat request straight to e, bypassing the routers.
func chatEngine(t *testing.T, e *mockengine.Engine, system, user string) {
	t.Helper()
	chatEngineMsgs(t, e, cacheMessages(system, user))
}

func chatEngineMsgs(t *testing.T, e *mockengine.Engine, msgs []cacheMessage) {
	t.Helper()
	if _, err := postChat(context.Background(), e.URL(), msgs, 1); err != nil {
		t.Fatal(err)
	}
}

func httpGet(url string) (int, []byte, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func httpPost(url, body string) (int, []byte, error) {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode/100 != 2 {
		err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return resp.StatusCode, b, err
}

// metricValue reads one series from a Prometheus text endpoint; 0 when absent.
func metricValue(t *testing.T, url, series string) float64 {
	t.Helper()
	status, body, err := httpGet(url)
	if err != nil || status != http.StatusOK {
		t.Fatalf("GET %s: %d, %v", url, status, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return 0
}

// waitFor polls cond every few milliseconds until it holds, for at most cacheWait.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(cacheWait)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v (%s)", what, cacheWait, state)
		}
		pause(5 * time.Millisecond)
	}
}

// pause waits d between two polls of real sockets' observable state.
func pause(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	<-t.C
}

// TestCacheAwareShortPrompt: a chat prompt shorter than one KV block ("hi") to a
// cache_aware model is served (it once answered 500: the SHA-extension hashing sliced past
// the end of a prompt shorter than a block).
func TestCacheAwareShortPrompt(t *testing.T) {
	engines := startCacheEngines(t, 2)
	r := startCacheRouter(t, cacheRouterConfig(engines))
	msgs := []cacheMessage{{Role: "user", Content: "hi"}}
	if n := len(promptIDs(t, msgs)); n >= 16 {
		t.Fatalf("the prompt has %d tokens, not less than one 16-token block", n)
	}
	for range 3 {
		if _, err := postChat(context.Background(), r.base, msgs, 1); err != nil {
			t.Fatalf("short prompt through the router: %v", err)
		}
	}
}
