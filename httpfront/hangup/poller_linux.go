//go:build linux

package hangup

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
)

// Connections are found by file descriptor: a directory of lazily made chunks.
const (
	chunkBits = 10
	chunkSize = 1 << chunkBits
	dirSize   = 1 << 11 // with chunkSize: descriptors below 2M
)

// A watch's state.
const (
	stIdle   uint32 = iota // no watch
	stArmed                // a watch waits for the peer
	stFiring               // Gone runs
	stFired                // Gone has run; Stop reports the hang-up
	stEnded                // bytes arrived: the watch is over without a hang-up
	stMask   uint32 = 7
	// flagEdge: a hang-up edge was seen while no watch was armed; the next Watch looks.
	flagEdge uint32 = 8
	// epollET is EPOLLET as the events field's type.
	epollET uint32 = 1 << 31
)

// Poller watches many connections for their peers hanging up with one goroutine and one
// epoll instance: a connection is added once (edge-triggered, hang-up events only: bytes
// arriving wake nothing), and a watch is armed and disarmed with atomics, without a system
// call or a goroutine per watch.
type Poller struct {
	epfd  int
	wake  [2]int // a pipe: a byte written to wake[1] ends the loop
	dir   [dirSize]atomic.Pointer[[chunkSize]atomic.Pointer[Conn]]
	mu    sync.Mutex // making chunks (once per 1,024 descriptors)
	done  chan struct{}
	close sync.Once
}

// Conn is one connection's watch state, kept by the connection's owner (Watch and Stop are
// called by one goroutine at a time). The zero value is a connection not yet added.
type Conn struct {
	fd     int32 // the descriptor plus one; 0: not added yet, -1: cannot be watched
	state  atomic.Uint32
	target Target
	// fired carries one token per Gone run; Stop takes it, so that Stop returns after Gone.
	fired chan struct{}
}

// Target is told that a watched connection's peer has hung up.
type Target interface {
	// Gone runs on the Poller's goroutine (or on Watch's caller, for a hang-up that came
	// before the watch); it must be short and must not block.
	Gone()
}

// NewPoller starts a Poller's goroutine; Close stops it.
func NewPoller() (*Poller, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	p := &Poller{epfd: epfd, done: make(chan struct{})}
	if err := syscall.Pipe2(p.wake[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC); err != nil {
		_ = syscall.Close(epfd)
		return nil, err
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(p.wake[0])}
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, p.wake[0], &ev); err != nil {
		p.closeFDs()
		return nil, err
	}
	go p.loop()
	return p, nil
}

func (p *Poller) closeFDs() {
	_ = syscall.Close(p.wake[0])
	_ = syscall.Close(p.wake[1])
	_ = syscall.Close(p.epfd)
}

// Close stops the Poller's goroutine and waits for it. Armed watches never fire afterwards;
// Stop still works on them.
func (p *Poller) Close() error {
	p.close.Do(func() {
		_, _ = syscall.Write(p.wake[1], []byte{1})
		<-p.done
		p.closeFDs()
	})
	return nil
}

// loop waits for hang-up edges until Close.
func (p *Poller) loop() {
	defer close(p.done)
	var events [128]syscall.EpollEvent
	for {
		n, err := syscall.EpollWait(p.epfd, events[:], -1)
		if err != nil {
			if err == syscall.EINTR {
				continue
			}
			return // the epoll descriptor is unusable: nothing more can be watched
		}
		for i := range n {
			fd := int(events[i].Fd)
			if fd == p.wake[0] {
				return
			}
			p.edge(fd)
		}
	}
}

// entry returns fd's entry, making its chunk when create is true; nil when fd is out of
// range or its chunk does not exist.
func (p *Poller) entry(fd int, create bool) *atomic.Pointer[Conn] {
	if fd < 0 || fd >= chunkSize*dirSize {
		return nil
	}
	d := &p.dir[fd>>chunkBits]
	c := d.Load()
	if c == nil {
		if !create {
			return nil
		}
		p.mu.Lock()
		if c = d.Load(); c == nil {
			c = new([chunkSize]atomic.Pointer[Conn])
			d.Store(c)
		}
		p.mu.Unlock()
	}
	return &c[fd&(chunkSize-1)]
}

// edge handles a hang-up edge on fd: an armed watch looks at the socket; otherwise the
// edge is remembered for the connection's next Watch. An edge of a connection closed
// meanwhile (its descriptor another's) only costs a look at the socket.
func (p *Poller) edge(fd int) {
	e := p.entry(fd, false)
	if e == nil {
		return
	}
	pc := e.Load()
	if pc == nil {
		return
	}
	for range 4 { // each retry follows a transition by Watch or Stop, at most a few
		old := pc.state.Load()
		if old&stMask != stArmed {
			if pc.state.CompareAndSwap(old, old|flagEdge) {
				return
			}
			continue
		}
		switch peek(fd) {
		case peerGone:
			pc.fire()
		case peerData:
			pc.state.CompareAndSwap(stArmed, stEnded)
		}
		return
	}
}

// fire runs the target's Gone once, if the watch is still armed.
func (pc *Conn) fire() {
	if !pc.state.CompareAndSwap(stArmed, stFiring) {
		return // stopped meanwhile
	}
	pc.target.Gone()
	pc.state.Store(stFired)
	pc.fired <- struct{}{} // never blocks: one token per fire, taken by Stop before the next
}

// peek results.
const (
	peerQuiet = iota // nothing to read: still there
	peerData         // bytes to read: still there (a pipelined request)
	peerGone         // an orderly close, a reset, or no longer a socket
)

// peek looks at fd without consuming anything.
func peek(fd int) int {
	var b [1]byte
	for range 4 {
		n, _, err := syscall.Recvfrom(fd, b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return peerQuiet
		case err != nil || n == 0:
			return peerGone
		}
		return peerData
	}
	return peerQuiet
}

// Watch arms a watch of c's peer until Stop: t.Gone runs once if the peer closes or resets
// the connection while armed. Bytes arriving (a pipelined request) end the watch without a
// hang-up. The first Watch of a connection adds it to the poller (one system call); later
// ones are atomics only. Watch reports false (nothing armed) when c cannot be watched;
// nothing may read c until Stop.
func (p *Poller) Watch(pc *Conn, c net.Conn, t Target) bool {
	if pc.fd == 0 && !p.add(pc, c) {
		pc.fd = -1
	}
	if pc.fd < 0 {
		return false
	}
	pc.target = t
	if old := pc.state.Swap(stArmed); old&flagEdge != 0 && peek(int(pc.fd-1)) == peerGone {
		// Slow path: the peer hung up before the watch (its edge found no watch armed).
		pc.fire()
	}
	return true
}

// add adds c's descriptor to the poller, for pc.
func (p *Poller) add(pc *Conn, c net.Conn) bool {
	rc := rawConn(c)
	if rc == nil {
		return false
	}
	fd := -1
	if rc.Control(func(s uintptr) { fd = int(s) }) != nil {
		return false
	}
	e := p.entry(fd, true)
	if e == nil {
		return false
	}
	pc.fired = make(chan struct{}, 1)
	e.Store(pc)
	ev := syscall.EpollEvent{Events: syscall.EPOLLRDHUP | epollET, Fd: int32(fd)}
	err := syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_ADD, fd, &ev)
	if errors.Is(err, syscall.EEXIST) {
		err = syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_MOD, fd, &ev)
	}
	if err != nil {
		e.CompareAndSwap(pc, nil)
		return false
	}
	pc.fd = int32(fd) + 1
	return true
}

// Stop disarms the watch Watch armed on pc and reports whether the peer hung up (Gone has
// then returned).
func (p *Poller) Stop(pc *Conn) (gone bool) {
	for range 4 { // each retry follows a transition by the poller, at most a few
		old := pc.state.Load()
		switch old & stMask {
		case stArmed:
			if !pc.state.CompareAndSwap(old, stIdle) {
				continue
			}
		case stFiring, stFired:
			<-pc.fired
			pc.state.Store(stIdle)
			gone = true
		default: // stEnded, or already idle; an edge may still be flagged
			if !pc.state.CompareAndSwap(old, old&flagEdge) {
				continue
			}
		}
		break
	}
	pc.target = nil
	return gone
}

// Forget drops pc from the poller when its connection closes (the kernel drops the
// descriptor from the epoll instance by itself).
func (p *Poller) Forget(pc *Conn) {
	if pc.fd > 0 {
		if e := p.entry(int(pc.fd-1), false); e != nil {
			e.CompareAndSwap(pc, nil)
		}
	}
}
