package kv

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
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
	dec    Decoder
	batch  EventBatch
	log    *slog.Logger

	connected atomic.Bool
	received  atomic.Uint64
	lastSeq   atomic.Uint64
	clears    atomic.Uint64

	lastConnErr string
	lastBad     string
}

func newRankSub(m *Manager, worker string, pub Publisher, rekey bool) *rankSub {
	log := m.log.With(slog.String("worker", worker), slog.Int("rank", pub.Rank))
	return &rankSub{m: m, worker: worker, pub: pub, ap: newApplier(m.x, worker, rekey, log), log: log}
}

// run subscribes until ctx is done. A lost or refused connection is retried with doubling
// backoff; a panic while handling a message is recovered, logged, and ends the session.
func (s *rankSub) run(ctx context.Context) {
	backoff := s.m.cfg.MinBackoff
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			s.m.x.metrics.reconnects.Inc()
		}
		delivered, err := s.session(ctx)
		if ctx.Err() != nil {
			return
		}
		s.disconnected()
		if delivered {
			backoff = s.m.cfg.MinBackoff
		}
		if msg := err.Error(); msg != s.lastConnErr {
			s.lastConnErr = msg
			s.log.Warn("KV-event subscription failing", slog.String("endpoint", s.pub.Endpoint), slog.Any("error", err))
		}
		timer.Reset(backoff)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		backoff = min(2*backoff, s.m.cfg.MaxBackoff)
	}
}

// disconnected handles a lost connection: without a replay socket nothing can prove later
// that no batch was lost (or that the engine did not restart), so the rank's entries go.
func (s *rankSub) disconnected() {
	if s.pub.Replay == "" && s.seq.known {
		s.clear(clearGap)
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
	sock := zmq4.NewSub(sctx,
		zmq4.WithDialerMaxRetries(0), // run owns retries and backoff
		zmq4.WithDialerTimeout(s.m.cfg.DialTimeout),
		zmq4.WithLogger(slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)),
	)
	defer sock.Close()
	if err := sock.SetOption(zmq4.OptionSubscribe, s.pub.Topic); err != nil {
		return false, fmt.Errorf("cannot subscribe to %s: %w", s.pub.Endpoint, err)
	}
	if err := sock.Dial(s.pub.Endpoint); err != nil {
		return false, fmt.Errorf("cannot connect to %s: %w", s.pub.Endpoint, err)
	}
	s.connected.Store(true)
	defer s.connected.Store(false)
	// Duplicates of a replay can only arrive on the connection that carried them.
	s.seq.dedupe = false
	if s.seq.known {
		// A reconnection: batches published while disconnected are lost, and the publisher
		// may have restarted and counted past our last seq, so even a seamless-looking next
		// seq proves nothing. A stale index is worse than an empty one: start over.
		s.clear(clearReconnect)
		s.seq.reset()
	}
	if s.lastConnErr != "" {
		s.log.Info("KV-event subscription connected", slog.String("endpoint", s.pub.Endpoint))
		s.lastConnErr = ""
	}
	for {
		msg, err := sock.Recv()
		if err != nil {
			return delivered, fmt.Errorf("cannot receive from %s: %w", s.pub.Endpoint, err)
		}
		if s.handle(ctx, msg.Frames) {
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
		s.clear(clearRestart)
		s.seq.reset()
	case seqGap:
		s.m.x.metrics.gaps.Inc()
		// Within one connection a replay can fill the gap (a reconnection starts over, see
		// run, so a gap is never repaired from a restarted publisher's new history).
		s.repair(ctx, seq)
		switch s.seq.observe(seq) {
		case seqDuplicate:
			return true
		case seqGap, seqRestart:
			s.clear(clearGap)
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
	if err := s.dec.Decode(payload, &s.batch); err != nil {
		s.malformed(err)
		s.clear(clearGap)
		return
	}
	if err := s.ap.apply(&s.batch, s.pub.Rank); err != nil {
		s.malformed(err)
		return
	}
	s.m.x.metrics.batchesOK.Inc()
	if f := s.m.cfg.OnApplied; f != nil {
		f(s.worker, s.pub.Rank, seq)
	}
}

func (s *rankSub) malformed(err error) {
	s.m.x.metrics.batchesMalformed.Inc()
	if msg := err.Error(); msg != s.lastBad {
		s.lastBad = msg
		s.log.Warn("malformed KV-event message", slog.Any("error", err))
	}
}

// clear invalidates the rank's entries.
func (s *rankSub) clear(reason clearReason) {
	if id, ok := s.m.x.owners.Lookup(s.worker, s.pub.Rank); ok {
		s.m.x.clearOwner(id, reason)
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
	if err := s.replay(ctx, from); err != nil {
		s.m.x.metrics.replayFailures.Inc()
		s.log.Warn("KV-event replay failed", slog.String("endpoint", s.pub.Replay), slog.Uint64("from", from), slog.Any("error", err))
		return
	}
	s.m.x.metrics.replays.Inc()
	s.seq.replayed(live)
}

// endOfReplay is the replay end marker: sequence −1.
const endOfReplay = math.MaxUint64

// replay asks the replay ROUTER for every retained batch from seq from on and applies them.
// The request is (empty delimiter, 8-byte start): a ROUTER expecting a REQ envelope and one
// expecting a bare DEALER frame both read it; replies may carry the delimiter back.
func (s *rankSub) replay(ctx context.Context, from uint64) error {
	rctx, cancel := context.WithTimeout(ctx, s.m.cfg.ReplayTimeout)
	defer cancel()
	sock := zmq4.NewDealer(rctx,
		zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(s.m.cfg.DialTimeout),
		zmq4.WithLogger(slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)),
	)
	defer sock.Close()
	if err := sock.Dial(s.pub.Replay); err != nil {
		return fmt.Errorf("cannot connect: %w", err)
	}
	if err := sock.Send(zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, from))); err != nil {
		return fmt.Errorf("cannot send the start sequence: %w", err)
	}
	next := from
	for {
		msg, err := sock.Recv()
		if err != nil {
			return fmt.Errorf("cannot receive after seq %d: %w", next, err)
		}
		f := msg.Frames
		if len(f) > 0 && len(f[0]) == 0 {
			f = f[1:]
		}
		if len(f) < 1 || len(f[0]) != 8 {
			return fmt.Errorf("malformed replay message of %d frames", len(msg.Frames))
		}
		seq := binary.BigEndian.Uint64(f[0])
		switch {
		case seq == endOfReplay:
			if next == from {
				return fmt.Errorf("nothing retained from seq %d", from)
			}
			return nil
		case seq < next:
			continue
		case seq > next:
			return fmt.Errorf("retained batches start at seq %d, need %d", seq, next)
		case len(f) < 2:
			return fmt.Errorf("replay message of seq %d has no payload", seq)
		}
		s.applyPayload(seq, f[1])
		next++
	}
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
