package httpfront

import (
	"bufio"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"switchyard/config"
	"switchyard/httpfront/heldtest"
)

// heldSlack bounds the goroutines a burst of held streams may add besides one per stream:
// those started once (the engine connection pool's cleaner, fasthttp's worker-pool cleaner).
const heldSlack = 16

// relayGoroutines counts the goroutines that relay a stream, and those of them that run on
// fasthttp's serving goroutine (its connection loop is below the relay).
func relayGoroutines() (relays, onServer int) {
	buf := make([]byte, 16<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "httpfront.(*relay).WriteTo") {
			relays++
			if strings.Contains(g, "fasthttp.(*Server).serveConn") {
				onServer++
			}
		}
	}
	return relays, onServer
}

// TestHeldStreamGoroutines: a held idle stream costs the router one goroutine, the one
// fasthttp serves the client's connection on, which relays the stream itself: no reader or
// writer goroutine of the stream's own, no goroutine per heartbeat, idle or deadline timer.
// The engine and the clients add no goroutine per stream here, so the process's count grows
// by the router's alone.
func TestHeldStreamGoroutines(t *testing.T) {
	const streams = 200
	e := heldtest.NewEngine(t)
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", e.URL(), "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("all", nil, nil, "A")}}}
	// Heartbeats every 5 ms: each held stream writes several while it is counted.
	ts := startServer(t, cfg, Options{SkipStartupChecks: true, NoTelemetry: true, HeartbeatInterval: 5 * time.Millisecond})
	addr := ts.Addr().String()
	body := chatBody("llama", "hi", `"stream":true`)

	before := runtime.NumGoroutine()
	conns := make([]net.Conn, 0, streams)
	var closeOnce sync.Once
	closeAll := func() {
		closeOnce.Do(func() {
			for _, c := range conns {
				_ = c.Close()
			}
		})
	}
	defer closeAll()
	for range streams {
		conns = append(conns, heldtest.Open(t, addr, body))
	}
	// One more stream's heartbeat, read: the held streams' timers have run meanwhile.
	probe := heldtest.Open(t, addr, body)
	conns = append(conns, probe)
	_ = probe.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(probe)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("no heartbeat on a held stream: %v", err)
		}
		if line == ": keep-alive\n" {
			break
		}
	}
	after := runtime.NumGoroutine()
	added := after - before
	t.Logf("%d held streams: %d goroutines added (%.2f per stream)", streams+1, added, float64(added)/float64(streams+1))
	if added > streams+1+heldSlack {
		t.Fatalf("%d held streams added %d goroutines, want at most one per stream (+%d)", streams+1, added, heldSlack)
	}
	if n := ts.metrics.inflight.Load(); n != streams+1 {
		t.Fatalf("router in flight %d, want %d: the streams must still be held", n, streams+1)
	}
	// Each stream waits on a goroutine of its own, not on fasthttp's serving goroutine, which
	// would hold fasthttp's read and write buffers, the request context and the stack the
	// request's handling grew.
	relays, onServer := relayGoroutines()
	if relays < streams+1 || onServer > 0 {
		t.Fatalf("%d goroutines relay a stream, %d of them on fasthttp's serving goroutine; want %d, none", relays, onServer, streams+1)
	}
	// Clients that leave end their streams (the hang-up poller interrupts the engine reads).
	closeAll()
	ts.waitBackground(t)
}
