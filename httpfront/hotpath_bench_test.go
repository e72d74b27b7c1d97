package httpfront

import (
	"context"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/httpfront/internal/loopbench"
	"switchyard/httpfront/tracing/tracingtest"
)

const benchClientHeaders = "POST /v1/chat/completions HTTP/1.1\r\nHost: router:8080\r\nUser-Agent: bench\r\n" +
	"Content-Type: application/json\r\nContent-Length: 2\r\nAccept: */*\r\nX-Request-Id: 7f3a\r\n" +
	"Traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nX-Session-Id: s-42\r\n\r\n"

// BenchmarkForwardHeaders is the per-request header work of a plain dispatch: one pass over
// the client's headers, then the upstream request line and forwarded headers.
func BenchmarkForwardHeaders(b *testing.B) {
	cfg := config.Default()
	s := &Server{cfg: cfg, fwd: newForwardNames(cfg.Affinity.SessionHeader, cfg.Affinity.RoutingKeyHeader)}
	h := parseRequestHeader(b, benchClientHeaders)
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	b.ReportAllocs()
	for b.Loop() {
		var hdr clientHeaders
		s.fwd.scan(h, &hdr)
		d := dispatch{s: s, kind: routeChat, hdr: hdr}
		req.Reset()
		d.upstreamHeaders(req, "engine:30000")
	}
}

// BenchmarkForwardHeadersPeekBaseline is the same work done by looking each forwarded name up
// (fasthttp normalizes the name on every Peek and Set): the baseline.
func BenchmarkForwardHeadersPeekBaseline(b *testing.B) {
	cfg := config.Default()
	names := []string{"Authorization", "X-Request-Id", "X-Correlation-Id", "Traceparent", "Tracestate",
		cfg.Affinity.SessionHeader, cfg.Affinity.RoutingKeyHeader}
	h := parseRequestHeader(b, benchClientHeaders)
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	b.ReportAllocs()
	for b.Loop() {
		_, _ = h.Peek(names[5]), h.Peek(names[6]) // the session and routing keys
		req.Reset()
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetRequestURI(routePaths[routeChat])
		req.Header.SetHost("engine:30000")
		req.Header.SetContentType("application/json")
		for _, name := range names {
			if v := h.Peek(name); len(v) > 0 {
				req.Header.SetBytesV(name, v)
			}
		}
	}
}

// BenchmarkReadDeadline moves a keep-alive connection's read deadline the way fasthttp does
// per request (idle timeout, then read timeout), on a plain TCP connection and on a
// clientConn.
func BenchmarkReadDeadline(b *testing.B) {
	for _, lazy := range []bool{false, true} {
		name := "conn"
		if lazy {
			name = "lazy"
		}
		b.Run(name, func(b *testing.B) {
			raw := loopbench.Conn(b)
			var c net.Conn = raw
			if lazy {
				c = &clientConn{Conn: raw}
			}
			b.ReportAllocs()
			for b.Loop() {
				now := time.Now()
				_ = c.SetReadDeadline(now.Add(DefaultIdleTimeout))
				_ = c.SetReadDeadline(now.Add(DefaultReadTimeout))
			}
		})
	}
}

// BenchmarkBoundedWrite writes 4 KiB at a time to a loopback connection whose peer reads
// everything: on a plain TCP connection (the baseline), and on a clientConn whose every write
// is bounded by server.write_timeout (a clock read and a lazily moved write deadline).
func BenchmarkBoundedWrite(b *testing.B) {
	for _, bounded := range []bool{false, true} {
		name := "conn"
		if bounded {
			name = "bounded"
		}
		b.Run(name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			done := make(chan struct{})
			go func() {
				defer close(done)
				if c, err := ln.Accept(); err == nil {
					defer c.Close()
					_, _ = io.Copy(io.Discard, c)
				}
			}()
			raw, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			var c net.Conn = raw
			if bounded {
				c = &clientConn{Conn: raw, owner: &clientListener{writeTimeout: 30 * time.Second}}
			}
			buf := make([]byte, 4096)
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			_ = raw.Close()
			<-done
		})
	}
}

// BenchmarkServePlainChat is a small non-streaming chat request through a Server to a
// minimal engine on loopback, from parallel keep-alive clients: the whole request path,
// client and engine included (allocs/op counts all three).
// BenchmarkServePlainChat measures a small non-streaming request through the router, with
// the defaults (aborts on: the client's connection watched and the dispatch cancellable
// while the engine answers); BenchmarkServePlainChatNoAbort is its baseline with
// abort.enabled false.
func BenchmarkServePlainChat(b *testing.B) { benchServePlainChat(b, nil) }

func BenchmarkServePlainChatNoAbort(b *testing.B) {
	benchServePlainChat(b, func(cfg *config.Config) { cfg.Abort.Enabled = false })
}

// BenchmarkServePlainChatTracing is BenchmarkServePlainChat with tracing off (the baseline),
// and on at sampling ratios 0.01 and 1, exporting over OTLP/HTTP to an in-process receiver
// that reads each export and answers without decoding it. cpu-ms/1000req is the process's
// CPU time (user and system) per 1,000 requests: client, router, engine and receiver.
func BenchmarkServePlainChatTracing(b *testing.B) {
	for _, tt := range []struct {
		name  string
		ratio float64
	}{{"off", -1}, {"ratio=0.01", 0.01}, {"ratio=1", 1}} {
		b.Run(tt.name, func(b *testing.B) {
			benchServePlainChat(b, func(cfg *config.Config) {
				if tt.ratio < 0 {
					return
				}
				rcv := tracingtest.NewHTTP(b, tracingtest.Discarding())
				cfg.Tracing.Enabled, cfg.Tracing.Endpoint = true, "http://"+rcv.Endpoint
				cfg.Tracing.Protocol, cfg.Tracing.SamplingRatio = config.TracingHTTP, tt.ratio
			})
		})
	}
}

// cpuTime is the process's CPU time so far, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// servePlainChat starts a minimal engine and a Server (aborts on or off) in front of it, both
// stopped at the end of tb, and returns a keep-alive client to the Server and the request's
// URI and body.
func servePlainChat(b testing.TB, abort bool) (client *fasthttp.HostClient, uri string, body []byte) {
	return servePlainChatWith(b, func(cfg *config.Config) { cfg.Abort.Enabled = abort })
}

// servePlainChatWith is servePlainChat with a Server configured by the defaults, then by set
// (nil: none).
func servePlainChatWith(b testing.TB, set func(cfg *config.Config)) (client *fasthttp.HostClient, uri string, body []byte) {
	return servePlainChatOpts(b, set, Options{})
}

// servePlainChatOpts is servePlainChatWith with opts for the Server (startup checks and
// telemetry always off).
func servePlainChatOpts(b testing.TB, set func(cfg *config.Config), opts Options) (client *fasthttp.HostClient, uri string, body []byte) {
	answer := []byte(`{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	engineAddr := loopbench.Engine(b, answer)

	cfg := config.Default()
	cfg.Server.Port = 0
	cfg.Workers = []config.Worker{plainWorker("A", "http://"+engineAddr, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("all", nil, nil, "A")}}}
	if set != nil {
		set(cfg)
	}
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	opts.SkipStartupChecks, opts.NoTelemetry = true, true
	s, err := New(cfg, opts)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- s.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		if err := <-runDone; err != nil {
			b.Errorf("Run: %v", err)
		}
	})
	<-s.serving

	client = &fasthttp.HostClient{Addr: s.Addr().String(), MaxConns: 64}
	b.Cleanup(client.CloseIdleConnections)
	body = []byte(`{"model":"llama","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`)
	return client, "http://" + client.Addr + "/v1/chat/completions", body
}

func benchServePlainChat(b *testing.B, set func(cfg *config.Config)) {
	client, uri, body := servePlainChatWith(b, set)
	postLoop(b, client, uri, body)
}

// BenchmarkServeStream is a streamed chat request through a Server to an engine on loopback
// that answers 64 events, each its own chunk, from parallel keep-alive clients reading the
// whole answer: the stream relay's path, client and engine included. cpu-ms/1000req is the
// process's CPU time per 1,000 requests.
func BenchmarkServeStream(b *testing.B) {
	client, uri, body := serveStreamChat(b)
	postLoop(b, client, uri, body)
}

// serveStreamChat is servePlainChatWith in front of an engine on loopback that answers every
// request with 64 events, each its own chunk, then [DONE]; body asks for a stream.
func serveStreamChat(tb testing.TB) (client *fasthttp.HostClient, uri string, body []byte) {
	event := []byte(`data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}` + "\n\n")
	engineAddr := loopbench.StreamEngine(tb, 64, event)
	client, uri, _ = servePlainChatWith(tb, func(cfg *config.Config) {
		cfg.Workers = []config.Worker{plainWorker("A", "http://"+engineAddr, "llama")}
	})
	return client, uri, []byte(`{"model":"llama","messages":[{"role":"user","content":"hi"}],"max_tokens":64,"stream":true}`)
}

// postLoop POSTs body to uri from parallel keep-alive clients until b ends, and reports the
// process's CPU time per 1,000 requests (cpu-ms/1000req).
func postLoop(b *testing.B, client *fasthttp.HostClient, uri string, body []byte) {
	cpu0 := cpuTime(b)
	defer func() {
		b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(time.Millisecond)*1000/float64(b.N), "cpu-ms/1000req")
	}()
	loopbench.RoundTrips(b, 8, func(req *fasthttp.Request) {
		req.SetRequestURI(uri)
		req.Header.SetMethod(fasthttp.MethodPost)
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(body)
	}, client.Do)
}

// BenchmarkClientHeaders is a request's reads of its client headers: the forwarded ones, the
// affinity keys and the SLO targets (absent, as on most requests).
func BenchmarkClientHeaders(b *testing.B) {
	cfg := config.Default()
	s := &Server{cfg: cfg, fwd: newForwardNames(cfg.Affinity.SessionHeader, cfg.Affinity.RoutingKeyHeader)}
	h := parseRequestHeader(b, benchClientHeaders)
	b.ReportAllocs()
	for b.Loop() {
		var hdr clientHeaders
		s.fwd.scan(h, &hdr)
		if _, e := sloTargets(&hdr, engine.SLOTargets{}); e != nil {
			b.Fatal(e)
		}
	}
}
