//go:build linux

package fleet

import (
	"errors"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"switchyard/config"
)

// fullListener returns the address of a loopback socket that listens with a backlog of 0 and
// never accepts, its accept queue filled: Linux drops further SYNs, so a connect hangs as it
// does to an engine host that is down or unreachable.
func fullListener(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	for i := 0; ; i++ {
		if i == 16 {
			t.Skip("the kernel kept accepting connections: cannot make a connect hang here")
		}
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			return addr // the queue is full
		}
		t.Cleanup(func() { _ = c.Close() })
	}
}

func TestConnectTimeout(t *testing.T) {
	addr := fullListener(t)
	u, _ := testUpstream(t, addr, config.Upstream{ConnectTimeout: 150 * time.Millisecond}, nil, nil)
	start := time.Now()
	_, _, err := post(u, false, time.Minute)
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindTimeout || !strings.Contains(e.Detail, "accept a connection") {
		t.Fatalf("err %v, want the connect timeout", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("connect timeout took %v", el)
	}
}
