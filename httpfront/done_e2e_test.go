package httpfront

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"
)

// A stream's [DONE] goes to the client with the end of its body. A client that stops reading
// at [DONE] and closes the body (Go's HTTP client, as the bench's) keeps its connection only
// when the body's last chunk came in the same read; real engines write [DONE] and the end of
// their answer in two writes.

// readToDone reads a streamed answer's body up to its [DONE] event, not past it, and closes
// the body, as a client that stops at [DONE] does (the bench's: bench/loadgen reads through
// a 32 KiB buffer, so Go's chunked reader reads a long chunk's data straight from the socket
// and sees the body's end in the same read only when it follows in a chunk of its own). It
// reports whether the request reused a connection.
func readToDone(c *http.Client, url string) (reused bool, err error) {
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
	ctx, cancel := context.WithTimeout(httptrace.WithClientTrace(context.Background(), trace), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(chatBody("llama", "hi", `"stream":true`)))
	if err != nil {
		return false, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return reused, fmt.Errorf("status %d", resp.StatusCode)
	}
	br := bufio.NewReaderSize(resp.Body, 32<<10)
	for range 1000 {
		line, err := br.ReadBytes('\n')
		if bytes.HasPrefix(line, []byte("data: [DONE]")) {
			return reused, nil
		}
		if err != nil {
			return reused, fmt.Errorf("the stream ended without [DONE]: %w", err)
		}
	}
	return reused, errors.New("no [DONE] in 1,000 lines")
}

// TestStreamDoneWithTheEnd: the engine writes [DONE], then the end of its answer only when
// the router has had time to relay the [DONE] alone; the client sees nothing of [DONE]
// before that end, reads both at once, and its next request reuses its connection. Fails
// when [DONE] is written as soon as the engine has nothing more to read, or (events past
// the gathering bound) when the read that completes a long event and brings the [DONE]
// fills the relay's gathering: under load an engine's last events and [DONE] arrive in
// one read, and the [DONE] then went out alone.
func TestStreamDoneWithTheEnd(t *testing.T) {
	long := `data: {"id":"c0","choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 2*gatherMax) + `"}}]}` + "\n\n"
	for _, tc := range []struct {
		name   string
		events string // the answer's events before [DONE], in the write that carries it
	}{
		{"one event", chunked(evA)},
		// One write: the relay's first read ends inside the long event, the next completes
		// it and brings the [DONE], past gatherMax.
		{"events past the gathering bound", chunked(evA) + chunked(long)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wroteDone, release := make(chan struct{}, 4), make(chan struct{}, 4)
			e := newChunkEngine(t, func(_ int, c net.Conn) bool {
				writeBytes(c, sseHead+tc.events+chunked("data: [DONE]\n\n"), false)
				wroteDone <- struct{}{}
				select {
				case <-release:
				case <-time.After(20 * time.Second):
				}
				writeBytes(c, "0\r\n\r\n", false)
				return true
			})
			ts := startServer(t, chunkedConfig(e.url), Options{SkipStartupChecks: true, NoTelemetry: true, StreamDoneWait: time.Minute})
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			defer client.CloseIdleConnections()
			for i := range 2 {
				type result struct {
					reused bool
					err    error
				}
				got := make(chan result, 1)
				go func() {
					reused, err := readToDone(client, ts.url+"/v1/chat/completions")
					got <- result{reused, err}
				}()
				<-wroteDone
				// The [DONE] must not reach the client alone: give the router time to
				// (wrongly) write it, then let the engine end its answer. The wait bounds
				// the check; the test passes whatever the machine's speed.
				select {
				case <-got:
					t.Fatalf("stream %d: the client read [DONE] before the engine ended its answer", i)
				case <-time.After(200 * time.Millisecond):
				}
				release <- struct{}{}
				r := <-got
				if r.err != nil {
					t.Fatalf("stream %d: %v", i, r.err)
				}
				if i == 1 && !r.reused {
					t.Fatal("the client stopped at [DONE] and its connection was not reused: the body's end did not come with [DONE]")
				}
			}
			if n := e.accepts.Load(); n != 1 {
				t.Errorf("the engine accepted %d connections for 2 streams, want 1", n)
			}
		})
	}
}

// TestStreamDoneEngineNeverEnds: an engine that writes [DONE] and never ends its answer
// keeps the client waiting StreamDoneWait at most; the client's stream is complete, and the
// engine's connection, mid-answer, is not used again.
func TestStreamDoneEngineNeverEnds(t *testing.T) {
	stop := make(chan struct{})
	e := newChunkEngine(t, func(i int, c net.Conn) bool {
		if i > 0 {
			writeBytes(c, chunkedAnswer([]string{evA}), false)
			return true
		}
		writeBytes(c, sseHead+chunked(evA)+chunked("data: [DONE]\n\n"), false)
		<-stop
		return false
	})
	defer close(stop)
	ts := startServer(t, chunkedConfig(e.url), Options{SkipStartupChecks: true, NoTelemetry: true, StreamDoneWait: 20 * time.Millisecond})
	for i := range 2 {
		r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", `"stream":true`))
		if r.status != 200 {
			t.Fatalf("stream %d: status %d: %s", i, r.status, r.body)
		}
		if got := checkStreamEnd(t, string(r.body), ""); len(got) != 1 {
			t.Fatalf("stream %d: %d events, want 1: %s", i, len(got), excerpt(string(r.body)))
		}
	}
	if n := e.accepts.Load(); n != 2 {
		t.Errorf("the engine accepted %d connections, want 2 (the first, mid-answer, not reused)", n)
	}
}
