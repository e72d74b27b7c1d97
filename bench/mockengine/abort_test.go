package mockengine

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// rawCall is one inference request on a connection of its own, so that the test decides
// when the caller hangs up.
type rawCall struct {
	conn  net.Conn
	lines chan string // the response, line by line, until the connection ends
}

func startCall(t *testing.T, e *Engine, path string, body map[string]any) *rawCall {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", strings.TrimPrefix(e.URL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: engine\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, len(b), b); err != nil {
		t.Fatal(err)
	}
	rc := &rawCall{conn: c, lines: make(chan string, 64)}
	go func() {
		defer close(rc.lines)
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			rc.lines <- sc.Text()
		}
	}()
	return rc
}

// awaitLine ends the prefill step (its first token) and waits for a response line with
// prefix.
func (rc *rawCall) awaitLine(t *testing.T, e *Engine, clk *ManualClock, prefix string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testDeadline)
	defer cancel()
	if err := clk.WaitForTimers(ctx, 1); err != nil {
		t.Fatalf("no prefill step begins: %v; %s", err, engineState(e, clk))
	}
	if _, err := clk.AdvanceToNext(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(testDeadline)
	for {
		select {
		case l, ok := <-rc.lines:
			if !ok {
				t.Fatalf("the connection ended before a line %q", prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return
			}
		case <-deadline:
			t.Fatalf("no line %q", prefix)
		}
	}
}

// runningAfterOneStep lets the step in progress end (the next one begins), then reports the
// tokens rank 0 has generated, with the clock frozen again and wantRunning requests running.
func runningAfterOneStep(t *testing.T, e *Engine, clk *ManualClock, wantRunning int) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testDeadline)
	defer cancel()
	if err := clk.WaitForTimers(ctx, 1); err != nil {
		t.Fatalf("no step begins: %v", err)
	}
	if _, err := clk.AdvanceToNext(ctx); err != nil {
		t.Fatal(err)
	}
	// The next step has begun: the one that ended is fully applied.
	if err := clk.WaitForTimers(ctx, 1); err != nil {
		t.Fatalf("no next step begins: %v", err)
	}
	poll(t, fmt.Sprintf("running == %d after one step", wantRunning), func() bool {
		return running(e) == int64(wantRunning)
	})
	return genTokens(e)
}

// stoppedWithinOneStep: once the step in progress (if any) ends, rank 0 runs nothing and no
// step is pending; it reports the tokens generated. An abort that arrives between two steps
// is reaped before the next step begins: then no step is left to end.
func stoppedWithinOneStep(t *testing.T, e *Engine, clk *ManualClock) int64 {
	t.Helper()
	poll(t, "a step in progress or nothing running", func() bool {
		return running(e) == 0 || clk.Pending() > 0
	})
	if running(e) > 0 {
		ctx, cancel := context.WithTimeout(t.Context(), testDeadline)
		defer cancel()
		if _, err := clk.AdvanceToNext(ctx); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, "nothing running after one step", func() bool { return running(e) == 0 })
	if p := clk.Pending(); p != 0 {
		t.Errorf("%d steps begun after the abort", p)
	}
	return genTokens(e)
}

// engineState describes rank 0 and the clock for a failure message.
func engineState(e *Engine, clk *ManualClock) string {
	reps, _ := e.reports()
	return fmt.Sprintf("rank 0: %d running, %d waiting, %d tokens generated; %d aborts; %d timers pending",
		reps[0].Running, reps[0].Waiting, genTokens(e), e.Aborts(), clk.Pending())
}

// running is rank 0's running count, as its load report says.
func running(e *Engine) int64 {
	reps, _ := e.reports()
	return reps[0].Running
}

// genTokens is the tokens rank 0 has generated.
func genTokens(e *Engine) int64 {
	r := e.ranks[0]
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats.genTokens
}

// TestAbortStopsTheWork: a vLLM engine stops a request within one decode step of its caller
// hanging up, streaming or not; an SGLang engine keeps generating until /abort_request names
// the request, then stops within one step. Nothing moves the engine's clock but the test.
func TestAbortStopsTheWork(t *testing.T) {
	costs := &Costs{PrefillOverhead: time.Millisecond, DecodeStep: 10 * time.Millisecond}
	for _, tt := range []struct {
		name   string
		flavor Flavor
		stream bool
	}{
		{"vllm stream", FlavorVLLM, true},
		{"vllm blocking", FlavorVLLM, false},
		{"sglang blocking", FlavorSGLang, false},
		{"sglang stream", FlavorSGLang, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := NewManualClock(time.Unix(1_800_000_000, 0))
			e := startEngine(t, Config{Clock: clk, Flavor: tt.flavor, Costs: costs, Model: "m",
				KVEvents: KVEvents{Disabled: true}, LoadPublish: LoadPublish{Disabled: true}})
			body := chatReq(tt.stream, 100)
			body["rid"] = "req-1"
			rc := startCall(t, e, "/v1/chat/completions", body)
			if tt.stream {
				rc.awaitLine(t, e, clk, `data: {`) // the first token reached the caller
			} else {
				runningAfterOneStep(t, e, clk, 1) // prefilled, decoding
			}
			_ = rc.conn.Close()
			if tt.flavor == FlavorSGLang {
				// The caller left, but nothing tells the engine until it writes (a stream) or
				// is told.
				tokens := runningAfterOneStep(t, e, clk, 1)
				if got := e.Aborts(); got != 0 && !tt.stream {
					t.Fatalf("%d aborts without /abort_request", got)
				}
				c := newClient(t)
				if r := do(t, c, "POST", e.URL()+"/abort_request", map[string]any{"rid": "req-1"}); r.status != 200 {
					t.Fatalf("/abort_request: %d %s", r.status, r.body)
				}
				ctx, cancel := context.WithTimeout(t.Context(), testDeadline)
				defer cancel()
				if err := e.WaitAborts(ctx, 1); err != nil {
					t.Fatal(err)
				}
				if after := stoppedWithinOneStep(t, e, clk); after > tokens+1 {
					t.Errorf("%d tokens after the abort, want at most one step's", after-tokens)
				}
				return
			}
			ctx, cancel := context.WithTimeout(t.Context(), testDeadline)
			defer cancel()
			if err := e.WaitAborts(ctx, 1); err != nil {
				t.Fatal(err)
			}
			if tokens := stoppedWithinOneStep(t, e, clk); tokens > 3 {
				t.Errorf("%d tokens generated, want the first ones and at most one step after the caller left", tokens)
			}
		})
	}
}

// TestAbortIsInEffectWhenCounted: an abort is counted (Aborts, WaitAborts) only once the
// scheduler can see it, so that the step in progress when the count moves is the request's
// last. The test holds the lock the count takes while a vLLM caller hangs up: the request
// must be marked aborted, and stop when that step ends, before its count can move. (Counted
// first, a waiter could let the step end before the mark, and the request ran on.)
func TestAbortIsInEffectWhenCounted(t *testing.T) {
	clk := NewManualClock(time.Unix(1_800_000_000, 0))
	e := startEngine(t, Config{Clock: clk, Flavor: FlavorVLLM, Model: "m",
		Costs:    &Costs{PrefillOverhead: time.Millisecond, DecodeStep: 10 * time.Millisecond},
		KVEvents: KVEvents{Disabled: true}, LoadPublish: LoadPublish{Disabled: true}})
	body := chatReq(false, 100)
	body["rid"] = "req-1"
	rc := startCall(t, e, "/v1/chat/completions", body)
	runningAfterOneStep(t, e, clk, 1) // prefilled, decoding
	e.jobsMu.Lock()
	j := e.jobs["req-1"]
	locked := true
	unlock := func() {
		if locked {
			locked = false
			e.jobsMu.Unlock()
		}
	}
	defer unlock()
	if j == nil {
		t.Fatal("no job req-1")
	}
	_ = rc.conn.Close()
	poll(t, "the request marked aborted before its abort is counted", func() bool {
		return j.seqs[0].aborted.Load()
	})
	ctx, cancel := context.WithTimeout(t.Context(), testDeadline)
	defer cancel()
	if _, err := clk.AdvanceToNext(ctx); err != nil { // the step in progress ends
		t.Fatal(err)
	}
	poll(t, "nothing running after the step in progress", func() bool { return running(e) == 0 })
	if p := clk.Pending(); p != 0 {
		t.Errorf("%d steps begun after the abort", p)
	}
	unlock()
	if err := e.WaitAborts(ctx, 1); err != nil {
		t.Fatal(err)
	}
}
