package httpfront

import (
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// resumeIdle is how long a warm goroutine waits for a connection to serve before it ends (as
// fasthttp's own workers: its MaxIdleWorkerDuration, 10 s).
const resumeIdle = 10 * time.Second

// resumers serve client connections again after a stream (relay.serve) on warm goroutines.
// A stream is written on a fresh goroutine (a held stream keeps its stack shallow); the
// request that follows on the connection would grow that stack, copying it, to what a
// request's handling takes. Instead the connection goes to an idle warm goroutine (one that
// has served requests before), which serves it with fasthttp's ServeConn until the
// connection closes or is taken over by the next stream; when no warm goroutine is idle, the
// stream's goroutine serves it and becomes one. An idle warm goroutine ends after resumeIdle
// or at close; while serving, it ends with its connection (the drain closes them all).
type resumers struct {
	srv  *fasthttp.Server
	next chan *clientConn // unbuffered: a send succeeds only into an idle warm goroutine
	stop chan struct{}    // closed by close: idle goroutines end
	idle time.Duration

	// mu orders a goroutine becoming warm (wg.Add) before close's wait.
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

func newResumers(srv *fasthttp.Server, idle time.Duration) *resumers {
	return &resumers{srv: srv, next: make(chan *clientConn), stop: make(chan struct{}), idle: idle}
}

// serve serves cc's requests on an idle warm goroutine, or on the calling goroutine, which
// then stays as a warm one until it has been idle for p.idle. After close, cc is closed.
func (p *resumers) serve(cc *clientConn) {
	select {
	case p.next <- cc:
		// Fast path: a warm goroutine took it.
		return
	default:
	}
	p.mu.Lock()
	closed := p.closed
	if !closed {
		p.wg.Add(1)
	}
	p.mu.Unlock()
	if closed {
		_ = cc.Close()
		return
	}
	defer p.wg.Done()
	var t *time.Timer
	for {
		_ = p.srv.ServeConn(cc)
		if t == nil {
			t = time.NewTimer(p.idle)
		} else {
			t.Reset(p.idle)
		}
		select {
		case cc = <-p.next:
		case <-t.C:
			return
		case <-p.stop:
			t.Stop()
			return
		}
	}
}

// close ends the idle warm goroutines and waits for every one; a connection a goroutine
// serves must be closed (so that ServeConn returns) for close to return.
func (p *resumers) close() {
	p.mu.Lock()
	already := p.closed
	p.closed = true
	p.mu.Unlock()
	if !already {
		close(p.stop)
	}
	p.wg.Wait()
}
