package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/asynkron/protoactor-go/actor"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/load/series"
)

// ErrAffinityClosed: the AffinityStore was closed. A *engine.PickError with OutcomeInternal
// wraps it.
var ErrAffinityClosed = errors.New("affinity store closed")

const (
	// minAffinityAdminTimeout bounds the wait for a Sweep or InvalidateWorker reply of one
	// scope (they walk the scope's bindings and nobody's request waits on them).
	minAffinityAdminTimeout = time.Second
)

// Affinity metric names. Per-scope series carry model, bucket and stage labels.
const (
	metricAffinityBindings = "switchyard_affinity_bindings"
	metricAffinityLookups  = "switchyard_affinity_lookups_total"
	metricAffinityBinds    = "switchyard_affinity_binds_total"
	metricAffinityRemoved  = "switchyard_affinity_removed_total"
	metricAffinityTimeouts = "switchyard_affinity_timeouts_total"
	metricAffinityScopes   = "switchyard_affinity_scopes"
)

// AffinityOptions configure an AffinityStore. Zero fields take the defaults (config.Default's
// for the ones that are configuration keys).
type AffinityOptions struct {
	// IdleTimeout expires a binding unused this long (affinity.idle_timeout).
	IdleTimeout time.Duration
	// MaxBindings bounds the bindings of one scope; the least recently used goes beyond it
	// (affinity.max_bindings).
	MaxBindings int
	// Mailbox is each scope actor's mailbox size, in messages (actors.mailbox.affinity).
	Mailbox int
	// CallTimeout bounds one Lookup or Bind round trip. Default a quarter of the default
	// actors.pick_timeout.
	CallTimeout time.Duration
	// Now is the clock of sweeps (RunSweeper) and of calls that carry no time. Default
	// time.Now.
	Now func() time.Time
	// Logger receives the store's logs. Default: the System's.
	Logger *slog.Logger
	// System is the actor system the scope actors run on; their mailbox rejections and
	// panics count under kind "affinity". Default: a private one, closed by Close.
	System *System
	// Metrics is the set the store registers its series in (see the metric* names).
	// Default: a private set.
	Metrics *metrics.Set
}

// AffinityOptionsFrom returns the options configured by cfg: affinity.idle_timeout,
// affinity.max_bindings, actors.mailbox.affinity, and a call deadline of a quarter of
// actors.pick_timeout. The caller adds the clock, logger and metric set.
func AffinityOptionsFrom(cfg *config.Config) AffinityOptions {
	return AffinityOptions{
		IdleTimeout: cfg.Affinity.IdleTimeout,
		MaxBindings: cfg.Affinity.MaxBindings,
		Mailbox:     cfg.Actors.Mailbox.Affinity,
		CallTimeout: cfg.Actors.PickTimeout / 4,
	}
}

// AffinityStore is the router's local engine.AffinityStore: one affinity scope actor per
// (model, bucket, stage) scope, spawned on the scope's first use, owning that scope's
// bindings (a bindingTable) with idle expiry and an LRU bound. Lookup and Bind are one round
// trip each to the scope's actor, with a reply channel carried in the message and a
// deadline; the actor serializes them, so Bind's compare-and-set is atomic per scope.
//
// The application owns expiry and invalidation: it drives Sweep from its own ticker
// (RunSweeper; every affinity.sweep_interval, default 60s) and calls InvalidateWorker when a
// worker is removed. Policies only Lookup and Bind.
//
// All methods are safe for concurrent use. Close stops every scope actor.
type AffinityStore struct {
	idle        time.Duration
	maxBindings int
	mailboxSize int
	timeout     time.Duration
	now         func() time.Time
	logger      *slog.Logger
	metrics     *series.Owned // every series of the store and its scopes, unregistered by Close

	sys      *System
	closeSys func()
	root     *actor.RootContext
	host     *host
	counters *kindCounters // mailbox rejections and panics of every scope actor
	timeouts *metrics.Counter

	mu     sync.Mutex // serializes spawning, Close and metric registration
	scopes atomic.Pointer[map[engine.AffinityScope]*scopeHost]
	pids   []*actor.PID

	calls     sync.Pool // *affinityCall
	closed    atomic.Bool
	closedErr *engine.PickError
}

var _ engine.AffinityStore = (*AffinityStore)(nil)

// NewAffinityStore starts an empty store; scope actors are spawned on first use.
func NewAffinityStore(opts AffinityOptions) *AffinityStore {
	s := &AffinityStore{
		idle:        opts.IdleTimeout,
		maxBindings: opts.MaxBindings,
		mailboxSize: opts.Mailbox,
		timeout:     opts.CallTimeout,
		now:         opts.Now,
		logger:      opts.Logger,
		metrics:     series.Own(opts.Metrics),
		host:        newHost(),
	}
	// A zero option takes config.Default's value; the call timeout is a quarter of the
	// default pick deadline, so that a policy waiting on a slow scope still answers its
	// bucket actor in time.
	d := config.Default()
	if s.idle <= 0 {
		s.idle = d.Affinity.IdleTimeout
	}
	if s.maxBindings <= 0 {
		s.maxBindings = d.Affinity.MaxBindings
	}
	if s.mailboxSize <= 0 {
		s.mailboxSize = d.Actors.Mailbox.Affinity
	}
	if s.timeout <= 0 {
		s.timeout = d.Actors.PickTimeout / 4
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.logger == nil && opts.System != nil {
		s.logger = opts.System.Logger()
	}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	empty := map[engine.AffinityScope]*scopeHost{}
	s.scopes.Store(&empty)
	s.closedErr = &engine.PickError{Outcome: engine.OutcomeInternal, Detail: "affinity store is shut down", Err: ErrAffinityClosed}
	s.calls.New = func() any { return newAffinityCall() }
	s.timeouts = s.metrics.Counter(metricAffinityTimeouts)
	s.metrics.Gauge(metricAffinityScopes, func() float64 { return float64(len(*s.scopes.Load())) })

	s.sys, s.closeSys = systemOr(opts.System, s.logger)
	s.root = s.sys.root
	s.counters = &s.sys.counters.kinds[KindAffinity]
	return s
}

// Lookup implements engine.AffinityStore: one round trip to the scope's actor.
func (s *AffinityStore) Lookup(scope engine.AffinityScope, key string, now time.Time) (string, error) {
	h, err := s.scopeFor(scope)
	if err != nil {
		return "", err
	}
	if now.IsZero() {
		now = s.now()
	}
	c := s.calls.Get().(*affinityCall)
	c.lookup = LookupBinding{Key: key, Now: now, call: c}
	if err := s.roundTrip(h, c, &c.lookup, s.timeout); err != nil {
		return "", err
	}
	r := c.lookupRes
	s.release(c)
	if r.Err != nil {
		return "", r.Err
	}
	return r.WorkerID, nil
}

// Bind implements engine.AffinityStore: a compare-and-set in one round trip to the scope's
// actor.
func (s *AffinityStore) Bind(scope engine.AffinityScope, key, expect, workerID string, now time.Time) (string, bool, error) {
	h, err := s.scopeFor(scope)
	if err != nil {
		return "", false, err
	}
	if now.IsZero() {
		now = s.now()
	}
	c := s.calls.Get().(*affinityCall)
	c.bind = Bind{Key: key, Expect: expect, WorkerID: workerID, Now: now, call: c}
	if err := s.roundTrip(h, c, &c.bind, s.timeout); err != nil {
		return "", false, err
	}
	r := c.bindRes
	s.release(c)
	if r.Err != nil {
		return "", false, r.Err
	}
	return r.WorkerID, r.Set, nil
}

// InvalidateWorker removes every binding to workerID in every scope and returns how many
// were removed. The application calls it when a worker is removed from the registry; errors
// name the scopes that did not answer (their bindings to the worker stay until a policy finds
// the worker outside its candidates and re-binds).
func (s *AffinityStore) InvalidateWorker(workerID string) (int, error) {
	n := 0
	var errs []error
	for _, h := range s.scopeList() {
		c := s.calls.Get().(*affinityCall)
		c.inval = InvalidateWorker{WorkerID: workerID, call: c}
		if err := s.roundTrip(h, c, &c.inval, max(s.timeout, minAffinityAdminTimeout)); err != nil {
			errs = append(errs, fmt.Errorf("cannot invalidate worker %q in scope %s: %w", workerID, h.scope, err))
			continue
		}
		r := c.invalRes
		s.release(c)
		if r.Err != nil {
			errs = append(errs, fmt.Errorf("cannot invalidate worker %q in scope %s: %w", workerID, h.scope, r.Err))
			continue
		}
		n += r.Removed
	}
	return n, errors.Join(errs...)
}

// Sweep removes every binding expired at now from every scope and returns how many it
// removed. The application drives it from its own ticker (see RunSweeper).
func (s *AffinityStore) Sweep(now time.Time) (int, error) {
	if now.IsZero() {
		now = s.now()
	}
	n := 0
	var errs []error
	for _, h := range s.scopeList() {
		c := s.calls.Get().(*affinityCall)
		c.sweep = Sweep{Now: now, call: c}
		if err := s.roundTrip(h, c, &c.sweep, max(s.timeout, minAffinityAdminTimeout)); err != nil {
			errs = append(errs, fmt.Errorf("cannot sweep scope %s: %w", h.scope, err))
			continue
		}
		r := c.sweepRes
		s.release(c)
		if r.Err != nil {
			errs = append(errs, fmt.Errorf("cannot sweep scope %s: %w", h.scope, r.Err))
			continue
		}
		n += r.Expired
	}
	return n, errors.Join(errs...)
}

// RunSweeper sweeps at the store's clock's time on every tick until ctx is done or ticks is
// closed. The caller owns the ticker (time.NewTicker(cfg.Affinity.SweepInterval).C) and the
// goroutine running RunSweeper; a panicking sweep is logged and the loop goes on.
func (s *AffinityStore) RunSweeper(ctx context.Context, ticks <-chan time.Time) {
	runSweeper(ctx, ticks, s.logger, func() (int, error) { return s.Sweep(s.now()) })
}

// Close stops every scope actor (their bindings are dropped), waits for them, and shuts the
// actor system down. Calls after Close fail with OutcomeInternal (ErrAffinityClosed).
func (s *AffinityStore) Close() {
	s.mu.Lock()
	if s.closed.Swap(true) {
		s.mu.Unlock()
		return
	}
	pids := s.pids
	s.pids = nil
	s.mu.Unlock()
	futures := make([]*actor.Future, 0, len(pids))
	for _, pid := range pids {
		futures = append(futures, s.root.StopFuture(pid))
	}
	for _, f := range futures {
		if _, err := f.Result(); err != nil {
			s.logger.Warn("affinity scope actor did not confirm stop", slog.Any("error", err))
		}
	}
	s.host.shutdown()
	s.metrics.Unregister()
	s.closeSys()
}

// scopeFor returns the scope's host, spawning its actor on first use.
func (s *AffinityStore) scopeFor(scope engine.AffinityScope) (*scopeHost, error) {
	// Fast path: the scope exists.
	if h := (*s.scopes.Load())[scope]; h != nil {
		return h, nil
	}
	// Slow path: first use of the scope.
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return nil, s.closedErr
	}
	old := *s.scopes.Load()
	if h := old[scope]; h != nil {
		return h, nil
	}
	h := s.newScopeHost(scope, len(old))
	pid, err := s.root.SpawnNamed(h.props(), h.name)
	if err != nil {
		return nil, &engine.PickError{Outcome: engine.OutcomeInternal, Stage: scope.Stage, BucketID: scope.BucketID,
			Detail: "cannot spawn affinity scope actor " + h.name, Err: err}
	}
	h.pid = pid
	s.pids = append(s.pids, pid)
	next := make(map[engine.AffinityScope]*scopeHost, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[scope] = h
	s.scopes.Store(&next)
	return h, nil
}

// scopeList returns the current scopes.
func (s *AffinityStore) scopeList() []*scopeHost {
	m := *s.scopes.Load()
	out := make([]*scopeHost, 0, len(m))
	for _, h := range m {
		out = append(out, h)
	}
	return out
}

// roundTrip sends msg (a command of c) to h's actor and waits for the reply at most
// timeout. On success the caller reads c's result and then releases c; on a deadline miss c
// is abandoned (never pooled again, so a late reply lands in a call nobody reuses).
func (s *AffinityStore) roundTrip(h *scopeHost, c *affinityCall, msg any, timeout time.Duration) error {
	if s.closed.Load() {
		s.release(c)
		return s.closedErr
	}
	c.arm(timeout)
	s.root.Send(h.pid, msg)
	if _, ok := c.wait(); ok {
		return nil
	}
	// Slow path: deadline missed; c is abandoned (never pooled again).
	s.timeouts.Inc()
	return h.timeoutErr
}

// release returns c to the pool.
func (s *AffinityStore) release(c *affinityCall) {
	c.reset()
	s.calls.Put(c)
}

// scopeStats are one scope's counters. The scope actor updates them; /metrics reads them.
type scopeStats struct {
	hits, misses     *metrics.Counter
	binds, conflicts *metrics.Counter
	expired, evicted *metrics.Counter
	invalidated      *metrics.Counter
	bindings         atomic.Int64
}

// newScopeStats creates a scope's series on o, labelled with the scope's label pairs.
func newScopeStats(o *series.Owned, scope ...string) *scopeStats {
	name := func(family string, pairs ...string) string {
		return series.Name(family, slices.Concat(scope, pairs)...)
	}
	st := &scopeStats{
		hits:        o.Counter(name(metricAffinityLookups, "result", "hit")),
		misses:      o.Counter(name(metricAffinityLookups, "result", "miss")),
		binds:       o.Counter(name(metricAffinityBinds, "result", "bound")),
		conflicts:   o.Counter(name(metricAffinityBinds, "result", "conflict")),
		expired:     o.Counter(name(metricAffinityRemoved, "cause", "expired")),
		evicted:     o.Counter(name(metricAffinityRemoved, "cause", "evicted")),
		invalidated: o.Counter(name(metricAffinityRemoved, "cause", "invalidated")),
	}
	o.Gauge(name(metricAffinityBindings), func() float64 { return float64(st.bindings.Load()) })
	return st
}

// scopeHost is what a scope actor's incarnations share: the scope, its counters and its
// prepared errors. The bindings themselves belong to the actor incarnation: a restart after
// a panic starts the scope empty (bindings are preferences, and a table a panic interrupted
// cannot be trusted).
type scopeHost struct {
	store      *AffinityStore
	scope      engine.AffinityScope
	name       string
	pid        *actor.PID
	mb         atomic.Pointer[mailbox] // the actor's mailbox
	stats      *scopeStats
	internal   *engine.PickError // reply to a command that hit a panic
	timeoutErr *engine.PickError
}

// newScopeHost prepares a scope's host and registers its metrics; s.mu is held.
func (s *AffinityStore) newScopeHost(scope engine.AffinityScope, n int) *scopeHost {
	h := &scopeHost{
		store: s,
		scope: scope,
		name:  fmt.Sprintf("affinity:%s#%d", scope, n),
	}
	h.stats = newScopeStats(s.metrics, "model", scope.Model, "bucket", scope.BucketID, "stage", scope.Stage.String())
	h.internal = &engine.PickError{Outcome: engine.OutcomeInternal, Stage: scope.Stage, BucketID: scope.BucketID,
		Detail: "affinity scope actor " + scope.String() + " failed", Err: ErrPanicked}
	h.timeoutErr = &engine.PickError{Outcome: engine.OutcomeTimeout, Stage: scope.Stage, BucketID: scope.BucketID,
		Detail: "affinity scope actor " + scope.String() + " did not reply within " + s.timeout.String()}
	return h
}

// props returns the scope actor's props with a fresh mailbox. Like bucket actors, scope
// actors are always restarted after a failure, never stopped.
func (h *scopeHost) props() *actor.Props {
	s := h.store
	mb := newMailbox(s.mailboxSize, s.host, s.counters,
		&engine.PickError{Outcome: engine.OutcomeOverloaded, Stage: h.scope.Stage, BucketID: h.scope.BucketID,
			Detail: "affinity scope actor " + h.scope.String() + " mailbox is full"},
		&engine.PickError{Outcome: engine.OutcomeInternal, Stage: h.scope.Stage, BucketID: h.scope.BucketID,
			Detail: "affinity scope actor " + h.scope.String() + " stopped", Err: ErrStopped})
	h.mb.Store(mb)
	return actor.PropsFromProducer(func() actor.Actor { return newAffinityScopeActor(h, mb) },
		actor.WithMailbox(mb.producer()),
		actor.WithGuardian(actor.RestartingSupervisorStrategy()),
		actor.WithSupervisor(actor.RestartingSupervisorStrategy()),
	)
}

// affinityScopeActor owns one scope's bindings.
type affinityScopeActor struct {
	h     *scopeHost
	mb    *mailbox
	table *bindingTable
}

var _ actor.Actor = (*affinityScopeActor)(nil)

func newAffinityScopeActor(h *scopeHost, mb *mailbox) *affinityScopeActor {
	return &affinityScopeActor{h: h, mb: mb, table: newBindingTable(h.store.idle, h.store.maxBindings, h.stats)}
}

// Receive implements actor.Actor.
func (a *affinityScopeActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case affinityCommand:
		a.handle(msg)
	case *actor.Restarting:
		a.table.clear()
	case *actor.Stopped:
		a.table.clear()
		a.mb.close()
	}
}

// handle applies one command and replies; a panic replies with the scope's internal error,
// is logged and counted, and restarts the actor.
func (a *affinityScopeActor) handle(cmd affinityCommand) {
	c := cmd.callOf()
	if c.abandoned.Load() {
		return
	}
	replied := false
	defer func() {
		if r := recover(); r != nil {
			a.h.store.counters.panics.Inc()
			a.h.store.logger.Error("affinity scope actor panicked; failing its command and restarting it with no bindings",
				slog.String("scope", a.h.scope.String()), slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			if !replied {
				cmd.reject(a.h.internal)
			}
			panic(r) // let Proto.Actor restart the actor
		}
	}()
	a.h.store.sys.observed(KindAffinity, cmd)
	cmd.apply(a.table)
	replied = true
	c.done()
}

// affinityCommand is a message a scope actor applies to its table.
type affinityCommand interface {
	rejecter
	apply(t *bindingTable)
	callOf() *affinityCall
}

// LookupBinding asks a scope actor for key's live binding, refreshing it as used at Now.
// The sender sets every field before sending and never changes them; the reply is a
// LookupBindingResult in the call.
type LookupBinding struct {
	Key string
	Now time.Time

	call *affinityCall
}

// LookupBindingResult is the reply to LookupBinding: the bound worker ID, "" for none.
type LookupBindingResult struct {
	WorkerID string
	Err      error
}

// Bind asks a scope actor to bind Key to WorkerID at Now when its live binding is Expect
// ("" for none) — a compare-and-set. The reply is a BindResult in the call.
type Bind struct {
	Key, Expect, WorkerID string
	Now                   time.Time

	call *affinityCall
}

// BindResult is the reply to Bind: the binding in force afterwards (WorkerID of the command
// when Set, else the binding that won, "" for none).
type BindResult struct {
	WorkerID string
	Set      bool
	Err      error
}

// InvalidateWorker asks a scope actor to drop every binding to WorkerID.
type InvalidateWorker struct {
	WorkerID string

	call *affinityCall
}

// InvalidateWorkerResult is the reply to InvalidateWorker.
type InvalidateWorkerResult struct {
	Removed int
	Err     error
}

// Sweep asks a scope actor to drop the bindings expired at Now.
type Sweep struct {
	Now time.Time

	call *affinityCall
}

// SweepResult is the reply to Sweep.
type SweepResult struct {
	Expired int
	Err     error
}

func (m *LookupBinding) apply(t *bindingTable) {
	m.call.lookupRes = LookupBindingResult{WorkerID: t.lookup(m.Key, m.Now.UnixNano())}
}

func (m *Bind) apply(t *bindingTable) {
	w, set := t.bind(m.Key, m.Expect, m.WorkerID, m.Now.UnixNano())
	m.call.bindRes = BindResult{WorkerID: w, Set: set}
}

func (m *InvalidateWorker) apply(t *bindingTable) {
	m.call.invalRes = InvalidateWorkerResult{Removed: t.invalidate(m.WorkerID)}
}

func (m *Sweep) apply(t *bindingTable) {
	m.call.sweepRes = SweepResult{Expired: t.sweep(m.Now.UnixNano())}
}

func (m *LookupBinding) reject(err *engine.PickError) {
	m.call.lookupRes = LookupBindingResult{Err: err}
	m.call.done()
}

func (m *Bind) reject(err *engine.PickError) {
	m.call.bindRes = BindResult{Err: err}
	m.call.done()
}

func (m *InvalidateWorker) reject(err *engine.PickError) {
	m.call.invalRes = InvalidateWorkerResult{Err: err}
	m.call.done()
}

func (m *Sweep) reject(err *engine.PickError) {
	m.call.sweepRes = SweepResult{Err: err}
	m.call.done()
}

func (m *LookupBinding) callOf() *affinityCall    { return m.call }
func (m *Bind) callOf() *affinityCall             { return m.call }
func (m *InvalidateWorker) callOf() *affinityCall { return m.call }
func (m *Sweep) callOf() *affinityCall            { return m.call }

var (
	_ affinityCommand = (*LookupBinding)(nil)
	_ affinityCommand = (*Bind)(nil)
	_ affinityCommand = (*InvalidateWorker)(nil)
	_ affinityCommand = (*Sweep)(nil)
)

// affinityCall is the pooled state of one round trip to a scope actor: the command, its
// result slot and the call. The caller fills one command and sends it; the actor (or a
// mailbox refusing the command) writes the result and answers the call exactly once.
type affinityCall struct {
	call[struct{}]
	// scope is the command's scope when it goes to a cluster partition (which holds many).
	scope  engine.AffinityScope
	lookup LookupBinding
	bind   Bind
	inval  InvalidateWorker
	sweep  Sweep

	lookupRes LookupBindingResult
	bindRes   BindResult
	invalRes  InvalidateWorkerResult
	sweepRes  SweepResult
}

func newAffinityCall() *affinityCall {
	c := &affinityCall{}
	c.init(1)
	return c
}

func (c *affinityCall) done() { c.answer(struct{}{}) }

// reset drops the call's references before it returns to the pool.
func (c *affinityCall) reset() {
	c.scope = engine.AffinityScope{}
	c.lookup, c.bind, c.inval, c.sweep = LookupBinding{}, Bind{}, InvalidateWorker{}, Sweep{}
	c.lookupRes, c.bindRes, c.invalRes, c.sweepRes = LookupBindingResult{}, BindResult{}, InvalidateWorkerResult{}, SweepResult{}
}
