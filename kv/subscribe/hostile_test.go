package subscribe

import (
	"context"
	"encoding/binary"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"switchyard/kv/events"
	"switchyard/kv/hashing"
	"switchyard/kv/internal/kvtest"
	"switchyard/load"
	"switchyard/load/zmtp/zmtptest"
)

// Tests against peers that do not behave: hostile ZMTP peers on every socket the router
// reads (bound SUB, engine PUB, replay ROUTER), peer churn on the bound SUB, DP ranks and
// late joiners of vLLM-style engines, and malformed-message logging.

// hugeFrame claims 2^40 bytes; tooManyFrames is one frame past the default bound.
var (
	hugeFrame     = zmtptest.Claim(1 << 40)
	tooManyFrames = zmtptest.Frames(65)
)

// attackBound dials the bound SUB at endpoint as a PUB, sends attack and checks the router
// hangs up.
func attackBound(t *testing.T, endpoint string, attack []byte) {
	t.Helper()
	zmtptest.Attack(t, strings.TrimPrefix(endpoint, "tcp://"), "PUB", attack)
}

func waitBound(t *testing.T, h *harness) {
	t.Helper()
	select {
	case <-h.m.BoundReady():
	case <-time.After(waitFor):
		t.Fatal("bound SUB never listened")
	}
}

// TestHostilePeerOnBoundSub: peers of the bound SUB (kv.bind_endpoint) that claim a 2^40
// byte frame or send 65 frames are hung up on and counted; an honest engine on the same
// socket goes on being applied.
func TestHostilePeerOnBoundSub(t *testing.T) {
	h := startManager(t, "tcp://127.0.0.1:0", WorkerSpec{ID: "v", URL: "http://127.0.0.1:8100", Model: "m", NoDiscovery: true})
	waitBound(t, h)
	attackBound(t, h.m.BoundAddr(), hugeFrame)
	attackBound(t, h.m.BoundAddr(), tooManyFrames)
	p := dialingPublisher(t, h.m.BoundAddr(), "kv@127.0.0.1:8100@m")
	h.warmUp(t, p, "v")
	prompt := kvtest.SeqTokens(0, 64)
	h.waitApplied(t, "v", p.send(storedBatch(prompt)))
	if got := kvtest.Lookup(t, h.x, "m", prompt); got["v"] != 64 {
		t.Fatalf("after the attacks: %v", got)
	}
	if n := h.x.Metrics().PeerDrops.TooLarge(); n != 2 {
		t.Fatalf("too_large drops %d, want 2", n)
	}
}

// TestHostileEnginePub: an engine PUB the router subscribes to that claims a 2^40-byte
// frame is hung up on, counted, and redialled.
func TestHostileEnginePub(t *testing.T) {
	for _, attack := range []struct {
		name  string
		bytes []byte
	}{{"2^40-byte frame", hugeFrame}, {"65 frames", tooManyFrames}} {
		t.Run(attack.name, func(t *testing.T) {
			ep, ends := zmtptest.Server(t, "PUB", attack.bytes)
			h := startManager(t, "", WorkerSpec{ID: "a", Model: "m", KVEvents: ep})
			zmtptest.HungUp(t, ends, 2) // the second: the subscription lives on and redials
			if n := h.x.Metrics().PeerDrops.TooLarge(); n < 2 {
				t.Fatalf("too_large drops %d, want at least 2", n)
			}
		})
	}
}

// TestHostileReplay: a replay ROUTER that answers with a 2^40-byte frame is hung up on and
// counted; the gap is then handled as one without replay (the rank is cleared) and live
// batches go on.
func TestHostileReplay(t *testing.T) {
	rep, ends := zmtptest.Server(t, "ROUTER", hugeFrame)
	p := newTestPublisher(t, "tcp://127.0.0.1:0", "")
	h := startManager(t, "", WorkerSpec{ID: "a", Model: "m", Publishers: []Publisher{{Endpoint: p.pubEndpoint(), Replay: rep}}})
	h.warmUp(t, p, "a")
	before := kvtest.SeqTokens(0, 64)
	h.waitApplied(t, "a", p.send(storedBatch(before)))
	p.lose(storedBatch(kvtest.SeqTokens(500, 16)))
	after := kvtest.SeqTokens(900, 32)
	h.waitApplied(t, "a", p.send(storedBatch(after)))
	zmtptest.HungUp(t, ends, 1)
	if got := kvtest.Lookup(t, h.x, "m", before); got["a"] != 0 {
		t.Fatalf("entries from before an unrepaired gap: %v", got)
	}
	if got := kvtest.Lookup(t, h.x, "m", after); got["a"] != 32 {
		t.Fatalf("entries after the gap: %v", got)
	}
	c := h.x.Metrics().Ingest()
	if c.ReplayFailures != 1 || h.x.Metrics().PeerDrops.TooLarge() != 1 {
		t.Fatalf("replay failures %d, too_large drops %d; want 1 and 1", c.ReplayFailures, h.x.Metrics().PeerDrops.TooLarge())
	}
}

// TestBoundSubKeepsRekeyMapsThroughPeerChurn: many peers connecting and leaving the bound
// SUB (which once made it reopen and forget the engines' re-key maps) do not lose a vLLM
// engine's later evictions: the router reports what the engine holds.
func TestBoundSubKeepsRekeyMapsThroughPeerChurn(t *testing.T) {
	h := startManager(t, "tcp://127.0.0.1:0", WorkerSpec{ID: "v", URL: "http://127.0.0.1:8100", Model: "m", NoDiscovery: true})
	waitBound(t, h)
	p := dialingPublisher(t, h.m.BoundAddr(), "kv@127.0.0.1:8100@m")
	h.warmUp(t, p, "v")
	prompt := kvtest.SeqTokens(1<<31, 512)
	eh := engineHashes(21, 32)
	h.waitApplied(t, "v", p.send(&events.EventBatch{Events: []events.Event{stored(eh, 0, prompt, 16, events.MediumGPU)}}))
	if got := kvtest.Lookup(t, h.x, "m", prompt); got["v"] != 512 {
		t.Fatalf("before the churn: %v", got)
	}
	hp := strings.TrimPrefix(h.m.BoundAddr(), "tcp://")
	for i := range 100 {
		c, err := net.DialTimeout("tcp", hp, waitFor)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			_, _ = c.Write(zmtptest.Hello("PUB")) // a peer that greets, then leaves
		}
		_ = c.Close()
	}
	h.waitApplied(t, "v", p.send(&events.EventBatch{Events: []events.Event{{Kind: events.EventBlockRemoved, BlockHashes: eh[19:20]}}}))
	if got := kvtest.Lookup(t, h.x, "m", prompt); got["v"] != 304 {
		t.Fatalf("after the churn and an eviction of block 19: %v, want 304", got)
	}
}

// TestBoundSubAttributesDPRanks: vLLM's rank r publishes with topic kv@ip:(P+r)@model and
// data_parallel_rank r: with the worker's dp_size declared, the port names the rank; a rank
// only the batch names is learned.
func TestBoundSubAttributesDPRanks(t *testing.T) {
	h := startManager(t, "tcp://127.0.0.1:0",
		WorkerSpec{ID: "v", URL: "http://127.0.0.1:8100", Model: "m", DPSize: 2, NoDiscovery: true, HashScheme: HashSchemeRekey},
		WorkerSpec{ID: "w", URL: "http://127.0.0.1:8200", Model: "m", NoDiscovery: true, HashScheme: HashSchemeRekey})
	waitBound(t, h)
	for _, tc := range []struct {
		worker, topic string
		rank          int
	}{
		{"v", "kv@127.0.0.1:8101@m", 1}, // rank 1 by port, the batch says so too
		{"w", "kv@127.0.0.1:8200@m", 1}, // rank 1 by the batch alone: learned
	} {
		p := dialingPublisher(t, h.m.BoundAddr(), tc.topic)
		h.warmUp(t, p, tc.worker)
		prompt := kvtest.SeqTokens(1000*(tc.rank+1)+len(tc.worker), 48)
		seq := p.send(&events.EventBatch{HasDPRank: true, DPRank: tc.rank, Events: []events.Event{stored(engineHashes(int64(len(tc.topic)), 3), 0, prompt, 16, events.MediumGPU)}})
		deadline := time.After(waitFor)
	wait:
		for {
			select {
			case a := <-h.applied:
				if a.worker == tc.worker && a.seq == seq {
					if a.rank != tc.rank {
						t.Fatalf("%s: applied to rank %d, want %d", tc.topic, a.rank, tc.rank)
					}
					break wait
				}
			case <-deadline:
				t.Fatalf("%s: batch not applied", tc.topic)
			}
		}
		if got := kvtest.Lookup(t, h.x, "m", prompt); got[tc.worker] != 48 {
			t.Fatalf("%s: %v", tc.topic, got)
		}
		if _, ok := h.x.Owners().Lookup(tc.worker, tc.rank); !ok {
			t.Fatalf("%s: rank %d of %s not registered", tc.topic, tc.rank, tc.worker)
		}
	}
	if c := h.x.Metrics().Ingest(); c.UnknownEngine != 0 || c.Malformed != 0 {
		t.Fatalf("counts %+v", c)
	}
}

// TestLateJoinerNotIndexedUnderEngineHashes: an engine whose first events have a parent
// (the router joined late) is not indexed under its own hashes before they are proven to
// be the router's; once a block without a parent shows vLLM-style hashes, what follows is
// re-keyed.
func TestLateJoinerNotIndexedUnderEngineHashes(t *testing.T) {
	x := kvtest.NewIndex(t, 2, 1<<16)
	kvtest.Register(t, x, "v", 1, 16)
	a := newTestApplier(t, x, "v", false)
	prompt := kvtest.SeqTokens(1<<31, 64)
	eh := engineHashes(31, 4)
	applyEvents(t, a, 0, stored(eh[2:], eh[1], prompt[32:], 16, events.MediumGPU)) // parent never seen
	if n := x.Stats().Blocks; n != 0 {
		t.Fatalf("%d blocks indexed under unproven engine hashes", n)
	}
	fresh := kvtest.SeqTokens(7<<28, 32)
	applyEvents(t, a, 0, stored(engineHashes(32, 2), 0, fresh, 16, events.MediumGPU))
	if got := kvtest.Lookup(t, x, "m", fresh); got["v"] != 32 {
		t.Fatalf("re-keyed after the proof: %v", got)
	}
	if !a.rekey {
		t.Fatal("vLLM-style hashes not detected")
	}
	// A declared SGLang engine is trusted at once, parent or not.
	kvtest.Register(t, x, "s", 1, 16)
	s := newApplier(x, "s", HashSchemeSGLang, slog.New(slog.DiscardHandler), load.LogThrottle{})
	hs := hashing.AppendBlockHashes(nil, prompt, 16)
	applyEvents(t, s, 0, stored(hs[2:], hs[1], prompt[32:], 16, events.MediumGPU))
	if n := x.Stats().Blocks; n != 2+2 {
		t.Fatalf("%d blocks, want the 2 re-keyed and the 2 SGLang ones", n)
	}
}

// TestMalformedKVEventsLoggedOncePerInterval: 1,010 garbage batches on the bound SUB, each
// failing differently, make one warning line; after the interval, the next line counts them.
func TestMalformedKVEventsLoggedOncePerInterval(t *testing.T) {
	h := zmtptest.NewLogCounter("malformed KV-event messages")
	var now sync.Mutex
	at := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { now.Lock(); defer now.Unlock(); return at }
	hs := startManagerWith(t, ManagerConfig{BindEndpoint: "tcp://127.0.0.1:0", Logger: slog.New(h), Now: clock}, WorkerSpec{ID: "v", URL: "http://127.0.0.1:8100", Model: "m", NoDiscovery: true})
	waitBound(t, hs)
	p := dialingPublisher(t, hs.m.BoundAddr(), "kv@127.0.0.1:8100@m")
	hs.warmUp(t, p, "v")
	garbage := func(n int) {
		for i := range n {
			bad := binary.BigEndian.AppendUint16([]byte{0xdc}, uint16(i+3)) // an array of i+3, empty
			p.sendRaw(bad)
		}
		hs.waitApplied(t, "v", p.send(&events.EventBatch{Events: []events.Event{}}))
	}
	garbage(1010)
	if lines := h.Lines(); len(lines) != 1 || lines[0] != 1 {
		t.Fatalf("log lines (their counts) %v, want one of count 1", lines)
	}
	now.Lock()
	at = at.Add(time.Minute)
	now.Unlock()
	garbage(1)
	if lines := h.Lines(); len(lines) != 2 || lines[1] != 1010 {
		t.Fatalf("log lines (their counts) %v, want a second counting 1,010", lines)
	}
}

// sendRaw publishes payload under the next sequence number as it is.
func (p *testPublisher) sendRaw(payload []byte) {
	p.t.Helper()
	p.mu.Lock()
	seq := p.seq
	p.seq++
	p.mu.Unlock()
	p.sendFrames([]byte(p.topic), binary.BigEndian.AppendUint64(nil, seq), payload)
}

// TestBoundSubRepairsGapFromConfiguredReplay: an engine that dials the bound SUB and whose
// worker declares a replay endpoint (kv_replay; vLLM has no /server_info to advertise it)
// has a sequence gap repaired from it, in the current vLLM reply layout, not cleared.
func TestBoundSubRepairsGapFromConfiguredReplay(t *testing.T) {
	topic := "kv@127.0.0.1:8100@m"
	// The engine's replay ROUTER (zmq4), answering with a topic frame.
	rp := newTestPublisher(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
	rp.mu.Lock()
	rp.replayTopic, rp.topic = true, topic
	rp.mu.Unlock()
	h := startManager(t, "tcp://127.0.0.1:0", WorkerSpec{ID: "v", URL: "http://127.0.0.1:8100", Model: "m", NoDiscovery: true,
		HashScheme: HashSchemeRekey, Replay: rp.replayEndpoint()})
	waitBound(t, h)
	// The engine's PUB dials the bound SUB; its batches are numbered and kept by rp, whose
	// replay ROUTER serves them.
	p := dialingPublisher(t, h.m.BoundAddr(), topic)
	send := func(b *events.EventBatch) uint64 {
		seq, msg := rp.encode(b)
		p.sendFrames([]byte(topic), binary.BigEndian.AppendUint64(nil, seq), msg)
		return seq
	}
	deadline := time.After(waitFor)
	for warm := false; !warm; {
		seq := send(&events.EventBatch{Events: []events.Event{}})
		select {
		case a := <-h.applied:
			warm = a.worker == "v" && a.seq == seq
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatal("the bound SUB never applied a batch")
		}
	}
	prompt := kvtest.SeqTokens(1<<31, 64)
	rp.lose(&events.EventBatch{Events: []events.Event{stored(engineHashes(41, 4), 0, prompt, 16, events.MediumGPU)}})
	h.waitApplied(t, "v", send(&events.EventBatch{Events: []events.Event{}}))
	if got := kvtest.Lookup(t, h.x, "m", prompt); got["v"] != 64 {
		t.Fatalf("the lost batch was not replayed: %v", got)
	}
	// The replay is counted once its end marker is read, after its batches were applied:
	// one more live batch is applied after that.
	h.waitApplied(t, "v", send(&events.EventBatch{Events: []events.Event{}}))
	if c := h.x.Metrics().Ingest(); c.Gaps != 1 || c.Replays != 1 || c.ClearsGap != 0 {
		t.Fatalf("counts %+v", c)
	}
}

// TestBoundSubRanksBounded: batches on the bound SUB that name DP ranks past maxDPRanks are
// dropped as malformed without leaving state behind: a peer sending one rank after another
// used to add a sequence stream per rank (up to 2^31 of them), and gaps on them asked the
// replay socket at port+rank.
func TestBoundSubRanksBounded(t *testing.T) {
	h := startManager(t, "", WorkerSpec{ID: "v", URL: "http://127.0.0.1:8100", Model: "m", NoDiscovery: true,
		Replay: "tcp://127.0.0.1:1"})
	b := &boundState{m: h.m, streams: map[streamKey]*boundStream{}, appliers: map[string]*boundWorker{}}
	topic := []byte("kv@127.0.0.1:8100@m")
	before := h.x.Metrics().BatchesMalformed.Get()
	const sent = 1000
	for i := range sent {
		payload, err := events.AppendEventBatch(nil, &events.EventBatch{HasDPRank: true, DPRank: maxDPRanks + i,
			Events: []events.Event{{Kind: events.EventAllBlocksCleared}}}, events.ShapeArray)
		if err != nil {
			t.Fatal(err)
		}
		b.handle(context.Background(), [][]byte{topic, binary.BigEndian.AppendUint64(nil, 7), payload})
	}
	if n := len(b.streams); n != 0 {
		t.Errorf("%d sequence streams kept for ranks past %d", n, maxDPRanks)
	}
	if n := h.x.Metrics().BatchesMalformed.Get() - before; n != sent {
		t.Errorf("%d batches counted malformed, want %d", n, sent)
	}
}
