package tracing

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/credentials"

	"switchyard/config"
)

// InstrumentationName names the router's tracer (the instrumentation scope of its spans).
const InstrumentationName = "switchyard/httpfront"

// Metric names.
const (
	metricExports = "switchyard_tracing_exports_total"
	metricSpans   = "switchyard_tracing_spans_exported_total"
)

// Options are a Provider's collaborators beyond the configuration.
type Options struct {
	// TLS is the client TLS towards the collector (tracing.tls, read by the caller); nil:
	// the system's roots.
	TLS *tls.Config
	// Metrics receives the export counters. Default: a new set.
	Metrics *metrics.Set
	// Logger receives export failures. Default: discard.
	Logger *slog.Logger
	// Version is the service.version resource attribute; empty leaves it out.
	Version string
}

// Provider is the router's tracer provider: the SDK's, exporting over OTLP.
type Provider struct {
	tp       *sdktrace.TracerProvider
	tracer   trace.Tracer
	exp      *exporter
	shutdown time.Duration
	once     sync.Once
	err      error
}

// New builds the tracer provider that cfg (validated) describes. Nothing is dialled yet: the
// exporter connects on its first export.
func New(cfg config.Tracing, opts Options) (*Provider, error) {
	if opts.Metrics == nil {
		opts.Metrics = metrics.NewSet()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	target, err := cfg.Target()
	if err != nil {
		return nil, &config.FieldError{Path: "tracing.endpoint", Msg: err.Error(), Kind: config.ErrInvalid}
	}
	inner, err := newExporter(cfg, target, opts.TLS)
	if err != nil {
		return nil, fmt.Errorf("cannot create the tracing exporter: %w", err)
	}
	exp := &exporter{inner: inner, logger: opts.Logger, endpoint: target.HostPort,
		ok:    opts.Metrics.NewCounter(metricExports + `{result="ok"}`),
		fail:  opts.Metrics.NewCounter(metricExports + `{result="error"}`),
		spans: opts.Metrics.NewCounter(metricSpans)}
	exp.stop, exp.abort = context.WithCancel(context.Background())
	attrs := []attribute.KeyValue{attribute.String("service.name", cfg.ServiceName)}
	if opts.Version != "" {
		attrs = append(attrs, attribute.String("service.version", opts.Version))
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithResource(resource.NewSchemaless(attrs...)),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SamplingRatio))),
		sdktrace.WithBatcher(exp, sdktrace.WithMaxQueueSize(cfg.QueueSize), sdktrace.WithExportTimeout(cfg.Timeout),
			sdktrace.WithMaxExportBatchSize(min(cfg.QueueSize, 512))),
	)
	return &Provider{tp: tp, tracer: tp.Tracer(InstrumentationName, trace.WithInstrumentationVersion(opts.Version)),
		exp: exp, shutdown: cfg.ShutdownTimeout}, nil
}

func newExporter(cfg config.Tracing, target config.TracingTarget, tlsCfg *tls.Config) (sdktrace.SpanExporter, error) {
	// An export is retried within its own timeout, never past it.
	ctx := context.Background()
	if cfg.Protocol == config.TracingHTTP {
		o := []otlptracehttp.Option{otlptracehttp.WithEndpoint(target.HostPort), otlptracehttp.WithTimeout(cfg.Timeout),
			otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: true, InitialInterval: 250 * time.Millisecond,
				MaxInterval: 2 * time.Second, MaxElapsedTime: cfg.Timeout})}
		if target.Path != "" {
			o = append(o, otlptracehttp.WithURLPath(target.Path))
		}
		if target.Insecure {
			o = append(o, otlptracehttp.WithInsecure())
		} else if tlsCfg != nil {
			o = append(o, otlptracehttp.WithTLSClientConfig(tlsCfg))
		}
		if len(cfg.Headers) > 0 {
			o = append(o, otlptracehttp.WithHeaders(cfg.Headers))
		}
		return otlptracehttp.New(ctx, o...)
	}
	o := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(target.HostPort), otlptracegrpc.WithTimeout(cfg.Timeout),
		otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: true, InitialInterval: 250 * time.Millisecond,
			MaxInterval: 2 * time.Second, MaxElapsedTime: cfg.Timeout})}
	switch {
	case target.Insecure:
		o = append(o, otlptracegrpc.WithInsecure())
	case tlsCfg != nil:
		o = append(o, otlptracegrpc.WithTLSCredentials(credentials.NewTLS(tlsCfg)))
	default:
		o = append(o, otlptracegrpc.WithTLSCredentials(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})))
	}
	if len(cfg.Headers) > 0 {
		o = append(o, otlptracegrpc.WithHeaders(cfg.Headers))
	}
	return otlptracegrpc.New(ctx, o...)
}

// Tracer is the router's tracer; nil when p is nil (tracing off).
func (p *Provider) Tracer() trace.Tracer {
	if p == nil {
		return nil
	}
	return p.tracer
}

// Shutdown ends tracing: the spans still queued are exported, for at most
// tracing.shutdown_timeout, after which the exports still running are cancelled. Every
// goroutine of the provider has ended when it returns. Later calls return the first's
// result.
func (p *Provider) Shutdown() error {
	if p == nil {
		return nil
	}
	p.once.Do(func() {
		// Past the timeout the exports in flight are cancelled, so the span processor's
		// drain ends promptly; the provider's own wait has a backstop of its own.
		timer := time.AfterFunc(p.shutdown, p.exp.abort)
		defer timer.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 2*p.shutdown+time.Second)
		defer cancel()
		p.err = p.tp.Shutdown(ctx)
		p.exp.abort()
		if p.exp.aborted.Load() > 0 {
			p.err = errors.Join(p.err, fmt.Errorf("cannot export every span within tracing.shutdown_timeout (%s)", p.shutdown))
		}
	})
	return p.err
}

// Propagator is the W3C trace-context propagator (traceparent, tracestate).
var Propagator propagation.TraceContext

// AppendTraceparent appends the W3C traceparent header value of sc (version 00) to dst;
// dst is unchanged when sc is not valid.
func AppendTraceparent(dst []byte, sc trace.SpanContext) []byte {
	if !sc.IsValid() {
		return dst
	}
	const hexDigits = "0123456789abcdef"
	tid, sid := sc.TraceID(), sc.SpanID()
	dst = append(dst, "00-"...)
	for _, b := range tid {
		dst = append(dst, hexDigits[b>>4], hexDigits[b&0xf])
	}
	dst = append(dst, '-')
	for _, b := range sid {
		dst = append(dst, hexDigits[b>>4], hexDigits[b&0xf])
	}
	f := byte(sc.TraceFlags())
	return append(dst, '-', hexDigits[f>>4], hexDigits[f&0xf])
}
