package actors

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/kv/approx"
	"switchyard/kv/index"
)

// ApproxShards hosts the approximate prefix tree's shards (approx.Shard) on actors, one
// per shard, the way IndexShards hosts the KV-event index: each actor owns its shard and
// applies writes (a recorded dispatch, a removed worker, an eviction) and lookups in
// mailbox order. A write is fire-and-forget and a full mailbox refuses it at once; a lookup
// carries a reply channel and its caller waits until its deadline. A panicking shard actor
// is logged, counted and restarted with an empty shard. It implements approx.Host.
//
// All methods are safe for concurrent use. Close stops every actor.
type ApproxShards struct {
	sys      *System
	closeSys func() // closes sys when it is the shards' own
	root     *actor.RootContext
	host     *host
	logger   *slog.Logger
	counters *kindCounters // the System's, kind approx_shard
	pids     []*actor.PID
	shards   []*approx.Shard

	closeMu sync.Mutex
	closed  atomic.Bool
}

var _ approx.Host = (*ApproxShards)(nil)

// ApproxHost returns an approx.Config.Host that runs the shards on actors with opts
// (Mailbox: actors.mailbox.index_shard).
func ApproxHost(opts IndexOptions) func(shards []*approx.Shard) (approx.Host, error) {
	return func(shards []*approx.Shard) (approx.Host, error) { return NewApproxShards(shards, opts) }
}

// NewApproxShards spawns one actor per shard.
func NewApproxShards(shards []*approx.Shard, opts IndexOptions) (*ApproxShards, error) {
	if opts.Mailbox <= 0 {
		opts.Mailbox = config.Default().Actors.Mailbox.IndexShard
	}
	if opts.Logger == nil && opts.System != nil {
		opts.Logger = opts.System.Logger()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &ApproxShards{host: newHost(), logger: opts.Logger, shards: shards}
	// Mailbox rejections and panics count in the actor families, kind approx_shard.
	s.sys, s.closeSys = systemOr(opts.System, opts.Logger)
	s.root = s.sys.root
	s.counters = &s.sys.counters.kinds[KindApproxShard]
	for i, sh := range shards {
		name := fmt.Sprintf("approx-shard:%d", i)
		mb := newMailbox(opts.Mailbox, s.host, s.counters,
			&engine.PickError{Outcome: engine.OutcomeOverloaded, Detail: name + " mailbox is full"},
			&engine.PickError{Outcome: engine.OutcomeInternal, Detail: name + " stopped", Err: ErrStopped})
		props := actor.PropsFromProducer(func() actor.Actor { return &approxShardActor{owner: s, shard: sh, name: name, mb: mb} },
			actor.WithMailbox(mb.producer()),
			actor.WithGuardian(actor.RestartingSupervisorStrategy()),
			actor.WithSupervisor(actor.RestartingSupervisorStrategy()),
		)
		pid, err := s.root.SpawnNamed(props, name)
		if err != nil {
			_ = s.Close()
			return nil, fmt.Errorf("cannot spawn %s: %w", name, err)
		}
		s.pids = append(s.pids, pid)
	}
	return s, nil
}

// Post implements approx.Host.
func (s *ApproxShards) Post(i int, op approx.Op) error {
	if s.closed.Load() {
		return fmt.Errorf("cannot reach approximate tree shard %d: %w", i, ErrIndexClosed)
	}
	msg := &ApplyApprox{Op: op}
	s.root.Send(s.pids[i], msg)
	if msg.refused.Load() {
		return fmt.Errorf("approximate tree shard %d: %w", i, index.ErrShardBusy)
	}
	return nil
}

// Ask implements approx.Host.
func (s *ApproxShards) Ask(ctx context.Context, i int, q *approx.Query) error {
	if s.closed.Load() {
		return fmt.Errorf("cannot reach approximate tree shard %d: %w", i, ErrIndexClosed)
	}
	msg := &MatchApprox{Query: q, reply: make(chan error, 1)}
	s.root.Send(s.pids[i], msg)
	select {
	case err := <-msg.reply:
		return err
	case <-ctx.Done():
		return fmt.Errorf("approximate tree shard %d did not answer: %w", i, ctx.Err())
	}
}

// Rejected is the number of messages refused by full or stopped shard mailboxes.
func (s *ApproxShards) Rejected() uint64 { return s.counters.rejected.Get() }

// Panics is the number of shard actor panics recovered.
func (s *ApproxShards) Panics() uint64 { return s.counters.panics.Get() }

// Close stops every shard actor and the actor system. It implements io.Closer, so that
// approx.Index.Close stops its host.
func (s *ApproxShards) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed.Swap(true) {
		return nil
	}
	futures := make([]*actor.Future, 0, len(s.pids))
	for _, pid := range s.pids {
		futures = append(futures, s.root.StopFuture(pid))
	}
	for _, f := range futures {
		if _, err := f.Result(); err != nil {
			s.logger.Warn("approximate tree shard actor did not confirm stop", slog.Any("error", err))
		}
	}
	s.host.shutdown()
	s.closeSys()
	return nil
}

// approxShardActor owns one approx.Shard.
type approxShardActor struct {
	owner *ApproxShards
	shard *approx.Shard
	name  string
	mb    *mailbox
}

var _ actor.Actor = (*approxShardActor)(nil)

// Receive implements actor.Actor.
func (a *approxShardActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *ApplyApprox:
		a.guard(nil, func() {
			a.owner.sys.observed(KindApproxShard, msg)
			a.shard.Apply(msg.Op)
		})
	case *MatchApprox:
		a.guard(msg.reply, func() {
			a.owner.sys.observed(KindApproxShard, msg)
			a.shard.Match(msg.Query)
			msg.reply <- nil
		})
	case *actor.Restarting:
		a.shard.Reset()
	case *actor.Stopped:
		a.mb.close()
	}
}

// guard runs f; a panic is counted and logged, fails the message's reply (if any), and
// restarts the actor (which empties the shard: its state cannot be trusted).
func (a *approxShardActor) guard(reply chan error, f func()) {
	replied := false
	defer func() {
		if r := recover(); r != nil {
			a.owner.counters.panics.Inc()
			a.owner.logger.Error("approximate tree shard actor panicked; restarting it with an empty shard",
				slog.String("shard", a.name), slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			if reply != nil && !replied {
				reply <- fmt.Errorf("%s failed: %w", a.name, ErrPanicked)
			}
			panic(r)
		}
	}()
	f()
	replied = true
}

// ApplyApprox asks a shard to apply a write (approx.Op). There is no reply.
type ApplyApprox struct {
	Op      approx.Op
	refused atomic.Bool
}

// MatchApprox asks a shard for the workers holding a prefix of a prompt; it answers on its
// reply channel.
type MatchApprox struct {
	Query *approx.Query
	reply chan error
}

func (m *ApplyApprox) reject(*engine.PickError) { m.refused.Store(true) }
func (m *MatchApprox) reject(err *engine.PickError) {
	if err.Outcome == engine.OutcomeOverloaded {
		m.reply <- fmt.Errorf("%s: %w", err.Detail, index.ErrShardBusy)
		return
	}
	m.reply <- err
}

var (
	_ rejecter = (*ApplyApprox)(nil)
	_ rejecter = (*MatchApprox)(nil)
)
