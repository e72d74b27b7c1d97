package load

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
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

// Load routes of an engine.
const (
	PathLoads   = "/v1/loads"
	PathGetLoad = "/get_load"
)

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
	// it answered 404. Default DefaultReprobeEvery (60).
	ReprobeEvery int
	// Client is the HTTP client, shareable between pollers. Default: a client limiting
	// bodies to MaxLoadBodyBytes.
	Client *fasthttp.Client
	// Logger receives failure-change logs. Default: discard.
	Logger *slog.Logger
	// Now is the clock for receipt times. Default time.Now.
	Now func() time.Time
	// Deliver receives every poll's reports, or its error (reps nil). It runs on the
	// poller's goroutine and owns reps. Required.
	Deliver func(workerID string, reps []RankReport, err error)
}

// Poller polls one engine's load over HTTP: GET <url>/v1/loads, falling back to
// GET <url>/get_load while /v1/loads answers 404. Run owns its state; a Poller is not safe
// for concurrent use.
type Poller struct {
	cfg       PollerConfig
	ownClient bool // cfg.Client was created here; Run closes its idle connections
	loadsURL  string
	legacyURL string
	// legacy is set after /v1/loads answered 404; polls since then count toward a re-probe.
	legacy       bool
	legacyPolls  int
	legacyLogged bool
	// lastErr is the message of the latest logged failure ("" while healthy).
	lastErr  string
	failures int
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
	ownClient := cfg.Client == nil
	if ownClient {
		cfg.Client = &fasthttp.Client{
			Name:                "switchyard-load",
			MaxResponseBodySize: MaxLoadBodyBytes,
			MaxConnsPerHost:     4,
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	base := strings.TrimRight(cfg.URL, "/")
	return &Poller{cfg: cfg, ownClient: ownClient, loadsURL: base + PathLoads, legacyURL: base + PathGetLoad}, nil
}

// Legacy reports whether the poller currently uses /get_load.
func (p *Poller) Legacy() bool { return p.legacy }

// Run polls at once and then every interval, delivering each result, until ctx is done;
// it then closes the idle connections of a client it created and returns nil. A panic in
// Deliver is recovered and logged.
func (p *Poller) Run(ctx context.Context) error {
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	if p.ownClient {
		defer p.cfg.Client.CloseIdleConnections()
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

// Poll performs one poll round: /v1/loads (or /get_load after a 404), with the fallback
// applied within the round. It is what Run calls; do not call it concurrently with Run.
func (p *Poller) Poll(ctx context.Context) ([]RankReport, error) {
	if p.legacy {
		p.legacyPolls++
		if p.legacyPolls > p.cfg.ReprobeEvery {
			p.legacy, p.legacyPolls = false, 0
		}
	}
	if !p.legacy {
		reps, status, err := p.get(ctx, p.loadsURL, DecodeLoads)
		if status != fasthttp.StatusNotFound {
			return reps, err
		}
		if !p.legacyLogged {
			p.legacyLogged = true
			p.cfg.Logger.Info("engine has no /v1/loads; polling /get_load", slog.String("worker", p.cfg.WorkerID))
		}
		p.legacy, p.legacyPolls = true, 0
	}
	reps, status, err := p.get(ctx, p.legacyURL, DecodeGetLoad)
	if status == fasthttp.StatusNotFound {
		// Neither route: try the native one first next time.
		p.legacy = false
	}
	return reps, err
}

// get fetches one load route and decodes a 200 body with decode.
func (p *Poller) get(ctx context.Context, u string, decode func([]byte, time.Time) ([]RankReport, error)) ([]RankReport, int, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, fmt.Errorf("cannot poll %s: %w", u, err)
	}
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(u)
	req.Header.SetMethod(fasthttp.MethodGet)
	req.Header.Set(fasthttp.HeaderAccept, "application/json")
	deadline := time.Now().Add(p.cfg.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := p.cfg.Client.DoDeadline(req, resp, deadline); err != nil {
		return nil, 0, fmt.Errorf("cannot poll %s: %w", u, err)
	}
	status := resp.StatusCode()
	if status != fasthttp.StatusOK {
		return nil, status, fmt.Errorf("cannot poll %s: %w %d", u, ErrStatus, status)
	}
	reps, err := decode(resp.Body(), p.cfg.Now())
	if err != nil {
		return nil, status, fmt.Errorf("cannot poll %s: %w", u, err)
	}
	return reps, status, nil
}
