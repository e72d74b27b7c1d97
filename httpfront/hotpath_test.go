package httpfront

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/httpfront/internal/loopbench"
)

// parseRequestHeader parses raw request headers the way the server does (names normalized).
func parseRequestHeader(t testing.TB, raw string) *fasthttp.RequestHeader {
	t.Helper()
	var h fasthttp.RequestHeader
	if err := h.Read(bufio.NewReader(strings.NewReader(raw))); err != nil {
		t.Fatal(err)
	}
	return &h
}

func TestForwardedHeaders(t *testing.T) {
	// Names past the last length the scan indexes (forwardNames.byLen).
	longSession, longRouting := "X-Session-"+strings.Repeat("a", 60), "X-Session-"+strings.Repeat("a", 55)
	tests := []struct {
		name                     string
		session, routing, key    string
		raw                      string
		want                     map[string]string // forwarded headers; "" = must be absent
		wantSession, wantRouting string
		wantTTFT, wantTPOT       time.Duration // the SLO targets read in the same pass
	}{
		{
			name:    "allow-list and affinity headers, any case; the rest dropped",
			session: "x-session-id", routing: "X-SGL-Routing-Key",
			raw: "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nx-request-id: r1\r\nTRACEPARENT: 00-a-01\r\n" +
				"Tracestate: k=v\r\nX-Correlation-Id: c1\r\nAuthorization: Bearer e\r\nx-session-id: s1\r\n" +
				"x-sgl-routing-key: rk\r\nCookie: a=b\r\nX-Custom: no\r\nConnection: keep-alive\r\n" +
				"x-slo-ttft-ms: 250\r\nX-SLO-TPOT-MS: 20\r\nX-Slo-Ttft-Ms: 9\r\n\r\n",
			want: map[string]string{"X-Request-Id": "r1", "Traceparent": "00-a-01", "Tracestate": "k=v",
				"X-Correlation-Id": "c1", "Authorization": "Bearer e", "X-Session-Id": "s1", "X-Sgl-Routing-Key": "rk",
				"Cookie": "", "X-Custom": "", "Connection": "", "X-Slo-Ttft-Ms": "", "X-Slo-Tpot-Ms": ""},
			wantSession: "s1", wantRouting: "rk", wantTTFT: 250 * time.Millisecond, wantTPOT: 20 * time.Millisecond,
		},
		{
			name: "the router's key is not forwarded", session: "x-session-id", key: "k1",
			raw:  "POST /generate HTTP/1.1\r\nHost: r\r\nAuthorization: Bearer k1\r\nX-Request-Id: r1\r\n\r\n",
			want: map[string]string{"Authorization": "", "X-Request-Id": "r1"},
		},
		{
			name: "first occurrence wins; empty values and unconfigured affinity headers are not forwarded",
			raw: "POST /generate HTTP/1.1\r\nHost: r\r\nX-Request-Id: first\r\nX-Request-Id: second\r\n" +
				"Traceparent:\r\nX-Session-Id: s1\r\n\r\n",
			want: map[string]string{"X-Request-Id": "first", "Traceparent": "", "X-Session-Id": ""},
		},
		{
			name:    "affinity header names longer than the length index",
			session: longSession, routing: longRouting,
			raw: "POST /generate HTTP/1.1\r\nHost: r\r\n" + longSession + ": s1\r\n" + longRouting + ": rk\r\n" +
				"X-Session-" + strings.Repeat("b", 60) + ": other\r\n\r\n",
			want:        map[string]string{},
			wantSession: "s1", wantRouting: "rk",
		},
		{
			name: "an affinity header that is also allow-listed", session: "X-Request-Id",
			raw:         "POST /generate HTTP/1.1\r\nHost: r\r\nX-Request-Id: r1\r\n\r\n",
			want:        map[string]string{"X-Request-Id": "r1"},
			wantSession: "r1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Server.APIKey = tt.key
			s := &Server{cfg: cfg, fwd: newForwardNames(tt.session, tt.routing)}
			var hdr clientHeaders
			s.fwd.scan(parseRequestHeader(t, tt.raw), &hdr)
			if got := hdr.string(fwdSession); got != tt.wantSession {
				t.Errorf("session key %q, want %q", got, tt.wantSession)
			}
			if got := hdr.string(fwdRouting); got != tt.wantRouting {
				t.Errorf("routing key %q, want %q", got, tt.wantRouting)
			}
			if got, e := sloTargets(&hdr, engine.SLOTargets{}); e != nil || got.TTFT != tt.wantTTFT || got.TPOT != tt.wantTPOT {
				t.Errorf("SLO targets %+v (%v), want TTFT %v TPOT %v", got, e, tt.wantTTFT, tt.wantTPOT)
			}
			d := dispatch{s: s, kind: routeChat, hdr: hdr}
			req := fasthttp.AcquireRequest()
			defer fasthttp.ReleaseRequest(req)
			d.upstreamHeaders(req, "engine:30000")
			for k, v := range tt.want {
				if got := string(req.Header.Peek(k)); got != v {
					t.Errorf("upstream %s = %q, want %q", k, got, v)
				}
			}
			// The request line and Host header are made when the request is written.
			wire := req.String()
			if !strings.HasPrefix(wire, "POST /v1/chat/completions HTTP/1.1\r\n") || !strings.Contains(wire, "\r\nHost: engine:30000\r\n") {
				t.Errorf("upstream request written as %q", wire)
			}
			if got := len(req.Header.PeekAll("X-Request-Id")); got > 1 {
				t.Errorf("X-Request-Id forwarded %d times", got)
			}
		})
	}
}

func TestLazyDeadlineConnRead(t *testing.T) {
	past, soon, later := time.Now().Add(-2*time.Second), time.Now().Add(-time.Second), time.Now().Add(time.Hour)
	tests := []struct {
		name      string
		deadlines []time.Time // set in order
		wantArmed time.Time   // armed after the sets
		timeout   bool        // the read times out (no data is sent)
	}{
		{"a later deadline waits and the read carries on", []time.Time{past, later}, past, false},
		{"a cleared deadline waits and the read carries on", []time.Time{past, {}}, past, false},
		{"the deadline last set times out", []time.Time{later, past}, past, true},
		{"a later deadline that has passed too times out", []time.Time{past, soon}, past, true},
		{"no deadline", nil, time.Time{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := loopbench.Pair(t)
			c := &clientConn{Conn: a}
			for _, d := range tt.deadlines {
				if err := c.SetReadDeadline(d); err != nil {
					t.Fatal(err)
				}
			}
			if !c.r.Armed.Equal(tt.wantArmed) {
				t.Fatalf("armed %v, want %v", c.r.Armed, tt.wantArmed)
			}
			if !tt.timeout {
				if _, err := b.Write([]byte("x")); err != nil {
					t.Fatal(err)
				}
			}
			buf := make([]byte, 1)
			n, err := c.Read(buf)
			if tt.timeout {
				if n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("Read = %d, %v; want a timeout", n, err)
				}
				return
			}
			if n != 1 || err != nil {
				t.Fatalf("Read = %d, %v; want 1 byte", n, err)
			}
			if want := tt.deadlines; len(want) > 0 && !c.r.Armed.Equal(want[len(want)-1]) {
				t.Errorf("armed %v after the read, want the deadline last set", c.r.Armed)
			}
		})
	}
}

func TestLazyDeadlineConnWrite(t *testing.T) {
	a, b := loopbench.Pair(t)
	c := &clientConn{Conn: a}
	if err := c.SetWriteDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := c.SetWriteDeadline(time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Write([]byte("hello")); n != 5 || err != nil {
		t.Fatalf("Write = %d, %v; want 5 bytes", n, err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(b, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("peer read %q, %v", buf, err)
	}
	if err := c.SetDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("late")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write after an earlier deadline: %v, want a timeout", err)
	}
}

// rawHealth writes a GET /health on c and reads one response.
func rawHealth(t *testing.T, c net.Conn, br *bufio.Reader) {
	t.Helper()
	if _, err := c.Write([]byte("GET /health HTTP/1.1\r\nHost: r\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	var resp fasthttp.Response
	if err := resp.Read(br); err != nil || resp.StatusCode() != 200 {
		t.Fatalf("health: %v, status %d", err, resp.StatusCode())
	}
}

// TestServerTimeoutsWithLazyDeadlines checks that the server's idle and read timeouts still
// close connections on time although their deadlines are moved lazily.
func TestServerTimeoutsWithLazyDeadlines(t *testing.T) {
	tests := []struct {
		name          string
		read, idle    time.Duration
		partial       string // sent after one request; the server must close the connection
		before, after time.Duration
	}{
		{"idle keep-alive connection", 10 * time.Second, 200 * time.Millisecond, "", 150 * time.Millisecond, 5 * time.Second},
		{"stalled request headers", 200 * time.Millisecond, 10 * time.Second, "GET /health HTTP/1.1\r\nHo",
			150 * time.Millisecond, 5 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newFakeEngine(t, "A", "llama")
			cfg := baseConfig()
			cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
			cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("all", nil, nil, "A")}}}
			ts := startServer(t, cfg, Options{ReadTimeout: tt.read, IdleTimeout: tt.idle, SkipStartupChecks: true, NoTelemetry: true})
			c, err := net.Dial("tcp", ts.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			for range 3 {
				rawHealth(t, c, br) // keep-alive requests move the deadlines forward
			}
			start := time.Now()
			if tt.partial != "" {
				if _, err := c.Write([]byte(tt.partial)); err != nil {
					t.Fatal(err)
				}
			}
			// Bounded wait for the server to close the connection (or answer and close).
			if err := c.SetReadDeadline(time.Now().Add(tt.after)); err != nil {
				t.Fatal(err)
			}
			_, err = io.Copy(io.Discard, br)
			if err != nil {
				t.Fatalf("connection not closed by the server within %v: %v", tt.after, err)
			}
			if took := time.Since(start); took < tt.before {
				t.Errorf("closed after %v, before the timeout", took)
			}
		})
	}
}

// TestWatchAfterWatch: a hang-up watch of a client connection after an earlier watch was
// stopped (the flow queue's, then the dispatch's, then the stream's) and after the server
// moved its read deadline still sees the client leave: the past deadline the first Stop
// armed, which a lazily cleared deadline leaves on the socket, must not end the next watch.
func TestWatchAfterWatch(t *testing.T) {
	a, b := loopbench.Pair(t)
	c := &clientConn{Conn: a}
	if err := c.SetReadDeadline(time.Now().Add(time.Hour)); err != nil { // the read timeout
		t.Fatal(err)
	}
	w, ok := watchConn(c, nil)
	if !ok {
		t.Fatal("a TCP connection cannot be watched")
	}
	w.Stop()
	if w.Left() {
		t.Fatal("gone before the client left")
	}
	w, ok = watchConn(c, nil)
	if !ok {
		t.Fatal("the second watch did not start")
	}
	defer w.Stop()
	_ = b.Close()
	select {
	case <-w.Gone():
	case <-time.After(10 * time.Second):
		t.Fatal("the second watch did not see the client leave")
	}
}

// TestPlainChatClockReads: a small non-streamed request reads the Server's clock twice, at
// its start and at its answer (the answer's reading ends the load guard's prefill and the
// request's duration alike); a request without LoRA adapter holds reads none for them.
func TestPlainChatClockReads(t *testing.T) {
	var reads atomic.Int64
	now := func() time.Time {
		reads.Add(1)
		return time.Now()
	}
	client, uri, body := servePlainChatOpts(t, nil, Options{Now: now})
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	const requests = 20
	var before int64
	for i := range requests + 1 {
		if i == 1 {
			before = reads.Load() // the first request's reads include the Server's first ones
		}
		req.Reset()
		req.SetRequestURI(uri)
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetBodyRaw(body)
		if err := client.Do(req, resp); err != nil || resp.StatusCode() != fasthttp.StatusOK {
			t.Fatalf("request %d: %v, status %d", i, err, resp.StatusCode())
		}
	}
	// A janitor tick (every DefaultJanitorInterval) may add one reading.
	if n := float64(reads.Load()-before) / requests; n > 2.25 {
		t.Errorf("%.2f clock readings per request, want 2 (start and answer)", n)
	}
}

// TestPDChatClockReads: a non-streamed prefill/decode request reads the Server's clock
// three times: at its start, at the prefill engine's answer (its first token) and at the
// decode engine's answer; its guards take the selection's time, as a plain dispatch's do.
func TestPDChatClockReads(t *testing.T) {
	var reads atomic.Int64
	now := func() time.Time {
		reads.Add(1)
		return time.Now()
	}
	p := newFakeEngine(t, "P", "llama", withMode("prefill"))
	p.bootstrapPort = 8998
	d := newFakeEngine(t, "D", "llama", withMode("decode"))
	d.expectHost, d.expectPort = "127.0.0.1", 8998
	ts := startServer(t, pdConfig(p, d, ptr(8998)), Options{NoTelemetry: true, SkipStartupChecks: true, Now: now})
	const requests = 20
	var before int64
	for i := range requests + 1 {
		if i == 1 {
			before = reads.Load() // the first request's reads include the Server's first ones
		}
		if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", "")); r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	ts.waitBackground(t)
	// A janitor tick (every DefaultJanitorInterval) may add one reading.
	if n := float64(reads.Load()-before) / requests; n > 3.25 {
		t.Errorf("%.2f clock readings per request, want 3 (start, prefill answer, answer)", n)
	}
}

// TestRequestStartReading: on the wall clock a request's start is fasthttp's reading before
// the handler (no reading of the Server's own); on another clock it is that clock's.
func TestRequestStartReading(t *testing.T) {
	var req fasthttp.Request
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, nil, nil) // reads the wall clock, as the server does before the handler
	reads := 0
	fake := time.Unix(1000, 0)
	now := func() time.Time { reads++; return fake }
	for _, tc := range []struct {
		name      string
		wall      bool
		want      time.Time
		wantReads int
	}{
		{"wall clock", true, ctx.Time(), 0},
		{"another clock", false, fake, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reads = 0
			s := &Server{now: now, wallNow: tc.wall}
			if got := s.requestStart(&ctx); !got.Equal(tc.want) || reads != tc.wantReads {
				t.Errorf("start %v after %d readings, want %v after %d", got, reads, tc.want, tc.wantReads)
			}
		})
	}
}
