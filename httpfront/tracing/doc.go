// Package tracing is Switchyard's OpenTelemetry tracing setup: the OpenTelemetry SDK's
// tracer provider with a batching span processor, a parent-based ratio sampler
// (tracing.sampling_ratio) and an OTLP exporter over gRPC or HTTP (tracing.protocol) towards
// the configured collector, and the W3C trace-context helpers the front end uses to continue
// a client's traceparent and to write the one sent to engines. It owns no request state:
// httpfront opens and ends the spans where the work is (request, preparation, selection,
// dispatch attempts, stream).
//
// # Concurrency model
//
// A Provider is safe for concurrent use; its tracer is the SDK's. Ended spans are queued
// (tracing.queue_size; past it they are dropped) and exported in batches by the span
// processor's one goroutine; an export is bounded by tracing.timeout and counted
// (switchyard_tracing_exports_total{result}), and a failing collector is logged when its
// state changes, not per batch.
//
// # What a caller must release
//
// Shutdown exports what is queued, bounded by tracing.shutdown_timeout: past it the exports
// still running are cancelled. When it returns, every goroutine of the provider and its
// exporter has ended. A nil *Provider is tracing off.
package tracing
