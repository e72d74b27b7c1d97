package fleet

import (
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
)

// Socket is one of the router's own TCP connections (an accepted client connection, an
// engine connection under any TLS) whose reads and writes make their system calls raw.
//
// The runtime's own socket read (net.Conn) makes its read(2) through syscall.Syscall, which
// tells the scheduler the goroutine has entered a system call and, after it, that it has
// left: a system call that looked long on a loaded machine has its P retaken by sysmon and
// handed to another thread, and sysmon sleeps and threads are woken for it. A socket here is
// nonblocking (the runtime's netpoller waits for it), so its reads and writes never block:
// the scheduler need not know. Socket runs them through the socket's syscall.RawConn with
// syscall.RawSyscall: the RawConn takes the same descriptor lock, checks the same deadlines
// and waits on the netpoller when a call reports EAGAIN, exactly as net.Conn's Read and
// Write do; only the scheduler's bookkeeping around each call is gone. Errors are the ones
// net.Conn returns (io.EOF; a deadline's os.ErrDeadlineExceeded, a closed socket's
// net.ErrClosed and the system call's errno inside a *net.OpError).
//
// Under the race detector the calls go through syscall.Read and syscall.Write instead:
// theirs are the annotations that tell the detector that a write to a socket happens before
// the read of it in the same process.
//
// A read and a write keep their state in the Socket (the functions the RawConn runs are made
// once per connection), so they allocate nothing. Like net.Conn's, reads (and writes) may
// come from several goroutines at once (a lingering close drains a connection while its
// serving goroutine's read waits): the one that finds the Socket's read state taken makes
// the runtime's own read instead, which waits for the other on the descriptor's lock. Close
// and the deadlines are the TCP connection's, safe from any goroutine.
type Socket struct {
	*net.TCPConn
	rc syscall.RawConn
	// rd and wr are the read and the write in progress; readFn and writeFn the functions rc
	// runs for them (rawRead, rawWrite).
	rd, wr          rawOp
	readFn, writeFn func(fd uintptr) bool
	// reading and writing say that rd and wr are taken by a read and a write in progress.
	reading, writing atomic.Bool
}

// rawOp is one read or write of a Socket: its buffer, what the system calls did, and for a
// read the hook run before it waits.
type rawOp struct {
	b     []byte
	n     int
	errno syscall.Errno
	err   error  // set by the read's hook (errWaitRefused), or a write that wrote nothing
	wait  waiter // a read's Waiting hook (a paced stream's); nil: none
	told  bool   // wait ran
}

// maxRW bounds one read system call, as the runtime's own do (1 GiB).
const maxRW = 1 << 30

// maxRawWrite bounds one write system call: a raw one cannot be preempted, so a garbage
// collection's stop waits for its copy; 256 KiB copies in tens of microseconds. A larger
// write is continued by the same loop.
const maxRawWrite = 256 << 10

// NewSocket returns c's Socket, or nil when c is not a *net.TCPConn (a test's pipe, a
// connection a DialFunc wrapped) or the system has no raw socket calls (not Unix): use c as
// it is then.
func NewSocket(c net.Conn) *Socket {
	tc, ok := c.(*net.TCPConn)
	if !ok || !rawSockets {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	s := &Socket{TCPConn: tc, rc: rc}
	s.readFn, s.writeFn = s.rawRead, s.rawWrite
	return s
}

// Read reads into b, as net.Conn's Read does.
func (s *Socket) Read(b []byte) (int, error) { return s.read(b, nil) }

// read reads into b; when the socket has nothing to read, w's Waiting (when w is not nil)
// runs once before the read waits, and its false fails the read with errWaitRefused. It
// makes the system calls a plain read makes.
func (s *Socket) read(b []byte, w waiter) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	if !s.reading.CompareAndSwap(false, true) {
		// Slow path: another goroutine's read is in progress (w, for paced reads, which
		// have one goroutine, does not run here).
		return s.TCPConn.Read(b)
	}
	if len(b) > maxRW {
		b = b[:maxRW]
	}
	s.rd = rawOp{b: b, wait: w}
	rerr := s.rc.Read(s.readFn)
	op := s.rd
	s.rd = rawOp{} // the caller's buffer and hook are not kept
	s.reading.Store(false)
	switch {
	case rerr != nil:
		return 0, s.opError("read", rerr)
	case op.err != nil:
		return 0, op.err
	case op.errno != 0:
		return 0, s.errnoError("read", op.errno)
	case op.n == 0:
		return 0, io.EOF
	}
	return op.n, nil
}

// rawRead is the function the RawConn runs for a read (s.rd): one read(2), retried after
// EINTR; false (wait for the socket) on EAGAIN, after the hook.
func (s *Socket) rawRead(fd uintptr) bool {
	op := &s.rd
	for {
		n, errno := SysRead(fd, op.b)
		switch errno {
		case 0:
			op.n = n
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			if op.wait != nil && !op.told {
				op.told = true
				if !op.wait.Waiting() {
					op.err = errWaitRefused
					return true
				}
			}
			return false
		}
		op.errno = errno
		return true
	}
}

// Write writes all of b, as net.Conn's Write does: the socket's partial writes are
// continued after a wait for room; a deadline or an error returns what was written.
func (s *Socket) Write(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	if !s.writing.CompareAndSwap(false, true) {
		// Slow path: another goroutine's write is in progress.
		return s.TCPConn.Write(b)
	}
	s.wr = rawOp{b: b}
	werr := s.rc.Write(s.writeFn)
	op := s.wr
	s.wr = rawOp{}
	s.writing.Store(false)
	switch {
	case werr != nil:
		return op.n, s.opError("write", werr)
	case op.err != nil:
		return op.n, s.opError("write", op.err)
	case op.errno != 0:
		return op.n, s.errnoError("write", op.errno)
	}
	return op.n, nil
}

// rawWrite is the function the RawConn runs for a write (s.wr): write(2) until all of it is
// written, retried after EINTR; false (wait for room) on EAGAIN.
func (s *Socket) rawWrite(fd uintptr) bool {
	op := &s.wr
	for op.n < len(op.b) {
		b := op.b[op.n:]
		if len(b) > maxRawWrite {
			b = b[:maxRawWrite]
		}
		n, errno := SysWrite(fd, b)
		switch errno {
		case 0:
			if n == 0 {
				op.err = io.ErrUnexpectedEOF // as the runtime's write reports it
				return true
			}
			op.n += n
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			op.errno = errno
			return true
		}
	}
	return true
}

// opError is err (the RawConn's: a deadline, a closed socket) as net.Conn's Read or Write
// returns it: a *net.OpError of op with both addresses.
func (s *Socket) opError(op string, err error) error {
	if oe, ok := err.(*net.OpError); ok {
		oe.Op, oe.Source = op, s.LocalAddr() // the RawConn's own error: no copy needed
		return oe
	}
	return &net.OpError{Op: op, Net: "tcp", Source: s.LocalAddr(), Addr: s.RemoteAddr(), Err: err}
}

// errnoError is a failed system call as net.Conn's Read or Write returns it.
func (s *Socket) errnoError(op string, errno syscall.Errno) error {
	return &net.OpError{Op: op, Net: "tcp", Source: s.LocalAddr(), Addr: s.RemoteAddr(), Err: os.NewSyscallError(op, errno)}
}
