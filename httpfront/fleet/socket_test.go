package fleet

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"switchyard/httpfront/internal/loopbench"
)

// wantOpError fails t unless err is a *net.OpError of op over TCP with both addresses that
// wraps target, as net.Conn's Read and Write return their errors.
func wantOpError(t *testing.T, err error, op string, target error) {
	t.Helper()
	var oe *net.OpError
	if !errors.As(err, &oe) {
		t.Fatalf("error %v (%T), want a *net.OpError", err, err)
	}
	if oe.Op != op || oe.Net != "tcp" || oe.Source == nil || oe.Addr == nil {
		t.Errorf("error %q: op %q net %q source %v addr %v, want op %q over tcp with both addresses", err, oe.Op, oe.Net, oe.Source, oe.Addr, op)
	}
	if !errors.Is(err, target) {
		t.Errorf("error %v does not wrap %v", err, target)
	}
}

// TestSocketContract runs the same cases on the runtime's TCP connection and on a Socket
// over one: the Socket must behave, and fail, as net.Conn does.
func TestSocketContract(t *testing.T) {
	impls := []struct {
		name string
		wrap func(t *testing.T, c *net.TCPConn) net.Conn
	}{
		{"net.TCPConn", func(_ *testing.T, c *net.TCPConn) net.Conn { return c }},
		{"Socket", func(t *testing.T, c *net.TCPConn) net.Conn {
			s := NewSocket(c)
			if s == nil {
				t.Fatal("NewSocket of a TCP connection returned nil")
			}
			return s
		}},
	}
	tests := []struct {
		name string
		run  func(t *testing.T, peer *net.TCPConn, c net.Conn)
	}{
		{"reads what the peer wrote, then io.EOF", func(t *testing.T, peer *net.TCPConn, c net.Conn) {
			if _, err := peer.Write([]byte("hello")); err != nil {
				t.Fatal(err)
			}
			_ = peer.CloseWrite()
			got, err := io.ReadAll(c)
			if err != nil || string(got) != "hello" {
				t.Fatalf("read %q, %v; want \"hello\", end of stream", got, err)
			}
			if n, err := c.Read(make([]byte, 8)); n != 0 || err != io.EOF {
				t.Errorf("read after the end: %d, %v; want 0, io.EOF", n, err)
			}
		}},
		{"zero-length read and write", func(t *testing.T, _ *net.TCPConn, c net.Conn) {
			if n, err := c.Read(nil); n != 0 || err != nil {
				t.Errorf("zero-length read: %d, %v", n, err)
			}
			if n, err := c.Write(nil); n != 0 || err != nil {
				t.Errorf("zero-length write: %d, %v", n, err)
			}
		}},
		{"a read deadline already passed", func(t *testing.T, _ *net.TCPConn, c net.Conn) {
			_ = c.SetReadDeadline(time.Now().Add(-time.Second))
			n, err := c.Read(make([]byte, 8))
			if n != 0 {
				t.Errorf("read %d bytes", n)
			}
			wantOpError(t, err, "read", os.ErrDeadlineExceeded)
			if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
				t.Errorf("error %v is not a timeout", err)
			}
		}},
		{"a read deadline fires while the read waits", func(t *testing.T, _ *net.TCPConn, c net.Conn) {
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
			_, err := c.Read(make([]byte, 8))
			wantOpError(t, err, "read", os.ErrDeadlineExceeded)
			// The deadline moved away, the connection reads on.
			_ = c.SetReadDeadline(time.Time{})
		}},
		{"a write deadline fires while the peer does not read", func(t *testing.T, peer *net.TCPConn, c net.Conn) {
			_ = peer.SetReadBuffer(4 << 10)
			setWriteBuffer(t, c, 4<<10)
			big := make([]byte, 4<<20) // far more than the buffers hold
			_ = c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
			n, err := c.Write(big)
			if n <= 0 || n >= len(big) {
				t.Errorf("wrote %d of %d bytes, want a part", n, len(big))
			}
			wantOpError(t, err, "write", os.ErrDeadlineExceeded)
		}},
		{"partial writes reach a slow reader whole", func(t *testing.T, peer *net.TCPConn, c net.Conn) {
			_ = peer.SetReadBuffer(64 << 10)
			setWriteBuffer(t, c, 16<<10)
			want := make([]byte, 4<<20) // many times what the buffers hold
			for i := range want {
				want[i] = byte(i * 7 / 5)
			}
			got := make(chan []byte, 1)
			go func() {
				var b bytes.Buffer
				small := make([]byte, 1<<10) // many small reads: the writer waits for room often
				for {
					n, err := peer.Read(small)
					b.Write(small[:n])
					if err != nil {
						break
					}
				}
				got <- b.Bytes()
			}()
			n, err := c.Write(want)
			if n != len(want) || err != nil {
				t.Errorf("write: %d, %v; want %d, nil", n, err, len(want))
			}
			_ = c.(interface{ CloseWrite() error }).CloseWrite()
			if b := <-got; !bytes.Equal(b, want) {
				t.Errorf("the peer read %d bytes, not the %d written", len(b), len(want))
			}
		}},
		{"a close from another goroutine ends a waiting read", func(t *testing.T, _ *net.TCPConn, c net.Conn) {
			errc := make(chan error, 1)
			go func() {
				_, err := c.Read(make([]byte, 8))
				errc <- err
			}()
			_ = c.Close()
			wantOpError(t, <-errc, "read", net.ErrClosed)
		}},
		{"two goroutines read at once", func(t *testing.T, peer *net.TCPConn, c net.Conn) {
			got := make(chan string, 2)
			for range 2 {
				go func() {
					b := make([]byte, 8)
					n, _ := c.Read(b)
					got <- string(b[:n])
				}()
			}
			var all []string
			for _, m := range []string{"a", "b"} {
				if _, err := peer.Write([]byte(m)); err != nil {
					t.Fatal(err)
				}
				all = append(all, <-got) // one read ends for each byte
			}
			if !(all[0] == "a" && all[1] == "b") {
				t.Errorf("the reads got %q, want \"a\" then \"b\"", all)
			}
		}},
		{"a reset by the peer fails the read, then the write", func(t *testing.T, peer *net.TCPConn, c net.Conn) {
			_ = peer.SetLinger(0)
			_ = peer.Close() // a reset
			_, err := c.Read(make([]byte, 8))
			wantOpError(t, err, "read", syscall.ECONNRESET)
			var se *os.SyscallError
			if !errors.As(err, &se) || se.Syscall != "read" {
				t.Errorf("read error %v does not name the system call", err)
			}
			_, err = c.Write([]byte("x"))
			if !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("write after the reset: %v, want a broken pipe", err)
			}
			wantOpError(t, err, "write", err.(*net.OpError).Err)
		}},
	}
	for _, impl := range impls {
		for _, tt := range tests {
			t.Run(impl.name+"/"+tt.name, func(t *testing.T) {
				end, peer := loopbench.Pair(t)
				tt.run(t, peer, impl.wrap(t, end))
			})
		}
	}
}

// setWriteBuffer shrinks c's send buffer (a Socket's or a TCP connection's).
func setWriteBuffer(t *testing.T, c net.Conn, n int) {
	t.Helper()
	if err := c.(interface{ SetWriteBuffer(int) error }).SetWriteBuffer(n); err != nil {
		t.Fatal(err)
	}
}

// TestNewSocketNotTCP: a connection that is not a TCP socket gets no Socket.
func TestNewSocketNotTCP(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if s := NewSocket(a); s != nil {
		t.Fatal("NewSocket of a pipe returned a Socket")
	}
}

// waitHook is a waiter that runs do when a read is about to wait.
type waitHook struct {
	calls int
	do    func() bool
}

func (w *waitHook) Waiting() bool { w.calls++; return w.do() }

// TestSocketReadWaiting: a read that finds the socket empty runs the hook once before it
// waits; the hook's false ends the read with errWaitRefused.
func TestSocketReadWaiting(t *testing.T) {
	t.Run("the hook runs once, then the read waits", func(t *testing.T) {
		end, peer := loopbench.Pair(t)
		s := NewSocket(end)
		h := &waitHook{do: func() bool {
			_, err := peer.Write([]byte("late")) // what the read then waits for
			return err == nil
		}}
		buf := make([]byte, 8)
		n, err := s.read(buf, h)
		if err != nil || string(buf[:n]) != "late" {
			t.Fatalf("read %q, %v; want \"late\"", buf[:n], err)
		}
		if h.calls != 1 {
			t.Errorf("the hook ran %d times, want 1", h.calls)
		}
	})
	t.Run("no hook when there is something to read", func(t *testing.T) {
		end, peer := loopbench.Pair(t)
		s := NewSocket(end)
		if _, err := peer.Write([]byte("early!")); err != nil { // one segment
			t.Fatal(err)
		}
		buf := make([]byte, 8)
		if n, err := s.read(buf[:1], nil); n != 1 || err != nil { // waits for the segment
			t.Fatalf("first byte: %d, %v", n, err)
		}
		h := &waitHook{do: func() bool { return true }}
		if n, err := s.read(buf, h); string(buf[:n]) != "arly!" || err != nil || h.calls != 0 {
			t.Errorf("read %q, %v, hook ran %d times; want \"arly!\" and no hook", buf[:n], err, h.calls)
		}
	})
	t.Run("the hook's false ends the read", func(t *testing.T) {
		end, _ := loopbench.Pair(t)
		s := NewSocket(end)
		h := &waitHook{do: func() bool { return false }}
		if _, err := s.read(make([]byte, 8), h); !errors.Is(err, errWaitRefused) {
			t.Errorf("read: %v, want errWaitRefused", err)
		}
	})
}
