package load

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"switchyard/load/zmtp"
	"switchyard/load/zmtp/zmtptest"
)

// testPub is a real zmq4 PUB socket on 127.0.0.1.
type testPub struct {
	t    *testing.T
	sock zmq4.Socket
	seq  uint64
}

func newTestPub(t *testing.T, endpoint string) *testPub {
	t.Helper()
	sock := zmq4.NewPub(t.Context())
	if err := sock.Listen(endpoint); err != nil {
		t.Fatalf("cannot bind PUB to %s: %v", endpoint, err)
	}
	p := &testPub{t: t, sock: sock}
	t.Cleanup(p.close)
	return p
}

func (p *testPub) endpoint() string { return "tcp://" + p.sock.Addr().String() }

func (p *testPub) close() { _ = p.sock.Close() }

// send publishes raw frames.
func (p *testPub) send(frames ...[]byte) {
	p.t.Helper()
	if err := p.sock.Send(zmq4.NewMsgFrom(frames...)); err != nil {
		p.t.Fatalf("cannot publish: %v", err)
	}
}

// gauge publishes r on topic "load" with the next sequence number (plus skip).
func (p *testPub) gauge(r RankReport, skip uint64) {
	p.t.Helper()
	p.seq += skip
	seq := binary.BigEndian.AppendUint64(nil, p.seq)
	p.seq++
	p.send([]byte(GaugeTopic), seq, AppendGauge(nil, r, true))
}

// runSubscriber starts s.Run and returns a stop function that cancels and waits for it.
func runSubscriber(t *testing.T, s *GaugeSubscriber) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return within 10 s of cancel")
		}
	}
	t.Cleanup(stop)
	return stop
}

// awaitRunning publishes warm-up reports until the subscriber delivers one whose Running is
// want (the ZMQ slow joiner misses messages published before its subscription arrives),
// bounded by a deadline.
func awaitRunning(t *testing.T, pub *testPub, got <-chan RankReport, want int64, republish bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	if republish {
		pub.gauge(RankReport{Running: want}, 0)
	}
	for {
		select {
		case r := <-got:
			if r.Running == want {
				return
			}
		case <-tick.C:
			if republish {
				pub.gauge(RankReport{Running: want}, 0)
			}
		case <-deadline:
			t.Fatalf("no report with Running=%d within 10 s", want)
		}
	}
}

func newTestSubscriber(t *testing.T, endpoint string, got chan<- RankReport, mod func(*GaugeSubscriberConfig)) *GaugeSubscriber {
	t.Helper()
	cfg := GaugeSubscriberConfig{
		WorkerID: "w1", Endpoint: endpoint,
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		Now: func() time.Time { return recvAt },
		Deliver: func(id string, r RankReport) {
			if id != "w1" {
				t.Errorf("delivered for %q", id)
			}
			got <- r
		},
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := NewGaugeSubscriber(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestGaugeSubscriberReceivesAndCountsMalformed(t *testing.T) {
	pub := newTestPub(t, "tcp://127.0.0.1:0")
	got := make(chan RankReport, 1024)
	s := newTestSubscriber(t, pub.endpoint(), got, nil)
	stop := runSubscriber(t, s)

	awaitRunning(t, pub, got, 1, true)
	if s.Malformed() != 0 || s.Gaps() != 0 {
		t.Fatalf("before bad input: malformed %d gaps %d", s.Malformed(), s.Gaps())
	}

	pub.send([]byte(GaugeTopic), binary.BigEndian.AppendUint64(nil, 1<<20), []byte{0x91, 0x01}) // bad payload
	pub.send([]byte(GaugeTopic), []byte("short"), AppendGauge(nil, RankReport{}, false))        // bad seq frame
	pub.send([]byte(GaugeTopic), []byte{0, 0, 0, 0, 0, 0, 0, 1})                                // 2 frames
	pub.send([]byte("loadX"), make([]byte, 8), []byte("other topic, ignored"))
	pub.seq = 1<<20 + 1
	pub.gauge(RankReport{DPRank: 2, Running: 99, Waiting: 3, MaxTotalTokens: 10}, 2)
	awaitRunning(t, pub, got, 99, false)

	if s.Malformed() != 3 {
		t.Errorf("Malformed() = %d, want 3", s.Malformed())
	}
	// The bad payload's sequence number jumped (a gap), and so did the marker's.
	if s.Gaps() != 2 {
		t.Errorf("Gaps() = %d, want 2", s.Gaps())
	}
	stop()
	if s.Received() == 0 {
		t.Error("Received() = 0")
	}
}

func TestGaugeSubscriberDeliversDecodedReport(t *testing.T) {
	pub := newTestPub(t, "tcp://127.0.0.1:0")
	got := make(chan RankReport, 1024)
	s := newTestSubscriber(t, pub.endpoint(), got, nil)
	runSubscriber(t, s)
	awaitRunning(t, pub, got, 1, true)

	sent := RankReport{DPRank: 1, Running: 7, Waiting: 2, UsedTokens: 300, MaxTotalTokens: 1000,
		WaitingUncachedTokens: 40, TotalTokens: 350, MaxRunningRequests: 8, HasCounters: true,
		TotalPrefillUncached: 5000, TotalPrefillBusyUs: 70000}
	pub.gauge(sent, 0)
	deadline := time.After(10 * time.Second)
	for {
		select {
		case r := <-got:
			if r.Running != 7 {
				continue // a late warm-up report
			}
			want := sent
			want.Fields = HasRunning | HasWaiting | HasUsedTokens | HasCapacity | HasNative | HasWaitingUncached
			want.At = recvAt
			if r != want {
				t.Fatalf("\n got %+v\nwant %+v", r, want)
			}
			return
		case <-deadline:
			t.Fatal("report not delivered within 10 s")
		}
	}
}

func TestGaugeSubscriberReconnects(t *testing.T) {
	pub := newTestPub(t, "tcp://127.0.0.1:0")
	endpoint := pub.endpoint()
	got := make(chan RankReport, 1024)
	s := newTestSubscriber(t, endpoint, got, nil)
	runSubscriber(t, s)
	awaitRunning(t, pub, got, 1, true)

	// The engine restarts: its publisher goes away and comes back on the same address.
	pub.close()
	pub2 := newTestPub(t, endpoint)
	awaitRunning(t, pub2, got, 2, true)
	if s.Reconnects() == 0 {
		t.Fatal("Reconnects() = 0 after a publisher restart")
	}
}

func TestGaugeSubscriberRetriesRefusedEndpoint(t *testing.T) {
	// A bound-then-closed port refuses connections.
	pub := newTestPub(t, "tcp://127.0.0.1:0")
	endpoint := pub.endpoint()
	pub.close()

	h := &recordHandler{}
	got := make(chan RankReport, 1)
	s := newTestSubscriber(t, endpoint, got, func(c *GaugeSubscriberConfig) { c.Logger = slog.New(h) })
	stop := runSubscriber(t, s)
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for s.Reconnects() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d reconnects within 10 s", s.Reconnects())
		}
		<-tick.C
	}
	stop()
	if n := h.count("load gauge connection failing"); n != 1 {
		t.Fatalf("repeated refusal logged %d times, want 1", n)
	}
}

func TestNewGaugeSubscriberValidates(t *testing.T) {
	deliver := func(string, RankReport) {}
	for _, cfg := range []GaugeSubscriberConfig{
		{Endpoint: "tcp://127.0.0.1:1", Deliver: deliver},
		{WorkerID: "w", Endpoint: "tcp://127.0.0.1:1"},
		{WorkerID: "w", Endpoint: "127.0.0.1:1", Deliver: deliver},
	} {
		if _, err := NewGaugeSubscriber(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewGaugeSubscriber(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
	s, err := NewGaugeSubscriber(GaugeSubscriberConfig{WorkerID: "w", Endpoint: "tcp://127.0.0.1:1", Deliver: deliver})
	if err != nil || s.cfg.Topic != GaugeTopic || s.cfg.MinBackoff != DefaultGaugeMinBackoff || s.cfg.MaxBackoff != DefaultGaugeMaxBackoff {
		t.Fatalf("defaults: %+v, %v", s.cfg, err)
	}
}

// TestGaugeSubscriberLogsMalformedOncePerInterval: 1,010 garbage messages make one warning
// line; after the interval the next one logs again with the count since the last line.
func TestGaugeSubscriberLogsMalformedOncePerInterval(t *testing.T) {
	pub := newTestPub(t, "tcp://127.0.0.1:0")
	got := make(chan RankReport, 1024)
	h := zmtptest.NewLogCounter("malformed load gauge messages")
	var now atomic.Int64
	now.Store(recvAt.UnixNano())
	s := newTestSubscriber(t, pub.endpoint(), got, func(c *GaugeSubscriberConfig) {
		c.Logger = slog.New(h)
		c.Now = func() time.Time { return time.Unix(0, now.Load()) }
	})
	runSubscriber(t, s)
	awaitRunning(t, pub, got, 1, true)
	garbage := func(n int, marker int64) {
		for i := range n {
			// An array of i elements (and nothing in it): each message fails differently.
			bad := binary.BigEndian.AppendUint16([]byte{0xdc}, uint16(i+20))
			pub.send([]byte(GaugeTopic), make([]byte, 8), bad)
		}
		pub.gauge(RankReport{Running: marker}, 0)
	}
	garbage(1010, 2)
	awaitRunning(t, pub, got, 2, false) // every garbage message before it was handled
	if s.Malformed() != 1010 {
		t.Fatalf("Malformed() = %d, want 1010", s.Malformed())
	}
	if lines := h.Lines(); len(lines) != 1 || lines[0] != 1 {
		t.Fatalf("log lines (their counts) %v, want one line of count 1", lines)
	}
	now.Add(int64(MalformedLogInterval))
	garbage(5, 3)
	awaitRunning(t, pub, got, 3, false)
	if lines := h.Lines(); len(lines) != 2 || lines[1] != 1009+1 {
		t.Fatalf("log lines (their counts) %v, want a second line counting 1,010", lines)
	}
}

// TestGaugeSubscriberDisconnectsHostilePublisher: a publisher that claims a 2^40-byte frame
// is disconnected and counted, and the subscriber goes on (it dials again).
func TestGaugeSubscriberDisconnectsHostilePublisher(t *testing.T) {
	ep, ends := zmtptest.Server(t, "PUB", zmtptest.Claim(1<<40))
	m := zmtp.NewMetrics(nil, "load_gauge")
	s := newTestSubscriber(t, ep, make(chan RankReport, 1), func(c *GaugeSubscriberConfig) { c.Metrics = m })
	runSubscriber(t, s)
	zmtptest.HungUp(t, ends, 2) // the second proves the subscriber is still alive and redialling
	if m.TooLarge() < 2 {
		t.Fatalf("too_large drops %d, want at least 2", m.TooLarge())
	}
}
