package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/asynkron/protoactor-go/actor"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/kv/index"
	"switchyard/load/series"
)

// ErrIndexClosed: the IndexShards were closed.
var ErrIndexClosed = errors.New("index shards closed")

// metricIndexTimeouts counts lookups whose shards did not all answer in time. Mailbox
// rejections and panics of the shard actors count in the actor families, kind
// "index_shard".
const metricIndexTimeouts = "switchyard_kv_shard_match_timeouts_total"

// IndexOptions configure IndexShards. Zero fields take the defaults.
type IndexOptions struct {
	// Mailbox is each shard actor's mailbox size, in messages. Default: config.Default's
	// actors.mailbox.index_shard.
	Mailbox int
	// Logger receives the shards' logs. Default: the System's.
	Logger *slog.Logger
	// System is the actor system the shard actors run on. Default: a private one, closed
	// by Close.
	System *System
	// Metrics is the set the shards register their series in. Default: a private set.
	Metrics *metrics.Set
}

// IndexOptionsFrom returns the options configured by cfg (actors.mailbox.index_shard); the
// caller adds the logger and metric set.
func IndexOptionsFrom(cfg *config.Config) IndexOptions {
	return IndexOptions{Mailbox: cfg.Actors.Mailbox.IndexShard}
}

// IndexHost returns an index.Config.Host that runs the index's shards on index shard actors.
func IndexHost(opts IndexOptions) func(shards []*index.Shard) (index.ShardHost, error) {
	return func(shards []*index.Shard) (index.ShardHost, error) { return NewIndexShards(shards, opts) }
}

// IndexShards hosts the prefix index's shards on index shard actors, one per shard: each
// actor owns its index.Shard, is its only writer, and applies ApplyEvents, MatchPrefix and
// PruneOwners in mailbox order. It implements index.ShardHost.
//
// Writes are fire-and-forget: batches queue per shard behind one ApplyEvents doorbell; a
// full queue or mailbox refuses them at once and the index writer clears the affected
// owners. Lookups read the shard tables on their own goroutines (index.Index.Lookup)
// and do not message the actors; a query a lookup could not read beside the writer, and
// index.Index.Sync, go through the actors (MatchPrefix): one pooled call per fan-out whose
// reply channel collects every answer, waiting until the lookup's deadline; a miss abandons
// the call. A panicking shard actor is logged, counted,
// restarted with an empty shard, and fails only the message that hit it.
//
// All methods are safe for concurrent use. Close stops every actor.
type IndexShards struct {
	sys      *System
	closeSys func()
	root     *actor.RootContext
	host     *host
	logger   *slog.Logger
	metrics  *series.Owned // unregistered by Close
	counters *kindCounters
	timeouts *metrics.Counter
	shards   []*indexShardHost

	calls     sync.Pool // *matchCall
	closeMu   sync.Mutex
	closed    atomic.Bool
	closedErr error
}

var _ index.ShardHost = (*IndexShards)(nil)

// NewIndexShards spawns one actor per shard.
func NewIndexShards(shards []*index.Shard, opts IndexOptions) (*IndexShards, error) {
	if opts.Mailbox <= 0 {
		opts.Mailbox = config.Default().Actors.Mailbox.IndexShard
	}
	if opts.Logger == nil && opts.System != nil {
		opts.Logger = opts.System.Logger()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.NewSet()
	}
	s := &IndexShards{host: newHost(), logger: opts.Logger, metrics: series.Own(opts.Metrics),
		closedErr: fmt.Errorf("cannot reach index shard: %w", ErrIndexClosed)}
	n := len(shards)
	s.calls.New = func() any {
		c := &matchCall{msgs: make([]MatchPrefix, 0, n)}
		c.init(n)
		return c
	}
	s.timeouts = s.metrics.Counter(metricIndexTimeouts)

	s.sys, s.closeSys = systemOr(opts.System, opts.Logger)
	s.root = s.sys.root
	s.counters = &s.sys.counters.kinds[KindIndexShard]
	for i, sh := range shards {
		h := &indexShardHost{owner: s, shard: sh, index: i, name: fmt.Sprintf("index-shard:%d", i), mailboxSize: opts.Mailbox,
			maxPending: opts.Mailbox}
		pid, err := s.root.SpawnNamed(h.props(), h.name)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("cannot spawn %s: %w", h.name, err)
		}
		h.pid = pid
		s.shards = append(s.shards, h)
	}
	return s, nil
}

// Rejected is the number of messages refused by full or stopped shard mailboxes.
func (s *IndexShards) Rejected() uint64 { return s.counters.rejected.Get() }

// Panics is the number of shard actor panics recovered.
func (s *IndexShards) Panics() uint64 { return s.counters.panics.Get() }

// Apply implements index.ShardHost: it queues the batch on shard i and rings the shard's
// doorbell (one ApplyEvents in its mailbox) unless one is already pending, so that under
// load many batches cost one actor wake-up. The shard actor also applies its queue before
// every other message, which keeps writes ordered before later queries through the actor
// (index.Index.Sync) and lets a doorbell refused by a full mailbox wait for the messages that
// fill it. The queue holds at most the mailbox size in batches (actors.mailbox.index_shard):
// beyond it a batch is refused at once, which bounds how far the index may lag behind the
// events. Past an eighth of it, the writer waits for the actor's next drain, at most
// applyWait (5 ms): lookups no longer wait for the actor, so writers alone would keep it off
// busy processors until its queue is full and their batches are refused.
func (s *IndexShards) Apply(i int, b *index.ShardBatch) error {
	if s.closed.Load() {
		return s.closedErr
	}
	h := s.shards[i]
	h.mu.Lock()
	if len(h.pending) >= h.maxPending {
		h.mu.Unlock()
		s.counters.rejected.Inc()
		return fmt.Errorf("cannot apply %d block operations on index shard %d: %w", len(b.Ops), i, index.ErrShardBusy)
	}
	h.pending = append(h.pending, b)
	ring := !h.rung
	h.rung = true
	deep := len(h.pending) > h.maxPending/8
	h.mu.Unlock()
	if deep {
		defer h.yield()
	}
	if ring {
		msg := &ApplyEvents{}
		s.root.Send(h.pid, msg)
		if msg.refused.Load() {
			// A full mailbox: the actor drains the queue before each message it holds. The
			// next Apply rings again.
			h.mu.Lock()
			h.rung = false
			h.mu.Unlock()
		}
	}
	return nil
}

// yield waits, a bounded time, while the shard's queue is deep: writers that never wait
// (lookups no longer wait for the shard actor) could otherwise keep the actor off the
// processors until its queue is full and batches are refused.
func (h *indexShardHost) yield() {
	h.mu.Lock()
	ch := h.drained
	if ch == nil {
		ch = make(chan struct{})
		h.drained = ch
	}
	deep := len(h.pending) > h.maxPending/8
	h.mu.Unlock()
	if !deep {
		return
	}
	t := time.NewTimer(applyWait)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	}
}

// applyWait bounds how long a writer waits for a shard actor that falls behind.
const applyWait = 5 * time.Millisecond

// drain takes the shard's queued batches; called by the shard actor on its doorbell.
func (h *indexShardHost) drain(dst []*index.ShardBatch) []*index.ShardBatch {
	h.mu.Lock()
	dst = append(dst, h.pending...)
	clear(h.pending)
	h.pending = h.pending[:0]
	h.rung = false
	if h.drained != nil {
		close(h.drained)
		h.drained = nil
	}
	h.mu.Unlock()
	return dst
}

// Match implements index.ShardHost: one MatchPrefix per non-nil query, answered on one reply
// channel; it waits for every answer or until ctx is done.
func (s *IndexShards) Match(ctx context.Context, qs []*index.ShardQuery) error {
	if s.closed.Load() {
		return s.closedErr
	}
	c := s.calls.Get().(*matchCall)
	c.owner = s
	for i, q := range qs {
		if q == nil {
			continue
		}
		c.msgs = append(c.msgs, MatchPrefix{Query: q, call: c}) // within capacity: no reallocation
		c.sent++
		s.root.Send(s.shards[i].pid, &c.msgs[len(c.msgs)-1])
	}
	return c.collect(ctx)
}

// collect collects every shard's answer, or gives up when ctx ends (the call is then
// abandoned: never pooled again, so a late answer lands in a call nobody reuses).
func (c *matchCall) collect(ctx context.Context) error {
	var firstErr error
	for got := 0; got < c.sent; got++ {
		err, ok := c.waitCtx(ctx)
		if !ok {
			c.owner.timeouts.Inc()
			return fmt.Errorf("index shards did not answer %d of %d queries: %w", c.sent-got, c.sent, ctx.Err())
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	s := c.owner
	c.reset()
	s.calls.Put(c)
	return firstErr
}

// Prune implements index.ShardHost: shard i reclaims the records of cleared owners now.
func (s *IndexShards) Prune(i int) error {
	if s.closed.Load() {
		return s.closedErr
	}
	msg := &PruneOwners{}
	s.root.Send(s.shards[i].pid, msg)
	if msg.refused.Load() {
		return fmt.Errorf("cannot prune index shard %d: %w", i, index.ErrShardBusy)
	}
	return nil
}

// Close stops every shard actor, waits for them, and shuts the actor system down. Later calls
// fail with ErrIndexClosed. It returns nil; it implements io.Closer so that index.Index.Close
// stops the host.
func (s *IndexShards) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed.Swap(true) {
		return nil
	}
	futures := make([]*actor.Future, 0, len(s.shards))
	for _, h := range s.shards {
		if h.pid != nil {
			futures = append(futures, s.root.StopFuture(h.pid))
		}
	}
	for _, f := range futures {
		if _, err := f.Result(); err != nil {
			s.logger.Warn("index shard actor did not confirm stop", slog.Any("error", err))
		}
	}
	s.host.shutdown()
	s.metrics.Unregister()
	s.closeSys()
	return nil
}

// indexShardHost is what a shard actor's incarnations share: the shard and its identity.
type indexShardHost struct {
	owner       *IndexShards
	shard       *index.Shard
	index       int
	name        string
	pid         *actor.PID
	mailboxSize int

	// Batches waiting for the shard actor, and whether its doorbell is in the mailbox.
	mu         sync.Mutex
	pending    []*index.ShardBatch
	rung       bool
	maxPending int
	drained    chan struct{} // closed by the next drain; nil until a writer waits for one
}

// props returns the shard actor's props with a fresh mailbox. Shard actors are always
// restarted after a failure, never stopped.
func (h *indexShardHost) props() *actor.Props {
	s := h.owner
	mb := newMailbox(h.mailboxSize, s.host, s.counters,
		&engine.PickError{Outcome: engine.OutcomeOverloaded, Detail: h.name + " mailbox is full"},
		&engine.PickError{Outcome: engine.OutcomeInternal, Detail: h.name + " stopped", Err: ErrStopped})
	return actor.PropsFromProducer(func() actor.Actor { return &indexShardActor{h: h, mb: mb} },
		actor.WithMailbox(mb.producer()),
		actor.WithGuardian(actor.RestartingSupervisorStrategy()),
		actor.WithSupervisor(actor.RestartingSupervisorStrategy()),
	)
}

// indexShardActor owns one index.Shard.
type indexShardActor struct {
	h       *indexShardHost
	mb      *mailbox
	batches []*index.ShardBatch // scratch of a drain
}

var _ actor.Actor = (*indexShardActor)(nil)

// Receive implements actor.Actor.
func (a *indexShardActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *ApplyEvents:
		a.guard(msg, nil, a.applyQueued)
	case *MatchPrefix:
		c := msg.call
		if c.abandoned.Load() {
			return
		}
		a.guard(msg, c, func() {
			a.applyQueued()
			a.h.shard.Match(msg.Query)
			c.answer(nil)
		})
	case *PruneOwners:
		a.guard(msg, nil, func() {
			a.applyQueued()
			a.h.shard.Prune()
		})
	case *actor.Restarting:
		a.h.shard.Reset()
	case *actor.Stopped:
		a.mb.close()
	}
}

// applyQueued applies every batch queued for the shard.
func (a *indexShardActor) applyQueued() {
	a.batches = a.h.drain(a.batches[:0])
	for i, b := range a.batches {
		a.h.shard.Apply(b)
		b.Done()
		a.batches[i] = nil
	}
}

// guard runs f; a panic is counted and logged, fails the message's call (if any), and
// restarts the actor (which empties the shard: its state cannot be trusted).
func (a *indexShardActor) guard(msg any, c *matchCall, f func()) {
	replied := false
	defer func() {
		if r := recover(); r != nil {
			s := a.h.owner
			s.counters.panics.Inc()
			s.logger.Error("index shard actor panicked; restarting it with an empty shard",
				slog.String("shard", a.h.name), slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			if c != nil && !replied {
				c.answer(fmt.Errorf("%s failed: %w", a.h.name, ErrPanicked))
			}
			panic(r)
		}
	}()
	a.h.owner.sys.observed(KindIndexShard, msg)
	f()
	replied = true
}

// ApplyEvents is a shard's doorbell: apply every batch of block operations queued for it
// (IndexShards.Apply queues them and sends one ApplyEvents while none is pending). The
// shard calls each batch's Done once applied. There is no reply.
type ApplyEvents struct {
	refused atomic.Bool
}

// MatchPrefix asks a shard for the owners of some blocks of a prompt. The shard appends its
// hits to Query and answers on the call's reply channel.
type MatchPrefix struct {
	Query *index.ShardQuery

	call *matchCall
}

// PruneOwners asks a shard to reclaim, now, the records of owners cleared or removed in the
// registry (index.Owners). Worker removal and engine restarts take effect for lookups at once
// through the owners' epochs; this message only frees the memory sooner. There is no reply.
type PruneOwners struct {
	refused atomic.Bool
}

func (m *ApplyEvents) reject(*engine.PickError) { m.refused.Store(true) }
func (m *PruneOwners) reject(*engine.PickError) { m.refused.Store(true) }
func (m *MatchPrefix) reject(err *engine.PickError) {
	if err.Outcome == engine.OutcomeOverloaded {
		m.call.answer(fmt.Errorf("%s: %w", err.Detail, index.ErrShardBusy))
		return
	}
	m.call.answer(err)
}

var (
	_ rejecter = (*ApplyEvents)(nil)
	_ rejecter = (*MatchPrefix)(nil)
	_ rejecter = (*PruneOwners)(nil)
)

// matchCall is the pooled state of one lookup's fan-out: its messages and a call with room
// for one answer per shard.
type matchCall struct {
	call[error]
	owner *IndexShards
	msgs  []MatchPrefix
	sent  int
}

func (c *matchCall) reset() {
	clear(c.msgs)
	c.msgs = c.msgs[:0]
	c.sent = 0
	c.owner = nil
}
