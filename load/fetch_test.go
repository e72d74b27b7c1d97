package load

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/internal/rawtest"
)

// hostileRoute serves every request of every connection with answer (raw bytes on the
// connection, which is closed after it) until the test ends.
func hostileRoute(t *testing.T, answer func(c net.Conn, stop <-chan struct{})) string {
	t.Helper()
	stop := make(chan struct{})
	addr := rawtest.Serve(t, rawtest.OneRequest(func(c net.Conn) { answer(c, stop) }))
	t.Cleanup(func() { close(stop) }) // before Serve's: the answers waiting on stop return
	return addr
}

// TestFetchBoundsHostileAnswers: the one bounded GET of every engine route the router polls
// (introspection, health checks, /v1/models, load polls and /metrics scrapes) gives up on an
// answer that is endless, gigabytes long, announced gigabytes long, one byte at a time, or
// never comes, within its byte limit and its timeout.
func TestFetchBoundsHostileAnswers(t *testing.T) {
	const limit = 64 << 10
	const timeout = 300 * time.Millisecond
	block := strings.Repeat("x", 4<<10)
	endless := func(head, frame string) func(net.Conn, <-chan struct{}) {
		return func(c net.Conn, stop <-chan struct{}) {
			if _, err := io.WriteString(c, head); err != nil {
				return
			}
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := io.WriteString(c, frame); err != nil {
					return
				}
			}
		}
	}
	tests := []struct {
		name   string
		answer func(net.Conn, <-chan struct{})
		tooBig bool // else: a timeout
	}{
		{"endless chunked body", endless("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "1000\r\n"+block+"\r\n"), true},
		{"endless body to the close", endless("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", block), true},
		{"64 GiB announced", endless("HTTP/1.1 200 OK\r\nContent-Length: 68719476736\r\n\r\n", block), true},
		{"one byte at a time", func(c net.Conn, stop <-chan struct{}) {
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				if _, err := io.WriteString(c, "x"); err != nil {
					return
				}
			}
		}, false},
		{"headers never sent", func(_ net.Conn, stop <-chan struct{}) { <-stop }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := hostileRoute(t, tt.answer)
			c := &fasthttp.HostClient{Addr: addr}
			start := time.Now()
			used := false
			err := Fetch(context.Background(), c, "http://"+addr+"/metrics", "*/*", timeout, limit, func(int, []byte) error {
				used = true
				return nil
			})
			took := time.Since(start)
			if err == nil || used {
				t.Fatalf("err %v, answer used %v: want a failed fetch", err, used)
			}
			if tt.tooBig != errors.Is(err, ErrBodyTooLarge) {
				t.Fatalf("err %v; want ErrBodyTooLarge: %v", err, tt.tooBig)
			}
			if !tt.tooBig && !errors.Is(err, fasthttp.ErrTimeout) && !isTimeout(err) {
				t.Fatalf("err %v; want a timeout", err)
			}
			// The timeout bounds the whole fetch; the slack is for a loaded machine.
			if took > timeout+5*time.Second {
				t.Fatalf("the fetch took %v, timeout %v", took, timeout)
			}
		})
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
