// Package rawtest serves raw TCP connections on loopback for tests that play a peer byte by
// byte: an engine that cuts its answer anywhere, one that never ends a line, a hostile
// ZeroMQ peer. Only tests import it.
//
// # Concurrency model and what a caller must release
//
// Serve runs an accept loop and one goroutine per connection until the test ends; its
// cleanup closes the listener and waits for every goroutine. A handler must return once its
// connection's deadline (Deadline from its accept) passes or its peer hangs up; one that
// waits on something else (a channel the test closes) must be released before the cleanup
// runs (cleanups run last registered first).
package rawtest

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// Deadline bounds every connection Serve accepts, reads and writes: a handler stuck on a
// peer that neither reads nor hangs up returns by then.
const Deadline = 30 * time.Second

// Serve listens on 127.0.0.1 (a port the OS chooses) and runs handle on every connection
// accepted, each on its own goroutine, the connection closed when handle returns. It returns
// the listener's host:port.
func Serve(t testing.TB, handle func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(Deadline))
				handle(c)
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	return ln.Addr().String()
}

// OneRequest is a handler that reads one HTTP request from its connection, discards the
// request's body, and gives the connection to answer; a connection that sends no valid
// request is closed without an answer.
func OneRequest(answer func(c net.Conn)) func(c net.Conn) {
	return func(c net.Conn) {
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		answer(c)
	}
}
