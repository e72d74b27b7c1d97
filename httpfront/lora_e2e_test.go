package httpfront

import (
	"context"
	"slices"
	"testing"
	"time"

	"switchyard/config"
	"switchyard/engine"
)

// TestAdapterLoadFailure: an engine that fails the adapter load leaves the request answered
// 502 adapter_load_failed, the load counted as failed, and the request never forwarded.
func TestAdapterLoadFailure(t *testing.T) {
	a := newFakeEngine(t, "A", "llama")
	b := newFakeEngine(t, "B", "llama")
	a.fail.Store(500)
	cfg := flowConfig(a, b)
	cfg.Workers = cfg.Workers[:1]
	cfg.Models["llama"].Buckets[0].Groups.Plain.WorkerIDs = &[]string{"A"}
	cfg.LoRA.Enabled, cfg.LoRA.AutoLoad = true, true
	m := cfg.Models["llama"]
	m.LoRAAdapters = map[string]string{"math": "/adapters/math"}
	cfg.Models["llama"] = m
	ts := startServer(t, cfg, Options{SkipStartupChecks: true})
	r := post(t, ts.url+"/v1/chat/completions", chatBody("math", "hi", ""))
	if r.status != 502 || r.errorCode() != CodeAdapterLoad {
		t.Fatalf("status %d %s: %s", r.status, r.errorCode(), r.body)
	}
	bodies, _ := a.received()
	loads := 0
	for _, b := range bodies {
		switch {
		case string(b) == `{"lora_name":"math","lora_path":"/adapters/math"}`:
			loads++
		case contains(b, "messages"):
			t.Fatalf("the request was forwarded: %s", b)
		}
	}
	if loads == 0 {
		t.Fatal("no load was asked")
	}
	if m := scrape(t, ts.url); !contains([]byte(m), `switchyard_lora_loads_total{model="llama",result="failed"} 1`) {
		t.Fatalf("metrics:\n%s", m)
	}
	// A model that is neither configured nor an adapter is still a 404.
	if r := post(t, ts.url+"/v1/chat/completions", chatBody("nope", "hi", "")); r.status != 404 {
		t.Fatalf("unknown model: %d", r.status)
	}
}

// TestAdapterEviction: with its one slot full, an engine makes room for a requested adapter
// by unloading the one it holds, but not while a request uses it (with
// lora.max_slot_waiters 0, the request for the new adapter is refused then at once); the
// unload comes before the load; every request's hold of its adapter ends with it, a
// stream's when the stream ends.
func TestAdapterEviction(t *testing.T) {
	a := newFakeEngine(t, "A", "llama", withGate(), withLoRA(1, "sql"))
	cfg := loraConfigA(a, map[string]string{"sql": "/adapters/sql", "math": "/adapters/math"})
	cfg.LoRA.MaxSlotWaiters = 0
	ts := startServer(t, cfg, Options{SkipStartupChecks: true})
	w := adapterWorker(t, ts, "A", "sql")

	// A stream uses sql: it holds it until the stream ends.
	out := make(chan result, 1)
	postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("sql", "hi", `"stream":true`), out)
	waitFor(t, a.streamed, "the sql stream's first chunk")
	if n := w.Adapters().InFlight("sql"); n != 1 {
		t.Fatalf("%d requests hold sql during its stream, want 1", n)
	}
	if r := post(t, ts.url+"/v1/chat/completions", chatBody("math", "hi", "")); r.status != 503 {
		t.Fatalf("math while sql is in use: %d %s, want 503", r.status, r.body)
	}
	close(a.gate)
	if r := collect(t, out, 1, "the sql stream")[0]; r.status != 200 {
		t.Fatalf("sql stream: %d", r.status)
	}
	ts.waitBackground(t)
	if n := w.Adapters().InFlight("sql"); n != 0 {
		t.Fatalf("%d holds of sql after its stream ended", n)
	}

	// Now sql is idle: math evicts it, unloaded before math is loaded.
	if r := post(t, ts.url+"/v1/chat/completions", chatBody("math", "hi", "")); r.status != 200 {
		t.Fatalf("math: %d %s", r.status, r.body)
	}
	names, calls := a.loraState()
	if !slices.Equal(names, []string{"math"}) || !slices.Equal(calls, []string{"unload sql", "load math"}) {
		t.Fatalf("engine holds %v after the calls %v; want math after unload sql, load math", names, calls)
	}
	if got := w.Adapters().Names(); !slices.Equal(got, []string{"math"}) || w.Adapters().InFlight("math") != 0 {
		t.Fatalf("the router's view of A: %v, %d holds of math", got, w.Adapters().InFlight("math"))
	}
	// And back: sql evicts math.
	if r := post(t, ts.url+"/v1/chat/completions", chatBody("sql", "hi", "")); r.status != 200 {
		t.Fatalf("sql again: %d %s", r.status, r.body)
	}
	metrics := scrape(t, ts.url)
	for _, want := range []string{
		`switchyard_lora_evictions_total{model="llama",result="ok"} 2`,
		`switchyard_lora_evictions_total{model="llama",result="failed"} 0`,
		`switchyard_lora_loads_total{model="llama",result="ok"} 2`,
	} {
		if !contains([]byte(metrics), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestAdapterReplication: an adapter held by one engine takes all its requests while that
// engine is not much busier than the others; once its requests in flight exceed an engine
// with free slots by more than lora.replicate_above, that engine joins the candidates, the
// policy picks it and the router loads the adapter there (counted as a replica pick), and
// from then on the adapter's requests spread over both holders without another load.
func TestAdapterReplication(t *testing.T) {
	a := newFakeEngine(t, "A", "llama", withGate(), withLoRA(4, "sql"))
	b := newFakeEngine(t, "B", "llama", withGate(), withLoRA(4))
	cfg := flowConfig(a, b)
	cfg.DefaultPolicy.Type = config.PolicyPowerOfTwo // no load reports: the lower in-flight wins
	cfg.LoRA.Enabled, cfg.LoRA.AutoLoad = true, true
	cfg.LoRA.RefreshInterval = time.Hour // learned once, at start
	cfg.LoRA.ReplicateAbove = 1
	m := cfg.Models["llama"]
	m.LoRAAdapters = map[string]string{"sql": "/adapters/sql"}
	cfg.Models["llama"] = m
	ts := startServer(t, cfg, Options{SkipStartupChecks: true})
	workers := map[string]*engine.Worker{}
	waitUntil(t, "the router learns both engines' adapters", func() bool {
		for _, x := range ts.wset.Load().Workers() {
			if x.Adapters() != nil {
				workers[x.ID] = x
			}
		}
		return len(workers) == 2 && workers["A"].Adapters().Has("sql")
	})
	served := func(what string) string {
		t.Helper()
		r := post(t, ts.url+"/v1/chat/completions", chatBody("sql", "hi", ""))
		if r.status != 200 {
			t.Fatalf("%s: %d %s", what, r.status, r.body)
		}
		return r.header.Get("X-Worker-Id")
	}

	out := make(chan result, 2)
	postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("sql", "hi", `"stream":true`), out)
	waitFor(t, a.streamed, "the first sql stream on A")
	// A has one request in flight, B none: not more than replicate_above (1) busier.
	if id := served("a request beside one stream"); id != "A" {
		t.Fatalf("a request beside one stream went to %s, want A (the holder, not busy enough to replicate)", id)
	}
	postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("sql", "hi", `"stream":true`), out)
	waitFor(t, a.streamed, "the second sql stream on A")
	if n := workers["A"].Adapters().InFlight("sql"); n != 2 {
		t.Fatalf("%d requests hold sql on A, want 2", n)
	}
	// Two in flight on A against none on B: B loads sql and serves the request.
	if id := served("the request that replicates"); id != "B" {
		t.Fatalf("with A two requests busier than B, sql's request went to %s; want B, loading sql", id)
	}
	if names, calls := b.loraState(); !slices.Equal(names, []string{"sql"}) || !slices.Equal(calls, []string{"load sql"}) {
		t.Fatalf("B holds %v after the calls %v; want sql after one load", names, calls)
	}
	// Both hold sql now: the less busy one serves, without another load.
	if id := served("a request after the replica"); id != "B" {
		t.Fatalf("a request with A busy went to %s, want B (a holder now)", id)
	}
	if _, calls := a.loraState(); len(calls) != 0 {
		t.Fatalf("A got adapter calls %v", calls)
	}
	if _, calls := b.loraState(); len(calls) != 1 {
		t.Fatalf("B got adapter calls %v, want one load", calls)
	}
	close(a.gate)
	for _, r := range collect(t, out, 2, "the sql streams") {
		if r.status != 200 {
			t.Fatalf("sql stream: %d", r.status)
		}
	}
	ts.waitBackground(t)
	metrics := scrape(t, ts.url)
	for _, want := range []string{
		`switchyard_lora_picks_total{model="llama",result="replica"} 1`,
		`switchyard_lora_picks_total{model="llama",result="load"} 0`,
		`switchyard_lora_picks_total{model="llama",result="hit"} 4`,
		`switchyard_lora_loads_total{model="llama",result="ok"} 1`,
		`switchyard_lora_evictions_total{model="llama",result="ok"} 0`,
	} {
		if !contains([]byte(metrics), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestAdapterLoadWaitersCountInFlight: requests waiting for their adapter's load on an engine
// count in its in-flight requests from their pick (the gauge shows them, the admission cap
// sees them), once each, until they end: with the cap full of requests waiting for the
// load, the next request is refused by the cap (503, one bucket) or moves on to the next
// bucket; a load that fails releases its waiters.
func TestAdapterLoadWaitersCountInFlight(t *testing.T) {
	tests := []struct {
		name string
		// spill adds a second bucket, of engine B, after A's.
		spill bool
		// failLoad makes A's held load fail.
		failLoad bool
		// wantThird is the status of the request beyond the cap; wantWaiters the waiters'.
		wantThird, wantWaiters int
	}{
		{name: "the cap refuses", wantThird: 503, wantWaiters: 200},
		{name: "the cap moves on", spill: true, wantThird: 200, wantWaiters: 200},
		{name: "the load fails", failLoad: true, wantThird: 503, wantWaiters: 502},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newFakeEngine(t, "A", "llama", withLoRA(4), withLoRALoadGate())
			b := newFakeEngine(t, "B", "llama", withLoRA(4))
			cfg := flowConfig(a, b)
			cfg.Models["llama"].Buckets[0].Groups.Plain.WorkerIDs = &[]string{"A"}
			if tt.spill {
				spill := plainBucket("spill", nil, nil, "B")
				spill.Rank = 1
				m := cfg.Models["llama"]
				m.Buckets = append(m.Buckets, spill)
				cfg.Models["llama"] = m
			} else {
				cfg.Workers = cfg.Workers[:1]
			}
			cfg.DefaultPolicy.Admission.MaxInflightRequests = ptr(int64(2))
			withAdapters(cfg, map[string]string{"math": "/adapters/math"})
			ts := startServer(t, cfg, Options{SkipStartupChecks: true})
			workers := learnedWorkers(t, ts, len(cfg.Workers))
			wa := workers["A"]

			out := make(chan result, 2)
			postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("math", "hi", ""), out)
			waitFor(t, a.lora.loading, "A's load of math")
			if n := wa.Counters.InFlight(); n != 1 {
				t.Fatalf("A has %d requests in flight while the first waits for its load, want 1", n)
			}
			postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("math", "hi", ""), out)
			waitUntil(t, "the second request for math counted on A", func() bool { return wa.Counters.InFlight() == 2 })
			if m := scrape(t, ts.url); !contains([]byte(m), `switchyard_worker_inflight_requests{worker="A"} 2`) {
				t.Fatalf("the in-flight gauge does not show the two waiting requests:\n%s", m)
			}

			// A is at its cap of 2 with both waiting: the third request is not sent there.
			r := post(t, ts.url+"/v1/chat/completions", chatBody("math", "hi", ""))
			if r.status != tt.wantThird {
				t.Fatalf("the request beyond A's cap: %d %s, want %d", r.status, r.body, tt.wantThird)
			}
			switch {
			case tt.spill:
				if id := r.header.Get("X-Worker-Id"); id != "B" {
					t.Fatalf("the request beyond A's cap was served by %s, want B (the next bucket)", id)
				}
			case r.errorCode() != CodeNoAvailableEngine || !contains(r.body, engine.LimitInFlight):
				t.Fatalf("the request beyond A's cap: %s %s, want %s naming %s", r.errorCode(), r.body, CodeNoAvailableEngine, engine.LimitInFlight)
			}
			if n := wa.Counters.InFlight(); n != 2 {
				t.Fatalf("A has %d requests in flight after the refused one, want 2", n)
			}

			if tt.failLoad {
				a.lora.loadStatus.Store(500)
			}
			close(a.lora.gate)
			for _, r := range collect(t, out, 2, "the requests that waited for the load") {
				if r.status != tt.wantWaiters {
					t.Fatalf("a request that waited for the load: %d %s, want %d", r.status, r.code, tt.wantWaiters)
				}
				if r.status == 200 && r.header.Get("X-Worker-Id") != "A" {
					t.Fatalf("a request that waited for A's load was served by %s", r.header.Get("X-Worker-Id"))
				}
			}
			if _, calls := a.loraState(); !slices.Equal(calls, []string{"load math"}) {
				t.Fatalf("A got the adapter calls %v, want one load", calls)
			}
			if n := wa.Counters.InFlight(); n != 0 {
				t.Fatalf("A has %d requests in flight after every request ended", n)
			}
			if n := ts.tracker.Outstanding(); n != 0 {
				t.Fatalf("%d guards outstanding after every request ended", n)
			}
			// Each request counted as one dispatch to the engine that served it, none for
			// the waiters of a failed load.
			wantA := uint64(2)
			if tt.failLoad {
				wantA = 0
			}
			if n := wa.Counters.Dispatched(); n != wantA {
				t.Fatalf("A counted %d dispatches, want %d", n, wantA)
			}
			// The first request's pick loaded math, the second's joined that load (the one
			// beyond the cap loaded it on B); a failed load's picks count none.
			wantLoad, wantJoined := 1.0, 1.0
			switch {
			case tt.failLoad:
				wantLoad, wantJoined = 0, 0
			case tt.spill:
				wantLoad = 2
			}
			for _, m := range []struct {
				result string
				want   float64
			}{{"load", wantLoad}, {"joined", wantJoined}} {
				if got := metricValue(t, ts, `switchyard_lora_picks_total{model="llama",result="`+m.result+`"}`); got != m.want {
					t.Errorf("picks %s = %v, want %v", m.result, got, m.want)
				}
			}
		})
	}
}

// TestAdapterLoadWaitersCountInFlightPD: a PD request whose engines load its adapter counts
// in flight on both from its pick, through the prefill engine's load, and as one request
// each once dispatched; a stream's relay releases both at its end.
func TestAdapterLoadWaitersCountInFlightPD(t *testing.T) {
	p := newFakeEngine(t, "P", "llama", withMode("prefill"), withLoRA(4), withLoRALoadGate())
	p.bootstrapPort = 8998
	d := newFakeEngine(t, "D", "llama", withMode("decode"), withLoRA(4))
	d.expectHost, d.expectPort = "127.0.0.1", 8998
	cfg := pdConfig(p, d, ptr(8998))
	withAdapters(cfg, map[string]string{"math": "/adapters/math"})
	ts := startServer(t, cfg, Options{SkipStartupChecks: true})
	workers := learnedWorkers(t, ts, 2)
	wp, wd := workers["P"], workers["D"]

	out := make(chan result, 1)
	postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("math", "hi", `"stream":true`), out)
	waitFor(t, p.lora.loading, "P's load of math")
	if np, nd := wp.Counters.InFlight(), wd.Counters.InFlight(); np != 1 || nd != 1 {
		t.Fatalf("in flight while the pair waits for P's load: P %d, D %d; want 1 and 1", np, nd)
	}
	if np, nd := wp.Counters.Dispatched(), wd.Counters.Dispatched(); np != 0 || nd != 0 {
		t.Fatalf("dispatches counted before the load ended: P %d, D %d", np, nd)
	}
	close(p.lora.gate)
	if r := collect(t, out, 1, "the PD stream")[0]; r.status != 200 {
		t.Fatalf("PD stream: %d %s", r.status, r.code)
	}
	ts.waitBackground(t)
	if np, nd := wp.Counters.Dispatched(), wd.Counters.Dispatched(); np != 1 || nd != 1 {
		t.Fatalf("dispatches: P %d, D %d; want one each", np, nd)
	}
	if np, nd := wp.Counters.InFlight(), wd.Counters.InFlight(); np != 0 || nd != 0 || ts.tracker.Outstanding() != 0 {
		t.Fatalf("after the stream: P %d, D %d in flight, %d guards outstanding", np, nd, ts.tracker.Outstanding())
	}
	for _, e := range []*fakeEngine{p, d} {
		if _, calls := e.loraState(); !slices.Equal(calls, []string{"load math"}) {
			t.Fatalf("%s got the adapter calls %v, want one load", e.id, calls)
		}
	}
}

// TestAdapterLoadWaiterRetried: a request that waited for its adapter's load on A, then got
// A's 503, is retried on B (which loads the adapter for it): it counted once on each engine
// it was dispatched to, and nothing stays in flight on either.
func TestAdapterLoadWaiterRetried(t *testing.T) {
	a := newFakeEngine(t, "A", "llama", withLoRA(4), withLoRALoadGate())
	// B holds another adapter: A has the most free slots, so math goes there first
	// (whether the router counts the slots each engine advertises or lora.slots_per_engine,
	// as it does until it learns the engine's facts).
	b := newFakeEngine(t, "B", "llama", withLoRA(4, "other"))
	a.fail.Store(503) // inference only: its adapter routes answer
	cfg := retryConfig(a, b)
	withAdapters(cfg, map[string]string{"math": "/adapters/math"})
	cfg.LoRA.SlotsPerEngine = 4
	ts := startServer(t, cfg, Options{SkipStartupChecks: true})
	workers := learnedWorkers(t, ts, 2)

	out := make(chan result, 1)
	postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("math", "hi", ""), out)
	waitFor(t, a.lora.loading, "A's load of math")
	if n := workers["A"].Counters.InFlight(); n != 1 {
		t.Fatalf("A has %d requests in flight during its load, want 1", n)
	}
	close(a.lora.gate)
	r := collect(t, out, 1, "the retried request")[0]
	if r.status != 200 || r.header.Get("X-Worker-Id") != "B" || r.header.Get(headerAttempts) != "2" {
		t.Fatalf("the retried request: %d from %s after %s attempts, want 200 from B after 2", r.status, r.header.Get("X-Worker-Id"), r.header.Get(headerAttempts))
	}
	for id, w := range workers {
		if w.Counters.InFlight() != 0 || w.Counters.Dispatched() != 1 {
			t.Fatalf("%s: %d in flight, %d dispatches; want 0 and 1", id, w.Counters.InFlight(), w.Counters.Dispatched())
		}
	}
	if n := ts.tracker.Outstanding(); n != 0 {
		t.Fatalf("%d guards outstanding", n)
	}
}

// TestAdapterSlotWait: with an engine's one slot taken by an adapter a stream uses, a request
// for another adapter waits for the slot (lora.max_slot_waiters) rather than being refused:
// when the stream ends, it evicts the idle adapter and is served; a request beyond
// max_slot_waiters is refused at once, and a waiter past lora.load_timeout gets the 503 it
// would have had without waiting.
func TestAdapterSlotWait(t *testing.T) {
	const loadTimeout = 7 * time.Second // the wait's bound, told apart from other timers
	tests := []struct {
		name string
		// expire ends the wait by its bound instead of the stream's end.
		expire bool
		// want is the waiter's status; wantCalls the adapter calls A got.
		want      int
		wantCalls []string
		wantWaits map[string]float64
	}{
		{name: "served once the stream ends", want: 200, wantCalls: []string{"unload sql", "load math"},
			wantWaits: map[string]float64{"freed": 1, "timeout": 0, "full": 1}},
		{name: "refused past the bound", expire: true, want: 503, wantCalls: nil,
			wantWaits: map[string]float64{"freed": 0, "timeout": 1, "full": 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newFakeEngine(t, "A", "llama", withGate(), withLoRA(1, "sql"))
			cfg := loraConfigA(a, map[string]string{"sql": "/adapters/sql", "math": "/adapters/math", "code": "/adapters/code"})
			cfg.LoRA.LoadTimeout = loadTimeout
			cfg.LoRA.MaxSlotWaiters = 1
			clock := newFakeClock()
			clock.scheduled = make(chan time.Duration, 16)
			ts := startServer(t, cfg, Options{SkipStartupChecks: true, Clock: clock})
			w := adapterWorker(t, ts, "A", "sql")

			// A stream uses sql, A's one slot.
			stream := make(chan result, 1)
			postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("sql", "hi", `"stream":true`), stream)
			waitFor(t, a.streamed, "the sql stream's first chunk")

			// math waits for the slot: its wait's timer is the bound.
			waiter := make(chan result, 1)
			postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("math", "hi", ""), waiter)
			waitSlotTimer(t, clock, loadTimeout, waiter)
			// One waiter is the limit: code is refused at once.
			if r := post(t, ts.url+"/v1/chat/completions", chatBody("code", "hi", "")); r.status != 503 || r.errorCode() != CodeNoAvailableEngine {
				t.Fatalf("code beyond max_slot_waiters: %d %s, want 503 %s", r.status, r.body, CodeNoAvailableEngine)
			}
			if _, calls := a.loraState(); len(calls) != 0 {
				t.Fatalf("A got the adapter calls %v while sql was in use", calls)
			}

			if tt.expire {
				clock.Advance(loadTimeout)
			} else {
				close(a.gate)
			}
			r := collect(t, waiter, 1, "the request that waited for the slot")[0]
			if r.status != tt.want {
				t.Fatalf("the waiter: %d %s, want %d", r.status, r.code, tt.want)
			}
			if tt.want == 200 && r.header.Get("X-Worker-Id") != "A" {
				t.Fatalf("the waiter was served by %q", r.header.Get("X-Worker-Id"))
			}
			if tt.expire {
				if n := w.Adapters().InFlight("sql"); n != 1 {
					t.Fatalf("%d holds of sql after the waiter gave up, want the stream's 1", n)
				}
				close(a.gate)
			}
			if r := collect(t, stream, 1, "the sql stream")[0]; r.status != 200 {
				t.Fatalf("sql stream: %d", r.status)
			}
			ts.waitBackground(t)
			if _, calls := a.loraState(); !slices.Equal(calls, tt.wantCalls) {
				t.Fatalf("A got the adapter calls %v, want %v", calls, tt.wantCalls)
			}
			for result, want := range tt.wantWaits {
				if got := metricValue(t, ts, `switchyard_lora_slot_waits_total{model="llama",result="`+result+`"}`); got != want {
					t.Errorf("slot waits %s = %v, want %v", result, got, want)
				}
			}
			if n := ts.lora.slotWaiters.Load(); n != 0 {
				t.Fatalf("%d requests still counted as waiting for a slot", n)
			}
		})
	}
}

// TestAdapterSlotWaitEndsWhenClientLeaves: a request waiting for an adapter slot is dropped
// as soon as its client closes the connection: its wait ends (counted as abandoned), and
// nothing is loaded or evicted for it once the slot frees.
func TestAdapterSlotWaitEndsWhenClientLeaves(t *testing.T) {
	a := newFakeEngine(t, "A", "llama", withGate(), withLoRA(1, "sql"))
	cfg := loraConfigA(a, map[string]string{"sql": "/adapters/sql", "math": "/adapters/math"})
	clock := newFakeClock() // never advanced: the wait ends only when the client leaves
	clock.scheduled = make(chan time.Duration, 16)
	clock.stopped = make(chan struct{}, 16)
	ts := startServer(t, cfg, Options{SkipStartupChecks: true, Clock: clock})
	adapterWorker(t, ts, "A", "sql")
	stream := make(chan result, 1)
	postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("sql", "hi", `"stream":true`), stream)
	waitFor(t, a.streamed, "the sql stream's first chunk")

	conn := sendChat(t, ts, chatBody("math", "hi", ""))
	waitSlotTimer(t, clock, cfg.LoRA.LoadTimeout, nil)
	_ = conn.Close()
	waitFor(t, clock.stopped, "the wait to end when the client left")
	if got := metricValue(t, ts, `switchyard_lora_slot_waits_total{model="llama",result="abandoned"}`); got != 1 {
		t.Fatalf("abandoned slot waits = %v, want 1", got)
	}
	close(a.gate)
	if r := collect(t, stream, 1, "the sql stream")[0]; r.status != 200 {
		t.Fatalf("sql stream: %d", r.status)
	}
	ts.stop(t) // every handler has returned: nothing can load for the abandoned request
	if _, calls := a.loraState(); len(calls) != 0 {
		t.Fatalf("A got the adapter calls %v for a request whose client left", calls)
	}
	if n := ts.lora.slotWaiters.Load(); n != 0 {
		t.Fatalf("%d requests still counted as waiting for a slot", n)
	}
}

// loraConfigA is a configuration of engine a alone (worker A) with adapter routing and
// auto_load on, the engines' adapters learned once, at start, and the model's adapters
// (name: path).
func loraConfigA(a *fakeEngine, adapters map[string]string) *config.Config {
	cfg := flowConfig(a, a)
	cfg.Workers = cfg.Workers[:1]
	cfg.Models["llama"].Buckets[0].Groups.Plain.WorkerIDs = &[]string{"A"}
	withAdapters(cfg, adapters)
	return cfg
}

// withAdapters turns adapter routing and auto_load on in cfg, the engines' adapters learned
// once, at start, and gives model llama the adapters (name: path).
func withAdapters(cfg *config.Config, adapters map[string]string) {
	cfg.LoRA.Enabled, cfg.LoRA.AutoLoad = true, true
	cfg.LoRA.RefreshInterval = time.Hour
	m := cfg.Models["llama"]
	m.LoRAAdapters = adapters
	cfg.Models["llama"] = m
}

// learnedWorkers waits until ts's router has learned the adapters of n engines, and returns
// their workers by ID.
func learnedWorkers(t *testing.T, ts *testServer, n int) map[string]*engine.Worker {
	t.Helper()
	workers := map[string]*engine.Worker{}
	waitUntil(t, "the router learns the engines' adapters", func() bool {
		for _, x := range ts.wset.Load().Workers() {
			if x.Adapters() != nil {
				workers[x.ID] = x
			}
		}
		return len(workers) == n
	})
	return workers
}

// adapterWorker waits until ts's router learns that engine id holds adapter, and returns
// its worker.
func adapterWorker(t *testing.T, ts *testServer, id, adapter string) *engine.Worker {
	t.Helper()
	var w *engine.Worker
	waitUntil(t, "the router learns "+id+"'s adapter "+adapter, func() bool {
		for _, x := range ts.wset.Load().Workers() {
			if x.ID == id && x.Adapters().Has(adapter) {
				w = x
				return true
			}
		}
		return false
	})
	return w
}

// TestAdapterSlotWaitWokenByLapse: a request waiting for an adapter slot that a load's
// reservation holds (its request never loaded: refused after its pick, say) is selected
// again when the reservation lapses, before the wait's own bound, and served.
func TestAdapterSlotWaitWokenByLapse(t *testing.T) {
	const loadTimeout, lapse = 7 * time.Second, 3 * time.Second
	a := newFakeEngine(t, "A", "llama", withLoRA(1))
	cfg := loraConfigA(a, map[string]string{"math": "/adapters/math"})
	cfg.LoRA.LoadTimeout = loadTimeout
	clock := newFakeClock()
	clock.scheduled = make(chan time.Duration, 16)
	ts := startServer(t, cfg, Options{SkipStartupChecks: true, Clock: clock})
	w := slotsWorker(t, ts, "A", 1)
	// A pick reserved A's one slot for a load that never comes; it lapses in 3s.
	if now := clock.Now(); !reserved(w.ReserveAdapter("ghost", now, now.Add(lapse), nil)) {
		t.Fatal("A's slot was not reserved")
	}

	waiter := make(chan result, 1)
	postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("math", "hi", ""), waiter)
	waitSlotTimer(t, clock, lapse, waiter) // not its bound, 7s
	clock.Advance(lapse)
	r := collect(t, waiter, 1, "the request that waited for the lapse")[0]
	if r.status != 200 || r.header.Get("X-Worker-Id") != "A" {
		t.Fatalf("the waiter: %d %s from %q, want 200 from A", r.status, r.code, r.header.Get("X-Worker-Id"))
	}
	if _, calls := a.loraState(); !slices.Equal(calls, []string{"load math"}) {
		t.Fatalf("A got the adapter calls %v, want one load of math", calls)
	}
	for result, want := range map[string]float64{"freed": 1, "timeout": 0} {
		if got := metricValue(t, ts, `switchyard_lora_slot_waits_total{model="llama",result="`+result+`"}`); got != want {
			t.Errorf("slot waits %s = %v, want %v", result, got, want)
		}
	}
}

// TestAdapterSlotWaitWokenByEngineList: a request waiting for the slot of an adapter a stream
// uses is selected again, and served, as soon as the router learns that the engine no longer
// holds that adapter (an operator unloaded it), without waiting for the stream's end.
func TestAdapterSlotWaitWokenByEngineList(t *testing.T) {
	a := newFakeEngine(t, "A", "llama", withGate(), withLoRA(1, "sql"))
	cfg := loraConfigA(a, map[string]string{"sql": "/adapters/sql", "math": "/adapters/math"})
	clock := newFakeClock() // never advanced: only the engine's list ends the wait
	clock.scheduled = make(chan time.Duration, 16)
	ts := startServer(t, cfg, Options{SkipStartupChecks: true, Clock: clock})
	adapterWorker(t, ts, "A", "sql")
	stream := make(chan result, 1)
	postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("sql", "hi", `"stream":true`), stream)
	waitFor(t, a.streamed, "the sql stream's first chunk")

	waiter := make(chan result, 1)
	postAsync(context.Background(), ts.url+"/v1/chat/completions", chatBody("math", "hi", ""), waiter)
	waitSlotTimer(t, clock, cfg.LoRA.LoadTimeout, waiter)
	a.lora.mu.Lock()
	a.lora.names = nil // unloaded behind the router's back
	a.lora.mu.Unlock()
	ts.workers.RefreshAdapters(context.Background(), ts.workers.Member("A"))
	r := collect(t, waiter, 1, "the request that waited for the slot")[0]
	if r.status != 200 || r.header.Get("X-Worker-Id") != "A" {
		t.Fatalf("the waiter: %d %s from %q, want 200 from A", r.status, r.code, r.header.Get("X-Worker-Id"))
	}
	if names, calls := a.loraState(); !slices.Equal(names, []string{"math"}) || !slices.Equal(calls, []string{"load math"}) {
		t.Fatalf("A holds %v after the calls %v, want math after one load", names, calls)
	}
	if got := metricValue(t, ts, `switchyard_lora_slot_waits_total{model="llama",result="freed"}`); got != 1 {
		t.Errorf("freed slot waits = %v, want 1", got)
	}
	close(a.gate)
	if r := collect(t, stream, 1, "the sql stream")[0]; r.status != 200 {
		t.Fatalf("sql stream: %d", r.status)
	}
	ts.waitBackground(t)
}

// waitSlotTimer waits until clock (with scheduled set) schedules a timer of d: the end of a
// request's wait for an adapter slot. An answer on waiter first (nil: none) fails the test.
func waitSlotTimer(t *testing.T, clock *fakeClock, d time.Duration, waiter <-chan result) {
	t.Helper()
	var seen []time.Duration
	deadline := time.After(10 * time.Second)
	for {
		select {
		case got := <-clock.scheduled:
			if got == d {
				return
			}
			seen = append(seen, got)
		case r := <-waiter:
			t.Fatalf("the request did not wait for a slot: %d %s", r.status, r.code)
		case <-deadline:
			t.Fatalf("no timer of %v for a slot wait (timers scheduled: %v)", d, seen)
		}
	}
}

// slotsWorker waits until ts's router counts slots adapter slots on engine id (its facts are
// known), and returns its worker.
func slotsWorker(t *testing.T, ts *testServer, id string, slots int) *engine.Worker {
	t.Helper()
	var w *engine.Worker
	waitUntil(t, "the router counts "+id+"'s adapter slots", func() bool {
		for _, x := range ts.wset.Load().Workers() {
			if x.ID == id && x.Adapters() != nil && x.Adapters().Slots == slots {
				w = x
				return true
			}
		}
		return false
	})
	return w
}

// reserved is ReserveAdapter's ok, for a test that keeps the share.
func reserved(_ engine.AdapterReservation, ok bool) bool { return ok }
