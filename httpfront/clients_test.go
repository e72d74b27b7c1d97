package httpfront

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"switchyard/config"
)

// Clients that misbehave: they send too much, stop reading, hold connections open without a
// word, or arrive when the process is out of file descriptors.

func oneEngineConfig(e *fakeEngine) *config.Config {
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("all", nil, nil, "A")}}}
	return cfg
}

// writeFirst sends a request the way Python's requests (urllib3) does: the whole body
// first, going on to read the answer when the write fails, as urllib3 does on a broken pipe
// or a reset. It returns the answer, its body, and the error of the body's write.
func writeFirst(t *testing.T, addr string, head string, body []byte) (*http.Response, []byte, error, error) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	_, werr := c.Write([]byte(head))
	if werr == nil {
		_, werr = c.Write(body)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil, nil, werr, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, b, werr, err
}

// TestTooLargeAnswerReachesWriteFirstClient: a body over the cap is answered 413 before it
// is read; a client that writes its whole body before reading must still read the 413,
// not a connection reset. The router must not reset the connection while the client is
// still sending (a reset can destroy the answer before the client reads it): the client's
// write completes and the answer ends with a clean end of stream.
func TestTooLargeAnswerReachesWriteFirstClient(t *testing.T) {
	e := newFakeEngine(t, "A", "llama")
	cfg := oneEngineConfig(e)
	cfg.Server.MaxBodyBytes = 1 << 20
	ts := startServer(t, cfg, Options{SkipStartupChecks: true, NoTelemetry: true})
	body := []byte(chatBody("llama", strings.Repeat("x", 16<<20), ""))
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n"
	for i := range 40 {
		resp, b, werr, err := writeFirst(t, ts.Addr().String(), head, body)
		if werr != nil {
			t.Fatalf("try %d: the router reset the connection while the body was sent: %v", i, werr)
		}
		if err != nil {
			t.Fatalf("try %d: %v (the answer was lost)", i, err)
		}
		if resp.StatusCode != 413 || !contains(b, CodeRequestTooLarge) {
			t.Fatalf("try %d: status %d body %s", i, resp.StatusCode, b)
		}
	}
	if e.hits.Load() != 0 {
		t.Fatal("a too-large body reached the engine")
	}
}

// TestNonReadingClientReleased: a client that reads the answer's headers and then stops
// reading must not hold the stream: the write timeout ends it, or the request timeout when
// that comes first; the engine request is cancelled and the in-flight slot released.
func TestNonReadingClientReleased(t *testing.T) {
	tests := []struct {
		name                  string
		writeTimeout, request time.Duration
	}{
		{"write timeout", 200 * time.Millisecond, 10 * time.Minute},
		{"request timeout", time.Hour, 300 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newFakeEngine(t, "A", "llama")
			e.flood = true
			cfg := oneEngineConfig(e)
			cfg.Server.WriteTimeout = tt.writeTimeout
			cfg.Server.RequestTimeout = tt.request
			ts := startServer(t, cfg, Options{SkipStartupChecks: true, NoTelemetry: true, HeartbeatInterval: time.Hour})
			c, err := net.Dial("tcp", ts.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			body := chatBody("llama", "hi", `"stream":true`)
			if _, err := c.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: " +
				strconv.Itoa(len(body)) + "\r\n\r\n" + body)); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("answer: %v", err)
			}
			// The client reads nothing more. The engine's stream must be cancelled.
			waitFor(t, e.gone, "the engine to see its stream cancelled")
			ts.waitBackground(t)
			if ts.metrics.inflight.Load() != 0 || ts.tracker.Outstanding() != 0 {
				t.Fatalf("in flight %d, guards %d after the stream ended", ts.metrics.inflight.Load(), ts.tracker.Outstanding())
			}
		})
	}
}

// rawConns opens n connections that send nothing.
func rawConns(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns[i] = c
	}
	return conns
}

// rawGet sends GET path on a new connection and reads the answer.
func rawGet(t *testing.T, addr, path string) (int, []byte) {
	t.Helper()
	resp, b, _, err := writeFirst(t, addr, "GET "+path+" HTTP/1.1\r\nHost: r\r\n\r\n", nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, b
}

// waitServerClosed waits (bounded) for the server to close c.
func waitServerClosed(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// TestConnectionCap: at server.max_connections a new connection takes the place of one that
// has sent nothing; with every connection busy it is answered 503 too_many_connections.
func TestConnectionCap(t *testing.T) {
	e := newFakeEngine(t, "A", "llama", withGate())
	cfg := oneEngineConfig(e)
	cfg.Server.MaxConnections = 3
	ts := startServer(t, cfg, Options{SkipStartupChecks: true, NoTelemetry: true, HeartbeatInterval: time.Hour})
	addr := ts.Addr().String()

	idle := rawConns(t, addr, 3)
	if status, b := rawGet(t, addr, "/health"); status != 200 {
		t.Fatalf("with the table full of silent connections: %d %s", status, b)
	}
	if !waitServerClosed(idle[0]) {
		t.Fatal("the oldest silent connection was not closed to make room")
	}
	if n := ts.conns.evicted.Get(); n < 1 {
		t.Fatalf("evicted %d", n)
	}
	for _, c := range idle {
		c.Close()
	}
	// The server notices those closes (and the /health connection's) on its own goroutines,
	// in its own time: one it has not noticed yet is still in the table, and one that has
	// not yet turned idle after its answer counts as busy, taking a stream's place. Start
	// the streams on an empty table.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !ts.conns.waitClosed(ctx) {
		t.Fatalf("%d connections still open after the clients closed them all", ts.conns.open())
	}

	// Three streams hold every connection busy.
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var bodies []io.ReadCloser
	for range 3 {
		resp, err := client.Post(ts.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("llama", "hi", `"stream":true`)))
		if err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, resp.Body)
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("stream %d: %d %s (open %d)", len(bodies), resp.StatusCode, b, ts.conns.open())
		}
		waitFor(t, e.streamed, "a stream's first chunk")
	}
	status, b := rawGet(t, addr, "/health")
	if status != 503 || !contains(b, CodeTooManyConnections) {
		t.Fatalf("with every connection busy: %d %s", status, b)
	}
	close(e.gate)
	for _, b := range bodies {
		_, _ = io.Copy(io.Discard, b)
		b.Close()
	}
}

// TestConnectionCapPerIP: server.max_connections_per_ip refuses one address's extra
// connections with 503.
func TestConnectionCapPerIP(t *testing.T) {
	e := newFakeEngine(t, "A", "llama")
	cfg := oneEngineConfig(e)
	cfg.Server.MaxConnectionsPerIP = 2
	ts := startServer(t, cfg, Options{SkipStartupChecks: true, NoTelemetry: true})
	held := rawConns(t, ts.Addr().String(), 2)
	status, b := rawGet(t, ts.Addr().String(), "/health")
	if status != 503 || !contains(b, CodeTooManyConnections) || !contains(b, "max_connections_per_ip") {
		t.Fatalf("third connection from one address: %d %s", status, b)
	}
	held[0].Close()
	// Once one closes, the address may connect again (its close is noticed asynchronously).
	waitUntil(t, "the server to release the closed connection", func() bool { return ts.conns.open() == 1 })
	if status, b := rawGet(t, ts.Addr().String(), "/health"); status != 200 {
		t.Fatalf("still refused after a connection closed: %d %s", status, b)
	}
}

// fdExhaustedListener fails its first accepts with EMFILE, as a process out of file
// descriptors does.
type fdExhaustedListener struct {
	net.Listener
	failures atomic.Int32
}

func (l *fdExhaustedListener) Accept() (net.Conn, error) {
	if l.failures.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestAcceptSurvivesFDExhaustion: accept failing with "too many open files" must not stop
// the server; it retries with backoff and serves once descriptors are free.
func TestAcceptSurvivesFDExhaustion(t *testing.T) {
	e := newFakeEngine(t, "A", "llama")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &fdExhaustedListener{Listener: ln}
	fl.failures.Store(5)
	ts := startServer(t, oneEngineConfig(e), Options{SkipStartupChecks: true, NoTelemetry: true, Listener: fl})
	r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
	if r.status != 200 {
		t.Fatalf("status %d body %s", r.status, r.body)
	}
	select {
	case err := <-ts.done:
		t.Fatalf("Run returned %v after EMFILE", err)
	default:
	}
	if n := ts.conns.acceptErrors.Get(); n != 5 {
		t.Errorf("accept errors counted %d, want 5", n)
	}
}

// TestConcurrentBombsBoundedMemory: 32 compression bombs at once are each refused (413, or
// 503 body_budget_exhausted while the body budget is spent) and the router allocates a
// bounded amount doing so: at most its body budget plus working memory, not 32 times the
// body cap (each bomb used to grow a buffer to 32 MiB by doubling).
func TestConcurrentBombsBoundedMemory(t *testing.T) {
	e := newFakeEngine(t, "A", "llama")
	ts := startServer(t, oneEngineConfig(e), Options{SkipStartupChecks: true, NoTelemetry: true})
	for _, enc := range []string{"gzip", "zstd"} {
		t.Run(enc, func(t *testing.T) {
			bomb := bombOf(t, enc, 256<<20)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			var wg sync.WaitGroup
			statuses := make([]int, 32)
			codes := make([]string, 32)
			for i := range 32 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req, _ := http.NewRequest(http.MethodPost, ts.url+"/v1/chat/completions", bytes.NewReader(bomb))
					req.Header.Set("Content-Encoding", enc)
					resp, err := testClient.Do(req)
					if err != nil {
						codes[i] = err.Error()
						return
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					statuses[i] = resp.StatusCode
					codes[i] = response{body: b}.errorCode()
				}()
			}
			wg.Wait()
			runtime.ReadMemStats(&after)
			for i := range statuses {
				ok := statuses[i] == 413 && codes[i] == CodeRequestTooLarge ||
					statuses[i] == 503 && codes[i] == CodeBodyBudget
				if !ok {
					t.Errorf("bomb %d: status %d code %q", i, statuses[i], codes[i])
				}
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 400<<20 {
				t.Errorf("allocated %d MiB refusing 32 bombs", alloc>>20)
			}
			if e.hits.Load() != 0 {
				t.Errorf("a bomb reached the engine")
			}
			if r := get(t, ts.url+"/metrics"); !contains(r.body, metricBodyBytes+" 0\n") {
				t.Errorf("%s is not 0 once the bombs are answered", metricBodyBytes)
			}
		})
	}
}

// TestClientInputEchoBounded: an error quoting client input quotes a bounded part of it.
func TestClientInputEchoBounded(t *testing.T) {
	e := newFakeEngine(t, "A", "llama")
	ts := startServer(t, oneEngineConfig(e), Options{SkipStartupChecks: true, NoTelemetry: true})
	name := strings.Repeat("m", 8<<20)
	r := post(t, ts.url+"/v1/chat/completions", chatBody(name, "hi", ""))
	if r.status != 404 || r.errorCode() != CodeModelNotFound {
		t.Fatalf("status %d body %.300s", r.status, r.body)
	}
	if len(r.body) > 2048 || !contains(r.body, "mmmmmmmm") {
		t.Fatalf("error body of %d bytes: %.300s", len(r.body), r.body)
	}
}

// TestOversizedHeadersAnswered431: a request line or headers over server.max_header_bytes
// get 431 request_header_too_large, readable by the client.
func TestOversizedHeadersAnswered431(t *testing.T) {
	e := newFakeEngine(t, "A", "llama")
	cfg := oneEngineConfig(e)
	cfg.Server.MaxHeaderBytes = 4096
	ts := startServer(t, cfg, Options{SkipStartupChecks: true, NoTelemetry: true})
	for name, head := range map[string]string{
		"header":       "GET /health HTTP/1.1\r\nHost: r\r\nX-Big: " + strings.Repeat("h", 16<<10) + "\r\n\r\n",
		"request line": "GET /health?" + strings.Repeat("q", 16<<10) + " HTTP/1.1\r\nHost: r\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			resp, b, _, err := writeFirst(t, ts.Addr().String(), head, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 431 || !contains(b, CodeHeaderTooLarge) {
				t.Fatalf("status %d body %s", resp.StatusCode, b)
			}
		})
	}
}

// TestExpectContinueOverCap: a request announcing a body over the cap with
// "Expect: 100-continue" gets 413 at once, without a 100 Continue.
func TestExpectContinueOverCap(t *testing.T) {
	e := newFakeEngine(t, "A", "llama")
	cfg := oneEngineConfig(e)
	cfg.Server.MaxBodyBytes = 1 << 20
	ts := startServer(t, cfg, Options{SkipStartupChecks: true, NoTelemetry: true})
	c, err := net.Dial("tcp", ts.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"+
		"Content-Length: 104857600\r\nExpect: 100-continue\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 413 || !contains(b, CodeRequestTooLarge) {
		t.Fatalf("status %d body %s", resp.StatusCode, b)
	}
}

// TestSilentConnectionClosedWithoutLingering: a connection that sends nothing is answered
// 408 at the read timeout and closed at once; it is not kept lingering for input that will
// not come, holding a descriptor.
func TestSilentConnectionClosedWithoutLingering(t *testing.T) {
	e := newFakeEngine(t, "A", "llama")
	ts := startServer(t, oneEngineConfig(e), Options{SkipStartupChecks: true, NoTelemetry: true, ReadTimeout: 100 * time.Millisecond})
	c, err := net.Dial("tcp", ts.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close() // the client stays: only the server may close
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, _ := io.ReadAll(c)
	if !contains(b, CodeRequestTimeout) {
		t.Fatalf("answer %q", b)
	}
	waitUntil(t, "the server to release the silent connection", func() bool { return ts.conns.open() == 0 })
}
