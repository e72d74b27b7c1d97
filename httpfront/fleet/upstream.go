package fleet

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"switchyard/config"
	"switchyard/load"
)

// DialFunc opens a TCP connection to addr within timeout (net.Dialer's DialTimeout by
// default). The lifecycle adds TLS, connection tracking and the header deadline on top.
type DialFunc func(network, addr string, timeout time.Duration) (net.Conn, error)

// defaultDial is DialFunc with TCP keep-alive probes.
func defaultDial(network, addr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	return d.Dial(network, addr)
}

// probeConns bounds a worker's health, introspection and load-poll connections, kept apart
// from its inference connections so that a full inference pool never fails a health check.
const probeConns = 4

// ErrorKind says who a failed dispatch is charged to.
type ErrorKind uint8

const (
	// KindTransport: the engine refused, reset or closed the connection without an answer.
	KindTransport ErrorKind = iota
	// KindTimeout: the engine did not accept a connection, send its response headers, or
	// answer within the request's deadline.
	KindTimeout
	// KindConnLimit: every connection the router may open to the engine is busy
	// (upstream.max_conns_per_worker). The router's fault, not the engine's.
	KindConnLimit
	// KindResources: the router could not open a connection (no file descriptor, no local
	// port, no buffer space). The router's fault, not the engine's.
	KindResources
)

// RouterSide reports whether the router, not the engine, is answerable for the failure.
func (k ErrorKind) RouterSide() bool { return k == KindConnLimit || k == KindResources }

// MetricLabel is the kind's label in the router-error and upstream-error metrics.
func (k ErrorKind) MetricLabel() string {
	switch k {
	case KindTimeout:
		return "timeout"
	case KindConnLimit:
		return "connection_limit"
	case KindResources:
		return "out_of_resources"
	}
	return "transport"
}

// Error is a failed exchange with an engine.
type Error struct {
	Kind ErrorKind
	// Detail says what happened in words for the client ("did not send its response
	// headers within 1m0s").
	Detail string
	Err    error
}

func (e *Error) Error() string { return e.Detail + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// dialError is a failure to open a connection.
type dialError struct {
	timeout time.Duration
	err     error
	// certAsked: the engine asked for a client certificate the router does not have.
	certAsked bool
}

func (e *dialError) Error() string { return "cannot connect: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// transport is what every worker's upstream shares: the settings, the dial seam, the TLS
// configuration and the set of live connections.
type transport struct {
	set   config.Upstream
	dial  DialFunc
	tls   *tls.Config
	conns connSet
	// auth is the Authorization value of upstream.api_key ("Bearer KEY"); nil without one.
	auth []byte
	// routerErrors counts failures the router caused, by kind.
	routerErrors [KindResources + 1]*metrics.Counter
}

// Upstream is one worker's HTTP client: a pool of inference connections and a small pool of
// probe connections (health checks, introspection, load polls) to the same engine, made by
// one dial function, so that TLS (https:// workers) and timeouts apply to every request the
// router sends it. A request that fails on a reused connection before any response byte
// arrived was never started by the engine: it is sent again once on a fresh connection.
// Safe for concurrent use.
type Upstream struct {
	t        *transport
	hostPort string
	tls      *tls.Config // nil for http://
	client   *fasthttp.HostClient
	probe    *fasthttp.HostClient
	stale    *metrics.Counter
	// cancels are the cancellable dispatches in flight (Cancellable).
	cancels cancels
}

func newUpstream(t *transport, hostPort, serverName string, isTLS bool, own *tls.Config, stale *metrics.Counter) *Upstream {
	u := &Upstream{t: t, hostPort: hostPort, stale: stale}
	if isTLS {
		switch {
		case own != nil:
			u.tls = own.Clone()
		case t.tls != nil:
			u.tls = t.tls.Clone()
		default:
			u.tls = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		if u.tls.ServerName == "" {
			u.tls.ServerName = serverName
		}
		if len(u.tls.Certificates) == 0 && u.tls.GetClientCertificate == nil {
			// No client certificate: show none, but note that the engine asked for one, so
			// that the failure that follows can say why.
			u.tls.GetClientCertificate = func(cri *tls.CertificateRequestInfo) (*tls.Certificate, error) {
				if n, ok := cri.Context().Value(handshakeKey{}).(*handshakeNote); ok {
					n.certAsked = true
				}
				return &tls.Certificate{}, nil
			}
		}
	}
	never := func(*fasthttp.Request, int, error) (bool, bool) { return false, false }
	u.client = &fasthttp.HostClient{
		Addr:                          hostPort,
		Name:                          "switchyard",
		NoDefaultUserAgentHeader:      true,
		MaxConns:                      t.set.MaxConnsPerWorker,
		MaxResponseBodySize:           t.maxAnswer(), // buffered answers; streamBody frames its own
		MaxConnWaitTimeout:            0,             // a full pool fails at once (KindConnLimit)
		MaxIdleConnDuration:           t.set.MaxIdleConnDuration,
		ConnPoolStrategy:              fasthttp.LIFO, // the warmest connection first; idle ones age out
		DisablePathNormalizing:        true,
		DisableHeaderNamesNormalizing: false,
		ReadBufferSize:                4 << 10,
		WriteBufferSize:               16 << 10,
		DialTimeout:                   u.dialer(t.set.ResponseHeaderTimeout),
		RetryIfErr:                    never,             // Do retries a stale connection itself
		Transport:                     streamTransport{}, // streamed answers decoded by streamBody
	}
	u.probe = &fasthttp.HostClient{
		Addr:                     hostPort,
		Name:                     "switchyard-probe",
		NoDefaultUserAgentHeader: true,
		MaxConns:                 probeConns,
		MaxResponseBodySize:      t.maxAnswer(), // buffered answers; load.Fetch bounds its streamed ones
		MaxConnWaitTimeout:       time.Second,
		MaxIdleConnDuration:      t.set.MaxIdleConnDuration,
		ConnPoolStrategy:         fasthttp.LIFO,
		DisablePathNormalizing:   true,
		DialTimeout:              u.dialer(0),
		RetryIfErr:               never,
	}
	return u
}

// authorizationKey is the canonical Authorization header name.
var authorizationKey = []byte(fasthttp.HeaderAuthorization)

// newTransport returns the transport of set: the upstream.api_key header built once.
func newTransport(set config.Upstream, dial DialFunc, tlsCfg *tls.Config) *transport {
	if set.MaxResponseBytes <= 0 {
		set.MaxResponseBytes = config.Default().Upstream.MaxResponseBytes // a settings literal
	}
	t := &transport{set: set, dial: dial, tls: tlsCfg}
	if set.APIKey != "" {
		t.auth = []byte("Bearer " + set.APIKey)
	}
	return t
}

// maxAnswer is the bound of an answer read whole (upstream.max_response_bytes): fasthttp
// refuses a larger Content-Length before it allocates, and a chunked answer as it grows past
// it. Without it, one answer announcing 64 GiB makes the runtime abort the process.
func (t *transport) maxAnswer() int { return int(min(t.set.MaxResponseBytes, 1<<30)) }

// HostPort is the engine's host:port (the Host header of every request to it).
func (u *Upstream) HostPort() string { return u.hostPort }

// Do sends an inference request and waits for its response headers (the body too unless
// resp.StreamBody) until deadline. A failure is an *Error.
func (u *Upstream) Do(req *fasthttp.Request, resp *fasthttp.Response, deadline time.Time) error {
	return u.do(u.client, req, resp, deadline)
}

// Probe is the Doer of the worker's health checks, introspection and load polls.
func (u *Upstream) Probe() load.Doer { return probeDoer{u} }

type probeDoer struct{ u *Upstream }

var _ load.Doer = probeDoer{}

func (p probeDoer) DoDeadline(req *fasthttp.Request, resp *fasthttp.Response, deadline time.Time) error {
	if p.u.tls != nil && string(req.URI().Scheme()) == "https" {
		// The dial makes the TLS connection; the client must see the plain scheme it serves.
		req.URI().SetScheme("http")
	}
	return p.u.do(p.u.probe, req, resp, deadline)
}

// CloseIdle closes the worker's idle connections.
func (u *Upstream) CloseIdle() {
	u.client.CloseIdleConnections()
	u.probe.CloseIdleConnections()
}

func (u *Upstream) do(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response, deadline time.Time) error {
	if u.t.auth != nil {
		// The workers' key (sgl-router's --api-key) replaces whatever the client sent.
		req.Header.SetCanonical(authorizationKey, u.t.auth)
	}
	err := hc.DoDeadline(req, resp, deadline)
	if err == nil {
		return nil
	}
	c := connOf(resp)
	if c != nil && c.stale() && !IsTimeout(err) {
		// Slow path: the engine closed the connection while it idled in the pool (uvicorn
		// does after 5 s) and never saw the request. The other idle connections are older
		// still: close them, and send the request again on a fresh connection.
		u.stale.Inc()
		hc.CloseIdleConnections()
		if err = hc.DoDeadline(req, resp, deadline); err == nil {
			return nil
		}
		c = connOf(resp)
	}
	e := u.classify(err, c)
	if e.Kind.RouterSide() {
		u.t.routerErrors[e.Kind].Inc()
	}
	return e
}

// classify says whose failure err (on connection c, nil when none was used) is.
func (u *Upstream) classify(err error, c *upConn) *Error {
	var de *dialError
	switch {
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		return &Error{Kind: KindConnLimit, Err: err,
			Detail: fmt.Sprintf("all %d connections the router may open to the engine are busy (upstream.max_conns_per_worker)", u.t.set.MaxConnsPerWorker)}
	case errors.As(err, &de) && IsResourceExhaustion(de.err):
		return &Error{Kind: KindResources, Err: err, Detail: "the router cannot open a connection to the engine"}
	case errors.As(err, &de) && IsTimeout(de.err):
		return &Error{Kind: KindTimeout, Err: err, Detail: "did not accept a connection within " + de.timeout.String()}
	case errors.As(err, &de) && de.certAsked:
		return &Error{Kind: KindTransport, Err: err, Detail: noClientCert}
	case errors.As(err, &de) && isTLSFailure(de.err):
		return &Error{Kind: KindTransport, Err: err, Detail: "failed the TLS handshake (upstream.tls)"}
	case errors.As(err, &de):
		return &Error{Kind: KindTransport, Err: err, Detail: "cannot be reached"}
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return &Error{Kind: KindTransport, Err: err,
			Detail: fmt.Sprintf("answered more than %d bytes (upstream.max_response_bytes)", u.t.maxAnswer())}
	case c != nil && c.headerTimedOut:
		return &Error{Kind: KindTimeout, Err: err, Detail: "sent no response headers within " + c.ttfb.String() + " (upstream.response_header_timeout)"}
	case IsTimeout(err):
		return &Error{Kind: KindTimeout, Err: err, Detail: "did not answer in time"}
	case c != nil && c.certAsked && c.requests == 1 && c.got == 0:
		// TLS 1.3: the handshake completes before the engine checks the certificate; its
		// refusal comes as an alert, or a closed connection, in answer to the request.
		return &Error{Kind: KindTransport, Err: cmp.Or(c.readErr, err), Detail: noClientCert}
	case isTLSFailure(err):
		return &Error{Kind: KindTransport, Err: err, Detail: "refused the router's TLS connection (upstream.tls)"}
	case c != nil && isTLSFailure(c.readErr):
		// The engine's alert: fasthttp reports any failure of the first read as a closed
		// connection.
		return &Error{Kind: KindTransport, Err: c.readErr, Detail: "refused the router's TLS connection (upstream.tls)"}
	}
	return &Error{Kind: KindTransport, Err: err, Detail: "failed"}
}

// isTLSFailure reports a failed TLS handshake or an alert from the engine: an unknown
// authority, a certificate for another name, a missing or refused client certificate.
func isTLSFailure(err error) bool {
	var (
		alert    tls.AlertError
		verify   *tls.CertificateVerificationError
		record   tls.RecordHeaderError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	return errors.As(err, &alert) || errors.As(err, &verify) || errors.As(err, &record) ||
		errors.As(err, &unknown) || errors.As(err, &hostname) || errors.As(err, &invalid)
}

// IsResourceExhaustion reports a failure of the router's own making: no file descriptor,
// local port or buffer left (a dial or an accept).
func IsResourceExhaustion(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// IsTimeout reports a timeout of any layer (fasthttp, net, deadlines).
func IsTimeout(err error) bool {
	if errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, fasthttp.ErrDialTimeout) ||
		errors.Is(err, fasthttp.ErrTLSHandshakeTimeout) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// dialer returns the HostClient dial function: TCP within upstream.connect_timeout (and
// the request's remaining time), the TLS handshake for https within the same bound, then
// the tracked connection with header deadline headerTimeout (0: none).
func (u *Upstream) dialer(headerTimeout time.Duration) fasthttp.DialFuncWithTimeout {
	return func(addr string, timeout time.Duration) (net.Conn, error) {
		ct := u.t.set.ConnectTimeout
		if timeout > 0 && timeout < ct {
			ct = timeout
		}
		start := time.Now()
		c, err := u.t.dial("tcp", addr, ct)
		if err != nil {
			return nil, &dialError{timeout: ct, err: err}
		}
		raw := c
		lazy := newLazyConn(c)
		c = lazy
		var note handshakeNote
		if u.tls != nil {
			tc := tls.Client(c, u.tls)
			_ = tc.SetDeadline(start.Add(ct))
			// The context carries the note (no deadline: SetDeadline bounds the handshake).
			if err := tc.HandshakeContext(context.WithValue(context.Background(), handshakeKey{}, &note)); err != nil {
				_ = c.Close()
				return nil, &dialError{timeout: ct, err: err, certAsked: note.certAsked}
			}
			_ = tc.SetDeadline(time.Time{})
			c = tc
		}
		uc := u.t.conns.track(c, raw, headerTimeout)
		uc.lazy = lazy
		uc.certAsked = note.certAsked
		uc.cancels = &u.cancels
		return uc, nil
	}
}

// handshakeNote is what a TLS handshake learned that its error does not say.
type handshakeNote struct {
	// certAsked: the engine asked for a client certificate and the router had none.
	certAsked bool
}

// handshakeKey is the context key of a handshake's *handshakeNote.
type handshakeKey struct{}

// noClientCert is the detail of a failure on a connection whose engine asked for a client
// certificate the router does not have.
const noClientCert = "refused the router's TLS connection: it asks for a client certificate, and the router has none (upstream.tls.cert_file and key_file)"

// connSet tracks the live upstream connections, so that a hard stop can close them.
type connSet struct {
	mu    sync.Mutex
	conns map[*upConn]struct{}
	// stopping: InterruptStreams ran; a connection paced later is interrupted at once.
	stopping atomic.Bool
}

func (s *connSet) track(c, raw net.Conn, headerTimeout time.Duration) *upConn {
	uc := &upConn{Conn: c, raw: raw, set: s, ttfb: headerTimeout, raddr: c.RemoteAddr()}
	uc.addr = &connAddr{Addr: c.LocalAddr(), c: uc}
	s.mu.Lock()
	if s.conns == nil {
		s.conns = make(map[*upConn]struct{})
	}
	s.conns[uc] = struct{}{}
	s.mu.Unlock()
	return uc
}

// closeAll closes every live upstream connection: requests on them fail at once.
func (s *connSet) closeAll() {
	s.mu.Lock()
	conns := make([]*upConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// upConn is one upstream connection. It counts the requests sent on it and the response
// bytes read since the latest one began, which tell a request that failed on a connection
// the engine had already closed, and it arms the header deadline: until the first response
// byte, a read deadline later than request start + ttfb is replaced by that one.
//
// The fields are owned by the goroutine the connection currently serves: fasthttp hands a
// connection to one request at a time (the hand-over through its pool orders the accesses)
// and Upstream.do reads them only after the request failed on it; streaming and interrupted
// are atomics (stream.go).
type upConn struct {
	net.Conn
	// raw is the TCP socket under TLS and the lazy deadlines (Stream.Interrupt closes it);
	// lazy is the lazy-deadline layer on it (Pace hooks its waits).
	raw  net.Conn
	lazy *lazyConn
	set  *connSet
	ttfb time.Duration
	addr *connAddr // made once: fasthttp asks for it on every request
	// raddr is the engine's address, read once: fasthttp asks for it on every answer
	// (Response.ParseNetConn), through the TLS and lazy-deadline layers otherwise.
	raddr net.Addr
	// cancels is the registry of the upstream's cancellable dispatches, told of the
	// dispatch each request on the connection carries.
	cancels *cancels

	requests       int   // requests begun on this connection
	inRequest      bool  // a request is being written: nothing read since its first write
	got            int64 // response bytes read since the current request began
	awaiting       bool  // the header deadline applies: no response byte yet
	start          time.Time
	want, header   time.Time // the read deadline asked for; the header deadline armed (zero: none)
	headerTimedOut bool
	readErr        error // the latest failed read's error, as the connection gave it
	// certAsked: the engine asked, in the TLS handshake, for a client certificate the
	// router does not have.
	certAsked bool
	// pacer paces the reads of a streamed response (Stream.Pace); nil: none.
	pacer Pacer
	// streaming: the connection is read under Pace (InterruptStreams reaches it);
	// interrupted: its socket was closed by Interrupt.
	streaming, interrupted atomic.Bool

	closeOnce sync.Once
}

// stale reports whether the latest request failed on a connection that had served an
// earlier one and on which no byte of the answer arrived.
func (c *upConn) stale() bool { return c.requests > 1 && c.got == 0 }

func (c *upConn) Write(b []byte) (int, error) {
	if !c.inRequest {
		c.inRequest = true
		c.requests++
		c.got = 0
		c.headerTimedOut = false
		c.readErr = nil
		if c.ttfb > 0 {
			c.awaiting = true
			c.start = time.Now()
		}
		if c.cancels != nil {
			c.cancels.bindMarked(c, b)
		}
	}
	return c.Conn.Write(b)
}

func (c *upConn) SetReadDeadline(t time.Time) error {
	c.want = t
	if c.awaiting {
		if h := c.start.Add(c.ttfb); t.IsZero() || h.Before(t) {
			c.header = h
			return c.Conn.SetReadDeadline(h)
		}
	}
	c.header = time.Time{}
	return c.Conn.SetReadDeadline(t)
}

func (c *upConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(t)
}

func (c *upConn) Read(b []byte) (int, error) {
	if c.pacer != nil {
		return c.pacedRead(b)
	}
	n, err := c.Conn.Read(b)
	c.inRequest = false
	if n > 0 {
		c.got += int64(n)
		if c.awaiting {
			c.awaiting = false
			if !c.header.IsZero() {
				// The headers have begun: the request's own deadline applies again.
				c.header = time.Time{}
				if derr := c.Conn.SetReadDeadline(c.want); derr != nil && err == nil {
					err = derr
				}
			}
		}
	} else if err != nil {
		c.readErr = err
		if c.awaiting && !c.header.IsZero() && IsTimeout(err) {
			c.headerTimedOut = true
		}
	}
	return n, err
}

func (c *upConn) Close() error {
	c.closeOnce.Do(func() {
		c.set.mu.Lock()
		delete(c.set.conns, c)
		c.set.mu.Unlock()
	})
	return c.Conn.Close()
}

// LocalAddr returns the connection's local address, which also carries the connection: it is
// how Upstream.do finds, through fasthttp.Response.LocalAddr, the connection a failed
// request used.
func (c *upConn) LocalAddr() net.Addr { return c.addr }

// RemoteAddr returns the engine's address.
func (c *upConn) RemoteAddr() net.Addr { return c.raddr }

type connAddr struct {
	net.Addr
	c *upConn
}

// connOf returns the connection resp was (or was to be) read from, or nil.
func connOf(resp *fasthttp.Response) *upConn {
	if a, ok := resp.LocalAddr().(*connAddr); ok {
		return a.c
	}
	return nil
}
