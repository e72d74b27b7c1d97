package mockengine

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"sync"

	"switchyard/kv/events"
)

// eventPublisher publishes one rank's KV-event batches: (topic, 8-byte big-endian seq,
// msgpack batch) on a PUB socket, counting seq up from 0, and keeps the latest batches for
// the replay ROUTER socket when replay is on.
type eventPublisher struct {
	sock    *zmtpPub    // nil when KV events are disabled
	replay  *zmtpRouter // nil unless replay is on
	topic   []byte
	shape   events.Shape
	enc     *events.Encoder
	stopped func() bool
	log     *slog.Logger
	// vllm publishes as a current vLLM publisher (KVFormatVLLM).
	vllm bool
	evs  []events.Event // scratch of vllmBatch

	mu   sync.Mutex
	seq  uint64
	ring []replayEntry // circular, capacity = buffer steps; nil without replay
	head int           // index of the oldest entry
	n    int
}

type replayEntry struct {
	seq     uint64
	payload []byte
}

// publish encodes and sends one batch. Callers serialize publish calls (the rank's mutex),
// so batches leave in the order the cache changed.
func (p *eventPublisher) publish(b *events.EventBatch) {
	if p.sock == nil && p.ring == nil {
		return // KV events are off
	}
	if p.vllm {
		b = p.vllmBatch(b)
	}
	payload, err := p.enc.Encode(b, p.shape)
	if err != nil {
		p.log.Error("cannot encode KV events", slog.Any("err", err))
		return
	}
	msg := bytes.Clone(payload)
	p.mu.Lock()
	seq := p.seq
	p.seq++
	if p.ring != nil {
		i := (p.head + p.n) % len(p.ring)
		if p.n == len(p.ring) {
			p.head = (p.head + 1) % len(p.ring)
		} else {
			p.n++
		}
		p.ring[i] = replayEntry{seq: seq, payload: msg}
	}
	p.mu.Unlock()
	if p.sock != nil && !p.stopped() {
		p.sock.Send(p.topic, seqFrame(seq), msg)
	}
}

// dropPeers disconnects every subscriber and replay peer, as a restarted engine's sockets
// do; both sockets keep listening.
func (p *eventPublisher) dropPeers() {
	if p.sock != nil {
		p.sock.DropPeers()
	}
	if p.replay != nil {
		p.replay.DropPeers()
	}
}

// reset restarts the sequence at 0 and forgets retained batches, as a restarted engine does.
func (p *eventPublisher) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq, p.head, p.n = 0, 0, 0
	clear(p.ring)
}

// serveReplay answers one replay request: an 8-byte big-endian start sequence, optionally
// after an empty delimiter frame (a DEALER or REQ peer). It sends (seq, payload) for every
// retained batch from start on, then (-1, empty) as the end marker, mirroring the
// delimiter when the request had one.
func (p *eventPublisher) serveReplay(peer *routerPeer, frames [][]byte) {
	var prefix [][]byte
	if len(frames) == 2 && len(frames[0]) == 0 {
		prefix, frames = [][]byte{{}}, frames[1:]
	}
	send := func(f ...[]byte) error { return peer.Send(append(append([][]byte(nil), prefix...), f...)...) }
	end := func() { _ = send(seqFrame(^uint64(0)), nil) }
	if p.vllm {
		// Current vLLM: (topic, seq, payload) per batch, ("", -1, "") at the end.
		send = func(f ...[]byte) error {
			return peer.Send(append(append([][]byte(nil), prefix...), append([][]byte{p.topic}, f...)...)...)
		}
		end = func() {
			_ = peer.Send(append(append([][]byte(nil), prefix...), []byte{}, seqFrame(^uint64(0)), []byte{})...)
		}
	}
	if len(frames) != 1 || len(frames[0]) != 8 {
		end()
		return
	}
	start := binary.BigEndian.Uint64(frames[0])
	p.mu.Lock()
	entries := make([]replayEntry, 0, p.n)
	for i := range p.n {
		e := p.ring[(p.head+i)%len(p.ring)]
		if e.seq >= start {
			entries = append(entries, e)
		}
	}
	p.mu.Unlock()
	for _, e := range entries {
		if err := send(seqFrame(e.seq), e.payload); err != nil {
			return
		}
	}
	end()
}

// vllmHash is the block hash a vLLM-style engine publishes for the router-style hash h: a
// bijection (so removes name what stores named) that no router reproduces from token IDs.
func vllmHash(h int64) int64 { return int64(uint64(h)*0x9e3779b97f4a7c15 + 0x632be59bd9b4e019) }

// vllmBatch is b as vLLM publishes it: its own block hashes, 0 as a first block's parent.
func (p *eventPublisher) vllmBatch(b *events.EventBatch) *events.EventBatch {
	p.evs = append(p.evs[:0], b.Events...)
	for i := range p.evs {
		ev := &p.evs[i]
		hs := make([]int64, len(ev.BlockHashes))
		for j, h := range ev.BlockHashes {
			hs[j] = vllmHash(h)
		}
		ev.BlockHashes = hs
		if ev.Kind == events.EventBlockStored {
			if ev.Medium == events.MediumNone {
				ev.Medium = events.MediumGPU
			}
			if ev.HasParent {
				ev.ParentHash = vllmHash(ev.ParentHash)
			} else {
				ev.HasParent, ev.ParentHash = true, 0
			}
		}
	}
	out := *b
	out.Events = p.evs
	return &out
}

func seqFrame(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq)
}
