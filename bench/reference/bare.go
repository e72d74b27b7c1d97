package reference

import (
	"fmt"
	"net"
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

// Name is the proxy's name in reports ("bare", "nginx").
func (p *Proxy) Name() string { return p.name }

// URL is the proxy's base URL (http://127.0.0.1:port).
func (p *Proxy) URL() string { return p.url }

// ExternalCPU is the CPU time (user + system) the proxy used outside this process so far;
// false when it cannot be known. The bare proxy's is zero: it runs in this process.
func (p *Proxy) ExternalCPU() (time.Duration, bool) { return p.cpu() }

// Close stops the proxy and waits for it.
func (p *Proxy) Close() error { return p.close() }

// StartBare starts the bare fasthttp reverse proxy on 127.0.0.1 (a port chosen by the OS)
// in front of engineURLs (http://host:port): round robin over them, each request copied to
// the engine as it is, each answer copied back (a chunked one, a stream, relayed as it
// arrives). No parsing, selection, metrics or deadlines: the least a fasthttp proxy does.
func StartBare(engineURLs []string) (*Proxy, error) {
	if len(engineURLs) == 0 {
		return nil, fmt.Errorf("cannot start the bare proxy: no engine")
	}
	clients := make([]*fasthttp.HostClient, len(engineURLs))
	for i, u := range engineURLs {
		clients[i] = &fasthttp.HostClient{Addr: strings.TrimPrefix(u, "http://"), MaxConns: 8192, StreamResponseBody: true}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("cannot start the bare proxy: %w", err)
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
	return &Proxy{
		name: "bare",
		url:  "http://" + ln.Addr().String(),
		close: func() error {
			err := srv.Shutdown()
			<-done
			for _, c := range clients {
				c.CloseIdleConnections()
			}
			return err
		},
		cpu: func() (time.Duration, bool) { return 0, true },
	}, nil
}

// upstreamBody is an engine's streamed answer as the client's response body.
type upstreamBody struct{ resp *fasthttp.Response }

func (b *upstreamBody) Read(p []byte) (int, error) { return b.resp.BodyStream().Read(p) }

func (b *upstreamBody) Close() error {
	err := b.resp.CloseBodyStream()
	fasthttp.ReleaseResponse(b.resp)
	return err
}
