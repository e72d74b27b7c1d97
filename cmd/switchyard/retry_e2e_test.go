package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"switchyard/bench/mockengine"
	"switchyard/config"
)

// outcome is how one client request of the kill test ended.
type killOutcome struct {
	stream bool
	status int
	worker string
	// events counts the stream's data events before its end; failed says the stream ended
	// with an error event (or without [DONE]).
	events int
	failed bool
	err    error
}

// killRequest sends one small chat request and reads its whole answer.
func killRequest(client *http.Client, url string, stream bool) killOutcome {
	body := `{"model":"m","messages":[{"role":"user","content":"Tell me about switchyards."}],"max_tokens":16`
	if stream {
		body += `,"stream":true`
	}
	o := killOutcome{stream: stream}
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body+"}"))
	if err != nil {
		o.err = err
		return o
	}
	defer resp.Body.Close()
	o.status, o.worker = resp.StatusCode, resp.Header.Get("X-Switchyard-Worker")
	if !stream || o.status != 200 {
		_, o.err = io.Copy(io.Discard, resp.Body)
		return o
	}
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		switch {
		case !ok:
		case line == "[DONE]":
			done = true
		case strings.HasPrefix(line, `{"error"`):
			o.failed = true
		case !o.failed:
			o.events++
		}
	}
	o.err = sc.Err()
	o.failed = o.failed || !done
	return o
}

// killSwitch stands between the router and one engine on loopback and can kill it the way
// a crashed process dies: kill closes the listening socket (new connections are refused)
// and resets every open connection at once, mid-request or mid-stream.
type killSwitch struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	killed bool
	wg     sync.WaitGroup
}

func newKillSwitch(t *testing.T, target string) *killSwitch {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	k := &killSwitch{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	k.wg.Go(k.accept)
	t.Cleanup(func() {
		k.kill()
		k.wg.Wait()
	})
	return k
}

func (k *killSwitch) url() string { return "http://" + k.ln.Addr().String() }

func (k *killSwitch) accept() {
	for {
		c, err := k.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", k.target)
		if err != nil || !k.track(c, up) {
			_ = c.Close()
			if up != nil {
				_ = up.Close()
			}
			continue
		}
		k.wg.Go(func() { k.pipe(c, up) })
		k.wg.Go(func() { k.pipe(up, c) })
	}
}

func (k *killSwitch) track(cs ...net.Conn) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.killed {
		return false
	}
	for _, c := range cs {
		k.conns[c] = struct{}{}
	}
	return true
}

func (k *killSwitch) pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
}

// kill refuses new connections and resets the open ones.
func (k *killSwitch) kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.killed {
		return
	}
	k.killed = true
	_ = k.ln.Close()
	for c := range k.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // a reset, as the kernel sends for a killed process
		}
		_ = c.Close()
	}
}

// TestRetriesSurviveAKilledEngine: three engines serve a steady mix of non-streaming requests
// and streams, and one of them is killed mid-run. With retries on, no non-streaming request
// fails and no stream fails that had not started (a stream the killed engine had begun may
// end with an error event); once the killed engine's breaker has opened it gets no traffic.
func TestRetriesSurviveAKilledEngine(t *testing.T) {
	var engines []*killSwitch
	cfg := config.Default()
	cfg.Server.Port = 0
	for _, id := range []string{"e1", "e2", "e3"} {
		// A long prefill (60ms) and 16 decode steps (100ms): a kill finds requests in both.
		costs := mockengine.DefaultCosts()
		costs.PrefillOverhead, costs.DecodeStep = 60*time.Millisecond, 6*time.Millisecond
		e := startMock(t, mockengine.Config{WorkerID: id, Model: "m", Costs: &costs})
		k := newKillSwitch(t, strings.TrimPrefix(e.URL(), "http://"))
		engines = append(engines, k)
		cfg.Workers = append(cfg.Workers, config.Worker{ID: id, URL: k.url(), Model: "m", Role: config.RolePlain, DPSize: 1})
	}
	cfg.Models = map[string]config.Model{"m": {Buckets: []config.Bucket{{ID: "all", Groups: config.Groups{Plain: &config.Group{}}}}}}
	cfg.Health.Interval = time.Hour // the breaker alone takes the engine out
	cfg.Health.BreakerFailures = 3
	cfg.Health.BreakerCooldown = time.Hour
	cfg.Retry.InitialBackoff, cfg.Retry.MaxBackoff = time.Millisecond, 5*time.Millisecond
	srv, url := startRouter(t, cfg)
	killed := engines[1]
	victim := func() bool { return !srv.Workers().Worker("e2").Healthy() }

	client := &http.Client{Timeout: 30 * time.Second}
	var (
		mu       sync.Mutex
		outcomes []killOutcome
		served   atomic.Int64
	)
	// run sends requests from 8 clients, half of them streams, until stop says so (or a
	// bound of requests is reached), and collects their outcomes.
	run := func(stop func(n int64) bool) {
		var wg sync.WaitGroup
		for c := range 8 {
			wg.Go(func() {
				for i := 0; i < 400; i++ {
					o := killRequest(client, url, (c+i)%2 == 0)
					mu.Lock()
					outcomes = append(outcomes, o)
					mu.Unlock()
					if stop(served.Add(1)) {
						return
					}
				}
			})
		}
		wg.Wait()
	}

	// Phase 1: the engine is killed once 60 requests were served, at a moment when it has
	// requests in flight; the run goes on until its breaker has opened and 60 more requests
	// were served.
	var killedAt atomic.Int64
	var kill sync.Once
	inflight := func() int64 { return srv.Workers().Worker("e2").Counters.InFlight() }
	run(func(n int64) bool {
		if n >= 60 && killedAt.Load() == 0 && inflight() >= 2 {
			kill.Do(func() {
				killedAt.Store(n)
				killed.kill()
			})
		}
		return killedAt.Load() > 0 && victim() && n > killedAt.Load()+60
	})
	if killedAt.Load() == 0 {
		t.Fatal("the engine to kill never had two requests in flight")
	}
	if !victim() {
		t.Fatal("the killed engine's breaker never opened")
	}
	// Phase 2: nothing reaches the killed engine any more.
	before := srv.Workers().Worker("e2").Counters.Dispatched()
	start := served.Load()
	run(func(n int64) bool { return n >= start+120 })
	if after := srv.Workers().Worker("e2").Counters.Dispatched(); after != before {
		t.Errorf("the killed engine got %d dispatches after its breaker opened", after-before)
	}

	var failures []string
	broken := 0
	for _, o := range outcomes {
		switch {
		case o.err != nil:
			failures = append(failures, fmt.Sprintf("stream=%v: %v", o.stream, o.err))
		case o.status != 200:
			failures = append(failures, fmt.Sprintf("stream=%v: status %d from %s", o.stream, o.status, o.worker))
		case o.stream && o.failed && o.events == 0:
			failures = append(failures, fmt.Sprintf("a stream from %s failed before its first event", o.worker))
		case o.stream && o.failed && o.worker != "e2":
			failures = append(failures, fmt.Sprintf("a stream from %s, which was not killed, failed", o.worker))
		case o.stream && o.failed:
			broken++ // begun on the killed engine: allowed
		}
	}
	if len(failures) > 0 {
		t.Fatalf("%d of %d requests failed at the client:\n%s", len(failures), len(outcomes), strings.Join(failures, "\n"))
	}
	t.Logf("%d requests, %d streams begun on the killed engine cut short, %v retries", len(outcomes), broken,
		metricSum(t, url, "switchyard_retries_total"))
}

// metricSum returns the sum of every series of a metric on the router's /metrics.
func metricSum(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
			sum += v
		}
	}
	return sum
}
