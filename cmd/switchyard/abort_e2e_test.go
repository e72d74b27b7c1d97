package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"switchyard/bench/mockengine"
	"switchyard/config"
	"switchyard/httpfront"
)

// abortCosts make one simulated step an event of the engine's manual clock.
var abortCosts = &mockengine.Costs{PrefillOverhead: time.Millisecond, DecodeStep: 10 * time.Millisecond}

// clockedEngine is a mock engine whose time moves only when the test says.
type clockedEngine struct {
	e   *mockengine.Engine
	clk *mockengine.ManualClock
}

func startClocked(t *testing.T, id, model string, role mockengine.Role, flavor mockengine.Flavor) clockedEngine {
	t.Helper()
	clk := mockengine.NewManualClock(time.Unix(1_800_000_000, 0))
	e := startMock(t, mockengine.Config{WorkerID: id, Model: model, Role: role, Flavor: flavor, Clock: clk, Costs: abortCosts})
	return clockedEngine{e: e, clk: clk}
}

// step ends the engine's step in progress (waiting for one to begin first).
func (c clockedEngine) step(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cacheWait)
	defer cancel()
	if err := c.clk.WaitForTimers(ctx, 1); err != nil {
		t.Fatalf("%s: no step begins: %v (running %d, waiting %d, aborted %d)", c.e.WorkerID(), err,
			c.e.Running(), c.e.Waiting(), c.e.Aborts())
	}
	if _, err := c.clk.AdvanceToNext(ctx); err != nil {
		t.Fatal(err)
	}
}

// awaitAbort waits until the engine has aborted n requests.
func (c clockedEngine) awaitAbort(t *testing.T, n uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cacheWait)
	defer cancel()
	if err := c.e.WaitAborts(ctx, n); err != nil {
		t.Fatal(err)
	}
}

// stopsWithinOneStep: once the engine's step in progress ends, nothing runs on it any more,
// with its clock frozen again. An abort that arrives between two steps stops the request
// before the next one begins: then no step is left to end.
func (c clockedEngine) stopsWithinOneStep(t *testing.T) {
	t.Helper()
	waitFor(t, c.e.WorkerID()+" in a step or stopped", func() (bool, string) {
		n := c.e.Running()
		return n == 0 || c.clk.Pending() > 0, fmt.Sprintf("%d running, no step pending", n)
	})
	if c.e.Running() > 0 {
		c.step(t)
	}
	waitFor(t, c.e.WorkerID()+" running nothing after one step", func() (bool, string) {
		n := c.e.Running()
		return n == 0, fmt.Sprintf("%d running", n)
	})
	if p := c.clk.Pending(); p != 0 {
		t.Errorf("%s: %d steps begun after the abort", c.e.WorkerID(), p)
	}
}

// streamCall is a streaming chat request through the router on a connection of its own.
type streamCall struct {
	conn  net.Conn
	lines chan string
}

func startStream(t *testing.T, base, model string) *streamCall {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"Tell me a long story."}],"max_tokens":100,"stream":true}`
	if _, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		len(body), body); err != nil {
		t.Fatal(err)
	}
	sc := &streamCall{conn: c, lines: make(chan string, 64)}
	go func() {
		defer close(sc.lines)
		s := bufio.NewScanner(c)
		for s.Scan() {
			sc.lines <- s.Text()
		}
	}()
	return sc
}

// firstToken waits for the stream's first data event.
func (sc *streamCall) firstToken(t *testing.T) {
	t.Helper()
	deadline := time.After(cacheWait)
	for {
		select {
		case l, ok := <-sc.lines:
			if !ok {
				t.Fatal("the stream ended before its first token")
			}
			if strings.HasPrefix(l, "data: {") {
				return
			}
		case <-deadline:
			t.Fatal("no first token")
		}
	}
}

func abortRouter(t *testing.T, workers []config.Worker, prefillToCompletion bool) string {
	t.Helper()
	cfg := config.Default()
	cfg.Server.Port = 0
	cfg.Abort.PrefillToCompletion = prefillToCompletion
	cfg.Workers = workers
	if workers[0].Role == config.RolePlain {
		cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{{ID: "plain", Groups: config.Groups{Plain: &config.Group{}}}}}}
	} else {
		cfg.Models = map[string]config.Model{"llama-pd": {Buckets: []config.Bucket{{ID: "pd",
			Groups: config.Groups{PD: &config.PDGroups{Prefill: &config.Group{}, Decode: &config.Group{}}}}}}}
	}
	// No heartbeat within the test: only the watch of the client's connection can tell
	// that the client left.
	_, base := startRouterWith(t, cfg, httpfront.Options{HeartbeatInterval: time.Hour})
	return base
}

func flavorOf(f mockengine.Flavor) string {
	if f == mockengine.FlavorVLLM {
		return config.FlavorVLLM
	}
	return config.FlavorAuto // introspected: an SGLang engine
}

// TestAbortOnDisconnectE2E: a client that leaves after its first token stops the engine's
// work within one decode step, in front of an engine that aborts on a closed connection
// (vLLM) and one that needs its abort API (SGLang, told the rid the router set), plain and
// prefill/decode; a client that leaves during the prefill (before the stream's first bytes)
// stops the engine, or both engines of a pair (only the decode with
// abort.prefill_to_completion).
func TestAbortOnDisconnectE2E(t *testing.T) {
	for _, flavor := range []mockengine.Flavor{mockengine.FlavorVLLM, mockengine.FlavorSGLang} {
		t.Run(string(flavor)+"/plain", func(t *testing.T) {
			e := startClocked(t, "e1", "llama", mockengine.RolePlain, flavor)
			base := abortRouter(t, []config.Worker{{ID: "e1", URL: e.e.URL(), Model: "llama", Role: config.RolePlain, Flavor: flavorOf(flavor), DPSize: 1}}, false)
			sc := startStream(t, base, "llama")
			e.step(t) // the prefill: the first token
			sc.firstToken(t)
			_ = sc.conn.Close()
			e.awaitAbort(t, 1)
			e.stopsWithinOneStep(t)
			if got := metricValue(t, base+"/metrics", `switchyard_aborts_total{cause="client_disconnect"}`); got != 1 {
				t.Errorf("client_disconnect aborts %v, want 1", got)
			}
		})
		t.Run(string(flavor)+"/plain-during-prefill", func(t *testing.T) {
			e := startClocked(t, "e1", "llama", mockengine.RolePlain, flavor)
			base := abortRouter(t, []config.Worker{{ID: "e1", URL: e.e.URL(), Model: "llama", Role: config.RolePlain, Flavor: flavorOf(flavor), DPSize: 1}}, false)
			sc := startStream(t, base, "llama")
			// The prefill is under way (its step pending): the router waits for the stream's
			// first bytes.
			ctx, cancel := context.WithTimeout(context.Background(), cacheWait)
			defer cancel()
			if err := e.clk.WaitForTimers(ctx, 1); err != nil {
				t.Fatal(err)
			}
			_ = sc.conn.Close()
			e.awaitAbort(t, 1)
			e.stopsWithinOneStep(t)
			if got := metricValue(t, base+"/metrics", `switchyard_aborts_total{cause="client_disconnect"}`); got != 1 {
				t.Errorf("client_disconnect aborts %v, want 1", got)
			}
		})
		t.Run(string(flavor)+"/pd", func(t *testing.T) {
			p := startClocked(t, "p1", "llama-pd", mockengine.RolePrefill, flavor)
			d := startClocked(t, "d1", "llama-pd", mockengine.RoleDecode, flavor)
			bp := p.e.BootstrapPort()
			base := abortRouter(t, []config.Worker{
				{ID: "p1", URL: p.e.URL(), Model: "llama-pd", Role: config.RolePrefill, Flavor: flavorOf(flavor), DPSize: 1, BootstrapPort: &bp},
				{ID: "d1", URL: d.e.URL(), Model: "llama-pd", Role: config.RoleDecode, Flavor: flavorOf(flavor), DPSize: 1},
			}, false)
			sc := startStream(t, base, "llama-pd")
			p.step(t) // the prefill
			// The decode engine has the KV cache (its wait for the prefill, a timer of its own
			// clock, is over) and decodes.
			waitFor(t, "the decode running", func() (bool, string) { return d.e.Running() == 1, "not yet" })
			d.step(t) // the first decode step: the first token
			sc.firstToken(t)
			_ = sc.conn.Close()
			d.awaitAbort(t, 1)
			d.stopsWithinOneStep(t)
			if n := p.e.Running(); n != 0 {
				t.Errorf("the prefill engine runs %d requests after its prefill", n)
			}
		})
		for _, keep := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/pd-during-prefill/prefill_to_completion=%t", flavor, keep), func(t *testing.T) {
				p := startClocked(t, "p1", "llama-pd", mockengine.RolePrefill, flavor)
				d := startClocked(t, "d1", "llama-pd", mockengine.RoleDecode, flavor)
				bp := p.e.BootstrapPort()
				base := abortRouter(t, []config.Worker{
					{ID: "p1", URL: p.e.URL(), Model: "llama-pd", Role: config.RolePrefill, Flavor: flavorOf(flavor), DPSize: 1, BootstrapPort: &bp},
					{ID: "d1", URL: d.e.URL(), Model: "llama-pd", Role: config.RoleDecode, Flavor: flavorOf(flavor), DPSize: 1},
				}, keep)
				sc := startStream(t, base, "llama-pd")
				// The prefill is under way (its step pending), the decode waits for it. (A
				// client that leaves before an SGLang engine has its request is not stopped
				// by the abort API, which names requests the engine knows.)
				ctx, cancel := context.WithTimeout(context.Background(), cacheWait)
				defer cancel()
				if err := p.clk.WaitForTimers(ctx, 1); err != nil {
					t.Fatal(err)
				}
				waitFor(t, "the decode waiting for its prefill", func() (bool, string) {
					n := d.e.Waiting()
					return n == 1, fmt.Sprintf("%d waiting", n)
				})
				_ = sc.conn.Close()
				d.awaitAbort(t, 1)
				if keep {
					p.step(t) // the prefill completes
					waitFor(t, "the prefill done", func() (bool, string) { return p.e.Running() == 0, "running" })
					if n := p.e.Aborts(); n != 0 {
						t.Errorf("prefill_to_completion: the prefill was aborted (%d)", n)
					}
					return
				}
				p.awaitAbort(t, 1)
				p.stopsWithinOneStep(t)
			})
		}
	}
}
