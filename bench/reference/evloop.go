package reference

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
)

// ErrNoEvloop: the event-loop proxy runs on Linux only (epoll).
var ErrNoEvloop = errors.New("the event-loop proxy needs Linux (epoll)")

// StartEvloop starts the event-loop proxy on 127.0.0.1 (a port chosen by the OS) in this
// process, in front of engineURLs (http://host:port): one goroutine locked to its OS
// thread serves every connection from an edge-triggered epoll set, round robin over the
// engines on keep-alive connections, each answer (a stream's chunks too) relayed as it is
// read; nothing is parsed beyond the HTTP/1.1 framing. Its CPU is this process's
// (ExternalCPU is zero); StartEvloopProcess runs it as its own process. ErrNoEvloop outside
// Linux.
func StartEvloop(engineURLs []string) (*Proxy, error) {
	if len(engineURLs) == 0 {
		return nil, fmt.Errorf("cannot start the event-loop proxy: %w", errNoEngine)
	}
	lfd, addr, err := evloopListener(0, "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("cannot start the event-loop proxy: %w", err)
	}
	stop, err := serveEvloop(lfd, engineURLs)
	if err != nil {
		return nil, fmt.Errorf("cannot start the event-loop proxy: %w", err)
	}
	return &Proxy{
		name:  "evloop",
		url:   "http://" + addr,
		close: stop,
		cpu:   func() (time.Duration, bool) { return 0, true },
	}, nil
}

// EvloopCommand runs the event-loop proxy as a command (switchyard evloop-proxy) until ctx
// is cancelled, with BareCommand's flags: --engines, --listen-fd (how StartEvloopProcess
// starts it) or --listen; it prints its URL on stdout.
func EvloopCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	urls, fd, listen, err := proxyFlags("evloop-proxy", `usage: switchyard evloop-proxy --engines URL[,URL...] [--listen ADDRESS]

A reference proxy of switchyard bench's overhead scenario (Linux): an HTTP/1.1 reverse
proxy on one edge-triggered epoll loop locked to one OS thread, round robin over keep-alive
engine connections, requests and answers copied through, streams relayed as they arrive.
No TLS, deadlines or selection: it measures what a Go process pays per request without
Go's netpoller and scheduler. The bench starts it as its own process.

flags:
`, args, stderr)
	if err != nil {
		return err
	}
	lfd, addr, err := evloopListener(fd, listen)
	if err != nil {
		return fmt.Errorf("cannot start the event-loop proxy: %w", err)
	}
	stop, err := serveEvloop(lfd, urls)
	if err != nil {
		return fmt.Errorf("cannot start the event-loop proxy: %w", err)
	}
	fmt.Fprintf(stdout, "event-loop proxy listening on http://%s\n", addr)
	<-ctx.Done()
	return stop()
}
