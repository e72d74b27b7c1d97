package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"switchyard/load/zmtp/zmtptest"
)

// testWait bounds every wait on a socket in these tests.
const testWait = 5 * time.Second

// served runs a Listener of sockType whose handler sends each read result (message copy or
// error) to the returned channel.
type result struct {
	frames [][]byte
	cmd    string
	err    error
}

func serveReads(t *testing.T, sockType string, lim Limits, m *Metrics) (*Listener, <-chan result) {
	t.Helper()
	out := make(chan result, 64)
	l, err := Listen("tcp://127.0.0.1:0", ListenerConfig{SocketType: sockType, Limits: lim, Metrics: m}, func(c *Conn) error {
		for {
			msg, err := c.ReadMessage()
			if err != nil {
				out <- result{err: err}
				return err
			}
			r := result{cmd: msg.Command}
			for _, f := range msg.Frames {
				r.frames = append(r.frames, bytes.Clone(f))
			}
			out <- r
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l, out
}

func next(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(testWait):
		t.Fatal("no message")
		return result{}
	}
}

// rawPeer is a hand-driven peer: it completes the handshake as sockType and then writes
// whatever the test says, byte by byte if need be.
type rawPeer struct {
	nc net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr, sockType string) *rawPeer {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, testWait)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(testWait))
	p := &rawPeer{nc: nc, br: bufio.NewReader(nc)}
	p.write(t, zmtptest.Hello(sockType))
	var g [64]byte
	if _, err := io.ReadFull(p.br, g[:]); err != nil {
		t.Fatal(err)
	}
	var h [2]byte
	if _, err := io.ReadFull(p.br, h[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(p.br, make([]byte, h[1])); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *rawPeer) write(t *testing.T, b []byte) {
	t.Helper()
	if _, err := p.nc.Write(b); err != nil {
		t.Fatal(err)
	}
}

// longHeader is a data frame header claiming size bytes.
func longHeader(flags byte, size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{flags | flagLong}, size)
}

// closed reports whether the peer's connection was closed by the other side.
func (p *rawPeer) closed(t *testing.T) bool {
	t.Helper()
	_ = p.nc.SetReadDeadline(time.Now().Add(testWait))
	_, err := io.Copy(io.Discard, p.br)
	return err == nil // EOF: closed by the peer
}

func TestRoundTripMultiFrame(t *testing.T) {
	l, reads := serveReads(t, "SUB", Limits{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := Dial(ctx, l.Endpoint(), "PUB", testWait, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	big := bytes.Repeat([]byte{7}, 300) // a long frame
	want := [][][]byte{{[]byte("topic"), {0, 0, 0, 0, 0, 0, 0, 1}, big}, {{}}, {[]byte("a"), {}, []byte("c")}}
	for _, m := range want {
		if err := c.WriteMessage(m...); err != nil {
			t.Fatal(err)
		}
	}
	for i, m := range want {
		got := next(t, reads)
		if got.err != nil || len(got.frames) != len(m) {
			t.Fatalf("message %d: %v, %d frames, want %d", i, got.err, len(got.frames), len(m))
		}
		for j := range m {
			if !bytes.Equal(got.frames[j], m[j]) {
				t.Fatalf("message %d frame %d: %q, want %q", i, j, got.frames[j], m[j])
			}
		}
	}
}

// TestHostileLengths: a peer that completes the handshake and then claims more than the
// limits allow is disconnected with ErrTooLarge, counted, and costs no allocation of the
// claimed size (a claim of 2^40 bytes would end the process otherwise).
func TestHostileLengths(t *testing.T) {
	lim := Limits{MaxMessage: 1 << 20, MaxFrames: 4}
	tests := []struct {
		name  string
		bytes []byte
	}{
		{"one frame of 2^40 bytes", longHeader(0, 1<<40)},
		{"one frame of 2^64-1 bytes", longHeader(0, 1<<64-1)},
		{"a frame one byte past the limit", longHeader(0, 1<<20+1)},
		{"frames together past the limit", append(append(longHeader(flagMore, 600<<10), make([]byte, 600<<10)...), longHeader(0, 600<<10)...)},
		{"too many frames", bytes.Repeat([]byte{flagMore, 0}, 5)},
		{"a command of 2^40 bytes", longHeader(flagCommand, 1<<40)},
		{"a command past 64 KiB", longHeader(flagCommand, maxCommand+1)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMetrics(nil, "test")
			l, reads := serveReads(t, "SUB", lim, m)
			p := dialRaw(t, l.Addr().String(), "PUB")
			p.write(t, tc.bytes)
			if r := next(t, reads); !errors.Is(r.err, ErrTooLarge) {
				t.Fatalf("read: %v, want ErrTooLarge", r.err)
			}
			if !p.closed(t) {
				t.Fatal("the peer was not disconnected")
			}
			if got := m.TooLarge(); got != 1 {
				t.Fatalf("too_large drops %d, want 1", got)
			}
		})
	}
}

// TestClaimedLengthCostsOnlyWhatArrives: a frame that claims the whole limit and sends a
// few bytes holds a buffer of one read chunk, not the claim.
func TestClaimedLengthCostsOnlyWhatArrives(t *testing.T) {
	var data []byte
	data = append(data, longHeader(0, DefaultMaxMessage)...)
	data = append(data, "only a few bytes"...)
	c := &Conn{br: bufio.NewReader(bytes.NewReader(data)), bw: bufio.NewWriter(io.Discard), lim: Limits{}.withDefaults()}
	if _, err := c.ReadMessage(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read: %v, want unexpected EOF", err)
	}
	if cap(c.buf) > 2*readChunk {
		t.Fatalf("buffer of %d bytes for 16 bytes received", cap(c.buf))
	}
}

func TestHandshakeRejects(t *testing.T) {
	tests := []struct {
		name string
		send []byte
	}{
		{"not ZMTP", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + string(make([]byte, 40)))},
		{"ZMTP 2", func() []byte { g := greeting; g[10] = 1; return g[:] }()},
		{"CURVE", func() []byte { g := greeting; copy(g[12:32], "CURVE\x00\x00\x00"); return g[:] }()},
		{"a huge READY", append(greeting[:], longHeader(flagCommand, 1<<40)...)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMetrics(nil, "test")
			l, _ := serveReads(t, "SUB", Limits{}, m)
			nc, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			if _, err := nc.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			_ = nc.SetReadDeadline(time.Now().Add(testWait))
			if _, err := io.Copy(io.Discard, nc); err != nil {
				t.Fatalf("not disconnected: %v", err)
			}
			if m.TooLarge()+m.Protocol() != 1 {
				t.Fatalf("drops: too_large %d, protocol %d; want one", m.TooLarge(), m.Protocol())
			}
		})
	}
}

// TestWrongSocketTypeRefused: a SUB does not talk to a SUB.
func TestWrongSocketTypeRefused(t *testing.T) {
	l, _ := serveReads(t, "SUB", Limits{}, nil)
	_, err := Dial(context.Background(), l.Endpoint(), "SUB", testWait, Limits{})
	if !errors.Is(err, ErrProtocol) {
		t.Fatalf("dial: %v, want ErrProtocol", err)
	}
}

func TestMaxPeers(t *testing.T) {
	m := NewMetrics(nil, "test")
	l, err := Listen("tcp://127.0.0.1:0", ListenerConfig{SocketType: "SUB", MaxPeers: 2, Metrics: m}, func(c *Conn) error {
		_, err := c.ReadMessage()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dialRaw(t, l.Addr().String(), "PUB")
	dialRaw(t, l.Addr().String(), "PUB")
	nc, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetReadDeadline(time.Now().Add(testWait))
	if _, err := io.Copy(io.Discard, nc); err != nil {
		t.Fatalf("the third peer was not refused: %v", err)
	}
	if m.Peers() != 1 {
		t.Fatalf("peers drops %d, want 1", m.Peers())
	}
}

// TestPingAnswered: a PING gets a PONG with its context.
func TestPingAnswered(t *testing.T) {
	l, reads := serveReads(t, "SUB", Limits{}, nil)
	p := dialRaw(t, l.Addr().String(), "PUB")
	ping := append([]byte{4}, "PING"...)
	ping = append(ping, 0, 10, 'c', 't', 'x')
	p.write(t, append([]byte{flagCommand, byte(len(ping))}, ping...))
	p.write(t, []byte{0, 2, 'o', 'k'})
	var h [2]byte
	if _, err := io.ReadFull(p.br, h[:]); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, h[1])
	if _, err := io.ReadFull(p.br, body); err != nil {
		t.Fatal(err)
	}
	if h[0] != flagCommand || string(body) != "\x04PONGctx" {
		t.Fatalf("answer %x %q, want PONG ctx", h[0], body)
	}
	if r := next(t, reads); r.err != nil || len(r.frames) != 1 || string(r.frames[0]) != "ok" {
		t.Fatalf("after PING: %+v", r)
	}
}

// TestInteropWithZMQ4 speaks to go-zeromq/zmq4, a ZeroMQ implementation we did not write:
// its PUB feeds our SUB, our PUB-side Listener feeds its SUB.
func TestInteropWithZMQ4(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	t.Run("their PUB, our SUB", func(t *testing.T) {
		pub := zmq4.NewPub(ctx)
		defer pub.Close()
		if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		c, err := Dial(ctx, "tcp://"+pub.Addr().String(), "SUB", testWait, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.Subscribe([]byte("kv")); err != nil {
			t.Fatal(err)
		}
		got := make(chan [][]byte, 1)
		go func() {
			msg, err := c.ReadMessage()
			if err != nil {
				got <- nil
				return
			}
			got <- [][]byte{bytes.Clone(msg.Frames[0]), bytes.Clone(msg.Frames[2])}
		}()
		for {
			// The subscription travels asynchronously: publish until it arrives.
			if err := pub.Send(zmq4.NewMsgFrom([]byte("kv"), make([]byte, 8), []byte("payload"))); err != nil {
				t.Fatal(err)
			}
			select {
			case f := <-got:
				if f == nil || string(f[0]) != "kv" || string(f[1]) != "payload" {
					t.Fatalf("got %q", f)
				}
				return
			case <-time.After(10 * time.Millisecond):
			case <-ctx.Done():
				t.Fatal("nothing received")
			}
		}
	})
	t.Run("our PUB side, their SUB", func(t *testing.T) {
		subscribed := make(chan *Conn, 1)
		l, err := Listen("tcp://127.0.0.1:0", ListenerConfig{SocketType: "PUB"}, func(c *Conn) error {
			msg, err := c.ReadMessage()
			if err != nil {
				return err
			}
			if len(msg.Frames) == 1 && len(msg.Frames[0]) > 0 && msg.Frames[0][0] == 1 || msg.Command == "SUBSCRIBE" {
				subscribed <- c
			}
			_, err = c.ReadMessage()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		sub := zmq4.NewSub(ctx)
		defer sub.Close()
		if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
			t.Fatal(err)
		}
		if err := sub.Dial(l.Endpoint()); err != nil {
			t.Fatal(err)
		}
		var c *Conn
		select {
		case c = <-subscribed:
		case <-ctx.Done():
			t.Fatal("no subscription")
		}
		if err := c.WriteMessage([]byte("load"), []byte{1}, bytes.Repeat([]byte{2}, 1000)); err != nil {
			t.Fatal(err)
		}
		msg, err := sub.Recv()
		if err != nil || len(msg.Frames) != 3 || len(msg.Frames[2]) != 1000 {
			t.Fatalf("their SUB got %v, %v", msg.Frames, err)
		}
	})
}

// FuzzReadMessage feeds arbitrary bytes to the frame reader: it never panics, never holds
// more than the limit plus one read chunk, and returns only messages within the limits.
func FuzzReadMessage(f *testing.F) {
	f.Add([]byte{0, 3, 'a', 'b', 'c'})
	f.Add([]byte{flagMore, 1, 'x', 0, 0})
	f.Add(longHeader(0, 1<<40))
	f.Add(append([]byte{flagCommand, 5, 4}, "PING"...))
	f.Add(append(longHeader(flagCommand, 10), 4, 'P', 'I', 'N', 'G', 0, 1, 2, 3, 4))
	f.Add(bytes.Repeat([]byte{flagMore, 0}, 10))
	f.Fuzz(func(t *testing.T, data []byte) {
		lim := Limits{MaxMessage: 4096, MaxFrames: 8}.withDefaults()
		c := &Conn{br: bufio.NewReader(bytes.NewReader(data)), bw: bufio.NewWriter(io.Discard), lim: lim}
		for range 100 {
			msg, err := c.ReadMessage()
			if cap(c.buf) > int(lim.MaxMessage)+readChunk && cap(c.buf) > maxCommand+readChunk {
				t.Fatalf("buffer of %d bytes", cap(c.buf))
			}
			if err != nil {
				return
			}
			n := 0
			for _, fr := range msg.Frames {
				n += len(fr)
			}
			if n > int(lim.MaxMessage) || len(msg.Frames) > lim.MaxFrames {
				t.Fatalf("message of %d bytes in %d frames past the limits", n, len(msg.Frames))
			}
		}
	})
}
