package mockengine

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"switchyard/kv/events"
)

func TestContextStopsEngine(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	e, err := Start(ctx, Config{ZeroCost: true})
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(e.URL(), "http://")
	cancel()
	poll(t, "the engine to stop listening", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestInvalidConfig(t *testing.T) {
	_, err := Start(t.Context(), Config{Role: "router", PageSize: -1, Speedup: -1, Faults: Faults{FailRate: 3}})
	if err == nil {
		t.Fatal("Start accepted an invalid configuration")
	}
	for _, want := range []string{"role", "page_size", "speedup", "fail_rate"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not report %s", err, want)
		}
	}
	if e := (Engine{}); e.SetFaults(Faults{FailRate: -1}) == nil {
		t.Error("SetFaults accepted a negative rate")
	}
}

func TestAllBlocksClearedAtStart(t *testing.T) {
	e := startEngine(t, Config{ZeroCost: true, DPSize: 2, KVEvents: KVEvents{Replay: true}})
	for rank := range 2 {
		batches := replay(t, e.ReplayEndpoint(rank), 0, rank == 0)
		if len(batches) != 1 || batches[0].seq != 0 || len(batches[0].b.Events) != 1 ||
			batches[0].b.Events[0].Kind != events.EventAllBlocksCleared || batches[0].b.DPRank != rank {
			t.Fatalf("rank %d: replay from 0 = %+v, want AllBlocksCleared as seq 0", rank, batches)
		}
	}
}

// TestCloseStopsEverything checks that Close leaves no goroutine behind, with requests of
// every kind in flight or done: streams, a hung stream, PD handshakes and ZMQ subscribers.
func TestCloseStopsEverything(t *testing.T) {
	tr := &http.Transport{}
	c := &http.Client{Transport: tr}
	p, err := Start(t.Context(), Config{Role: RolePrefill, DPSize: 2, Speedup: 100, KVEvents: KVEvents{Replay: true}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := Start(t.Context(), Config{Role: RoleDecode, Speedup: 100})
	if err != nil {
		t.Fatal(err)
	}
	body := pdBody(ids(1, 64), "127.0.0.1", p.BootstrapPort(), 3)
	body["stream"] = true
	pd := make(chan error, 2)
	for _, e := range []*Engine{d, p} {
		go func() {
			r, err := tryDo(c, "POST", e.URL()+"/generate", body)
			if err == nil && r.status != 200 {
				err = errors.New(string(r.body))
			}
			pd <- err
		}()
	}
	for range 2 {
		if err := <-pd; err != nil {
			t.Fatal(err)
		}
	}
	// A Restart drops the connections of a ZMQ subscriber and a replay peer: their
	// goroutines must end too.
	old := dialSub(t, p.KVEventsEndpoint(1), "")
	poll(t, "the subscription", func() bool { return p.ranks[1].kvpub.sock.Subscribers() == 1 })
	_, rport, err := net.SplitHostPort(strings.TrimPrefix(p.ReplayEndpoint(0), "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	rp, err := strconv.Atoi(rport)
	if err != nil {
		t.Fatal(err)
	}
	dialRaw(t, rp, "DEALER")
	p.Restart()
	old.dropped(t, "subscriber at the restart")
	// A raw subscriber stays connected through Close; a hung stream is cut by it.
	sub, err := net.Dial("tcp", strings.TrimPrefix(p.KVEventsEndpoint(1), "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	_ = p.SetFaults(Faults{Hang: true})
	resp, err := c.Post(p.URL()+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","stream":true,"bootstrap_host":"h","bootstrap_room":4}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Error("the hung stream ended cleanly; want it cut by Close")
	}
	resp.Body.Close()
	tr.CloseIdleConnections()
	sub.Close()
	poll(t, "the engines' goroutines to exit", func() bool { return len(engineGoroutines()) == 0 })
}

// engineGoroutines returns the stacks of goroutines that belong to an engine: this
// package's own, and the HTTP servers' connections. (fasthttp keeps a date-updating
// goroutine for the process and lets idle worker-pool cleaners exit on their next tick.)
func engineGoroutines() []string {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "TestCloseStopsEverything") || strings.Contains(g, "testing.(*T).Run") {
			continue
		}
		for _, mark := range []string{"switchyard/bench/mockengine.", "fasthttp.(*Server).serveConn", "net/http.(*conn).serve", "net/http.(*persistConn)"} {
			if strings.Contains(g, mark) {
				out = append(out, g)
				break
			}
		}
	}
	return out
}
