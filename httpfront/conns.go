package httpfront

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"switchyard/httpfront/fleet"
	"switchyard/httpfront/hangup"
)

// Accept backoff when the process is out of file descriptors, as net/http does: 5 ms,
// doubling, at most 1 s, until a descriptor is free again.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// evictScan bounds the connections looked at to find one to evict, so that a full table
// costs the same at every accept.
const evictScan = 64

// maxLingeringRejects bounds the refused connections closed lingering at once; beyond it a
// refused connection is closed at once.
const maxLingeringRejects = 64

// defaultMaxConnections is the connection cap where the open-file limit is unknown.
const defaultMaxConnections = 10000

// Why a connection was refused, as the metric labels it.
const (
	refusedMax   = "max_connections"
	refusedPerIP = "max_connections_per_ip"
)

// clientListener accepts the fasthttp server's client connections. It never gives up on an
// exhausted descriptor table (EMFILE, ENFILE): it frees an idle connection and retries with
// backoff. It caps the open connections, in all (server.max_connections) and per client
// address (server.max_connections_per_ip): at the overall cap a new connection takes the
// place of an idle one (opened without a request yet, the oldest first, or between
// keep-alive requests), else it is refused with a 503 answer; so is one past its address's
// cap. It tracks every connection so that the end of a drain can close them all.
type clientListener struct {
	net.Listener
	logger       *slog.Logger
	max, perIP   int
	writeTimeout time.Duration

	refused      [2]*metrics.Counter // by refusedMax, refusedPerIP
	evicted      *metrics.Counter
	acceptErrors *metrics.Counter

	done      chan struct{} // closed by Close
	closeOnce sync.Once

	mu    sync.Mutex
	conns map[*clientConn]struct{}
	byIP  map[netip.Addr]int
	// empty, when set, is closed once no connection is open (waitClosed).
	empty chan struct{}

	// lingering limits the refused connections closing lingering; bg waits for them.
	lingering chan struct{}
	bg        sync.WaitGroup
	// rejectBody is the answer to a refused connection, by reason.
	rejectBody [2][]byte
	// poller watches the connections for clients that leave while their requests are
	// dispatched (abort.go); set before Serve, nil when aborts are off or it cannot run.
	poller *hangup.Poller
}

// newClientListener wraps ln. maxConns 0 means half the open-file limit.
func newClientListener(ln net.Listener, maxConns, perIP int, writeTimeout time.Duration, set *metrics.Set,
	logger *slog.Logger) *clientListener {
	if maxConns <= 0 {
		maxConns = defaultMaxConnections
		if n := openFileLimit(); n > 0 {
			maxConns = int(max(n/2, 1))
		}
	}
	l := &clientListener{
		Listener:     ln,
		logger:       logger,
		max:          maxConns,
		perIP:        perIP,
		writeTimeout: writeTimeout,
		done:         make(chan struct{}),
		conns:        make(map[*clientConn]struct{}),
		byIP:         make(map[netip.Addr]int),
		lingering:    make(chan struct{}, maxLingeringRejects),
		evicted:      set.NewCounter(metricConnsEvicted),
		acceptErrors: set.NewCounter(metricAcceptErrors + `{reason="fd_exhausted"}`),
	}
	for i, reason := range [...]string{refusedMax, refusedPerIP} {
		l.refused[i] = set.NewCounter(metricConnsRefused + `{reason="` + reason + `"}`)
		msg := "the router has too many open connections (server.max_connections " + strconv.Itoa(l.max) + "); retry later"
		if reason == refusedPerIP {
			msg = "too many open connections from your address (server.max_connections_per_ip " + strconv.Itoa(perIP) + ")"
		}
		l.rejectBody[i] = rejectResponse(newAPIError(CodeTooManyConnections, msg))
	}
	set.NewGauge(metricClientConns, func() float64 {
		l.mu.Lock()
		defer l.mu.Unlock()
		return float64(len(l.conns))
	})
	return l
}

// rejectResponse is a whole HTTP response carrying e, closing the connection.
func rejectResponse(e *apiError) []byte {
	body := appendErrorJSON(nil, e)
	b := []byte("HTTP/1.1 " + strconv.Itoa(e.status()) + " " + fasthttp.StatusMessage(e.status()) + "\r\n" +
		"Content-Type: application/json\r\nConnection: close\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n")
	return append(b, body...)
}

// Accept returns the next admitted connection. Running out of descriptors is retried (see
// acceptBackoffMin); only a closed listener or another failure ends it.
func (l *clientListener) Accept() (net.Conn, error) {
	var delay time.Duration
	failures := 0
	for {
		raw, err := l.Listener.Accept()
		if err != nil {
			if !fleet.IsResourceExhaustion(err) {
				return nil, err
			}
			// Slow path: out of descriptors. Free one if an idle connection holds it.
			l.acceptErrors.Inc()
			if failures == 0 {
				l.logger.Warn("cannot accept connections: out of file descriptors; retrying",
					slog.Any("error", err), slog.Int("open_connections", l.open()))
			}
			failures++
			l.evictOne()
			delay = min(max(2*delay, acceptBackoffMin), acceptBackoffMax)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-l.done:
				t.Stop()
				return nil, net.ErrClosed
			}
			continue
		}
		if failures > 0 {
			l.logger.Info("accepting connections again", slog.Int("failed_attempts", failures))
			failures, delay = 0, 0
		}
		if c := l.admit(raw); c != nil {
			return c, nil
		}
	}
}

// admit tracks raw, or refuses it (answered and closed) when a cap is reached.
func (l *clientListener) admit(raw net.Conn) *clientConn {
	c := &clientConn{Conn: raw, owner: l, since: time.Now().UnixNano()}
	if s := fleet.NewSocket(raw); s != nil {
		c.Conn = s // reads and writes without the scheduler's system-call bookkeeping
	}
	if ta, ok := raw.RemoteAddr().(*net.TCPAddr); ok {
		c.ip = ta.AddrPort().Addr().Unmap()
	}
	l.mu.Lock()
	refused := -1
	switch {
	case l.perIP > 0 && c.ip.IsValid() && l.byIP[c.ip] >= l.perIP:
		refused = 1
	case len(l.conns) >= l.max:
		// Slow path: the table is full; an idle connection makes room.
		if v := l.victimLocked(); v != nil {
			l.forgetLocked(v)
			l.evicted.Inc() // counted before the client sees its connection end
			v.abort()
		} else {
			refused = 0
		}
	}
	if refused < 0 {
		l.conns[c] = struct{}{}
		if c.ip.IsValid() {
			l.byIP[c.ip]++
		}
	}
	l.mu.Unlock()
	if refused >= 0 {
		l.refused[refused].Inc()
		l.reject(raw, l.rejectBody[refused])
		return nil
	}
	return c
}

// victimLocked picks an idle connection to evict among up to evictScan of them: the oldest
// that has not sent a request yet, else one between keep-alive requests; nil when none is
// idle. l.mu must be held.
func (l *clientListener) victimLocked() *clientConn {
	var fresh, idle *clientConn
	n := 0
	for c := range l.conns {
		switch c.state.Load() {
		case connNew:
			if fresh == nil || c.since < fresh.since {
				fresh = c
			}
		case connIdle:
			if idle == nil {
				idle = c
			}
		}
		if n++; n == evictScan {
			break
		}
	}
	if fresh != nil {
		return fresh
	}
	return idle
}

// evictOne closes one idle connection, if any, to free its descriptor.
func (l *clientListener) evictOne() {
	l.mu.Lock()
	v := l.victimLocked()
	if v != nil {
		l.forgetLocked(v)
	}
	l.mu.Unlock()
	if v != nil {
		l.evicted.Inc() // counted before the client sees its connection end
		v.abort()
	}
}

// reject answers a refused connection with resp and closes it, lingering on a goroutine
// (bounded by maxLingeringRejects) so that the client reads the answer.
func (l *clientListener) reject(c net.Conn, resp []byte) {
	select {
	case l.lingering <- struct{}{}:
	default:
		_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		_, _ = c.Write(resp)
		_ = c.Close()
		return
	}
	l.bg.Add(1)
	go func() {
		defer l.bg.Done()
		defer func() { <-l.lingering }()
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := c.Write(resp); err == nil {
			lingerDrain(c, time.Second)
		}
		_ = c.Close()
	}()
}

// forgetLocked drops c from the counts; l.mu must be held. It reports whether c was there.
func (l *clientListener) forgetLocked(c *clientConn) bool {
	if _, ok := l.conns[c]; !ok {
		return false
	}
	delete(l.conns, c)
	if len(l.conns) == 0 && l.empty != nil {
		close(l.empty)
		l.empty = nil
	}
	if c.ip.IsValid() {
		if n := l.byIP[c.ip] - 1; n > 0 {
			l.byIP[c.ip] = n
		} else {
			delete(l.byIP, c.ip)
		}
	}
	return true
}

// release forgets a closed connection.
func (l *clientListener) release(c *clientConn) {
	l.mu.Lock()
	l.forgetLocked(c)
	l.mu.Unlock()
}

func (l *clientListener) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// track is the fasthttp ConnState hook: it records a connection's state for eviction,
// without a lock.
func (l *clientListener) track(c net.Conn, state fasthttp.ConnState) {
	cc, ok := c.(*clientConn)
	if !ok {
		return
	}
	switch state {
	case fasthttp.StateActive:
		cc.state.Store(connActive)
	case fasthttp.StateIdle:
		cc.state.Store(connIdle)
	}
}

// Close stops accepting (the fasthttp server's Shutdown calls it). Open connections stay.
func (l *clientListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// closeIdle closes at once every connection that is not serving a request.
func (l *clientListener) closeIdle() {
	l.mu.Lock()
	var idle []*clientConn
	for c := range l.conns {
		if c.state.Load() != connActive {
			idle = append(idle, c)
		}
	}
	l.mu.Unlock()
	for _, c := range idle {
		c.abort()
	}
}

// waitClosed waits until no connection is open, or ctx is done; it reports which.
func (l *clientListener) waitClosed(ctx context.Context) bool {
	l.mu.Lock()
	if len(l.conns) == 0 {
		l.mu.Unlock()
		return true
	}
	if l.empty == nil {
		l.empty = make(chan struct{})
	}
	ch := l.empty
	l.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// closeAll closes every open connection at once, lingering ones included, and waits for
// the refused connections still closing.
func (l *clientListener) closeAll() {
	l.mu.Lock()
	conns := make([]*clientConn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	for _, c := range conns {
		c.abort()
	}
	l.bg.Wait()
}
