package load

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// ErrInvalidConfig is wrapped by constructor errors about a missing or invalid setting.
var ErrInvalidConfig = errors.New("invalid configuration")

// ErrStatus is wrapped by poll errors about an unexpected HTTP status.
var ErrStatus = errors.New("unexpected HTTP status")

// Poller defaults.
const (
	// DefaultPollInterval is the period between two polls.
	DefaultPollInterval = time.Second
	// DefaultPollTimeout bounds one poll request when PollerConfig.Timeout is unset and the
	// interval is longer.
	DefaultPollTimeout = 2 * time.Second
	// DefaultReprobeEvery is how many legacy polls pass before /v1/loads is tried again.
	DefaultReprobeEvery = 60
	// MaxLoadBodyBytes bounds a load response body.
	MaxLoadBodyBytes = 4 << 20
)

// Load routes of an engine (the Prometheus page's path is configurable, DefaultMetricsPath).
const (
	PathLoads   = "/v1/loads"
	PathGetLoad = "/get_load"
)

// ErrNoLoadRoute is wrapped by the poll error of an engine that answered 404 on every load
// route it was probed for.
var ErrNoLoadRoute = errors.New("engine exposes no load route")

// PollMode says which routes a Poller reads.
type PollMode uint8

// Poll modes.
const (
	// PollAuto detects the route once: /v1/loads, then /get_load, then the Prometheus page;
	// the first that answers is kept (see Poller).
	PollAuto PollMode = iota
	// PollNative reads /v1/loads, falling back to /get_load (SGLang).
	PollNative
	// PollPrometheus scrapes the Prometheus page only (vLLM, or any engine by
	// load.source: prometheus).
	PollPrometheus
)

// Source names the route a Poller currently reads, as GET /workers and the metrics show it.
type Source uint8

// Sources. SourceNone: not detected yet, or nothing answered.
const (
	SourceNone Source = iota
	SourceLoads
	SourceGetLoad
	SourcePrometheus
	SourceGauge // the ZMQ load gauge (GaugeSubscriber), named here so that one list serves
	numSources
)

// Sources returns every Source, in order.
func Sources() []Source {
	out := make([]Source, numSources)
	for i := range out {
		out[i] = Source(i)
	}
	return out
}

// String is the source's name: "none", "v1_loads", "get_load", "prometheus" or "zmq".
func (s Source) String() string {
	switch s {
	case SourceLoads:
		return "v1_loads"
	case SourceGetLoad:
		return "get_load"
	case SourcePrometheus:
		return "prometheus"
	case SourceGauge:
		return "zmq"
	}
	return "none"
}

// PollerConfig configures a Poller.
type PollerConfig struct {
	// WorkerID names the worker in callbacks and logs. Required.
	WorkerID string
	// URL is the engine's base URL, e.g. "http://127.0.0.1:30001". Required.
	URL string
	// Interval is the poll period. Default DefaultPollInterval (1 s).
	Interval time.Duration
	// Timeout bounds one request. Default: the smaller of Interval and DefaultPollTimeout.
	Timeout time.Duration
	// ReprobeEvery is how many /get_load polls pass before /v1/loads is tried again after
	// it answered 404, and how many polls an engine that answered 404 on every route is
	// left alone before it is probed again. Default DefaultReprobeEvery (60).
	ReprobeEvery int
	// Mode selects the routes. Default PollAuto.
	Mode PollMode
	// MetricsPath is the Prometheus page's path. Default DefaultMetricsPath ("/metrics").
	MetricsPath string
	// Model is the served model name whose series a Prometheus page is read for when it
	// serves several models. Default "" (a page of one model only).
	Model string
	// MaxBodyBytes bounds a response body. Default MaxLoadBodyBytes (4 MiB).
	MaxBodyBytes int
	// Client sends the requests; it may be shared between pollers (the router passes each
	// worker's own client). Default: a new fasthttp.Client.
	Client Doer
	// Logger receives failure-change logs. Default: discard.
	Logger *slog.Logger
	// Now is the clock for receipt times. Default time.Now.
	Now func() time.Time
	// Deliver receives every poll's reports, or its error (reps nil). It runs on the
	// poller's goroutine and owns reps. Required.
	Deliver func(workerID string, reps []RankReport, err error)
}

// Poller polls one engine's load over HTTP. Native mode reads GET <url>/v1/loads, falling
// back to GET <url>/get_load while /v1/loads answers 404; Prometheus mode scrapes the
// metrics page. Auto mode detects once: /v1/loads, /get_load, then the metrics page, and
// keeps the first that answers (re-probing /v1/loads every ReprobeEvery legacy polls, as
// native mode does); once both native routes answered 404 only the metrics page is read,
// and a metrics page that answers 404 starts detection again. An
// engine that answers 404 on every route is left alone for ReprobeEvery polls (each
// reported as an ErrNoLoadRoute error without a request) before it is probed again, so an
// engine without load routes costs one probe a minute, not three a second.
//
// Run owns the poll state; a Poller is not safe for concurrent use, except Source, Info and
// Malformed, which any goroutine may call.
type Poller struct {
	cfg PollerConfig
	// own is cfg.Client when it was created here; Run closes its idle connections.
	own        *fasthttp.Client
	loadsURL   string
	legacyURL  string
	metricsURL string
	// legacy is set after /v1/loads answered 404; polls since then count toward a re-probe.
	legacy       bool
	legacyPolls  int
	legacyLogged bool
	// idle counts down the polls left alone after every route answered 404.
	idle int
	// scraping is set in auto mode once both native routes answered 404: the metrics page
	// is read from then on, until it answers 404.
	scraping bool
	// lastErr is the message of the latest logged failure ("" while healthy).
	lastErr  string
	failures int

	source    atomic.Uint32 // Source of the latest successful poll
	info      atomic.Pointer[PrometheusInfo]
	malformed atomic.Uint64
}

// NewPoller validates cfg and returns a Poller.
func NewPoller(cfg PollerConfig) (*Poller, error) {
	if cfg.WorkerID == "" {
		return nil, fmt.Errorf("cannot create load poller: %w: empty worker ID", ErrInvalidConfig)
	}
	if cfg.Deliver == nil {
		return nil, fmt.Errorf("cannot create load poller for %s: %w: nil Deliver", cfg.WorkerID, ErrInvalidConfig)
	}
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("cannot create load poller for %s: %w: url %q is not an http(s) base URL", cfg.WorkerID, ErrInvalidConfig, cfg.URL)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultPollInterval
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = min(cfg.Interval, DefaultPollTimeout)
	}
	if cfg.ReprobeEvery <= 0 {
		cfg.ReprobeEvery = DefaultReprobeEvery
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = MaxLoadBodyBytes
	}
	switch {
	case cfg.MetricsPath == "":
		cfg.MetricsPath = DefaultMetricsPath
	case cfg.MetricsPath[0] != '/':
		return nil, fmt.Errorf("cannot create load poller for %s: %w: metrics path %q does not start with /", cfg.WorkerID, ErrInvalidConfig, cfg.MetricsPath)
	}
	if cfg.Mode > PollPrometheus {
		return nil, fmt.Errorf("cannot create load poller for %s: %w: unknown mode %d", cfg.WorkerID, ErrInvalidConfig, cfg.Mode)
	}
	var own *fasthttp.Client
	if cfg.Client == nil {
		own = &fasthttp.Client{Name: "switchyard-load", MaxConnsPerHost: 4}
		cfg.Client = own
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	base := strings.TrimRight(cfg.URL, "/")
	return &Poller{cfg: cfg, own: own, loadsURL: base + PathLoads, legacyURL: base + PathGetLoad,
		metricsURL: base + cfg.MetricsPath}, nil
}

// Legacy reports whether the poller currently uses /get_load.
func (p *Poller) Legacy() bool { return p.legacy }

// Source is the route of the latest successful poll (SourceNone before one). Safe for
// concurrent use.
func (p *Poller) Source() Source { return Source(p.source.Load()) }

// Info is what the latest Prometheus page said beyond load (nil before one). Safe for
// concurrent use.
func (p *Poller) Info() *PrometheusInfo { return p.info.Load() }

// Malformed counts the answers that did not decode (a 200 with a body of the wrong shape).
// Safe for concurrent use.
func (p *Poller) Malformed() uint64 { return p.malformed.Load() }

// Run polls at once and then every interval, delivering each result, until ctx is done;
// it then closes the idle connections of a client it created and returns nil. A panic in
// Deliver is recovered and logged.
func (p *Poller) Run(ctx context.Context) error {
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	if p.own != nil {
		defer p.own.CloseIdleConnections()
	}
	for {
		p.round(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// round polls once and delivers the result, logging failure changes.
func (p *Poller) round(ctx context.Context) {
	defer func() {
		if v := recover(); v != nil {
			p.cfg.Logger.Error("load poll panicked", slog.String("worker", p.cfg.WorkerID), slog.Any("panic", v))
		}
	}()
	reps, err := p.Poll(ctx)
	if ctx.Err() != nil {
		return
	}
	p.noteResult(err)
	p.cfg.Deliver(p.cfg.WorkerID, reps, err)
}

// noteResult logs a failure when its message changes and a recovery once.
func (p *Poller) noteResult(err error) {
	if err == nil {
		if p.lastErr != "" {
			p.cfg.Logger.Info("load poll recovered", slog.String("worker", p.cfg.WorkerID), slog.Int("failures", p.failures))
		}
		p.lastErr, p.failures = "", 0
		return
	}
	p.failures++
	if msg := err.Error(); msg != p.lastErr {
		p.lastErr = msg
		p.cfg.Logger.Warn("load poll failing", slog.String("worker", p.cfg.WorkerID), slog.Any("error", err))
	}
}

// Poll performs one poll round (see Poller for the routes and their detection). It is what
// Run calls; do not call it concurrently with Run.
func (p *Poller) Poll(ctx context.Context) ([]RankReport, error) {
	reps, src, err := p.poll(ctx)
	if err == nil {
		p.source.Store(uint32(src))
	} else if errors.Is(err, ErrMalformed) {
		p.malformed.Add(1)
	}
	return reps, err
}

func (p *Poller) poll(ctx context.Context) ([]RankReport, Source, error) {
	if p.cfg.Mode == PollPrometheus {
		reps, _, err := p.scrape(ctx)
		return reps, SourcePrometheus, err
	}
	if p.idle > 0 {
		p.idle--
		return nil, SourceNone, fmt.Errorf("cannot poll %s: %w (probed again in %d polls)", p.cfg.URL, ErrNoLoadRoute, p.idle+1)
	}
	if p.cfg.Mode == PollAuto && (p.scraping || p.Source() == SourcePrometheus) {
		return p.autoScrape(ctx)
	}
	if p.legacy {
		p.legacyPolls++
		if p.legacyPolls > p.cfg.ReprobeEvery {
			p.legacy, p.legacyPolls = false, 0
		}
	}
	if !p.legacy {
		reps, status, err := p.get(ctx, p.loadsURL, DecodeLoads)
		if status != fasthttp.StatusNotFound {
			return reps, SourceLoads, err
		}
		if !p.legacyLogged {
			p.legacyLogged = true
			p.cfg.Logger.Info("engine has no /v1/loads; polling /get_load", slog.String("worker", p.cfg.WorkerID))
		}
		p.legacy, p.legacyPolls = true, 0
	}
	reps, status, err := p.get(ctx, p.legacyURL, DecodeGetLoad)
	if status != fasthttp.StatusNotFound {
		return reps, SourceGetLoad, err
	}
	// Neither native route.
	p.legacy, p.legacyLogged = false, false
	if p.cfg.Mode == PollAuto {
		p.scraping = true
		p.cfg.Logger.Info("engine has no /v1/loads or /get_load; scraping its metrics page",
			slog.String("worker", p.cfg.WorkerID), slog.String("url", p.metricsURL))
		return p.autoScrape(ctx)
	}
	return nil, SourceNone, p.noRoute(err)
}

// autoScrape scrapes the metrics page of an engine detected (or being detected) to have no
// native load route. A page that answers 404 after it was read starts detection again next
// round; one that answers 404, or what does not decode, before it was ever read means no
// load route: detection starts again after the idle polls. A failed request (timeout,
// refused connection, 5xx) keeps the page for the next round.
func (p *Poller) autoScrape(ctx context.Context) ([]RankReport, Source, error) {
	reps, status, err := p.scrape(ctx)
	detected := p.Source() == SourcePrometheus
	switch {
	case err == nil:
		return reps, SourcePrometheus, nil
	case status == fasthttp.StatusNotFound && detected:
		// The engine behind the URL changed: detect its routes again next round.
		p.scraping = false
		p.source.Store(uint32(SourceNone))
		p.cfg.Logger.Info("engine's metrics page is gone; detecting its load route again", slog.String("worker", p.cfg.WorkerID))
		return nil, SourceNone, err
	case status == fasthttp.StatusNotFound, errors.Is(err, ErrMalformed) && !detected:
		p.scraping = false
		return nil, SourceNone, p.noRoute(err)
	}
	return nil, SourcePrometheus, err
}

// noRoute leaves an engine without a load route alone for ReprobeEvery polls.
func (p *Poller) noRoute(err error) error {
	p.idle = p.cfg.ReprobeEvery
	p.cfg.Logger.Warn("engine exposes no load route; its load stays unknown", slog.String("worker", p.cfg.WorkerID),
		slog.Int("next_probe_in_polls", p.idle), slog.Any("error", err))
	return fmt.Errorf("%w (%w)", err, ErrNoLoadRoute)
}

// scrape fetches and decodes the Prometheus page.
func (p *Poller) scrape(ctx context.Context) ([]RankReport, int, error) {
	var info PrometheusInfo
	reps, status, err := p.get(ctx, p.metricsURL, func(body []byte, at time.Time) ([]RankReport, error) {
		var err error
		var reps []RankReport
		reps, info, err = DecodePrometheus(body, p.cfg.Model, at)
		return reps, err
	})
	if err == nil {
		p.info.Store(&info)
	}
	return reps, status, err
}

// get fetches one load route and decodes a 200 body with decode.
func (p *Poller) get(ctx context.Context, u string, decode func([]byte, time.Time) ([]RankReport, error)) ([]RankReport, int, error) {
	accept := "application/json"
	if u == p.metricsURL {
		accept = "text/plain;version=0.0.4"
	}
	var (
		reps   []RankReport
		status int
	)
	err := Fetch(ctx, p.cfg.Client, u, accept, p.cfg.Timeout, p.cfg.MaxBodyBytes, func(code int, body []byte) error {
		status = code
		if code != fasthttp.StatusOK {
			return fmt.Errorf("cannot poll %s: %w %d", u, ErrStatus, code)
		}
		var err error
		if reps, err = decode(body, p.cfg.Now()); err != nil {
			return fmt.Errorf("cannot poll %s: %w", u, err)
		}
		return nil
	})
	return reps, status, err
}
