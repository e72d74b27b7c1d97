package actors

import (
	"bytes"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/asynkron/protoactor-go/actor"

	"switchyard/config"
	"switchyard/engine"
)

const testModel = "llama"

// Request markers read by testPolicy (in BucketRequest.SessionKey).
const (
	markPanic = "panic" // the policy panics
	markBlock = "block" // the policy signals entered and waits for release
)

// testPolicy picks the candidate named by req.RoutingKey (else the first), panics on
// markPanic and blocks on markBlock. It counts its calls.
type testPolicy struct {
	entered chan struct{}
	release chan struct{}
	calls   atomic.Int64
}

var _ engine.Policy = (*testPolicy)(nil)

func newTestPolicy() *testPolicy {
	return &testPolicy{entered: make(chan struct{}, 16), release: make(chan struct{})}
}

func (*testPolicy) Name() string { return "test" }

func (p *testPolicy) Pick(c []*engine.Worker, req *engine.PickRequest) (engine.Pick, error) {
	p.calls.Add(1)
	switch req.SessionKey {
	case markPanic:
		panic("test policy: marked request")
	case markBlock:
		p.entered <- struct{}{}
		<-p.release
	}
	for _, w := range c {
		if w.ID == req.RoutingKey {
			return engine.Pick{Worker: w, Reason: "named"}, nil
		}
	}
	return engine.Pick{Worker: c[0], Reason: "first"}, nil
}

// workers returns n healthy workers of stage named prefix1..prefixN.
func workers(prefix string, n int, stage engine.Stage) []*engine.Worker {
	out := make([]*engine.Worker, n)
	for i := range out {
		id := fmt.Sprintf("%s%d", prefix, i+1)
		out[i] = engine.NewWorker(id, "http://127.0.0.1:1", testModel, stage, nil)
	}
	return out
}

func workerSet(t testing.TB, ws ...[]*engine.Worker) *engine.WorkerSet {
	t.Helper()
	var all []*engine.Worker
	for _, w := range ws {
		all = append(all, w...)
	}
	s, err := engine.NewWorkerSet(all)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func plainBucket(id string, maxInput int64, p engine.Policy, members []string) *engine.Bucket {
	return &engine.Bucket{ID: id, MaxInput: maxInput, MaxContext: engine.Unbounded,
		Plain: engine.NewEngineGroup(testModel, engine.StagePlain, members, p)}
}

func pdBucket(id string, maxInput int64, pp, dp engine.Policy, prefill, decode []string) *engine.Bucket {
	return &engine.Bucket{ID: id, MaxInput: maxInput, MaxContext: engine.Unbounded,
		Prefill: engine.NewEngineGroup(testModel, engine.StagePrefill, prefill, pp),
		Decode:  engine.NewEngineGroup(testModel, engine.StageDecode, decode, dp)}
}

func resolvers(buckets ...*engine.Bucket) map[string]*engine.BucketResolver {
	return map[string]*engine.BucketResolver{testModel: engine.NewBucketResolver(testModel, buckets)}
}

// newTestSelector builds a Selector and closes it when the test ends.
func newTestSelector(t testing.TB, ws *engine.WorkerSet, cfg config.Actors, logger *slog.Logger, buckets ...*engine.Bucket) *Selector {
	t.Helper()
	sys, _ := newObservedSystem(t, nil, logger)
	s, err := NewSelector(resolvers(buckets...), ws, cfg, SelectorOptions{System: sys, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func request(input int64) *engine.BucketRequest {
	return &engine.BucketRequest{Model: testModel, InputTokens: input, ExpectedPeak: -1, Now: time.Unix(1000, 0)}
}

func requestFor(input int64, session, routing string) *engine.BucketRequest {
	r := request(input)
	r.SessionKey, r.RoutingKey = session, routing
	return r
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startPick sends a pick without waiting: picks started in order from one goroutine reach
// the bucket actor in that order.
func startPick(t testing.TB, s *Selector, b *engine.Bucket, req *engine.BucketRequest) func() (engine.BucketPick, error) {
	t.Helper()
	bh := s.buckets[b]
	if bh == nil {
		t.Fatalf("bucket %s not hosted", b.ID)
	}
	c := s.start(bh, req)
	return func() (engine.BucketPick, error) { return s.await(bh, c) }
}

func pickErrOf(t testing.TB, err error) *engine.PickError {
	t.Helper()
	pe, ok := err.(*engine.PickError)
	if !ok {
		t.Fatalf("error %v (%T) is not a *engine.PickError", err, err)
	}
	return pe
}

func suspendMailbox() any { return &actor.SuspendMailbox{} }

func resumeMailbox() any { return &actor.ResumeMailbox{} }

// observer is a test's handle on a System's Observe seam: set swaps the function every
// actor runs before a command (nil: none).
type observer struct{ f atomic.Pointer[func(any)] }

func (o *observer) set(f func(msg any)) {
	if f == nil {
		o.f.Store(nil)
		return
	}
	o.f.Store(&f)
}

func (o *observer) observe(_ Kind, msg any) {
	if f := o.f.Load(); f != nil {
		(*f)(msg)
	}
}

// newObservedSystem returns a System (closed when the test ends, after the components the
// test closes itself) whose Observe runs what the returned observer is set to.
func newObservedSystem(t testing.TB, set *metrics.Set, logger ...*slog.Logger) (*System, *observer) {
	t.Helper()
	o := &observer{}
	opts := SystemOptions{Metrics: set, Observe: o.observe}
	if len(logger) > 0 {
		opts.Logger = logger[0]
	}
	sys := NewSystem(opts)
	t.Cleanup(sys.Close)
	observers.Store(sys, o)
	return sys, o
}

// observers maps the test Systems to their observers (see obsOf).
var observers sync.Map // *System → *observer

// obsOf returns the observer of a System made by newObservedSystem.
func obsOf(t testing.TB, sys *System) *observer {
	t.Helper()
	o, ok := observers.Load(sys)
	if !ok {
		t.Fatal("BUG: the component does not run on an observed system")
	}
	return o.(*observer)
}
