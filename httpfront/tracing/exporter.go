package tracing

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// exporter wraps the OTLP exporter: it counts every export, logs the collector's failures
// when they start and when they end (not per batch), and cancels the exports in flight when
// the shutdown runs out of time. Its errors are its own to report: the span processor is
// told nothing, so the SDK's global error handler logs nothing on the router's behalf.
type exporter struct {
	inner    sdktrace.SpanExporter
	logger   *slog.Logger
	endpoint string

	ok, fail, spans *metrics.Counter
	// failing: the latest export failed (the state whose changes are logged).
	failing atomic.Bool
	// stop is cancelled by abort when the shutdown runs out of time.
	stop  context.Context
	abort context.CancelFunc
	// aborted counts the exports abort cut short.
	aborted atomic.Int64
}

var _ sdktrace.SpanExporter = (*exporter)(nil)

// ExportSpans implements sdktrace.SpanExporter.
func (e *exporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if e.stop.Err() != nil {
		e.aborted.Add(1)
		e.fail.Inc()
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	unhook := context.AfterFunc(e.stop, cancel)
	defer unhook()
	err := e.inner.ExportSpans(ctx, spans)
	if err != nil {
		e.fail.Inc()
		if e.stop.Err() != nil {
			e.aborted.Add(1)
		}
		if !e.failing.Swap(true) {
			e.logger.Warn("cannot export spans to the tracing collector", slog.String("endpoint", e.endpoint),
				slog.Int("spans", len(spans)), slog.Any("error", err))
		}
		return nil
	}
	e.ok.Inc()
	e.spans.Add(len(spans))
	if e.failing.Swap(false) {
		e.logger.Info("spans reach the tracing collector again", slog.String("endpoint", e.endpoint))
	}
	return nil
}

// Shutdown implements sdktrace.SpanExporter.
func (e *exporter) Shutdown(ctx context.Context) error { return e.inner.Shutdown(ctx) }
