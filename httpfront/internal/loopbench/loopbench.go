// Package loopbench is the setup the serving benchmarks and socket tests of httpfront and its
// sub-packages share: an engine on loopback that answers every request with one fixed JSON
// body (or a stream of events, each its own chunk), the parallel client loop that sends
// requests until the benchmark ends, and loopback TCP connections. Only tests and benchmarks
// import it.
package loopbench

import (
	"bufio"
	"net"
	"testing"

	"github.com/valyala/fasthttp"
)

// Engine starts a fasthttp server on 127.0.0.1 that answers every request with body as
// application/json, and returns its address. It stops when the test or benchmark ends.
func Engine(tb testing.TB, body []byte) string {
	tb.Helper()
	return serve(tb, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		ctx.SetBody(body)
	})
}

// StreamEngine starts a fasthttp server on 127.0.0.1 that answers every request with an SSE
// stream of events copies of event, each flushed as its own chunk (as engines flush every
// token), then "data: [DONE]"; it returns its address and stops when the test or benchmark
// ends.
func StreamEngine(tb testing.TB, events int, event []byte) string {
	tb.Helper()
	return serve(tb, func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for range events {
				_, _ = w.Write(event)
				if w.Flush() != nil {
					return
				}
			}
			_, _ = w.WriteString("data: [DONE]\n\n")
			_ = w.Flush()
		})
	})
}

// serve runs handler on a fasthttp server listening on 127.0.0.1 and returns its address;
// the server is shut down, and its goroutine ended, when the test or benchmark ends.
func serve(tb testing.TB, handler fasthttp.RequestHandler) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: handler}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	tb.Cleanup(func() {
		_ = srv.Shutdown()
		<-done
	})
	return ln.Addr().String()
}

// RoundTrips runs b's loop on parallelism goroutines per GOMAXPROCS, each with its own
// request and response: fill writes the request (it is reset before each call), do sends it.
// A failed call or a status other than 200 fails the benchmark.
func RoundTrips(b *testing.B, parallelism int, fill func(*fasthttp.Request), do func(*fasthttp.Request, *fasthttp.Response) error) {
	b.SetParallelism(parallelism)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req := fasthttp.AcquireRequest()
		resp := fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		for pb.Next() {
			req.Reset()
			fill(req)
			if err := do(req, resp); err != nil || resp.StatusCode() != fasthttp.StatusOK {
				b.Errorf("request: %v, status %d", err, resp.StatusCode())
				return
			}
		}
	})
}

// Conn returns a TCP connection to a loopback peer that reads until the connection closes:
// a socket whose deadlines a benchmark moves. It is closed, and its peer stopped, when the
// test or benchmark ends.
func Conn(tb testing.TB) net.Conn {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			_, _ = c.Read(make([]byte, 1)) // until the client closes
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		_ = ln.Close()
		<-done
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = c.Close()
		_ = ln.Close()
		<-done
	})
	return c
}

// Pair returns both ends of a loopback TCP connection: the dialed end and the accepted one.
// Both are closed when the test or benchmark ends.
func Pair(tb testing.TB) (dialed, accepted *net.TCPConn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	d, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		_ = ln.Close() // ends the accept
		<-acc
		tb.Fatal(err)
	}
	a := <-acc
	if a == nil {
		_ = d.Close()
		tb.Fatal("accept failed")
	}
	tb.Cleanup(func() {
		_ = d.Close()
		_ = a.Close()
	})
	return d.(*net.TCPConn), a.(*net.TCPConn)
}
