package fleet

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
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
	// waiting, when set (a paced stream, Stream.Pace), runs Waiting before a read waits for
	// the socket: nothing is left to read; false fails the read (errWaitRefused). rc is the
	// socket's raw connection, for reads that can run it.
	waiting waiter
	rc      syscall.RawConn
	// rd is the read in progress in waitingRead, for rawRead, the function rc runs (made
	// once a connection, rawReadFn): a read allocates nothing.
	rd        rawReadState
	rawReadFn func(fd uintptr) bool
}

// waiter is what a paced read runs before it waits: Pacer's Waiting.
type waiter interface{ Waiting() bool }

// rawReadState is one read of waitingRead: its buffer, and what the system calls returned.
type rawReadState struct {
	b    []byte
	n    int
	err  error
	told bool // Waiting ran
}

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
			n, err = c.waitingRead(b)
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

// waitingRead reads b from the socket as the runtime does (a read; on EAGAIN a wait for the
// socket, bounded by the read deadline; a read again), running waiting once before it waits.
// It makes no system call more than a plain read.
func (c *lazyConn) waitingRead(b []byte) (int, error) {
	if c.rawReadFn == nil {
		c.rawReadFn = c.rawRead
	}
	c.rd = rawReadState{b: b}
	rerr := c.rc.Read(c.rawReadFn)
	n, err := c.rd.n, c.rd.err
	c.rd = rawReadState{} // the caller's buffer is not kept
	switch {
	case rerr != nil:
		return 0, rerr
	case err != nil:
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError("read", err)}
	case n == 0 && len(b) > 0:
		return 0, io.EOF
	}
	return n, nil
}

// rawRead is the function the raw connection runs for waitingRead (c.rd): one read, and
// Waiting before the first wait.
func (c *lazyConn) rawRead(fd uintptr) bool {
	rd := &c.rd
	for {
		rd.n, rd.err = syscall.Read(int(fd), rd.b)
		if rd.err != syscall.EINTR {
			break
		}
	}
	if rd.err != syscall.EAGAIN {
		return true
	}
	if !rd.told {
		rd.told = true
		if !c.waiting.Waiting() {
			rd.err = errWaitRefused
			return true
		}
	}
	return false
}
