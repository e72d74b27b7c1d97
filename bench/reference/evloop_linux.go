//go:build linux

package reference

import (
	"bytes"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"switchyard/httpfront/fleet"
)

// The event-loop proxy: one goroutine locked to its OS thread, an edge-triggered epoll set
// over every socket, nonblocking reads and writes made as raw system calls (they never
// block, so the runtime need not hand the thread's P away), keep-alive connections on both
// sides. One request at a time per client connection (pipelined requests wait in its
// buffer); each engine answer is relayed as it is read, so a stream's chunks leave as they
// come. Nothing is parsed beyond the framing: the request's head (method, version,
// Content-Length, Transfer-Encoding, Connection) and the answer's (status, Content-Length,
// chunked, Connection).

const (
	// evHeadMax bounds a request's or an answer's head, in bytes.
	evHeadMax = 16 << 10
	// evBodyMax bounds a request's body (its Content-Length), in bytes: 413 above it.
	evBodyMax = 8 << 20
	// evReadSize is the loop's read buffer: one read from an engine, relayed at once.
	evReadSize = 64 << 10
	// evClientBuf is a client connection's first buffer; it grows to a request's size.
	evClientBuf = 4 << 10
	// evEvents is the most events one epoll_wait returns.
	evEvents = 256
)

// epollET is EPOLLET as the uint32 epoll_event.events holds it (syscall's is negative).
const epollET uint32 = 1 << 31

// Kinds of the loop's file descriptors.
const (
	kindListener = iota + 1
	kindWake
	kindClient
	kindUpstream
)

// Body framings of an engine's answer.
const (
	bodyNone = iota
	bodyLength
	bodyChunked
	bodyUntilClose
)

// evConn is one socket of the loop: the listener, the wake pipe, a client or an engine
// connection.
type evConn struct {
	fd   int
	gen  uint32
	kind uint8
	// readable and writable are the edge-triggered readiness: set by an event, cleared by
	// EAGAIN or a short read.
	readable, writable bool
	// rdhup: the peer's FIN was reported; reads go on to it (no short-read shortcut).
	rdhup  bool
	closed bool
	// peer pairs a client with the engine connection serving its request, and back.
	peer *evConn
	// out holds bytes not yet written (a partial write's rest).
	out []byte

	// A client's fields.
	in      []byte // buffered request bytes (the current request first)
	reqEnd  int    // the current request's end in in; 0: none in flight
	retried bool   // the current request was resent once on a new engine connection
	closing bool   // close once out is written
	isHead  bool   // the current request's method is HEAD
	reqKeep bool   // the current request lets the connection stay open
	sent    bool   // some of the current answer reached the client

	// An engine connection's fields.
	engine     int
	connecting bool
	reused     bool // it served an earlier request: a failure before any answer may be a stale keep-alive
	gotResp    bool // some answer byte arrived for the current request
	resp       respFraming
}

// respFraming follows an engine answer's framing to find its end.
type respFraming struct {
	head      []byte // the head's bytes so far, when it spans reads
	inHead    bool
	mode      int
	remain    int64 // bodyLength: bytes left
	chunked   fleet.ChunkedFraming
	keepAlive bool
	isHead    bool
}

// evLoop is the proxy's state, owned by its goroutine.
type evLoop struct {
	epfd    int
	lfd     int
	wakeR   int
	wakeW   int
	engines []syscall.Sockaddr
	next    int
	idle    [][]*evConn // per engine, idle keep-alive connections
	conns   []*evConn   // by fd
	gen     uint32
	buf     []byte
	scratch []byte // the chunked framing's copy of a read
	events  []syscall.EpollEvent
}

// newEvLoop prepares a loop serving on the listening socket lfd (which it owns from now
// on, also on error) in front of engineURLs (http://host:port).
func newEvLoop(lfd int, engineURLs []string) (_ *evLoop, err error) {
	l := &evLoop{epfd: -1, lfd: lfd, wakeR: -1, wakeW: -1, buf: make([]byte, evReadSize), scratch: make([]byte, evReadSize), events: make([]syscall.EpollEvent, evEvents)}
	defer func() {
		if err != nil {
			l.closeAll()
			l.closeWake()
		}
	}()
	for _, u := range engineURLs {
		host := strings.TrimSuffix(strings.TrimPrefix(u, "http://"), "/")
		a, err := net.ResolveTCPAddr("tcp", host)
		if err != nil {
			return nil, fmt.Errorf("cannot resolve engine %q: %w", u, err)
		}
		if ip4 := a.IP.To4(); ip4 != nil {
			sa := &syscall.SockaddrInet4{Port: a.Port}
			copy(sa.Addr[:], ip4)
			l.engines = append(l.engines, sa)
		} else {
			sa := &syscall.SockaddrInet6{Port: a.Port}
			copy(sa.Addr[:], a.IP.To16())
			l.engines = append(l.engines, sa)
		}
	}
	l.idle = make([][]*evConn, len(l.engines))
	if err := syscall.SetNonblock(lfd, true); err != nil {
		return nil, err
	}
	if l.epfd, err = syscall.EpollCreate1(syscall.EPOLL_CLOEXEC); err != nil {
		return nil, err
	}
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC); err != nil {
		return nil, err
	}
	l.wakeR, l.wakeW = p[0], p[1]
	if err := l.add(&evConn{fd: lfd, kind: kindListener}, syscall.EPOLLIN|epollET); err != nil {
		return nil, err
	}
	if err := l.add(&evConn{fd: l.wakeR, kind: kindWake}, syscall.EPOLLIN); err != nil {
		return nil, err
	}
	return l, nil
}

// wake makes run return; any goroutine may call it, once the loop exists.
func (l *evLoop) wake() { _, _ = syscall.Write(l.wakeW, []byte{1}) }

// add registers c with the epoll set and the fd table.
func (l *evLoop) add(c *evConn, events uint32) error {
	l.gen++
	c.gen = l.gen
	for c.fd >= len(l.conns) {
		l.conns = append(l.conns, nil)
	}
	l.conns[c.fd] = c
	ev := syscall.EpollEvent{Events: events, Fd: int32(c.fd), Pad: int32(c.gen)}
	if err := syscall.EpollCtl(l.epfd, syscall.EPOLL_CTL_ADD, c.fd, &ev); err != nil {
		l.conns[c.fd] = nil
		return err
	}
	return nil
}

// run serves until wake, on the calling goroutine locked to its thread (which ends with
// it), then closes every socket.
func (l *evLoop) run() error {
	runtime.LockOSThread() // not unlocked: the thread exits with the goroutine
	defer l.closeAll()
	for {
		n, err := rawEpollWait(l.epfd, l.events)
		if err == syscall.EINTR {
			runtime.Gosched() // a preemption signal woke the wait: let the runtime stop this goroutine (GC, scheduling)
			continue
		}
		if err != nil {
			return fmt.Errorf("epoll_wait: %w", err)
		}
		for i := range l.events[:n] {
			ev := &l.events[i]
			fd := int(ev.Fd)
			if fd >= len(l.conns) {
				continue
			}
			c := l.conns[fd]
			if c == nil || c.gen != uint32(ev.Pad) || c.closed {
				continue // closed earlier in this batch (its fd maybe reused)
			}
			switch c.kind {
			case kindWake:
				return nil
			case kindListener:
				l.accept()
			case kindClient:
				l.clientEvent(c, ev.Events)
			case kindUpstream:
				l.upstreamEvent(c, ev.Events)
			}
		}
	}
}

// closeAll closes every socket the loop holds, the listener, the wake pipe's read end and
// the epoll set. The write end is the stopper's (closeWake), so that a late wake never
// writes to a reused descriptor.
func (l *evLoop) closeAll() {
	for _, c := range l.conns {
		if c != nil && !c.closed && c.kind != kindWake && c.kind != kindListener {
			c.closed = true
			_ = syscall.Close(c.fd)
		}
	}
	l.conns = nil
	for _, fd := range []int{l.lfd, l.wakeR, l.epfd} {
		if fd >= 0 {
			_ = syscall.Close(fd)
		}
	}
	l.lfd, l.wakeR, l.epfd = -1, -1, -1
}

// closeWake closes the wake pipe's write end, once run has returned (or never ran).
func (l *evLoop) closeWake() {
	if l.wakeW >= 0 {
		_ = syscall.Close(l.wakeW)
		l.wakeW = -1
	}
}

// rawEpollWait waits for events without telling the runtime (no entersyscall): the
// thread keeps its P while it sleeps, so sysmon does not hand the P to another thread
// (a futex wake-up and two context switches each time the loop sleeps); a preemption
// signal (GC, sysmon every 10 ms) interrupts the wait with EINTR, and the loop reaches a
// safe point before waiting again.
func rawEpollWait(epfd int, events []syscall.EpollEvent) (int, error) {
	n, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), ^uintptr(0), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func (l *evLoop) accept() {
	for {
		nfd, _, err := syscall.Accept4(l.lfd, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		if err == syscall.EINTR || err == syscall.ECONNABORTED {
			continue
		}
		if err != nil {
			return // EAGAIN: drained; EMFILE and the like: the next connection's edge retries
		}
		_ = syscall.SetsockoptInt(nfd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
		c := &evConn{fd: nfd, kind: kindClient, in: make([]byte, 0, evClientBuf)}
		if err := l.add(c, syscall.EPOLLIN|syscall.EPOLLOUT|syscall.EPOLLRDHUP|epollET); err != nil {
			_ = syscall.Close(nfd)
			continue
		}
		c.writable = true
	}
}

// close closes c (and nothing else).
func (l *evLoop) close(c *evConn) {
	if c.closed {
		return
	}
	c.closed = true
	l.conns[c.fd] = nil
	_ = syscall.Close(c.fd)
}

// closeClient closes a client and the engine connection serving it, if any (its answer is
// unfinished: the connection cannot be reused).
func (l *evLoop) closeClient(c *evConn) {
	if up := c.peer; up != nil {
		up.peer, c.peer = nil, nil
		l.close(up)
	}
	l.close(c)
}

func (l *evLoop) clientEvent(c *evConn, events uint32) {
	if events&syscall.EPOLLERR != 0 {
		l.closeClient(c)
		return
	}
	if events&syscall.EPOLLOUT != 0 {
		c.writable = true
		if len(c.out) > 0 && !l.flushClient(c) {
			return
		}
	}
	if events&(syscall.EPOLLIN|syscall.EPOLLRDHUP|syscall.EPOLLHUP) != 0 {
		c.readable = true
		c.rdhup = c.rdhup || events&(syscall.EPOLLRDHUP|syscall.EPOLLHUP) != 0
	}
	l.clientProgress(c)
}

// flushClient writes c's pending output; false when c was closed. Once it is written, the
// engine answer paused behind it resumes or a closing client is closed.
func (l *evLoop) flushClient(c *evConn) bool {
	for len(c.out) > 0 && c.writable {
		n, e := fleet.SysWrite(uintptr(c.fd), c.out)
		switch {
		case e == syscall.EINTR:
			continue
		case e == syscall.EAGAIN:
			c.writable = false
			return true
		case e != 0:
			l.closeClient(c)
			return false
		}
		c.out = c.out[n:]
	}
	if len(c.out) > 0 {
		return true
	}
	c.out = c.out[:0:0]
	if c.closing && c.peer == nil {
		l.close(c)
		return false
	}
	if up := c.peer; up != nil && up.readable {
		l.upstreamRead(up)
		return !c.closed
	}
	return true
}

// writeClient sends p to c now, keeping what the socket does not take; false when c was
// closed.
func (l *evLoop) writeClient(c *evConn, p []byte) bool {
	if len(c.out) > 0 || !c.writable {
		c.out = append(c.out, p...)
		return true
	}
	for len(p) > 0 {
		n, e := fleet.SysWrite(uintptr(c.fd), p)
		switch {
		case e == syscall.EINTR:
			continue
		case e == syscall.EAGAIN:
			c.writable = false
			c.out = append(c.out, p...)
			return true
		case e != 0:
			l.closeClient(c)
			return false
		}
		p = p[n:]
	}
	return true
}

// clientProgress reads what c sent and starts its next request when none is in flight.
func (l *evLoop) clientProgress(c *evConn) {
	for !c.closed && !c.closing {
		if c.reqEnd == 0 && len(c.out) == 0 && !c.closing {
			if started := l.startRequest(c); started || c.closed {
				continue // read on while the request is in flight: pipelined bytes, or the client's close
			}
		}
		if !c.readable {
			return
		}
		if len(c.in) == cap(c.in) {
			if c.reqEnd > 0 || cap(c.in) >= evHeadMax+evBodyMax {
				return // full behind a request in flight: read on once it is answered
			}
			c.in = append(c.in[:cap(c.in)], make([]byte, cap(c.in))...)[:len(c.in)]
		}
		room := c.in[len(c.in):cap(c.in)]
		n, e := fleet.SysRead(uintptr(c.fd), room)
		switch {
		case e == syscall.EINTR:
			continue
		case e == syscall.EAGAIN:
			c.readable = false
			return
		case e != 0 || n == 0:
			// The client closed (or broke) its connection: mid-request or idle, nothing is
			// left to answer.
			l.closeClient(c)
			return
		}
		c.in = c.in[:len(c.in)+n]
		if n < len(room) && !c.rdhup {
			c.readable = false // a short read drained the socket; new bytes bring a new edge
		}
	}
}

// startRequest forwards c's next buffered request when it is complete; true when one was
// sent to an engine. A malformed or oversized request is answered here and c closed after.
func (l *evLoop) startRequest(c *evConn) bool {
	if len(c.in) == 0 {
		return false
	}
	he := bytes.Index(c.in, []byte("\r\n\r\n"))
	if he < 0 {
		if len(c.in) > evHeadMax {
			l.fail(c, 431, "request header fields too large", "request_too_large")
		}
		return false
	}
	headLen := he + 4
	if headLen > evHeadMax {
		l.fail(c, 431, "request header fields too large", "request_too_large")
		return false
	}
	req, errMsg := parseRequestHead(c.in[:headLen])
	if errMsg != "" {
		status := 400
		if req.status != 0 {
			status = req.status
		}
		l.fail(c, status, errMsg, "invalid_request")
		return false
	}
	if req.length > evBodyMax {
		l.fail(c, 413, "request body too large", "request_too_large")
		return false
	}
	total := headLen + int(req.length)
	if len(c.in) < total {
		if cap(c.in) < total {
			nb := make([]byte, len(c.in), total)
			copy(nb, c.in)
			c.in = nb
		}
		return false
	}
	c.reqEnd, c.isHead, c.reqKeep, c.retried, c.sent = total, req.isHead, req.keepAlive, false, false
	l.forward(c)
	return true
}

// forward sends c's current request to the next engine round robin, on an idle
// keep-alive connection or a new one.
func (l *evLoop) forward(c *evConn) {
	e := l.next
	l.next = (l.next + 1) % len(l.engines)
	var up *evConn
	for idle := l.idle[e]; len(idle) > 0 && up == nil; {
		up, idle = idle[len(idle)-1], idle[:len(idle)-1]
		l.idle[e] = idle
		if up.closed {
			up = nil
		}
	}
	if up == nil {
		var err error
		if up, err = l.dial(e); err != nil {
			l.badGateway(c, "cannot connect to the engine: "+err.Error())
			return
		}
	}
	l.send(c, up)
}

// send hands c's current request to the engine connection up.
func (l *evLoop) send(c *evConn, up *evConn) {
	c.peer, up.peer = up, c
	up.gotResp = false
	up.resp = respFraming{inHead: true, isHead: c.isHead, head: up.resp.head[:0]}
	req := c.in[:c.reqEnd]
	if up.connecting || !up.writable {
		up.out = append(up.out[:0], req...)
		return
	}
	l.writeUpstream(up, req)
}

// writeUpstream writes p to up, keeping what the socket does not take.
func (l *evLoop) writeUpstream(up *evConn, p []byte) {
	for len(p) > 0 {
		n, e := fleet.SysWrite(uintptr(up.fd), p)
		switch {
		case e == syscall.EINTR:
			continue
		case e == syscall.EAGAIN:
			up.writable = false
			up.out = append(up.out[:0], p...)
			return
		case e != 0:
			l.upstreamFailed(up, "cannot write to the engine: "+e.Error())
			return
		}
		p = p[n:]
	}
	up.out = up.out[:0]
}

// dial opens a nonblocking connection to engine e.
func (l *evLoop) dial(e int) (*evConn, error) {
	sa := l.engines[e]
	family := syscall.AF_INET
	if _, ok := sa.(*syscall.SockaddrInet6); ok {
		family = syscall.AF_INET6
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	up := &evConn{fd: fd, kind: kindUpstream, engine: e}
	switch err := syscall.Connect(fd, sa); err {
	case nil:
		up.writable = true
	case syscall.EINPROGRESS:
		up.connecting = true
	default:
		_ = syscall.Close(fd)
		return nil, err
	}
	if err := l.add(up, syscall.EPOLLIN|syscall.EPOLLOUT|syscall.EPOLLRDHUP|epollET); err != nil {
		_ = syscall.Close(fd)
		return nil, err
	}
	return up, nil
}

func (l *evLoop) upstreamEvent(up *evConn, events uint32) {
	if events&syscall.EPOLLOUT != 0 {
		if up.connecting {
			up.connecting = false
			if v, err := syscall.GetsockoptInt(up.fd, syscall.SOL_SOCKET, syscall.SO_ERROR); err != nil || v != 0 {
				msg := "cannot connect to the engine"
				if v != 0 {
					msg += ": " + syscall.Errno(v).Error()
				}
				l.upstreamFailed(up, msg)
				return
			}
		}
		up.writable = true
		if len(up.out) > 0 {
			l.writeUpstream(up, up.out)
			if up.closed {
				return
			}
		}
	}
	if events&(syscall.EPOLLIN|syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
		up.readable = true
		up.rdhup = up.rdhup || events&(syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) != 0
		l.upstreamRead(up)
	}
}

// upstreamRead reads up's answer and relays it to its client as it comes, until the
// socket is drained, the client's socket is full, or the answer ends.
func (l *evLoop) upstreamRead(up *evConn) {
	for up.readable && !up.closed {
		c := up.peer
		if c != nil && len(c.out) > 0 {
			return // the client is slow: read on once its output is written
		}
		n, e := fleet.SysRead(uintptr(up.fd), l.buf)
		switch {
		case e == syscall.EINTR:
			continue
		case e == syscall.EAGAIN:
			up.readable = false
			return
		case e != 0 || n == 0:
			if c != nil && up.resp.mode == bodyUntilClose && !up.resp.inHead {
				l.finish(c, up, false) // the answer ended with the connection
				return
			}
			msg := "the engine closed the connection"
			if e != 0 {
				msg = "cannot read from the engine: " + e.Error()
			}
			l.upstreamFailed(up, msg)
			return
		}
		if n < len(l.buf) && !up.rdhup {
			up.readable = false
		}
		if c == nil {
			l.close(up) // bytes from an idle engine connection: not ours to relay
			return
		}
		up.gotResp = true
		p := l.buf[:n]
		end, done, perr := up.resp.feed(p, l.scratch)
		if perr != "" {
			if !c.sent {
				l.badGateway(c, "invalid answer from the engine: "+perr)
				up.peer, c.peer = nil, nil
				l.close(up)
				return
			}
			l.closeClient(c)
			return
		}
		c.sent = true
		if !l.writeClient(c, p[:end]) {
			return
		}
		if done {
			l.finish(c, up, end == n && up.resp.keepAlive)
			return
		}
	}
}

// finish ends c's exchange with up: up goes back to the idle pool when reusable, and c
// goes on with its next request or closes.
func (l *evLoop) finish(c, up *evConn, reuse bool) {
	up.peer, c.peer = nil, nil
	// An answer that came before the whole request was written leaves the connection
	// mid-request: not reusable.
	if reuse && c.reqKeep && !up.rdhup && len(up.out) == 0 {
		up.reused = true
		l.idle[up.engine] = append(l.idle[up.engine], up)
	} else {
		l.close(up)
	}
	rest := copy(c.in, c.in[c.reqEnd:])
	c.in = c.in[:rest]
	c.reqEnd = 0
	if !c.reqKeep || !up.resp.keepAlive || up.resp.mode == bodyUntilClose {
		c.closing = true
		c.readable = false
	}
	if len(c.out) == 0 {
		if c.closing {
			l.close(c)
			return
		}
		l.clientProgress(c)
	}
}

// upstreamFailed handles an engine connection that broke: a stale keep-alive connection
// that failed before any answer has the request resent once on a new connection; else the
// client gets a 502 if nothing of the answer reached it, or is closed.
func (l *evLoop) upstreamFailed(up *evConn, msg string) {
	c := up.peer
	up.peer = nil
	l.close(up)
	if c == nil {
		return // an idle connection the engine closed
	}
	c.peer = nil
	switch {
	case up.reused && !up.gotResp && !c.retried:
		c.retried = true
		nu, err := l.dial(up.engine)
		if err != nil {
			l.badGateway(c, "cannot connect to the engine: "+err.Error())
			return
		}
		l.send(c, nu)
	case !c.sent:
		l.badGateway(c, msg)
	default:
		l.closeClient(c)
	}
}

// badGateway answers c's current request with 502 and keeps the connection when the
// request allows.
func (l *evLoop) badGateway(c *evConn, msg string) {
	if !l.writeClient(c, errorAnswer(nil, 502, msg, "engine_unavailable", !c.reqKeep)) {
		return
	}
	rest := copy(c.in, c.in[c.reqEnd:])
	c.in, c.reqEnd = c.in[:rest], 0
	if !c.reqKeep {
		c.closing = true
		if len(c.out) == 0 {
			l.close(c)
		}
	}
}

// fail answers a request that cannot be served and closes c once the answer is written.
func (l *evLoop) fail(c *evConn, status int, msg, code string) {
	c.closing, c.readable = true, false
	if !l.writeClient(c, errorAnswer(nil, status, msg, code, true)) {
		return
	}
	if len(c.out) == 0 {
		l.close(c)
	}
}

// errorAnswer appends an HTTP/1.1 answer with an OpenAI-style error body to dst.
func errorAnswer(dst []byte, status int, msg, code string, closeConn bool) []byte {
	body := fmt.Appendf(nil, `{"error":{"message":%s,"type":"proxy_error","code":%s}}`, strconv.Quote(msg), strconv.Quote(code))
	dst = fmt.Appendf(dst, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", status, statusText(status), len(body))
	if closeConn {
		dst = append(dst, "Connection: close\r\n"...)
	}
	dst = append(dst, "\r\n"...)
	return append(dst, body...)
}

func statusText(status int) string {
	switch status {
	case 400:
		return "Bad Request"
	case 413:
		return "Content Too Large"
	case 431:
		return "Request Header Fields Too Large"
	case 501:
		return "Not Implemented"
	case 502:
		return "Bad Gateway"
	case 505:
		return "HTTP Version Not Supported"
	}
	return "Error"
}

// reqHead is what the loop needs of a request's head.
type reqHead struct {
	length    int64
	isHead    bool
	keepAlive bool
	status    int // the answer to a request refused with a status other than 400
}

// parseRequestHead reads a request head (the request line and header lines, up to and
// including the empty line); a non-empty message refuses it.
func parseRequestHead(h []byte) (reqHead, string) {
	var r reqHead
	line, rest, _ := bytes.Cut(h, []byte("\r\n"))
	method, line, ok1 := bytes.Cut(line, []byte(" "))
	_, version, ok2 := bytes.Cut(line, []byte(" "))
	if !ok1 || !ok2 || len(method) == 0 {
		return r, "malformed request line"
	}
	switch string(version) {
	case "HTTP/1.1":
		r.keepAlive = true
	case "HTTP/1.0":
	default:
		r.status = 505
		return r, "unsupported HTTP version"
	}
	r.isHead = string(method) == "HEAD"
	sawLength := false
	for len(rest) > 2 {
		line, rest, _ = bytes.Cut(rest, []byte("\r\n"))
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || len(name) == 0 || bytes.IndexByte(name, ' ') >= 0 || bytes.IndexByte(name, '\t') >= 0 {
			return r, "malformed header line"
		}
		value = bytes.TrimSpace(value)
		switch {
		case asciiEqualFold(name, "content-length"):
			n, err := strconv.ParseInt(string(value), 10, 64)
			if err != nil || n < 0 || (sawLength && n != r.length) {
				return r, "invalid Content-Length"
			}
			r.length, sawLength = n, true
		case asciiEqualFold(name, "transfer-encoding"):
			r.status = 501
			return r, "chunked request bodies are not supported; send Content-Length"
		case asciiEqualFold(name, "connection"):
			if hasToken(value, "close") {
				r.keepAlive = false
			} else if hasToken(value, "keep-alive") {
				r.keepAlive = true
			}
		}
	}
	return r, ""
}

// feed follows the answer through p, the next bytes read from the engine (scratch, at
// least as long, is overwritten): end is how many of them belong to the answer, done
// whether it ended there; a non-empty message is a framing error.
func (f *respFraming) feed(p, scratch []byte) (end int, done bool, errMsg string) {
	i := 0
	for i < len(p) {
		if f.inHead {
			n, complete, msg := f.feedHead(p[i:])
			if msg != "" {
				return 0, false, msg
			}
			i += n
			if f.inHead {
				if complete {
					continue // an interim answer: the final one's head follows
				}
				return i, false, ""
			}
			if f.mode == bodyNone {
				return i, true, ""
			}
			continue
		}
		switch f.mode {
		case bodyLength:
			take := int64(len(p) - i)
			if take > f.remain {
				take = f.remain
			}
			i += int(take)
			f.remain -= take
			if f.remain == 0 {
				return i, true, ""
			}
		case bodyUntilClose:
			return len(p), false, ""
		case bodyChunked:
			n, fin, err := f.chunked.Feed(p[i:], scratch)
			if err != nil {
				return 0, false, err.Error()
			}
			i += n
			if fin {
				return i, true, ""
			}
			return i, false, ""
		}
	}
	return i, false, ""
}

// feedHead consumes head bytes from p: n is how many belong to the head, complete whether
// it ended there.
func (f *respFraming) feedHead(p []byte) (n int, complete bool, errMsg string) {
	var head []byte
	if len(f.head) == 0 {
		if e := bytes.Index(p, []byte("\r\n\r\n")); e >= 0 {
			head, n = p[:e+4], e+4 // fast path: the whole head in this read
		}
	}
	if head == nil {
		// slow path: the head spans reads
		old := len(f.head)
		f.head = append(f.head, p...)
		e := bytes.Index(f.head, []byte("\r\n\r\n"))
		if e < 0 {
			if len(f.head) > evHeadMax {
				return 0, false, "answer head too large"
			}
			return len(p), false, ""
		}
		head, n = f.head[:e+4], e+4-old
	}
	if len(head) > evHeadMax {
		return 0, false, "answer head too large"
	}
	msg := f.parseHead(head)
	f.head = f.head[:0]
	return n, true, msg
}

// parseHead reads an answer's head and sets the body framing.
func (f *respFraming) parseHead(h []byte) string {
	line, rest, _ := bytes.Cut(h, []byte("\r\n"))
	version, line, ok := bytes.Cut(line, []byte(" "))
	if !ok || len(line) < 3 || !bytes.HasPrefix(version, []byte("HTTP/1.")) {
		return "malformed status line"
	}
	status, err := strconv.Atoi(string(line[:3]))
	if err != nil || status < 100 {
		return "malformed status line"
	}
	f.keepAlive = string(version) == "HTTP/1.1"
	length, chunked, other := int64(-1), false, false
	for len(rest) > 2 {
		line, rest, _ = bytes.Cut(rest, []byte("\r\n"))
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return "malformed header line"
		}
		value = bytes.TrimSpace(value)
		switch {
		case asciiEqualFold(name, "content-length"):
			n, err := strconv.ParseInt(string(value), 10, 64)
			if err != nil || n < 0 || (length >= 0 && n != length) {
				return "invalid Content-Length"
			}
			length = n
		case asciiEqualFold(name, "transfer-encoding"):
			if hasToken(value, "chunked") {
				chunked = true
			} else {
				other = true
			}
		case asciiEqualFold(name, "connection"):
			if hasToken(value, "close") {
				f.keepAlive = false
			} else if hasToken(value, "keep-alive") {
				f.keepAlive = true
			}
		}
	}
	f.inHead = false
	switch {
	case status >= 100 && status < 200 && status != 101:
		f.inHead = true // an interim answer: the final one follows
	case f.isHead || status == 204 || status == 304:
		f.mode = bodyNone
	case chunked && !other:
		f.mode, f.chunked = bodyChunked, fleet.ChunkedFraming{}
	case other || status == 101 || length < 0:
		f.mode = bodyUntilClose
	case length == 0:
		f.mode = bodyNone
	default:
		f.mode, f.remain = bodyLength, length
	}
	return ""
}

// asciiEqualFold reports whether b equals the lower-case s, ignoring ASCII case.
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// hasToken reports whether the comma-separated list v holds the lower-case token t.
func hasToken(v []byte, t string) bool {
	for len(v) > 0 {
		var tok []byte
		tok, v, _ = bytes.Cut(v, []byte(","))
		if asciiEqualFold(bytes.TrimSpace(tok), t) {
			return true
		}
	}
	return false
}
