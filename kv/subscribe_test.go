package kv

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// waitFor bounds every wait on a real socket.
const waitFor = 10 * time.Second

// testPublisher is an engine's side of the KV-event topology on real zmq4 sockets on
// 127.0.0.1: a PUB socket (bound, or dialing the router's bound SUB) sending (topic, seq,
// payload), and optionally a replay ROUTER serving the batches it retained.
type testPublisher struct {
	t      *testing.T
	pub    zmq4.Socket
	router zmq4.Socket
	topic  string
	shape  Shape
	enc    *Encoder
	done   chan struct{}

	mu   sync.Mutex
	seq  uint64
	ring map[uint64][]byte
}

// newTestPublisher binds a PUB on pubEP (and a replay ROUTER on replayEP unless it is "").
func newTestPublisher(t *testing.T, pubEP, replayEP string) *testPublisher {
	t.Helper()
	p := &testPublisher{t: t, enc: NewEncoder(), ring: map[uint64][]byte{}, done: make(chan struct{})}
	p.pub = zmq4.NewPub(context.Background())
	if err := p.pub.Listen(pubEP); err != nil {
		t.Fatalf("cannot bind PUB %s: %v", pubEP, err)
	}
	if replayEP != "" {
		p.router = zmq4.NewRouter(context.Background())
		if err := p.router.Listen(replayEP); err != nil {
			t.Fatalf("cannot bind ROUTER %s: %v", replayEP, err)
		}
		go p.serveReplay()
	} else {
		close(p.done)
	}
	t.Cleanup(p.close)
	return p
}

// dialingPublisher dials a bound SUB, as vLLM-style engines do.
func dialingPublisher(t *testing.T, ep, topic string) *testPublisher {
	t.Helper()
	p := &testPublisher{t: t, enc: NewEncoder(), ring: map[uint64][]byte{}, done: make(chan struct{}), topic: topic}
	close(p.done)
	p.pub = zmq4.NewPub(context.Background())
	if err := p.pub.Dial(ep); err != nil {
		t.Fatalf("cannot dial %s: %v", ep, err)
	}
	t.Cleanup(p.close)
	return p
}

func (p *testPublisher) close() {
	_ = p.pub.Close()
	if p.router != nil {
		_ = p.router.Close()
	}
	<-p.done
}

func (p *testPublisher) pubEndpoint() string { return "tcp://" + p.pub.Addr().String() }

func (p *testPublisher) replayEndpoint() string { return "tcp://" + p.router.Addr().String() }

// encode records the batch under the next sequence number and returns it.
func (p *testPublisher) encode(b *EventBatch) (uint64, []byte) {
	p.t.Helper()
	payload, err := p.enc.Encode(b, p.shape)
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.seq
	p.seq++
	msg := append([]byte(nil), payload...)
	p.ring[seq] = msg
	return seq, msg
}

// send publishes b and returns its sequence number.
func (p *testPublisher) send(b *EventBatch) uint64 {
	p.t.Helper()
	seq, msg := p.encode(b)
	if err := p.pub.Send(zmq4.NewMsgFrom([]byte(p.topic), binary.BigEndian.AppendUint64(nil, seq), msg)); err != nil {
		p.t.Fatalf("cannot publish: %v", err)
	}
	return seq
}

// lose takes a sequence number for b without sending it (a dropped message).
func (p *testPublisher) lose(b *EventBatch) uint64 {
	seq, _ := p.encode(b)
	return seq
}

// serveReplay answers replay requests until the ROUTER closes.
func (p *testPublisher) serveReplay() {
	defer close(p.done)
	for {
		msg, err := p.router.Recv()
		if err != nil {
			return
		}
		f := msg.Frames
		if len(f) < 2 {
			continue
		}
		id, rest := f[0], f[1:]
		var prefix [][]byte
		if len(rest) == 2 && len(rest[0]) == 0 {
			prefix, rest = [][]byte{{}}, rest[1:]
		}
		if len(rest) != 1 || len(rest[0]) != 8 {
			continue
		}
		start := binary.BigEndian.Uint64(rest[0])
		reply := func(frames ...[]byte) {
			all := append(append([][]byte{id}, prefix...), frames...)
			_ = p.router.Send(zmq4.NewMsgFrom(all...))
		}
		p.mu.Lock()
		last := p.seq
		p.mu.Unlock()
		for s := start; s < last; s++ {
			p.mu.Lock()
			payload, ok := p.ring[s]
			p.mu.Unlock()
			if ok {
				reply(binary.BigEndian.AppendUint64(nil, s), payload)
			}
		}
		reply(binary.BigEndian.AppendUint64(nil, endOfReplay), nil)
	}
}

// applied is one OnApplied call.
type applied struct {
	worker string
	rank   int
	seq    uint64
}

// harness runs a Manager over an index for one test.
type harness struct {
	x       *Index
	m       *Manager
	applied chan applied
}

func startManager(t *testing.T, bind string, specs ...WorkerSpec) *harness {
	t.Helper()
	h := &harness{x: newTestIndex(t, 4, 1<<20), applied: make(chan applied, 4096)}
	m, err := NewManager(ManagerConfig{
		Index: h.x, BindEndpoint: bind, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		ReplayTimeout: 5 * time.Second,
		OnApplied: func(w string, r int, seq uint64) {
			select {
			case h.applied <- applied{w, r, seq}:
			default:
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h.m = m
	for _, s := range specs {
		if err := m.AddWorker(s); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(waitFor):
			t.Error("Run did not return after cancel")
		}
	})
	return h
}

// waitApplied waits until a batch of worker with sequence seq was applied.
func (h *harness) waitApplied(t *testing.T, worker string, seq uint64) {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		select {
		case a := <-h.applied:
			if a.worker == worker && a.seq == seq {
				return
			}
		case <-deadline:
			t.Fatalf("batch %d of %s not applied within %v", seq, worker, waitFor)
		}
	}
}

// warmUp publishes empty batches until the subscriber applies one (the ZMQ slow joiner
// drops what is published before the subscription arrives).
func (h *harness) warmUp(t *testing.T, p *testPublisher, worker string) {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		seq := p.send(&EventBatch{Events: []Event{}})
		tick := time.After(50 * time.Millisecond)
	wait:
		for {
			select {
			case a := <-h.applied:
				if a.worker == worker && a.seq == seq {
					return
				}
			case <-tick:
				break wait
			case <-deadline:
				t.Fatalf("subscriber of %s never received a batch", worker)
			}
		}
	}
}

// storedBatch stores the router-hash blocks of tokens (block size 16, a new chain) on the GPU.
func storedBatch(tokens []uint32) *EventBatch {
	return &EventBatch{Events: []Event{stored(AppendBlockHashes(nil, tokens, 16), 0, tokens, 16, MediumGPU)}}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func TestSubscriptionAppliesAndRepairsGapsByReplay(t *testing.T) {
	p := newTestPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
	h := startManager(t, "", WorkerSpec{ID: "a", Model: "m",
		Publishers: []Publisher{{Rank: 0, Endpoint: p.pubEndpoint(), Replay: p.replayEndpoint()}}})
	h.warmUp(t, p, "a")

	first := seqTokens(0, 160)
	h.waitApplied(t, "a", p.send(storedBatch(first)))
	if got := lookup(t, h.x, "m", first); got["a"] != 160 {
		t.Fatalf("after the first batch: %v", got)
	}
	lost := seqTokens(5000, 320)
	p.lose(storedBatch(lost))
	next := seqTokens(9000, 96)
	h.waitApplied(t, "a", p.send(storedBatch(next)))
	got := map[string]int64{}
	for _, prompt := range [][]uint32{first, lost, next} {
		for w, n := range lookup(t, h.x, "m", prompt) {
			got[w] += n
		}
	}
	if got["a"] != 160+320+96 {
		t.Fatalf("after the repaired gap: %v", got)
	}
	// One more batch: the replay's bookkeeping is done once it is applied.
	h.waitApplied(t, "a", p.send(&EventBatch{Events: []Event{}}))
	c := h.x.Metrics().Ingest()
	if c.Gaps != 1 || c.Replays != 1 || c.ReplayFailures != 0 || c.ClearsGap != 0 {
		t.Fatalf("counts %+v", c)
	}
	st := h.m.Status()
	if len(st) != 1 || len(st[0].Publishers) != 1 || !st[0].Publishers[0].Connected {
		t.Fatalf("status %+v", st)
	}
}

func TestSubscriptionGapWithoutReplayClears(t *testing.T) {
	p := newTestPublisher(t, "tcp://127.0.0.1:0", "")
	h := startManager(t, "", WorkerSpec{ID: "a", Model: "m", KVEvents: p.pubEndpoint()})
	h.warmUp(t, p, "a")
	before := seqTokens(0, 160)
	h.waitApplied(t, "a", p.send(storedBatch(before)))
	p.lose(storedBatch(seqTokens(7000, 16)))
	after := seqTokens(9000, 96)
	h.waitApplied(t, "a", p.send(storedBatch(after)))
	if got := lookup(t, h.x, "m", before); got["a"] != 0 {
		t.Fatalf("entries from before the gap survived: %v", got)
	}
	if got := lookup(t, h.x, "m", after); got["a"] != 96 {
		t.Fatalf("entries after the gap: %v", got)
	}
	if c := h.x.Metrics().Ingest(); c.Gaps != 1 || c.ClearsGap != 1 {
		t.Fatalf("counts %+v", c)
	}
}

// TestSubscriptionReconnectClears covers a publisher that restarted while the router was
// disconnected and happened to count exactly past the router's last sequence number: the
// next batch looks continuous, yet the old entries must not survive the reconnection.
func TestSubscriptionReconnectClears(t *testing.T) {
	port, rport := freePort(t), freePort(t)
	ep := "tcp://127.0.0.1:" + strconv.Itoa(port)
	rep := "tcp://127.0.0.1:" + strconv.Itoa(rport)
	p := newTestPublisher(t, ep, rep)
	h := startManager(t, "", WorkerSpec{ID: "a", Model: "m", KVEvents: ep, Replay: rep})
	h.warmUp(t, p, "a")
	old := seqTokens(0, 160)
	h.waitApplied(t, "a", p.send(storedBatch(old)))
	p.close()
	p2 := newTestPublisher(t, ep, rep)
	p2.mu.Lock()
	p2.seq = p.seq // the new run's next batch carries the old run's next sequence number
	p2.mu.Unlock()
	h.warmUp(t, p2, "a")
	if got := lookup(t, h.x, "m", old); got["a"] != 0 {
		t.Fatalf("stale ownership after a reconnection: %v", got)
	}
	if c := h.x.Metrics().Ingest(); c.ClearsReconnect != 1 {
		t.Fatalf("counts %+v", c)
	}
}

func TestSubscriptionRestartClears(t *testing.T) {
	port, rport := freePort(t), freePort(t)
	ep := "tcp://127.0.0.1:" + strconv.Itoa(port)
	rep := "tcp://127.0.0.1:" + strconv.Itoa(rport)
	p := newTestPublisher(t, ep, rep)
	h := startManager(t, "", WorkerSpec{ID: "a", Model: "m", KVEvents: ep, Replay: rep})
	h.warmUp(t, p, "a")
	old := seqTokens(0, 320)
	for range 3 {
		h.waitApplied(t, "a", p.send(&EventBatch{Events: []Event{}}))
	}
	h.waitApplied(t, "a", p.send(storedBatch(old)))
	if got := lookup(t, h.x, "m", old); got["a"] != 320 {
		t.Fatalf("before the restart: %v", got)
	}
	// The engine restarts: its publisher goes away and comes back counting from 0.
	p.close()
	p2 := newTestPublisher(t, ep, rep)
	h.warmUp(t, p2, "a")
	if got := lookup(t, h.x, "m", old); got["a"] != 0 {
		t.Fatalf("stale ownership after the restart: %v", got)
	}
	fresh := seqTokens(100, 64)
	h.waitApplied(t, "a", p2.send(storedBatch(fresh)))
	if got := lookup(t, h.x, "m", fresh); got["a"] != 64 {
		t.Fatalf("after the restart: %v", got)
	}
	if c := h.x.Metrics().Ingest(); c.ClearsReconnect != 1 {
		t.Fatalf("counts %+v", c)
	}
	t.Run("AllBlocksCleared clears", func(t *testing.T) {
		h.waitApplied(t, "a", p2.send(&EventBatch{Events: []Event{{Kind: EventAllBlocksCleared}}}))
		if got := lookup(t, h.x, "m", fresh); got["a"] != 0 {
			t.Fatalf("after AllBlocksCleared: %v", got)
		}
	})
	t.Run("removal stops and prunes", func(t *testing.T) {
		h.waitApplied(t, "a", p2.send(storedBatch(fresh)))
		if !h.m.RemoveWorker("a") {
			t.Fatal("RemoveWorker")
		}
		if got := lookup(t, h.x, "m", fresh); len(got) != 0 || h.x.Stats().Blocks != 0 {
			t.Fatalf("after removal: %v, %d blocks", got, h.x.Stats().Blocks)
		}
		if len(h.m.Status()) != 0 {
			t.Fatal("status lists a removed worker")
		}
	})
}

func TestSubscriptionDisconnectWithoutReplayClears(t *testing.T) {
	port := freePort(t)
	ep := "tcp://127.0.0.1:" + strconv.Itoa(port)
	p := newTestPublisher(t, ep, "")
	h := startManager(t, "", WorkerSpec{ID: "a", Model: "m", KVEvents: ep})
	h.warmUp(t, p, "a")
	blocks := seqTokens(0, 128)
	h.waitApplied(t, "a", p.send(storedBatch(blocks)))
	p.close()
	// The subscriber notices the lost connection and clears; wait for the reconnect.
	p2 := newTestPublisher(t, ep, "")
	h.warmUp(t, p2, "a")
	if got := lookup(t, h.x, "m", blocks); got["a"] != 0 {
		t.Fatalf("ownership survived a disconnect without replay: %v", got)
	}
}

func TestBoundSubRekeysVLLMStyleEvents(t *testing.T) {
	h := startManager(t, "tcp://127.0.0.1:0",
		WorkerSpec{ID: "v", URL: "http://localhost:8100", Model: "m", NoDiscovery: true})
	select {
	case <-h.m.BoundReady():
	case <-time.After(waitFor):
		t.Fatal("bound SUB never listened")
	}
	p := dialingPublisher(t, h.m.BoundAddr(), "kv@127.0.0.1:8100@m")
	p.shape = ShapeArray
	h.warmUp(t, p, "v")

	prompt := seqTokens(1<<31, 64)
	eh := engineHashes(11, 4)
	h.waitApplied(t, "v", p.send(&EventBatch{TS: 1795969854.43, HasDPRank: true, Events: []Event{
		stored(eh, 0, prompt, 16, MediumGPU),
	}}))
	if got := lookup(t, h.x, "m", prompt); got["v"] != 64 {
		t.Fatalf("re-keyed lookup: %v", got)
	}
	h.waitApplied(t, "v", p.send(&EventBatch{Events: []Event{{Kind: EventBlockRemoved, BlockHashes: eh[2:3]}}}))
	if got := lookup(t, h.x, "m", prompt); got["v"] != 32 {
		t.Fatalf("after the translated remove: %v", got)
	}
	stranger := dialingPublisher(t, h.m.BoundAddr(), "kv@10.1.2.3:9999@m")
	deadline := time.After(waitFor)
	for h.x.Metrics().Ingest().UnknownEngine == 0 {
		stranger.send(&EventBatch{Events: []Event{}})
		// Each round trip through the bound SUB is answered by an applied batch of "v".
		h.waitApplied(t, "v", p.send(&EventBatch{Events: []Event{}}))
		select {
		case <-deadline:
			t.Fatal("a batch of an unknown engine was never counted")
		default:
		}
	}
}

func TestDiscoverySubscribes(t *testing.T) {
	p := newTestPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
	_, pport, _ := net.SplitHostPort(p.pub.Addr().String())
	_, rport, _ := net.SplitHostPort(p.router.Addr().String())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/server_info" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, `{"model_path":"m","page_size":16,"dp_size":1,"kv_events":{"publisher":"zmq",`+
			`"endpoint_host":"*","endpoint_port_base":%s,"topic":"","block_size":16,"dp_size":1,`+
			`"replay_endpoint_port_base":"%s"}}`, pport, rport)
	}))
	defer srv.Close()
	h := startManager(t, "", WorkerSpec{ID: "a", URL: srv.URL, Model: "m"})
	h.warmUp(t, p, "a")
	prompt := seqTokens(0, 48)
	h.waitApplied(t, "a", p.send(storedBatch(prompt)))
	if got := lookup(t, h.x, "m", prompt); got["a"] != 48 {
		t.Fatalf("got %v", got)
	}
	st := h.m.Status()
	if st[0].State != "discovered" || !strings.HasSuffix(st[0].Publishers[0].Replay, ":"+rport) {
		t.Fatalf("status %+v", st)
	}
}

func TestParseServerInfo(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		url     string
		want    []Publisher
		bs, dp  int
		wantErr error
	}{
		{name: "wildcard host, two ranks, replay",
			body: `{"page_size":16,"dp_size":2,"kv_events":{"publisher":"zmq","endpoint_host":"*","endpoint_port_base":5557,"topic":"kv","block_size":32,"dp_size":2,"replay_endpoint_port_base":6000}}`,
			url:  "http://10.0.0.7:30000",
			want: []Publisher{{0, "tcp://10.0.0.7:5557", "tcp://10.0.0.7:6000", "kv"}, {1, "tcp://10.0.0.7:5558", "tcp://10.0.0.7:6001", "kv"}},
			bs:   32, dp: 2},
		{name: "numbers as strings, explicit host",
			body: `{"page_size":"64","kv_events":{"endpoint_host":"engine-1","endpoint_port_base":"7000"}}`,
			url:  "http://127.0.0.1:1",
			want: []Publisher{{0, "tcp://engine-1:7000", "", ""}}, bs: 64, dp: 1},
		{name: "endpoint form and replay endpoint",
			body: `{"kv_events":{"endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5560","block_size":16}}`,
			url:  "http://[::1]:8000",
			want: []Publisher{{0, "tcp://[::1]:5557", "tcp://[::1]:5560", ""}}, bs: 16, dp: 1},
		{name: "no kv_events", body: `{"page_size":16}`, wantErr: ErrNoKVEvents},
		{name: "null kv_events", body: `{"kv_events":null}`, wantErr: ErrNoKVEvents},
		{name: "another publisher", body: `{"kv_events":{"publisher":"null"}}`, wantErr: ErrNoKVEvents},
		{name: "no port", body: `{"kv_events":{"publisher":"zmq"}}`, wantErr: ErrNoKVEvents},
		{name: "not JSON", body: `{`, wantErr: ErrMalformed},
		{name: "negative port", body: `{"kv_events":{"endpoint_port_base":-5}}`, wantErr: ErrMalformed},
		{name: "ports past the range", body: `{"dp_size":8,"kv_events":{"endpoint_port_base":65530}}`, wantErr: ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := ParseServerInfo([]byte(tt.body), tt.url)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(d.Publishers) != fmt.Sprint(tt.want) || d.BlockSize != tt.bs || d.DPSize != tt.dp {
				t.Fatalf("got %+v, want %v bs %d dp %d", d, tt.want, tt.bs, tt.dp)
			}
		})
	}
}

func TestPublishersFor(t *testing.T) {
	got, err := PublishersFor("tcp://*:5557", "tcp://0.0.0.0:6000", "t", "http://h1:80", 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []Publisher{{0, "tcp://h1:5557", "tcp://h1:6000", "t"}, {1, "tcp://h1:5558", "tcp://h1:6001", "t"}, {2, "tcp://h1:5559", "tcp://h1:6002", "t"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v", got)
	}
	for _, bad := range []string{"udp://h:1", "tcp://h", "tcp://h:0", "tcp://h:65535"} {
		if _, err := PublishersFor(bad, "", "", "", 2); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func FuzzParseServerInfo(f *testing.F) {
	f.Add([]byte(`{"page_size":16,"dp_size":2,"kv_events":{"publisher":"zmq","endpoint_host":"*","endpoint_port_base":5557,"block_size":16,"dp_size":2,"replay_endpoint_port_base":6000}}`), "http://127.0.0.1:30000")
	f.Add([]byte(`{"kv_events":{"endpoint":"tcp://*:5557","replay_endpoint":null}}`), "http://localhost")
	f.Add([]byte(`{"kv_events":"zmq"}`), "")
	f.Fuzz(func(t *testing.T, body []byte, url string) {
		d, err := ParseServerInfo(body, url)
		if err != nil {
			return
		}
		if len(d.Publishers) != d.DPSize || d.DPSize < 1 || d.DPSize > maxDPSize {
			t.Fatalf("%d publishers for dp %d", len(d.Publishers), d.DPSize)
		}
		for _, p := range d.Publishers {
			if _, _, err := SplitEndpoint(p.Endpoint); err != nil {
				t.Fatalf("bad endpoint %q: %v", p.Endpoint, err)
			}
		}
	})
}
