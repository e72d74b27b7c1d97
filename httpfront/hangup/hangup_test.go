//go:build unix

package hangup

import (
	"io"
	"net"
	"testing"
	"time"
)

// pair is a loopback TCP connection: the server side and the client side.
func pair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		server.Close()
		client.Close()
	})
	return server, client
}

func TestHangUp(t *testing.T) {
	for _, how := range []string{"close", "reset"} {
		t.Run(how, func(t *testing.T) {
			s, c := pair(t)
			called := false
			w, ok := Start(s, nil, func() { called = true })
			if !ok {
				t.Fatal("a TCP connection cannot be watched")
			}
			if w.Left() {
				t.Fatal("gone before the peer left")
			}
			if how == "reset" {
				_ = c.(*net.TCPConn).SetLinger(0)
			}
			_ = c.Close()
			select {
			case <-w.Gone():
			case <-time.After(10 * time.Second):
				t.Fatal("the hang-up was not seen")
			}
			w.Stop()
			if !called {
				t.Error("onGone did not run")
			}
		})
	}
}

// TestDataIsNotConsumed: bytes from a peer that stays end the watch without a hang-up, and
// are still there for the connection's owner; a stopped watch leaves the connection usable.
func TestDataIsNotConsumed(t *testing.T) {
	s, c := pair(t)
	w, _ := Start(s, nil, nil)
	w.Stop() // nothing happened
	if w.Left() {
		t.Fatal("a stopped watch reports a hang-up")
	}
	w, _ = Start(s, nil, nil)
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\n")); err != nil {
		t.Fatal(err)
	}
	w.Stop()
	if w.Left() {
		t.Fatal("data reported as a hang-up")
	}
	_ = s.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 16)
	if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "GET / HTTP/1.1\r\n" {
		t.Fatalf("read %q, %v after the watch", buf, err)
	}
}

func TestNotASocket(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if _, ok := Start(a, nil, nil); ok {
		t.Fatal("a pipe was watched")
	}
}
