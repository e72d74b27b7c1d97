package fleet

import (
	"errors"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// Streams. A streamed response's body is read on one goroutine (the client connection's),
// which must also wake on its own when the stream goes quiet: to send a heartbeat, or to end
// the stream at its idle bound or deadline. A Stream gives that goroutine the response's
// engine connection: with Pace, every read on the connection waits at most until the Pacer's
// Due time, and a wait that reaches it runs Woke on the reading goroutine, which says
// whether the read goes on. The wait is the connection's read deadline (moved lazily, see
// LazyDeadline): no timer of the reader's own, no goroutine, and the read resumes inside the
// response's chunked framing exactly where it was, whatever byte it waited for.
//
// While paced, a read that finds the socket empty runs the Pacer's Waiting before it waits
// (the runtime's own read does the same system calls: a read, EAGAIN, a wait for the socket,
// a read): a reader that gathers what several reads brought writes it there, so that events
// already received go out together and none waits for the next.
//
// Interrupt ends a read from any goroutine (the client hung up, the drain's hard stop): it
// closes the connection's socket, below TLS, at once; the connection is never used again.

// Pacer paces the reads of a Stream's connection (Stream.Pace). Its methods run on the
// reading goroutine.
type Pacer interface {
	// Due is when the current read must wake if nothing arrives; zero: never.
	Due() time.Time
	// Woke runs when a read waited until Due and nothing arrived. It reports whether the
	// read goes on (with a new Due); false ends it with the timeout error.
	Woke() bool
	// Waiting runs when a read finds nothing left to read on the socket, before it waits
	// (Stream.Waits reports whether it will be called): the reader writes what it has
	// gathered. False ends the read with an error.
	Waiting() bool
}

// ErrInterrupted is the read error of a Stream whose read was interrupted (Interrupt).
var ErrInterrupted = errors.New("the stream's engine connection was closed by the router")

// Stream is the engine connection a streamed response's body is read from. The zero value
// (a response that did not come from an Upstream) paces nothing and interrupts nothing.
type Stream struct{ c *upConn }

// StreamOf returns the connection resp (a streamed response an Upstream received) is read
// from.
func StreamOf(resp *fasthttp.Response) Stream { return Stream{c: connOf(resp)} }

// Valid reports whether s has a connection.
func (s Stream) Valid() bool { return s.c != nil }

// Pace makes every later read of the connection wait at most until p.Due (see Pacer), until
// Unpace, and lets the fleet's InterruptStreams reach the connection. It reports false when
// InterruptStreams has already run (the drain's hard stop): the connection is then
// interrupted. Call it from the reading goroutine, before reading.
func (s Stream) Pace(p Pacer) bool {
	c := s.c
	if c == nil {
		return true
	}
	c.pacer = p
	if l := c.lazy; l != nil && l.sock != nil {
		l.waiting = p
	}
	c.streaming.Store(true)
	if c.set.stopping.Load() {
		c.interrupt()
		return false
	}
	return true
}

// Unpace ends Pace, before the response's body stream is closed (which may give the
// connection to another request).
func (s Stream) Unpace() {
	if c := s.c; c != nil {
		c.streaming.Store(false)
		c.pacer = nil
		if c.lazy != nil {
			c.lazy.waiting = nil
		}
	}
}

// Waits reports whether, under Pace, the Pacer's Waiting runs before every wait for the
// socket (a TCP socket: the router's own connections); without it a reader must not gather
// bytes across reads.
func (s Stream) Waits() bool { return s.c != nil && s.c.lazy != nil && s.c.lazy.waiting != nil }

// Interrupt ends the connection's current and later reads with ErrInterrupted (or the
// closed socket's error): its socket is closed. Safe from any goroutine; it never blocks.
func (s Stream) Interrupt() {
	if s.c != nil {
		s.c.interrupt()
	}
}

// Interrupted reports whether Interrupt (or InterruptStreams) closed the connection: it must
// not go back to the pool.
func (s Stream) Interrupted() bool { return s.c != nil && s.c.interrupted.Load() }

// InterruptStreams interrupts every connection being read under Pace, and every one paced
// later (Pace reports false): the drain's hard stop, for streams that must end at once.
func (f *Fleet) InterruptStreams() { f.t.conns.interruptStreams() }

func (s *connSet) interruptStreams() {
	s.stopping.Store(true)
	s.mu.Lock()
	var paced []*upConn
	for c := range s.conns {
		if c.streaming.Load() {
			paced = append(paced, c)
		}
	}
	s.mu.Unlock()
	for _, c := range paced {
		c.interrupt()
	}
}

// interrupt closes the socket under any TLS layer: a blocked read fails at once, and no
// TLS alert is written (which could block).
func (c *upConn) interrupt() {
	c.interrupted.Store(true)
	_ = c.raw.Close()
}

// pacedRead is Read under Pace: the read deadline is the Pacer's Due; a deadline that
// passes asks Woke whether to read on.
func (c *upConn) pacedRead(b []byte) (int, error) {
	for range maxWakes {
		if c.interrupted.Load() {
			return 0, ErrInterrupted
		}
		if err := c.Conn.SetReadDeadline(c.pacer.Due()); err != nil {
			return 0, err
		}
		n, err := c.Conn.Read(b)
		if n > 0 || err == nil {
			c.got += int64(n)
			return n, err
		}
		if c.interrupted.Load() {
			return 0, ErrInterrupted
		}
		if !IsTimeout(err) || !c.pacer.Woke() {
			c.readErr = err
			return 0, err
		}
	}
	return 0, errors.New("a paced read woke too often without data")
}

// maxWakes bounds the wakes of one paced read (each normally a heartbeat); a Pacer whose Due
// does not move on cannot spin for ever.
const maxWakes = 1 << 20

var _ net.Conn = (*upConn)(nil)
