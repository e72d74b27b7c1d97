package httpfront

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"switchyard/actors"
	"switchyard/config"
	"switchyard/engine"
	"switchyard/httpfront/fleet"
	"switchyard/httpfront/flow"
	"switchyard/httpfront/hangup"
	"switchyard/httpfront/jsontext"
	"switchyard/httpfront/retry"
	"switchyard/httpfront/tracing"
	"switchyard/load"
	"switchyard/load/zmtp"
	"switchyard/tokenizer"
)

// Defaults of Options.
const (
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultReadTimeout       = 60 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultJanitorInterval   = time.Minute
	DefaultStreamEndGrace    = 2 * time.Second
	DefaultStreamDoneWait    = 50 * time.Millisecond
)

// Options are the Server's collaborators and tuning beyond the configuration. The zero value
// is usable.
type Options struct {
	// Logger receives the server's logs. Default: discard.
	Logger *slog.Logger
	// Now is the clock for request timing and guards. Default: Clock's, else time.Now.
	Now func() time.Time
	// Clock is the breakers' time: their cool-down timers run on it. Default: the wall
	// clock.
	Clock fleet.Clock
	// Dial opens the TCP connections to engines. Default: net.Dialer with TCP keep-alive.
	Dial fleet.DialFunc
	// DiscoveryPods is the Kubernetes API the discovery (discovery.kubernetes.enabled)
	// lists and watches pods through. Default: a client of the API server the
	// configuration names.
	DiscoveryPods fleet.PodClient
	// Tokenizer returns the tokenizer of a model, or nil to use the Hugging Face tokenizer
	// that models.<name>.tokenizer.path names (loaded by New), or, without one, the
	// body-size estimate. Default: none (the configuration decides).
	Tokenizer func(model string) tokenizer.Tokenizer
	// Telemetry ingests the workers' load reports into Loads. Default: an actors.Telemetry
	// (HTTP polling of /v1/loads or /get_load, scraping of /metrics, or the ZMQ load gauge,
	// per load.source and each worker's flavor).
	Telemetry Telemetry
	// NoTelemetry disables the default Telemetry: every reported metric stays unknown and
	// policies fall back to router-local in-flight counts.
	NoTelemetry bool
	// Loads is the load table the policies read; Telemetry publishes into it. Default: a new
	// empty table.
	Loads *load.Table
	// Tracker is the router-local request accounting. Default: a new Tracker.
	Tracker *load.Tracker
	// Metrics receives the server's metrics. Default: a new set.
	Metrics *metrics.Set
	// Listener, when set, is served instead of listening on the configured host and port.
	Listener net.Listener
	// Seed seeds the policies' random sources; 0 draws one.
	Seed uint64
	// HeartbeatInterval is the gap after which an idle SSE stream gets a ": keep-alive"
	// comment, which is how a vanished client is noticed. Default 5s.
	HeartbeatInterval time.Duration
	// ReadTimeout bounds reading one request (headers and body). Default 60s.
	ReadTimeout time.Duration
	// IdleTimeout closes keep-alive connections idle this long. Default 120s.
	IdleTimeout time.Duration
	// StreamEndGrace is how long, once the drain timeout has passed, the streams still
	// running have to deliver their shutting_down event before every connection closes.
	// Default 2s.
	StreamEndGrace time.Duration
	// StreamDoneWait is how long a stream's [DONE] event waits for the end of the engine's
	// answer, which then goes to the client in the same write: a client that stops reading
	// at [DONE] (Go's HTTP client, many SDKs) finds the end of the body there and keeps its
	// connection. An engine that has not ended its answer by then is not waited for: the
	// client's stream ends, complete, and the engine connection is closed. Default 50ms.
	StreamDoneWait time.Duration
	// SkipStartupChecks skips the health check and introspection of configured workers
	// before serving: they start healthy with their configured facts.
	SkipStartupChecks bool
	// Flow is the admission of inference requests (rate limits, concurrency limits and
	// queues). Default: built from the configuration (nil when it sets no limit).
	Flow *flow.Gate
	// CacheAwareObserver, when set, is told of every latency decision of the cache_aware
	// policies (engine.CacheAwareObserver: the bench's record of why requests left their
	// prefix's holder). Default: none.
	CacheAwareObserver engine.CacheAwareObserver
}

// selector runs the bucket loop for one request (actors.Selector).
type selector interface {
	Select(resolver *engine.BucketResolver, req *engine.BucketRequest) (engine.BucketPick, error)
}

// modelRoute is one configured model: its resolver, tokenizer and metric handles.
type modelRoute struct {
	name     string
	resolver *engine.BucketResolver
	tok      *promptTokenizer // nil: the body-size estimate
	metrics  *modelMetrics
	stages   []engine.Stage // stages some bucket requires, for readiness
	prefix   bool           // requests make a prefix lookup (cache_aware, affinity.prefix_rebind)
	slo      engine.SLOTargets
	hashKey  bool // some group runs consistent_hash: requests read hashing.key_headers
}

// Server is Switchyard's HTTP front end: fasthttp routes, request preparation, selection
// through the actors, plain and PD dispatch, the worker admin API, health and metrics.
type Server struct {
	cfg    *config.Config
	opts   Options
	logger *slog.Logger
	now    func() time.Time
	ln     net.Listener
	srv    *fasthttp.Server
	// resumed serves client connections again after their streams, on warm goroutines.
	resumed *resumers
	sel     selector
	// life holds the started parts (state, actors, telemetry, workers, listener, background
	// loops) and stops them in reverse order.
	life lifecycle
	// metricsLn serves /metrics apart from the data plane; nil when server.metrics_port is
	// not set.
	metricsLn *metricsListener
	// sys is the process's one actor system: every actor of the server runs on it.
	sys *actors.System
	// affinity holds the session and routing-key bindings of session_aware and sticky.
	affinity affinityStore
	// cluster joins the other router replicas; nil unless cluster.enabled.
	cluster *actors.Cluster
	// cache is the prefix source (cache_aware, affinity.prefix_rebind) and KV-event
	// subscriptions; nil without one.
	cache   *actors.CacheState
	workers *fleet.Fleet
	// discovery finds workers among Kubernetes pods; nil unless discovery.kubernetes.enabled.
	discovery *fleet.Kubernetes
	// tele is the workers' load ingestion (nil with Options.NoTelemetry).
	tele    Telemetry
	wset    *engine.WorkerSet
	tracker *load.Tracker
	loads   *load.Table
	set     *metrics.Set
	metrics *serverMetrics
	models  map[string]*modelRoute
	only    *modelRoute // the single configured model, for /generate without "model"
	dec     decoders
	exPool  sync.Pool // *exchange
	// lora is LoRA-adapter routing; nil when lora.enabled is off.
	lora *loraRouting
	// hashHeaders are hashing.key_headers, canonical: consistent_hash's key, first present.
	hashHeaders [][]byte
	// prioHeader and tenantHeader are server.priority_header and tenant_header, canonical;
	// nil when unset.
	prioHeader, tenantHeader []byte

	// fwd are the forwarded client header names (allow-list and affinity headers).
	fwd forwardNames
	// gate admits inference requests (rate limits, concurrency limits, queues); nil: all.
	gate *flow.Gate
	// tracing exports the requests' spans; tracer is its tracer. Both nil unless
	// tracing.enabled.
	tracing *tracing.Provider
	tracer  trace.Tracer
	// retry is the dispatch retry rules; retryBudget bounds the retries of all requests.
	retry       *retry.Policy
	retryBudget *retry.Budget

	draining atomic.Bool
	// hardStop is closed when the drain timeout passes: streams end at once.
	hardStop chan struct{}
	// bg tracks request-owned goroutines that outlive their handler (streams, prefill,
	// abort-API calls).
	bg sync.WaitGroup
	// aborts counts the requests whose engines were stopped, by cause.
	aborts abortMetrics
	// ridPrefix and ridSeq make the rids the router sets (abort.go).
	ridPrefix ridPrefix
	ridSeq    atomic.Uint64
	// conns accepts, caps and tracks the client connections (on ln).
	conns *clientListener
	// poller watches clients for hang-ups while their requests are dispatched (abort.go);
	// set by Run before serving, nil when aborts are off or it cannot run.
	poller *hangup.Poller
	// budget bounds the request-body bytes held at once.
	budget *bodyBudget
	// What the data plane, the admin API and /metrics require (auth.go).
	dataAccess, adminAccess, metricsAccess routeAccess

	runOnce sync.Once
	// built is closed once New has built every part: the cluster's callbacks, which read
	// the fleet, wait for it.
	built chan struct{}
	// serving is closed once the start-up checks are done and Serve begins.
	serving chan struct{}

	// wallNow: now is the wall clock (time.Now).
	wallNow bool
}

// New builds a Server from a validated configuration and starts listening (so Addr is known),
// but serves nothing until Run.
func New(cfg *config.Config, opts Options) (*Server, error) {
	if cfg == nil {
		return nil, errors.New("cannot create server: nil configuration")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	// The wall clock: a stream's idle bounds and the metrics it records can share one reading.
	wallClock := opts.Clock == nil && opts.Now == nil
	if opts.Clock == nil {
		opts.Clock = fleet.SystemClock{}
	}
	if opts.Now == nil {
		opts.Now = opts.Clock.Now
	}
	if opts.Loads == nil {
		opts.Loads = load.NewTable()
	}
	if opts.Tracker == nil {
		opts.Tracker = load.NewTracker()
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.NewSet()
	}
	if opts.HeartbeatInterval <= 0 {
		opts.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if opts.ReadTimeout <= 0 {
		opts.ReadTimeout = DefaultReadTimeout
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	if opts.StreamEndGrace <= 0 {
		opts.StreamEndGrace = DefaultStreamEndGrace
	}
	if opts.StreamDoneWait <= 0 {
		opts.StreamDoneWait = DefaultStreamDoneWait
	}
	s := &Server{
		cfg:      cfg,
		opts:     opts,
		logger:   opts.Logger,
		now:      opts.Now,
		wallNow:  wallClock,
		tracker:  opts.Tracker,
		loads:    opts.Loads,
		set:      opts.Metrics,
		hardStop: make(chan struct{}),
		built:    make(chan struct{}),
		serving:  make(chan struct{}),
		fwd:      newForwardNames(cfg.Affinity.SessionHeader, cfg.Affinity.RoutingKeyHeader),
	}
	if h := cfg.Server.PriorityHeader; h != "" {
		s.prioHeader = fasthttp.AppendNormalizedHeaderKey(nil, h)
	}
	if h := cfg.Server.TenantHeader; h != "" {
		s.tenantHeader = fasthttp.AppendNormalizedHeaderKey(nil, h)
	}
	for _, h := range cfg.Hashing.KeyHeaders {
		s.hashHeaders = append(s.hashHeaders, fasthttp.AppendNormalizedHeaderKey(nil, h))
	}
	s.exPool.New = func() any { return new(exchange) }
	s.ridPrefix = newRIDPrefix(rand.Uint64())
	s.aborts = newAbortMetrics(s.set)
	budget := cfg.Server.MaxBodyBytesInFlight
	if budget <= 0 {
		budget = max(128<<20, s.maxBody())
	}
	s.budget = newBodyBudget(budget, bodyBudgetWait)
	s.set.NewGauge(metricBodyBytes, func() float64 { return float64(s.budget.used.Load()) })
	s.life.logger = s.logger
	if err := s.build(); err != nil {
		s.life.stop() // whatever was built, in reverse
		return nil, fmt.Errorf("cannot create server: %w", err)
	}
	close(s.built)
	return s, nil
}

// build makes the Server's parts in order, recording each in s.life as it starts.
func (s *Server) build() error {
	cfg, opts := s.cfg, s.opts
	clientTLS, err := fleet.LoadTLS(cfg)
	if err != nil {
		return err
	}
	if cfg.Tracing.Enabled {
		// First built, last stopped: the drain's last spans are exported.
		if s.tracing, err = tracing.New(cfg.Tracing, tracing.Options{TLS: clientTLS.Tracing, Metrics: s.set,
			Logger: s.logger}); err != nil {
			return err
		}
		s.tracer = s.tracing.Tracer()
		s.life.add("tracing", func() {
			if err := s.tracing.Shutdown(); err != nil {
				s.logger.Warn("tracing did not shut down cleanly", slog.Any("error", err))
			}
		})
	}
	if s.retry, err = retry.New(cfg.Retry, nil); err != nil {
		return err
	}
	s.retryBudget = retry.NewBudget(cfg.Retry.Budget)
	toks, err := loadTokenizers(cfg, opts)
	if err != nil {
		return err
	}
	ws, err := engine.NewWorkerSet(nil)
	if err != nil {
		return err
	}
	s.wset = ws
	s.sys = actors.NewSystem(actors.SystemOptions{Logger: opts.Logger, Metrics: opts.Metrics})
	s.life.add("actor system", s.sys.Close)
	aopts := actors.AffinityOptionsFrom(cfg)
	aopts.Now, aopts.Logger, aopts.Metrics, aopts.System = opts.Now, opts.Logger, opts.Metrics, s.sys
	// The discovery is built before the cluster, whose gossip asks it which workers it owns
	// (it adds none before Run).
	if s.discovery, err = s.newDiscovery(); err != nil {
		return err
	}
	if s.affinity, err = s.newAffinityStore(aopts); err != nil {
		return err
	}
	s.life.add("affinity store", s.affinity.Close)
	deps := engine.Deps{Loads: opts.Loads, Seed: opts.Seed, Affinity: s.affinity, Metrics: opts.Metrics,
		CacheAwareObserver: opts.CacheAwareObserver}
	if s.cache, err = newCacheState(cfg, opts, s.sys); err != nil {
		return err
	}
	if s.cache != nil {
		s.life.add("cache state", func() { _ = s.cache.Close() })
		deps = s.cache.Deps(deps)
		defaultCacheTokenizers(s.cache, toks, opts.Logger)
	}
	resolvers, err := engine.BuildResolvers(cfg, deps)
	if err != nil {
		return err
	}
	s.metrics = newServerMetrics(s.set, resolvers, cfg.Retry.RetryableStatuses)
	s.gate = newGate(cfg, opts)
	s.models = make(map[string]*modelRoute, len(resolvers))
	names := make([]string, 0, len(resolvers))
	for name, r := range resolvers {
		mr := &modelRoute{name: name, resolver: r, tok: toks[name], metrics: s.metrics.models[name],
			prefix: s.cache != nil && s.cache.NeedsPrefix(name), slo: modelTargets(cfg.Models[name].SLO)}
		if mr.tok != nil {
			onError := cfg.Models[name].Tokenizer.OnError
			reject := onError == config.TokenizerOnErrorReject || (onError == "" && mr.prefix)
			mr.tok.failures = newTokenizerFailures(name, reject, s.metrics.tokenizerErrors(name), opts.Logger)
		}
		need := map[engine.Stage]bool{}
		for _, b := range r.Buckets() {
			for _, g := range b.Groups() {
				if g != nil {
					need[g.Stage()] = true
					mr.hashKey = mr.hashKey || g.Policy() != nil && g.Policy().Name() == engine.PolicyConsistentHash
				}
			}
		}
		for st := range need {
			mr.stages = append(mr.stages, st)
		}
		slices.Sort(mr.stages)
		for _, st := range mr.stages {
			s.metrics.healthyWorkers(name, st, func() float64 { return float64(len(s.wset.Load().Healthy(name, st))) })
		}
		s.models[name] = mr
		names = append(names, name)
	}
	slices.Sort(names)
	if len(names) == 1 {
		s.only = s.models[names[0]]
	}
	s.lora = newLoRARouting(cfg, s.set, s.logger, opts.Now)

	sel, err := actors.NewSelector(resolvers, ws, cfg.Actors, actors.SelectorOptions{System: s.sys, Logger: opts.Logger})
	if err != nil {
		return err
	}
	s.sel = sel
	s.life.add("selection actors", sel.Close)

	if opts.Telemetry == nil && !opts.NoTelemetry {
		tel, err := actors.NewTelemetry(opts.Loads, actors.TelemetryOptions{
			Load:    cfg.Load,
			Mailbox: cfg.Actors.Mailbox.Telemetry,
			Now:     opts.Now,
			Logger:  opts.Logger,
			System:  s.sys,
			// The load gauge shares kv.max_message_bytes, the one bound on ZeroMQ messages.
			GaugeLimits: zmtp.Limits{MaxMessage: cfg.KV.MaxMessageBytes},
			Metrics:     opts.Metrics,
		})
		if err != nil {
			return err
		}
		opts.Telemetry = actorTelemetry{tel}
		s.life.add("telemetry", tel.Close)
	}
	fo := fleet.Options{Health: cfg.Health, Upstream: cfg.Upstream, Tracker: s.tracker, Telemetry: opts.Telemetry,
		Metrics: s.set, Logger: opts.Logger, Clock: opts.Clock, Dial: opts.Dial, TLS: clientTLS.Global}
	if cfg.LoRA.Enabled {
		fo.AdapterRefresh, fo.AdapterSlots = cfg.LoRA.RefreshInterval, cfg.LoRA.SlotsPerEngine
		fo.AdapterNow = opts.Now            // the clock of the selections' reservations and of the loads
		fo.AdapterRoom = s.lora.slotMayFree // an engine's list or slots may make room for a waiter
	}
	if s.cache != nil {
		fo.KV = s.cache
	}
	s.tele = opts.Telemetry
	s.workers = fleet.New(ws, fo)
	s.life.add("workers", s.workers.Stop)
	for i, wc := range cfg.Workers {
		spec := WorkerSpec{ID: wc.ID, URL: wc.URL, Model: wc.Model, Role: string(wc.Role),
			BootstrapPort: wc.BootstrapPort, DPSize: wc.DPSize, LoadPublish: wc.LoadPublish, KVEvents: wc.KVEvents,
			Flavor: wc.Flavor, MetricsPath: wc.MetricsPath, KVReplay: wc.KVReplay, KVBlockSize: wc.KVBlockSize,
			KVHashScheme: wc.KVHashScheme, TLS: clientTLS.Workers[i], Labels: maps.Clone(wc.Labels),
			CanPrefill: wc.CanPrefill}
		if _, err := s.workers.Add(context.Background(), spec, false); err != nil {
			return err
		}
	}

	s.srv = &fasthttp.Server{
		Handler:      s.handle,
		ErrorHandler: s.handleServerError,
		// Bodies are read by the handlers, under the body budget, straight into their
		// decoders (body.go).
		StreamRequestBody:             true,
		ExpectHandler:                 s.expectContinue,
		Name:                          "switchyard",
		MaxRequestBodySize:            int(min(cfg.Server.MaxBodyBytes, 1<<40)),
		ReadTimeout:                   opts.ReadTimeout,
		WriteTimeout:                  0, // a total write deadline would cut long streams
		IdleTimeout:                   opts.IdleTimeout,
		NoDefaultServerHeader:         true,
		NoDefaultDate:                 false,
		DisablePreParseMultipartForm:  true,
		DisableHeaderNamesNormalizing: false,
		ReadBufferSize:                cfg.Server.MaxHeaderBytes, // also the request line and headers cap
		CloseOnShutdown:               true,
		ConnState:                     func(c net.Conn, st fasthttp.ConnState) { s.conns.track(c, st) },
		Logger:                        fasthttpLogger{s.logger},
	}
	if cfg.Server.MaxBodyBytes <= 0 {
		s.srv.MaxRequestBodySize = 32 << 20
	}
	s.resumed = newResumers(s.srv, resumeIdle)
	if opts.Listener != nil {
		s.ln = opts.Listener
	} else {
		ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Server.Host, strconv.Itoa(cfg.Server.Port)))
		if err != nil {
			return err
		}
		s.ln = ln
	}
	s.life.add("listener", func() { _ = s.ln.Close() })
	s.dataAccess, s.adminAccess, s.metricsAccess = accessRules(cfg.Server, s.ln.Addr())
	s.conns = newClientListener(s.ln, cfg.Server.MaxConnections, cfg.Server.MaxConnectionsPerIP,
		cfg.Server.WriteTimeout, s.set, s.logger)
	if err := s.listenMetrics(); err != nil {
		return fmt.Errorf("cannot listen on server.metrics_host and metrics_port: %w", err)
	}
	return nil
}

// fasthttpLogger routes fasthttp's own messages to slog.
type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Debug("fasthttp", slog.String("message", fmt.Sprintf(format, args...)))
}

func modelsBody(names []string) []byte {
	b := []byte(`{"object":"list","data":[`)
	for i, n := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = jsontext.AppendString(b, n)
		b = append(b, `,"object":"model","created":0,"owned_by":"switchyard"}`...)
	}
	return append(b, "]}"...)
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Workers returns the current worker registry snapshot.
func (s *Server) Workers() *engine.Registry { return s.wset.Load() }

// Tracker returns the router-local request accounting.
func (s *Server) Tracker() *load.Tracker { return s.tracker }

// actorTelemetry adapts actors.Telemetry to Telemetry.
type actorTelemetry struct{ t *actors.Telemetry }

var _ Telemetry = actorTelemetry{}

func (a actorTelemetry) StartWorker(src TelemetrySource) error {
	ws := actors.WorkerSource{ID: src.WorkerID, URL: src.URL, DPSize: src.DPSize, Counters: src.Counters,
		Flavor: src.Flavor, MetricsPath: src.MetricsPath, Model: src.Model, Client: src.Client}
	if len(src.GaugeEndpoints) > 0 {
		ws.GaugeEndpoint = src.GaugeEndpoints[0]
		ws.GaugeEndpoints = src.GaugeEndpoints[1:]
	}
	return a.t.AddWorker(ws)
}

func (a actorTelemetry) StopWorker(id string) { _ = a.t.RemoveWorker(id) }

// LoadStatus implements loadStatuser.
func (a actorTelemetry) LoadStatus(id string) (actors.LoadStatus, bool) { return a.t.Status(id) }

var _ loadStatuser = actorTelemetry{}
