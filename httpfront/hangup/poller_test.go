//go:build linux

package hangup

import (
	"io"
	"net"
	"testing"
	"time"
)

// goneTarget counts its Gone calls on a channel.
type goneTarget chan struct{}

func (g goneTarget) Gone() { g <- struct{}{} }

func newPoller(t *testing.T) *Poller {
	t.Helper()
	p, err := NewPoller()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// waitGone waits (bounded) for g's Gone.
func waitGone(t *testing.T, g goneTarget) {
	t.Helper()
	select {
	case <-g:
	case <-time.After(10 * time.Second):
		t.Fatal("the hang-up was not seen")
	}
}

func TestPollerHangUp(t *testing.T) {
	p := newPoller(t)
	for _, how := range []string{"close", "reset"} {
		t.Run(how, func(t *testing.T) {
			s, c := pair(t)
			var pc Conn
			g := make(goneTarget, 1)
			// A few watches that see nothing: the connection is added once and re-armed.
			for range 3 {
				if !p.Watch(&pc, s, g) {
					t.Fatal("a TCP connection cannot be watched")
				}
				if p.Stop(&pc) {
					t.Fatal("gone before the peer left")
				}
			}
			if !p.Watch(&pc, s, g) {
				t.Fatal("not watched")
			}
			if how == "reset" {
				_ = c.(*net.TCPConn).SetLinger(0)
			}
			_ = c.Close()
			waitGone(t, g)
			if !p.Stop(&pc) {
				t.Fatal("Stop does not report the hang-up")
			}
			p.Forget(&pc)
		})
	}
}

// TestPollerHangUpBetweenWatches: a peer that hangs up while no watch is armed (between two
// requests) is seen by the next watch.
func TestPollerHangUpBetweenWatches(t *testing.T) {
	p := newPoller(t)
	s, c := pair(t)
	var pc Conn
	g := make(goneTarget, 1)
	p.Watch(&pc, s, g)
	p.Stop(&pc)
	_ = c.Close()
	// Whether the poller has seen the edge yet or not, the next watch reports it.
	if !p.Watch(&pc, s, g) {
		t.Fatal("not watched")
	}
	waitGone(t, g)
	if !p.Stop(&pc) {
		t.Fatal("Stop does not report the hang-up")
	}
}

// TestPollerDataIsNotConsumed: bytes from a peer (a pipelined request) are no hang-up, also
// when the peer closes after them, and are still there for the connection's owner.
func TestPollerDataIsNotConsumed(t *testing.T) {
	p := newPoller(t)
	s, c := pair(t)
	var pc Conn
	g := make(goneTarget, 1)
	p.Watch(&pc, s, g)
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	if p.Stop(&pc) {
		t.Fatal("data reported as a hang-up")
	}
	select {
	case <-g:
		t.Fatal("Gone ran for a peer with a request pending")
	default:
	}
	_ = s.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 16)
	if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "GET / HTTP/1.1\r\n" {
		t.Fatalf("read %q, %v after the watch", buf, err)
	}
}

// TestPollerClosedUnderWatch: a connection its owner closes while armed stops without
// blocking, and a new connection (likely on the same descriptor) is watched as usual.
func TestPollerClosedUnderWatch(t *testing.T) {
	p := newPoller(t)
	s, _ := pair(t)
	var pc Conn
	g := make(goneTarget, 1)
	p.Watch(&pc, s, g)
	_ = s.Close()
	p.Stop(&pc) // either outcome; it must return
	p.Forget(&pc)

	s2, c2 := pair(t)
	var pc2 Conn
	g2 := make(goneTarget, 1)
	if !p.Watch(&pc2, s2, g2) {
		t.Fatal("not watched")
	}
	_ = c2.Close()
	waitGone(t, g2)
	if !p.Stop(&pc2) {
		t.Fatal("Stop does not report the hang-up")
	}
}

func TestPollerNotASocket(t *testing.T) {
	p := newPoller(t)
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	var pc Conn
	if p.Watch(&pc, a, make(goneTarget, 1)) || p.Watch(&pc, a, make(goneTarget, 1)) {
		t.Fatal("a pipe was watched")
	}
}

// TestPollerClose: a closed Poller's goroutine has ended; a watch armed before still stops.
func TestPollerClose(t *testing.T) {
	p, err := NewPoller()
	if err != nil {
		t.Fatal(err)
	}
	s, _ := pair(t)
	var pc Conn
	p.Watch(&pc, s, make(goneTarget, 1))
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	default:
		t.Fatal("the poller's goroutine still runs")
	}
	if p.Stop(&pc) {
		t.Fatal("a hang-up reported for a peer still there")
	}
	_ = p.Close() // twice is fine
}

// BenchmarkWatch is one request's watch of its client connection: Watch and Stop with the
// Poller, against a goroutine per watch (Start).
func BenchmarkWatch(b *testing.B) {
	b.Run("poller", func(b *testing.B) {
		p, err := NewPoller()
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		s, _ := benchPair(b)
		var pc Conn
		g := make(goneTarget, 1)
		b.ReportAllocs()
		for b.Loop() {
			p.Watch(&pc, s, g)
			p.Stop(&pc)
		}
	})
	b.Run("goroutine", func(b *testing.B) {
		s, _ := benchPair(b)
		b.ReportAllocs()
		for b.Loop() {
			w, _ := Start(s, nil, func() {})
			w.Stop()
		}
	})
}

func benchPair(b *testing.B) (server, client net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		server.Close()
		client.Close()
	})
	return server, client
}
