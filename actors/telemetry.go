package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/asynkron/protoactor-go/actor"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/load"
	"switchyard/load/zmtp"
)

// Telemetry defaults, used when TelemetryOptions leaves a field at zero.
const (
	// DefaultPublishInterval is the coalescing window: a dirty load table is rebuilt and
	// published at most once per interval, at once when the last publish tick is older.
	DefaultPublishInterval = 20 * time.Millisecond
	// DefaultRefreshInterval is how often the table is rebuilt even when no report arrived,
	// so that its build time follows the clock and expired reports drop out.
	DefaultRefreshInterval = time.Second
)

// Telemetry errors.
var (
	// ErrTelemetryClosed: the Telemetry was closed.
	ErrTelemetryClosed = errors.New("telemetry closed")
	// ErrWorkerTracked: AddWorker was called for a worker already tracked.
	ErrWorkerTracked = errors.New("worker already tracked")
	// ErrNoGaugeEndpoint: load.source is zmq and the worker advertises no load gauge.
	ErrNoGaugeEndpoint = errors.New("no load gauge endpoint")
)

// LoadReported is an event: a worker's transport delivered its DP ranks' reports, or
// failed to (Err set, Reports nil). The telemetry actor owns Reports once sent.
type LoadReported struct {
	WorkerID string
	Reports  []load.RankReport
	Err      error
}

// AddWorker tells the telemetry actor to aggregate a worker's reports.
type AddWorker struct {
	WorkerID string
	// DPSize is the worker's number of DP ranks (at least 1).
	DPSize int
	// Counters are the worker's router-local counters (dispatch counts at ingest); may be nil.
	Counters *load.Counters

	call *call[*AddWorkerResult]
}

// AddWorkerResult is the reply to AddWorker.
type AddWorkerResult struct{ Err error }

// RemoveWorker tells the telemetry actor to forget a worker and its reports.
type RemoveWorker struct {
	WorkerID string

	call *call[*RemoveWorkerResult]
}

// RemoveWorkerResult is the reply to RemoveWorker.
type RemoveWorkerResult struct{ Err error }

// PublishLoads tells the telemetry actor to rebuild and publish the load table: always when
// Force is set, else only when a report or worker change arrived since the last build or
// the refresh interval has passed. The periodic tick sends it without a reply channel.
type PublishLoads struct {
	Force bool

	call *call[*PublishLoadsResult] // nil for the periodic tick
}

// PublishLoadsResult is the reply to PublishLoads: the snapshot now in the table.
type PublishLoadsResult struct {
	Snapshot *load.Snapshot
	Err      error
}

func (m *AddWorker) reject(err *engine.PickError) { answer(m.call, &AddWorkerResult{Err: err}) }

func (m *RemoveWorker) reject(err *engine.PickError) { answer(m.call, &RemoveWorkerResult{Err: err}) }

func (m *PublishLoads) reject(err *engine.PickError) { answer(m.call, &PublishLoadsResult{Err: err}) }

// answer offers r to c unless c is nil (a reply-less command).
func answer[R any](c *call[*R], r *R) {
	if c != nil {
		c.offer(r)
	}
}

// errTelemetryTimeout is the reply of a telemetry command the actor did not answer in time.
var errTelemetryTimeout = &engine.PickError{Outcome: engine.OutcomeTimeout, Detail: "telemetry actor did not reply within " + adminCallTimeout.String()}

// ask sends msg, whose call is c, and waits for the reply at most adminCallTimeout.
func ask[R any](t *Telemetry, c *call[*R], msg any) (*R, error) {
	c.arm(adminCallTimeout)
	t.sys.root.Send(t.pid, msg)
	r, ok := c.wait()
	if !ok {
		return nil, errTelemetryTimeout
	}
	return r, nil
}

var (
	_ rejecter = (*AddWorker)(nil)
	_ rejecter = (*RemoveWorker)(nil)
	_ rejecter = (*PublishLoads)(nil)
)

// TelemetryOptions configure a Telemetry. Zero fields take the defaults.
type TelemetryOptions struct {
	// Load holds load.freshness, load.poll_interval and load.source. Zero values take the
	// load package's defaults; an empty source is auto.
	Load config.LoadSettings
	// Mailbox is the telemetry actor's mailbox size. Default: config.Default's
	// actors.mailbox.telemetry.
	Mailbox int
	// PublishInterval is the coalescing window of table rebuilds. Default 20ms.
	PublishInterval time.Duration
	// RefreshInterval rebuilds the table even when nothing changed. Default 1s.
	RefreshInterval time.Duration
	// Now is the clock of snapshots and report receipt times. Default time.Now.
	Now func() time.Time
	// Ticks, when set, replaces the publish schedule (tests drive it: every tick is an
	// unforced publish); Telemetry does not own or close it.
	Ticks <-chan time.Time
	// Client sends the polls of workers whose WorkerSource names no client of its own.
	// Default: the load package's.
	Client load.Doer
	// Logger receives telemetry logs. Default: the System's.
	Logger *slog.Logger
	// GaugeLimits bound what a load-gauge publisher may send (kv.max_message_bytes).
	// Default: zmtp's (16 MiB).
	GaugeLimits zmtp.Limits
	// Metrics receives switchyard_zmq_peer_drops_total{component="load_gauge"}. Default:
	// private.
	Metrics *metrics.Set
	// System is the actor system the telemetry actor runs on; its mailbox rejections and
	// panics count under kind "telemetry". Default: a private one, closed by Close.
	System *System
}

// WorkerSource is what Telemetry needs to follow one engine's load.
type WorkerSource struct {
	// ID is the worker ID. Required.
	ID string
	// URL is the engine's base URL, polled at /v1/loads (or /get_load).
	URL string
	// DPSize is the number of DP ranks; smaller than 1 means 1.
	DPSize int
	// Counters are the worker's router-local counters; may be nil.
	Counters *load.Counters
	// GaugeEndpoint is the engine's ZMQ load gauge ("tcp://host:port"), or "".
	GaugeEndpoint string
	// GaugeEndpoints are further load gauge publishers of the same engine (one per DP rank
	// when the engine publishes each rank on its own port); each gets a subscriber.
	GaugeEndpoints []string
	// Flavor is the worker's configured flavour (config.Flavor*): vllm is always scraped
	// at MetricsPath, sglang never is; "" or auto detects. Default auto.
	Flavor string
	// MetricsPath is the engine's Prometheus page. Default "/metrics".
	MetricsPath string
	// Model is the served model whose series a page of several models is read for.
	Model string
	// Client, when set, sends this worker's polls (the worker lifecycle's client of the
	// engine, with its connection and TLS settings). Default: TelemetryOptions.Client.
	Client load.Doer
}

// LoadStatus says where a worker's load comes from.
type LoadStatus struct {
	// Source is the transport's current route (load.SourceNone before the first report).
	Source load.Source
	// Flavor is the engine kind the metrics page revealed (load.FlavorVLLM or
	// load.FlavorSGLang); "" when the load does not come from a metrics page.
	Flavor string
	// Malformed counts answers or messages that did not decode.
	Malformed uint64
}

// gauges returns every gauge endpoint of src, without duplicates.
func (src *WorkerSource) gauges() []string {
	var out []string
	for _, e := range append([]string{src.GaugeEndpoint}, src.GaugeEndpoints...) {
		if e != "" && !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out
}

// TelemetryStats counts what the telemetry actor received and published.
type TelemetryStats struct {
	// Reports is the number of LoadReported events carrying reports.
	Reports uint64
	// Failures is the number of LoadReported events carrying a transport or decode error.
	Failures uint64
	// Publishes is the number of snapshots stored in the table.
	Publishes uint64
}

// Telemetry ingests engine load reports and publishes them into a load.Table. It owns a
// telemetry actor (holding the load.Aggregator), a publish pacer (pace) and one transport
// goroutine per worker: a load.Poller (HTTP) or a load.GaugeSubscriber (ZMQ), chosen by
// load.source. Its methods are safe for concurrent use.
type Telemetry struct {
	opts       TelemetryOptions
	gaugeDrops *zmtp.Metrics
	table      *load.Table
	logger     *slog.Logger
	now        func() time.Time

	sys      *System
	closeSys func()
	pid      *actor.PID
	host     *host
	th       *telemetryHost
	counters *Counters
	tick     *PublishLoads // shared, reply-less
	refresh  *PublishLoads // shared, reply-less, forced: the pacer's refresh

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // pacer and transports

	mu     sync.Mutex
	feeds  map[string]*feed
	closed bool
}

// feed is one worker's running transports.
type feed struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	poller *load.Poller            // HTTP transport, or nil
	gauges []*load.GaugeSubscriber // ZMQ transports
}

// telemetryHost is what the telemetry actor's incarnations share: the aggregator and the
// table it publishes into survive a restart.
type telemetryHost struct {
	agg       *load.Aggregator
	table     *load.Table
	now       func() time.Time
	refresh   time.Duration
	logger    *slog.Logger
	counters  *kindCounters
	internal  *engine.PickError
	reports   atomic.Uint64
	failures  atomic.Uint64
	publishes atomic.Uint64
	// changed wakes the publish pacer when the table becomes dirty (capacity 1, sent
	// without blocking); nil when tests drive the ticks.
	changed chan struct{}

	// Owned by the actor.
	dirty     bool
	lastBuild time.Time
}

// markDirty records a change the next publish must include and wakes the pacer.
func (h *telemetryHost) markDirty() {
	h.dirty = true
	select {
	case h.changed <- struct{}{}:
	default: // a wake-up is pending already (or no pacer)
	}
}

// NewTelemetry starts the telemetry actor and its publish pacer. Workers are added with
// AddWorker; Close stops everything.
func NewTelemetry(table *load.Table, opts TelemetryOptions) (*Telemetry, error) {
	if table == nil {
		return nil, errors.New("cannot create telemetry: nil load table")
	}
	if opts.Logger == nil && opts.System != nil {
		opts.Logger = opts.System.Logger()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.PublishInterval <= 0 {
		opts.PublishInterval = DefaultPublishInterval
	}
	if opts.RefreshInterval <= 0 {
		opts.RefreshInterval = DefaultRefreshInterval
	}
	switch opts.Load.Source {
	case "":
		opts.Load.Source = config.LoadSourceAuto
	case config.LoadSourceAuto, config.LoadSourceHTTP, config.LoadSourceZMQ, config.LoadSourcePrometheus:
	default:
		return nil, fmt.Errorf("cannot create telemetry: unknown load source %q", opts.Load.Source)
	}
	t := &Telemetry{
		opts:       opts,
		gaugeDrops: zmtp.NewMetrics(opts.Metrics, "load_gauge"),
		table:      table,
		logger:     opts.Logger,
		now:        opts.Now,
		host:       newHost(),
		feeds:      make(map[string]*feed),
		tick:       &PublishLoads{},
		refresh:    &PublishLoads{Force: true},
	}
	t.sys, t.closeSys = systemOr(opts.System, opts.Logger)
	t.counters = t.sys.counters
	t.th = &telemetryHost{
		agg:      load.NewAggregator(opts.Load.Freshness),
		table:    table,
		now:      opts.Now,
		refresh:  opts.RefreshInterval,
		logger:   opts.Logger,
		counters: &t.counters.kinds[KindTelemetry],
		internal: &engine.PickError{Outcome: engine.OutcomeInternal, Detail: "telemetry actor failed", Err: ErrPanicked},
	}
	if opts.Ticks == nil {
		t.th.changed = make(chan struct{}, 1)
	}
	mb := newMailbox(sizeOr(opts.Mailbox, config.Default().Actors.Mailbox.Telemetry), t.host, t.th.counters,
		&engine.PickError{Outcome: engine.OutcomeOverloaded, Detail: "telemetry actor mailbox is full"},
		&engine.PickError{Outcome: engine.OutcomeInternal, Detail: "telemetry actor stopped", Err: ErrStopped})
	props := actor.PropsFromProducer(func() actor.Actor { return &telemetryActor{h: t.th, mb: mb} },
		actor.WithMailbox(mb.producer()),
		actor.WithGuardian(actor.RestartingSupervisorStrategy()))
	pid, err := t.sys.root.SpawnNamed(props, "telemetry")
	if err != nil {
		t.host.shutdown()
		t.closeSys()
		return nil, fmt.Errorf("cannot spawn telemetry actor: %w", err)
	}
	t.pid = pid
	t.ctx, t.cancel = context.WithCancel(context.Background())

	if ticks := opts.Ticks; ticks != nil {
		t.wg.Go(func() {
			for {
				select {
				case <-t.ctx.Done():
					return
				case <-ticks:
					t.sys.root.Send(t.pid, t.tick)
				}
			}
		})
		return t, nil
	}
	t.wg.Go(func() { t.pace(t.th.changed) })
	return t, nil
}

// pace sends the telemetry actor its publish ticks: PublishInterval after the last tick
// when the table became dirty (at once when that has passed), and a forced rebuild
// RefreshInterval after the last tick otherwise. An idle router wakes once a refresh
// interval, not once a publish interval (a ticker woke the process 50 times a second
// whether or not a report came), and a report no longer waits for a tick's phase.
func (t *Telemetry) pace(changed <-chan struct{}) {
	every, refresh := t.opts.PublishInterval, t.opts.RefreshInterval
	timer := time.NewTimer(refresh)
	defer timer.Stop()
	last := time.Now()
	soon := false // the timer is armed for a change's publish
	for {
		// While a change's publish is armed, later changes are left in the channel's one
		// slot: the actor's sends then fail at once and wake nobody, however many reports
		// come in the interval.
		wake := changed
		if soon {
			wake = nil
		}
		select {
		case <-t.ctx.Done():
			return
		case <-wake:
			soon = true
			timer.Reset(max(0, every-time.Since(last)))
		case <-timer.C:
			if soon {
				t.sys.root.Send(t.pid, t.tick)
			} else {
				t.sys.root.Send(t.pid, t.refresh)
			}
			last, soon = time.Now(), false
			timer.Reset(refresh)
		}
	}
}

// Counters returns the telemetry actor's failure counts (mailbox rejections: dropped
// reports or refused commands; recovered panics).
func (t *Telemetry) Counters() *Counters { return t.counters }

// Stats returns what the telemetry actor received and published.
func (t *Telemetry) Stats() TelemetryStats {
	return TelemetryStats{
		Reports:   t.th.reports.Load(),
		Failures:  t.th.failures.Load(),
		Publishes: t.th.publishes.Load(),
	}
}

// AddWorker registers src with the aggregator and starts its transport: the ZMQ load gauge
// when load.source is zmq, or auto and src has a gauge endpoint; HTTP polling otherwise.
func (t *Telemetry) AddWorker(src WorkerSource) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return fmt.Errorf("cannot add worker %q to telemetry: %w", src.ID, ErrTelemetryClosed)
	}
	if src.ID == "" {
		return errors.New("cannot add worker to telemetry: empty worker ID")
	}
	if t.feeds[src.ID] != nil {
		return fmt.Errorf("cannot add worker %q to telemetry: %w", src.ID, ErrWorkerTracked)
	}
	f := &feed{}
	runs, err := t.transports(src, f)
	if err != nil {
		return fmt.Errorf("cannot add worker %q to telemetry: %w", src.ID, err)
	}
	c := newCall[*AddWorkerResult]()
	r, err := ask(t, c, &AddWorker{WorkerID: src.ID, DPSize: src.DPSize, Counters: src.Counters, call: c})
	if err == nil {
		err = r.Err
	}
	if err != nil {
		return fmt.Errorf("cannot add worker %q to telemetry: %w", src.ID, err)
	}
	ctx, cancel := context.WithCancel(t.ctx)
	f.cancel = cancel
	t.feeds[src.ID] = f
	for _, run := range runs {
		f.wg.Add(1)
		t.wg.Go(func() {
			defer f.wg.Done()
			defer func() {
				if v := recover(); v != nil {
					t.logger.Error("load transport panicked", slog.String("worker", src.ID), slog.Any("panic", v))
				}
			}()
			if err := run(ctx); err != nil {
				t.logger.Warn("load transport stopped", slog.String("worker", src.ID), slog.Any("error", err))
			}
		})
	}
	return nil
}

// transports builds src's load transports into f and returns their Run functions: one
// gauge subscriber per gauge endpoint, or one HTTP poller (native routes, the Prometheus
// page, or detection of which the engine has; see PollMode).
func (t *Telemetry) transports(src WorkerSource, f *feed) ([]func(context.Context) error, error) {
	gauges := src.gauges()
	vllm := src.Flavor == config.FlavorVLLM
	source := t.opts.Load.Source
	useGauge := source == config.LoadSourceZMQ || (source == config.LoadSourceAuto && len(gauges) > 0 && !vllm)
	if useGauge {
		if len(gauges) == 0 {
			return nil, ErrNoGaugeEndpoint
		}
		runs := make([]func(context.Context) error, 0, len(gauges))
		for _, ep := range gauges {
			s, err := load.NewGaugeSubscriber(load.GaugeSubscriberConfig{
				WorkerID: src.ID,
				Endpoint: ep,
				Logger:   t.logger,
				Now:      t.now,
				Deliver: func(id string, r load.RankReport) {
					t.sys.root.Send(t.pid, &LoadReported{WorkerID: id, Reports: []load.RankReport{r}})
				},
				Limits:  t.opts.GaugeLimits,
				Metrics: t.gaugeDrops,
			})
			if err != nil {
				return nil, err
			}
			f.gauges = append(f.gauges, s)
			runs = append(runs, s.Run)
		}
		return runs, nil
	}
	mode := load.PollAuto
	switch {
	case vllm || source == config.LoadSourcePrometheus:
		mode = load.PollPrometheus
	case src.Flavor == config.FlavorSGLang:
		mode = load.PollNative
	}
	timeout := t.opts.Load.ScrapeTimeout
	if iv := t.opts.Load.PollInterval; iv > 0 && (timeout <= 0 || iv < timeout) {
		timeout = iv
	}
	client := src.Client
	if client == nil {
		client = t.opts.Client
	}
	p, err := load.NewPoller(load.PollerConfig{
		WorkerID:     src.ID,
		URL:          src.URL,
		Interval:     t.opts.Load.PollInterval,
		Timeout:      timeout,
		Mode:         mode,
		MetricsPath:  src.MetricsPath,
		Model:        src.Model,
		MaxBodyBytes: t.opts.Load.ScrapeMaxBytes,
		Client:       client,
		Logger:       t.logger,
		Now:          t.now,
		Deliver: func(id string, reps []load.RankReport, err error) {
			t.sys.root.Send(t.pid, &LoadReported{WorkerID: id, Reports: reps, Err: err})
		},
	})
	if err != nil {
		return nil, err
	}
	f.poller = p
	return []func(context.Context) error{p.Run}, nil
}

// Status says where worker id's load comes from; false for a worker not tracked.
func (t *Telemetry) Status(id string) (LoadStatus, bool) {
	t.mu.Lock()
	f := t.feeds[id]
	t.mu.Unlock()
	if f == nil {
		return LoadStatus{}, false
	}
	var st LoadStatus
	if f.poller != nil {
		st.Source, st.Malformed = f.poller.Source(), f.poller.Malformed()
		if st.Source == load.SourcePrometheus {
			if info := f.poller.Info(); info != nil {
				st.Flavor = info.Flavor
			}
		}
	}
	for _, g := range f.gauges {
		st.Source = load.SourceGauge
		st.Malformed += g.Malformed()
	}
	return st, true
}

// RemoveWorker stops the worker's transport, waits for it, and removes the worker and its
// reports from the aggregator. Unknown workers are ignored.
func (t *Telemetry) RemoveWorker(id string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return fmt.Errorf("cannot remove worker %q from telemetry: %w", id, ErrTelemetryClosed)
	}
	f := t.feeds[id]
	if f == nil {
		return nil
	}
	delete(t.feeds, id)
	f.cancel()
	f.wg.Wait()
	c := newCall[*RemoveWorkerResult]()
	r, err := ask(t, c, &RemoveWorker{WorkerID: id, call: c})
	if err == nil {
		err = r.Err
	}
	if err != nil {
		return fmt.Errorf("cannot remove worker %q from telemetry: %w", id, err)
	}
	return nil
}

// Workers returns the IDs of the tracked workers, in no particular order.
func (t *Telemetry) Workers() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	ids := make([]string, 0, len(t.feeds))
	for id := range t.feeds {
		ids = append(ids, id)
	}
	return ids
}

// Flush rebuilds and publishes the table now, after every report already queued, and
// returns the published snapshot.
func (t *Telemetry) Flush() (*load.Snapshot, error) {
	c := newCall[*PublishLoadsResult]()
	r, err := ask(t, c, &PublishLoads{Force: true, call: c})
	if err != nil {
		return nil, err
	}
	return r.Snapshot, r.Err
}

// Close stops every transport and the pacer, waits for them, then stops the telemetry
// actor and waits for it. The table keeps its last snapshot.
func (t *Telemetry) Close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	t.feeds = nil
	t.mu.Unlock()
	t.cancel()
	t.wg.Wait()
	if _, err := t.sys.root.StopFuture(t.pid).Result(); err != nil {
		t.logger.Warn("telemetry actor did not confirm stop", slog.Any("error", err))
	}
	t.host.shutdown()
	t.closeSys()
}

// telemetryActor owns the load.Aggregator: it ingests reports and worker changes and
// publishes coalesced snapshots into the table.
type telemetryActor struct {
	h  *telemetryHost
	mb *mailbox
}

var _ actor.Actor = (*telemetryActor)(nil)

// Receive implements actor.Actor.
func (a *telemetryActor) Receive(ctx actor.Context) {
	msg := ctx.Message()
	defer func() {
		if r := recover(); r != nil {
			a.h.counters.panics.Inc()
			a.h.logger.Error("telemetry actor panicked; restarting it", slog.Any("panic", r), slog.String("message", fmt.Sprintf("%T", msg)))
			if rj, ok := msg.(rejecter); ok {
				rj.reject(a.h.internal)
			}
			panic(r) // let Proto.Actor restart the actor
		}
	}()
	h := a.h
	switch m := msg.(type) {
	case *LoadReported:
		if m.Err != nil {
			h.failures.Add(1)
			return
		}
		h.reports.Add(1)
		for _, r := range m.Reports {
			h.agg.Ingest(m.WorkerID, r)
		}
		h.markDirty()
	case *AddWorker:
		h.agg.SetWorker(m.WorkerID, m.DPSize, m.Counters)
		h.markDirty()
		answer(m.call, &AddWorkerResult{})
	case *RemoveWorker:
		h.agg.RemoveWorker(m.WorkerID)
		h.markDirty()
		answer(m.call, &RemoveWorkerResult{})
	case *PublishLoads:
		now := h.now()
		if m.Force || h.dirty || now.Sub(h.lastBuild) >= h.refresh {
			h.table.Store(h.agg.Snapshot(now))
			h.dirty = false
			h.lastBuild = now
			h.publishes.Add(1)
		}
		answer(m.call, &PublishLoadsResult{Snapshot: h.table.Load()})
	case *actor.Stopped:
		a.mb.close()
	}
}
