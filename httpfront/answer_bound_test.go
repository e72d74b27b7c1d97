package httpfront

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"switchyard/config"
	"switchyard/internal/rawtest"
)

// hostileAnswerEngine answers the paths in hostile with answer (on a connection it then
// closes) and every other request (health checks, load polls) with an empty JSON object.
// sent counts the bytes answer wrote.
type hostileAnswerEngine struct {
	url  string
	sent atomic.Int64
}

func newHostileAnswerEngine(t *testing.T, hostile []string, answer func(w io.Writer)) *hostileAnswerEngine {
	t.Helper()
	e := &hostileAnswerEngine{}
	e.url = "http://" + rawtest.Serve(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			for _, p := range hostile {
				if req.URL.Path == p {
					answer(countingWriter{c, &e.sent})
					return
				}
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
		}
	})
	return e
}

type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n.Add(int64(n))
	return n, err
}

// TestEngineAnswerBounded: an answer the router reads whole (a non-streaming completion,
// /get_model_info, /flush_cache) is bounded by upstream.max_response_bytes, whatever the
// engine announces or sends: 502 upstream_error naming the key, and the router stops reading.
// An engine announcing a 64 GiB Content-Length used to make the runtime abort the router
// (fatal "out of memory": fasthttp allocates the announced length up front), and a chunked
// answer was read for as long as the engine sent.
func TestEngineAnswerBounded(t *testing.T) {
	const limit = 1 << 20
	const json = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
	block := strings.Repeat("x", 64<<10)
	answers := []struct {
		name   string
		answer func(w io.Writer)
	}{
		{"Content-Length of 64 GiB", func(w io.Writer) {
			_, _ = io.WriteString(w, json+"Content-Length: 68719476736\r\n\r\n{")
		}},
		{"one chunk of 64 GiB", func(w io.Writer) {
			_, _ = io.WriteString(w, json+"Transfer-Encoding: chunked\r\n\r\n1000000000\r\n{")
		}},
		{"chunks past the bound", func(w io.Writer) {
			_, _ = io.WriteString(w, json+"Transfer-Encoding: chunked\r\n\r\n")
			for range 64 * limit / len(block) {
				if _, err := io.WriteString(w, "10000\r\n"+block+"\r\n"); err != nil {
					return
				}
			}
			_, _ = io.WriteString(w, "0\r\n\r\n")
		}},
		{"a body to the connection's end past the bound", func(w io.Writer) {
			_, _ = io.WriteString(w, json+"Connection: close\r\n\r\n")
			for range 64 * limit / len(block) {
				if _, err := io.WriteString(w, block); err != nil {
					return
				}
			}
		}},
	}
	routes := []struct {
		path string // the engine's
		call func(t *testing.T, ts *testServer) response
	}{
		{"/v1/chat/completions", func(t *testing.T, ts *testServer) response {
			return post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
		}},
		{"/get_model_info", func(t *testing.T, ts *testServer) response { return get(t, ts.url+"/get_model_info") }},
		{"/flush_cache", func(t *testing.T, ts *testServer) response { return post(t, ts.url+"/flush_cache", "") }},
	}
	for _, a := range answers {
		for _, r := range routes {
			t.Run(a.name+" "+r.path, func(t *testing.T) {
				e := newHostileAnswerEngine(t, []string{r.path}, a.answer)
				cfg := baseConfig()
				cfg.Upstream.MaxResponseBytes = limit
				cfg.Retry.Enabled = false
				cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
				cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("all", nil, nil, "A")}}}
				ts := startServer(t, cfg, Options{SkipStartupChecks: true, NoTelemetry: true})
				got := r.call(t, ts)
				if got.status != http.StatusBadGateway || !contains(got.body, "upstream.max_response_bytes") {
					t.Fatalf("status %d, body %.300s; want 502 naming upstream.max_response_bytes", got.status, got.body)
				}
				if r.path != "/flush_cache" && got.errorCode() != CodeUpstream {
					t.Errorf("error code %q, want %q", got.errorCode(), CodeUpstream)
				}
				ts.stop(t)
				// The engine writes 64 times the bound; the sockets' buffers take a few MiB.
				if n := e.sent.Load(); n > 24*limit {
					t.Errorf("the engine wrote %d bytes of its answer: the router read on past its bound of %d", n, limit)
				}
			})
		}
	}
}
