package flow

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/config"
	"switchyard/load/series"
)

// ErrRateLimited: a rate limit refused the request.
var ErrRateLimited = errors.New("rate limited")

// Metric names of the admission limits.
const (
	MetricQueueDepth      = "switchyard_queue_depth"
	MetricQueueWait       = "switchyard_queue_wait_seconds"
	MetricQueueRejections = "switchyard_queue_rejections_total"
	MetricConcurrent      = "switchyard_concurrent_requests"
	MetricRateLimited     = "switchyard_rate_limited_total"
	MetricRateLimitKeys   = "switchyard_rate_limit_keys"
	MetricClassWait       = "switchyard_queue_class_wait_seconds"
	MetricClassRequests   = "switchyard_queue_class_requests_total"
)

// TenantOther labels the metrics of every tenant that server.tenant_weights does not name
// (API-key tenants among them: keys never reach a label).
const TenantOther = "other"

// Scopes of the limits, as errors name them.
const (
	ScopeRouter      = "router"
	ScopeKey         = "key"
	ScopeModelPrefix = "model "
)

// waitBuckets are the `le` bounds, in seconds, of the queue wait histogram.
var waitBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// Options are a Gate's collaborators. The zero value is usable.
type Options struct {
	// Metrics receives the gate's metrics; nil records none.
	Metrics *metrics.Set
	// Observer, when set, also receives every Limiter's slow-path events.
	Observer Observer
}

// Gate is the admission of one router: its rate limits and concurrency limits, built from
// the configuration. A nil *Gate admits everything.
type Gate struct {
	rate   *TokenBucket
	keys   *KeyLimiter
	router *Limiter
	models map[string]*Limiter

	rateErr, keyErr *LimitError
	rateLimited     *metrics.Counter
	keyLimited      *metrics.Counter

	// tenants are the configured tenant weights by name (server.tenant_weights).
	tenants map[string]tenant
	set     *metrics.Set
	// classes holds the per-class metrics by tenant (index 0: "other", then each configured
	// tenant's idx) and priority (offset by maxPrio), created on a class's first request.
	classes [][]atomic.Pointer[classMetrics]
	// classWait is the family of the per-class wait histograms (nil without a concurrency
	// limit).
	classWait *series.HistogramFamily
	maxPrio   int
	mu        sync.Mutex // serializes the creation of class metrics
}

type tenant struct {
	label  string
	weight int
	idx    int
}

// classMetrics are one (priority, tenant label)'s metrics.
type classMetrics struct {
	wait              *series.Histogram
	admitted, refused *metrics.Counter
}

// NewGate returns the gate of cfg (server.max_concurrent_requests, queue_size,
// queue_timeout, rate_limit.*, and each model's max_concurrent_requests, queue_size and
// queue_timeout), or nil when cfg configures no limit at all.
func NewGate(cfg *config.Config, opts Options) *Gate {
	s := cfg.Server
	g := &Gate{
		rateErr: &LimitError{Scope: ScopeRouter, Err: ErrRateLimited},
		keyErr:  &LimitError{Scope: ScopeKey, Err: ErrRateLimited},
	}
	set := opts.Metrics
	if set == nil {
		set = metrics.NewSet() // unregistered: the metrics go nowhere
	}
	timeout := s.QueueTimeout
	if timeout <= 0 {
		timeout = config.Default().Server.QueueTimeout
	}
	g.set = set
	g.maxPrio = max(s.MaxPriority, 0)
	g.classes = make([][]atomic.Pointer[classMetrics], 1, 1+len(s.TenantWeights))
	g.classes[0] = make([]atomic.Pointer[classMetrics], 2*g.maxPrio+1)
	for _, name := range sortedNames(s.TenantWeights) {
		if g.tenants == nil {
			g.tenants = make(map[string]tenant, len(s.TenantWeights))
		}
		g.tenants[name] = tenant{label: series.Label(name), weight: s.TenantWeights[name], idx: len(g.classes)}
		g.classes = append(g.classes, make([]atomic.Pointer[classMetrics], 2*g.maxPrio+1))
	}
	if rl := s.RateLimit; rl.RequestsPerSecond > 0 {
		g.rate = NewTokenBucket(rl.RequestsPerSecond, config.EffectiveBurst(rl.RequestsPerSecond, rl.Burst))
		g.rateLimited = set.NewCounter(MetricRateLimited + `{scope="router"}`)
	}
	if pk := s.RateLimit.PerKey; pk.RequestsPerSecond > 0 {
		maxKeys := pk.MaxKeys
		if maxKeys <= 0 {
			maxKeys = 10_000
		}
		g.keys = NewKeyLimiter(pk.RequestsPerSecond, config.EffectiveBurst(pk.RequestsPerSecond, pk.Burst), maxKeys)
		g.keyLimited = set.NewCounter(MetricRateLimited + `{scope="key"}`)
		keys := g.keys
		set.NewGauge(MetricRateLimitKeys, func() float64 { return float64(keys.Len()) })
	}
	// The queue wait histograms are updated by every request that queued: without a lock.
	var waits *series.HistogramFamily
	waitsOf := func() *series.HistogramFamily {
		if waits == nil {
			waits = series.NewHistogramFamily(set, MetricQueueWait)
		}
		return waits
	}
	if s.MaxConcurrentRequests > 0 {
		g.router = newObservedLimiter(set, waitsOf(), ScopeRouter, `scope="router"`, s.MaxConcurrentRequests, s.QueueSize, timeout,
			opts.Observer)
	}
	names := make([]string, 0, len(cfg.Models))
	for name := range cfg.Models {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		m := cfg.Models[name]
		if m.MaxConcurrentRequests <= 0 {
			continue
		}
		size := s.QueueSize
		if m.QueueSize != nil {
			size = *m.QueueSize
		}
		mt := m.QueueTimeout
		if mt <= 0 {
			mt = timeout
		}
		if g.models == nil {
			g.models = make(map[string]*Limiter)
		}
		g.models[name] = newObservedLimiter(set, waitsOf(), ScopeModelPrefix+name, `scope="model",model="`+series.Label(name)+`"`,
			m.MaxConcurrentRequests, size, mt, opts.Observer)
	}
	if g.rate == nil && g.keys == nil && g.router == nil && g.models == nil {
		return nil
	}
	if g.router != nil || g.models != nil {
		g.classWait = series.NewHistogramFamily(set, MetricClassWait)
	}
	return g
}

// Router returns the router-wide concurrency limit, or nil.
func (g *Gate) Router() *Limiter {
	if g == nil {
		return nil
	}
	return g.router
}

// Model returns model's concurrency limit, or nil.
func (g *Gate) Model(model string) *Limiter {
	if g == nil {
		return nil
	}
	return g.models[model]
}

// Allow checks the rate limits for one request carrying API key key (empty without one) at
// now: the key's bucket, then the router's. A refusal is a *LimitError wrapping
// ErrRateLimited with the wait until a token is back; a refusal by the router's bucket gives
// the key's token back.
func (g *Gate) Allow(key []byte, now time.Time) (retryAfter time.Duration, err error) {
	if g == nil {
		return 0, nil
	}
	if g.keys != nil {
		if ok, after := g.keys.Allow(key, now); !ok {
			g.keyLimited.Inc()
			return after, g.keyErr
		}
	}
	if g.rate != nil {
		if ok, after := g.rate.Allow(now); !ok {
			if g.keys != nil {
				g.keys.refund(key)
			}
			g.rateLimited.Inc()
			return after, g.rateErr
		}
	}
	return 0, nil
}

// Ticket is the concurrency slots one request holds. The zero Ticket holds none.
type Ticket struct {
	model, router *Limiter
}

// Release gives the slots back. Call it exactly once per admitted request.
func (t Ticket) Release() {
	if t.router != nil {
		t.router.Release()
	}
	if t.model != nil {
		t.model.Release()
	}
}

// Admit takes a request's concurrency slots: its model's first, then the router's (so a
// request waiting for its model holds nothing that other models need). arrived is when the
// request reached the router, on the wall clock: each queue's timeout counts from it, so the
// router's queue_timeout bounds the whole wait. cls orders the request in the queues
// (priority, then its tenant's weighted fair share; Admit sets the weight from
// server.tenant_weights). An error is a *LimitError (ErrQueueFull, ErrQueueTimeout,
// ErrClientGone or ErrStopped) and holds no slot.
func (g *Gate) Admit(model string, arrived time.Time, cls Class, c Cancel) (Ticket, error) {
	if g == nil {
		return Ticket{}, nil
	}
	label, idx := TenantOther, 0
	cls.Weight = 1
	if t, ok := g.tenants[string(cls.Tenant)]; ok && !cls.Keyed {
		label, idx, cls.Weight = t.label, t.idx, t.weight
	}
	var (
		t      Ticket
		queued bool
		wait   time.Duration
		err    error
	)
	if g.models != nil {
		if l := g.models[model]; l != nil {
			var q bool
			var w time.Duration
			if q, w, err = l.acquire(arrived, cls, c); err == nil {
				t.model = l
			}
			queued, wait = q, w
		}
	}
	if err == nil && g.router != nil {
		var q bool
		var w time.Duration
		if q, w, err = g.router.acquire(arrived, cls, c); err == nil {
			t.router = g.router
		} else {
			t.Release()
			t = Ticket{}
		}
		queued, wait = queued || q, wait+w
	}
	if g.router != nil || g.models != nil {
		m := g.class(idx, cls.Priority, label)
		if queued {
			m.wait.Update(wait.Seconds())
		}
		if err != nil {
			m.refused.Inc()
			return Ticket{}, err
		}
		m.admitted.Inc()
	}
	return t, nil
}

// class returns the metrics of tenant index idx (labelled label) at priority prio (clamped
// to ±server.max_priority), creating them on first use (slow path: once per class).
func (g *Gate) class(idx, prio int, label string) *classMetrics {
	prio = min(max(prio, -g.maxPrio), g.maxPrio)
	slot := &g.classes[idx][prio+g.maxPrio]
	if m := slot.Load(); m != nil {
		return m
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if m := slot.Load(); m != nil {
		return m
	}
	labels := `{priority="` + PriorityLabel(prio) + `",tenant="` + label + `"`
	m := &classMetrics{
		wait:     g.classWait.New(MetricClassWait+labels+"}", waitBuckets),
		admitted: g.set.NewCounter(MetricClassRequests + labels + `,outcome="admitted"}`),
		refused:  g.set.NewCounter(MetricClassRequests + labels + `,outcome="refused"}`),
	}
	slot.Store(m)
	return m
}

// sortedNames returns m's keys in order.
func sortedNames(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// limiterMetrics records one Limiter's slow-path events, then passes them on.
type limiterMetrics struct {
	wait                           *series.Histogram
	full, timedOut, gone, shutdown *metrics.Counter
	next                           Observer
}

var _ Observer = (*limiterMetrics)(nil)

func newObservedLimiter(set *metrics.Set, waits *series.HistogramFamily, scope, labels string, limit, size int, timeout time.Duration,
	next Observer) *Limiter {
	lm := &limiterMetrics{
		wait:     waits.New(MetricQueueWait+"{"+labels+"}", waitBuckets),
		full:     set.NewCounter(MetricQueueRejections + "{" + labels + `,reason="queue_full"}`),
		timedOut: set.NewCounter(MetricQueueRejections + "{" + labels + `,reason="queue_timeout"}`),
		gone:     set.NewCounter(MetricQueueRejections + "{" + labels + `,reason="client_gone"}`),
		shutdown: set.NewCounter(MetricQueueRejections + "{" + labels + `,reason="shutting_down"}`),
		next:     next,
	}
	l := NewLimiter(scope, limit, size, timeout, lm)
	set.NewGauge(MetricQueueDepth+"{"+labels+"}", func() float64 { return float64(l.Queued()) })
	set.NewGauge(MetricConcurrent+"{"+labels+"}", func() float64 { return float64(l.Active()) })
	return l
}

func (m *limiterMetrics) Queued(l *Limiter) {
	if m.next != nil {
		m.next.Queued(l)
	}
}

func (m *limiterMetrics) Dequeued(l *Limiter, wait time.Duration, err error) {
	switch {
	case err == nil:
		m.wait.Update(wait.Seconds())
	case errors.Is(err, ErrQueueFull):
		m.full.Inc()
	case errors.Is(err, ErrQueueTimeout):
		m.wait.Update(wait.Seconds())
		m.timedOut.Inc()
	case errors.Is(err, ErrClientGone):
		m.wait.Update(wait.Seconds())
		m.gone.Inc()
	case errors.Is(err, ErrStopped):
		m.shutdown.Inc()
	}
	if m.next != nil {
		m.next.Dequeued(l, wait, err)
	}
}
