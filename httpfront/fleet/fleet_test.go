package fleet

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/kv/subscribe"
	"switchyard/load"
)

// manualClock is a Clock advanced by the test; Advance runs the timers that fall due.
type manualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*manualTimer
}

type manualTimer struct {
	at   time.Time
	f    func()
	done bool
}

func newManualClock() *manualClock { return &manualClock{now: t0} }

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	tm := &manualTimer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, tm)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		was := !tm.done
		tm.done = true
		return was
	}
}

// pending is the number of timers neither fired nor stopped.
func (c *manualClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, tm := range c.timers {
		if !tm.done {
			n++
		}
	}
	return n
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*manualTimer
	for _, tm := range c.timers {
		if !tm.done && !tm.at.After(c.now) {
			tm.done = true
			due = append(due, tm)
		}
	}
	c.mu.Unlock()
	for _, tm := range due {
		tm.f()
	}
}

// recorder is a Telemetry and a KVFollower recording what the lifecycle tells them.
type recorder struct {
	mu      sync.Mutex
	started []TelemetrySource
	stopped []string
	kv      []subscribe.WorkerSpec
	kvGone  []string
	changed chan struct{}
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{}, 64)} }

func (r *recorder) note() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *recorder) StartWorker(src TelemetrySource) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.started = append(r.started, src)
	r.note()
	return nil
}

func (r *recorder) StopWorker(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = append(r.stopped, id)
}

func (r *recorder) AddWorker(spec subscribe.WorkerSpec) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kv = append(r.kv, spec)
	r.note()
	return nil
}

func (r *recorder) RemoveWorker(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kvGone = append(r.kvGone, id)
}

// waitFor waits until cond holds, re-checking each time the recorder hears something.
func (r *recorder) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-r.changed:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

var (
	_ Telemetry  = (*recorder)(nil)
	_ KVFollower = (*recorder)(nil)
)

// testEngine is an SGLang-like engine answering /health (status health, 200 when 0) and
// /server_info with info ("" : 404, as vLLM).
type testEngine struct {
	url    string
	health atomic.Int32
	info   atomic.Pointer[string]
	// asked counts introspection requests.
	asked atomic.Int32
	// infoStatus, when not 0, is the status of every introspection answer (an engine not
	// ready yet).
	infoStatus atomic.Int32
	// models, when set, is the /v1/models answer.
	models atomic.Pointer[string]
}

func newTestEngine(t *testing.T, info string) *testEngine {
	t.Helper()
	e := &testEngine{}
	e.info.Store(&info)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case PathHealth:
			if s := e.health.Load(); s != 0 {
				w.WriteHeader(int(s))
			}
		case PathServerInfo:
			e.asked.Add(1)
			if s := e.infoStatus.Load(); s != 0 {
				w.WriteHeader(int(s))
				return
			}
			if body := *e.info.Load(); body != "" {
				fmt.Fprint(w, body)
				return
			}
			http.NotFound(w, r)
		case PathModels:
			if body := e.models.Load(); body != nil {
				fmt.Fprint(w, *body)
				return
			}
			http.NotFound(w, r)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	e.url = srv.URL
	return e
}

// testFleet is a Fleet over a new worker set with short checks.
func testFleet(t *testing.T, clock Clock, rec *recorder, dial DialFunc) (*Fleet, *engine.WorkerSet) {
	t.Helper()
	ws, err := engine.NewWorkerSet(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Health.Interval = time.Hour // tests drive the rounds, or the loop's start
	cfg.Health.FailureThreshold = 2
	cfg.Health.BreakerFailures = 2
	opts := Options{Health: cfg.Health, Upstream: cfg.Upstream, Tracker: load.NewTracker(), Metrics: metrics.NewSet(),
		Clock: clock, Dial: dial}
	if rec != nil {
		opts.Telemetry, opts.KV = rec, rec
	}
	f := New(ws, opts)
	t.Cleanup(func() {
		f.Stop()
		f.CloseConnections()
	})
	return f, ws
}

const prefillInfo = `{"model_path":"/models/llama","served_model_name":"llama","disaggregation_mode":"prefill",
	"disaggregation_bootstrap_port":"8998","dp_size":"2","page_size":16,
	"kv_events":{"publisher":"zmq","endpoint_host":"*","endpoint_port_base":"5557","load_endpoint_port_base":5600,"block_size":32}}`

// TestAddIntrospects: a worker added at run time learns its facts from one introspection,
// which feeds the registry, the telemetry and the KV subscriptions, and serves at once.
func TestAddIntrospects(t *testing.T) {
	e := newTestEngine(t, prefillInfo)
	rec := newRecorder()
	f, ws := testFleet(t, nil, rec, nil)
	m, err := f.Add(context.Background(), Spec{URL: e.url, ID: "P"}, true)
	if err != nil {
		t.Fatal(err)
	}
	w := ws.Load().Worker("P")
	if w == nil || !w.Healthy() || w.Model != "llama" || w.Stage != engine.StagePrefill || w.BootstrapPort != 8998 || w.DPSize != 2 {
		t.Fatalf("registered %+v", w)
	}
	if MemberOf(w) != m {
		t.Fatal("the registry's worker does not lead to its lifecycle state")
	}
	host := urlHost(e.url)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.started) != 1 || rec.started[0].DPSize != 2 || rec.started[0].Client == nil ||
		!slices.Equal(rec.started[0].GaugeEndpoints, []string{"tcp://" + host + ":5600", "tcp://" + host + ":5601"}) {
		t.Fatalf("telemetry %+v", rec.started)
	}
	if len(rec.kv) != 1 || len(rec.kv[0].Publishers) != 2 || rec.kv[0].Publishers[1].Endpoint != "tcp://"+host+":5558" || rec.kv[0].BlockSize != 32 {
		t.Fatalf("kv %+v", rec.kv)
	}
}

func TestAddWithoutIntrospection(t *testing.T) {
	vllm := newTestEngine(t, "")
	f, ws := testFleet(t, nil, nil, nil)
	if _, err := f.Add(context.Background(), Spec{URL: vllm.url, ID: "V"}, true); !errors.Is(err, ErrNoIntrospection) {
		t.Fatalf("no model given nor introspected: %v", err)
	}
	if ws.Load().Worker("V") != nil {
		t.Fatal("refused worker registered")
	}
	if _, err := f.Add(context.Background(), Spec{URL: vllm.url, ID: "V", Model: "m"}, true); err != nil {
		t.Fatal(err)
	}
	if w := ws.Load().Worker("V"); w == nil || !w.Healthy() {
		t.Fatal("a vLLM worker whose health check passes is not serving at once")
	}
	down := newTestEngine(t, "")
	down.health.Store(503)
	if _, err := f.Add(context.Background(), Spec{URL: down.url, ID: "D", Model: "m"}, true); err != nil {
		t.Fatal(err)
	}
	if ws.Load().Worker("D").Healthy() {
		t.Fatal("a worker whose health check fails was added healthy")
	}
	if _, err := f.Add(context.Background(), Spec{URL: down.url, ID: "D", Model: "m"}, true); !errors.Is(err, ErrWorkerExists) {
		t.Fatalf("duplicate: %v", err)
	}
	if _, err := f.Add(context.Background(), Spec{URL: "ftp://x"}, true); !errors.Is(err, ErrInvalidWorker) {
		t.Fatalf("bad URL: %v", err)
	}
}

// TestConfiguredWorkerLearnsItsFacts: a configured worker, added without introspection, is
// introspected when its health loop starts; the KV subscriptions get its publishers and the
// telemetry its DP size.
func TestConfiguredWorkerLearnsItsFacts(t *testing.T) {
	e := newTestEngine(t, prefillInfo)
	rec := newRecorder()
	f, ws := testFleet(t, nil, rec, nil)
	if _, err := f.Add(context.Background(), Spec{URL: e.url, ID: "P", Model: "llama", Role: "prefill"}, false); err != nil {
		t.Fatal(err)
	}
	if w := ws.Load().Worker("P"); w.DPSize != 1 || w.BootstrapPort != 0 {
		t.Fatalf("before introspection %+v", w)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.Start(ctx)
	rec.waitFor(t, "the KV publishers", func() bool { return len(rec.kv) == 1 && len(rec.kv[0].Publishers) == 2 })
	rec.waitFor(t, "the telemetry restarted", func() bool { return len(rec.started) == 2 && rec.started[1].DPSize == 2 })
	if w := ws.Load().Worker("P"); w.DPSize != 2 || w.BootstrapPort != 8998 || !w.Healthy() {
		t.Fatalf("after introspection %+v", w)
	}
}

// TestBreakerThroughTheRegistry: a breaker's changes reach the registry at once (the next
// pick), the cool-down's end turns it half-open without a health round, and half-open it
// takes one probe at a time.
func TestBreakerThroughTheRegistry(t *testing.T) {
	e := newTestEngine(t, `{"model_path":"m"}`)
	clock := newManualClock()
	f, ws := testFleet(t, clock, nil, nil)
	m, err := f.Add(context.Background(), Spec{URL: e.url, ID: "A"}, true)
	if err != nil {
		t.Fatal(err)
	}
	eligible := func() bool { return ws.Load().Worker("A").Healthy() }
	for range 2 {
		tk, ok := m.Admit(t0)
		if !ok {
			t.Fatal("a closed breaker refused")
		}
		tk.Done(OutcomeFailure)
	}
	if m.Breaker().State() != BreakerOpen || eligible() {
		t.Fatal("an open breaker's worker is still eligible")
	}
	clock.Advance(29 * time.Second)
	if eligible() {
		t.Fatal("eligible before the cool-down ended")
	}
	clock.Advance(time.Second)
	if m.Breaker().State() != BreakerHalfOpen || !eligible() {
		t.Fatal("the cool-down's end did not make the worker eligible for its probe")
	}
	probe, ok := m.Admit(t0)
	if !ok || !probe.Probe() {
		t.Fatal("the first dispatch is not the probe")
	}
	if eligible() {
		t.Fatal("the worker stays eligible while its probe is in flight")
	}
	if _, ok := m.Admit(t0); ok {
		t.Fatal("a second dispatch went through during the probe")
	}
	probe.Done(OutcomeSuccess)
	if m.Breaker().State() != BreakerClosed || !eligible() {
		t.Fatal("a good probe did not close the breaker")
	}
	// Open again, then removed: its cool-down timer is stopped.
	for range 2 {
		tk, _ := m.Admit(t0)
		tk.Done(OutcomeFailure)
	}
	if clock.pending() != 1 {
		t.Fatalf("%d pending timers, want the cool-down", clock.pending())
	}
	if err := f.Remove("A"); err != nil {
		t.Fatal(err)
	}
	if clock.pending() != 0 {
		t.Fatal("the removed worker's cool-down timer still runs")
	}
	if _, ok := m.Admit(t0); ok {
		t.Fatal("a removed worker admitted a dispatch")
	}
}

// TestHealthChecksOfTheRouterOwnFailures: a health check that cannot even open a connection
// for want of file descriptors says nothing about the engine; a refused connection does.
func TestHealthChecksOfTheRouterOwnFailures(t *testing.T) {
	e := newTestEngine(t, "")
	var failure atomic.Pointer[syscall.Errno]
	dial := func(network, addr string, timeout time.Duration) (net.Conn, error) {
		if errno := failure.Load(); errno != nil {
			return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("socket", *errno)}
		}
		return defaultDial(network, addr, timeout)
	}
	f, ws := testFleet(t, nil, nil, dial)
	m, err := f.Add(context.Background(), Spec{URL: e.url, ID: "A", Model: "m"}, false)
	if err != nil {
		t.Fatal(err)
	}
	emfile := syscall.EMFILE
	failure.Store(&emfile)
	for range 4 {
		f.CheckOnce(context.Background(), m)
	}
	if !ws.Load().Worker("A").Healthy() {
		t.Fatal("the router's own failures marked the engine unhealthy")
	}
	refused := syscall.ECONNREFUSED
	failure.Store(&refused)
	for range 2 {
		f.CheckOnce(context.Background(), m)
	}
	if ws.Load().Worker("A").Healthy() {
		t.Fatal("an engine refusing connections stayed healthy")
	}
}

// TestHealthEndpoint: health checks ask health.endpoint.
func TestHealthEndpoint(t *testing.T) {
	e := newTestEngine(t, "") // answers /health only
	ws, err := engine.NewWorkerSet(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Health.Endpoint = "/health_generate"
	cfg.Health.FailureThreshold = 1
	f := New(ws, Options{Health: cfg.Health, Upstream: cfg.Upstream})
	t.Cleanup(f.Stop)
	m, err := f.Add(context.Background(), Spec{URL: e.url, ID: "A", Model: "m"}, false)
	if err != nil {
		t.Fatal(err)
	}
	f.CheckOnce(context.Background(), m)
	if ws.Load().Worker("A").Healthy() {
		t.Fatal("a check of /health_generate, which the engine does not serve, passed")
	}
}

// TestVLLMFlavorIsNeverIntrospected: a worker declared flavor vllm is asked nothing it does
// not serve, and serves once a health check passes.
func TestVLLMFlavorIsNeverIntrospected(t *testing.T) {
	e := newTestEngine(t, prefillInfo)
	rec := newRecorder()
	f, ws := testFleet(t, nil, rec, nil)
	if _, err := f.Add(context.Background(), Spec{URL: e.url, ID: "V", Flavor: "vllm"}, true); !errors.Is(err, ErrInvalidWorker) {
		t.Fatalf("a vllm worker without a model: %v", err)
	}
	if _, err := f.Add(context.Background(), Spec{URL: e.url, ID: "V", Model: "m", Flavor: "vllm", MetricsPath: "/prom"}, true); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.StartupCheck(ctx)
	f.Start(ctx)
	f.CheckOnce(ctx, f.Member("V"))
	if n := e.asked.Load(); n != 0 {
		t.Fatalf("a vllm worker was introspected %d times", n)
	}
	if w := ws.Load().Worker("V"); !w.Healthy() || w.Model != "m" {
		t.Fatalf("%+v", w)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.started) != 1 || rec.started[0].Flavor != "vllm" || rec.started[0].MetricsPath != "/prom" || rec.started[0].Model != "m" {
		t.Fatalf("telemetry %+v", rec.started)
	}
	for _, bad := range []Spec{{URL: e.url, ID: "X", Model: "m", Flavor: "tgi"}, {URL: e.url, ID: "Y", Model: "m", MetricsPath: "metrics"}} {
		if _, err := f.Add(context.Background(), bad, true); !errors.Is(err, ErrInvalidWorker) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
}

// TestDeclaredKVFactsReachTheSubscription: the KV facts a worker declares (replay endpoint,
// block size, hash scheme) reach its KV subscription, also after introspection (a declared
// block size wins over the advertised one); a vllm worker is re-keyed and never asked for
// publishers; bad facts are refused.
func TestDeclaredKVFactsReachTheSubscription(t *testing.T) {
	e := newTestEngine(t, prefillInfo)
	rec := newRecorder()
	f, _ := testFleet(t, nil, rec, nil)
	spec := Spec{URL: e.url, ID: "P", KVReplay: "tcp://127.0.0.1:5700", KVBlockSize: 64, KVHashScheme: "sglang"}
	if _, err := f.Add(context.Background(), spec, true); err != nil {
		t.Fatal(err)
	}
	v := newTestEngine(t, "")
	if _, err := f.Add(context.Background(), Spec{URL: v.url, ID: "V", Model: "m", Flavor: "vllm", KVEvents: "tcp://127.0.0.1:5800"}, true); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	got := slices.Clone(rec.kv)
	rec.mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("kv %+v", got)
	}
	p, w := got[0], got[1]
	if p.Replay != "tcp://127.0.0.1:5700" || p.BlockSize != 64 || p.HashScheme != subscribe.HashSchemeSGLang || len(p.Publishers) != 2 {
		t.Fatalf("introspected worker's subscription %+v", p)
	}
	if w.KVEvents != "tcp://127.0.0.1:5800" || !w.NoDiscovery || w.HashScheme != subscribe.HashSchemeRekey {
		t.Fatalf("vllm worker's subscription %+v", w)
	}
	for _, bad := range []Spec{
		{URL: e.url, ID: "A", Model: "m", KVReplay: "5700"},
		{URL: e.url, ID: "B", Model: "m", KVBlockSize: -1},
		{URL: e.url, ID: "C", Model: "m", KVHashScheme: "vllm"},
	} {
		if _, err := f.Add(context.Background(), bad, true); !errors.Is(err, ErrInvalidWorker) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
}

// TestLabelsFromIntrospectionAndConfiguration: a worker's PD compatibility labels are the
// ones its /server_info reports with its configured ones over them; a configured worker
// learns the introspected ones when its health loop starts, and GET /workers' view shows
// them.
func TestLabelsFromIntrospectionAndConfiguration(t *testing.T) {
	e := newTestEngine(t, `{"model_path":"llama","disaggregation_mode":"decode","page_size":32,
		"disaggregation_transfer_backend":"nixl","tp_size":2}`)
	f, ws := testFleet(t, nil, nil, nil)
	spec := Spec{URL: e.url, ID: "D", Labels: map[string]string{"transfer_backend": "mooncake", "zone": "a"}}
	m, err := f.Add(context.Background(), spec, true)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"transfer_backend": "mooncake", "zone": "a", "tp_size": "2", "page_size": "32"}
	if got := ws.Load().Worker("D").Labels(); !maps.Equal(got, want) {
		t.Fatalf("labels %v, want %v", got, want)
	}
	if v := m.View(); !maps.Equal(v.Labels, want) || v.Learned.PrefillSamples != 0 || v.PendingPrefill.Requests != 0 {
		t.Fatalf("view %+v", v)
	}

	// Added without introspection: the configured labels at first, the introspected ones
	// once a health round has introspected it. Only the labels changed, so the worker is
	// the same *Worker: a request that excluded it after a failure still excludes it, and no
	// snapshot is published without it.
	f2, ws2 := testFleet(t, nil, nil, nil)
	m2, err := f2.Add(context.Background(), Spec{URL: e.url, ID: "D", Model: "llama", Role: "decode",
		Labels: map[string]string{"zone": "b"}}, false)
	if err != nil {
		t.Fatal(err)
	}
	before, reg := ws2.Load().Worker("D"), ws2.Load()
	if got := before.Labels(); !maps.Equal(got, map[string]string{"zone": "b"}) {
		t.Fatalf("before introspection %v", got)
	}
	f2.CheckOnce(context.Background(), m2)
	if w := ws2.Load().Worker("D"); w != before || ws2.Load() != reg {
		t.Fatal("a change of labels alone republished the worker")
	}
	// Labels the admin API sends are checked as configured ones are.
	for _, bad := range []map[string]string{{"a b": "x"}, {"": "x"}, {"zone": strings.Repeat("v", 300)}} {
		if _, err := f2.Add(context.Background(), Spec{URL: e.url, ID: "X", Model: "llama", Labels: bad}, false); !errors.Is(err, ErrInvalidWorker) {
			t.Errorf("labels %v: %v", bad, err)
		}
	}
	want2 := map[string]string{"zone": "b", "transfer_backend": "nixl", "tp_size": "2", "page_size": "32"}
	if got := ws2.Load().Worker("D").Labels(); !maps.Equal(got, want2) {
		t.Fatalf("after introspection %v, want %v", got, want2)
	}
}
