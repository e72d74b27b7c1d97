package tracing

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"switchyard/config"
	"switchyard/httpfront/tracing/tracingtest"
)

func testConfig(protocol, endpoint string) config.Tracing {
	c := config.Default().Tracing
	c.Enabled, c.Protocol, c.Endpoint = true, protocol, endpoint
	return c
}

// TestExportOverBothProtocols: spans reach an OTLP receiver over HTTP and over gRPC, with the
// service name and the configured headers; Shutdown exports what is still queued (the
// batch's own timer is far away), counts the export, and leaves no goroutine behind.
func TestExportOverBothProtocols(t *testing.T) {
	for _, protocol := range []string{config.TracingHTTP, config.TracingGRPC} {
		t.Run(protocol, func(t *testing.T) {
			var rcv *tracingtest.Receiver
			if protocol == config.TracingHTTP {
				rcv = tracingtest.NewHTTP(t)
			} else {
				rcv = tracingtest.NewGRPC(t)
			}
			before := otelGoroutines()
			cfg := testConfig(protocol, "http://"+rcv.Endpoint)
			cfg.ServiceName = "router-7"
			set := metrics.NewSet()
			p, err := New(cfg, Options{Metrics: set, Version: "v1.2.3"})
			if err != nil {
				t.Fatal(err)
			}
			_, sp := p.Tracer().Start(context.Background(), "work", trace.WithSpanKind(trace.SpanKindServer))
			sp.End()
			if err := p.Shutdown(); err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			spans := rcv.Spans()
			if len(spans) != 1 || spans[0].Name != "work" || spans[0].Resource["service.name"] != "router-7" ||
				spans[0].Resource["service.version"] != "v1.2.3" {
				t.Fatalf("received %+v", spans)
			}
			var buf bytes.Buffer
			set.WritePrometheus(&buf)
			if !strings.Contains(buf.String(), `switchyard_tracing_exports_total{result="ok"} 1`) ||
				!strings.Contains(buf.String(), "switchyard_tracing_spans_exported_total 1") {
				t.Errorf("metrics:\n%s", buf.String())
			}
			rcv.Close()
			waitGoroutines(t, before)
		})
	}
}

// TestShutdownIsBounded: a collector that takes exports and never answers holds Shutdown no
// longer than about tracing.shutdown_timeout; the exports still running are cancelled, the
// failure reported, and every goroutine of the provider ends.
func TestShutdownIsBounded(t *testing.T) {
	for _, protocol := range []string{config.TracingHTTP, config.TracingGRPC} {
		t.Run(protocol, func(t *testing.T) {
			release := make(chan struct{})
			var rcv *tracingtest.Receiver
			if protocol == config.TracingHTTP {
				rcv = tracingtest.NewHTTP(t, tracingtest.Stalled(release))
			} else {
				rcv = tracingtest.NewGRPC(t, tracingtest.Stalled(release))
			}
			before := otelGoroutines()
			cfg := testConfig(protocol, "http://"+rcv.Endpoint)
			cfg.ShutdownTimeout = 200 * time.Millisecond
			cfg.Timeout = time.Minute // only the shutdown bounds the stalled export
			p, err := New(cfg, Options{})
			if err != nil {
				t.Fatal(err)
			}
			_, sp := p.Tracer().Start(context.Background(), "stuck")
			sp.End()
			start := time.Now()
			err = p.Shutdown()
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("Shutdown took %v with a shutdown timeout of %v", took, cfg.ShutdownTimeout)
			}
			if err == nil {
				t.Error("Shutdown reported no failure though the collector never answered")
			}
			if p.Shutdown() != err {
				t.Error("a second Shutdown gave another result")
			}
			rcv.Close()
			waitGoroutines(t, before)
		})
	}
}

// TestNewRejectsABadEndpoint: an endpoint that Validate would refuse is refused by name.
func TestNewRejectsABadEndpoint(t *testing.T) {
	cfg := testConfig(config.TracingGRPC, "collector")
	if _, err := New(cfg, Options{}); err == nil || !strings.Contains(err.Error(), "tracing.endpoint") {
		t.Fatalf("err = %v, want one naming tracing.endpoint", err)
	}
	var p *Provider
	if p.Tracer() != nil || p.Shutdown() != nil {
		t.Error("a nil Provider is not tracing off")
	}
}

// TestAppendTraceparent: the header written for engines is the W3C form the propagator
// reads back, and writing it allocates nothing.
func TestAppendTraceparent(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	for _, flags := range []trace.TraceFlags{0, trace.FlagsSampled} {
		sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: flags})
		got := string(AppendTraceparent(nil, sc))
		want := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0" + string("01"[flags])
		if got != want {
			t.Errorf("traceparent %q, want %q", got, want)
		}
		back := trace.SpanContextFromContext(Propagator.Extract(context.Background(), propagation.MapCarrier{"traceparent": got}))
		if back.TraceID() != tid || back.SpanID() != sid || back.TraceFlags() != flags {
			t.Errorf("read back %v", back)
		}
	}
	if got := AppendTraceparent([]byte("x"), trace.SpanContext{}); string(got) != "x" {
		t.Errorf("an invalid context wrote %q", got)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid})
	buf := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() { buf = AppendTraceparent(buf[:0], sc) }); n != 0 {
		t.Errorf("%v allocations, want 0", n)
	}
}

// otelGoroutines counts the goroutines running OpenTelemetry or gRPC code.
func otelGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "go.opentelemetry.io/") || strings.Contains(g, "google.golang.org/grpc") {
			n++
		}
	}
	return n
}

// waitGoroutines waits until no more such goroutines run than before, for at most 10 s,
// looking again every few milliseconds: a closed gRPC connection's goroutines end shortly
// after Close returns, signalling nothing.
func waitGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for otelGoroutines() > before {
		select {
		case <-deadline.C:
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines left running:\n%s", buf[:runtime.Stack(buf, true)])
		case <-tick.C:
		}
	}
}
