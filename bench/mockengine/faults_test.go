package mockengine

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"switchyard/kv/events"
	"switchyard/load"
)

func chatReq(stream bool, maxTokens int) map[string]any {
	return map[string]any{
		"model": "m", "max_tokens": maxTokens, "stream": stream,
		"messages": []map[string]any{{"role": "user", "content": "Tell me about caches."}},
	}
}

func TestFaultFailFirst(t *testing.T) {
	e := startEngine(t, Config{ZeroCost: true, Faults: Faults{FailFirst: 2, FailStatus: 503}})
	c := newClient(t)
	for i, want := range []int{503, 503, 200, 200} {
		r := do(t, c, "POST", e.URL()+"/v1/chat/completions", chatReq(false, 2))
		if r.status != want {
			t.Fatalf("request %d: status %d, want %d (%s)", i, r.status, want, r.body)
		}
		if want != 200 && path(t, r.json(t), "error", "code") != float64(want) {
			t.Fatalf("request %d: error body %s", i, r.body)
		}
	}
	// Setting the faults again restarts the count; the default status is 500.
	if err := e.SetFaults(Faults{FailFirst: 1}); err != nil {
		t.Fatal(err)
	}
	if r := do(t, c, "POST", e.URL()+"/v1/completions", map[string]any{"prompt": "x"}); r.status != 500 {
		t.Fatalf("after SetFaults: %d, want 500", r.status)
	}
	if r := do(t, c, "POST", e.URL()+"/v1/completions", map[string]any{"prompt": "x"}); r.status != 200 {
		t.Fatalf("second after SetFaults: %d, want 200", r.status)
	}
}

func TestFaultFailRate(t *testing.T) {
	e := startEngine(t, Config{ZeroCost: true, Seed: 7, Faults: Faults{FailRate: 0.5}})
	c := newClient(t)
	failed := 0
	for range 200 {
		switch r := do(t, c, "POST", e.URL()+"/generate", map[string]any{"text": "x", "sampling_params": map[string]any{"max_new_tokens": 1}}); r.status {
		case 500:
			failed++
		case 200:
		default:
			t.Fatalf("status %d", r.status)
		}
	}
	if failed < 60 || failed > 140 {
		t.Fatalf("%d of 200 failed at rate 0.5", failed)
	}
	for _, rate := range []float64{0, 1} {
		if err := e.SetFaults(Faults{FailRate: rate}); err != nil {
			t.Fatal(err)
		}
		want := 200
		if rate == 1 {
			want = 500
		}
		for range 20 {
			if r := do(t, c, "POST", e.URL()+"/generate", map[string]any{"text": "x"}); r.status != want {
				t.Fatalf("rate %v: status %d", rate, r.status)
			}
		}
	}
}

func TestFaultFixedStatus(t *testing.T) {
	e := startEngine(t, Config{ZeroCost: true, Faults: Faults{Status: 429}})
	c := newClient(t)
	for _, route := range []string{"/v1/chat/completions", "/v1/completions", "/generate"} {
		r := do(t, c, "POST", e.URL()+route, chatReq(false, 1))
		if r.status != 429 || path(t, r.json(t), "error", "type") != "RateLimitError" {
			t.Errorf("%s: %d %s", route, r.status, r.body)
		}
	}
	if r := do(t, c, "GET", e.URL()+"/health", nil); r.status != 200 {
		t.Errorf("/health: %d; a status fault concerns inference only", r.status)
	}
}

func TestFaultLatency(t *testing.T) {
	clk := NewManualClock(time.Unix(1_800_000_000, 0))
	e := startEngine(t, Config{Clock: clk, Costs: &Costs{PrefillOverhead: time.Millisecond, DecodeStep: time.Millisecond},
		Faults: Faults{Latency: 250 * time.Millisecond}, LoadPublish: LoadPublish{Disabled: true}})
	done := async(t, "POST", e.URL()+"/generate", map[string]any{"text": "x", "sampling_params": map[string]any{"max_new_tokens": 1}})
	if err := clk.WaitForTimers(t.Context(), 1); err != nil { // the added latency
		t.Fatal(err)
	}
	start := clk.Now()
	runClock(t, clk)
	r := await(t, done)
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	// The latency is spent before the request is queued; the simulation then costs 1ms.
	if got := clk.Now().Sub(start); got < 250*time.Millisecond {
		t.Fatalf("request finished after %v of engine time, want at least 250ms", got)
	}
}

func TestFaultDropMidStream(t *testing.T) {
	e := startEngine(t, Config{ZeroCost: true, Faults: Faults{Drop: true, DropAfterTokens: 3}})
	c := newClient(t)
	resp, err := c.Post(e.URL()+"/v1/chat/completions", "application/json", jsonBody(t, chatReq(true, 10)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	events, done, err := sseEvents(resp.Body)
	if err == nil || done {
		t.Fatalf("stream ended cleanly (done=%v, err=%v); want a cut connection", done, err)
	}
	if len(events) != 3 {
		t.Fatalf("%d events before the drop, want 3", len(events))
	}
	// Non-streaming: the connection closes without a response.
	if _, err := tryDo(c, "POST", e.URL()+"/v1/chat/completions", chatReq(false, 10)); err == nil {
		t.Fatal("non-streaming request got a response")
	}
	// Fewer tokens than the threshold: the request completes.
	if r := do(t, c, "POST", e.URL()+"/v1/chat/completions", chatReq(false, 2)); r.status != 200 {
		t.Fatalf("short request: %d", r.status)
	}
}

func TestFaultHangBeforeFirstToken(t *testing.T) {
	e := startEngine(t, Config{ZeroCost: true, Faults: Faults{Hang: true}})
	c := newClient(t)
	// The stream starts (headers arrive) but no token does until the fault is cleared.
	resp, err := c.Post(e.URL()+"/v1/chat/completions", "application/json", jsonBody(t, chatReq(true, 3)))
	if err != nil {
		t.Fatalf("headers did not arrive: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
	}
	first := make(chan error, 1)
	go func() {
		_, err := resp.Body.Read(make([]byte, 1))
		first <- err
	}()
	waitLoad(t, e, "the stream to be held", func(r load.RankReport) bool { return r.Running == 1 })
	select {
	case err := <-first:
		t.Fatalf("a byte arrived while the engine hangs (err %v)", err)
	default:
	}
	if err := e.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-first:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testDeadline):
		t.Fatal("the stream did not resume")
	}
	if events, done, err := sseEvents(resp.Body); err != nil || !done || len(events) < 3 {
		t.Fatalf("resumed stream: %d events, done %v, err %v", len(events), done, err)
	}

	// A held non-streaming request is released when the fault is cleared...
	_ = e.SetFaults(Faults{Hang: true})
	held := async(t, "POST", e.URL()+"/generate", map[string]any{"text": "x", "sampling_params": map[string]any{"max_new_tokens": 2}})
	waitLoad(t, e, "the request to be held", func(r load.RankReport) bool { return r.Running == 1 })
	select {
	case r := <-held:
		t.Fatalf("hung request answered: %+v", r)
	default:
	}
	_ = e.SetFaults(Faults{})
	if r := await(t, held); r.status != 200 {
		t.Fatalf("released request: %d %s", r.status, r.body)
	}
	// ...or by /abort_request.
	_ = e.SetFaults(Faults{Hang: true})
	held = async(t, "POST", e.URL()+"/generate", map[string]any{"text": "x", "rid": "stuck"})
	waitLoad(t, e, "the request to be held", func(r load.RankReport) bool { return r.Running == 1 })
	if r := do(t, c, "POST", e.URL()+"/abort_request", map[string]any{"rid": "stuck"}); r.status != 200 || num(t, r.json(t)["aborted"]) != 1 {
		t.Fatalf("abort: %d %s", r.status, r.body)
	}
	if r := await(t, held); r.status != 400 || !strings.Contains(string(r.body), "aborted") {
		t.Fatalf("aborted request: %d %s", r.status, r.body)
	}
}

func TestFaultUnhealthyAfter(t *testing.T) {
	clk := NewManualClock(time.Unix(1_800_000_000, 0))
	e := startEngine(t, Config{ZeroCost: true, Clock: clk, Faults: Faults{UnhealthyAfter: time.Minute}, LoadPublish: LoadPublish{Disabled: true}})
	c := newClient(t)
	for _, route := range []string{"/health", "/health_generate"} {
		if r := do(t, c, "GET", e.URL()+route, nil); r.status != 200 {
			t.Fatalf("%s before the delay: %d %s", route, r.status, r.body)
		}
	}
	if err := clk.WaitForTimers(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Minute)
	poll(t, "/health to fail", func() bool { return do(t, c, "GET", e.URL()+"/health", nil).status == 503 })
	if r := do(t, c, "GET", e.URL()+"/health_generate", nil); r.status != 503 {
		t.Fatalf("/health_generate: %d", r.status)
	}
	_ = e.SetFaults(Faults{Unhealthy: true})
	if r := do(t, c, "GET", e.URL()+"/health", nil); r.status != 503 {
		t.Fatalf("Unhealthy: /health %d", r.status)
	}
	_ = e.SetFaults(Faults{})
	if r := do(t, c, "GET", e.URL()+"/health", nil); r.status != 200 {
		t.Fatalf("cleared: /health %d", r.status)
	}
}

func TestFaultStopEvents(t *testing.T) {
	e := startEngine(t, Config{ZeroCost: true, KVEvents: KVEvents{Replay: true}})
	c := newClient(t)
	sub := dialSub(t, e.KVEventsEndpoint(0), "")
	seq := syncKV(t, c, e, sub, "")
	_ = e.SetFaults(Faults{StopEvents: true})
	generate(t, e, ids(1, 40), 0, nil) // withheld: seq+1
	_ = e.SetFaults(Faults{})
	generate(t, e, ids(100, 40), 0, nil) // published: seq+2
	got, b := kvBatch(t, sub.next(t), "")
	if got != seq+2 || b.Events[0].Kind != 1 {
		t.Fatalf("after resuming: seq %d (want %d, a visible gap), events %+v", got, seq+2, b.Events)
	}
	// The withheld batch is in the replay buffer.
	batches := replay(t, e.ReplayEndpoint(0), seq+1, true)
	if len(batches) != 2 || batches[0].seq != seq+1 || batches[1].seq != seq+2 {
		t.Fatalf("replay from %d returned %+v", seq+1, batches)
	}
}

func TestFaultRestart(t *testing.T) {
	e := startEngine(t, Config{ZeroCost: true, KVEvents: KVEvents{Replay: true}})
	c := newClient(t)
	prompt := ids(1, 100)
	generate(t, e, prompt, 1, nil)
	if m := generate(t, e, prompt, 1, nil); num(t, path(t, m, "meta_info", "cached_tokens")) == 0 {
		t.Fatal("no cache hit before the restart")
	}
	if getLoads(t, e)[0].TotalPrefillUncached == 0 {
		t.Fatal("no prefill counted before the restart")
	}
	if r := do(t, c, "POST", e.URL()+"/mock/restart", nil); r.status != 200 {
		t.Fatalf("restart: %d", r.status)
	}
	if m := generate(t, e, prompt, 1, nil); num(t, path(t, m, "meta_info", "cached_tokens")) != 0 {
		t.Fatal("cache survived the restart")
	}
	if got := getLoads(t, e)[0].TotalPrefillUncached; got != 100 {
		t.Fatalf("prefill counter after restart = %d, want 100 (reset, then one request)", got)
	}
	// Sequence numbers start again at 0 with AllBlocksCleared.
	batches := replay(t, e.ReplayEndpoint(0), 0, false)
	if len(batches) != 2 || batches[0].seq != 0 || batches[0].b.Events[0].Kind != 3 {
		t.Fatalf("after restart the replay buffer holds %+v", batches)
	}
}

// TestFaultRestartCutsStreams restarts while a stream is stuck mid-way.
func TestFaultRestartCutsStreams(t *testing.T) {
	clk := NewManualClock(time.Unix(1_800_000_000, 0))
	e := startEngine(t, Config{Clock: clk, LoadPublish: LoadPublish{Disabled: true}, Faults: Faults{RestartEvery: time.Hour, RestartDowntime: time.Minute}})
	c := newClient(t)
	resp, err := c.Post(e.URL()+"/v1/chat/completions", "application/json", jsonBody(t, chatReq(true, 5)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := clk.WaitForTimers(t.Context(), 2); err != nil { // restart timer and the prefill step
		t.Fatal(err)
	}
	clk.Advance(time.Hour) // the prefill finishes, then the restart fires
	_, done, err := sseEvents(resp.Body)
	if done || err == nil {
		t.Fatalf("stream survived the restart: done=%v err=%v", done, err)
	}
	if r := do(t, c, "GET", e.URL()+"/health", nil); r.status != 503 {
		t.Fatalf("/health during the restart downtime: %d", r.status)
	}
	clk.Advance(time.Minute)
	if r := do(t, c, "GET", e.URL()+"/health", nil); r.status != 200 {
		t.Fatalf("/health after the downtime: %d", r.status)
	}
}

// TestFaultRestartDropsConnections checks that Restart closes every connection of the
// KV-event, replay and load sockets before the new run publishes, as a restarted process
// does, and that a subscriber which connects again sees the new run from sequence 0.
func TestFaultRestartDropsConnections(t *testing.T) {
	e := startEngine(t, Config{ZeroCost: true, KVEvents: KVEvents{Replay: true}, LoadPublish: LoadPublish{Interval: 10 * time.Millisecond}})
	c := newClient(t)
	sub := dialSub(t, e.KVEventsEndpoint(0), "")
	if seq := syncKV(t, c, e, sub, ""); seq == 0 {
		t.Fatal("synced on sequence 0: the restart's sequence 0 would not be told apart")
	}
	loads := dialSub(t, e.LoadEndpoint(0), "load")
	loads.next(t)
	_, port, err := net.SplitHostPort(strings.TrimPrefix(e.ReplayEndpoint(0), "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	replayPeer := dialRaw(t, n, "DEALER")

	e.Restart()
	// The old subscription ends without a message of the new run: AllBlocksCleared went out
	// after its connection was closed.
	sub.dropped(t, "KV-event subscriber")
	if _, err := replayPeer.read(t); err == nil {
		t.Fatal("the replay connection still delivers frames after the restart")
	}
	deadline := time.After(testDeadline)
	for done := false; !done; {
		select { // gauges sent before the restart may still be queued
		case <-loads.msgs:
		case err := <-loads.done:
			if err == nil {
				t.Fatal("load subscriber: receiving ended without an error")
			}
			done = true
		case <-deadline:
			t.Fatal("the load connection was not dropped within the deadline")
		}
	}

	// The sockets still listen: a new subscription receives the new run's batches, and the
	// replay buffer holds its AllBlocksCleared as sequence 0.
	again := dialSub(t, e.KVEventsEndpoint(0), "")
	poll(t, "the new subscription", func() bool { return e.ranks[0].kvpub.sock.Subscribers() == 1 })
	generate(t, e, ids(1, 40), 0, nil)
	if seq, b := kvBatch(t, again.next(t), ""); seq != 1 || b.Events[0].Kind != events.EventBlockStored {
		t.Fatalf("first live batch after reconnecting: seq %d, events %+v; want seq 1, BlockStored", seq, b.Events)
	}
	batches := replay(t, e.ReplayEndpoint(0), 0, true)
	if len(batches) != 2 || batches[0].seq != 0 || len(batches[0].b.Events) != 1 ||
		batches[0].b.Events[0].Kind != events.EventAllBlocksCleared || batches[1].seq != 1 {
		t.Fatalf("replay from 0 after the restart returned %+v, want AllBlocksCleared as seq 0, then seq 1", batches)
	}
	loadsAgain := dialSub(t, e.LoadEndpoint(0), "load")
	loadsAgain.next(t)
}
