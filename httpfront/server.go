package httpfront

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"switchyard/actors"
	"switchyard/config"
	"switchyard/engine"
	"switchyard/httpfront/fleet"
	"switchyard/httpfront/flow"
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
	// SkipStartupChecks skips the health check and introspection of configured workers
	// before serving: they start healthy with their configured facts.
	SkipStartupChecks bool
	// Flow is the admission of inference requests (rate limits, concurrency limits and
	// queues). Default: built from the configuration (nil when it sets no limit).
	Flow *flow.Gate
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
	prefix   bool           // some group runs cache_aware: requests make a prefix lookup
}

// Server is Switchyard's HTTP front end: fasthttp routes, request preparation, selection
// through the actors, plain and PD dispatch, the worker admin API, health and metrics.
type Server struct {
	cfg       *config.Config
	opts      Options
	logger    *slog.Logger
	now       func() time.Time
	ln        net.Listener
	srv       *fasthttp.Server
	sel       selector
	closeSel  func()
	closeTele func()
	// affinity holds the session and routing-key bindings of session_aware and sticky.
	affinity *actors.AffinityStore
	// cache is cache_aware's prefix source and KV-event subscriptions; nil without one.
	cache   *actors.CacheState
	workers *fleet.Fleet
	// tele is the workers' load ingestion (nil with Options.NoTelemetry).
	tele     Telemetry
	wset     *engine.WorkerSet
	tracker  *load.Tracker
	loads    *load.Table
	set      *metrics.Set
	metrics  *serverMetrics
	models   map[string]*modelRoute
	only     *modelRoute // the single configured model, for /generate without "model"
	modelsJS []byte      // GET /v1/models body
	dec      decoders
	exPool   sync.Pool // *exchange

	// fwd are the forwarded client header names (allow-list and affinity headers).
	fwd forwardNames
	// gate admits inference requests (rate limits, concurrency limits, queues); nil: all.
	gate *flow.Gate

	draining atomic.Bool
	// hardStop is closed when the drain timeout passes: streams end at once.
	hardStop chan struct{}
	// bg tracks request-owned goroutines that outlive their handler (streams, prefill).
	bg sync.WaitGroup

	connMu sync.Mutex
	conns  map[net.Conn]struct{}

	runOnce sync.Once
	// serving is closed once the start-up checks are done and Serve begins.
	serving chan struct{}
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
	s := &Server{
		cfg:      cfg,
		opts:     opts,
		logger:   opts.Logger,
		now:      opts.Now,
		tracker:  opts.Tracker,
		loads:    opts.Loads,
		set:      opts.Metrics,
		hardStop: make(chan struct{}),
		serving:  make(chan struct{}),
		conns:    make(map[net.Conn]struct{}),
		fwd:      newForwardNames(cfg.Affinity.SessionHeader, cfg.Affinity.RoutingKeyHeader),
	}
	s.exPool.New = func() any { return new(exchange) }

	toks, err := loadTokenizers(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("cannot create server: %w", err)
	}
	ws, err := engine.NewWorkerSet(nil)
	if err != nil {
		return nil, fmt.Errorf("cannot create server: %w", err)
	}
	s.wset = ws
	aopts := actors.AffinityOptionsFrom(cfg)
	aopts.Now, aopts.Logger, aopts.Metrics = opts.Now, opts.Logger, opts.Metrics
	s.affinity = actors.NewAffinityStore(aopts)
	deps := engine.Deps{Loads: opts.Loads, Seed: opts.Seed, Affinity: s.affinity, Metrics: opts.Metrics}
	if s.cache, err = newCacheState(cfg, opts); err != nil {
		s.affinity.Close()
		return nil, fmt.Errorf("cannot create server: %w", err)
	}
	if s.cache != nil {
		deps = s.cache.Deps(deps)
		defaultCacheTokenizers(s.cache, toks, opts.Logger)
	}
	closeState := func() {
		s.affinity.Close()
		if s.cache != nil {
			_ = s.cache.Close()
		}
	}
	resolvers, err := engine.BuildResolvers(cfg, deps)
	if err != nil {
		closeState()
		return nil, fmt.Errorf("cannot create server: %w", err)
	}
	s.metrics = newServerMetrics(s.set, resolvers)
	s.gate = newGate(cfg, opts)
	s.models = make(map[string]*modelRoute, len(resolvers))
	names := make([]string, 0, len(resolvers))
	for name, r := range resolvers {
		mr := &modelRoute{name: name, resolver: r, tok: toks[name], metrics: s.metrics.models[name],
			prefix: s.cache != nil && s.cache.NeedsPrefix(name)}
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
	s.modelsJS = modelsBody(names)

	sel, err := actors.NewSelector(resolvers, ws, cfg.Actors, opts.Logger)
	if err != nil {
		closeState()
		return nil, fmt.Errorf("cannot create server: %w", err)
	}
	s.sel = sel
	s.closeSel = func() {
		sel.Close()
		closeState()
	}
	s.registerActorMetrics(sel)

	s.closeTele = func() {}
	if opts.Telemetry == nil && !opts.NoTelemetry {
		tel, err := actors.NewTelemetry(opts.Loads, actors.TelemetryOptions{
			Load:     cfg.Load,
			Mailbox:  cfg.Actors.Mailbox.Telemetry,
			Now:      opts.Now,
			Logger:   opts.Logger,
			Counters: sel.Counters(),
			// The load gauge shares kv.max_message_bytes, the one bound on ZeroMQ messages.
			GaugeLimits: zmtp.Limits{MaxMessage: cfg.KV.MaxMessageBytes},
			Metrics:     opts.Metrics,
		})
		if err != nil {
			s.closeSel()
			return nil, fmt.Errorf("cannot create server: %w", err)
		}
		opts.Telemetry = actorTelemetry{tel}
		s.closeTele = tel.Close
	}
	fo := fleet.Options{Health: cfg.Health, Upstream: cfg.Upstream, Tracker: s.tracker, Telemetry: opts.Telemetry,
		Metrics: s.set, Logger: opts.Logger, Clock: opts.Clock, Dial: opts.Dial}
	if s.cache != nil {
		fo.KV = s.cache
	}
	s.tele = opts.Telemetry
	s.workers = fleet.New(ws, fo)
	for _, wc := range cfg.Workers {
		spec := WorkerSpec{ID: wc.ID, URL: wc.URL, Model: wc.Model, Role: string(wc.Role),
			BootstrapPort: wc.BootstrapPort, DPSize: wc.DPSize, LoadPublish: wc.LoadPublish, KVEvents: wc.KVEvents,
			Flavor: wc.Flavor, MetricsPath: wc.MetricsPath, KVReplay: wc.KVReplay, KVBlockSize: wc.KVBlockSize,
			KVHashScheme: wc.KVHashScheme}
		if _, err := s.workers.Add(context.Background(), spec, false); err != nil {
			s.closeSel()
			s.workers.Stop()
			s.closeTele()
			return nil, fmt.Errorf("cannot create server: %w", err)
		}
	}

	s.srv = &fasthttp.Server{
		Handler:                       s.handle,
		ErrorHandler:                  s.handleServerError,
		Name:                          "switchyard",
		MaxRequestBodySize:            int(min(cfg.Server.MaxBodyBytes, 1<<40)),
		ReadTimeout:                   opts.ReadTimeout,
		WriteTimeout:                  0, // a total write deadline would cut long streams
		IdleTimeout:                   opts.IdleTimeout,
		NoDefaultServerHeader:         true,
		NoDefaultDate:                 false,
		DisablePreParseMultipartForm:  true,
		DisableHeaderNamesNormalizing: false,
		CloseOnShutdown:               true,
		ConnState:                     s.trackConn,
		Logger:                        fasthttpLogger{s.logger},
	}
	if cfg.Server.MaxBodyBytes <= 0 {
		s.srv.MaxRequestBodySize = 32 << 20
	}
	if opts.Listener != nil {
		s.ln = opts.Listener
	} else {
		ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Server.Host, strconv.Itoa(cfg.Server.Port)))
		if err != nil {
			s.closeSel()
			s.workers.Stop()
			s.closeTele()
			return nil, fmt.Errorf("cannot create server: %w", err)
		}
		s.ln = ln
	}
	return s, nil
}

// fasthttpLogger routes fasthttp's own messages to slog.
type fasthttpLogger struct{ l *slog.Logger }

func (f fasthttpLogger) Printf(format string, args ...any) {
	f.l.Debug("fasthttp", slog.String("message", fmt.Sprintf(format, args...)))
}

func (s *Server) registerActorMetrics(sel *actors.Selector) {
	c := sel.Counters()
	for _, k := range []actors.Kind{actors.KindBucket, actors.KindGroup, actors.KindTelemetry} {
		k := k
		s.set.NewGauge(metricMailboxRejections+`{kind="`+k.String()+`"}`, func() float64 { return float64(c.Rejected(k)) })
		s.set.NewGauge(metricActorPanics+`{kind="`+k.String()+`"}`, func() float64 { return float64(c.Panics(k)) })
	}
	s.set.NewGauge(metricStaleGuards, func() float64 { return float64(s.tracker.StaleReleased()) })
}

func modelsBody(names []string) []byte {
	b := []byte(`{"object":"list","data":[`)
	for i, n := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = appendJSONString(b, n)
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

// Run checks the configured workers once (introspection and health, unless
// Options.SkipStartupChecks), starts health checks and the guard janitor, and serves until
// ctx is done. It then stops accepting connections, lets in-flight requests and streams
// finish for up to the drain timeout, ends whatever remains, and releases everything. Run
// may be called once; it returns nil after a clean shutdown.
func (s *Server) Run(ctx context.Context) error {
	err := errors.New("cannot run server: Run called twice")
	s.runOnce.Do(func() { err = s.run(ctx) })
	return err
}

func (s *Server) run(ctx context.Context) error {
	life, stopLife := context.WithCancel(context.Background())
	defer stopLife()
	if !s.opts.SkipStartupChecks {
		s.workers.StartupCheck(ctx)
	}
	s.workers.Start(life)
	var janitor sync.WaitGroup
	janitor.Add(1)
	go func() {
		defer janitor.Done()
		s.runJanitor(life)
	}()
	sweep := s.cfg.Affinity.SweepInterval
	if sweep <= 0 {
		sweep = time.Minute
	}
	janitor.Add(1)
	go func() {
		defer janitor.Done()
		t := time.NewTicker(sweep)
		defer t.Stop()
		s.affinity.RunSweeper(life, t.C)
	}()
	if s.cache != nil {
		// The KV-event subscriptions follow the engines until the drain is over.
		janitor.Add(1)
		go func() {
			defer janitor.Done()
			if err := s.cache.Run(life); err != nil {
				s.logger.Error("KV-event subscriptions stopped", slog.Any("error", err))
			}
		}()
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- s.srv.Serve(lazyDeadlineListener{s.ln}) }()
	close(s.serving)
	s.logger.Info("serving", slog.String("addr", s.ln.Addr().String()), slog.Int("models", len(s.models)),
		slog.Int("workers", len(s.wset.Load().Workers())))

	var runErr error
	served := false
	select {
	case <-ctx.Done():
	case runErr = <-serveErr:
		served = true
	}
	s.draining.Store(true)
	drain := s.cfg.Server.DrainTimeout
	if drain <= 0 {
		drain = 30 * time.Second
	}
	s.logger.Info("draining", slog.Duration("timeout", drain))
	dctx, cancel := context.WithTimeout(context.Background(), drain)
	if err := s.srv.ShutdownWithContext(dctx); err != nil {
		s.logger.Warn("drain timeout passed; closing remaining connections and streams")
	}
	// Shutdown closes only the listeners Serve has registered; when the context was cancelled
	// before Serve got that far, closing ours makes Serve return (a closed listener ends it
	// without error).
	_ = s.ln.Close()
	if !served {
		runErr = <-serveErr
	}
	// Prefill requests whose client has gone still count as in flight.
	bgDone := make(chan struct{})
	go func() {
		s.bg.Wait()
		close(bgDone)
	}()
	select {
	case <-bgDone:
	case <-dctx.Done():
	}
	cancel()
	close(s.hardStop)
	s.closeConns()
	s.workers.CloseConnections()
	<-bgDone
	stopLife()
	janitor.Wait()
	s.workers.Stop()
	s.closeTele()
	s.closeSel()
	s.logger.Info("stopped")
	return runErr
}

func (s *Server) runJanitor(ctx context.Context) {
	maxAge := s.cfg.Load.GuardMaxAge
	if maxAge <= 0 {
		maxAge = load.DefaultGuardMaxAge
	}
	t := time.NewTicker(DefaultJanitorInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n := s.tracker.ReleaseStale(s.now(), maxAge); n > 0 {
				s.logger.Warn("released leaked in-flight guards", slog.Int("count", n))
			}
		}
	}
}

// trackConn records the open connections for closeConns. The active and idle transitions,
// two per request, take no lock.
func (s *Server) trackConn(c net.Conn, state fasthttp.ConnState) {
	switch state {
	case fasthttp.StateNew:
		s.connMu.Lock()
		s.conns[c] = struct{}{}
		s.connMu.Unlock()
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		s.connMu.Lock()
		delete(s.conns, c)
		s.connMu.Unlock()
	}
}

func (s *Server) closeConns() {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	for c := range s.conns {
		_ = c.Close()
	}
}

// handleServerError answers fasthttp's own failures (body too large, malformed request).
func (s *Server) handleServerError(ctx *fasthttp.RequestCtx, err error) {
	var tooLarge bool
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		tooLarge = true
	}
	if tooLarge {
		writeError(ctx, errTooLarge)
		ctx.SetConnectionClose()
		return
	}
	writeError(ctx, newAPIError(CodeInvalidJSON, "malformed HTTP request"))
	ctx.SetConnectionClose()
}

// checkKey enforces a bearer key when key is set.
func checkKey(ctx *fasthttp.RequestCtx, key string) *apiError {
	if key == "" {
		return nil
	}
	h := ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)
	const prefix = "Bearer "
	if len(h) <= len(prefix) || !equalFoldASCII(h[:len(prefix)], prefix) {
		return errMissingKey
	}
	if subtle.ConstantTimeCompare(h[len(prefix):], []byte(key)) != 1 {
		return errWrongKey
	}
	return nil
}

func equalFoldASCII(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		c, d := b[i], s[i]
		if c|0x20 != d|0x20 {
			return false
		}
	}
	return true
}

// handle routes a request. A panic fails only its own request, with a 500.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	defer func() {
		if r := recover(); r != nil {
			s.logger.Error("request handler panicked", slog.Any("panic", r), slog.String("path", string(ctx.Path())))
			writeError(ctx, newAPIError(CodeInternal, "internal error"))
		}
	}()
	path := ctx.Path()
	switch string(path) {
	case "/v1/chat/completions":
		s.inference(ctx, routeChat)
		return
	case "/v1/completions":
		s.inference(ctx, routeCompletions)
		return
	case "/generate":
		s.inference(ctx, routeGenerate)
		return
	case "/v1/models":
		s.metrics.other[otherModels].Inc()
		if !ctx.IsGet() {
			writeError(ctx, errMethodNotAllowed)
			return
		}
		if e := checkKey(ctx, s.cfg.Server.APIKey); e != nil {
			writeError(ctx, e)
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBody(s.modelsJS)
		return
	case "/health":
		s.metrics.other[otherHealth].Inc()
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"status":"ok"}`)
		return
	case "/readiness":
		s.metrics.other[otherReadiness].Inc()
		s.readiness(ctx)
		return
	case "/metrics":
		s.metrics.other[otherMetrics].Inc()
		ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
		s.set.WritePrometheus(ctx)
		metrics.WriteProcessMetrics(ctx)
		return
	}
	if len(path) >= len("/workers") && string(path[:len("/workers")]) == "/workers" {
		s.metrics.other[otherAdmin].Inc()
		s.admin(ctx)
		return
	}
	s.metrics.other[otherUnknown].Inc()
	writeError(ctx, errNotFound)
}

// readiness answers 200 when every configured model has a healthy engine for every stage
// its buckets require, else 503 naming what is missing.
func (s *Server) readiness(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	if s.draining.Load() {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString(`{"status":"draining"}`)
		return
	}
	reg := s.wset.Load()
	var missing []byte
	names := make([]string, 0, len(s.models))
	for n := range s.models {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		for _, st := range s.models[n].stages {
			if len(reg.Healthy(n, st)) == 0 {
				if len(missing) > 0 {
					missing = append(missing, ',')
				}
				missing = appendJSONString(missing, n+"/"+st.String())
			}
		}
	}
	if len(missing) > 0 {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString(`{"status":"not_ready","missing":[` + string(missing) + `]}`)
		return
	}
	ctx.SetBodyString(`{"status":"ready"}`)
}

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

// lazyDeadlineListener hands out lazyDeadlineConns.
type lazyDeadlineListener struct{ net.Listener }

func (l lazyDeadlineListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &lazyDeadlineConn{Conn: c}, nil
}

// lazyDeadlineConn moves its deadlines lazily. fasthttp moves a keep-alive connection's read
// deadline twice per request (the idle timeout, then the read timeout), and every move is a
// runtime timer update: a measurable part of the cost of a small request. Here a deadline
// later than the armed one is only recorded; when the armed deadline fires first, the read or
// write re-arms the recorded deadline and carries on, so an operation still times out exactly
// at the deadline last set. A deadline earlier than the armed one is armed at once.
type lazyDeadlineConn struct {
	net.Conn
	mu   sync.Mutex
	r, w lazyDeadline
}

var _ net.Conn = (*lazyDeadlineConn)(nil)

// lazyDeadline is one direction's deadlines: the one last set and the one armed on the
// connection; zero is none.
type lazyDeadline struct{ want, armed time.Time }

// set records t and reports whether it must be armed now: it is earlier than the armed
// deadline, or none is armed. A later or cleared deadline waits for the armed one to fire.
func (d *lazyDeadline) set(t time.Time) bool {
	d.want = t
	if t.IsZero() || !d.armed.IsZero() && !t.Before(d.armed) {
		return false
	}
	d.armed = t
	return true
}

// fired handles the armed deadline firing and reports whether the operation goes on: the
// deadline last set (or none) is armed, unless it has passed as well.
func (d *lazyDeadline) fired(arm func(time.Time) error) bool {
	if d.want.Equal(d.armed) {
		return false // the deadline last set is the one that fired
	}
	d.armed = d.want
	if err := arm(d.want); err != nil {
		return false
	}
	return d.want.IsZero() || time.Now().Before(d.want)
}

func (c *lazyDeadlineConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.r.set(t) {
		return c.Conn.SetReadDeadline(t)
	}
	return nil
}

func (c *lazyDeadlineConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.w.set(t) {
		return c.Conn.SetWriteDeadline(t)
	}
	return nil
}

func (c *lazyDeadlineConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

func (c *lazyDeadlineConn) Read(b []byte) (int, error) {
	for {
		n, err := c.Conn.Read(b)
		if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
		c.mu.Lock()
		more := c.r.fired(c.Conn.SetReadDeadline)
		c.mu.Unlock()
		if !more {
			return n, err
		}
	}
}

func (c *lazyDeadlineConn) Write(b []byte) (int, error) {
	done := 0
	for {
		n, err := c.Conn.Write(b[done:])
		done += n
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return done, err
		}
		c.mu.Lock()
		more := c.w.fired(c.Conn.SetWriteDeadline)
		c.mu.Unlock()
		if !more {
			return done, err
		}
	}
}
