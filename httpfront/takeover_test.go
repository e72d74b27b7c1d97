package httpfront

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/config"
)

// streamRequest is a raw chat request for the router: a stream when stream is set, with
// extra header lines (each ending in CRLF), over proto, its body sent with Content-Length
// or, when chunkedBody, in chunks.
func streamRequest(stream bool, proto, extra string, chunkedBody bool) string {
	opt := ""
	if stream {
		opt = `"stream":true`
	}
	body := chatBody("llama", "hi", opt)
	head := "POST /v1/chat/completions " + proto + "\r\nHost: router\r\nContent-Type: application/json\r\n" + extra
	if chunkedBody {
		return head + "Transfer-Encoding: chunked\r\n\r\n" + chunked(body[:5]) + chunked(body[5:]) + "0\r\n\r\n"
	}
	return head + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// readAnswer reads one answer from br (the answer to a POST) with its whole body; net/http
// checks its framing (chunks, or the body up to the connection's end).
func readAnswer(t *testing.T, br *bufio.Reader) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodPost})
	if err != nil {
		t.Fatalf("reading an answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading an answer's body (%v): %v; got %q", resp.TransferEncoding, err, b)
	}
	return resp, string(b)
}

// wantStream checks a complete streamed answer, chunked when chunks.
func wantStream(t *testing.T, resp *http.Response, body string, chunks bool) {
	t.Helper()
	if resp.StatusCode != 200 || !strings.Contains(body, `"text":"tok3"`) || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("stream: %d %q", resp.StatusCode, body)
	}
	if chunked := len(resp.TransferEncoding) == 1 && resp.TransferEncoding[0] == "chunked"; chunked != chunks {
		t.Fatalf("stream sent with transfer encoding %v", resp.TransferEncoding)
	}
}

// wantClosed checks that the router closed c (after everything br holds was read).
func wantClosed(t *testing.T, c net.Conn, br *bufio.Reader) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("the connection went on after its last answer: byte %q, %v", b, err)
	}
}

// TestStreamConnectionGoesOn: a streamed answer is relayed on the client's connection, taken
// over from fasthttp once the stream has its first event; afterwards the connection goes on
// as after any answer. The next request on it is served, also one the client pipelined
// right behind the stream's request (held by fasthttp's reader when the connection was taken
// over), behind a chunked request body too; a request that asked for Connection: close gets
// it, and the connection closes after the stream; an HTTP/1.0 client gets the events without
// chunks, up to the connection's end. Engines over plain TCP and over TLS.
func TestStreamConnectionGoesOn(t *testing.T) {
	p := newTestPKI(t)
	for _, secure := range []bool{false, true} {
		name := "plain engine"
		var opts []engineOpt
		if secure {
			name = "TLS engine"
			opts = append(opts, withTLS(p.server))
		}
		t.Run(name, func(t *testing.T) {
			e := newFakeEngine(t, "A", "llama", opts...)
			cfg := baseConfig()
			cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
			cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("all", nil, nil, "A")}}}
			if secure {
				cfg.Upstream.TLS = config.UpstreamTLS{CAFiles: []string{p.caFile}, CertFile: p.clientCertFile, KeyFile: p.clientKeyFile}
			}
			ts := startServer(t, cfg, Options{SkipStartupChecks: true, NoTelemetry: true})
			dial := func(t *testing.T) (net.Conn, *bufio.Reader) {
				c, err := net.Dial("tcp", ts.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = c.Close() })
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				return c, bufio.NewReader(c)
			}
			send := func(t *testing.T, c net.Conn, reqs ...string) {
				// Written at once: the requests after the first arrive with it.
				if _, err := io.WriteString(c, strings.Join(reqs, "")); err != nil {
					t.Fatal(err)
				}
			}
			wantPlain := func(t *testing.T, br *bufio.Reader) {
				t.Helper()
				if resp, body := readAnswer(t, br); resp.StatusCode != 200 || !strings.Contains(body, "hello from A") {
					t.Fatalf("request after the stream: %d %q", resp.StatusCode, body)
				}
			}

			t.Run("next request", func(t *testing.T) {
				c, br := dial(t)
				for range 2 {
					send(t, c, streamRequest(true, "HTTP/1.1", "", false))
					resp, body := readAnswer(t, br)
					wantStream(t, resp, body, true)
				}
				send(t, c, streamRequest(false, "HTTP/1.1", "", false))
				wantPlain(t, br)
			})
			t.Run("pipelined", func(t *testing.T) {
				c, br := dial(t)
				send(t, c, streamRequest(true, "HTTP/1.1", "", false), streamRequest(true, "HTTP/1.1", "", false),
					streamRequest(false, "HTTP/1.1", "", false))
				for range 2 {
					resp, body := readAnswer(t, br)
					wantStream(t, resp, body, true)
				}
				wantPlain(t, br)
			})
			t.Run("pipelined behind a chunked body", func(t *testing.T) {
				c, br := dial(t)
				send(t, c, streamRequest(true, "HTTP/1.1", "", true), streamRequest(false, "HTTP/1.1", "", true))
				resp, body := readAnswer(t, br)
				wantStream(t, resp, body, true)
				wantPlain(t, br)
			})
			t.Run("Connection: close", func(t *testing.T) {
				c, br := dial(t)
				send(t, c, streamRequest(true, "HTTP/1.1", "Connection: close\r\n", false))
				resp, body := readAnswer(t, br)
				wantStream(t, resp, body, true)
				if !resp.Close {
					t.Fatalf("the answer to a request with Connection: close did not say it: %v", resp.Header)
				}
				wantClosed(t, c, br)
			})
			t.Run("HTTP/1.0", func(t *testing.T) {
				c, br := dial(t)
				send(t, c, streamRequest(true, "HTTP/1.0", "", false))
				resp, body := readAnswer(t, br)
				wantStream(t, resp, body, false)
				wantClosed(t, c, br)
			})
		})
	}
}

// TestStreamConnectionTimeouts: after a stream on a taken-over connection, the connection
// waits for its next request as any keep-alive connection does, up to server.idle_timeout
// (not server.read_timeout, which bounds reading a request), and the request that comes is
// then read under server.read_timeout. The timeouts are scaled down; every wait is for an
// event (the router closing a connection), bounded by the client's deadline.
func TestStreamConnectionTimeouts(t *testing.T) {
	e := newFakeEngine(t, "A", "llama")
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("all", nil, nil, "A")}}}
	dial := func(t *testing.T, ts *testServer) (net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := net.Dial("tcp", ts.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		return c, bufio.NewReader(c)
	}
	afterStream := func(t *testing.T, ts *testServer) (net.Conn, *bufio.Reader) {
		t.Helper()
		c, br := dial(t, ts)
		if _, err := io.WriteString(c, streamRequest(true, "HTTP/1.1", "", false)); err != nil {
			t.Fatal(err)
		}
		resp, body := readAnswer(t, br)
		wantStream(t, resp, body, true)
		return c, br
	}

	t.Run("idle timeout shorter than the read timeout", func(t *testing.T) {
		ts := startServer(t, cfg, Options{SkipStartupChecks: true, NoTelemetry: true,
			ReadTimeout: time.Hour, IdleTimeout: 100 * time.Millisecond})
		c, br := afterStream(t, ts)
		// Before the fix the connection waited for the read timeout (an hour here): the
		// client's deadline (20 s) passed first.
		wantClosed(t, c, br)
	})

	t.Run("idle timeout longer than the read timeout", func(t *testing.T) {
		const readTimeout = 150 * time.Millisecond
		ts := startServer(t, cfg, Options{SkipStartupChecks: true, NoTelemetry: true,
			ReadTimeout: readTimeout, IdleTimeout: time.Hour})
		c, br := afterStream(t, ts)
		// Two fresh connections opened one after the other after the stream, each closed by
		// the router at its read timeout: the stream's connection has then been idle longer
		// than twice the read timeout. Before the fix it was closed at one.
		for range 2 {
			_, fbr := dial(t, ts)
			if _, err := io.ReadAll(fbr); err != nil { // a 408 answer, then the close
				t.Fatalf("a fresh connection was not closed at the read timeout: %v", err)
			}
		}
		if _, err := io.WriteString(c, streamRequest(false, "HTTP/1.1", "", false)); err != nil {
			t.Fatal(err)
		}
		if resp, body := readAnswer(t, br); resp.StatusCode != 200 || !strings.Contains(body, "hello from A") {
			t.Fatalf("request after the idle wait: %d %q", resp.StatusCode, body)
		}
		// A request that starts after a stream and then stalls is cut at the read timeout.
		c2, br2 := afterStream(t, ts)
		start := time.Now()
		if _, err := io.WriteString(c2, "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\n"); err != nil {
			t.Fatal(err)
		}
		if resp, body := readAnswer(t, br2); resp.StatusCode != fasthttp.StatusRequestTimeout {
			t.Fatalf("a stalled request after a stream: %d %q, want 408", resp.StatusCode, body)
		}
		wantClosed(t, c2, br2)
		if d := time.Since(start); d < readTimeout {
			t.Fatalf("the stalled request was cut after %v, before the read timeout %v", d, readTimeout)
		}
	})
}

// TestResumedConnectionsOnWarmGoroutines: the requests that follow a stream on its
// connection are served on a warm goroutine (one that has served requests before, its stack
// grown), not on the stream's fresh goroutine, whose stack would grow, copied, at each such
// request; and the warm goroutines are reused from one stream to the next.
func TestResumedConnectionsOnWarmGoroutines(t *testing.T) {
	const rounds = 8
	e := newFakeEngine(t, "A", "llama")
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("all", nil, nil, "A")}}}
	ts := startServer(t, cfg, Options{SkipStartupChecks: true, NoTelemetry: true})
	c, err := net.Dial("tcp", ts.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	for range rounds {
		if _, err := io.WriteString(c, streamRequest(true, "HTTP/1.1", "", false)); err != nil {
			t.Fatal(err)
		}
		resp, body := readAnswer(t, br)
		wantStream(t, resp, body, true)
		if _, err := io.WriteString(c, streamRequest(false, "HTTP/1.1", "", false)); err != nil {
			t.Fatal(err)
		}
		if resp, body := readAnswer(t, br); resp.StatusCode != 200 || !strings.Contains(body, "hello from A") {
			t.Fatalf("request after the stream: %d %q", resp.StatusCode, body)
		}
	}
	// The connection now waits for its next request in fasthttp's ServeConn, on a warm
	// goroutine (the first stream's, which found none idle, became one). A warm goroutine the
	// scheduler has not run since its last stream took the connection over may still be
	// leaving ServeConn: every goroutine in it must be a warm one.
	buf := make([]byte, 16<<20)
	buf = buf[:runtime.Stack(buf, true)]
	serving, warm := 0, 0
	var cold []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		isWarm := strings.Contains(g, "httpfront.(*resumers).serve")
		if isWarm {
			warm++
		}
		if strings.Contains(g, "fasthttp.(*Server).ServeConn") {
			serving++
			if !isWarm {
				cold = append(cold, g)
			}
		}
	}
	if serving == 0 || len(cold) > 0 {
		t.Fatalf("the connection is served on %d goroutines, %d of them not warm:\n%s", serving, len(cold), strings.Join(cold, "\n\n"))
	}
	// Every round ends with the warm goroutine idle again (the next stream took the
	// connection over); one that missed a hand-off (it had not gone idle yet) makes another.
	// Without reuse every round would leave one.
	if warm >= rounds {
		t.Fatalf("%d warm goroutines after %d streams on one connection: they are not reused", warm, rounds)
	}
}
