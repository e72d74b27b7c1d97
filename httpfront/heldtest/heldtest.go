// Package heldtest holds streams open through a router, for tests and benchmarks that count
// what a held idle stream costs: an engine that answers each stream's headers and one event,
// then sends nothing more and keeps the connection, serving its connections one after the
// other on a single goroutine (so that it adds no goroutine per stream to its process); and
// a client that opens a stream over a raw connection and returns it once the first event
// arrived, for nothing to read afterwards. Only tests import it.
package heldtest

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Event is the one event a held stream's engine sends.
const Event = `data: {"id":"h","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"}}]}` + "\n\n"

// maxFirst bounds what Open reads before the first event.
const maxFirst = 64 << 10

// Engine answers every POST /v1/chat/completions with a stream's headers and Event, then
// holds the stream; any other request (health checks, introspection) gets 200 with "{}".
type Engine struct {
	ln   net.Listener
	url  string
	mu   sync.Mutex
	held []net.Conn
	done chan struct{}
}

// NewEngine starts an Engine on a loopback port; it stops, and closes every held stream, at
// the end of the test.
func NewEngine(tb testing.TB) *Engine {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	e := &Engine{ln: ln, url: "http://" + ln.Addr().String(), done: make(chan struct{})}
	go e.serve()
	tb.Cleanup(func() {
		_ = ln.Close()
		<-e.done
		e.Release()
	})
	return e
}

// URL is the engine's base URL.
func (e *Engine) URL() string { return e.url }

func (e *Engine) serve() {
	defer close(e.done)
	for {
		c, err := e.ln.Accept()
		if err != nil {
			return
		}
		if e.answer(c) {
			e.mu.Lock()
			e.held = append(e.held, c)
			e.mu.Unlock()
		} else {
			_ = c.Close()
		}
	}
}

// answer reads c's request and answers it; it reports whether c now holds a stream.
func (e *Engine) answer(c net.Conn) bool {
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	req, err := http.ReadRequest(bufio.NewReader(c))
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, req.Body)
	if req.Method != http.MethodPost || req.URL.Path != "/v1/chat/completions" {
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
		return false
	}
	_ = c.SetDeadline(time.Time{})
	head := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
		strconv.FormatInt(int64(len(Event)), 16) + "\r\n" + Event + "\r\n"
	_, err = io.WriteString(c, head)
	return err == nil
}

// Release closes the held streams' connections.
func (e *Engine) Release() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.held {
		_ = c.Close()
	}
	e.held = nil
}

// Open sends body as a streaming chat request to the router at addr (host:port) over a raw
// connection and returns the connection once the answer (200) has brought Event; nothing
// reads the connection afterwards.
func Open(tb testing.TB, addr, body string) net.Conn {
	tb.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		tb.Fatal(err)
	}
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
	if _, err := io.WriteString(c, req); err != nil {
		tb.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	var got []byte
	buf := make([]byte, 4096)
	for !bytes.Contains(got, []byte(Event)) {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil || len(got) > maxFirst {
			tb.Fatalf("the held stream's first event did not arrive (%v): %q", err, got)
		}
	}
	if !bytes.HasPrefix(got, []byte("HTTP/1.1 200")) {
		tb.Fatalf("answer: %q", got)
	}
	_ = c.SetReadDeadline(time.Time{})
	return c
}
