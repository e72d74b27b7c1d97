package fleet

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"switchyard/config"
	"switchyard/load"
)

// keepAliveServer is an engine written with net/http (not the router's client library): it
// keeps idle keep-alive connections until the test calls closeIdle, as uvicorn closes them
// after its keep-alive timeout, and can hold answers, answer slowly or hang up.
type keepAliveServer struct {
	srv  *http.Server
	addr string

	mu    sync.Mutex
	conns map[net.Conn]http.ConnState

	accepted atomic.Int64
	requests atomic.Int64
	// hangUp, when set, makes the next request's connection close without an answer.
	hangUp atomic.Bool
	// hold, when set, makes every answer wait for it to close.
	hold chan struct{}
	// slowBody streams the body in chunks this far apart.
	slowBody time.Duration
	// arrived receives (without blocking) when a request has been read.
	arrived chan struct{}
	// idled receives (without blocking) when a connection turns idle.
	idled chan struct{}
}

func newKeepAliveServer(t *testing.T, tlsCfg *tls.Config) *keepAliveServer {
	t.Helper()
	s := &keepAliveServer{conns: map[net.Conn]http.ConnState{}, arrived: make(chan struct{}, 64), idled: make(chan struct{}, 64)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ConnState: s.track, IdleTimeout: time.Hour, TLSConfig: tlsCfg,
		ErrorLog: log.New(io.Discard, "", 0)} // refused handshakes are part of the tests
	done := make(chan struct{})
	go func() {
		defer close(done)
		if tlsCfg != nil {
			_ = s.srv.ServeTLS(ln, "", "")
		} else {
			_ = s.srv.Serve(ln)
		}
	}()
	t.Cleanup(func() {
		if s.hold != nil {
			select {
			case <-s.hold:
			default:
				close(s.hold)
			}
		}
		_ = s.srv.Close()
		<-done
	})
	return s
}

func (s *keepAliveServer) track(c net.Conn, st http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch st {
	case http.StateNew:
		s.accepted.Add(1)
		s.conns[c] = st
	case http.StateClosed, http.StateHijacked:
		delete(s.conns, c)
	default:
		s.conns[c] = st
		if st == http.StateIdle {
			select {
			case s.idled <- struct{}{}:
			default:
			}
		}
	}
}

// closeIdle closes the idle connections once every open one is idle (a connection turns
// idle just after its answer is written), and returns how many it closed.
func (s *keepAliveServer) closeIdle() int {
	deadline := time.After(5 * time.Second)
	for {
		s.mu.Lock()
		busy := 0
		for _, st := range s.conns {
			if st != http.StateIdle {
				busy++
			}
		}
		if busy == 0 {
			n := len(s.conns)
			for c := range s.conns {
				_ = c.Close()
				delete(s.conns, c)
			}
			s.mu.Unlock()
			return n
		}
		s.mu.Unlock()
		select {
		case <-s.idled:
		case <-deadline:
			return 0
		}
	}
}

func (s *keepAliveServer) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	s.requests.Add(1)
	select {
	case s.arrived <- struct{}{}:
	default:
	}
	if s.hangUp.CompareAndSwap(true, false) {
		c, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = c.Close()
		}
		return
	}
	if s.hold != nil {
		<-s.hold
	}
	pace := s.slowBody
	switch r.URL.Path {
	case "/hang": // no answer until the client hangs up
		<-r.Context().Done()
		return
	case "/slow":
		pace = slowPathPace
	}
	if pace > 0 {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 4 {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(pace) // the engine's pace, not a wait for a condition
		}
		return
	}
	fmt.Fprint(w, `{"ok":true}`)
}

// testUpstream is an Upstream to addr with settings set (defaults filled) and dial.
func testUpstream(t *testing.T, addr string, set config.Upstream, dial DialFunc, tlsCfg *tls.Config) (*Upstream, *transport) {
	t.Helper()
	d := config.Default().Upstream
	if set.MaxIdleConnDuration == 0 {
		set.MaxIdleConnDuration = d.MaxIdleConnDuration
	}
	if set.ConnectTimeout == 0 {
		set.ConnectTimeout = d.ConnectTimeout
	}
	if set.MaxConnsPerWorker == 0 {
		set.MaxConnsPerWorker = d.MaxConnsPerWorker
	}
	if set.MaxResponseBytes == 0 {
		set.MaxResponseBytes = d.MaxResponseBytes
	}
	if dial == nil {
		dial = defaultDial
	}
	ms := metrics.NewSet()
	tr := newTransport(set, dial, tlsCfg)
	for k := KindConnLimit; k <= KindResources; k++ {
		tr.routerErrors[k] = ms.NewCounter(MetricRouterErrors + `{kind="` + k.MetricLabel() + `"}`)
	}
	host, _, _ := net.SplitHostPort(addr)
	u := newUpstream(tr, addr, host, tlsCfg != nil, nil, ms.NewCounter(MetricStaleRetries))
	t.Cleanup(func() {
		u.CloseIdle()
		tr.conns.closeAll()
	})
	return u, tr
}

// slowPathPace is the gap between the 4 events the engine streams for path /slow.
const slowPathPace = 400 * time.Millisecond

// post sends one POST through u and returns its status and body.
func post(u *Upstream, stream bool, deadline time.Duration) (int, string, error) {
	return postTo(u, "/v1/chat/completions", stream, deadline)
}

// postTo is post to path: /slow streams 4 events slowPathPace apart, /hang never answers.
func postTo(u *Upstream, path string, stream bool, deadline time.Duration) (int, string, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(path)
	req.Header.SetHost(u.HostPort())
	req.SetBodyString(`{"model":"m"}`)
	resp.StreamBody = stream
	if err := u.Do(req, resp, time.Now().Add(deadline)); err != nil {
		return 0, "", err
	}
	if stream {
		b, err := io.ReadAll(resp.BodyStream())
		_ = resp.CloseBodyStream()
		return resp.StatusCode(), string(b), err
	}
	return resp.StatusCode(), string(resp.Body()), nil
}

func kindOf(err error) (ErrorKind, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind, true
	}
	return 0, false
}

// TestStaleConnectionSentAgain: a POST on a pooled connection the engine closed while it
// idled is sent again on a fresh connection; a bare client fails on the same connection.
func TestStaleConnectionSentAgain(t *testing.T) {
	srv := newKeepAliveServer(t, nil)
	u, _ := testUpstream(t, srv.addr, config.Upstream{}, nil, nil)
	for _, stream := range []bool{false, true} {
		if st, _, err := post(u, stream, 5*time.Second); err != nil || st != 200 {
			t.Fatalf("first request: %d %v", st, err)
		}
		if srv.closeIdle() == 0 {
			t.Fatal("no idle connection to close")
		}
		if st, _, err := post(u, stream, 5*time.Second); err != nil || st != 200 {
			t.Fatalf("request on the closed connection (stream %v): %d %v", stream, st, err)
		}
	}
	if got := u.stale.Get(); got != 2 {
		t.Errorf("stale retries %d, want 2", got)
	}
	if got := srv.requests.Load(); got != 4 {
		t.Errorf("engine served %d requests, want 4: none lost, none doubled", got)
	}

	// The same sequence with a bare client fails: the test reproduces the engines' behaviour.
	srv = newKeepAliveServer(t, nil)
	bare := &fasthttp.HostClient{Addr: srv.addr}
	defer bare.CloseIdleConnections()
	do := func() error {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetRequestURI("http://" + srv.addr + "/")
		return bare.DoTimeout(req, resp, 5*time.Second)
	}
	if err := do(); err != nil {
		t.Fatal(err)
	}
	srv.closeIdle()
	if err := do(); !errors.Is(err, fasthttp.ErrConnectionClosed) {
		t.Fatalf("bare client on a closed connection: %v, want ErrConnectionClosed", err)
	}
}

// TestFailuresNotSentAgain: a request is sent again only when it failed on a reused
// connection before any response byte: not on a fresh connection (the engine may have
// started it) and not when the engine had begun to answer.
func TestFailuresNotSentAgain(t *testing.T) {
	t.Run("fresh connection closed", func(t *testing.T) {
		srv := newKeepAliveServer(t, nil)
		u, _ := testUpstream(t, srv.addr, config.Upstream{}, nil, nil)
		srv.hangUp.Store(true)
		_, _, err := post(u, false, 5*time.Second)
		if k, ok := kindOf(err); !ok || k != KindTransport {
			t.Fatalf("err %v, want a transport failure", err)
		}
		if srv.requests.Load() != 1 || u.stale.Get() != 0 {
			t.Fatalf("engine saw %d requests, %d stale retries: a fresh connection's failure was sent again", srv.requests.Load(), u.stale.Get())
		}
	})
	t.Run("reused connection closed after the engine read the request", func(t *testing.T) {
		srv := newKeepAliveServer(t, nil)
		u, _ := testUpstream(t, srv.addr, config.Upstream{}, nil, nil)
		if _, _, err := post(u, false, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		srv.hangUp.Store(true)
		// The engine read this request before hanging up: it may have started it, but the
		// router cannot tell that from a connection closed while idle. What it can tell is
		// that no byte of an answer came: the rule sends it again once.
		if st, _, err := post(u, false, 5*time.Second); err != nil || st != 200 {
			t.Fatalf("%d %v", st, err)
		}
		if srv.requests.Load() != 3 || u.stale.Get() != 1 {
			t.Fatalf("engine saw %d requests, %d stale retries; want 3 and 1", srv.requests.Load(), u.stale.Get())
		}
	})
}

func TestResponseHeaderTimeout(t *testing.T) {
	srv := newKeepAliveServer(t, nil)
	srv.hold = make(chan struct{})
	u, _ := testUpstream(t, srv.addr, config.Upstream{ResponseHeaderTimeout: 100 * time.Millisecond}, nil, nil)
	start := time.Now()
	_, _, err := post(u, false, time.Minute)
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindTimeout || !strings.Contains(e.Detail, "response headers") {
		t.Fatalf("err %v, want the header timeout", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("header timeout took %v", el)
	}
	close(srv.hold)
}

// TestResponseHeaderTimeoutSparesStreams: once the headers came, the header deadline no
// longer applies: a stream longer than it completes.
func TestResponseHeaderTimeoutSparesStreams(t *testing.T) {
	srv := newKeepAliveServer(t, nil)
	// The headers and first event come at once; the body lasts 4 x 100 ms, longer than the
	// header timeout. The timeout leaves a loaded host 250 ms to deliver the headers (50 ms
	// was within what a host at load 20 can delay a goroutine).
	srv.slowBody = 100 * time.Millisecond
	u, _ := testUpstream(t, srv.addr, config.Upstream{ResponseHeaderTimeout: 250 * time.Millisecond}, nil, nil)
	for range 2 { // the second on the reused connection
		st, body, err := post(u, true, time.Minute)
		if err != nil || st != 200 || strings.Count(body, "data:") != 4 {
			t.Fatalf("stream: %d %q %v", st, body, err)
		}
	}
}

// TestConnectionLimitFailsFast: a request that finds every allowed connection busy fails at
// once, as the router's fault.
func TestConnectionLimitFailsFast(t *testing.T) {
	srv := newKeepAliveServer(t, nil)
	srv.hold = make(chan struct{})
	u, tr := testUpstream(t, srv.addr, config.Upstream{MaxConnsPerWorker: 1}, nil, nil)
	first := make(chan error, 1)
	go func() {
		_, _, err := post(u, false, time.Minute)
		first <- err
	}()
	select {
	case <-srv.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("first request never reached the engine")
	}
	start := time.Now()
	_, _, err := post(u, false, time.Minute)
	if k, ok := kindOf(err); !ok || k != KindConnLimit || !k.RouterSide() {
		t.Fatalf("err %v, want the connection limit", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("a full pool took %v to fail", el)
	}
	if tr.routerErrors[KindConnLimit].Get() != 1 {
		t.Fatal("router error not counted")
	}
	close(srv.hold)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

// TestDialOutOfDescriptors: a dial that fails for want of file descriptors is the router's
// failure.
func TestDialOutOfDescriptors(t *testing.T) {
	emfile := func(network, addr string, _ time.Duration) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("socket", syscall.EMFILE)}
	}
	u, tr := testUpstream(t, "127.0.0.1:1", config.Upstream{}, emfile, nil)
	_, _, err := post(u, false, time.Minute)
	if k, ok := kindOf(err); !ok || k != KindResources {
		t.Fatalf("err %v, want out of resources", err)
	}
	if tr.routerErrors[KindResources].Get() != 1 {
		t.Fatal("router error not counted")
	}
	refused := func(network, addr string, _ time.Duration) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	}
	u, _ = testUpstream(t, "127.0.0.1:1", config.Upstream{}, refused, nil)
	if _, _, err := post(u, false, time.Minute); func() bool { k, ok := kindOf(err); return !ok || k != KindTransport }() {
		t.Fatalf("refused connection: %v, want the engine's transport failure", err)
	}
}

// TestHTTPSWorker: an https:// worker is dialed with TLS, verified against the configured
// authority; without it the certificate is refused.
func TestHTTPSWorker(t *testing.T) {
	ca, serverCfg := testCertificates(t)
	srv := newKeepAliveServer(t, serverCfg)
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	u, _ := testUpstream(t, srv.addr, config.Upstream{}, nil, &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12})
	for range 2 {
		if st, _, err := post(u, false, 5*time.Second); err != nil || st != 200 {
			t.Fatalf("https: %d %v", st, err)
		}
	}
	if srv.accepted.Load() != 1 {
		t.Fatalf("%d TLS connections for two requests", srv.accepted.Load())
	}
	// The worker's probes (health, introspection, load polls) name the https URL.
	err := load.Fetch(context.Background(), u.Probe(), "https://"+srv.addr+"/health", "*/*", 5*time.Second, 1<<10,
		func(status int, _ []byte) error {
			if status != 200 {
				return fmt.Errorf("status %d", status)
			}
			return nil
		})
	if err != nil {
		t.Fatalf("https probe: %v", err)
	}
	if srv.closeIdle() == 0 {
		t.Fatal("no idle TLS connection")
	}
	if st, _, err := post(u, false, 5*time.Second); err != nil || st != 200 || u.stale.Get() != 1 {
		t.Fatalf("https after the engine closed the idle connection: %d %v, %d retries", st, err, u.stale.Get())
	}
	unknown, _ := testUpstream(t, srv.addr, config.Upstream{}, nil, &tls.Config{MinVersion: tls.VersionTLS12})
	if _, _, err := post(unknown, false, 5*time.Second); func() bool { k, ok := kindOf(err); return !ok || k != KindTransport }() {
		t.Fatalf("unknown authority: %v", err)
	}
}

// testCertificates makes a CA and a server certificate for 127.0.0.1 signed by it.
func testCertificates(t *testing.T) (*x509.Certificate, *tls.Config) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "engine"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return ca, &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12}
}

// TestUpstreamAPIKey: with upstream.api_key every request to the engine — dispatch and
// probes alike — carries it as the bearer key, in place of the client's.
func TestUpstreamAPIKey(t *testing.T) {
	auth := make(chan string, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth <- r.URL.Path + " " + r.Header.Get("Authorization")
		fmt.Fprint(w, `{}`)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	u, _ := testUpstream(t, addr, config.Upstream{APIKey: "sk-workers"}, nil, nil)
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI("/v1/chat/completions")
	req.Header.SetHost(u.HostPort())
	req.Header.Set("Authorization", "Bearer client-key")
	if err := u.Do(req, resp, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := <-auth; got != "/v1/chat/completions Bearer sk-workers" {
		t.Errorf("dispatch carried %q", got)
	}
	err := load.Fetch(context.Background(), u.Probe(), srv.URL+"/health", "*/*", 5*time.Second, 1024,
		func(int, []byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if got := <-auth; got != "/health Bearer sk-workers" {
		t.Errorf("probe carried %q", got)
	}
	// Without the setting, the client's header goes through untouched.
	u2, _ := testUpstream(t, addr, config.Upstream{}, nil, nil)
	req.SetRequestURI("/v1/chat/completions")
	req.Header.SetHost(u2.HostPort())
	req.Header.Set("Authorization", "Bearer client-key")
	if err := u2.Do(req, resp, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := <-auth; got != "/v1/chat/completions Bearer client-key" {
		t.Errorf("dispatch without a workers' key carried %q", got)
	}
}

// addrConn is a net.Conn that counts its RemoteAddr calls.
type addrConn struct {
	net.Conn
	remote net.Addr
	calls  int
}

func (c *addrConn) RemoteAddr() net.Addr { c.calls++; return c.remote }
func (c *addrConn) LocalAddr() net.Addr  { return c.remote }

// TestUpConnRemoteAddrReadOnce: fasthttp asks an engine connection for its remote address on
// every answer; the connection reads it from the socket's layers once, when it is made.
func TestUpConnRemoteAddrReadOnce(t *testing.T) {
	raw := &addrConn{remote: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 30000}}
	var set connSet
	uc := set.track(raw, raw, 0)
	for range 3 {
		if got := uc.RemoteAddr(); got != raw.remote {
			t.Fatalf("RemoteAddr = %v, want %v", got, raw.remote)
		}
	}
	if raw.calls != 1 {
		t.Fatalf("the socket's RemoteAddr was called %d times, want once", raw.calls)
	}
}
