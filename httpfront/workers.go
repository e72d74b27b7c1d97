package httpfront

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/actors"
	"switchyard/config"
	"switchyard/engine"
	"switchyard/load"
)

// Telemetry starts and stops the load ingestion of one worker (HTTP polling of /v1/loads or
// /get_load, or the ZMQ load gauge) and publishes the load table the policies read. The
// actors package provides the implementation; outsiders implement it, hence exported.
type Telemetry interface {
	// StartWorker begins ingesting src's load reports. It must not block on the network.
	StartWorker(src TelemetrySource) error
	// StopWorker ends the worker's ingestion and forgets its reports.
	StopWorker(id string)
}

// TelemetrySource describes one worker to its telemetry.
type TelemetrySource struct {
	// WorkerID is the worker's stable ID.
	WorkerID string
	// URL is the engine's base URL.
	URL string
	// DPSize is the number of data-parallel ranks (at least 1).
	DPSize int
	// Counters are the worker's router-local counters (dispatch correction).
	Counters *load.Counters
	// GaugeEndpoints are the engine's ZMQ load-gauge endpoints, one per DP rank, when it
	// advertises them (or the configuration names one); nil otherwise.
	GaugeEndpoints []string
	// Flavor is the worker's configured flavour (auto, sglang, vllm; "" is auto).
	Flavor string
	// MetricsPath is the engine's Prometheus page ("" is /metrics).
	MetricsPath string
	// Model is the served model name.
	Model string
}

// loadStatuser is implemented by a Telemetry that can say where a worker's load comes from,
// for GET /workers and the metrics.
type loadStatuser interface {
	LoadStatus(id string) (actors.LoadStatus, bool)
}

// Sentinel errors of the worker admin operations.
var (
	ErrWorkerExists   = errors.New("worker already exists")
	ErrWorkerNotFound = errors.New("worker not found")
	ErrInvalidWorker  = errors.New("invalid worker")
)

// WorkerSpec describes a worker to add (configuration or POST /workers). Empty fields are
// filled by introspection.
type WorkerSpec struct {
	ID            string `json:"id"`
	URL           string `json:"url"`
	Model         string `json:"model"`
	Role          string `json:"role"`
	BootstrapPort *int   `json:"bootstrap_port"`
	DPSize        int    `json:"dp_size"`
	LoadPublish   string `json:"load_publish"`
	// KVEvents is the engine's KV-event publisher endpoint ("tcp://host:port") for
	// cache_aware; empty: the one /server_info advertises.
	KVEvents string `json:"kv_events"`
	// Flavor is auto, sglang or vllm ("" is auto). A vllm worker is never introspected (it
	// has no /server_info): its model must be given.
	Flavor string `json:"flavor"`
	// MetricsPath is the engine's Prometheus page; "" is /metrics.
	MetricsPath string `json:"metrics_path"`
}

// introspects reports whether the worker's engine has /server_info to ask.
func (s *WorkerSpec) introspects() bool { return s.Flavor != config.FlavorVLLM }

// workerState is the router's view of one worker: its engine.Worker, HTTP client, health
// check counters, breaker and introspection result.
type workerState struct {
	id       string
	url      string
	hostPort string
	// bootstrapHost is the host of the worker's URL (PD bootstrap_host).
	bootstrapHost string
	client        *fasthttp.HostClient
	breaker       *breaker
	worker        atomic.Pointer[engine.Worker]
	info          atomic.Pointer[ServerInfo]
	spec          WorkerSpec

	// healthOK is the health-check verdict; succ and fail are owned by the health loop.
	healthOK   atomic.Bool
	succ, fail int

	mu       sync.Mutex // serializes eligibility updates
	cancel   context.CancelFunc
	done     chan struct{}
	ungauge  func()
	unsource func()
}

// workerManager owns the worker lifecycle: registry membership, introspection, active health
// checks, circuit breakers and telemetry. Add and Remove serialize on mu; the dispatch path
// reads the states map snapshot without locks.
type workerManager struct {
	mu      sync.Mutex
	states  atomic.Pointer[map[string]*workerState]
	set     *engine.WorkerSet
	tracker *load.Tracker
	health  config.Health
	probe   *fasthttp.Client
	tele    Telemetry
	metrics *serverMetrics
	logger  *slog.Logger
	now     func() time.Time
	maxConn int

	// upstream tracks every connection dialed to an engine so that a hard stop can close them.
	upstream connSet

	// ctx is the lifetime of health loops, set by start; wg waits for them.
	ctx     context.Context
	wg      sync.WaitGroup
	started bool
}

func newWorkerManager(set *engine.WorkerSet, tracker *load.Tracker, health config.Health, tele Telemetry,
	m *serverMetrics, logger *slog.Logger, now func() time.Time) *workerManager {
	wm := &workerManager{
		set:     set,
		tracker: tracker,
		health:  health,
		probe: &fasthttp.Client{
			Name:                     "switchyard-probe",
			NoDefaultUserAgentHeader: true,
			MaxResponseBodySize:      maxInfoBody,
			MaxConnsPerHost:          4,
			MaxIdleConnDuration:      time.Minute,
		},
		tele:    tele,
		metrics: m,
		logger:  logger,
		now:     now,
		maxConn: 8192,
	}
	empty := map[string]*workerState{}
	wm.states.Store(&empty)
	return wm
}

// state returns the worker's state, or nil.
func (m *workerManager) state(id string) *workerState { return (*m.states.Load())[id] }

// all returns every state sorted by ID.
func (m *workerManager) all() []*workerState {
	st := *m.states.Load()
	out := slices.Collect(maps.Values(st))
	slices.SortFunc(out, func(a, b *workerState) int {
		if a.id < b.id {
			return -1
		}
		if a.id > b.id {
			return 1
		}
		return 0
	})
	return out
}

// newState builds a worker's state from spec and the worker it registers.
func (m *workerManager) newState(spec WorkerSpec, w *engine.Worker) (*workerState, error) {
	hp, tls, err := urlHostPort(spec.URL)
	if err != nil {
		return nil, fmt.Errorf("cannot add worker %q: %w: %w", spec.ID, ErrInvalidWorker, err)
	}
	st := &workerState{
		id:            w.ID,
		url:           w.URL,
		hostPort:      hp,
		bootstrapHost: urlHost(spec.URL),
		breaker:       newBreaker(m.health.BreakerFailures, m.health.BreakerCooldown),
		spec:          spec,
		client: &fasthttp.HostClient{
			Addr:                          hp,
			IsTLS:                         tls,
			Name:                          "switchyard",
			NoDefaultUserAgentHeader:      true,
			MaxConns:                      m.maxConn,
			MaxConnWaitTimeout:            10 * time.Second,
			MaxIdleConnDuration:           30 * time.Second,
			DisablePathNormalizing:        true,
			DisableHeaderNamesNormalizing: false,
			ReadBufferSize:                16 << 10,
			WriteBufferSize:               16 << 10,
			Dial:                          m.upstream.dial,
		},
	}
	st.worker.Store(w)
	st.healthOK.Store(w.Healthy())
	return st, nil
}

// buildWorker makes the engine.Worker of spec with info applied (explicit spec fields win).
func (m *workerManager) buildWorker(spec WorkerSpec, info *ServerInfo) (*engine.Worker, error) {
	role := config.Role(spec.Role)
	if role == "" && info != nil {
		role = config.Role(info.Mode)
	}
	if role == "" {
		role = config.RolePlain
	}
	stage, ok := engine.StageOf(role)
	if !ok {
		return nil, fmt.Errorf("cannot add worker %q: %w: unknown role %q", spec.ID, ErrInvalidWorker, spec.Role)
	}
	model := spec.Model
	if model == "" && info != nil {
		model = info.Model()
	}
	if model == "" {
		return nil, fmt.Errorf("cannot add worker %q: %w: no model given and none introspected", spec.ID, ErrInvalidWorker)
	}
	w := engine.NewWorker(spec.ID, spec.URL, model, stage, m.tracker.Counters(spec.ID))
	switch {
	case spec.BootstrapPort != nil:
		w.BootstrapPort = *spec.BootstrapPort
	case info != nil && stage == engine.StagePrefill:
		w.BootstrapPort = info.BootstrapPort
	}
	switch {
	case info != nil && info.DPSize > 0:
		w.DPSize = info.DPSize
	case spec.DPSize > 0:
		w.DPSize = spec.DPSize
	}
	if info != nil && spec.Model != "" && info.Model() != "" && info.Model() != spec.Model &&
		info.ModelPath != spec.Model {
		m.logger.Warn("worker serves a different model than configured",
			slog.String("worker", spec.ID), slog.String("configured", spec.Model), slog.String("introspected", info.Model()))
	}
	if info != nil && spec.Role != "" && config.Role(info.Mode) != role && !(info.Mode == "" && role == config.RolePlain) {
		m.logger.Warn("worker reports a different role than configured",
			slog.String("worker", spec.ID), slog.String("configured", string(role)), slog.String("introspected", info.Mode))
	}
	return w, nil
}

// add registers a worker: introspection (bounded by the health timeout) fills what spec
// leaves empty; a worker whose introspection fails is added only when spec names its model,
// and starts unhealthy until its health checks pass. healthy is the initial verdict.
func (m *workerManager) add(ctx context.Context, spec WorkerSpec, introspectNow bool) (*workerState, error) {
	if spec.URL == "" {
		return nil, fmt.Errorf("cannot add worker: %w: url is required", ErrInvalidWorker)
	}
	if _, _, err := urlHostPort(spec.URL); err != nil {
		return nil, fmt.Errorf("cannot add worker: %w: %w", ErrInvalidWorker, err)
	}
	if spec.ID == "" {
		hp, _, _ := urlHostPort(spec.URL)
		spec.ID = hp
	}
	if m.state(spec.ID) != nil {
		return nil, fmt.Errorf("cannot add worker %q: %w", spec.ID, ErrWorkerExists)
	}
	switch spec.Flavor {
	case "", config.FlavorAuto, config.FlavorSGLang, config.FlavorVLLM:
	default:
		return nil, fmt.Errorf("cannot add worker %q: %w: unknown flavor %q (auto, sglang or vllm)", spec.ID, ErrInvalidWorker, spec.Flavor)
	}
	if spec.MetricsPath != "" && spec.MetricsPath[0] != '/' {
		return nil, fmt.Errorf("cannot add worker %q: %w: metrics_path %q is not an absolute path", spec.ID, ErrInvalidWorker, spec.MetricsPath)
	}
	var info *ServerInfo
	healthy := true
	if introspectNow && spec.introspects() {
		i, err := introspect(ctx, m.probe, trimSlash(spec.URL), m.health.Timeout)
		if err != nil {
			if spec.Model == "" {
				return nil, err
			}
			m.logger.Warn("worker introspection failed; adding it unhealthy",
				slog.String("worker", spec.ID), slog.Any("error", err))
			healthy = false
		} else {
			info = &i
		}
	}
	w, err := m.buildWorker(spec, info)
	if err != nil {
		return nil, err
	}
	st, err := m.newState(spec, w)
	if err != nil {
		return nil, err
	}
	if info != nil {
		st.info.Store(info)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.state(spec.ID) != nil {
		return nil, fmt.Errorf("cannot add worker %q: %w", spec.ID, ErrWorkerExists)
	}
	if !healthy {
		st.healthOK.Store(false)
		// Not yet published: no other goroutine sees w.
		if err := m.set.Add(w); err != nil {
			return nil, fmt.Errorf("cannot add worker %q: %w", spec.ID, err)
		}
		m.set.SetHealthy(w.ID, false)
	} else if err := m.set.Add(w); err != nil {
		return nil, fmt.Errorf("cannot add worker %q: %w", spec.ID, err)
	}
	next := maps.Clone(*m.states.Load())
	next[st.id] = st
	m.states.Store(&next)
	st.ungauge = m.metrics.workerGauges(st.id,
		func() float64 { return float64(st.worker.Load().Counters.InFlight()) },
		func() float64 { return b2f(st.worker.Load().Healthy()) },
		func() float64 { return float64(st.breaker.State()) })
	m.startTelemetry(st)
	if ls, ok := m.tele.(loadStatuser); ok {
		st.unsource = m.metrics.loadSourceGauges(st.id, func() load.Source {
			s, _ := ls.LoadStatus(st.id)
			return s.Source
		})
	}
	if m.started {
		m.startHealth(st)
	}
	m.logger.Info("worker added", slog.String("worker", st.id), slog.String("url", st.url),
		slog.String("model", w.Model), slog.String("role", w.Stage.String()), slog.Bool("healthy", healthy))
	return st, nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func trimSlash(u string) string {
	for len(u) > 0 && u[len(u)-1] == '/' {
		u = u[:len(u)-1]
	}
	return u
}

func (m *workerManager) startTelemetry(st *workerState) {
	if m.tele == nil {
		return
	}
	w := st.worker.Load()
	src := TelemetrySource{WorkerID: w.ID, URL: w.URL, DPSize: w.DPSize, Counters: w.Counters,
		Flavor: st.spec.Flavor, MetricsPath: st.spec.MetricsPath, Model: w.Model}
	if st.spec.LoadPublish != "" {
		src.GaugeEndpoints = []string{st.spec.LoadPublish}
	} else if info := st.info.Load(); info != nil {
		src.GaugeEndpoints = info.GaugeEndpoints(w.URL)
	}
	if err := m.tele.StartWorker(src); err != nil {
		m.logger.Warn("cannot start worker telemetry", slog.String("worker", w.ID), slog.Any("error", err))
	}
}

// remove unregisters a worker, stops its health checks and telemetry. In-flight requests to
// it finish normally.
func (m *workerManager) remove(id string) error {
	m.mu.Lock()
	st := m.state(id)
	if st == nil {
		m.mu.Unlock()
		return fmt.Errorf("cannot remove worker %q: %w", id, ErrWorkerNotFound)
	}
	next := maps.Clone(*m.states.Load())
	delete(next, id)
	m.states.Store(&next)
	m.set.Remove(id)
	m.mu.Unlock()
	m.stopWorker(st)
	m.logger.Info("worker removed", slog.String("worker", id))
	return nil
}

func (m *workerManager) stopWorker(st *workerState) {
	if st.cancel != nil {
		st.cancel()
		<-st.done
	}
	if m.tele != nil {
		m.tele.StopWorker(st.id)
	}
	if st.unsource != nil {
		st.unsource()
	}
	if st.ungauge != nil {
		st.ungauge()
	}
	st.client.CloseIdleConnections()
}

// start begins the health loops under ctx. Call once.
func (m *workerManager) start(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ctx = ctx
	m.started = true
	for _, st := range *m.states.Load() {
		m.startHealth(st)
	}
}

// startHealth starts st's health loop; m.mu must be held and m.started set.
func (m *workerManager) startHealth(st *workerState) {
	if m.health.Interval <= 0 {
		return
	}
	ctx, cancel := context.WithCancel(m.ctx)
	st.cancel = cancel
	st.done = make(chan struct{})
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer close(st.done)
		defer func() {
			if r := recover(); r != nil {
				m.logger.Error("health loop panicked", slog.String("worker", st.id), slog.Any("panic", r))
			}
		}()
		t := time.NewTicker(m.health.Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				m.checkOnce(ctx, st)
			}
		}
	}()
}

// stop ends every health loop and telemetry and waits for them.
func (m *workerManager) stop() {
	m.mu.Lock()
	states := m.all()
	m.mu.Unlock()
	for _, st := range states {
		m.stopWorker(st)
	}
	m.wg.Wait()
	m.probe.CloseIdleConnections()
}

// checkOnce runs one health round for st: the health check, then the breaker's cool-down.
func (m *workerManager) checkOnce(ctx context.Context, st *workerState) {
	ok := m.healthCheck(ctx, st)
	m.observeHealth(ctx, st, ok)
	if st.breaker.probe(m.now()) {
		m.logger.Info("worker breaker half-open: next dispatch probes it", slog.String("worker", st.id))
		m.refresh(st)
	}
}

func (m *workerManager) healthCheck(ctx context.Context, st *workerState) bool {
	_, status, err := getJSON(ctx, m.probe, trimSlash(st.url)+pathHealth, m.health.Timeout)
	return err == nil && status == fasthttp.StatusOK
}

// observeHealth applies one health-check result with the failure and success thresholds.
// It is called by st's health loop only.
func (m *workerManager) observeHealth(ctx context.Context, st *workerState, ok bool) {
	if ok {
		st.fail = 0
		st.succ++
		if !st.healthOK.Load() && st.succ >= max(m.health.SuccessThreshold, 1) {
			if st.info.Load() == nil {
				m.reintrospect(ctx, st)
			}
			st.healthOK.Store(true)
			m.logger.Info("worker healthy", slog.String("worker", st.id))
			m.refresh(st)
		}
		return
	}
	st.succ = 0
	st.fail++
	if st.healthOK.Load() && st.fail >= max(m.health.FailureThreshold, 1) {
		st.healthOK.Store(false)
		m.logger.Warn("worker unhealthy", slog.String("worker", st.id), slog.Int("consecutive_failures", st.fail))
		m.refresh(st)
	}
}

// reintrospect fetches the server info of a worker added without it and, when it changes
// what dispatch needs (bootstrap port, DP size), republishes the worker.
func (m *workerManager) reintrospect(ctx context.Context, st *workerState) {
	if !st.spec.introspects() {
		return
	}
	info, err := introspect(ctx, m.probe, trimSlash(st.url), m.health.Timeout)
	if err != nil {
		return
	}
	st.info.Store(&info)
	old := st.worker.Load()
	w, err := m.buildWorker(st.spec, &info)
	if err != nil || (w.BootstrapPort == old.BootstrapPort && w.DPSize == old.DPSize && w.Model == old.Model && w.Stage == old.Stage) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.state(st.id) != st {
		return
	}
	m.set.Remove(st.id)
	if err := m.set.Add(w); err != nil {
		m.logger.Error("cannot republish introspected worker", slog.String("worker", st.id), slog.Any("error", err))
		_ = m.set.Add(old)
		return
	}
	m.set.SetHealthy(st.id, false)
	st.worker.Store(w)
}

// eligible reports whether st may receive traffic: healthy and its breaker not open.
func (st *workerState) eligible() bool {
	return st.healthOK.Load() && st.breaker.State() != BreakerOpen
}

// refresh publishes st's eligibility to the registry.
func (m *workerManager) refresh(st *workerState) {
	st.mu.Lock()
	m.set.SetHealthy(st.id, st.eligible())
	st.mu.Unlock()
}

// dispatched records a dispatch outcome on st's breaker. failed means a transport failure,
// a timeout or a 5xx answer; client-caused endings count as neither.
func (m *workerManager) dispatched(st *workerState, failed bool) {
	if st == nil {
		return
	}
	if failed {
		if st.breaker.failure(m.now()) {
			m.logger.Warn("worker breaker opened", slog.String("worker", st.id))
			m.refresh(st)
		}
		return
	}
	if st.breaker.success() {
		m.logger.Info("worker breaker closed", slog.String("worker", st.id))
		m.refresh(st)
	}
}

// connSet tracks live upstream connections.
type connSet struct {
	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	dialer net.Dialer
}

type trackedConn struct {
	net.Conn
	set  *connSet
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.set.mu.Lock()
		delete(c.set.conns, c)
		c.set.mu.Unlock()
	})
	return c.Conn.Close()
}

// dial is the engines' HostClient dialer.
func (s *connSet) dial(addr string) (net.Conn, error) {
	d := s.dialer
	d.Timeout = 10 * time.Second
	d.KeepAlive = 30 * time.Second
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, set: s}
	s.mu.Lock()
	if s.conns == nil {
		s.conns = make(map[*trackedConn]struct{})
	}
	s.conns[tc] = struct{}{}
	s.mu.Unlock()
	return tc, nil
}

// closeAll closes every live upstream connection: requests on them fail at once.
func (s *connSet) closeAll() {
	s.mu.Lock()
	conns := make([]*trackedConn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}
