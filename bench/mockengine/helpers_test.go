package mockengine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"switchyard/kv"
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
			t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, url, err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: raw}
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
// messages arrive on a channel.
type zsub struct {
	sock zmq4.Socket
	msgs chan zmq4.Msg
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
	z := &zsub{sock: sock, msgs: make(chan zmq4.Msg, 4096)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := sock.Recv()
			if err != nil {
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

// kvBatch decodes a KV-event message: topic, 8-byte seq, payload.
func kvBatch(t *testing.T, m zmq4.Msg, topic string) (uint64, *kv.EventBatch) {
	t.Helper()
	if len(m.Frames) != 3 {
		t.Fatalf("KV-event message has %d frames, want 3", len(m.Frames))
	}
	if string(m.Frames[0]) != topic || len(m.Frames[1]) != 8 {
		t.Fatalf("bad frames: topic %q, seq of %d bytes", m.Frames[0], len(m.Frames[1]))
	}
	b, err := kv.DecodeEventBatch(m.Frames[2])
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
			if len(b.Events) != 1 || b.Events[0].Kind != kv.EventAllBlocksCleared {
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
