package httpfront

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"switchyard/config"
)

// The engine's chunked answer is decoded below fasthttp's client (fleet's streamed body):
// these tests send it through the Server cut at every byte and in one write, well formed and
// hostile, from an engine that keeps its connections alive, and check what the client reads
// and whether the engine's connection was used again.

// chunkEngine (raw TCP, unlike rawEngine it keeps its connections alive) answers the inference requests of each connection in turn, keeping the
// connection open between them: answer writes the i-th answer (counted over all
// connections) and reports whether the connection goes on. accepts counts the connections
// that carried an inference request.
type chunkEngine struct {
	url     string
	accepts atomic.Int64
}

func newChunkEngine(t *testing.T, answer func(i int, c net.Conn) bool) *chunkEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &chunkEngine{url: "http://" + ln.Addr().String()}
	var (
		wg sync.WaitGroup
		mu sync.Mutex
		n  int
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				br := bufio.NewReader(c)
				counted := false
				for range 100 {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					if !strings.HasPrefix(req.URL.Path, "/v1/") {
						// Health checks and the like: the probe connections are not counted.
						_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
						continue
					}
					if !counted {
						counted = true
						e.accepts.Add(1)
					}
					mu.Lock()
					i := n
					n++
					mu.Unlock()
					if !answer(i, c) {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	return e
}

// writeBytes writes s one byte per write (cut) or in one write.
func writeBytes(c net.Conn, s string, cut bool) {
	if !cut {
		_, _ = io.WriteString(c, s)
		return
	}
	for i := range len(s) {
		if _, err := io.WriteString(c, s[i:i+1]); err != nil {
			return
		}
	}
}

// oneByteConn returns at most one byte per read: every byte of what the engine sends is a
// read boundary for the router.
type oneByteConn struct{ net.Conn }

func (c oneByteConn) Read(b []byte) (int, error) {
	if len(b) > 1 {
		b = b[:1]
	}
	return c.Conn.Read(b)
}

// chunkedAnswer is a complete streamed answer of events, framed as the engine's chunks
// (an event split over two chunks, several events in one, a chunk extension), with a
// trailer after the last chunk.
func chunkedAnswer(events []string) string {
	var b strings.Builder
	b.WriteString(sseHead)
	all := strings.Join(events, "") + "data: [DONE]\n\n"
	for i, size := 0, 1; i < len(all); size = size*3 + 1 {
		k := min(size, len(all)-i)
		piece := all[i : i+k]
		if size == 4 {
			// A chunk extension (skipped).
			b.WriteString(strconv.FormatInt(int64(k), 16) + ";ext=1\r\n" + piece + "\r\n")
		} else {
			b.WriteString(chunked(piece))
		}
		i += k
	}
	b.WriteString("0\r\nX-Trailer: yes\r\n\r\n")
	return b.String()
}

func streamEvents(n int) []string {
	events := make([]string, n)
	for i := range events {
		events[i] = `data: {"id":"c0","choices":[{"index":0,"delta":{"content":"t` + strings.Repeat("x", i%7) + `"}}]}` + "\n\n"
	}
	return events
}

func chunkedConfig(url string) *config.Config {
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("all", nil, nil, "A")}}}
	return cfg
}

// TestStreamChunksCutAnywhere: an engine's stream arrives whole at the client whether the
// engine writes it one byte at a time (read as it comes, and with every byte its own read of
// the router's) or all at once (one read takes every chunk); the engine's connection is then
// used again.
func TestStreamChunksCutAnywhere(t *testing.T) {
	events := streamEvents(24)
	answer := chunkedAnswer(events)
	for _, tt := range []struct {
		name     string
		cut      bool
		oneByte  bool
		requests int
	}{
		{"one write", false, false, 3},
		{"a byte per write", true, false, 3},
		{"a byte per write and per read", true, true, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newChunkEngine(t, func(_ int, c net.Conn) bool {
				writeBytes(c, answer, tt.cut)
				return true
			})
			opts := Options{SkipStartupChecks: true, NoTelemetry: true}
			if tt.oneByte {
				opts.Dial = func(network, addr string, timeout time.Duration) (net.Conn, error) {
					c, err := net.DialTimeout(network, addr, timeout)
					if err != nil {
						return nil, err
					}
					return oneByteConn{c}, nil
				}
			}
			ts := startServer(t, chunkedConfig(e.url), opts)
			for i := range tt.requests {
				r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", `"stream":true`))
				if r.status != 200 {
					t.Fatalf("request %d: status %d: %s", i, r.status, r.body)
				}
				got := checkStreamEnd(t, string(r.body), "")
				if len(got) != len(events) {
					t.Fatalf("request %d: %d events, want %d: %s", i, len(got), len(events), excerpt(string(r.body)))
				}
				for j, ev := range got {
					if want := strings.TrimSuffix(strings.TrimPrefix(events[j], "data: "), "\n\n"); ev != want {
						t.Fatalf("request %d: event %d is %q, want %q", i, j, ev, want)
					}
				}
			}
			if n := e.accepts.Load(); n != 1 {
				t.Fatalf("the engine accepted %d connections for %d streams in a row, want 1 (reused)", n, tt.requests)
			}
		})
	}
}

// TestStreamHostileChunks: an engine whose chunked framing breaks mid-stream (a bad chunk
// size, one too long, a missing CRLF, a bare LF, a close mid-chunk or before the last chunk,
// bytes past the answer) gives the client the events before the break, then an upstream
// error event and [DONE]; its connection is never used again (the next stream is answered
// on a new one, in full). Every case is sent in one write and a byte per write.
func TestStreamHostileChunks(t *testing.T) {
	good := sseHead + chunked(evA) + chunked(evB)
	tests := []struct {
		name  string
		bytes string
		// events: complete events before the break; wantCode: "" when the stream completes
		// (its framing broke after [DONE]).
		events   int
		wantCode string
	}{
		{"bad hex", good + "zz\r\n" + evA + "\r\n0\r\n\r\n", 2, CodeUpstream},
		{"chunk size too long", good + "10000000000000000\r\n" + evA, 2, CodeUpstream},
		{"data not followed by CRLF", good + chunked(evA)[:len(chunked(evA))-2] + "XY0\r\n\r\n", 3, CodeUpstream},
		{"bare LF after the size", good + strings.Replace(chunked(evA), "\r\n", "\n", 1) + "0\r\n\r\n", 2, CodeUpstream},
		{"closed mid-chunk", good + chunked(evA)[:20], 2, CodeUpstream},
		{"closed before the last chunk", good, 2, CodeUpstream},
		{"trailers past their bound", good + "0\r\nX: " + strings.Repeat("y", 5000) + "\r\n\r\n", 2, CodeUpstream},
		{"bytes past the answer", good + chunked("data: [DONE]\n\n") + "0\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", 2, ""},
		{"closed after [DONE], before the last chunk", good + chunked("data: [DONE]\n\n"), 2, ""},
		{"bad framing after [DONE]", good + chunked("data: [DONE]\n\n") + "zz\r\n", 2, ""},
	}
	for _, tt := range tests {
		for _, cut := range []bool{false, true} {
			name := tt.name
			if cut {
				name += ", a byte per write"
			}
			t.Run(name, func(t *testing.T) {
				e := newChunkEngine(t, func(i int, c net.Conn) bool {
					if i == 0 {
						writeBytes(c, tt.bytes, cut)
						// The engine keeps the connection unless the case is a close.
						return !strings.HasPrefix(tt.name, "closed")
					}
					writeBytes(c, chunkedAnswer([]string{evA}), false)
					return true
				})
				ts := startServer(t, chunkedConfig(e.url), Options{SkipStartupChecks: true, NoTelemetry: true})
				r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", `"stream":true`))
				if r.status != 200 {
					t.Fatalf("status %d: %s", r.status, r.body)
				}
				if got := checkStreamEnd(t, string(r.body), tt.wantCode); len(got) != tt.events {
					t.Fatalf("%d events before the end, want %d: %s", len(got), tt.events, excerpt(string(r.body)))
				}
				// The next stream: in full, on a new connection.
				r = post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", `"stream":true`))
				if got := checkStreamEnd(t, string(r.body), ""); r.status != 200 || len(got) != 1 {
					t.Fatalf("the next stream: status %d, %d events: %s", r.status, len(got), excerpt(string(r.body)))
				}
				if n := e.accepts.Load(); n != 2 {
					t.Fatalf("the engine accepted %d connections, want 2: the broken one was used again", n)
				}
			})
		}
	}
}

// TestStreamErrorAnswerBodies: an engine's error answer to a stream is read through the
// same body, whatever its framing (chunked, Content-Length, up to the close), and given to
// the client as it is.
func TestStreamErrorAnswerBodies(t *testing.T) {
	const msg = `{"error":{"message":"bad request","code":"invalid"}}`
	for _, tt := range []struct{ name, bytes string }{
		{"chunked", "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(msg[:9]) + chunked(msg[9:]) + "0\r\n\r\n"},
		{"content-length", "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 52\r\n\r\n" + msg},
		{"up to the close", "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n" + msg},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if len(msg) != 52 {
				t.Fatalf("the message is %d bytes", len(msg))
			}
			e := newChunkEngine(t, func(_ int, c net.Conn) bool {
				writeBytes(c, tt.bytes, true)
				return tt.name != "up to the close"
			})
			ts := startServer(t, chunkedConfig(e.url), Options{SkipStartupChecks: true, NoTelemetry: true})
			r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", `"stream":true`))
			if r.status != 400 || string(r.body) != msg {
				t.Fatalf("status %d, body %q; want 400 and the engine's body", r.status, r.body)
			}
		})
	}
}
