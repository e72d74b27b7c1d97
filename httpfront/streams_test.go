package httpfront

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/iotest"
	"time"
	"unsafe"

	"switchyard/config"
	"switchyard/internal/rawtest"
)

// Streams must end in a way every client reads: with the engine's whole answer and its
// [DONE] event, or with a parseable error event and [DONE], never with a truncated answer
// that looks complete or an error glued to a half-relayed event.

// sseEvents parses an SSE body strictly, as the OpenAI SDKs do: events are separated by a
// blank line, data lines are joined, comments are skipped. It returns each event's data.
func sseEvents(body string) []string {
	var events []string
	var data []string
	for _, line := range strings.Split(strings.ReplaceAll(body, "\r\n", "\n"), "\n") {
		switch {
		case line == "":
			if len(data) > 0 {
				events = append(events, strings.Join(data, "\n"))
				data = nil
			}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		default:
			data = append(data, "<field "+line+">")
		}
	}
	if len(data) > 0 {
		events = append(events, strings.Join(data, "\n")+" <unterminated>")
	}
	return events
}

// excerpt bounds a stream body quoted in a failure.
func excerpt(body string) string {
	if len(body) <= 600 {
		return strconv.Quote(body)
	}
	return strconv.Quote(body[:200]) + " ... " + strconv.Quote(body[len(body)-400:])
}

// checkStreamEnd checks that body is a well-formed stream: every event is JSON, the last is
// [DONE], and the one before it is an error with code wantCode ("" for a complete answer,
// which must have no error event). It returns the non-error events' data.
func checkStreamEnd(t *testing.T, body, wantCode string) []string {
	t.Helper()
	events := sseEvents(body)
	if len(events) == 0 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("the stream does not end with [DONE]: %s", excerpt(body))
	}
	var answer []string
	var errCode string
	for i, ev := range events[:len(events)-1] {
		var v struct {
			Error *struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(ev), &v); err != nil {
			t.Fatalf("event %d is not JSON (%v): %s\nwhole stream: %s", i, err, excerpt(ev), excerpt(body))
		}
		if v.Error != nil {
			if i != len(events)-2 {
				t.Fatalf("error event %d is not the last before [DONE]: %s", i, excerpt(body))
			}
			errCode = v.Error.Code
			continue
		}
		answer = append(answer, ev)
	}
	if errCode != wantCode {
		t.Fatalf("error code %q, want %q: %s", errCode, wantCode, excerpt(body))
	}
	return answer
}

// rawEngine is an upstream written over raw TCP: each inference request's connection is
// handed to answer once its request was read. It lets a test cut a stream anywhere.
type rawEngine struct {
	url string
}

func newRawEngine(t *testing.T, answer func(c net.Conn)) *rawEngine {
	t.Helper()
	return &rawEngine{url: "http://" + rawtest.Serve(t, rawtest.OneRequest(answer))}
}

const sseHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

// chunked frames s as one HTTP chunk.
func chunked(s string) string { return strconv.FormatInt(int64(len(s)), 16) + "\r\n" + s + "\r\n" }

const (
	evA = `data: {"id":"c0","choices":[{"index":0,"delta":{"content":"Hel"}}]}` + "\n\n"
	evB = `data: {"id":"c0","choices":[{"index":0,"delta":{"content":"lo"}}]}` + "\n\n"
)

func TestStreamEndsOnEventBoundary(t *testing.T) {
	half := `data: {"id":"c0","choices":[{"index":0,"delta":{"content":"tr`
	tests := []struct {
		name     string
		answer   func(c net.Conn, release <-chan struct{})
		idle     time.Duration
		request  time.Duration
		wantCode string
		want     int // complete events the client must see
	}{
		{"engine dies mid-event", func(c net.Conn, _ <-chan struct{}) {
			_, _ = io.WriteString(c, sseHead+chunked(evA)+chunked(half))
		}, 0, 0, CodeUpstream, 1},
		{"engine dies mid-line of a CRLF stream", func(c net.Conn, _ <-chan struct{}) {
			_, _ = io.WriteString(c, sseHead+chunked(strings.ReplaceAll(evA+evB, "\n", "\r\n"))+chunked("data: {\"id\""))
		}, 0, 0, CodeUpstream, 2},
		{"events split across chunks, then a clean end without [DONE]", func(c net.Conn, _ <-chan struct{}) {
			_, _ = io.WriteString(c, sseHead+chunked(evA[:10])+chunked(evA[10:]+evB[:5])+chunked(evB[5:])+"0\r\n\r\n")
		}, 0, 0, CodeUpstream, 2},
		{"engine goes silent mid-event", func(c net.Conn, release <-chan struct{}) {
			_, _ = io.WriteString(c, sseHead+chunked(evA)+chunked(half))
			<-release
		}, 150 * time.Millisecond, 0, CodeStreamIdleTimeout, 1},
		{"request times out mid-event", func(c net.Conn, release <-chan struct{}) {
			_, _ = io.WriteString(c, sseHead+chunked(evA)+chunked(half))
			<-release
		}, 0, 300 * time.Millisecond, CodeUpstreamTimeout, 1},
		{"complete answer", func(c net.Conn, _ <-chan struct{}) {
			_, _ = io.WriteString(c, sseHead+chunked(evA[:7])+chunked(evA[7:]+evB)+chunked("data: [DONE]\n\n")+"0\r\n\r\n")
		}, 0, 0, "", 2},
		{"complete answer whose [DONE] lacks its blank line", func(c net.Conn, _ <-chan struct{}) {
			_, _ = io.WriteString(c, sseHead+chunked(evA+evB+"data: [DONE]\n")+"0\r\n\r\n")
		}, 0, 0, "", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			release := make(chan struct{})
			e := newRawEngine(t, func(c net.Conn) { tt.answer(c, release) })
			defer close(release)
			cfg := baseConfig()
			cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
			cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("all", nil, nil, "A")}}}
			if tt.idle > 0 {
				cfg.Server.StreamIdleTimeout = tt.idle
			}
			if tt.request > 0 {
				cfg.Server.RequestTimeout = tt.request
			}
			ts := startServer(t, cfg, Options{SkipStartupChecks: true, NoTelemetry: true, HeartbeatInterval: 20 * time.Millisecond})
			r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", `"stream":true`))
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if got := checkStreamEnd(t, string(r.body), tt.wantCode); len(got) != tt.want {
				t.Fatalf("%d complete events, want %d: %q", len(got), tt.want, r.body)
			}
		})
	}
}

// TestDrainDeliversShuttingDown: streams still running when the drain timeout passes each
// end with a shutting_down event and [DONE], whether they wait on the engine or are
// back-pressured: the engine floods and the client reads nothing until the hard stop, so
// the stream's end is queued behind what the sockets hold, and reaches the client once it
// has read that. The drain promises the end only within Options.StreamEndGrace: the test's
// grace is long, for a client that -race and a loaded machine slow down (a stream whose end
// is not written by then loses it, and the test fails).
func TestDrainDeliversShuttingDown(t *testing.T) {
	tests := []struct {
		name    string
		flood   bool
		streams int
	}{
		{"waiting streams", false, 40},
		{"back-pressured streams", true, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newFakeEngine(t, "A", "llama", withGate())
			e.flood = tt.flood
			cfg := oneEngineConfig(e)
			cfg.Server.DrainTimeout = 300 * time.Millisecond
			ln := listenPressed(t, tt.streams)
			ts := startServer(t, cfg, Options{SkipStartupChecks: true, NoTelemetry: true, HeartbeatInterval: 50 * time.Millisecond,
				Listener: ln, StreamEndGrace: 30 * time.Second})
			tr := &http.Transport{DisableKeepAlives: true, DialContext: dialPressed}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr}
			bodies := make([]string, tt.streams)
			var wg sync.WaitGroup
			for i := range tt.streams {
				resp, err := client.Post(ts.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("llama", "hi", `"stream":true`)))
				if err != nil {
					t.Fatal(err)
				}
				waitFor(t, e.streamed, "a stream's first chunk")
				if tt.flood {
					// The client has read nothing past the headers: its stream's writes fill
					// the socket's buffers and then wait.
					waitFor(t, ln.pressed, "a stream's write to wait for its client")
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer resp.Body.Close()
					if tt.flood {
						<-ts.hardStop
					}
					b, _ := io.ReadAll(resp.Body)
					bodies[i] = string(b)
				}()
			}
			ts.stop(t) // the drain times out and ends every stream
			ts.done = make(chan error, 1)
			ts.done <- nil
			wg.Wait()
			for i, b := range bodies {
				t.Run(fmt.Sprint("stream ", i), func(t *testing.T) {
					checkStreamEnd(t, b, CodeShuttingDown)
				})
			}
		})
	}
}

// pressedListener hands the Server connections whose writes signal on pressed, once each,
// when the kernel first refuses their bytes: the socket's send buffer is full, the client
// has not read what it holds. It tells a back-pressured stream from a fast one without a
// guess at timing.
type pressedListener struct {
	net.Listener
	pressed chan struct{}
}

// listenPressed listens on a loopback port the OS chooses; pressed holds up to n signals.
func listenPressed(t *testing.T, n int) *pressedListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return &pressedListener{Listener: ln, pressed: make(chan struct{}, n)}
}

func (l *pressedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := c.(*net.TCPConn)
	rc, err := tc.SyscallConn()
	if err == nil {
		err = tc.SetWriteBuffer(pressedBuffer)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return &pressedConn{TCPConn: tc, rc: rc, pressed: l.pressed}, nil
}

// pressedBuffer is the socket buffer size of both ends of a pressedListener's connections
// (the client's with dialPressed): a stream is back-pressured once a few of its events wait,
// not megabytes that a loaded machine's client then takes seconds to read.
const pressedBuffer = 32 << 10

// dialPressed dials a pressedListener with a small receive buffer (pressedBuffer).
func dialPressed(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if err := c.(*net.TCPConn).SetReadBuffer(pressedBuffer); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// pressedConn is a connection of pressedListener.
type pressedConn struct {
	*net.TCPConn
	rc      syscall.RawConn
	pressed chan<- struct{}
	once    sync.Once
}

// Write writes b as net.TCPConn does (waiting in the runtime's poller, under the deadline
// set), noting the first write the kernel refused.
func (c *pressedConn) Write(b []byte) (int, error) {
	n := 0
	var werr error
	err := c.rc.Write(func(fd uintptr) bool {
		for n < len(b) {
			m, err := syscall.Write(int(fd), b[n:])
			if m > 0 {
				n += m
			}
			switch {
			case err == syscall.EAGAIN:
				c.once.Do(func() { signal(c.pressed) })
				return false // wait until the socket takes more
			case err == syscall.EINTR:
			case err != nil:
				werr = err
				return true
			case m <= 0:
				werr = io.ErrShortWrite
				return true
			}
		}
		return true
	})
	if werr == nil {
		werr = err
	}
	return n, werr
}

// lastBoundary is the reference: the offset past the last line terminator (CRLF, LF or CR)
// that ends an empty line, or 0.
func lastBoundary(b []byte) int {
	cut, lineLen := 0, 0
	for i := 0; i < len(b); i++ {
		if b[i] != '\r' && b[i] != '\n' {
			lineLen++
			continue
		}
		if b[i] == '\r' && i+1 < len(b) && b[i+1] == '\n' {
			i++
		}
		if lineLen == 0 {
			cut = i + 1
		}
		lineLen = 0
	}
	return cut
}

// FuzzRelayFraming feeds an engine's stream to the relay's framing in arbitrary chunks: the
// client must receive exactly the stream up to its last event boundary, whatever the
// chunking.
func FuzzRelayFraming(f *testing.F) {
	for _, s := range []string{evA + evB + "data: [DONE]\n\n", "data: x\r\n\r\ndata: y\r\rdata", "\n\n\n", ": c\n\ndata: a\ndata: b\n\n", "data: [DONE]\n"} {
		f.Add([]byte(s), []byte{3, 1, 7})
	}
	f.Fuzz(func(t *testing.T, stream, splits []byte) {
		var out bytes.Buffer
		r := &relay{}
		rest := stream
		for _, s := range splits {
			n := min(int(s), len(rest))
			out.Write(r.frame(rest[:n]))
			rest = rest[n:]
		}
		out.Write(r.frame(rest))
		want := stream[:lastBoundary(stream)]
		// A CRLF split between two chunks ends the event at its CR; the LF then waits.
		if got := out.Bytes(); !bytes.Equal(got, want) && !(bytes.HasSuffix(want, []byte("\r\n")) && bytes.Equal(got, want[:len(want)-1])) {
			t.Fatalf("relayed %q, want %q", out.Bytes(), want)
		}
		if got := string(out.Bytes()) + string(r.held); got != string(stream) {
			t.Fatalf("relayed %q + held %q is not the stream %q", out.Bytes(), r.held, stream)
		}
		if data, done := countLines(stream); r.sse.dataLines != data || r.sse.doneLines != done {
			t.Fatalf("the framer counted %d data and %d [DONE] lines in %q, want %d and %d",
				r.sse.dataLines, r.sse.doneLines, stream, data, done)
		}
	})
}

// countLines counts the data lines ("data:" at a line's start) and [DONE] lines ("data:",
// spaces, "[DONE]") of an SSE stream, its last line unterminated or not: the reference for
// the relay's framer.
func countLines(b []byte) (data, done int) {
	for len(b) > 0 {
		n := bytes.IndexAny(b, "\r\n")
		if n < 0 {
			n = len(b)
		}
		if rest, ok := bytes.CutPrefix(b[:n], []byte("data:")); ok {
			data++
			if bytes.HasPrefix(bytes.TrimLeft(rest, " "), []byte("[DONE]")) {
				done++
			}
		}
		b = b[n:]
		if len(b) > 0 {
			b = b[1:] // the terminator (of a CRLF, the CR: the LF ends an empty line here, counted as none)
		}
	}
	return data, done
}

// TestRelayReadMatchesWriteTo: a caller that reads the relay (io.Reader) instead of letting
// it write (WriteTo, what fasthttp uses) gets the same bytes: whole events, then the end.
func TestRelayReadMatchesWriteTo(t *testing.T) {
	stream := evA[:9] + evA[9:] + evB[:4] + evB[4:] + "data: [DONE]\n"
	relayOf := func() *relay {
		s := &Server{hardStop: make(chan struct{}), now: time.Now}
		r := &relay{s: s, body: iotest.OneByteReader(strings.NewReader(stream)), buf: getBuf(),
			idleAfter: time.Minute, hbEvery: time.Minute}
		r.slo.firstAt = time.Unix(1, 0) // no SLO rates here: the first token counts as recorded
		r.idleAt = time.Now().Add(time.Minute)
		return r
	}
	var written bytes.Buffer
	if _, err := relayOf().WriteTo(&written); err != nil {
		t.Fatal(err)
	}
	read, err := io.ReadAll(relayOf())
	if err != nil {
		t.Fatal(err)
	}
	want := evA + evB + "data: [DONE]\n\n"
	if written.String() != want || string(read) != want {
		t.Fatalf("WriteTo wrote %q, Read gave %q; want %q", written.String(), read, want)
	}
}

// TestHeartbeatNeverOvertakesAnEvent: when the heartbeat is due before the read that would
// write the gathered events waits (a stream's goroutine started late on a busy machine: the
// first event, read in prime, is gathered, then the read finds the heartbeat past), the
// events go out, not a heartbeat ahead of them.
func TestHeartbeatNeverOvertakesAnEvent(t *testing.T) {
	var out bytes.Buffer
	r := &relay{s: &Server{hardStop: make(chan struct{}), now: time.Now}, hbEvery: time.Minute}
	r.w, r.gather = &out, true
	now := time.Now()
	r.idleAt, r.hbAt = now.Add(time.Hour), now.Add(-time.Millisecond)
	r.gatherOut([]byte(evA))
	if !r.Woke() {
		t.Fatal("the stream ended at a heartbeat")
	}
	if out.String() != evA {
		t.Fatalf("wrote %q, want the gathered event %q", out.String(), evA)
	}
	if !r.hbAt.After(now) {
		t.Fatal("the next heartbeat was not pushed back")
	}
	r.hbAt = time.Now().Add(-time.Millisecond)
	out.Reset()
	if !r.Woke() || out.String() != string(heartbeat) {
		t.Fatalf("with nothing gathered: wrote %q, want the heartbeat", out.String())
	}
}

// relaySizeClass is the Go allocator's size class a relay is allocated from (1536 bytes; the
// next is 1792): every stream allocates one and a held stream keeps it.
const relaySizeClass = 1536

// TestRelaySize: the relay stays within its size class, so that a field added to it does not
// cost every stream the next class's 256 bytes unnoticed. Move a field's flags beside the
// others (padding) or make room before raising the bound.
func TestRelaySize(t *testing.T) {
	if n := unsafe.Sizeof(relay{}); n > relaySizeClass {
		t.Fatalf("a relay is %d bytes, over its %d-byte size class", n, relaySizeClass)
	}
}
