package actors

import (
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"
	"github.com/asynkron/protoactor-go/actor"

	"switchyard/engine"
	"switchyard/load/series"
)

// Actor failure metric families: one series per Kind.
const (
	metricMailboxRejections = "switchyard_actor_mailbox_rejections_total"
	metricActorPanics       = "switchyard_actor_panics_total"
)

// SystemOptions configure a System. The zero value is usable.
type SystemOptions struct {
	// Logger receives Proto.Actor's logs (tagged lib=protoactor) and the actors' own.
	// Default: discarded.
	Logger *slog.Logger
	// Metrics is the set the actor failure counters are registered in
	// (switchyard_actor_mailbox_rejections_total{kind}, switchyard_actor_panics_total{kind}).
	// Default: a private set.
	Metrics *metrics.Set
	// Observe, when set, is called by an actor with each command it is about to handle
	// (PickEngines in a bucket actor, affinity commands, index shard messages), on the
	// actor's goroutine. It is a seam for tests (block an actor, fail a command); a panic
	// in it is handled as a panic of the actor. Default: none.
	Observe func(k Kind, msg any)
}

// System is the process's one actor system. Every actor of this package (bucket, group,
// telemetry, affinity scope, index shard, and with a cluster the affinity partitions) runs
// on it, with the one bounded mailbox implementation (mailbox), and is counted in one
// Counters. A component built without a System makes a private one and closes it with
// itself; a server builds one System, hands it to every component, and closes it last.
type System struct {
	sys      *actor.ActorSystem
	root     *actor.RootContext
	logger   *slog.Logger
	set      *metrics.Set
	counters *Counters
	observe  func(Kind, any)
	// cluster, when this system hosts one, is shut down (with the actor system) by Close.
	cluster atomic.Pointer[Cluster]

	closeOnce sync.Once
}

// NewSystem starts an actor system whose own logging (start-up, supervision, dead letters)
// goes to opts.Logger, tagged lib=protoactor. No Proto.Actor metrics provider is configured
// (its OpenTelemetry instruments stay off); the failure counters are registered in
// opts.Metrics instead. A message that reaches a stopped actor and expects a reply is
// answered at once with OutcomeInternal (ErrStopped), so a send racing with shutdown never
// waits for its deadline.
func NewSystem(opts SystemOptions) *System {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.NewSet()
	}
	s := &System{logger: opts.Logger, set: opts.Metrics, observe: opts.Observe}
	s.counters = newCounters(opts.Metrics)
	logger := opts.Logger
	s.sys = actor.NewActorSystem(
		actor.WithLoggerFactory(func(sys *actor.ActorSystem) *slog.Logger {
			return logger.With(slog.String("lib", "protoactor"), slog.String("system", sys.ID))
		}),
		actor.WithDeadLetterRequestLogging(false),
	)
	s.root = s.sys.Root
	stopped := &engine.PickError{Outcome: engine.OutcomeInternal, Detail: "actor stopped", Err: ErrStopped}
	s.sys.EventStream.Subscribe(func(evt any) {
		if dl, ok := evt.(*actor.DeadLetterEvent); ok {
			if r, ok := dl.Message.(rejecter); ok {
				r.reject(stopped)
			}
		}
	})
	return s
}

// Counters returns the actors' failure counts per kind.
func (s *System) Counters() *Counters { return s.counters }

// Logger is the system's logger.
func (s *System) Logger() *slog.Logger { return s.logger }

// Actor returns the underlying Proto.Actor system (for the cluster and tests).
func (s *System) Actor() *actor.ActorSystem { return s.sys }

// observed runs the Observe seam, when set.
func (s *System) observed(k Kind, msg any) {
	if s.observe != nil {
		s.observe(k, msg)
	}
}

// Close shuts the actor system down. Components running on it must be closed first (their
// Close stops their actors and waits for them). Close is idempotent.
func (s *System) Close() {
	s.closeOnce.Do(func() {
		if c := s.cluster.Load(); c != nil {
			c.Close() // leaves the cluster and shuts the actor system down
		} else {
			s.sys.Shutdown()
		}
		for k := range numKinds {
			s.set.UnregisterMetric(series.Name(metricMailboxRejections, "kind", k.String()))
			s.set.UnregisterMetric(series.Name(metricActorPanics, "kind", k.String()))
		}
	})
}

// systemOr returns sys, or a new private System and a func closing it.
func systemOr(sys *System, logger *slog.Logger) (*System, func()) {
	if sys != nil {
		return sys, func() {}
	}
	own := NewSystem(SystemOptions{Logger: logger})
	return own, own.Close
}
