package subscribe

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"

	"switchyard/kv"
	"switchyard/kv/events"
	"switchyard/load"
	"switchyard/load/zmtp"
)

// rankSub subscribes to one DP rank's bound PUB socket (the SGLang topology): it dials with
// backoff, tracks the sequence, repairs a gap from the replay socket when the engine has one
// and otherwise clears the rank's entries, and applies every batch to the index.
//
// run owns all fields but the atomics, which status readers load.
type rankSub struct {
	m      *Manager
	worker string
	pub    Publisher
	ap     *applier
	seq    seqTracker
	dec    events.Decoder
	batch  events.EventBatch
	log    *slog.Logger

	connected atomic.Bool
	received  atomic.Uint64
	lastSeq   atomic.Uint64
	clears    atomic.Uint64

	lastConnErr string
	badLog      load.LogThrottle
}

func newRankSub(m *Manager, worker string, pub Publisher, scheme string) *rankSub {
	log := m.log.With(slog.String("worker", worker), slog.Int("rank", pub.Rank))
	return &rankSub{m: m, worker: worker, pub: pub, ap: newApplier(m.x, worker, scheme, log, m.throttledLog(log)), log: log, badLog: m.malformedLog(log)}
}

// run subscribes until ctx is done. A lost or refused connection is retried with doubling
// backoff (zmtp.Retry); a panic while handling a message is recovered, logged, and ends the
// session.
func (s *rankSub) run(ctx context.Context) {
	zmtp.Retry(ctx, s.m.backoff(), func(ctx context.Context, n int) (bool, error) {
		if n > 0 {
			s.m.x.Metrics().Reconnects.Inc()
		}
		delivered, err := s.session(ctx)
		if ctx.Err() == nil {
			s.disconnected()
		}
		return delivered, err
	}, func(err error) {
		if msg := err.Error(); msg != s.lastConnErr {
			s.lastConnErr = msg
			s.log.Warn("KV-event subscription failing", slog.String("endpoint", s.pub.Endpoint), slog.Any("error", err))
		}
	})
}

// disconnected handles a lost connection: without a replay socket nothing can prove later
// that no batch was lost (or that the engine did not restart), so the rank's entries go.
func (s *rankSub) disconnected() {
	if s.pub.Replay == "" && s.seq.known {
		s.clear(kv.ClearGap)
		s.seq.reset()
	}
}

// session runs one connection until it fails; delivered reports whether any batch got
// through.
func (s *rankSub) session(ctx context.Context) (delivered bool, err error) {
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("KV-event handling panicked", slog.Any("panic", v))
			err = fmt.Errorf("panic: %v", v)
		}
	}()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c, err := zmtp.Dial(sctx, s.pub.Endpoint, "SUB", s.m.cfg.DialTimeout, s.m.cfg.Limits)
	if err != nil {
		s.m.x.Metrics().PeerDrops.Drop(err)
		return false, fmt.Errorf("cannot connect to %s: %w", s.pub.Endpoint, err)
	}
	defer c.Close()
	if err := c.Subscribe([]byte(s.pub.Topic)); err != nil {
		return false, fmt.Errorf("cannot subscribe to %s: %w", s.pub.Endpoint, err)
	}
	s.connected.Store(true)
	defer s.connected.Store(false)
	// Duplicates of a replay can only arrive on the connection that carried them.
	s.seq.dedupe = false
	if s.seq.known {
		// A reconnection: batches published while disconnected are lost, and the publisher
		// may have restarted and counted past our last seq, so even a seamless-looking next
		// seq proves nothing. A stale index is worse than an empty one: start over.
		s.clear(kv.ClearReconnect)
		s.seq.reset()
	}
	if s.lastConnErr != "" {
		s.log.Info("KV-event subscription connected", slog.String("endpoint", s.pub.Endpoint))
		s.lastConnErr = ""
	}
	for {
		msg, err := c.ReadMessage()
		if err != nil {
			s.m.x.Metrics().PeerDrops.Drop(err)
			return delivered, fmt.Errorf("cannot receive from %s: %w", s.pub.Endpoint, err)
		}
		if msg.Command == "" && s.handle(ctx, msg.Frames) {
			delivered = true
		}
	}
}

// handle processes one (topic, seq, payload) message; it reports whether it was well formed.
func (s *rankSub) handle(ctx context.Context, frames [][]byte) bool {
	if len(frames) != 3 || len(frames[1]) != 8 {
		s.malformed(fmt.Errorf("message of %d frames is not (topic, 8-byte seq, payload)", len(frames)))
		return false
	}
	seq := binary.BigEndian.Uint64(frames[1])
	s.received.Add(1)
	switch s.seq.observe(seq) {
	case seqDuplicate:
		return true
	case seqRestart:
		s.clear(kv.ClearRestart)
		s.seq.reset()
	case seqGap:
		s.m.x.Metrics().Gaps.Inc()
		// Within one connection a replay can fill the gap (a reconnection starts over, see
		// run, so a gap is never repaired from a restarted publisher's new history).
		s.repair(ctx, seq)
		switch s.seq.observe(seq) {
		case seqDuplicate:
			return true
		case seqGap, seqRestart:
			s.clear(kv.ClearGap)
			s.seq.reset()
		}
	}
	s.applyPayload(seq, frames[2])
	return true
}

// applyPayload decodes and applies one batch and advances the sequence. A batch that cannot
// be decoded is lost data: the rank's entries are cleared.
func (s *rankSub) applyPayload(seq uint64, payload []byte) {
	s.seq.advance(seq)
	s.lastSeq.Store(seq)
	s.dec.SkipTokenIDs = !s.ap.needsTokens()
	if err := s.dec.Decode(payload, &s.batch); err != nil {
		s.malformed(err)
		s.clear(kv.ClearGap)
		return
	}
	if err := s.ap.apply(&s.batch, s.pub.Rank); err != nil {
		s.malformed(err)
		return
	}
	s.m.x.Metrics().BatchesOK.Inc()
	if f := s.m.cfg.OnApplied; f != nil {
		f(s.worker, s.pub.Rank, seq)
	}
}

func (s *rankSub) malformed(err error) {
	s.m.x.Metrics().BatchesMalformed.Inc()
	s.badLog.Note(err)
}

// clear invalidates the rank's entries.
func (s *rankSub) clear(reason kv.ClearReason) {
	if id, ok := s.m.x.Owners().Lookup(s.worker, s.pub.Rank); ok {
		s.m.x.ClearOwner(id, reason)
		s.clears.Add(1)
	}
}

// repair replays the batches after the last applied one from the engine's replay socket,
// after live message live revealed the gap. On success the tracker stands at the newest
// replayed batch (in dedupe mode); on failure it is left where it was, for the caller to
// clear.
func (s *rankSub) repair(ctx context.Context, live uint64) {
	if s.pub.Replay == "" {
		return
	}
	from := s.seq.last + 1
	if err := s.m.replay(ctx, s.pub.Replay, from, s.applyPayload); err != nil {
		s.m.x.Metrics().ReplayFailures.Inc()
		s.log.Warn("KV-event replay failed", slog.String("endpoint", s.pub.Replay), slog.Uint64("from", from), slog.Any("error", err))
		return
	}
	s.m.x.Metrics().Replays.Inc()
	s.seq.replayed(live)
}

// endOfReplay is the replay end marker: sequence −1.
const endOfReplay = math.MaxUint64

// errNothingRetained is a replay whose publisher holds nothing from the asked seq on.
var errNothingRetained = errors.New("nothing retained")

// replay asks the replay ROUTER at endpoint for every retained batch from seq from on and
// hands each to apply in order. The request is (empty delimiter, 8-byte start): a ROUTER
// expecting a REQ envelope and one expecting a bare DEALER frame both read it.
//
// Replies come in two layouts, both accepted: (seq, payload) from older publishers, and
// (topic, seq, payload) from current vLLM, whose end marker is ("", seq −1, ""); either may
// carry the empty delimiter first.
func (m *Manager) replay(ctx context.Context, endpoint string, from uint64, apply func(seq uint64, payload []byte)) error {
	rctx, cancel := context.WithTimeout(ctx, m.cfg.ReplayTimeout)
	defer cancel()
	c, err := zmtp.Dial(rctx, endpoint, "DEALER", m.cfg.DialTimeout, m.cfg.Limits)
	if err != nil {
		m.x.Metrics().PeerDrops.Drop(err)
		return fmt.Errorf("cannot connect: %w", err)
	}
	defer c.Close()
	if err := c.WriteMessage([]byte{}, binary.BigEndian.AppendUint64(nil, from)); err != nil {
		return fmt.Errorf("cannot send the start sequence: %w", err)
	}
	next := from
	for {
		msg, err := c.ReadMessage()
		if err != nil {
			m.x.Metrics().PeerDrops.Drop(err)
			return fmt.Errorf("cannot receive after seq %d: %w", next, err)
		}
		if msg.Command != "" {
			continue
		}
		seq, payload, err := replayFrames(msg.Frames)
		if err != nil {
			return err
		}
		switch {
		case seq == endOfReplay:
			if next == from {
				return fmt.Errorf("%w from seq %d", errNothingRetained, from)
			}
			return nil
		case seq < next:
			continue
		case seq > next:
			return fmt.Errorf("retained batches start at seq %d, need %d", seq, next)
		case payload == nil:
			return fmt.Errorf("replay message of seq %d has no payload", seq)
		}
		apply(seq, payload)
		next++
	}
}

// replayFrames reads one replay reply in either layout (see replay): its seq and payload
// (nil when absent, as in an end marker).
func replayFrames(f [][]byte) (seq uint64, payload []byte, err error) {
	n := len(f)
	if n >= 2 && len(f[0]) == 0 {
		f = f[1:] // the delimiter
	}
	switch {
	case len(f) == 3 && len(f[1]) == 8: // topic, seq, payload
		return binary.BigEndian.Uint64(f[1]), f[2], nil
	case len(f) == 2 && len(f[0]) == 8: // seq, payload
		return binary.BigEndian.Uint64(f[0]), f[1], nil
	case len(f) == 1 && len(f[0]) == 8: // seq alone (an end marker)
		return binary.BigEndian.Uint64(f[0]), nil, nil
	}
	return 0, nil, fmt.Errorf("malformed replay message of %d frames", n)
}

// PublisherStatus is one DP rank subscription's state.
type PublisherStatus struct {
	Rank      int    `json:"rank"`
	Endpoint  string `json:"endpoint"`
	Replay    string `json:"replay,omitempty"`
	Connected bool   `json:"connected"`
	Received  uint64 `json:"received"`
	LastSeq   uint64 `json:"last_seq"`
	Clears    uint64 `json:"clears"`
}

func (s *rankSub) status() PublisherStatus {
	return PublisherStatus{
		Rank: s.pub.Rank, Endpoint: s.pub.Endpoint, Replay: s.pub.Replay,
		Connected: s.connected.Load(), Received: s.received.Load(), LastSeq: s.lastSeq.Load(), Clears: s.clears.Load(),
	}
}
