package fleet

import (
	"io"
	"net"
	"testing"

	"switchyard/httpfront/internal/loopbench"
)

// BenchmarkSocketRoundTrip writes a 200-byte request and reads its 200-byte echo over
// loopback: through the runtime's TCP connection (tcp, the baseline) and through a Socket
// over one (socket). The echoing peer is a plain TCP connection in both. A single
// connection's round trip is mostly the wake-ups of both ends: compare the CPU of runs that
// alternate (perf stat), not one run's time per op.
func BenchmarkSocketRoundTrip(b *testing.B) {
	for _, raw := range []bool{false, true} {
		name := "tcp"
		if raw {
			name = "socket"
		}
		b.Run(name, func(b *testing.B) {
			d, peer := loopbench.Pair(b)
			done := make(chan struct{})
			go func() {
				defer close(done)
				buf := make([]byte, 200)
				for {
					if _, err := io.ReadFull(peer, buf); err != nil {
						return
					}
					if _, err := peer.Write(buf); err != nil {
						return
					}
				}
			}()
			var c net.Conn = d
			if raw {
				c = NewSocket(d)
			}
			msg := make([]byte, 200)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, msg); err != nil {
					b.Fatal(err)
				}
			}
			_ = d.Close() // the peer's read ends
			<-done
		})
	}
}
