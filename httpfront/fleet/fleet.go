package fleet

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"switchyard/actors"
	"switchyard/config"
	"switchyard/engine"
	"switchyard/kv/subscribe"
	"switchyard/load"
	"switchyard/load/series"
)

// Sentinel errors of Add and Remove.
var (
	ErrWorkerExists   = errors.New("worker already exists")
	ErrWorkerNotFound = errors.New("worker not found")
	ErrInvalidWorker  = errors.New("invalid worker")
)

// Metric names of the lifecycle. Every handle is created when its worker is added (or at
// New) and kept.
const (
	MetricWorkerInflight = "switchyard_worker_inflight_requests"
	MetricWorkerHealthy  = "switchyard_worker_healthy"
	MetricWorkerBreaker  = "switchyard_worker_breaker_state"
	MetricStaleRetries   = "switchyard_upstream_stale_connection_retries_total"
	MetricRouterErrors   = "switchyard_router_errors_total"
	MetricLoadSource     = "switchyard_worker_load_source"
	// The learned service rates of the SLO estimates (load.Rates).
	MetricLearnedTTFTBase       = "switchyard_worker_learned_ttft_base_seconds"
	MetricLearnedPrefill        = "switchyard_worker_learned_prefill_tokens_per_second"
	MetricLearnedTPOTBase       = "switchyard_worker_learned_tpot_base_seconds"
	MetricLearnedTPOTPerRequest = "switchyard_worker_learned_tpot_per_request_seconds"
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
	// Client sends the worker's load polls: the worker's own probe client.
	Client load.Doer
	// Flavor is the worker's configured flavour (auto, sglang, vllm; "" is auto).
	Flavor string
	// MetricsPath is the engine's Prometheus page ("" is /metrics).
	MetricsPath string
	// Model is the served model name.
	Model string
}

// LoadSourcer is a Telemetry that can say where a worker's load currently comes from; the
// lifecycle then exports switchyard_worker_load_source for each worker.
type LoadSourcer interface {
	LoadSource(id string) (load.Source, bool)
}

// KVFollower follows the KV events of workers for cache_aware (actors.CacheState): the
// lifecycle names each worker's publishers once it knows them.
type KVFollower interface {
	AddWorker(spec subscribe.WorkerSpec) error
	RemoveWorker(id string)
}

// Options are a Fleet's settings and collaborators.
type Options struct {
	// Health holds the health-check and breaker settings.
	Health config.Health
	// Upstream holds the connection settings.
	Upstream config.Upstream
	// Tracker hands out the workers' router-local counters. Required.
	Tracker *load.Tracker
	// Telemetry, when set, ingests the workers' load.
	Telemetry Telemetry
	// KV, when set, follows the workers' KV events.
	KV KVFollower
	// Metrics receives the lifecycle's metrics. Default: a new set.
	Metrics *metrics.Set
	// Logger receives the lifecycle's logs. Default: discard.
	Logger *slog.Logger
	// Clock is the breakers' time. Default SystemClock.
	Clock Clock
	// Dial opens TCP connections to engines. Default: net.Dialer with TCP keep-alive.
	Dial DialFunc
	// TLS is the client TLS configuration of https:// workers (certificate authorities,
	// client certificate; LoadTLS reads upstream.tls), unless a worker has its own
	// (Spec.TLS); its ServerName defaults to each worker's host. Default: the system roots.
	TLS *tls.Config
	// AdapterRefresh, when positive, is how often each worker is asked for the LoRA adapters
	// it holds (RefreshAdapters); 0 never asks (lora.enabled off).
	AdapterRefresh time.Duration
	// AdapterSlots is an engine's adapter slots when it does not report them (0: unbounded).
	AdapterSlots int
	// AdapterNow is when an engine is asked for its adapter list (RefreshAdapters), on the
	// clock the router times its adapter loads and evictions on (engine.Worker.AddAdapter,
	// ReserveAdapter). Default: Clock's Now.
	AdapterNow func() time.Time
	// AdapterRoom, when set, is called with an engine's model when what the router learns
	// of it may have made room for an adapter: its adapter list lost one (the engine
	// unloaded it) or names one the router did not know (a full engine may evict it), or
	// its facts give it more slots. It must not block.
	AdapterRoom func(model string)
}

// Fleet owns the worker lifecycle: the sources of workers (configuration, admin API) and for
// each worker its registry entry, introspection, active health checks, circuit breaker,
// upstream client, telemetry and KV subscriptions. Add and Remove serialize on a mutex; the
// dispatch path reaches a worker's Member from its engine.Worker and takes no lock.
type Fleet struct {
	set     *engine.WorkerSet
	opts    Options
	health  config.Health
	breaker BreakerSettings
	clock   Clock
	logger  *slog.Logger
	metrics *metrics.Set
	t       *transport

	mu      sync.Mutex
	members map[string]*Member // guarded by mu
	ctx     context.Context    // lifetime of health loops, set by Start
	started bool
	stopped bool
	// jobs are the additions under way or failed recently, by URL (AddLater); guarded by mu.
	jobs map[string]*job
	wg   sync.WaitGroup
}

// New returns a Fleet publishing into set.
func New(set *engine.WorkerSet, opts Options) *Fleet {
	if opts.Metrics == nil {
		opts.Metrics = metrics.NewSet()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Clock == nil {
		opts.Clock = SystemClock{}
	}
	if opts.AdapterNow == nil {
		opts.AdapterNow = opts.Clock.Now
	}
	if opts.Dial == nil {
		opts.Dial = defaultDial
	}
	if opts.Tracker == nil {
		opts.Tracker = load.NewTracker()
	}
	f := &Fleet{
		set:     set,
		opts:    opts,
		health:  opts.Health,
		breaker: BreakerSettingsFrom(opts.Health),
		clock:   opts.Clock,
		logger:  opts.Logger,
		metrics: opts.Metrics,
		t:       newTransport(opts.Upstream, opts.Dial, opts.TLS),
		members: map[string]*Member{},
	}
	for k := KindConnLimit; k <= KindResources; k++ {
		f.t.routerErrors[k] = opts.Metrics.NewCounter(MetricRouterErrors + `{kind="` + k.MetricLabel() + `"}`)
	}
	return f
}

// Member returns the worker's lifecycle state, or nil.
func (f *Fleet) Member(id string) *Member {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.members[id]
}

// Members returns every worker's state sorted by ID.
func (f *Fleet) Members() []*Member {
	f.mu.Lock()
	out := slices.Collect(maps.Values(f.members))
	f.mu.Unlock()
	slices.SortFunc(out, func(a, b *Member) int { return strings.Compare(a.id, b.id) })
	return out
}

// Add registers a worker. With introspect (the admin API), the engine is introspected
// first, bounded by health.timeout: its facts fill what spec leaves empty and the worker is
// healthy at once; when introspection fails, the worker is added only if spec names its
// model, healthy if a health check passes at once, else until its checks pass. Without
// introspect (the configuration), the worker starts healthy with its configured facts and
// Start checks it. The worker's telemetry starts, and, for a worker added at run time, its
// KV-event subscriptions.
func (f *Fleet) Add(ctx context.Context, spec Spec, introspect bool) (*Member, error) {
	return f.add(ctx, spec, introspect, "")
}

// add is Add; a non-empty job is the URL of the background addition (AddLater) that adds
// the worker, whose job status ends as the worker is registered.
func (f *Fleet) add(ctx context.Context, spec Spec, introspect bool, job string) (*Member, error) {
	if spec.URL == "" {
		return nil, fmt.Errorf("cannot add worker: %w: url is required", ErrInvalidWorker)
	}
	hostPort, isTLS, err := urlHostPort(spec.URL)
	if err != nil {
		return nil, fmt.Errorf("cannot add worker: %w: %w", ErrInvalidWorker, err)
	}
	if spec.ID == "" {
		spec.ID = hostPort
	}
	switch spec.Flavor {
	case "", config.FlavorAuto, config.FlavorSGLang, config.FlavorVLLM:
	default:
		return nil, fmt.Errorf("cannot add worker %q: %w: unknown flavor %q (auto, sglang or vllm)", spec.ID, ErrInvalidWorker, spec.Flavor)
	}
	if spec.MetricsPath != "" && spec.MetricsPath[0] != '/' {
		return nil, fmt.Errorf("cannot add worker %q: %w: metrics_path %q is not an absolute path", spec.ID, ErrInvalidWorker, spec.MetricsPath)
	}
	if err := errors.Join(checkEngineFacts(spec), checkKVFacts(spec), checkLabels(spec)); err != nil {
		return nil, fmt.Errorf("cannot add worker %q: %w: %w", spec.ID, ErrInvalidWorker, err)
	}
	if f.Member(spec.ID) != nil {
		return nil, fmt.Errorf("cannot add worker %q: %w", spec.ID, ErrWorkerExists)
	}
	m := &Member{
		f:             f,
		id:            spec.ID,
		url:           spec.URL,
		bootstrapHost: urlHost(spec.URL),
		spec:          spec,
		breaker:       NewBreaker(f.breaker, f.clock.Now, f.opts.Tracker.Counters(spec.ID).Dispatched),
	}
	staleName := series.Name(MetricStaleRetries, "worker", spec.ID)
	m.up = newUpstream(f.t, hostPort, urlHost(spec.URL), isTLS, spec.TLS, f.metrics.GetOrCreateCounter(staleName))
	added := false
	defer func() {
		if !added {
			m.up.CloseIdle()
			if f.Member(spec.ID) == nil {
				f.metrics.UnregisterMetric(staleName)
			}
		}
	}()
	healthy := true
	var info *Info
	if !spec.introspects() {
		m.noInfo.Store(true) // vLLM: the configuration's facts are all there is
		if introspect {
			healthy, _, _ = f.healthCheck(ctx, m)
		}
	}
	if introspect && spec.introspects() {
		i, err := Introspect(ctx, m.up.Probe(), spec.URL, f.health.Timeout)
		switch {
		case err == nil:
			info = &i
		case spec.Model == "":
			return nil, fmt.Errorf("cannot add worker %q: %w", spec.ID, err)
		default:
			ok, _, _ := f.healthCheck(ctx, m)
			healthy = ok
			m.noInfo.Store(errors.Is(err, ErrNoIntrospection))
			if !errors.Is(err, ErrNoIntrospection) {
				f.logger.Warn("worker introspection failed; adding it with its given facts",
					slog.String("worker", spec.ID), slog.Bool("healthy", ok), slog.Any("error", err))
			}
		}
	}
	w, err := f.buildWorker(m, info)
	if err != nil {
		return nil, err
	}
	m.worker.Store(w)
	if info != nil {
		m.info.Store(info)
	}
	m.healthOK.Store(healthy)

	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return nil, fmt.Errorf("cannot add worker %q: %w", spec.ID, errStopped)
	}
	if f.members[spec.ID] != nil {
		return nil, fmt.Errorf("cannot add worker %q: %w", spec.ID, ErrWorkerExists)
	}
	if err := f.set.Add(w); err != nil {
		return nil, fmt.Errorf("cannot add worker %q: %w", spec.ID, err)
	}
	f.set.SetHealthy(w.ID, m.eligible())
	f.members[spec.ID] = m
	added = true
	if job != "" {
		delete(f.jobs, job) // the worker answers for itself from now on
	}
	m.ungauge = f.workerGauges(m)
	m.mu.Lock()
	f.followTelemetryLocked(m)
	if introspect {
		f.followKVLocked(m)
	} else {
		// The configuration's subscriptions are the cache state's own until an
		// introspection says more.
		k := f.kvSpecOf(m)
		m.kvSpec = &k
	}
	m.mu.Unlock()
	if f.started {
		f.startHealthLocked(m)
	}
	f.logger.Info("worker added", slog.String("worker", m.id), slog.String("url", m.url),
		slog.String("model", w.Model), slog.String("role", w.Stage.String()), slog.Bool("healthy", healthy))
	return m, nil
}

// Remove unregisters a worker and stops its health checks, cool-down timer, telemetry and
// KV subscriptions. In-flight requests to it finish normally.
func (f *Fleet) Remove(id string) error {
	f.mu.Lock()
	m := f.members[id]
	if m == nil {
		f.mu.Unlock()
		return fmt.Errorf("cannot remove worker %q: %w", id, ErrWorkerNotFound)
	}
	delete(f.members, id)
	m.mu.Lock()
	m.removed.Store(true)
	f.set.Remove(id)
	m.mu.Unlock()
	f.mu.Unlock()
	f.stopMember(m)
	if f.opts.KV != nil {
		f.opts.KV.RemoveWorker(id)
	}
	f.logger.Info("worker removed", slog.String("worker", id))
	return nil
}

func (f *Fleet) stopMember(m *Member) {
	m.mu.Lock()
	cancel, done := m.cancel, m.done
	if m.stopTimer != nil {
		m.stopTimer()
		m.stopTimer = nil
	}
	tele := m.tele
	m.tele = nil
	m.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	if tele != nil && f.opts.Telemetry != nil {
		f.opts.Telemetry.StopWorker(m.id)
	}
	if m.ungauge != nil {
		m.ungauge()
	}
	m.up.CloseIdle()
}

// StartupCheck introspects and health-checks every worker concurrently, bounded by
// health.timeout, and records the verdicts: the configured workers before serving.
func (f *Fleet) StartupCheck(ctx context.Context) {
	var wg sync.WaitGroup
	for _, m := range f.Members() {
		wg.Go(func() { f.startupCheck(ctx, m) })
	}
	wg.Wait()
}

// Start runs the health loops under ctx: one per worker, now and for workers added later.
// Call once.
func (f *Fleet) Start(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ctx = ctx
	f.started = true
	for _, m := range f.members {
		f.startHealthLocked(m)
	}
}

func (f *Fleet) startupCheck(ctx context.Context, m *Member) {
	f.reintrospect(ctx, m)
	ok, verdict, err := f.healthCheck(ctx, m)
	if !verdict {
		return
	}
	m.healthOK.Store(ok)
	if ok {
		m.succ = 1
	} else {
		m.fail = 1
		f.logger.Warn("worker failed its start-up health check", slog.String("worker", m.id), slog.String("url", m.url),
			slog.Any("error", err))
	}
	f.publish(m)
}

// Stop ends every health loop, timer, telemetry and addition under way, and waits for
// them. No worker is added afterwards.
func (f *Fleet) Stop() {
	f.mu.Lock()
	f.stopped = true
	for _, j := range f.jobs {
		j.cancel()
	}
	f.mu.Unlock()
	for _, m := range f.Members() {
		f.stopMember(m)
	}
	f.wg.Wait()
}

// CloseConnections closes every live upstream connection (the hard stop of a drain).
func (f *Fleet) CloseConnections() { f.t.conns.closeAll() }

// startHealthLocked starts m's health loop; f.mu must be held and f.started set.
func (f *Fleet) startHealthLocked(m *Member) {
	if f.health.Interval <= 0 {
		return
	}
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	m.mu.Lock()
	m.cancel, m.done = cancel, done
	m.mu.Unlock()
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer close(done)
		defer func() {
			if r := recover(); r != nil {
				f.logger.Error("health loop panicked", slog.String("worker", m.id), slog.Any("panic", r))
			}
		}()
		f.introspectIfNeeded(ctx, m) // a worker added without its facts learns them at once
		t := time.NewTicker(f.health.Interval)
		defer t.Stop()
		var adapters <-chan time.Time
		if f.opts.AdapterRefresh > 0 {
			f.RefreshAdapters(ctx, m)
			at := time.NewTicker(f.opts.AdapterRefresh)
			defer at.Stop()
			adapters = at.C
		}
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				f.CheckOnce(ctx, m)
			case <-adapters:
				f.RefreshAdapters(ctx, m)
			}
		}
	}()
}

// CheckOnce runs one health round of m: the introspection of a worker whose facts are not
// known yet, the health check and its thresholds, and — a fallback to the cool-down timer —
// an open breaker whose cool-down has passed turns half-open. m's health loop calls it; so
// may tests, instead of the loop.
func (f *Fleet) CheckOnce(ctx context.Context, m *Member) {
	f.introspectIfNeeded(ctx, m)
	if ok, verdict, err := f.healthCheck(ctx, m); verdict {
		f.observeHealth(ctx, m, ok, err)
	}
	f.expire(m)
}

// introspectIfNeeded introspects m when its facts are not known yet and the engine has not
// shown that it has no introspection route.
func (f *Fleet) introspectIfNeeded(ctx context.Context, m *Member) {
	if m.info.Load() == nil && !m.noInfo.Load() {
		f.reintrospect(ctx, m)
	}
}

// healthCheck asks the engine's health.endpoint (/health). verdict is false when the check failed for a
// reason of the router's own (no connection slot, no file descriptor): that says nothing of
// the engine.
func (f *Fleet) healthCheck(ctx context.Context, m *Member) (ok, verdict bool, err error) {
	path := cmp.Or(f.health.Endpoint, PathHealth)
	err = load.Fetch(ctx, m.up.Probe(), strings.TrimRight(m.url, "/")+path, "*/*", f.health.Timeout, maxInfoBody,
		func(status int, _ []byte) error {
			if status != fasthttp.StatusOK {
				return &errStatus{path, status}
			}
			return nil
		})
	var ue *Error
	if errors.As(err, &ue) && ue.Kind.RouterSide() || ctx.Err() != nil {
		return false, false, err
	}
	return err == nil, true, err
}

// observeHealth applies one health-check result with the failure and success thresholds;
// err is why a failed check failed.
func (f *Fleet) observeHealth(ctx context.Context, m *Member, ok bool, err error) {
	if ok {
		m.fail = 0
		m.succ++
		if !m.healthOK.Load() && m.succ >= max(f.health.SuccessThreshold, 1) {
			m.healthOK.Store(true)
			f.logger.Info("worker healthy", slog.String("worker", m.id))
			f.publish(m)
		}
		return
	}
	m.succ = 0
	m.fail++
	if m.healthOK.Load() && m.fail >= max(f.health.FailureThreshold, 1) {
		m.healthOK.Store(false)
		f.logger.Warn("worker unhealthy", slog.String("worker", m.id), slog.Int("consecutive_failures", m.fail),
			slog.Any("error", err))
		f.publish(m)
	}
}

// reintrospect introspects m and applies what it learns: the registry entry when a fact
// dispatch needs changed (model, role, bootstrap port, DP size; new labels alone are set on
// the published worker, which stays the same *engine.Worker), the telemetry when the
// DP size or the load gauges changed, the KV subscriptions when the publishers changed.
func (f *Fleet) reintrospect(ctx context.Context, m *Member) {
	if !m.spec.introspects() {
		return
	}
	info, err := Introspect(ctx, m.up.Probe(), m.url, f.health.Timeout)
	if errors.Is(err, ErrNoIntrospection) {
		m.noInfo.Store(true) // vLLM: the configuration's facts are all there is
	}
	if err != nil {
		if !errors.Is(err, ErrNoIntrospection) {
			f.logger.Debug("worker introspection failed", slog.String("worker", m.id), slog.Any("error", err))
		}
		return
	}
	if info.KVErr != nil {
		f.logger.Warn("worker advertises a kv_events section the router cannot read", slog.String("worker", m.id), slog.Any("error", info.KVErr))
	}
	m.info.Store(&info)
	old := m.worker.Load()
	w, err := f.buildWorker(m, &info)
	if err != nil {
		f.logger.Warn("introspected facts not applied", slog.String("worker", m.id), slog.Any("error", err))
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.members[m.id] != m {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// The slots of the facts count from now on, for the worker published (the adapters may
	// have been learned before the facts, with Options.AdapterSlots).
	defer f.applyAdapterSlots(m)
	switch {
	case w.BootstrapPort == old.BootstrapPort && w.DPSize == old.DPSize && w.CanPrefill == old.CanPrefill && w.Model == old.Model && w.Stage == old.Stage:
		// The same worker: new labels, if any, apply in place, so a request that excluded it
		// after a failure still does, and no snapshot goes out without it.
		if !maps.Equal(w.Labels(), old.Labels()) {
			old.SetLabels(w.Labels())
		}
	default:
		w.ShareAdapters(old) // one cell: a load that ends on old reaches w
		f.set.Remove(m.id)
		if err := f.set.Add(w); err != nil {
			f.logger.Error("cannot republish introspected worker", slog.String("worker", m.id), slog.Any("error", err))
			_ = f.set.Add(old)
			return
		}
		m.worker.Store(w)
		f.set.SetHealthy(m.id, m.eligible())
	}
	f.followTelemetryLocked(m)
	f.followKVLocked(m)
}

// buildWorker makes m's engine.Worker from its spec with info applied (explicit spec fields
// win), its Handle pointing at m.
func (f *Fleet) buildWorker(m *Member, info *Info) (*engine.Worker, error) {
	spec := m.spec
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
	w := engine.NewWorker(spec.ID, spec.URL, model, stage, f.opts.Tracker.Counters(spec.ID))
	w.Handle = m
	w.AdapterRoom = f.opts.AdapterRoom // a pick that gives back a reserved slot makes room
	if f.opts.AdapterRefresh > 0 {
		// Until the engine's adapter list is first read, the router knows its slots and that
		// it loaded nothing there yet: the loads it starts meanwhile count against the slots
		// (with nothing known, every load would find room, and a second one a full engine).
		w.SetAdapters(engine.NewAdapterSet(nil, f.adapterSlots(info)))
	}
	w.SetLabels(mergeLabels(info, spec.Labels))
	w.CanPrefill = spec.CanPrefill && stage == engine.StageDecode
	switch {
	case spec.BootstrapPort != nil:
		w.BootstrapPort = *spec.BootstrapPort
	case info != nil && stage == engine.StagePrefill:
		w.BootstrapPort = info.BootstrapPort
	}
	switch {
	case info != nil && info.ranks() > 1:
		w.DPSize = info.ranks()
	case spec.DPSize > 0:
		w.DPSize = spec.DPSize
	}
	if info != nil && spec.Model != "" && info.Model() != "" && info.Model() != spec.Model && info.ModelPath != spec.Model {
		f.logger.Warn("worker serves a different model than configured",
			slog.String("worker", spec.ID), slog.String("configured", spec.Model), slog.String("introspected", info.Model()))
	}
	if info != nil && spec.Role != "" && config.Role(info.Mode) != role && !(info.Mode == "" && role == config.RolePlain) {
		f.logger.Warn("worker reports a different role than configured",
			slog.String("worker", spec.ID), slog.String("configured", string(role)), slog.String("introspected", info.Mode))
	}
	return w, nil
}

// mergeLabels returns a worker's labels: the introspected ones (info may be nil) with the
// configured ones over them; nil when there are none.
func mergeLabels(info *Info, configured map[string]string) map[string]string {
	var out map[string]string
	if info != nil && len(info.Labels) > 0 {
		out = maps.Clone(info.Labels)
	}
	if len(configured) > 0 {
		if out == nil {
			out = make(map[string]string, len(configured))
		}
		maps.Copy(out, configured)
	}
	return out
}

// followTelemetryLocked (re)starts m's telemetry when what it follows changed; m.mu held.
func (f *Fleet) followTelemetryLocked(m *Member) {
	if f.opts.Telemetry == nil || m.removed.Load() {
		return
	}
	w := m.worker.Load()
	src := TelemetrySource{WorkerID: w.ID, URL: w.URL, DPSize: w.DPSize, Counters: w.Counters, Client: m.up.Probe(),
		Flavor: m.spec.Flavor, MetricsPath: m.spec.MetricsPath, Model: w.Model}
	switch info := m.info.Load(); {
	case m.spec.LoadPublish != "":
		h, p, err := subscribe.SplitEndpoint(m.spec.LoadPublish)
		if err == nil {
			src.GaugeEndpoints = []string{subscribe.TCPEndpoint(subscribe.EndpointHost(h, w.URL), p)}
		} else {
			src.GaugeEndpoints = []string{m.spec.LoadPublish} // ipc://: as configured
		}
	case info != nil:
		src.GaugeEndpoints = info.GaugeEndpoints(w.URL)
	}
	if m.tele != nil {
		if m.tele.DPSize == src.DPSize && m.tele.Counters == src.Counters && m.tele.Model == src.Model &&
			slices.Equal(m.tele.GaugeEndpoints, src.GaugeEndpoints) {
			return
		}
		f.opts.Telemetry.StopWorker(m.id)
		m.tele = nil
	}
	if err := f.opts.Telemetry.StartWorker(src); err != nil {
		f.logger.Warn("cannot start worker telemetry", slog.String("worker", m.id), slog.Any("error", err))
		return
	}
	m.tele = &src
}

// kvSpecOf is the KV-event subscription of m: its configured endpoint, else the publishers
// its introspection found, else none yet.
func (f *Fleet) kvSpecOf(m *Member) subscribe.WorkerSpec {
	w := m.worker.Load()
	spec := actors.WorkerSpecFrom(config.Worker{ID: w.ID, URL: w.URL, Model: w.Model, DPSize: w.DPSize,
		KVEvents: m.spec.KVEvents, KVReplay: m.spec.KVReplay, KVBlockSize: m.spec.KVBlockSize,
		KVHashScheme: m.spec.KVHashScheme, Flavor: m.spec.Flavor})
	info := m.info.Load()
	if info == nil {
		return spec
	}
	declared := spec.BlockSize > 0
	if !declared {
		spec.BlockSize = info.blockSize()
	}
	if m.spec.KVEvents != "" {
		return spec
	}
	if d, err := info.KVDiscovery(w.URL); err == nil {
		spec.Publishers, spec.DPSize = d.Publishers, max(spec.DPSize, d.DPSize)
		if !declared {
			spec.BlockSize = d.BlockSize
		}
	}
	return spec
}

// checkEngineFacts checks the data-parallel size and bootstrap port a worker declares, as
// config.Validate does for the configuration's workers: the router keeps state per rank,
// and a POST /workers of dp_size 2e9 made it allocate for every one and abort.
func checkEngineFacts(spec Spec) error {
	if spec.DPSize < 0 || spec.DPSize > config.MaxDPSize {
		return fmt.Errorf("dp_size %d is not in 1..%d (0: introspected)", spec.DPSize, config.MaxDPSize)
	}
	if spec.BootstrapPort != nil && (*spec.BootstrapPort < 1 || *spec.BootstrapPort > 65535) {
		return fmt.Errorf("bootstrap_port %d is not in 1..65535", *spec.BootstrapPort)
	}
	return nil
}

// checkKVFacts checks the KV facts a worker declares, as config.Validate does for the
// configuration's workers.
func checkKVFacts(spec Spec) error {
	if spec.KVReplay != "" {
		if _, _, err := subscribe.SplitEndpoint(spec.KVReplay); err != nil {
			return fmt.Errorf("kv_replay: %w", err)
		}
	}
	if spec.KVBlockSize < 0 {
		return fmt.Errorf("kv_block_size %d is negative", spec.KVBlockSize)
	}
	switch spec.KVHashScheme {
	case "", config.KVHashAuto, config.KVHashSGLang, config.KVHashRekey:
	default:
		return fmt.Errorf("unknown kv_hash_scheme %q (auto, sglang or rekey)", spec.KVHashScheme)
	}
	return nil
}

// checkLabels checks the labels a worker declares, as config.Validate does for the
// configuration's workers.
func checkLabels(spec Spec) error {
	if len(spec.Labels) > config.MaxLabels {
		return fmt.Errorf("%d labels, more than %d", len(spec.Labels), config.MaxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(spec.Labels)) {
		if msg := config.CheckLabel(k, spec.Labels[k]); msg != "" {
			return fmt.Errorf("labels.%s: %s", k, msg)
		}
	}
	return nil
}

// followKVLocked hands m's KV subscription to the follower when it changed; m.mu held.
func (f *Fleet) followKVLocked(m *Member) {
	if f.opts.KV == nil || m.removed.Load() {
		return
	}
	spec := f.kvSpecOf(m)
	if m.kvSpec != nil && reflect.DeepEqual(*m.kvSpec, spec) {
		return
	}
	if err := f.opts.KV.AddWorker(spec); err != nil {
		f.logger.Warn("cannot follow the worker's KV events: cache_aware sees it hold nothing",
			slog.String("worker", m.id), slog.Any("error", err))
		return
	}
	m.kvSpec = &spec
}

// publish makes m's registry entry eligible or not for picks, as its health and breaker
// say; the next pick sees it.
func (f *Fleet) publish(m *Member) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.removed.Load() {
		f.set.SetHealthy(m.id, m.eligible())
	}
}

// transition acts on a breaker state change of m: logs it, schedules the cool-down and
// republishes m's eligibility.
func (f *Fleet) transition(m *Member, t Transition) {
	switch t {
	case Opened:
		f.logger.Warn("worker breaker opened", slog.String("worker", m.id), slog.Duration("cooldown", m.breaker.Cooldown()))
		m.mu.Lock()
		if m.stopTimer != nil {
			m.stopTimer()
		}
		if !m.removed.Load() {
			m.stopTimer = f.clock.AfterFunc(m.breaker.Cooldown(), func() { f.expire(m) })
		}
		m.mu.Unlock()
	case HalfOpened:
		f.logger.Info("worker breaker half-open: the next dispatch probes it", slog.String("worker", m.id))
	case Closed:
		f.logger.Info("worker breaker closed", slog.String("worker", m.id))
	}
	f.publish(m)
}

// expire turns m's breaker half-open when its cool-down has passed.
func (f *Fleet) expire(m *Member) {
	if t := m.breaker.Expire(f.clock.Now()); t != NoChange {
		f.transition(m, t)
	}
}

// workerGauges registers m's gauges; the returned func unregisters them.
func (f *Fleet) workerGauges(m *Member) func() {
	l := `{worker="` + series.Label(m.id) + `"}`
	names := []string{MetricWorkerInflight + l, MetricWorkerHealthy + l, MetricWorkerBreaker + l, MetricStaleRetries + l}
	f.metrics.GetOrCreateGauge(names[0], func() float64 { return float64(m.worker.Load().Counters.InFlight()) })
	f.metrics.GetOrCreateGauge(names[1], func() float64 { return b2f(m.worker.Load().Healthy()) })
	f.metrics.GetOrCreateGauge(names[2], func() float64 { return float64(m.breaker.State()) })
	// The learned rates of the SLO estimates (load.Rates), read at scrape time.
	for _, g := range []struct {
		name string
		f    func(r *load.Rates) float64
	}{
		{MetricLearnedTTFTBase, func(r *load.Rates) float64 { b, _, _ := r.Prefill.Params(); return b }},
		{MetricLearnedPrefill, func(r *load.Rates) float64 { return r.PrefillTokensPerSecond() }},
		{MetricLearnedTPOTBase, func(r *load.Rates) float64 { b, _, _ := r.Decode.Params(); return b }},
		{MetricLearnedTPOTPerRequest, func(r *load.Rates) float64 { _, s, _ := r.Decode.Params(); return s }},
	} {
		names = append(names, g.name+l)
		f.metrics.GetOrCreateGauge(g.name+l, func() float64 { return g.f(m.worker.Load().Counters.Rates()) })
	}
	if ls, ok := f.opts.Telemetry.(LoadSourcer); ok {
		for _, src := range load.Sources() {
			n := series.Name(MetricLoadSource, "worker", m.id, "source", src.String())
			names = append(names, n)
			f.metrics.GetOrCreateGauge(n, func() float64 {
				cur, _ := ls.LoadSource(m.id)
				return b2f(cur == src)
			})
		}
	}
	return func() {
		for _, n := range names {
			f.metrics.UnregisterMetric(n)
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
