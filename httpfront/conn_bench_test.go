package httpfront

import (
	"net"
	"testing"
	"time"
)

// nopConn is a socket that takes every write and deadline at once.
type nopConn struct{ net.Conn }

func (nopConn) Write(b []byte) (int, error)      { return len(b), nil }
func (nopConn) SetReadDeadline(time.Time) error  { return nil }
func (nopConn) SetWriteDeadline(time.Time) error { return nil }

// BenchmarkClientConnRequest is a small request's moves of a client connection's deadlines
// and its answer's write, as fasthttp makes them (a read deadline before the request, another
// after it, the answer written under server.write_timeout), over a socket that costs nothing:
// the connection wrapper's own work.
func BenchmarkClientConnRequest(b *testing.B) {
	l := &clientListener{writeTimeout: 30 * time.Second}
	c := &clientConn{Conn: nopConn{}, owner: l}
	answer := make([]byte, 256)
	at := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		at = at.Add(time.Microsecond)
		_ = c.SetReadDeadline(at.Add(time.Minute))
		_ = c.SetReadDeadline(at.Add(30 * time.Second))
		if _, err := c.Write(answer); err != nil {
			b.Fatal(err)
		}
	}
}
