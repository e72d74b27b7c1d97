package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"

	"switchyard/actors/clusterpb"
	"switchyard/engine"
)

var _ engine.AffinityStore = (*Cluster)(nil)

// Lookup implements engine.AffinityStore: one round trip to the key's partition grain, in
// process when this replica owns it.
func (c *Cluster) Lookup(scope engine.AffinityScope, key string, now time.Time) (string, error) {
	if now.IsZero() {
		now = c.opts.Affinity.Now()
	}
	r, err := c.request(scope, bindingOp{key: key, now: now})
	return r.worker, err
}

// Bind implements engine.AffinityStore: a compare-and-set in one round trip to the key's
// partition grain.
func (c *Cluster) Bind(scope engine.AffinityScope, key, expect, workerID string, now time.Time) (string, bool, error) {
	if now.IsZero() {
		now = c.opts.Affinity.Now()
	}
	r, err := c.request(scope, bindingOp{bind: true, key: key, expect: expect, worker: workerID, now: now})
	return r.worker, r.set, err
}

// bindingOp is a lookup, or a bind when bind is set.
type bindingOp struct {
	bind                bool
	key, expect, worker string
	now                 time.Time
}

type bindingAnswer struct {
	worker string
	set    bool
}

// request runs one binding command on the key's partition: in process with a pooled call
// when this replica owns it (fast path: no allocation), else as one remote request. A
// command whose owner did not answer is tried once more, on the partition's next owner
// (where the partition goes should its owner be gone), within the same deadline
// (cluster.request_timeout): the first attempt gets half of it, since an owner that
// crashed answers nothing until the membership notices. A grain that had stopped (it
// moved) is asked again through its owner. Nothing here changes the placement: a slow
// member is not a gone one.
func (c *Cluster) request(scope engine.AffinityScope, op bindingOp) (bindingAnswer, error) {
	// Counted before the closed check: either Close sees this request and waits for it, or
	// this request sees Close (see waitRequests).
	c.inflight.Add(1)
	defer c.endRequest()
	if c.closed.Load() {
		return bindingAnswer{}, &engine.PickError{Outcome: engine.OutcomeInternal, Stage: scope.Stage, BucketID: scope.BucketID,
			Detail: "cluster is shut down", Err: ErrAffinityClosed}
	}
	p, h := c.partitionHash(op.key)
	// The near cache's generation is read before anything else: a change after this point
	// (an invalidation, a new owner) keeps this request's answer out of the cache.
	var gen uint64
	if c.near != nil {
		gen = c.near.gen(p)
	}
	var deadline time.Time
	var lastErr error
	failed := "" // the owner that did not answer the first attempt
	for attempt := range 2 {
		pl := c.placement.Load()
		if pid := pl.pids[p].Load(); attempt == 0 && pid != nil && pid.Address == pl.self {
			// Fast path: this replica owns the partition and its grain is known.
			a, err, again := c.requestLocal(pl, p, pid, scope, op)
			if !again {
				return a, err
			}
			lastErr = err
			continue
		}
		if attempt == 0 && !op.bind && c.near != nil && pl.owners[p] != pl.self {
			// Another replica owns the partition: a binding read from it lately answers.
			if w, ok := c.near.get(p, h, scope, op.key, op.now.UnixNano()); ok {
				return bindingAnswer{worker: w}, nil
			}
		}
		// Slow path: first use under this placement, another owner, or the retry.
		if deadline.IsZero() {
			deadline = time.Now().Add(c.timeout)
		}
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		budget := left
		if attempt == 0 {
			budget = left / 2
		}
		attemptDeadline := time.Now().Add(budget)
		var pid *actor.PID
		var err error
		if failed != "" && pl.owners[p] == failed && pl.next[p] != "" {
			next := pl.next[p]
			if next == "self:0" {
				next = pl.self
			}
			pid, err = c.activate(next, p, budget) // not cached: the placement is unchanged
		} else {
			pid, err = c.pidOf(pl, p, budget)
		}
		if err == nil && pid.Address == pl.self {
			a, err, again := c.requestLocal(pl, p, pid, scope, op)
			if !again {
				return a, err
			}
			lastErr = err
			continue
		}
		var a bindingAnswer
		if err == nil {
			a, err = c.requestRemote(pl, p, pid, scope, op, attemptDeadline)
			if err == nil && c.near != nil {
				c.near.put(p, gen, h, scope, op.key, a.worker, op.now.UnixNano())
			}
			if err == nil || !errors.Is(err, ErrClusterUnavailable) {
				return a, err
			}
		}
		lastErr = err
		if !errors.Is(err, actor.ErrDeadLetter) {
			failed = pl.owners[p]
		}
	}
	out := engine.OutcomeTimeout
	if lastErr != nil && !errors.Is(lastErr, actor.ErrTimeout) && !errors.Is(lastErr, context.DeadlineExceeded) {
		out = engine.OutcomeInternal
	}
	return bindingAnswer{}, &engine.PickError{Outcome: out, Stage: scope.Stage, BucketID: scope.BucketID,
		Detail: "cannot reach affinity partition " + strconv.Itoa(p), Err: errors.Join(ErrClusterUnavailable, lastErr)}
}

// requestLocal runs op on this replica's grain of partition p with a pooled call; again
// reports a grain that stopped meanwhile (it moved): the caller asks the next placement.
func (c *Cluster) requestLocal(pl *placement, p int, pid *actor.PID, scope engine.AffinityScope, op bindingOp) (bindingAnswer, error, bool) {
	c.lookups.Inc()
	ac := c.calls.Get().(*affinityCall)
	ac.scope = scope
	var cmd affinityCommand
	if op.bind {
		ac.bind = Bind{Key: op.key, Expect: op.expect, WorkerID: op.worker, Now: op.now, call: ac}
		cmd = &ac.bind
	} else {
		ac.lookup = LookupBinding{Key: op.key, Now: op.now, call: ac}
		cmd = &ac.lookup
	}
	ac.arm(c.opts.Affinity.CallTimeout)
	c.sys.root.Send(pid, cmd)
	if _, ok := ac.wait(); !ok {
		return bindingAnswer{}, &engine.PickError{Outcome: engine.OutcomeTimeout, Stage: scope.Stage, BucketID: scope.BucketID,
			Detail: "affinity partition " + strconv.Itoa(p) + " did not reply within " + c.opts.Affinity.CallTimeout.String()}, false
	}
	var a bindingAnswer
	var err error
	if op.bind {
		a, err = bindingAnswer{ac.bindRes.WorkerID, ac.bindRes.Set}, ac.bindRes.Err
	} else {
		a, err = bindingAnswer{worker: ac.lookupRes.WorkerID}, ac.lookupRes.Err
	}
	ac.reset()
	c.calls.Put(ac)
	if errors.Is(err, ErrStopped) {
		pl.pids[p].CompareAndSwap(pid, nil)
		return bindingAnswer{}, err, true
	}
	return a, err, false
}

// requestRemote runs op on another member's grain: one remote request until deadline. A
// failure wraps ErrClusterUnavailable (the caller may retry on the next owner).
func (c *Cluster) requestRemote(pl *placement, p int, pid *actor.PID, scope engine.AffinityScope, op bindingOp, deadline time.Time) (bindingAnswer, error) {
	c.remote.Inc()
	var msg any
	if op.bind {
		msg = &clusterpb.Bind{Scope: pbScope(scope), Key: op.key, Expect: op.expect, WorkerId: op.worker, NowUnixNano: op.now.UnixNano()}
	} else {
		msg = &clusterpb.LookupBinding{Scope: pbScope(scope), Key: op.key, NowUnixNano: op.now.UnixNano()}
	}
	start := time.Now()
	res, err := c.sys.root.RequestFuture(pid, msg, time.Until(deadline)).Result()
	c.remoteLatency.UpdateDuration(start)
	if err != nil {
		c.remoteFailed.Inc()
		if errors.Is(err, actor.ErrDeadLetter) {
			pl.pids[p].CompareAndSwap(pid, nil) // the grain stopped: activate it anew
		}
		return bindingAnswer{}, fmt.Errorf("partition %d on %s: %w: %w", p, pid.Address, ErrClusterUnavailable, err)
	}
	br, ok := res.(*clusterpb.BindingResult)
	if !ok {
		return bindingAnswer{}, fmt.Errorf("partition %d on %s: unexpected reply %T: %w", p, pid.Address, res, ErrClusterUnavailable)
	}
	if br.Outcome != 0 {
		return bindingAnswer{}, &engine.PickError{Outcome: engine.Outcome(br.Outcome), Stage: scope.Stage, BucketID: scope.BucketID,
			Detail: br.Detail}
	}
	return bindingAnswer{br.WorkerId, br.Set}, nil
}

// InvalidateWorker drops every binding to workerID in the partitions this replica owns and
// returns how many were removed. Each replica invalidates its own partitions when it
// applies a worker removal (worker changes reach every replica).
func (c *Cluster) InvalidateWorker(workerID string) (int, error) {
	if c.near != nil {
		c.near.invalidateAll() // copies of bindings to it, read from other owners
	}
	return c.eachLocal(func(ac *affinityCall) affinityCommand {
		ac.inval = InvalidateWorker{WorkerID: workerID, call: ac}
		return &ac.inval
	}, func(ac *affinityCall) (int, error) { return ac.invalRes.Removed, ac.invalRes.Err })
}

// Sweep drops the bindings expired at now from the partitions this replica owns.
func (c *Cluster) Sweep(now time.Time) (int, error) {
	if now.IsZero() {
		now = c.opts.Affinity.Now()
	}
	return c.eachLocal(func(ac *affinityCall) affinityCommand {
		ac.sweep = Sweep{Now: now, call: ac}
		return &ac.sweep
	}, func(ac *affinityCall) (int, error) { return ac.sweepRes.Expired, ac.sweepRes.Err })
}

// RunSweeper sweeps the local partitions on every tick until ctx is done (see
// AffinityStore.RunSweeper).
func (c *Cluster) RunSweeper(ctx context.Context, ticks <-chan time.Time) {
	runSweeper(ctx, ticks, c.logger, func() (int, error) { return c.Sweep(c.opts.Affinity.Now()) })
}

// eachLocal runs a command on every local partition grain.
func (c *Cluster) eachLocal(cmd func(*affinityCall) affinityCommand, result func(*affinityCall) (int, error)) (int, error) {
	n := 0
	var errs []error
	for p := range c.local {
		h := c.local[p].Load()
		if h == nil {
			continue
		}
		ac := c.calls.Get().(*affinityCall)
		m := cmd(ac)
		ac.arm(max(c.opts.Affinity.CallTimeout, minAffinityAdminTimeout))
		c.sys.root.Send(h.pid, m)
		if _, ok := ac.wait(); !ok {
			errs = append(errs, fmt.Errorf("affinity partition %d did not reply", p))
			continue
		}
		k, err := result(ac)
		ac.reset()
		c.calls.Put(ac)
		if err != nil {
			errs = append(errs, fmt.Errorf("affinity partition %d: %w", p, err))
			continue
		}
		n += k
	}
	return n, errors.Join(errs...)
}

func pbScope(s engine.AffinityScope) *clusterpb.Scope {
	return &clusterpb.Scope{Model: s.Model, Bucket: s.BucketID, Stage: int32(s.Stage)}
}

func scopeOf(s *clusterpb.Scope) engine.AffinityScope {
	if s == nil {
		return engine.AffinityScope{}
	}
	return engine.AffinityScope{Model: s.Model, BucketID: s.Bucket, Stage: engine.Stage(s.Stage)}
}

// partitionHost is a running partition grain of this replica.
type partitionHost struct {
	pid *actor.PID
}

// handOff tells a partition grain to give its bindings to the grain of the same partition
// on target (a member address), then forward every later command there. Sent by Leave.
type handOff struct {
	target  string
	timeout time.Duration // bounds each request of the hand-off
	call    *call[error]
}

// partitionActor is an affinity partition grain: the bindings of every scope whose keys
// hash to its partition. Proto.Actor activates it on the owner (disthash placement); a
// grain whose partition moves to another member (a member joined) hands its bindings to the
// new owner as it stops, and on a graceful leave (handOff) before the replica goes.
type partitionActor struct {
	c       *Cluster
	mb      *mailbox
	id      *cluster.ClusterIdentity
	p       int
	self    *partitionHost
	tables  map[engine.AffinityScope]*bindingTable
	forward *actor.PID // set once the bindings were handed off

	// readers are the replicas (addresses) that read a binding of this grain since it last
	// invalidated their copies; dirty is set when a binding one of them read changed or
	// went, and the grain then tells them all (NearCacheInvalidate) before its next message.
	readers map[string]struct{}
	dirty   bool
}

var (
	_ actor.Actor  = (*partitionActor)(nil)
	_ mailboxOwner = (*partitionActor)(nil)
)

func newPartitionActor(c *Cluster) *partitionActor {
	return &partitionActor{c: c, p: -1, tables: map[engine.AffinityScope]*bindingTable{}}
}

// setMailbox implements mailboxOwner: the grain closes its own mailbox when it stops.
func (a *partitionActor) setMailbox(mb *mailbox) { a.mb = mb }

// table returns scope's table, creating it.
func (a *partitionActor) table(scope engine.AffinityScope) *bindingTable {
	t := a.tables[scope]
	if t == nil {
		t = newBindingTable(a.c.idle, a.c.perPart, a.c.stats.of(scope))
		t.watch = 2 * int64(a.c.cfg.NearCacheTTL) // readers' clocks may differ a little
		t.onRemoteChange = a.markDirty
		a.tables[scope] = t
	}
	return t
}

// Receive implements actor.Actor. A panic fails the command that hit it, is logged and
// counted (kind affinity_partition), and empties the partition (its tables cannot be
// trusted); the grain is not restarted.
func (a *partitionActor) Receive(ctx actor.Context) {
	msg := ctx.Message()
	defer func() {
		if r := recover(); r != nil {
			a.c.sys.counters.kinds[KindPartition].panics.Inc()
			a.c.logger.Error("affinity partition panicked; failing its command and emptying it",
				slog.Int("partition", a.p), slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			a.clear()
			a.dirty = true
			a.notifyReaders(ctx)
			fail := &engine.PickError{Outcome: engine.OutcomeInternal, Detail: "affinity partition failed", Err: ErrPanicked}
			switch m := msg.(type) {
			case affinityCommand:
				m.reject(fail)
			case *clusterpb.LookupBinding, *clusterpb.Bind:
				ctx.Respond(&clusterpb.BindingResult{Outcome: int32(engine.OutcomeInternal), Detail: fail.Detail})
			case *handOff:
				m.call.offer(fail)
			}
		}
	}()
	switch m := msg.(type) {
	case affinityCommand:
		a.local(ctx, m)
		a.notifyReaders(ctx)
	case *clusterpb.LookupBinding:
		if a.forward != nil {
			ctx.Forward(a.forward)
			return
		}
		a.c.sys.observed(KindPartition, m)
		t := a.table(scopeOf(m.Scope))
		w := t.lookup(m.Key, m.NowUnixNano)
		a.readBy(ctx, t, m.Key, w, m.NowUnixNano)
		ctx.Respond(&clusterpb.BindingResult{WorkerId: w})
	case *clusterpb.Bind:
		if a.forward != nil {
			ctx.Forward(a.forward)
			return
		}
		a.c.sys.observed(KindPartition, m)
		t := a.table(scopeOf(m.Scope))
		w, set := t.bind(m.Key, m.Expect, m.WorkerId, m.NowUnixNano)
		a.notifyReaders(ctx) // before the answer: the rebind may have changed a copy
		a.readBy(ctx, t, m.Key, w, m.NowUnixNano)
		ctx.Respond(&clusterpb.BindingResult{WorkerId: w, Set: set})
	case *clusterpb.HandOffBindings:
		a.c.sys.observed(KindPartition, m)
		ctx.Respond(&clusterpb.HandOffBindingsResult{Adopted: int32(a.adopt(m.Bindings))})
	case *handOff:
		m.call.offer(a.handOffTo(ctx, m.target, m.timeout))
	case *actor.Started:
		// The grain's kind carries no cluster middleware (see partitionKindOf): what it
		// would do on start and stop is done here.
		if id := cluster.GetClusterIdentity(ctx); id != nil {
			a.id = id
			if p, err := strconv.Atoi(id.Identity); err == nil && p >= 0 && p < len(a.c.local) {
				a.p = p
				a.self = &partitionHost{pid: ctx.Self()}
				a.c.local[p].Store(a.self)
			}
		}
	case *actor.Stopping:
		a.onStopping(ctx)
	case *actor.Stopped:
		if a.p >= 0 {
			a.c.local[a.p].CompareAndSwap(a.self, nil)
		}
		if a.id != nil {
			// The identity lookup forgets the activation, so the next request activates
			// the partition anew.
			cl := cluster.GetCluster(ctx.ActorSystem())
			cl.ActorSystem.EventStream.Publish(&cluster.ActivationTerminating{Pid: ctx.Self(), ClusterIdentity: a.id})
			cl.PidCache.RemoveByValue(a.id.Identity, a.id.Kind, ctx.Self())
		}
		a.clear()
		if a.mb != nil {
			a.mb.close()
		}
	}
}

// readBy records that the sender of the current (remote) message read key's binding w in t:
// it may keep a copy in its near cache until told otherwise.
func (a *partitionActor) readBy(ctx actor.Context, t *bindingTable, key, w string, now int64) {
	s := ctx.Sender()
	if w == "" || s == nil || s.Address == "" || a.c.cfg.NearCacheTTL <= 0 {
		return
	}
	t.readRemotely(key, now)
	if _, ok := a.readers[s.Address]; ok {
		return
	}
	if len(a.readers) >= maxReaders {
		a.dirty = true
		a.notifyReaders(ctx)
	}
	if a.readers == nil {
		a.readers = map[string]struct{}{}
	}
	a.readers[s.Address] = struct{}{}
}

// markDirty is the tables' onRemoteChange: a binding another replica read changed or went.
func (a *partitionActor) markDirty() { a.dirty = true }

// notifyReaders tells every reader, when a binding one of them read changed or went, to
// forget its copies of this partition, and forgets the readers (they register again with
// their next read). The message goes out before any later answer of this grain, on the
// same connection to each reader.
func (a *partitionActor) notifyReaders(ctx actor.Context) {
	if !a.dirty {
		return
	}
	a.dirty = false
	if len(a.readers) == 0 || a.p < 0 {
		return
	}
	msg := &clusterpb.NearCacheInvalidate{Partition: int32(a.p)}
	for addr := range a.readers {
		ctx.Send(actor.NewPID(addr, nearCacheName), msg)
	}
	a.c.nearSent.Add(len(a.readers))
	clear(a.readers)
}

// local applies a command of this replica's own requests.
func (a *partitionActor) local(ctx actor.Context, cmd affinityCommand) {
	ac := cmd.callOf()
	if ac.abandoned.Load() {
		return
	}
	a.c.sys.observed(KindPartition, cmd)
	switch m := cmd.(type) {
	case *InvalidateWorker:
		n := 0
		for _, t := range a.tables {
			n += t.invalidate(m.WorkerID)
		}
		ac.invalRes = InvalidateWorkerResult{Removed: n}
	case *Sweep:
		n := 0
		for _, t := range a.tables {
			n += t.sweep(m.Now.UnixNano())
		}
		ac.sweepRes = SweepResult{Expired: n}
	default:
		if a.forward != nil {
			// Handed off: this replica is leaving; ask the new owner on its behalf.
			a.forwardLocal(ctx, ac, cmd)
		} else {
			cmd.apply(a.table(ac.scope))
		}
	}
	ac.done()
}

// forwardLocal runs a lookup or bind of this replica on the grain the bindings went to.
func (a *partitionActor) forwardLocal(ctx actor.Context, ac *affinityCall, cmd affinityCommand) {
	var msg any
	switch m := cmd.(type) {
	case *LookupBinding:
		msg = &clusterpb.LookupBinding{Scope: pbScope(ac.scope), Key: m.Key, NowUnixNano: m.Now.UnixNano()}
	case *Bind:
		msg = &clusterpb.Bind{Scope: pbScope(ac.scope), Key: m.Key, Expect: m.Expect, WorkerId: m.WorkerID, NowUnixNano: m.Now.UnixNano()}
	default:
		return
	}
	res, err := ctx.RequestFuture(a.forward, msg, a.c.timeout).Result()
	br, _ := res.(*clusterpb.BindingResult)
	var fail error
	if err != nil || br == nil {
		fail = &engine.PickError{Outcome: engine.OutcomeTimeout, Stage: ac.scope.Stage, BucketID: ac.scope.BucketID,
			Detail: "the partition's new owner did not reply"}
		br = &clusterpb.BindingResult{}
	}
	switch cmd.(type) {
	case *LookupBinding:
		ac.lookupRes = LookupBindingResult{WorkerID: br.WorkerId, Err: fail}
	case *Bind:
		ac.bindRes = BindResult{WorkerID: br.WorkerId, Set: br.Set, Err: fail}
	}
}

// bindings returns every live binding of the partition at now.
func (a *partitionActor) bindings(now int64) []*clusterpb.Binding {
	var out []*clusterpb.Binding
	for scope, t := range a.tables {
		ps := pbScope(scope)
		for b := t.tail; b != nil; b = b.prev {
			if now-b.lastUse < t.idle {
				out = append(out, &clusterpb.Binding{Scope: ps, Key: b.key, WorkerId: b.worker, LastUseUnixNano: b.lastUse})
			}
		}
	}
	return out
}

// adopt takes handed-off bindings; a key this grain already holds keeps its binding (it was
// set after the hand-off began).
func (a *partitionActor) adopt(bs []*clusterpb.Binding) int {
	n := 0
	for _, b := range bs {
		t := a.table(scopeOf(b.Scope))
		if t.live(b.Key, b.LastUseUnixNano) != nil {
			continue
		}
		if _, set := t.bind(b.Key, "", b.WorkerId, b.LastUseUnixNano); set {
			n++
		}
	}
	a.c.handedOff.Add(n)
	return n
}

// handOffTo activates the partition's grain on target, gives it the bindings and forwards
// everything there from now on.
func (a *partitionActor) handOffTo(ctx actor.Context, target string, timeout time.Duration) error {
	if a.forward != nil {
		return nil
	}
	activator := actor.NewPID(target, "partition-activator")
	res, err := ctx.RequestFuture(activator, &cluster.ActivationRequest{
		ClusterIdentity: cluster.NewClusterIdentity(strconv.Itoa(a.p), partitionKind)}, timeout).Result()
	if err != nil {
		return fmt.Errorf("partition %d: cannot activate on %s: %w", a.p, target, err)
	}
	ar, ok := res.(*cluster.ActivationResponse)
	if !ok || ar.Pid == nil {
		return fmt.Errorf("partition %d: no activation on %s", a.p, target)
	}
	bs := a.bindings(a.c.opts.Affinity.Now().UnixNano())
	if len(bs) > 0 {
		if _, err := ctx.RequestFuture(ar.Pid, &clusterpb.HandOffBindings{Partition: int32(a.p), Bindings: bs},
			timeout).Result(); err != nil {
			return fmt.Errorf("partition %d: %d bindings not handed to %s: %w", a.p, len(bs), target, err)
		}
	}
	a.forward = ar.Pid
	a.c.logger.Info("affinity partition handed off", slog.Int("partition", a.p), slog.String("to", target), slog.Int("bindings", len(bs)))
	return nil
}

// onStopping hands the bindings on when the grain stops because its partition moved to
// another member (a member joined), not when the whole replica stops.
func (a *partitionActor) onStopping(ctx actor.Context) {
	if a.forward != nil || a.p < 0 || a.c.closed.Load() || len(a.tables) == 0 {
		return
	}
	pl := a.c.placement.Load()
	if target := pl.owners[a.p]; target != "" && target != pl.self {
		if err := a.handOffTo(ctx, target, a.c.cfg.HandoffTimeout); err != nil {
			a.c.logger.Warn("affinity partition moved without its bindings", slog.Any("error", err))
		}
	}
}

func (a *partitionActor) clear() {
	for _, t := range a.tables {
		t.clear()
	}
	clear(a.tables)
}

// runSweeper calls sweep on every tick until ctx is done or ticks is closed; a panicking
// sweep is logged and the loop goes on. A failure is logged when its message changes.
func runSweeper(ctx context.Context, ticks <-chan time.Time, logger *slog.Logger, sweep func() (int, error)) {
	var lastErr string
	once := func() (msg string) {
		defer func() {
			if r := recover(); r != nil {
				msg = fmt.Sprintf("sweep panicked: %v", r)
				logger.Error("affinity sweep panicked", slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			}
		}()
		n, err := sweep()
		if logger.Enabled(context.Background(), slog.LevelDebug) {
			logger.Debug("affinity sweep", slog.Int("expired", n))
		}
		if err != nil {
			return err.Error()
		}
		return ""
	}
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ticks:
			if !ok {
				return
			}
		}
		msg := once()
		if msg != lastErr && msg != "" {
			logger.Warn("affinity sweep failed", slog.String("error", msg))
		}
		lastErr = msg
	}
}
