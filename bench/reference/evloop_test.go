//go:build linux

package reference

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// ioBound bounds every blocking read and write of these tests: a hung proxy fails the test
// instead of hanging it.
const ioBound = 10 * time.Second

// engineAction is what a rawEngine does with a request: answer it, close the connection
// without an answer, or hold it until the proxy closes the connection.
type engineAction int

const (
	answer engineAction = iota
	closeUnanswered
	holdUntilClosed
)

// rawEngine is an HTTP/1.1 engine written against the socket, so that a test decides what
// happens to each connection: decide sees the connection's number (from 0, in accept
// order), the request's number on it (from 0) and the request; answered requests get the
// body back with x-engine and x-conn headers, and the connection stays open unless
// closeAfter says otherwise.
type rawEngine struct {
	ln         net.Listener
	name       string
	decide     func(conn, req int, r *http.Request) engineAction
	closeAfter func(conn, req int) bool
	conns      atomic.Int64
	wg         sync.WaitGroup
	mu         sync.Mutex
	open       []net.Conn
	// proxyClosed counts connections the proxy closed while a request was held.
	proxyClosed chan struct{}
}

func startRawEngine(t *testing.T, name string, decide func(conn, req int, r *http.Request) engineAction) *rawEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &rawEngine{ln: ln, name: name, decide: decide, proxyClosed: make(chan struct{}, 64)}
	e.wg.Add(1)
	go e.serve()
	t.Cleanup(e.close)
	return e
}

func (e *rawEngine) url() string { return "http://" + e.ln.Addr().String() }

func (e *rawEngine) serve() {
	defer e.wg.Done()
	for {
		c, err := e.ln.Accept()
		if err != nil {
			return
		}
		n := int(e.conns.Add(1)) - 1
		e.mu.Lock()
		e.open = append(e.open, c)
		e.mu.Unlock()
		e.wg.Add(1)
		go e.serveConn(c, n)
	}
}

func (e *rawEngine) serveConn(c net.Conn, n int) {
	defer e.wg.Done()
	defer c.Close()
	br := bufio.NewReader(c)
	for i := 0; ; i++ {
		_ = c.SetDeadline(time.Now().Add(ioBound))
		r, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		act := answer
		if e.decide != nil {
			act = e.decide(n, i, r)
		}
		switch act {
		case closeUnanswered:
			return
		case holdUntilClosed:
			if _, err := br.ReadByte(); err == io.EOF {
				e.proxyClosed <- struct{}{}
			}
			return
		}
		hdr := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nx-engine: %s\r\nx-conn: %d\r\nContent-Length: %d\r\n\r\n", e.name, n, len(body))
		if _, err := c.Write(append([]byte(hdr), body...)); err != nil {
			return
		}
		if e.closeAfter != nil && e.closeAfter(n, i) {
			return
		}
	}
}

func (e *rawEngine) close() {
	_ = e.ln.Close()
	e.mu.Lock()
	for _, c := range e.open {
		_ = c.Close()
	}
	e.mu.Unlock()
	e.wg.Wait()
}

// startEvloop starts the event-loop proxy in this process, closed at the end of the test.
func startEvloop(t *testing.T, engines ...string) *Proxy {
	t.Helper()
	p, err := StartEvloop(engines)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

// dial opens a raw client connection to the proxy, closed at the end of the test.
func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(p.URL(), "http://"), ioBound)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(ioBound))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func chatRequest(body string) string {
	return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// readAnswer reads one answer from br.
func readAnswer(t *testing.T, br *bufio.Reader) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading an answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading an answer's body: %v", err)
	}
	return resp, string(b)
}

// TestEvloopRelaysBodies: concurrent clients on keep-alive connections, bodies from a few
// bytes to beyond the loop's read buffer and a socket's buffer, each answered with its own
// body, round robin over the engines on reused connections; pipelined requests are
// answered in order.
func TestEvloopRelaysBodies(t *testing.T) {
	e1, e2 := startRawEngine(t, "e1", nil), startRawEngine(t, "e2", nil)
	p := startEvloop(t, e1.url(), e2.url())
	const clients, perClient = 6, 40
	var wg sync.WaitGroup
	engines := make([]map[string]int, clients)
	errs := make(chan error, clients)
	for ci := range clients {
		engines[ci] = map[string]int{}
		c := dial(t, p)
		wg.Add(1)
		go func() {
			defer wg.Done()
			br := bufio.NewReader(c)
			for i := range perClient {
				size := 1 + (ci*perClient+i)*97%3000
				if i == 7 {
					size = 3 << 20 // beyond the read buffer and the sockets' buffers
				}
				body := strings.Repeat(strconv.Itoa(ci*1000+i)+",", size/5+1)
				if _, err := io.WriteString(c, chatRequest(body)); err != nil {
					errs <- err
					return
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					errs <- fmt.Errorf("client %d request %d: %w", ci, i, err)
					return
				}
				got, err := io.ReadAll(resp.Body)
				if err != nil || resp.StatusCode != 200 || string(got) != body {
					errs <- fmt.Errorf("client %d request %d: %d, %d bytes back of %d (%v)", ci, i, resp.StatusCode, len(got), len(body), err)
					return
				}
				engines[ci][resp.Header.Get("x-engine")]++
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for ci, m := range engines {
		if m["e1"] == 0 || m["e2"] == 0 {
			t.Errorf("client %d's requests went to %v, want both engines", ci, m)
		}
	}
	// Keep-alive towards the engines: far fewer connections than requests.
	if n := e1.conns.Load() + e2.conns.Load(); n > 4*clients {
		t.Errorf("%d engine connections for %d requests", n, clients*perClient)
	}

	c := dial(t, p)
	var pipelined bytes.Buffer
	for i := range 5 {
		pipelined.WriteString(chatRequest(fmt.Sprintf(`{"n":%d}`, i)))
	}
	if _, err := c.Write(pipelined.Bytes()); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	for i := range 5 {
		if resp, body := readAnswer(t, br); resp.StatusCode != 200 || body != fmt.Sprintf(`{"n":%d}`, i) {
			t.Fatalf("pipelined answer %d: %d %q", i, resp.StatusCode, body)
		}
	}
}

// TestEvloopClientGoesAway: a client that closes mid-head, mid-body or while the engine
// holds its request costs the proxy nothing lasting: the engine connection serving an
// abandoned request is closed, and the next client is served.
func TestEvloopClientGoesAway(t *testing.T) {
	e := startRawEngine(t, "e", func(_, _ int, r *http.Request) engineAction {
		if r.Header.Get("x-hold") != "" {
			return holdUntilClosed
		}
		return answer
	})
	p := startEvloop(t, e.url())
	full := chatRequest(`{"model":"m"}`)
	for _, tc := range []struct {
		name string
		send string
		hold bool
	}{
		{"mid-head", full[:20], false},
		{"mid-body", full[:len(full)-4], false},
		{"while the engine holds the request", strings.Replace(full, "Host: proxy\r\n", "Host: proxy\r\nx-hold: 1\r\n", 1), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, p)
			if _, err := io.WriteString(c, tc.send); err != nil {
				t.Fatal(err)
			}
			if tc.hold {
				// The next request to reach the engine after this one proves it was forwarded.
				for range 2 {
					c2 := dial(t, p)
					if _, err := io.WriteString(c2, full); err != nil {
						t.Fatal(err)
					}
					if resp, _ := readAnswer(t, bufio.NewReader(c2)); resp.StatusCode != 200 {
						t.Fatalf("status %d", resp.StatusCode)
					}
				}
			}
			_ = c.Close()
			if tc.hold {
				select {
				case <-e.proxyClosed:
				case <-time.After(ioBound):
					t.Fatal("the proxy kept the engine connection of an abandoned request")
				}
			}
			c2 := dial(t, p)
			if _, err := io.WriteString(c2, full); err != nil {
				t.Fatal(err)
			}
			if resp, body := readAnswer(t, bufio.NewReader(c2)); resp.StatusCode != 200 || body != `{"model":"m"}` {
				t.Fatalf("the next client: %d %q", resp.StatusCode, body)
			}
		})
	}
}

// TestEvloopEngineClosesConnections: an engine that closes its keep-alive connections,
// idle or as the next request arrives, does not fail requests (the proxy reconnects, and
// resends once a request a stale connection dropped); an engine that drops every request,
// or is not there, gets the client a 502 with an error body.
func TestEvloopEngineClosesConnections(t *testing.T) {
	t.Run("idle close", func(t *testing.T) {
		e := startRawEngine(t, "e", nil)
		e.closeAfter = func(int, int) bool { return true } // keep-alive promised, then closed
		p := startEvloop(t, e.url())
		c := dial(t, p)
		br := bufio.NewReader(c)
		for i := range 20 {
			if _, err := io.WriteString(c, chatRequest(strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
			if resp, body := readAnswer(t, br); resp.StatusCode != 200 || body != strconv.Itoa(i) {
				t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
			}
		}
		if n := e.conns.Load(); n != 20 {
			t.Errorf("%d engine connections for 20 requests, each closed after its answer", n)
		}
	})
	t.Run("closed as the next request arrives", func(t *testing.T) {
		e := startRawEngine(t, "e", func(_, req int, _ *http.Request) engineAction {
			if req > 0 {
				return closeUnanswered // a keep-alive connection the engine timed out as the request came
			}
			return answer
		})
		p := startEvloop(t, e.url())
		c := dial(t, p)
		br := bufio.NewReader(c)
		for i := range 10 {
			if _, err := io.WriteString(c, chatRequest(strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
			if resp, body := readAnswer(t, br); resp.StatusCode != 200 || body != strconv.Itoa(i) {
				t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
			}
		}
	})
	t.Run("every request dropped", func(t *testing.T) {
		e := startRawEngine(t, "e", func(int, int, *http.Request) engineAction { return closeUnanswered })
		dead, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		deadURL := "http://" + dead.Addr().String()
		_ = dead.Close() // nothing listens there
		p := startEvloop(t, e.url(), deadURL)
		c := dial(t, p)
		br := bufio.NewReader(c)
		for i := range 4 {
			if _, err := io.WriteString(c, chatRequest("x")); err != nil {
				t.Fatal(err)
			}
			resp, body := readAnswer(t, br)
			var eb struct {
				Error struct{ Message, Code string }
			}
			if resp.StatusCode != 502 || json.Unmarshal([]byte(body), &eb) != nil || eb.Error.Code != "engine_unavailable" {
				t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
			}
		}
	})
}

// TestEvloopRefuses: requests the loop does not serve are answered with their precise
// status and an OpenAI-style error body, and the connection closed.
func TestEvloopRefuses(t *testing.T) {
	e := startRawEngine(t, "e", nil)
	p := startEvloop(t, e.url())
	for _, tc := range []struct {
		name string
		req  string
		want int
	}{
		{"malformed request line", "GARBAGE\r\n\r\n", 400},
		{"malformed header", "POST / HTTP/1.1\r\nno colon\r\n\r\n", 400},
		{"bad length", "POST / HTTP/1.1\r\nContent-Length: -3\r\n\r\n", 400},
		{"two lengths", "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400},
		{"chunked body", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501},
		{"version", "GET / HTTP/2.0\r\n\r\n", 505},
		{"body too large", "POST / HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n", 413},
		{"head too large", "GET / HTTP/1.1\r\nx: " + strings.Repeat("a", evHeadMax) + "\r\n\r\n", 431},
		{"head too large, unterminated", "GET / HTTP/1.1\r\nx: " + strings.Repeat("a", evHeadMax+10), 431},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, p)
			if _, err := io.WriteString(c, tc.req); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(c)
			resp, body := readAnswer(t, br)
			if resp.StatusCode != tc.want || !strings.Contains(body, `"error"`) || !resp.Close {
				t.Fatalf("%d (close %v) %q, want %d", resp.StatusCode, resp.Close, body, tc.want)
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Fatalf("the connection stayed open: %v", err)
			}
		})
	}
	if n := e.conns.Load(); n != 0 {
		t.Errorf("refused requests reached the engine (%d connections)", n)
	}
}

// TestEvloopStops: Close ends the loop's goroutine, closes the client and engine
// connections it held and its listening socket.
func TestEvloopStops(t *testing.T) {
	e := startRawEngine(t, "e", nil)
	p, err := StartEvloop([]string{e.url()})
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p)
	if _, err := io.WriteString(c, chatRequest("x")); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	if resp, _ := readAnswer(t, br); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if !strings.Contains(goroutines(), "(*evLoop).run") {
		t.Fatal("no loop goroutine while serving: the check below would prove nothing")
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil { // idempotent
		t.Fatal(err)
	}
	if s := goroutines(); strings.Contains(s, "(*evLoop).run") {
		t.Fatalf("the loop goroutine is still there after Close:\n%s", s)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("the client connection stayed open: %v", err)
	}
	// The engine sees its idle keep-alive connection closed: its connection goroutine ends.
	done := make(chan struct{})
	go func() { e.close(); close(done) }()
	select {
	case <-done:
	case <-time.After(ioBound):
		t.Fatal("the engine connection stayed open")
	}
	if c, err := net.DialTimeout("tcp", strings.TrimPrefix(p.URL(), "http://"), time.Second); err == nil {
		c.Close()
		t.Error("the proxy still accepts connections after Close")
	}
}

func goroutines() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// TestRespFraming: the answer's end is found for every framing, wherever the reads cut it.
func TestRespFraming(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      string
		isHead  bool
		wantEnd int // -1: not done
		wantErr bool
		keep    bool
	}{
		{name: "length", in: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcNEXT", wantEnd: 41, keep: true},
		{name: "no body", in: "HTTP/1.1 204 No Content\r\n\r\nX", wantEnd: 27, keep: true},
		{name: "head request", in: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", isHead: true, wantEnd: 38, keep: true},
		{name: "interim", in: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nz", wantEnd: 64, keep: true},
		{name: "chunked", in: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\nA\r\n0123456789\r\n0\r\nTrailer: t\r\n\r\nNEXT", wantEnd: 93, keep: true},
		{name: "chunked, unfinished", in: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", wantEnd: -1, keep: true},
		{name: "until close", in: "HTTP/1.0 200 OK\r\n\r\nabc", wantEnd: -1},
		{name: "connection close", in: "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", wantEnd: 57},
		{name: "bad chunk", in: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", wantErr: true},
		{name: "bad chunk end", in: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc", wantErr: true},
		{name: "bad status", in: "HTTP/1.1 2x\r\n\r\n", wantErr: true},
		{name: "bad length", in: "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for cut := 0; cut <= len(tc.in); cut++ {
				end, done, msg, f := feedSplit(tc.isHead, []byte(tc.in), cut)
				if tc.wantErr {
					if msg == "" {
						t.Fatalf("cut %d: no error", cut)
					}
					continue
				}
				if msg != "" {
					t.Fatalf("cut %d: %s", cut, msg)
				}
				if tc.wantEnd < 0 && done || tc.wantEnd >= 0 && (!done || end != tc.wantEnd) {
					t.Fatalf("cut %d: end %d done %v, want %d", cut, end, done, tc.wantEnd)
				}
				if done && f.keepAlive != tc.keep {
					t.Fatalf("cut %d: keep-alive %v", cut, f.keepAlive)
				}
			}
		})
	}
}

// feedSplit feeds in to a fresh framing in two reads cut at cut; end is the answer's end
// in in.
func feedSplit(isHead bool, in []byte, cut int) (end int, done bool, msg string, f *respFraming) {
	f = &respFraming{inHead: true, isHead: isHead}
	off := 0
	for _, part := range [][]byte{in[:cut], in[cut:]} {
		if len(part) == 0 {
			continue
		}
		n, d, m := f.feed(part, make([]byte, len(part)))
		if m != "" {
			return 0, false, m, f
		}
		if d {
			return off + n, true, "", f
		}
		off += len(part)
	}
	return off, false, "", f
}

// FuzzRespFraming: no answer an engine sends panics the framing, the end it finds lies
// within the bytes read, and it is the same however the reads cut the answer.
func FuzzRespFraming(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x\r\nhello\r\n0\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.0 200 OK\r\n\r\nabc",
	} {
		f.Add([]byte(s), uint16(7), false)
	}
	f.Fuzz(func(t *testing.T, in []byte, cut uint16, isHead bool) {
		end, done, msg, _ := feedSplit(isHead, in, len(in))
		end2, done2, msg2, _ := feedSplit(isHead, in, int(cut)%(len(in)+1))
		if done && (end < 0 || end > len(in)) {
			t.Fatalf("end %d outside %d bytes", end, len(in))
		}
		if done != done2 || (done && end != end2) || (msg == "") != (msg2 == "") {
			t.Fatalf("whole: %d %v %q; cut at %d: %d %v %q", end, done, msg, cut, end2, done2, msg2)
		}
	})
}

// FuzzRequestHead: no request head a client sends panics the parser, and a length it
// accepts is never negative.
func FuzzRequestHead(f *testing.F) {
	for _, s := range []string{
		"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 12\r\nConnection: close\r\n\r\n",
		"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
		"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r, msg := parseRequestHead(in)
		if msg == "" && r.length < 0 {
			t.Fatalf("length %d accepted", r.length)
		}
	})
}
