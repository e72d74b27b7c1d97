package fleet

import (
	"errors"
	"net"
	"os"
	"time"
)

// LazyDeadline is one direction's deadlines on a connection: Want, the one last set, and
// Armed, the one armed on the socket; zero is none. The router's client connections and its
// engine connections both move deadlines through one.
//
// fasthttp moves a keep-alive connection's deadlines on every request (a server's read
// deadline twice, a client's write and read deadline, the response-header deadline and the
// request's own again), and every move is a runtime timer update: a measurable part of the
// cost of a small request. Here a deadline later than the armed one is only recorded; when
// the armed deadline fires first, the read or write re-arms the recorded deadline and
// carries on (Fired), so an operation still times out exactly at the deadline last set. A
// deadline earlier than the armed one is armed at once. Successive requests' deadlines
// usually grow, so a busy connection arms about one deadline per timeout period instead of
// several per request.
//
// A LazyDeadline is not safe for concurrent use; its owner serializes the calls.
type LazyDeadline struct{ Want, Armed time.Time }

// Set records t and reports whether it must be armed now: it is earlier than the armed
// deadline, or none is armed. A later or cleared deadline waits for the armed one to fire.
func (d *LazyDeadline) Set(t time.Time) bool {
	d.Want = t
	return d.Arm(t)
}

// Arm reports whether t must be armed now (it is earlier than the armed deadline, or none is
// armed) and records it as armed if so.
func (d *LazyDeadline) Arm(t time.Time) bool {
	if t.IsZero() || !d.Armed.IsZero() && !t.Before(d.Armed) {
		return false
	}
	d.Armed = t
	return true
}

// Fired handles the armed deadline firing and reports whether the operation goes on: the
// deadline last set (or none) is armed with arm, unless it has passed as well.
func (d *LazyDeadline) Fired(arm func(time.Time) error) bool {
	if d.Want.Equal(d.Armed) {
		return false // the deadline last set is the one that fired
	}
	d.Armed = d.Want
	if err := arm(d.Want); err != nil {
		return false
	}
	return d.Want.IsZero() || time.Now().Before(d.Want)
}

// lazyConn is an engine connection's socket with lazy deadlines (LazyDeadline), below TLS
// for https:// workers: a deadline armed for an earlier request that fires is handled here,
// so TLS never sees it (a TLS write that timed out leaves the connection unusable).
//
// Like upConn it is used by one goroutine at a time: fasthttp hands a connection to one
// request at a time, and the request (or its body stream's reader) sets deadlines and reads
// and writes in turn. Close may come from any goroutine; it touches no deadline state.
type lazyConn struct {
	net.Conn
	r, w LazyDeadline
	// sock is the connection's Socket (Conn itself) when it is one: a TCP socket, the
	// router's own. waiting, when set (a paced stream, Stream.Pace; only with sock), runs
	// Waiting before a read waits for the socket: nothing is left to read; false fails the
	// read (errWaitRefused).
	sock    *Socket
	waiting waiter
}

// newLazyConn returns c with lazy deadlines, its reads and writes through a Socket when c is
// a TCP connection.
func newLazyConn(c net.Conn) *lazyConn {
	if s := NewSocket(c); s != nil {
		return &lazyConn{Conn: s, sock: s}
	}
	return &lazyConn{Conn: c}
}

// waiter is what a paced read runs before it waits: Pacer's Waiting.
type waiter interface{ Waiting() bool }

func (c *lazyConn) SetReadDeadline(t time.Time) error {
	if c.r.Set(t) {
		return c.Conn.SetReadDeadline(t)
	}
	return nil
}

func (c *lazyConn) SetWriteDeadline(t time.Time) error {
	if c.w.Set(t) {
		return c.Conn.SetWriteDeadline(t)
	}
	return nil
}

func (c *lazyConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// Read reads into b; a deadline that fired and is not the one last set is re-armed and the
// read goes on (at most once: the re-armed one is the one last set).
func (c *lazyConn) Read(b []byte) (int, error) {
	for {
		var n int
		var err error
		if c.waiting != nil {
			n, err = c.sock.read(b, c.waiting)
		} else {
			n, err = c.Conn.Read(b)
		}
		if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) || !c.r.Fired(c.Conn.SetReadDeadline) {
			return n, err
		}
	}
}

// Write writes b; a deadline that fired and is not the one last set is re-armed and the rest
// of b is written.
func (c *lazyConn) Write(b []byte) (int, error) {
	done := 0
	for {
		n, err := c.Conn.Write(b[done:])
		done += n
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) || !c.w.Fired(c.Conn.SetWriteDeadline) {
			return done, err
		}
	}
}

// errWaitRefused fails a read whose waiting hook said not to wait.
var errWaitRefused = errors.New("the stream's reader ended the read before waiting")
