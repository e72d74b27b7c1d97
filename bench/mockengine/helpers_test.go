package mockengine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"switchyard/kv/events"
)

// testDeadline bounds every wait on a real socket in these tests.
const testDeadline = 10 * time.Second

// startEngine starts an engine closed at the end of the test.
func startEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	e, err := Start(t.Context(), cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return e
}

// runClock runs c as a discrete-event simulation until the test ends.
func runClock(t *testing.T, c *ManualClock) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// newClient returns an HTTP client whose idle connections close at the end of the test.
func newClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: testDeadline}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("response is not a JSON object: %v: %s", err, r.body)
	}
	return m
}

func do(t *testing.T, c *http.Client, method, url string, body any) response {
	t.Helper()
	r, err := tryDo(c, method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// tryDo is do for goroutines other than the test's: it returns errors instead of failing.
func tryDo(c *http.Client, method, url string, body any) (response, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			return response{}, err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return response{}, err
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		return response{}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, fmt.Errorf("%s %s: reading body: %w", method, url, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: raw}, nil
}

// poll calls cond until it holds, failing the test after testDeadline. It is for state
// behind a real socket, which no channel can signal.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(testDeadline)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// sseEvents reads an SSE body into its data payloads; it reports whether the stream ended
// cleanly with [DONE] and returns the read error, if any.
func sseEvents(r io.Reader) (events []string, done bool, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		data := strings.TrimPrefix(line, "data: ")
		if data == "[DONE]" {
			done = true
			continue
		}
		events = append(events, data)
	}
	return events, done, sc.Err()
}

func num(t *testing.T, v any) int {
	t.Helper()
	f, ok := v.(float64)
	if !ok {
		t.Fatalf("%v (%T) is not a number", v, v)
	}
	return int(f)
}

// path walks a decoded JSON value by object keys and array indexes.
func path(t *testing.T, v any, keys ...any) any {
	t.Helper()
	for _, k := range keys {
		switch k := k.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("cannot index %T with %q", v, k)
			}
			v = m[k]
		case int:
			a, ok := v.([]any)
			if !ok || k >= len(a) {
				t.Fatalf("cannot index %T with %d", v, k)
			}
			v = a[k]
		}
	}
	return v
}

// zsub is a ZMQ SUB socket (go-zeromq/zmq4, an independent ZMTP implementation) whose
// messages arrive on a channel; the error that ends its receiving (a dropped connection)
// arrives on done.
type zsub struct {
	sock zmq4.Socket
	msgs chan zmq4.Msg
	done chan error
}

func dialSub(t *testing.T, endpoint, topic string) *zsub {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sock := zmq4.NewSub(ctx, zmq4.WithLogger(log.New(io.Discard, "", 0)), zmq4.WithDialerMaxRetries(0))
	if err := sock.Dial(endpoint); err != nil {
		cancel()
		t.Fatalf("dial %s: %v", endpoint, err)
	}
	if err := sock.SetOption(zmq4.OptionSubscribe, topic); err != nil {
		t.Fatal(err)
	}
	z := &zsub{sock: sock, msgs: make(chan zmq4.Msg, 4096), done: make(chan error, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := sock.Recv()
			if err != nil {
				z.done <- err
				return
			}
			select {
			case z.msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		sock.Close()
		<-done
	})
	return z
}

// next returns the next message, failing the test after testDeadline.
func (z *zsub) next(t *testing.T) zmq4.Msg {
	t.Helper()
	select {
	case m := <-z.msgs:
		return m
	case <-time.After(testDeadline):
		t.Fatal("no ZMQ message within the deadline")
	}
	return zmq4.Msg{}
}

// dropped waits for the connection to end, failing the test if a message arrives first or
// nothing happens within testDeadline.
func (z *zsub) dropped(t *testing.T, what string) {
	t.Helper()
	select {
	case err := <-z.done:
		if err == nil {
			t.Fatalf("%s: receiving ended without an error", what)
		}
	case m := <-z.msgs:
		t.Fatalf("%s: got a message on a connection that should have been dropped: %q", what, m.Frames)
	case <-time.After(testDeadline):
		t.Fatalf("%s: the connection was not dropped within the deadline", what)
	}
}

// kvBatch decodes a KV-event message: topic, 8-byte seq, payload.
func kvBatch(t *testing.T, m zmq4.Msg, topic string) (uint64, *events.EventBatch) {
	t.Helper()
	if len(m.Frames) != 3 {
		t.Fatalf("KV-event message has %d frames, want 3", len(m.Frames))
	}
	if string(m.Frames[0]) != topic || len(m.Frames[1]) != 8 {
		t.Fatalf("bad frames: topic %q, seq of %d bytes", m.Frames[0], len(m.Frames[1]))
	}
	b, err := events.DecodeEventBatch(m.Frames[2])
	if err != nil {
		t.Fatal(err)
	}
	return binary.BigEndian.Uint64(m.Frames[1]), b
}

// syncKV waits until sub receives events from e: it flushes the (idle) cache until an
// AllBlocksCleared batch arrives, then returns its sequence number.
func syncKV(t *testing.T, c *http.Client, e *Engine, z *zsub, topic string) uint64 {
	t.Helper()
	deadline := time.Now().Add(testDeadline)
	for time.Now().Before(deadline) {
		if r := do(t, c, "POST", e.URL()+"/flush_cache", nil); r.status != 200 {
			t.Fatalf("flush_cache: %d %s", r.status, r.body)
		}
		select {
		case m := <-z.msgs:
			seq, b := kvBatch(t, m, topic)
			if len(b.Events) != 1 || b.Events[0].Kind != events.EventAllBlocksCleared {
				t.Fatalf("first batch after a flush is %+v", b)
			}
			return seq
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatal("the subscriber never received an event")
	return 0
}

func jsonBody(t *testing.T, v any) io.Reader {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(raw)
}

func newRequest(ctx context.Context, url string, body any) (*http.Request, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return req, nil
}

func beUint64(b []byte) uint64 { return binary.BigEndian.Uint64(b) }

type replayed struct {
	seq uint64
	b   *events.EventBatch
}

// replay asks a replay socket for every batch from start, with or without the empty
// delimiter frame of a REQ-style peer.
func replay(t *testing.T, endpoint string, start uint64, delimiter bool) []replayed {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sock := zmq4.NewDealer(ctx, zmq4.WithLogger(log.New(io.Discard, "", 0)), zmq4.WithDialerMaxRetries(0))
	defer sock.Close()
	if err := sock.Dial(endpoint); err != nil {
		t.Fatal(err)
	}
	req := [][]byte{binary.BigEndian.AppendUint64(nil, start)}
	if delimiter {
		req = append([][]byte{{}}, req...)
	}
	if err := sock.Send(zmq4.NewMsgFrom(req...)); err != nil {
		t.Fatal(err)
	}
	var out []replayed
	for {
		type recv struct {
			m   zmq4.Msg
			err error
		}
		ch := make(chan recv, 1)
		go func() {
			m, err := sock.Recv()
			ch <- recv{m, err}
		}()
		var m zmq4.Msg
		select {
		case r := <-ch:
			if r.err != nil {
				t.Fatal(r.err)
			}
			m = r.m
		case <-time.After(testDeadline):
			t.Fatal("replay did not answer")
		}
		f := m.Frames
		if delimiter {
			if len(f) == 0 || len(f[0]) != 0 {
				t.Fatalf("reply without the delimiter: %q", f)
			}
			f = f[1:]
		}
		if len(f) != 2 || len(f[0]) != 8 {
			t.Fatalf("bad replay frames %q", f)
		}
		seq := binary.BigEndian.Uint64(f[0])
		if seq == ^uint64(0) {
			return out
		}
		b, err := events.DecodeEventBatch(f[1])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, replayed{seq, b})
	}
}

func contextWithCancel(t *testing.T) (context.Context, context.CancelFunc) {
	return context.WithCancel(t.Context())
}
