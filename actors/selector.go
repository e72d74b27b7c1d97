package actors

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"switchyard/config"
	"switchyard/engine"
)

// Sentinel errors; a *engine.PickError with OutcomeInternal wraps them.
var (
	// ErrClosed: the Selector was closed.
	ErrClosed = errors.New("selector closed")
	// ErrStopped: the actor serving the pick stopped before answering.
	ErrStopped = errors.New("actor stopped")
	// ErrPanicked: the policy or actor serving the pick panicked.
	ErrPanicked = errors.New("actor panicked")
)

// Selector hosts the selection domain on actors: one bucket actor per bucket and, as its
// children, one group actor per engine group. Select makes an idle bucket's selection in
// the caller's goroutine instead (see pick). PickEngines and Select are safe for concurrent
// use by any number of request goroutines.
type Selector struct {
	sys      *System
	closeSys func()
	root     *actor.RootContext
	host     *host
	workers  *engine.WorkerSet
	timeout  time.Duration
	logger   *slog.Logger
	counters *Counters

	buckets map[*engine.Bucket]*bucketHost
	pids    []*actor.PID // bucket actors, for Close

	calls sync.Pool // *pickCall
	bufs  sync.Pool // *[]*engine.Bucket

	closed    atomic.Bool
	closeOnce sync.Once
	closedErr *engine.PickError
}

// bucketHost is what a bucket actor's incarnations share: the bucket's immutable facts and
// the hosts of its groups. Restarting the actor keeps it.
type bucketHost struct {
	sel    *Selector
	bucket *engine.Bucket
	id     string
	name   string // actor name
	pid    *actor.PID
	stage  engine.Stage
	// groups: plain, or prefill then decode; nil entries for a misconfigured bucket.
	plain, prefill, decode *groupHost
	mailboxSize            int
	mb                     atomic.Pointer[mailbox] // the current incarnation's mailbox
	invalid                *engine.PickError       // reply of a bucket without its groups
	internal               *engine.PickError       // reply to a pick that hit a bucket actor panic
	// groups are the bucket's non-nil group hosts (a pick in the caller holds each one's run).
	groups []*groupHost
}

// groupHost is what a group actor's incarnations share: the *engine.EngineGroup (membership
// and the policy with its state, kept across restarts) and the group's fixed labels.
type groupHost struct {
	sel      *Selector
	group    *engine.EngineGroup
	bucketID string
	stage    engine.Stage
	// bucket is the group's bucket: its PickStage makes the group's step of a selection.
	bucket      *engine.Bucket
	mailboxSize int
	mb          atomic.Pointer[mailbox] // the current incarnation's mailbox
	// run is held by whichever goroutine uses group: the group actor while it makes a step,
	// or a request goroutine making a whole selection itself (Select's fast path). Picks only
	// ever TryLock it, so no request waits on it; the group actor waits at most one
	// selection.
	run sync.Mutex
}

// SelectorOptions are a Selector's collaborators beyond the configuration.
type SelectorOptions struct {
	// System is the actor system the bucket and group actors run on. Default: a private
	// one, closed by Close.
	System *System
	// Logger receives the actors' logs. Default: the System's.
	Logger *slog.Logger
}

// NewSelector spawns the actors for every bucket of resolvers. workers is the registry the
// group actors pick from; cfg sizes the mailboxes and the pick deadline (zero values take
// the defaults). A group shared by two buckets is refused: a group is owned by one actor.
func NewSelector(resolvers map[string]*engine.BucketResolver, workers *engine.WorkerSet, cfg config.Actors, opts SelectorOptions) (*Selector, error) {
	if workers == nil {
		return nil, errors.New("cannot create selector: nil worker set")
	}
	logger := opts.Logger
	if logger == nil && opts.System != nil {
		logger = opts.System.Logger()
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Selector{
		host:    newHost(),
		workers: workers,
		timeout: cfg.PickTimeout,
		logger:  logger,
		buckets: make(map[*engine.Bucket]*bucketHost),
	}
	// A zero setting takes config.Default's value.
	d := config.Default().Actors
	if s.timeout <= 0 {
		s.timeout = d.PickTimeout
	}
	bucketSize := sizeOr(cfg.Mailbox.Bucket, d.Mailbox.Bucket)
	groupSize := sizeOr(cfg.Mailbox.Group, d.Mailbox.Group)
	s.closedErr = &engine.PickError{Outcome: engine.OutcomeInternal, Detail: "selection is shut down", Err: ErrClosed}
	s.calls.New = func() any { return newPickCall() }
	s.bufs.New = func() any { b := make([]*engine.Bucket, 0, 8); return &b }

	// Deterministic order: models by name, then each resolver's selection order.
	models := make([]string, 0, len(resolvers))
	for m := range resolvers {
		models = append(models, m)
	}
	slices.Sort(models)
	owner := make(map[*engine.EngineGroup]string)
	var errs []error
	for _, m := range models {
		r := resolvers[m]
		if r == nil {
			continue
		}
		for _, b := range r.Buckets() {
			if b == nil || s.buckets[b] != nil {
				continue
			}
			bh := &bucketHost{
				sel:         s,
				bucket:      b,
				id:          b.ID,
				name:        fmt.Sprintf("bucket:%s:%s#%d", m, b.ID, len(s.buckets)),
				mailboxSize: bucketSize,
			}
			for _, g := range b.Groups() {
				if g == nil {
					continue
				}
				if prev, dup := owner[g]; dup {
					errs = append(errs, fmt.Errorf("cannot create selector: bucket %q of model %q shares a group with %s", b.ID, m, prev))
					continue
				}
				owner[g] = fmt.Sprintf("bucket %q of model %q", b.ID, m)
				gh := &groupHost{sel: s, group: g, bucket: b, bucketID: b.ID, stage: g.Stage(), mailboxSize: groupSize}
				switch {
				case !b.IsPD():
					bh.plain = gh
				case g == b.Prefill:
					bh.prefill = gh
				default:
					bh.decode = gh
				}
				bh.groups = append(bh.groups, gh)
			}
			bh.stage = engine.StagePlain
			if b.IsPD() {
				bh.stage = engine.StagePrefill
			}
			if err := b.Check(); err != nil {
				bh.invalid = err
			}
			bh.internal = &engine.PickError{Outcome: engine.OutcomeInternal, Stage: bh.stage, BucketID: b.ID,
				Detail: "bucket actor failed", Err: ErrPanicked}
			s.buckets[b] = bh
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	s.sys, s.closeSys = systemOr(opts.System, logger)
	s.root = s.sys.root
	s.counters = s.sys.counters
	hosts := make([]*bucketHost, 0, len(s.buckets))
	for _, bh := range s.buckets {
		hosts = append(hosts, bh)
	}
	slices.SortFunc(hosts, func(a, b *bucketHost) int { return strings.Compare(a.name, b.name) })
	for _, bh := range hosts {
		pid, err := s.root.SpawnNamed(bh.props(), bh.name)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("cannot spawn bucket actor %s: %w", bh.name, err)
		}
		bh.pid = pid
		s.pids = append(s.pids, pid)
	}
	return s, nil
}

func sizeOr(n, def int) int {
	if n > 0 {
		return n
	}
	return def
}

// Counters returns the actors' failure counts (mailbox rejections, recovered panics).
func (s *Selector) Counters() *Counters { return s.counters }

// Timeout is the pick deadline.
func (s *Selector) Timeout() time.Duration { return s.timeout }

// PickEngines returns b's complete selection for req in one round trip through b's actors:
// the bucket actor forwards to the plain group actor, or to the prefill group actor which
// forwards to the decode group actor; the last one replies. It waits at most the pick
// deadline: a miss returns OutcomeTimeout and req may still be read by an actor afterwards,
// so a caller must not reuse req after a timeout. A full mailbox returns OutcomeOverloaded at
// once. Returned errors are shared and must not be modified.
func (s *Selector) PickEngines(b *engine.Bucket, req *engine.BucketRequest) (engine.BucketPick, error) {
	bh := s.buckets[b]
	if bh == nil {
		return engine.BucketPick{}, &engine.PickError{Outcome: engine.OutcomeInvalidConfiguration, BucketID: bucketID(b),
			Detail: "bucket is not hosted by this selector"}
	}
	if s.closed.Load() {
		return engine.BucketPick{}, s.closedErr
	}
	return s.await(bh, s.start(bh, req))
}

// start sends req to bh's actor in a pooled call, arming the call's deadline.
func (s *Selector) start(bh *bucketHost, req *engine.BucketRequest) *pickCall {
	c := s.calls.Get().(*pickCall)
	c.engines.Request = req
	c.arm(s.timeout)
	s.root.Send(bh.pid, &c.engines)
	return c
}

// await waits for c's reply until its deadline.
func (s *Selector) await(bh *bucketHost, c *pickCall) (engine.BucketPick, error) {
	if r, ok := c.wait(); ok {
		return s.release(c, r)
	}
	// Slow path: deadline missed; c is abandoned (never pooled again). A reply that came
	// meanwhile is nobody's: what it reserved is given back.
	c.reclaim()
	return engine.BucketPick{}, &engine.PickError{Outcome: engine.OutcomeTimeout, Stage: bh.stage, BucketID: bh.id,
		Detail: "no reply within " + s.timeout.String()}
}

// release returns c to the pool and its result.
func (s *Selector) release(c *pickCall, r *PickEnginesResult) (engine.BucketPick, error) {
	pick, err := r.Pick, r.Err
	c.reset()
	s.calls.Put(c)
	return pick, err
}

func bucketID(b *engine.Bucket) string {
	if b == nil {
		return ""
	}
	return b.ID
}

// Select resolves req's compatible buckets, orders them by the resolver's rule
// (BucketResolver.Order: capacity, or slo for a request with latency targets) and runs the
// bucket loop (engine.BucketLoop) with each bucket's selection (pick: in the caller when the
// bucket is idle, else PickEngines) as its attempt: the first complete
// selection wins; missing candidates, admission rejections and PD incompatibility move on
// to the next bucket. The selection records the order's rule. A retried request
// (req.RetryAfter) resumes at the bucket of its failed attempt, in this order, without the
// engines that failed.
func (s *Selector) Select(resolver *engine.BucketResolver, req *engine.BucketRequest) (engine.BucketPick, error) {
	bp := s.bufs.Get().(*[]*engine.Bucket)
	buckets, err := resolver.Resolve((*bp)[:0], req.InputTokens, req.ExpectedPeak)
	if err == nil {
		order := resolver.Order(buckets, req, s.workers.Load())
		var pick engine.BucketPick
		pick, err = s.selectFrom(buckets, req)
		pick.Order = order
		if err == nil {
			clear(buckets)
			*bp = buckets[:0]
			s.bufs.Put(bp)
			return pick, nil
		}
	}
	clear(buckets)
	*bp = buckets[:0]
	s.bufs.Put(bp)
	return engine.BucketPick{}, err
}

// selectFrom runs the bucket loop (engine.BucketLoop) over buckets with each bucket's
// selection (pick) as its attempt.
func (s *Selector) selectFrom(buckets []*engine.Bucket, req *engine.BucketRequest) (engine.BucketPick, error) {
	loop := engine.StartBucketLoop(buckets, req)
	for b := loop.Next(); b != nil; b = loop.Next() {
		pick, err := s.pick(b, req)
		if done, err := loop.Attempted(b, pick, err); done {
			if err != nil {
				return engine.BucketPick{}, err
			}
			return pick, nil
		}
	}
	return engine.BucketPick{}, loop.Err()
}

// pick makes b's selection for req. Fast path: b's actors have nothing queued and no goroutine
// is using any of b's groups; the caller takes every group's run and makes the selection
// itself, the same steps (engine.Bucket.PickStage) the group actors would make, with no
// message, goroutine hand-off or deadline timer. Slow path: a round trip through b's actors
// (PickEngines), whose bounded mailboxes queue or refuse what outruns them. Either way one
// goroutine at a time uses a group.
func (s *Selector) pick(b *engine.Bucket, req *engine.BucketRequest) (engine.BucketPick, error) {
	bh := s.buckets[b]
	if bh == nil || bh.invalid != nil || s.closed.Load() || !bh.tryRun() {
		return s.PickEngines(b, req)
	}
	defer bh.endRun()
	return bh.pickHere(req)
}

// tryRun takes the run of every group of bh when bh's actors have nothing queued, without
// waiting: false (holding none) when a mailbox has messages or a group is in use. The runs
// alone keep the groups to one goroutine at a time; the queues are looked at so that a
// selection made here does not overtake picks already waiting for the actors.
func (bh *bucketHost) tryRun() bool {
	if queued(bh.mb.Load()) {
		return false
	}
	for i, gh := range bh.groups {
		if queued(gh.mb.Load()) || !gh.run.TryLock() {
			for _, held := range bh.groups[:i] {
				held.run.Unlock()
			}
			return false
		}
	}
	return true
}

// queued reports whether mb holds messages (nil: the actor is not spawned yet).
func queued(mb *mailbox) bool { return mb != nil && mb.queued.Load() > 0 }

// endRun gives back the runs tryRun took.
func (bh *bucketHost) endRun() {
	for _, gh := range bh.groups {
		gh.run.Unlock()
	}
}

// group is bh's group host of stage; nil when the bucket has none.
func (bh *bucketHost) group(stage engine.Stage) *groupHost {
	switch stage {
	case engine.StagePlain:
		return bh.plain
	case engine.StagePrefill:
		return bh.prefill
	}
	return bh.decode
}

// pickHere makes bh's whole selection for req on the caller's goroutine, which holds every
// group's run: the group steps in order, as the group actors make them. A failing step
// discards the earlier ones' picks.
func (bh *bucketHost) pickHere(req *engine.BucketRequest) (engine.BucketPick, error) {
	var pick engine.BucketPick
	stage := bh.bucket.FirstStage()
	for {
		next, more, err := bh.group(stage).step(req, &pick)
		switch {
		case err != nil:
			pick.AbandonAdapters() // a stage that panicked after an earlier one reserved
			return engine.BucketPick{}, err
		case !more:
			return pick, nil
		}
		stage = next
	}
}

// step makes gh's step of a selection (engine.Bucket.PickStage) into sel, on a goroutine that
// holds gh's run. A panic in the policy is recovered, logged and counted like one in the
// group actor, and fails only this selection (OutcomeInternal, ErrPanicked); the group and
// its policy state stay as a restarted group actor would find them.
func (gh *groupHost) step(req *engine.BucketRequest, sel *engine.BucketPick) (next engine.Stage, more bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			recordPanic(gh.sel, KindGroup, gh.bucketID, gh.stage, gh.group.Policy().Name(), r,
				"policy panicked in a request's own selection; failing its request")
			next, more = 0, false
			err = &engine.PickError{Outcome: engine.OutcomeInternal, Stage: gh.stage, BucketID: gh.bucketID,
				Detail: fmt.Sprintf("%s group panicked: %v", gh.stage, r), Err: ErrPanicked}
		}
	}()
	return gh.bucket.PickStage(gh.sel.workers.Load(), req, gh.stage, sel)
}

// Close stops every actor, waits until they have stopped and their goroutines have ended,
// and shuts the actor system down. Picks after Close fail with OutcomeInternal (ErrClosed).
func (s *Selector) Close() {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		futures := make([]*actor.Future, 0, len(s.pids))
		for _, pid := range s.pids {
			futures = append(futures, s.root.StopFuture(pid))
		}
		for _, f := range futures {
			if _, err := f.Result(); err != nil {
				s.logger.Warn("actor did not confirm stop", slog.Any("error", err))
			}
		}
		s.host.shutdown()
		s.closeSys()
	})
}

// props returns the bucket actor's props; each spawn gets a fresh mailbox. Bucket actors (by
// their guardian) and group actors (by their parent's strategy) are always restarted after a
// failure, never stopped however often they fail: a stopped actor would turn every later pick
// of its bucket into an error.
func (bh *bucketHost) props() *actor.Props {
	mb := newMailbox(bh.mailboxSize, bh.sel.host, &bh.sel.counters.kinds[KindBucket],
		&engine.PickError{Outcome: engine.OutcomeOverloaded, Stage: bh.stage, BucketID: bh.id, Detail: "bucket actor mailbox is full"},
		&engine.PickError{Outcome: engine.OutcomeInternal, Stage: bh.stage, BucketID: bh.id, Detail: "bucket actor stopped", Err: ErrStopped})
	bh.mb.Store(mb)
	return actor.PropsFromProducer(func() actor.Actor { return newBucketActor(bh, mb) },
		actor.WithMailbox(mb.producer()),
		actor.WithGuardian(actor.RestartingSupervisorStrategy()),
		actor.WithSupervisor(actor.RestartingSupervisorStrategy()),
	)
}

// props returns the group actor's props; each spawn gets a fresh mailbox.
func (gh *groupHost) props() *actor.Props {
	mb := newMailbox(gh.mailboxSize, gh.sel.host, &gh.sel.counters.kinds[KindGroup],
		&engine.PickError{Outcome: engine.OutcomeOverloaded, Stage: gh.stage, BucketID: gh.bucketID, Detail: gh.stage.String() + " group actor mailbox is full"},
		&engine.PickError{Outcome: engine.OutcomeInternal, Stage: gh.stage, BucketID: gh.bucketID, Detail: gh.stage.String() + " group actor stopped", Err: ErrStopped})
	gh.mb.Store(mb)
	return actor.PropsFromProducer(func() actor.Actor { return newGroupActor(gh, mb) },
		actor.WithMailbox(mb.producer()))
}

// bucketActor is a bucket's one address: a pick enters here. It exists for what it owns, not
// for work per pick: it is the parent and supervisor of the bucket's group actors (a group
// actor that panics is restarted with its group and policy state; a bucket whose groups are
// missing answers every pick with the same error), and its bounded mailbox refuses a
// bucket's picks at once when they outrun it (OutcomeOverloaded), before any group is asked.
// Per pick it only hands the call to the group actor of the bucket's first stage
// (engine.Bucket.FirstStage); the selection itself is made by the group actors, one step
// each (engine.Bucket.PickStage).
type bucketActor struct {
	h  *bucketHost
	mb *mailbox
	// groups are the group actors' PIDs by stage, spawned on Started (again after a restart,
	// which stops children); nil for a stage the bucket does not have.
	groups [3]*actor.PID
}

var _ actor.Actor = (*bucketActor)(nil)

func newBucketActor(h *bucketHost, mb *mailbox) *bucketActor { return &bucketActor{h: h, mb: mb} }

// Receive implements actor.Actor.
func (a *bucketActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *PickEngines:
		a.pickEngines(ctx, msg)
	case *actor.Started:
		a.spawnGroups(ctx)
	case *actor.Stopped:
		a.mb.close()
	}
}

func (a *bucketActor) spawnGroups(ctx actor.Context) {
	spawn := func(gh *groupHost) *actor.PID {
		if gh == nil {
			return nil
		}
		pid, err := ctx.SpawnNamed(gh.props(), gh.stage.String())
		if err != nil {
			panic(fmt.Sprintf("BUG: cannot spawn %s group actor of bucket %s: %v", gh.stage, a.h.id, err))
		}
		return pid
	}
	a.groups[engine.StagePlain] = spawn(a.h.plain)
	a.groups[engine.StagePrefill] = spawn(a.h.prefill)
	a.groups[engine.StageDecode] = spawn(a.h.decode)
}

func (a *bucketActor) pickEngines(ctx actor.Context, msg *PickEngines) {
	c := msg.call
	if c.abandoned.Load() {
		return
	}
	owned := true
	defer func() {
		if r := recover(); r != nil {
			recordPanic(a.h.sel, KindBucket, a.h.id, a.h.stage, "", r, actorPanicked)
			if owned {
				c.fail(a.h.internal)
			}
			panic(r) // let Proto.Actor restart the actor
		}
	}()
	if a.h.invalid != nil {
		owned = false
		c.fail(a.h.invalid)
		return
	}
	a.h.sel.sys.observed(KindBucket, msg)
	c.engine = PickEngine{Request: msg.Request, Groups: &a.groups, call: c}
	owned = false
	ctx.Send(a.groups[a.h.bucket.FirstStage()], &c.engine)
}

// groupActor owns one engine group: its membership cache and its policy with its state.
type groupActor struct {
	h  *groupHost
	mb *mailbox
}

var _ actor.Actor = (*groupActor)(nil)

func newGroupActor(h *groupHost, mb *mailbox) *groupActor { return &groupActor{h: h, mb: mb} }

// Receive implements actor.Actor.
func (a *groupActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *PickEngine:
		a.pickEngine(ctx, msg)
	case *actor.Stopped:
		a.mb.close()
	}
}

func (a *groupActor) pickEngine(ctx actor.Context, msg *PickEngine) {
	c := msg.call
	if c.abandoned.Load() {
		c.skip()
		return
	}
	// A selection made in a request goroutine (Selector.pick) may hold the group: wait for it.
	a.h.run.Lock()
	defer a.h.run.Unlock()
	owned := true
	defer func() {
		if r := recover(); r != nil {
			recordPanic(a.h.sel, KindGroup, a.h.bucketID, a.h.stage, a.h.group.Policy().Name(), r, actorPanicked)
			if owned {
				c.fail(&engine.PickError{Outcome: engine.OutcomeInternal, Stage: a.h.stage, BucketID: a.h.bucketID,
					Detail: fmt.Sprintf("%s group actor panicked: %v", a.h.stage, r), Err: ErrPanicked})
			}
			panic(r) // let Proto.Actor restart the actor
		}
	}()
	next, more, err := a.h.bucket.PickStage(a.h.sel.workers.Load(), msg.Request, a.h.stage, &c.result.Pick)
	owned = false
	switch {
	case err != nil:
		c.fail(err)
	case more:
		ctx.Send(msg.Groups[next], msg)
	default:
		c.finish()
	}
}

// actorPanicked is the log message of a panic recovered in an actor.
const actorPanicked = "actor panicked; failing its request and restarting it"

// recordPanic logs (with msg) and counts a panic recovered in an actor, or in a selection a
// request goroutine made itself (counted as its group actor's kind).
func recordPanic(s *Selector, k Kind, bucketID string, stage engine.Stage, policy string, r any, msg string) {
	s.counters.kinds[k].panics.Inc()
	s.logger.Error(msg,
		slog.String("kind", k.String()),
		slog.String("bucket", bucketID),
		slog.String("stage", stage.String()),
		slog.String("policy", policy),
		slog.Any("panic", r),
		slog.String("stack", string(debug.Stack())))
}
