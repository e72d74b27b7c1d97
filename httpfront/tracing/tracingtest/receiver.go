// Package tracingtest is an in-process OTLP trace receiver for tests: a collector's
// receiving end on a loopback port, over HTTP (protobuf bodies, POST /v1/traces) or gRPC
// (the TraceService), that decodes every export with the OTLP protobuf types and keeps the
// spans, flattened, for a test to read. Only tests import it.
package tracingtest

import (
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// maxBody bounds one export's body.
const maxBody = 16 << 20

// Span is one received span, flattened.
type Span struct {
	TraceID, SpanID, ParentSpanID string // lower-case hex; ParentSpanID empty for a root
	Name                          string
	Kind                          tracepb.Span_SpanKind
	Attrs                         map[string]any
	Events                        []Event
	StatusCode                    tracepb.Status_StatusCode
	StatusMessage                 string
	// Resource holds the resource attributes of the span's batch (service.name).
	Resource map[string]any
	Start    time.Time
	End      time.Time
}

// Event is one span event.
type Event struct {
	Name  string
	Attrs map[string]any
}

// Receiver is a running OTLP receiver.
type Receiver struct {
	// Endpoint is the host:port to export to.
	Endpoint string

	mu      sync.Mutex
	spans   []Span
	exports int
	changed chan struct{} // closed and replaced on every export

	// hold, when set, makes every export wait for it to be closed (a stalled collector).
	hold chan struct{}
	// discard: exports are read and answered, not decoded (benchmarks: the receiver's
	// work stays out of the router's figures).
	discard bool
	stop    func()
}

// Option configures a Receiver.
type Option func(*Receiver)

// Stalled makes the receiver take every export and answer nothing until release is closed
// or the receiver stops: a collector that does not answer.
func Stalled(release chan struct{}) Option { return func(r *Receiver) { r.hold = release } }

// Discarding makes an HTTP receiver read and answer every export without decoding it; it
// keeps no spans, only the count of exports.
func Discarding() Option { return func(r *Receiver) { r.discard = true } }

func newReceiver(opts []Option) *Receiver {
	r := &Receiver{changed: make(chan struct{})}
	for _, o := range opts {
		o(r)
	}
	return r
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// NewHTTP starts a receiver of OTLP/HTTP (protobuf) on a loopback port; the test's cleanup
// stops it.
func NewHTTP(t testing.TB, opts ...Option) *Receiver {
	t.Helper()
	r := newReceiver(opts)
	ln := listen(t)
	r.Endpoint = ln.Addr().String()
	done := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(r.serveHTTP), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	r.stop = func() {
		r.release()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}
	t.Cleanup(r.Close)
	return r
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, "unsupported content type "+ct, http.StatusUnsupportedMediaType)
		return
	}
	if r.discard {
		_, _ = io.Copy(io.Discard, io.LimitReader(req.Body, maxBody))
		r.add(&coltracepb.ExportTraceServiceRequest{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, maxBody+1))
	if err != nil || len(body) > maxBody {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	var msg coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &msg); err != nil {
		http.Error(w, "cannot decode: "+err.Error(), http.StatusBadRequest)
		return
	}
	if !r.wait(req.Context()) {
		return
	}
	r.add(&msg)
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// NewGRPC starts a receiver of OTLP/gRPC on a loopback port; the test's cleanup stops it.
func NewGRPC(t testing.TB, opts ...Option) *Receiver {
	t.Helper()
	r := newReceiver(opts)
	ln := listen(t)
	r.Endpoint = ln.Addr().String()
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(maxBody))
	coltracepb.RegisterTraceServiceServer(srv, traceService{r: r})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	r.stop = func() {
		r.release()
		srv.Stop()
		<-done
	}
	t.Cleanup(r.Close)
	return r
}

type traceService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *Receiver
}

func (s traceService) Export(ctx context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	if !s.r.wait(ctx) {
		return nil, errors.New("receiver stopped")
	}
	s.r.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// wait holds a stalled receiver's export until it is released; false when the export's
// client gave up first.
func (r *Receiver) wait(ctx context.Context) bool {
	if r.hold == nil {
		return true
	}
	select {
	case <-r.hold:
		return true
	case <-ctx.Done():
		return false
	}
}

func (r *Receiver) release() {
	if r.hold == nil {
		return
	}
	select {
	case <-r.hold:
	default:
		close(r.hold)
	}
}

// Close stops the receiver; it may be called more than once.
func (r *Receiver) Close() {
	r.mu.Lock()
	stop := r.stop
	r.stop = nil
	r.mu.Unlock()
	if stop != nil {
		stop()
	}
}

func (r *Receiver) add(req *coltracepb.ExportTraceServiceRequest) {
	var got []Span
	for _, rs := range req.GetResourceSpans() {
		res := attrMap(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				s := Span{TraceID: hex.EncodeToString(sp.GetTraceId()), SpanID: hex.EncodeToString(sp.GetSpanId()),
					Name: sp.GetName(), Kind: sp.GetKind(), Attrs: attrMap(sp.GetAttributes()), Resource: res,
					StatusCode: sp.GetStatus().GetCode(), StatusMessage: sp.GetStatus().GetMessage(),
					Start: time.Unix(0, int64(sp.GetStartTimeUnixNano())), End: time.Unix(0, int64(sp.GetEndTimeUnixNano()))}
				if len(sp.GetParentSpanId()) > 0 {
					s.ParentSpanID = hex.EncodeToString(sp.GetParentSpanId())
				}
				for _, ev := range sp.GetEvents() {
					s.Events = append(s.Events, Event{Name: ev.GetName(), Attrs: attrMap(ev.GetAttributes())})
				}
				got = append(got, s)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.exports++
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func attrMap(kvs []*commonpb.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = value(kv.GetValue())
	}
	return m
}

func value(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_ArrayValue:
		var out []any
		for _, e := range x.ArrayValue.GetValues() {
			out = append(out, value(e))
		}
		return out
	}
	return nil
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Exports is the number of exports received.
func (r *Receiver) Exports() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exports
}

// WaitSpans waits until cond holds for the spans received, woken by each export, for at
// most 10 s; it returns them.
func (r *Receiver) WaitSpans(t testing.TB, what string, cond func([]Span) bool) []Span {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		spans, changed := append([]Span(nil), r.spans...), r.changed
		r.mu.Unlock()
		if cond(spans) {
			return spans
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s; received %d spans", what, len(spans))
			return nil
		}
	}
}
