package reference

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Proxy is one running reference proxy in front of the engines.
type Proxy struct {
	name  string
	url   string
	close func() error
	cpu   func() (time.Duration, bool)
}

// Name is the proxy's name in reports ("bare", "evloop", "nginx").
func (p *Proxy) Name() string { return p.name }

// URL is the proxy's base URL (http://127.0.0.1:port).
func (p *Proxy) URL() string { return p.url }

// ExternalCPU is the CPU time (user + system) the proxy used outside this process so far;
// false when it cannot be known. StartBare's is zero: it runs in this process.
func (p *Proxy) ExternalCPU() (time.Duration, bool) { return p.cpu() }

// Close stops the proxy and waits for it.
func (p *Proxy) Close() error { return p.close() }

// StartBare starts the bare fasthttp reverse proxy on 127.0.0.1 (a port chosen by the OS)
// in this process, in front of engineURLs (http://host:port): round robin over them, each
// request copied to the engine as it is, each answer copied back (a chunked one, a stream,
// relayed as it arrives). No parsing, selection, metrics or deadlines: the least a fasthttp
// proxy does. Its CPU is this process's (ExternalCPU is zero); StartBareProcess runs the
// same proxy as its own process.
func StartBare(engineURLs []string) (*Proxy, error) {
	if len(engineURLs) == 0 {
		return nil, fmt.Errorf("cannot start the bare proxy: %w", errNoEngine)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("cannot start the bare proxy: %w", err)
	}
	stop := serveBare(ln, engineURLs)
	return &Proxy{
		name:  "bare",
		url:   "http://" + ln.Addr().String(),
		close: stop,
		cpu:   func() (time.Duration, bool) { return 0, true },
	}, nil
}

var errNoEngine = errors.New("no engine")

// serveBare serves the bare proxy on ln until the returned stop, which closes ln, waits for
// the server and closes the engine connections.
func serveBare(ln net.Listener, engineURLs []string) (stop func() error) {
	clients := make([]*fasthttp.HostClient, len(engineURLs))
	for i, u := range engineURLs {
		clients[i] = &fasthttp.HostClient{Addr: strings.TrimPrefix(u, "http://"), MaxConns: 8192, StreamResponseBody: true}
	}
	var next atomic.Uint64
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		c := clients[next.Add(1)%uint64(len(clients))]
		req := fasthttp.AcquireRequest()
		resp := fasthttp.AcquireResponse()
		ctx.Request.CopyTo(req)
		req.SetHost(c.Addr)
		if err := c.Do(req, resp); err != nil {
			fasthttp.ReleaseRequest(req)
			fasthttp.ReleaseResponse(resp)
			ctx.Error(err.Error(), fasthttp.StatusBadGateway)
			return
		}
		fasthttp.ReleaseRequest(req)
		resp.Header.CopyTo(&ctx.Response.Header)
		if resp.Header.ContentLength() >= 0 {
			ctx.Response.SetBody(resp.Body())
			fasthttp.ReleaseResponse(resp)
			return
		}
		// A stream: fasthttp reads it on this connection's goroutine and closes it (which
		// releases the engine's response) at its end.
		ctx.Response.SetBodyStream(&upstreamBody{resp: resp}, -1)
	}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	return func() error {
		err := srv.Shutdown()
		<-done
		for _, c := range clients {
			c.CloseIdleConnections()
		}
		return err
	}
}

// BareCommand runs the bare proxy as a command (switchyard bare-proxy) until ctx is
// cancelled: --engines lists the engines' URLs, comma-separated; it listens on the
// inherited socket --listen-fd names (how StartBareProcess starts it) or on --listen, and
// prints its URL on stdout.
func BareCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	urls, fd, listen, err := proxyFlags("bare-proxy", `usage: switchyard bare-proxy --engines URL[,URL...] [--listen ADDRESS]

The reference proxy of switchyard bench's overhead scenario: a bare fasthttp reverse proxy,
round robin over the engines, requests and answers copied through unparsed, streams relayed
as they arrive. The bench starts it as its own process.

flags:
`, args, stderr)
	if err != nil {
		return err
	}
	var ln net.Listener
	if fd > 0 {
		f := os.NewFile(uintptr(fd), "listener")
		ln, err = net.FileListener(f)
		_ = f.Close()
	} else {
		ln, err = net.Listen("tcp", listen)
	}
	if err != nil {
		return fmt.Errorf("cannot start the bare proxy: %w", err)
	}
	stop := serveBare(ln, urls)
	fmt.Fprintf(stdout, "bare proxy listening on http://%s\n", ln.Addr())
	<-ctx.Done()
	return stop()
}

// proxyFlags parses a reference proxy command's flags (--engines, --listen, --listen-fd):
// the engines' URLs (at least one), the inherited socket's fd (0: none) and the address to
// listen on otherwise.
func proxyFlags(name, usage string, args []string, stderr io.Writer) (urls []string, fd int, listen string, err error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	engines := fs.String("engines", "", "the engines' base URLs (http://host:port), comma-separated")
	fs.StringVar(&listen, "listen", "127.0.0.1:0", "listen `ADDRESS` (port 0 lets the OS choose)")
	fs.IntVar(&fd, "listen-fd", 0, "serve on this inherited listening socket `FD` instead of --listen (0: none)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, 0, "", err
	}
	for _, u := range strings.Split(*engines, ",") {
		if u = strings.TrimSpace(u); u != "" {
			urls = append(urls, u)
		}
	}
	if len(urls) == 0 {
		return nil, 0, "", fmt.Errorf("cannot start the %s: %w (--engines)", name, errNoEngine)
	}
	return urls, fd, listen, nil
}

// upstreamBody is an engine's streamed answer as the client's response body.
type upstreamBody struct{ resp *fasthttp.Response }

func (b *upstreamBody) Read(p []byte) (int, error) { return b.resp.BodyStream().Read(p) }

func (b *upstreamBody) Close() error {
	err := b.resp.CloseBodyStream()
	fasthttp.ReleaseResponse(b.resp)
	return err
}
