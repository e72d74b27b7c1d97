package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"switchyard/bench/mockengine"
	"switchyard/config"
	"switchyard/engine"
	"switchyard/httpfront"
	"switchyard/tokenizer"
)

// cluster is a set of in-process mock engines.
type cluster struct {
	plain, prefill, decode []*mockengine.Engine
	// quiet: the engines' load gauges, and a router process's load polls and health checks,
	// are quietInterval apart (clusterSpec.quiet).
	quiet bool
}

// clusterSpec sizes a cluster.
type clusterSpec struct {
	plain, prefill, decode int
	zeroCost               bool
	// eventPerWrite: every streamed event is its own write (mockengine.Config.EventPerWrite).
	eventPerWrite bool
	// decodeCanPrefill starts decode engines that also serve requests alone (PD bypass).
	decodeCanPrefill bool
	// dpSize is every engine's data-parallel size; 0 means 1.
	dpSize int
	// lora is every plain engine's LoRA simulation (off by default).
	lora mockengine.LoRA
	// quiet sets the engines' load gauges, and a router process's load polls and health
	// checks (routerProcConfig), quietInterval apart: work that follows wall time rather
	// than requests stays out of a count of work per request.
	quiet bool
}

// quietInterval is the period of a quiet cluster's load gauges, load polls and health
// checks: longer than any run.
const quietInterval = time.Hour

// gaugeInterval is the engines' load-gauge period and the router's HTTP load poll period.
const gaugeInterval = 250 * time.Millisecond

// engineConfig is the engines' common configuration.
func (o *Options) engineConfig(zeroCost bool) mockengine.Config {
	costs := *o.Costs
	return mockengine.Config{
		Host:        "127.0.0.1",
		Flavor:      o.flavor,
		Model:       o.Model,
		PageSize:    o.PageSize,
		CacheTokens: o.EngineCache,
		// A request that fits the cache fits the context: long traces need both.
		ContextLength: max(o.EngineCache, 32768),
		MaxRunning:    o.MaxRunning,
		Speedup:       o.Speedup,
		ZeroCost:      zeroCost,
		Costs:         &costs,
		Seed:          o.Seed,
		Logger:        o.Logger,
		// The harness subscribes nothing itself; the router does when a policy needs events.
		LoadPublish: mockengine.LoadPublish{Interval: gaugeInterval},
	}
}

// startCluster starts the engines of spec. On error every engine started is closed.
func (o *Options) startCluster(ctx context.Context, spec clusterSpec) (*cluster, error) {
	c := &cluster{quiet: spec.quiet}
	start := func(role mockengine.Role, prefix string, n int) ([]*mockengine.Engine, error) {
		var out []*mockengine.Engine
		for i := range n {
			cfg := o.engineConfig(spec.zeroCost)
			cfg.EventPerWrite = spec.eventPerWrite
			if spec.quiet {
				cfg.LoadPublish.Interval = quietInterval
			}
			cfg.Role = role
			cfg.DecodeCanPrefill = role == mockengine.RoleDecode && spec.decodeCanPrefill
			cfg.DPSize = max(spec.dpSize, 1)
			if role == mockengine.RolePlain {
				cfg.LoRA = spec.lora
			}
			cfg.WorkerID = prefix + strconv.Itoa(i)
			cfg.Seed = o.Seed + uint64(len(c.all())+i)
			if role == mockengine.RolePlain && len(o.EngineSpeeds) == n {
				cfg.Speedup = o.Speedup * o.EngineSpeeds[i]
			}
			e, err := mockengine.Start(ctx, cfg)
			if err != nil {
				for _, s := range out {
					_ = s.Close()
				}
				return nil, err
			}
			out = append(out, e)
		}
		return out, nil
	}
	var err error
	if c.plain, err = start(mockengine.RolePlain, "e", spec.plain); err == nil {
		if c.prefill, err = start(mockengine.RolePrefill, "p", spec.prefill); err == nil {
			c.decode, err = start(mockengine.RoleDecode, "d", spec.decode)
		}
	}
	if err != nil {
		_ = c.close()
		return nil, fmt.Errorf("cannot start engines: %w", err)
	}
	return c, nil
}

func (c *cluster) all() []*mockengine.Engine {
	out := make([]*mockengine.Engine, 0, len(c.plain)+len(c.prefill)+len(c.decode))
	out = append(out, c.plain...)
	out = append(out, c.prefill...)
	return append(out, c.decode...)
}

// close stops every engine.
func (c *cluster) close() error {
	var errs []error
	for _, e := range c.all() {
		if err := e.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func ids(es []*mockengine.Engine) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.WorkerID()
	}
	return out
}

func urls(es []*mockengine.Engine) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.URL()
	}
	return out
}

// workers returns the router's worker list for the cluster. vLLM-flavoured engines are
// declared as such, with their KV-event endpoint: they have no /server_info to tell it.
func (c *cluster) workers(model string) []config.Worker {
	var out []config.Worker
	add := func(es []*mockengine.Engine, role config.Role) {
		for _, e := range es {
			w := config.Worker{ID: e.WorkerID(), URL: e.URL(), Model: model, Role: role, DPSize: 1,
				CanPrefill: role == config.RoleDecode && e.Config().DecodeCanPrefill}
			if e.Config().Flavor == mockengine.FlavorVLLM {
				w.Flavor = config.FlavorVLLM
				w.KVEvents = e.KVEventsEndpoint(0)
			}
			if role == config.RolePrefill {
				p := e.BootstrapPort()
				w.BootstrapPort = &p
			}
			out = append(out, w)
		}
	}
	add(c.plain, config.RolePlain)
	add(c.prefill, config.RolePrefill)
	add(c.decode, config.RoleDecode)
	return out
}

// routerConfig returns the router configuration every scenario starts from: loopback, an
// OS-chosen port, a short drain, and the cluster's workers.
func (o *Options) routerConfig(c *cluster) *config.Config {
	cfg := config.Default()
	cfg.Server.Host = "127.0.0.1"
	cfg.Server.Port = 0
	cfg.Server.DrainTimeout = 5 * time.Second
	cfg.Server.RequestTimeout = o.RequestTimeout
	cfg.Workers = c.workers(o.Model)
	cfg.KV.BlockSize = o.PageSize // what vLLM-flavoured engines cannot advertise
	// HTTP load polls (and scrapes) at the load gauge's cadence, so that both flavours' load
	// is as fresh in the engines' simulated time.
	cfg.Load.PollInterval = gaugeInterval
	return cfg
}

// plainGroup is one plain bucket holding ids with policy p.
func plainBucket(id string, ids []string, p config.Policy) config.Bucket {
	members := append([]string(nil), ids...)
	return config.Bucket{ID: id, Groups: config.Groups{Plain: &config.Group{WorkerIDs: &members, Policy: &p}}}
}

// router is an in-process httpfront server.
type router struct {
	srv    *httpfront.Server
	url    string
	cancel context.CancelFunc
	done   chan error
}

// errRouterBuild marks a router the configuration or the policy factory refused: the row is
// skipped rather than the run failed.
var errRouterBuild = errors.New("cannot build router")

// startRouter validates cfg, builds the router and waits until it is ready.
func (o *Options) startRouter(ctx context.Context, cfg *config.Config) (*router, error) {
	return o.startObservedRouter(ctx, cfg, nil)
}

// startObservedRouter is startRouter whose cache_aware policies tell obs (nil: none) of
// their latency decisions.
func (o *Options) startObservedRouter(ctx context.Context, cfg *config.Config, obs engine.CacheAwareObserver) (*router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", errRouterBuild, err)
	}
	tok := tokenizer.NewSimple()
	srv, err := httpfront.New(cfg, httpfront.Options{
		Logger:    o.Logger,
		Tokenizer: func(string) tokenizer.Tokenizer { return tok },
		Seed:      o.Seed,

		CacheAwareObserver: obs,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errRouterBuild, err)
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &router{srv: srv, url: "http://" + srv.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- srv.Run(rctx) }()
	if err := WaitReady(ctx, r.url, DefaultRouterReadyTimeout); err != nil {
		_ = r.close()
		return nil, err
	}
	return r, nil
}

// counter sums the router's counter name over the series whose labels contain label (e.g.
// `result="hit"`), read from its /metrics.
func (r *router) counter(ctx context.Context, name, label string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("cannot read the router's metrics: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("cannot read the router's metrics: status %d, %v", resp.StatusCode, err)
	}
	var sum int64
	for line := range strings.Lines(string(body)) {
		series, value, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || !strings.HasPrefix(series, name+"{") || !strings.Contains(series, label) {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return 0, fmt.Errorf("cannot read the router's metric %s: %w", series, err)
		}
		sum += int64(v)
	}
	return sum, nil
}

// close stops the router and waits for its drain.
func (r *router) close() error {
	r.cancel()
	if err := <-r.done; err != nil {
		return fmt.Errorf("router stopped with: %w", err)
	}
	return nil
}

// WaitReady polls GET /readiness of the router at base until it answers 200, for at most
// timeout.
func WaitReady(ctx context.Context, base string, timeout time.Duration) error {
	return waitReady(ctx, base, timeout, readyPoll)
}

// readyPoll is WaitReady's period.
const readyPoll = 10 * time.Millisecond

// waitReady is WaitReady polling every period.
func waitReady(ctx context.Context, base string, timeout, period time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	tick := time.NewTicker(period)
	defer tick.Stop()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readiness", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Errorf("readiness answered %d", resp.StatusCode)
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("router at %s not ready after %v: %w", base, timeout, errors.Join(last, ctx.Err()))
		case <-tick.C:
		}
	}
}
