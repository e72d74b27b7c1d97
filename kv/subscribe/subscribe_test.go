package subscribe

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"switchyard/kv/events"
	"switchyard/kv/hashing"
	"switchyard/kv/index"
	"switchyard/kv/internal/kvtest"
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
	shape  events.Shape
	enc    *events.Encoder
	done   chan struct{}

	mu   sync.Mutex
	seq  uint64
	ring map[uint64][]byte
	// replayTopic answers replays in current vLLM's layout: (topic, seq, payload) per
	// batch and ("", seq −1, "") at the end, after the delimiter.
	replayTopic bool
}

// newTestPublisher binds a PUB on pubEP (and a replay ROUTER on replayEP unless it is "").
func newTestPublisher(t *testing.T, pubEP, replayEP string) *testPublisher {
	t.Helper()
	p := &testPublisher{t: t, enc: events.NewEncoder(), ring: map[uint64][]byte{}, done: make(chan struct{})}
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
	p := &testPublisher{t: t, enc: events.NewEncoder(), ring: map[uint64][]byte{}, done: make(chan struct{}), topic: topic}
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
func (p *testPublisher) encode(b *events.EventBatch) (uint64, []byte) {
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
func (p *testPublisher) send(b *events.EventBatch) uint64 {
	p.t.Helper()
	seq, msg := p.encode(b)
	p.sendFrames([]byte(p.topic), binary.BigEndian.AppendUint64(nil, seq), msg)
	return seq
}

func (p *testPublisher) sendFrames(frames ...[]byte) {
	p.t.Helper()
	if err := p.pub.Send(zmq4.NewMsgFrom(frames...)); err != nil {
		p.t.Fatalf("cannot publish: %v", err)
	}
}

// lose takes a sequence number for b without sending it (a dropped message).
func (p *testPublisher) lose(b *events.EventBatch) uint64 {
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
			if ok && p.replayTopic {
				reply([]byte(p.topic), binary.BigEndian.AppendUint64(nil, s), payload)
			} else if ok {
				reply(binary.BigEndian.AppendUint64(nil, s), payload)
			}
		}
		if p.replayTopic {
			reply([]byte{}, binary.BigEndian.AppendUint64(nil, endOfReplay), []byte{})
			continue
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
	x       *index.Index
	m       *Manager
	applied chan applied
}

func startManager(t *testing.T, bind string, specs ...WorkerSpec) *harness {
	t.Helper()
	return startManagerWith(t, ManagerConfig{BindEndpoint: bind}, specs...)
}

// startManagerWith starts a Manager configured by cfg plus the harness's index, short
// backoffs and OnApplied hook.
func startManagerWith(t *testing.T, cfg ManagerConfig, specs ...WorkerSpec) *harness {
	t.Helper()
	h := &harness{x: kvtest.NewIndex(t, 4, 1<<20), applied: make(chan applied, 4096)}
	cfg.Index, cfg.MinBackoff, cfg.MaxBackoff, cfg.ReplayTimeout = h.x, 10*time.Millisecond, 50*time.Millisecond, 5*time.Second
	cfg.OnApplied = func(w string, r int, seq uint64) {
		select {
		case h.applied <- applied{w, r, seq}:
		default:
		}
	}
	m, err := NewManager(cfg)
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
		seq := p.send(&events.EventBatch{Events: []events.Event{}})
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
func storedBatch(tokens []uint32) *events.EventBatch {
	return &events.EventBatch{Events: []events.Event{stored(hashing.AppendBlockHashes(nil, tokens, 16), 0, tokens, 16, events.MediumGPU)}}
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
	for _, layout := range []string{"seq-payload", "vllm-topic-seq-payload"} {
		t.Run(layout, func(t *testing.T) { testRepairByReplay(t, layout != "seq-payload") })
	}
}

// testRepairByReplay: a gap is repaired from the replay socket, whose replies carry a
// topic frame (current vLLM) or not (older publishers).
func testRepairByReplay(t *testing.T, topicFrame bool) {
	p := newTestPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
	p.mu.Lock()
	p.replayTopic, p.topic = topicFrame, "kv@127.0.0.1:8000@m"
	p.mu.Unlock()
	h := startManager(t, "", WorkerSpec{ID: "a", Model: "m",
		Publishers: []Publisher{{Rank: 0, Endpoint: p.pubEndpoint(), Replay: p.replayEndpoint()}}})
	h.warmUp(t, p, "a")

	first := kvtest.SeqTokens(0, 160)
	h.waitApplied(t, "a", p.send(storedBatch(first)))
	if got := kvtest.Lookup(t, h.x, "m", first); got["a"] != 160 {
		t.Fatalf("after the first batch: %v", got)
	}
	lost := kvtest.SeqTokens(5000, 320)
	p.lose(storedBatch(lost))
	next := kvtest.SeqTokens(9000, 96)
	h.waitApplied(t, "a", p.send(storedBatch(next)))
	got := map[string]int64{}
	for _, prompt := range [][]uint32{first, lost, next} {
		for w, n := range kvtest.Lookup(t, h.x, "m", prompt) {
			got[w] += n
		}
	}
	if got["a"] != 160+320+96 {
		t.Fatalf("after the repaired gap: %v", got)
	}
	// One more batch: the replay's bookkeeping is done once it is applied.
	h.waitApplied(t, "a", p.send(&events.EventBatch{Events: []events.Event{}}))
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
	before := kvtest.SeqTokens(0, 160)
	h.waitApplied(t, "a", p.send(storedBatch(before)))
	p.lose(storedBatch(kvtest.SeqTokens(7000, 16)))
	after := kvtest.SeqTokens(9000, 96)
	h.waitApplied(t, "a", p.send(storedBatch(after)))
	if got := kvtest.Lookup(t, h.x, "m", before); got["a"] != 0 {
		t.Fatalf("entries from before the gap survived: %v", got)
	}
	if got := kvtest.Lookup(t, h.x, "m", after); got["a"] != 96 {
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
	old := kvtest.SeqTokens(0, 160)
	h.waitApplied(t, "a", p.send(storedBatch(old)))
	p.close()
	p2 := newTestPublisher(t, ep, rep)
	p2.mu.Lock()
	p2.seq = p.seq // the new run's next batch carries the old run's next sequence number
	p2.mu.Unlock()
	h.warmUp(t, p2, "a")
	if got := kvtest.Lookup(t, h.x, "m", old); got["a"] != 0 {
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
	old := kvtest.SeqTokens(0, 320)
	for range 3 {
		h.waitApplied(t, "a", p.send(&events.EventBatch{Events: []events.Event{}}))
	}
	h.waitApplied(t, "a", p.send(storedBatch(old)))
	if got := kvtest.Lookup(t, h.x, "m", old); got["a"] != 320 {
		t.Fatalf("before the restart: %v", got)
	}
	// The engine restarts: its publisher goes away and comes back counting from 0.
	p.close()
	p2 := newTestPublisher(t, ep, rep)
	h.warmUp(t, p2, "a")
	if got := kvtest.Lookup(t, h.x, "m", old); got["a"] != 0 {
		t.Fatalf("stale ownership after the restart: %v", got)
	}
	fresh := kvtest.SeqTokens(100, 64)
	h.waitApplied(t, "a", p2.send(storedBatch(fresh)))
	if got := kvtest.Lookup(t, h.x, "m", fresh); got["a"] != 64 {
		t.Fatalf("after the restart: %v", got)
	}
	if c := h.x.Metrics().Ingest(); c.ClearsReconnect != 1 {
		t.Fatalf("counts %+v", c)
	}
	t.Run("AllBlocksCleared clears", func(t *testing.T) {
		h.waitApplied(t, "a", p2.send(&events.EventBatch{Events: []events.Event{{Kind: events.EventAllBlocksCleared}}}))
		if got := kvtest.Lookup(t, h.x, "m", fresh); got["a"] != 0 {
			t.Fatalf("after AllBlocksCleared: %v", got)
		}
	})
	t.Run("removal stops and prunes", func(t *testing.T) {
		h.waitApplied(t, "a", p2.send(storedBatch(fresh)))
		if !h.m.RemoveWorker("a") {
			t.Fatal("RemoveWorker")
		}
		if got := kvtest.Lookup(t, h.x, "m", fresh); len(got) != 0 || h.x.Stats().Blocks != 0 {
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
	blocks := kvtest.SeqTokens(0, 128)
	h.waitApplied(t, "a", p.send(storedBatch(blocks)))
	p.close()
	// The subscriber notices the lost connection and clears; wait for the reconnect.
	p2 := newTestPublisher(t, ep, "")
	h.warmUp(t, p2, "a")
	if got := kvtest.Lookup(t, h.x, "m", blocks); got["a"] != 0 {
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
	p.shape = events.ShapeArray
	h.warmUp(t, p, "v")

	prompt := kvtest.SeqTokens(1<<31, 64)
	eh := engineHashes(11, 4)
	h.waitApplied(t, "v", p.send(&events.EventBatch{TS: 1795969854.43, HasDPRank: true, Events: []events.Event{
		stored(eh, 0, prompt, 16, events.MediumGPU),
	}}))
	if got := kvtest.Lookup(t, h.x, "m", prompt); got["v"] != 64 {
		t.Fatalf("re-keyed lookup: %v", got)
	}
	h.waitApplied(t, "v", p.send(&events.EventBatch{Events: []events.Event{{Kind: events.EventBlockRemoved, BlockHashes: eh[2:3]}}}))
	if got := kvtest.Lookup(t, h.x, "m", prompt); got["v"] != 32 {
		t.Fatalf("after the translated remove: %v", got)
	}
	stranger := dialingPublisher(t, h.m.BoundAddr(), "kv@10.1.2.3:9999@m")
	deadline := time.After(waitFor)
	for h.x.Metrics().Ingest().UnknownEngine == 0 {
		stranger.send(&events.EventBatch{Events: []events.Event{}})
		// Each round trip through the bound SUB is answered by an applied batch of "v".
		h.waitApplied(t, "v", p.send(&events.EventBatch{Events: []events.Event{}}))
		select {
		case <-deadline:
			t.Fatal("a batch of an unknown engine was never counted")
		default:
		}
	}
}

// fakeDiscoverer answers every worker with the same publishers, once it has failed fails times.
type fakeDiscoverer struct {
	pubs  []Publisher
	fails atomic.Int32
	asked atomic.Int32
}

func (f *fakeDiscoverer) DiscoverKV(_ context.Context, workerURL string) (Discovery, error) {
	f.asked.Add(1)
	if f.fails.Add(-1) >= 0 {
		return Discovery{}, fmt.Errorf("engine %s not up yet", workerURL)
	}
	return Discovery{Publishers: f.pubs, BlockSize: 16, DPSize: len(f.pubs)}, nil
}

func TestDiscoverySubscribes(t *testing.T) {
	p := newTestPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
	_, rport, _ := net.SplitHostPort(p.router.Addr().String())
	d := &fakeDiscoverer{pubs: []Publisher{{Rank: 0, Endpoint: "tcp://" + p.pub.Addr().String(), Replay: "tcp://" + p.router.Addr().String()}}}
	d.fails.Store(2) // transient failures are retried with backoff
	h := startManagerWith(t, ManagerConfig{Discover: d}, WorkerSpec{ID: "a", URL: "http://127.0.0.1:1", Model: "m"})
	h.warmUp(t, p, "a")
	prompt := kvtest.SeqTokens(0, 48)
	h.waitApplied(t, "a", p.send(storedBatch(prompt)))
	if got := kvtest.Lookup(t, h.x, "m", prompt); got["a"] != 48 {
		t.Fatalf("got %v", got)
	}
	st := h.m.Status()
	if st[0].State != "discovered" || !strings.HasSuffix(st[0].Publishers[0].Replay, ":"+rport) {
		t.Fatalf("status %+v", st)
	}
	if n := d.asked.Load(); n != 3 {
		t.Fatalf("discoverer asked %d times, want 3 (two failures, one success)", n)
	}
}

func TestNoDiscovererAwaitsPublishers(t *testing.T) {
	pa := newTestPublisher(t, "tcp://127.0.0.1:0", "")
	h := startManager(t, "", WorkerSpec{ID: "a", Model: "m", Publishers: []Publisher{{Endpoint: "tcp://" + pa.pub.Addr().String()}}})
	h.warmUp(t, pa, "a") // the manager runs: workers added now start at once
	if err := h.m.AddWorker(WorkerSpec{ID: "b", URL: "http://127.0.0.1:1", Model: "m"}); err != nil {
		t.Fatal(err)
	}
	h.m.mu.Lock()
	done := h.m.workers["b"].done
	h.m.mu.Unlock()
	select {
	case <-done: // nothing to dial: the worker's goroutine is over
	case <-time.After(waitFor):
		t.Fatal("worker without publishers kept running")
	}
	if st := h.m.Status(); len(st) != 2 || st[1].State != "awaiting discovery" {
		t.Fatalf("status %+v", st)
	}
	pb := newTestPublisher(t, "tcp://127.0.0.1:0", "")
	// The worker lifecycle names the publishers once it has introspected the engine.
	if err := h.m.AddWorker(WorkerSpec{ID: "b", URL: "http://127.0.0.1:1", Model: "m",
		Publishers: []Publisher{{Endpoint: "tcp://" + pb.pub.Addr().String()}}}); err != nil {
		t.Fatal(err)
	}
	h.warmUp(t, pb, "b")
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

// TestWithReplay: publishers named without a replay socket get the configured one, rank r
// on port+r; an advertised one is kept.
func TestWithReplay(t *testing.T) {
	pubs := []Publisher{{Rank: 0, Endpoint: "tcp://10.0.0.1:5557"}, {Rank: 1, Endpoint: "tcp://10.0.0.1:5558", Replay: "tcp://10.0.0.1:7000"}}
	got := withReplay(pubs, "tcp://*:6000", "http://10.0.0.1:8000")
	if got[0].Replay != "tcp://10.0.0.1:6000" || got[1].Replay != "tcp://10.0.0.1:7000" {
		t.Fatalf("got %+v", got)
	}
	if pubs[0].Replay != "" {
		t.Fatal("the caller's publishers were changed")
	}
	if got := withReplay(pubs, "", ""); &got[0] != &pubs[0] {
		t.Fatal("no configured replay: the publishers should come back as they are")
	}
}

// TestReAddingAnUnchangedWorkerKeepsItsSubscription: the worker lifecycle hands a worker's
// subscription to the manager again after it introspects the engine; when nothing changed,
// the running subscription stays (no reconnect, its counters and sequence kept), so no event
// published meanwhile is missed.
func TestReAddingAnUnchangedWorkerKeepsItsSubscription(t *testing.T) {
	p := newTestPublisher(t, "tcp://127.0.0.1:0", "")
	spec := WorkerSpec{ID: "a", Model: "m", Publishers: []Publisher{{Rank: 0, Endpoint: p.pubEndpoint()}}}
	h := startManager(t, "", spec)
	h.warmUp(t, p, "a")
	h.waitApplied(t, "a", p.send(storedBatch(kvtest.SeqTokens(0, 32))))
	before := h.m.Status()[0].Publishers[0]

	again := spec
	again.Publishers = slices.Clone(spec.Publishers)
	if err := h.m.AddWorker(again); err != nil {
		t.Fatal(err)
	}
	st := h.m.Status()[0].Publishers
	if len(st) != 1 || !st[0].Connected || st[0].Received < before.Received || st[0].LastSeq != before.LastSeq {
		t.Fatalf("subscription renewed: before %+v, after %+v", before, st)
	}
	// A changed spec still replaces the subscription.
	changed := again
	changed.Topic = "other"
	if err := h.m.AddWorker(changed); err != nil {
		t.Fatal(err)
	}
	if st := h.m.Status()[0].Publishers; len(st) == 1 && st[0].Received != 0 {
		t.Fatalf("a changed spec kept the old subscription: %+v", st[0])
	}
}
