package load

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"switchyard/load/zmtp"
)

// GaugeTopic is the ZMQ topic of the load gauge.
const GaugeTopic = "load"

// Gauge subscriber defaults.
const (
	DefaultGaugeMinBackoff  = 100 * time.Millisecond
	DefaultGaugeMaxBackoff  = 5 * time.Second
	DefaultGaugeDialTimeout = 2 * time.Second
)

// ErrGaugeFrames is wrapped by the error for a gauge message that is not three frames with
// an 8-byte sequence number.
var ErrGaugeFrames = errors.New("load gauge message is not (topic, 8-byte seq, payload)")

// GaugeSubscriberConfig configures a GaugeSubscriber.
type GaugeSubscriberConfig struct {
	// WorkerID names the worker in callbacks and logs. Required.
	WorkerID string
	// Endpoint is the engine's load publisher, e.g. "tcp://127.0.0.1:5558". Required.
	Endpoint string
	// Topic is the subscription topic. Default GaugeTopic ("load").
	Topic string
	// MinBackoff and MaxBackoff bound the doubling wait between reconnects. Defaults
	// DefaultGaugeMinBackoff (100 ms) and DefaultGaugeMaxBackoff (5 s).
	MinBackoff, MaxBackoff time.Duration
	// DialTimeout bounds one TCP connect. Default DefaultGaugeDialTimeout (2 s).
	DialTimeout time.Duration
	// Logger receives connection and malformed-message logs (on change). Default: discard.
	Logger *slog.Logger
	// Now is the clock for receipt times. Default time.Now.
	Now func() time.Time
	// Deliver receives every decoded report, on the subscriber's goroutine. Required.
	Deliver func(workerID string, r RankReport)
	// Limits bound what the publisher may send (zmtp defaults: 16 MiB a message).
	Limits zmtp.Limits
	// Metrics counts publishers disconnected for what they sent. Default: private.
	Metrics *zmtp.Metrics
	// MalformedLogEvery is the least time between two logs of malformed messages. Default
	// MalformedLogInterval (10 s).
	MalformedLogEvery time.Duration
}

// GaugeSubscriber subscribes to one engine's ZMQ load gauge and delivers decoded reports.
// Run owns the socket; the counter methods are safe to call from any goroutine.
type GaugeSubscriber struct {
	cfg GaugeSubscriberConfig

	received   atomic.Uint64
	malformed  atomic.Uint64
	gaps       atomic.Uint64
	reconnects atomic.Uint64

	// Owned by Run.
	lastSeq  uint64
	hasSeq   bool
	badLog   LogThrottle
	lastConn string
}

// NewGaugeSubscriber validates cfg and returns a GaugeSubscriber.
func NewGaugeSubscriber(cfg GaugeSubscriberConfig) (*GaugeSubscriber, error) {
	if cfg.WorkerID == "" {
		return nil, fmt.Errorf("cannot create load gauge subscriber: %w: empty worker ID", ErrInvalidConfig)
	}
	if cfg.Deliver == nil {
		return nil, fmt.Errorf("cannot create load gauge subscriber for %s: %w: nil Deliver", cfg.WorkerID, ErrInvalidConfig)
	}
	if !strings.HasPrefix(cfg.Endpoint, "tcp://") && !strings.HasPrefix(cfg.Endpoint, "ipc://") {
		return nil, fmt.Errorf("cannot create load gauge subscriber for %s: %w: endpoint %q is not tcp:// or ipc://", cfg.WorkerID, ErrInvalidConfig, cfg.Endpoint)
	}
	if cfg.Topic == "" {
		cfg.Topic = GaugeTopic
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultGaugeMinBackoff
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(DefaultGaugeMaxBackoff, cfg.MinBackoff)
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultGaugeDialTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Metrics == nil {
		cfg.Metrics = zmtp.NewMetrics(nil, "load_gauge")
	}
	s := &GaugeSubscriber{cfg: cfg}
	s.badLog = LogThrottle{Logger: cfg.Logger.With(slog.String("worker", cfg.WorkerID)), Msg: "malformed load gauge messages",
		Every: cfg.MalformedLogEvery, Now: cfg.Now}
	return s, nil
}

// Received is the number of reports delivered.
func (s *GaugeSubscriber) Received() uint64 { return s.received.Load() }

// Malformed is the number of messages dropped as malformed (wrong frames or payload).
func (s *GaugeSubscriber) Malformed() uint64 { return s.malformed.Load() }

// Gaps is the number of sequence-number jumps seen (lost messages; harmless for a gauge).
func (s *GaugeSubscriber) Gaps() uint64 { return s.gaps.Load() }

// Reconnects is the number of connection attempts after the first.
func (s *GaugeSubscriber) Reconnects() uint64 { return s.reconnects.Load() }

// Run connects, subscribes and delivers reports until ctx is done; it then closes the socket
// and returns nil. A lost or refused connection is retried with doubling backoff; malformed
// messages are counted and logged (at most once per MalformedLogInterval, with a count),
// never fatal; a peer past the message limits is disconnected and counted; a panic in
// Deliver is recovered and logged.
func (s *GaugeSubscriber) Run(ctx context.Context) error {
	zmtp.Retry(ctx, zmtp.Backoff{Min: s.cfg.MinBackoff, Max: s.cfg.MaxBackoff},
		func(ctx context.Context, n int) (bool, error) {
			if n > 0 {
				s.reconnects.Add(1)
			}
			return s.session(ctx)
		}, s.noteConn)
	return nil
}

// noteConn logs a connection failure when its message changes.
func (s *GaugeSubscriber) noteConn(err error) {
	if msg := err.Error(); msg != s.lastConn {
		s.lastConn = msg
		s.cfg.Logger.Warn("load gauge connection failing", slog.String("worker", s.cfg.WorkerID),
			slog.String("endpoint", s.cfg.Endpoint), slog.Any("error", err))
	}
}

// session runs one connection until it fails; delivered reports whether any report got
// through (which resets the backoff).
func (s *GaugeSubscriber) session(ctx context.Context) (delivered bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c, err := zmtp.Dial(sctx, s.cfg.Endpoint, "SUB", s.cfg.DialTimeout, s.cfg.Limits)
	if err != nil {
		s.cfg.Metrics.Drop(err)
		return false, fmt.Errorf("cannot connect to %s: %w", s.cfg.Endpoint, err)
	}
	defer c.Close()
	if err := c.Subscribe([]byte(s.cfg.Topic)); err != nil {
		return false, fmt.Errorf("cannot subscribe to %s: %w", s.cfg.Endpoint, err)
	}
	if s.lastConn != "" {
		s.cfg.Logger.Info("load gauge connected", slog.String("worker", s.cfg.WorkerID), slog.String("endpoint", s.cfg.Endpoint))
		s.lastConn = ""
	}
	s.hasSeq = false // a new connection may meet a restarted publisher
	for {
		msg, err := c.ReadMessage()
		if err != nil {
			s.cfg.Metrics.Drop(err)
			return delivered, fmt.Errorf("cannot receive from %s: %w", s.cfg.Endpoint, err)
		}
		if msg.Command != "" {
			continue
		}
		if s.handle(msg.Frames) {
			delivered = true
		}
	}
}

// handle decodes and delivers one message; it reports whether a report was delivered.
// Messages of other topics that share the subscription prefix are ignored.
func (s *GaugeSubscriber) handle(frames [][]byte) bool {
	if len(frames) > 0 && string(frames[0]) != s.cfg.Topic {
		return false
	}
	rep, err := s.decode(frames)
	if err != nil {
		s.malformed.Add(1)
		s.badLog.Note(err)
		return false
	}
	s.received.Add(1)
	s.deliver(rep)
	return true
}

// decode checks the frames, tracks the sequence number and decodes the payload.
func (s *GaugeSubscriber) decode(frames [][]byte) (RankReport, error) {
	if len(frames) != 3 || len(frames[1]) != 8 {
		return RankReport{}, fmt.Errorf("cannot decode load gauge message: %w (%d frames)", ErrGaugeFrames, len(frames))
	}
	seq := binary.BigEndian.Uint64(frames[1])
	if s.hasSeq && seq > s.lastSeq+1 {
		s.gaps.Add(1)
	}
	s.lastSeq, s.hasSeq = seq, true
	return DecodeGauge(frames[2], s.cfg.Now())
}

func (s *GaugeSubscriber) deliver(rep RankReport) {
	defer func() {
		if v := recover(); v != nil {
			s.cfg.Logger.Error("load gauge delivery panicked", slog.String("worker", s.cfg.WorkerID), slog.Any("panic", v))
		}
	}()
	s.cfg.Deliver(s.cfg.WorkerID, rep)
}
