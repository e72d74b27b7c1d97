package fleet

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"switchyard/config"
)

// deadlineCountingConn counts the deadline moves that reach the socket.
type deadlineCountingConn struct {
	net.Conn
	moves *atomic.Int64
}

func (c *deadlineCountingConn) SetDeadline(t time.Time) error {
	c.moves.Add(2)
	return c.Conn.SetDeadline(t)
}

func (c *deadlineCountingConn) SetReadDeadline(t time.Time) error {
	c.moves.Add(1)
	return c.Conn.SetReadDeadline(t)
}

func (c *deadlineCountingConn) SetWriteDeadline(t time.Time) error {
	c.moves.Add(1)
	return c.Conn.SetWriteDeadline(t)
}

// countingDial dials with defaultDial and counts the deadline moves on every connection.
func countingDial(moves *atomic.Int64) DialFunc {
	return func(network, addr string, timeout time.Duration) (net.Conn, error) {
		c, err := defaultDial(network, addr, timeout)
		if err != nil {
			return nil, err
		}
		return &deadlineCountingConn{Conn: c, moves: moves}, nil
	}
}

// TestEngineConnectionDeadlinesLazy: an engine connection's socket sees its deadlines moved
// a few times over many requests, not for every request (each request sets a write
// deadline, a read deadline, the response-header deadline and the request's own again),
// over plain TCP and TLS.
func TestEngineConnectionDeadlinesLazy(t *testing.T) {
	ca, serverCfg := testCertificates(t)
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, tc := range []struct {
		name      string
		srv, conf *tls.Config
	}{{"plain", nil, nil}, {"tls", serverCfg, &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newKeepAliveServer(t, tc.srv)
			var moves atomic.Int64
			u, _ := testUpstream(t, srv.addr, config.Upstream{ResponseHeaderTimeout: time.Minute}, countingDial(&moves), tc.conf)
			const requests = 100
			for i := range requests {
				if st, _, err := post(u, i%2 == 1, 2*time.Minute); err != nil || st != 200 {
					t.Fatalf("request %d: %d %v", i, st, err)
				}
			}
			if srv.accepted.Load() != 1 {
				t.Fatalf("%d connections, want 1", srv.accepted.Load())
			}
			// The dial's own (the TLS handshake's bound and its clearing), then the first
			// request's; a later request moves nothing unless an armed deadline fired.
			if got := moves.Load(); got > 8 {
				t.Errorf("%d deadline moves on the socket for %d requests, want a few", got, requests)
			}
		})
	}
}

// TestEngineConnectionDeadlinesExact: with lazy deadlines every request still times out at
// its own deadline, and one only armed from an earlier request that fires during a later,
// longer request (a read), or before a later request's write, is not taken for a timeout;
// over plain TCP and TLS (where a write that timed out would break the connection).
func TestEngineConnectionDeadlinesExact(t *testing.T) {
	// shortDeadline is short against the /slow stream (4 gaps of slowPathPace) and long
	// against one request on an open loopback connection, even on a loaded machine.
	const shortDeadline = time.Second
	ca, serverCfg := testCertificates(t)
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, tc := range []struct {
		name      string
		srv, conf *tls.Config
	}{{"plain", nil, nil}, {"tls", serverCfg, &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newKeepAliveServer(t, tc.srv)
			u, _ := testUpstream(t, srv.addr, config.Upstream{ResponseHeaderTimeout: shortDeadline}, nil, tc.conf)
			// The connection (and its TLS handshake) first, outside the short deadlines.
			if st, _, err := post(u, false, time.Minute); err != nil || st != 200 {
				t.Fatalf("dial: %d %v", st, err)
			}
			// A short deadline, armed at once.
			if st, _, err := post(u, false, shortDeadline); err != nil || st != 200 {
				t.Fatalf("first: %d %v", st, err)
			}
			// A stream longer than the first request's deadline and the header deadline:
			// both fire during its reads.
			if st, body, err := postTo(u, "/slow", true, time.Minute); err != nil || st != 200 || strings.Count(body, "data:") != 4 {
				t.Fatalf("stream past an earlier deadline: %d %q %v", st, body, err)
			}
			// The write deadline armed for the first request has passed: this request's
			// write must not fail on it.
			if st, _, err := post(u, false, time.Minute); err != nil || st != 200 {
				t.Fatalf("after an earlier write deadline passed: %d %v", st, err)
			}
			if srv.accepted.Load() != 1 {
				t.Fatalf("%d connections, want 1: a request failed on a deadline not its own", srv.accepted.Load())
			}
			// A later request's shorter deadline is armed at once and fires.
			start := time.Now()
			_, _, err := postTo(u, "/hang", false, 200*time.Millisecond)
			if k, ok := kindOf(err); !ok || k != KindTimeout {
				t.Fatalf("held answer: %v, want a timeout", err)
			}
			if el := time.Since(start); el > 10*time.Second {
				t.Fatalf("the 200ms deadline fired after %v", el)
			}
		})
	}
}
