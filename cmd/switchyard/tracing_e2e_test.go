package main

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"switchyard/bench/mockengine"
	"switchyard/httpfront/tracing/tracingtest"
)

// TestTracingE2E runs the switchyard binary with tracing on, in front of a mock engine, and
// reads what it exports at an in-process OTLP receiver: sgl-router's --enable-trace and
// --otlp-traces-endpoint over gRPC, and serve's tracing keys over HTTP. The request's
// server span continues the client's trace, the engine got the dispatch span as its
// traceparent, and the spans are exported when the process stops on SIGTERM (the
// shutdown flushes what the batch still held: its own timer is seconds away).
func TestTracingE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	const (
		model       = "Qwen/Qwen3-8B"
		traceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
		clientSpan  = "00f067aa0ba902b7"
		traceparent = "00-" + traceID + "-" + clientSpan + "-01"
	)
	tests := []struct {
		name   string
		rcv    func(t *testing.T) *tracingtest.Receiver
		launch func(t *testing.T, engine, collector string) (*child, string)
	}{
		{"sgl-router flags over grpc", func(t *testing.T) *tracingtest.Receiver { return tracingtest.NewGRPC(t) },
			func(t *testing.T, engine, collector string) (*child, string) {
				return launchChild(t, "--worker-urls", engine, "--host", "127.0.0.1", "--port", "0",
					"--enable-trace", "--otlp-traces-endpoint", collector)
			}},
		{"serve keys over http", func(t *testing.T) *tracingtest.Receiver { return tracingtest.NewHTTP(t) },
			func(t *testing.T, engine, collector string) (*child, string) {
				return startRouterChild(t, 0, "--worker-urls", engine, "--model", model,
					"--set", "tracing.enabled=true", "--set", "tracing.protocol=http",
					"--set", "tracing.endpoint=http://"+collector, "--set", "tracing.service_name=router-e2e")
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rcv := tt.rcv(t)
			e := startMock(t, mockengine.Config{WorkerID: "a", Model: model, Role: mockengine.RolePlain, ZeroCost: true})
			c, base := tt.launch(t, e.URL(), rcv.Endpoint)
			waitReady(t, base)
			req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
				strings.NewReader(`{"model":"`+model+`","max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Traceparent", traceparent)
			resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("chat: %d", resp.StatusCode)
			}
			c.stop(t)
			if !c.exited() {
				t.Fatal("the router did not exit")
			}
			var root, disp tracingtest.Span
			for _, s := range rcv.Spans() {
				switch {
				case strings.HasPrefix(s.Name, "POST "):
					root = s
				case s.Name == "dispatch":
					disp = s
				}
			}
			if root.TraceID != traceID || root.ParentSpanID != clientSpan {
				t.Fatalf("server span %+v, want one continuing the client's trace; received %d spans\n%s",
					root, len(rcv.Spans()), c.output())
			}
			if disp.ParentSpanID != root.SpanID || disp.Attrs["http.response.status_code"] != int64(200) {
				t.Errorf("dispatch span %+v", disp)
			}
			if tt.name == "serve keys over http" && root.Resource["service.name"] != "router-e2e" {
				t.Errorf("service.name %v", root.Resource["service.name"])
			}
			tps := e.Traceparents()
			if want := "00-" + traceID + "-" + disp.SpanID + "-01"; len(tps) != 1 || tps[0] != want {
				t.Errorf("engine got traceparents %q, want [%s]", tps, want)
			}
		})
	}
}
