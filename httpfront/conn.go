package httpfront

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"switchyard/httpfront/fleet"
	"switchyard/httpfront/hangup"
)

// Lingering close: after an answer sent before the request body was read (413, 401, 503 at
// the connection cap, ...), the connection is half-closed and what the client still sends
// is read and dropped, up to these bounds, before it is closed. Closing a socket with unread
// input makes the kernel answer with a reset, which destroys the answer on the client side
// before a client that writes its whole body first (Python requests) reads it.
const (
	lingerMaxBytes = 64 << 20
	lingerTimeout  = 5 * time.Second
)

// Client connection states, as the tracker sees them.
const (
	connNew    int32 = iota // accepted; no request byte yet
	connActive              // a request is being read or answered
	connIdle                // between keep-alive requests
)

// clientConn is one accepted client connection, over its fleet.Socket (raw system calls)
// when it is a TCP connection. It moves deadlines lazily (see fleet.LazyDeadline), bounds
// every write by server.write_timeout and by a limit a stream sets (its request deadline),
// records its state for the tracker, and closes lingering when an answer was sent before the
// request body was read. The zero value around a net.Conn is
// usable: no write bound, no tracking.
//
// One goroutine at a time reads, writes and moves deadlines, so the deadline state takes no
// lock: fasthttp's goroutine serving the connection, then, for a stream that takes the
// connection over, the hijack handler's goroutine (fasthttp starts it after its last
// deadline move) and the stream's (started by the Close after the handler). The listener's
// TLS is none (engines' connections have their own). Close and abort may come from any
// goroutine; they touch atomics and the socket only.
type clientConn struct {
	net.Conn
	owner *clientListener // nil: untracked
	ip    netip.Addr      // the client address per-IP caps count; invalid when unknown
	since int64           // accept time, unix nanoseconds (the oldest idle connection goes first)
	state atomic.Int32
	// linger asks Close to half-close and drain before closing (lingerMaxBytes, lingerTimeout).
	linger atomic.Bool
	closed atomic.Bool

	// hup is the connection's watch state on the poller (abort.go): used by the goroutine
	// serving the connection's requests.
	hup hangup.Conn

	// pending is what the client sent after a request whose stream was relayed on a taken-over
	// connection (relay.hijacked), read before the socket when the connection serves
	// requests again (also the first bytes of the request awaitRequest waited for); only the
	// goroutine serving the connection touches it. pendingBuf is the pooled buffer pending
	// lies in, returned once pending is read.
	pending    []byte
	pendingBuf *[]byte
	// handoff is a stream that took the connection over (relay.hijacked): fasthttp's Close
	// after its hijack handler starts it instead of closing.
	handoff atomic.Pointer[relay]

	r, w fleet.LazyDeadline
	// limit is an absolute write deadline set by a stream (its request deadline); zero: none.
	limit time.Time
}

var _ net.Conn = (*clientConn)(nil)

func (c *clientConn) SetReadDeadline(t time.Time) error {
	if c.r.Set(t) {
		return c.Conn.SetReadDeadline(t)
	}
	return nil
}

// setReadDeadlineNow arms t on the socket at once, also when it is later than the armed
// deadline or zero: a watch of the raw socket (hangup) must see the deadline it sets, not a
// past one left armed by a deadline moved lazily.
func (c *clientConn) setReadDeadlineNow(t time.Time) error {
	c.r.Want, c.r.Armed = t, t
	return c.Conn.SetReadDeadline(t)
}

func (c *clientConn) SetWriteDeadline(t time.Time) error {
	if c.w.Set(t) {
		return c.Conn.SetWriteDeadline(t)
	}
	return nil
}

func (c *clientConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

func (c *clientConn) Read(b []byte) (int, error) {
	if len(c.pending) > 0 {
		// Slow path: pipelined bytes kept from before a stream took the connection over.
		n := copy(b, c.pending)
		if c.pending = c.pending[n:]; len(c.pending) == 0 {
			c.pending = nil
			putBuf(c.pendingBuf)
			c.pendingBuf = nil
		}
		return n, nil
	}
	for {
		n, err := c.Conn.Read(b)
		if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
		if !c.r.Fired(c.Conn.SetReadDeadline) {
			return n, err
		}
	}
}

// awaitRequest waits up to idle for the client's next request on a connection a stream took
// over, as fasthttp waits on a keep-alive connection (server.idle_timeout), and reports
// whether its first bytes came: they are kept in pending, read before the socket, and the
// request then has server.read_timeout from there, as on any connection. False: the client
// closed the connection, or idle passed first.
func (c *clientConn) awaitRequest(idle time.Duration) bool {
	if len(c.pending) > 0 {
		return true // pipelined behind the stream's request
	}
	if c.SetReadDeadline(time.Now().Add(idle)) != nil {
		return false
	}
	buf := getBuf()
	n, _ := c.Read((*buf)[:cap(*buf)])
	if n == 0 {
		putBuf(buf)
		return false
	}
	c.pending, c.pendingBuf = (*buf)[:n], buf
	return true
}

// setWriteLimit bounds every later write by t as well (zero clears the limit).
func (c *clientConn) setWriteLimit(t time.Time) {
	c.limit = t
	if c.w.Arm(t) {
		_ = c.Conn.SetWriteDeadline(t)
	}
}

// writeDeadline is the deadline of a write that started at bound-writeTimeout: the earliest
// of the deadline last set, the stream's limit and bound; zero is none.
func (c *clientConn) writeDeadline(bound time.Time) time.Time {
	dl := c.w.Want
	for _, t := range [...]time.Time{c.limit, bound} {
		if !t.IsZero() && (dl.IsZero() || t.Before(dl)) {
			dl = t
		}
	}
	return dl
}

// Write writes b, failing with os.ErrDeadlineExceeded when the client takes more than the
// write timeout (or past the stream's limit or the deadline last set) to take it.
func (c *clientConn) Write(b []byte) (int, error) {
	var bound time.Time
	if c.owner != nil && c.owner.writeTimeout > 0 {
		bound = time.Now().Add(c.owner.writeTimeout)
	}
	if dl := c.writeDeadline(bound); c.w.Arm(dl) {
		if err := c.Conn.SetWriteDeadline(dl); err != nil {
			return 0, err
		}
	}
	done := 0
	for {
		n, err := c.Conn.Write(b[done:])
		done += n
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return done, err
		}
		// An earlier write's deadline fired: arm this write's, unless it has passed.
		dl := c.writeDeadline(bound)
		more := !dl.IsZero() && time.Now().Before(dl) || dl.IsZero() && !c.w.Armed.IsZero()
		if more {
			c.w.Armed = dl
			more = c.Conn.SetWriteDeadline(dl) == nil
		}
		if !more {
			return done, err
		}
	}
}

// lingerOnClose makes the next Close half-close and drain the input first.
func (c *clientConn) lingerOnClose() { c.linger.Store(true) }

// Close closes the connection, lingering first when asked (see lingerMaxBytes), and
// releases its place in the tracker. Later calls do nothing. The Close fasthttp makes after
// the hijack handler of a connection a stream took over (handoff) starts the stream instead.
func (c *clientConn) Close() error {
	if r := c.handoff.Swap(nil); r != nil {
		// fasthttp is done with a connection a stream took over: the stream starts.
		go r.serve()
		return nil
	}
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	if c.linger.Load() {
		lingerDrain(c.Conn, lingerTimeout)
	}
	err := c.Conn.Close()
	if c.owner != nil {
		if c.owner.poller != nil {
			c.owner.poller.Forget(&c.hup)
		}
		c.owner.release(c)
	}
	return err
}

// abort closes the socket at once, without lingering; a Close in progress (lingering) ends,
// and the tracker releases the connection there.
func (c *clientConn) abort() { _ = c.Conn.Close() }

// lingerDrain half-closes c (the client reads everything sent, then end of stream) and
// reads and drops its input until the client closes, lingerMaxBytes were read or timeout
// passed.
func lingerDrain(c net.Conn, timeout time.Duration) {
	type closeWriter interface{ CloseWrite() error }
	cw, ok := c.(closeWriter)
	if !ok || cw.CloseWrite() != nil {
		return
	}
	if c.SetReadDeadline(time.Now().Add(timeout)) != nil {
		return
	}
	buf := getBuf()
	b := (*buf)[:cap(*buf)]
	for n := 0; n < lingerMaxBytes; {
		m, err := c.Read(b)
		n += m
		if err != nil {
			break
		}
	}
	putBuf(buf)
}
