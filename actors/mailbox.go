package actors

import (
	"sync"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"
	"github.com/asynkron/protoactor-go/actor"

	"switchyard/engine"
	"switchyard/load/series"
)

// Kind is an actor kind; mailbox sizes and failure counters are per kind.
type Kind uint8

// Actor kinds.
const (
	KindBucket Kind = iota
	KindGroup
	KindTelemetry
	KindAffinity
	KindIndexShard
	KindPartition
	KindApproxShard
	numKinds
)

var kindNames = [numKinds]string{"bucket", "group", "telemetry", "affinity", "index_shard", "affinity_partition", "approx_shard"}

// String returns the kind's name as used in configuration (actors.mailbox.<kind>) and in the
// kind label of the actor metrics.
func (k Kind) String() string {
	if k < numKinds {
		return kindNames[k]
	}
	return "unknown"
}

// Counters are the actors' failure counts per kind, registered as
// switchyard_actor_mailbox_rejections_total{kind} and switchyard_actor_panics_total{kind}.
// All methods are safe for concurrent use.
type Counters struct {
	kinds [numKinds]kindCounters
}

// kindCounters are the failure counters of one kind of actor.
type kindCounters struct {
	rejected *metrics.Counter
	panics   *metrics.Counter
}

// newCounters registers every kind's counters in set.
func newCounters(set *metrics.Set) *Counters {
	c := &Counters{}
	for k := range numKinds {
		c.kinds[k] = kindCounters{
			rejected: set.GetOrCreateCounter(series.Name(metricMailboxRejections, "kind", k.String())),
			panics:   set.GetOrCreateCounter(series.Name(metricActorPanics, "kind", k.String())),
		}
	}
	return c
}

// Rejected is the number of messages refused by a full (or stopped) mailbox of kind k. A
// refused command was answered with OutcomeOverloaded (or OutcomeInternal when stopped); a
// refused event (a load report, an index write) was dropped.
func (c *Counters) Rejected(k Kind) uint64 { return c.kinds[k].rejected.Get() }

// Panics is the number of panics recovered in actors of kind k (each failed one command and
// restarted the actor).
func (c *Counters) Panics(k Kind) uint64 { return c.kinds[k].panics.Get() }

// rejecter is a message that expects a reply. A mailbox that cannot accept it answers it at
// once with err instead of blocking or dropping it. reject is called at most once per
// message, on the sender's goroutine.
type rejecter interface {
	reject(err *engine.PickError)
}

// host owns the goroutines of a set of mailboxes.
type host struct {
	mu        sync.Mutex
	mailboxes map[*mailbox]struct{} // running ones: a mailbox leaves when its goroutine ends
	down      bool
	wg        sync.WaitGroup
}

func newHost() *host { return &host{mailboxes: map[*mailbox]struct{}{}} }

// start runs m's goroutine, or closes m at once when the host is shut down.
func (h *host) start(m *mailbox) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down {
		m.close()
		return
	}
	h.mailboxes[m] = struct{}{}
	h.wg.Add(1)
	go m.loop()
}

// done forgets m once its goroutine has ended (a grain that stopped).
func (h *host) done(m *mailbox) {
	h.mu.Lock()
	delete(h.mailboxes, m)
	h.mu.Unlock()
	h.wg.Done()
}

// shutdown closes every mailbox (refusing what is queued) and waits for their goroutines.
func (h *host) shutdown() {
	h.mu.Lock()
	h.down = true
	mbs := make([]*mailbox, 0, len(h.mailboxes))
	for m := range h.mailboxes {
		mbs = append(mbs, m)
	}
	h.mu.Unlock()
	for _, m := range mbs {
		m.close()
	}
	h.wg.Wait()
}

// wakeToken is queued in a mailbox's user channel to wake its goroutine for a system message
// or close; it is never delivered to the actor.
type wakeToken struct{}

// mailbox is a bounded actor.Mailbox that rejects fast. The user queue holds at most the
// configured number of messages (counted in queued): PostUserMessage never blocks; when
// the queue is full the message is refused, counted, and — when it is a rejecter — answered
// at once with the mailbox's overloaded error. System messages (start, stop, restart,
// supervision) are never refused.
//
// Each mailbox runs one goroutine for its actor's lifetime (started by Start, owned by its
// host) instead of scheduling a goroutine per burst through the props dispatcher: a parked
// goroutine woken by a direct channel hand-off costs less than spawning one per burst, and
// the mailbox needs no idle/running handshake. The goroutine blocks on the user channel
// alone (a plain receive, not a select); a system message wakes it with a wakeToken, which
// has a channel slot of its own and does not count toward the size. The dispatcher handed
// to RegisterHandlers is not used.
type mailbox struct {
	user         chan any // capacity size+1: size messages and one wakeToken
	size         int32
	queued       atomic.Int32  // user messages in user (not the token)
	wake         chan struct{} // capacity 1: wakes the goroutine while suspended
	tokenPending atomic.Bool   // a wakeToken is (being) queued in user

	sysMu sync.Mutex
	sys   []any
	sysN  atomic.Int32

	closed atomic.Bool

	invoker    actor.MessageInvoker
	host       *host
	counters   *kindCounters
	overloaded *engine.PickError // answer to a rejecter refused for a full queue
	stopped    *engine.PickError // answer to a rejecter refused after the actor stopped

	// owned by the mailbox goroutine
	suspended bool
	held      any // a user message received while a system message was pending
}

var _ actor.Mailbox = (*mailbox)(nil)

// newMailbox returns a mailbox of size messages (at least 1) owned by h.
func newMailbox(size int, h *host, c *kindCounters, overloaded, stopped *engine.PickError) *mailbox {
	return &mailbox{
		user:       make(chan any, max(size, 1)+1),
		size:       int32(max(size, 1)),
		wake:       make(chan struct{}, 1),
		host:       h,
		counters:   c,
		overloaded: overloaded,
		stopped:    stopped,
	}
}

// producer returns a MailboxProducer handing out m (one actor, one mailbox).
func (m *mailbox) producer() actor.MailboxProducer {
	return func() actor.Mailbox { return m }
}

// PostUserMessage implements actor.Mailbox. Fast path: one non-blocking channel send.
func (m *mailbox) PostUserMessage(msg any) {
	if m.closed.Load() {
		m.refuse(msg, m.stopped)
		return
	}
	if m.queued.Add(1) > m.size {
		// Slow path: the queue is full.
		m.queued.Add(-1)
		m.refuse(msg, m.overloaded)
		return
	}
	m.user <- msg // never blocks: at most size messages and one token are queued
	if m.closed.Load() {
		// close ran between the check and the send; its drain may have missed msg.
		m.drain()
	}
}

// refuse counts a refused message and answers it when it expects a reply.
func (m *mailbox) refuse(msg any, err *engine.PickError) {
	if _, ok := msg.(wakeToken); ok {
		return
	}
	m.counters.rejected.Inc()
	if env, ok := msg.(*actor.MessageEnvelope); ok {
		msg = env.Message
	}
	if r, ok := msg.(rejecter); ok {
		r.reject(err)
	}
}

// PostSystemMessage implements actor.Mailbox. It never blocks and never refuses.
func (m *mailbox) PostSystemMessage(msg any) {
	m.sysMu.Lock()
	m.sys = append(m.sys, msg)
	m.sysMu.Unlock()
	m.sysN.Add(1)
	m.signal()
}

// signal wakes the mailbox goroutine after sysN or closed changed. While one token is
// pending no other is queued; when the user queue is full the goroutine is busy and checks
// sysN and closed before and after every message anyway.
func (m *mailbox) signal() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
	if m.tokenPending.CompareAndSwap(false, true) {
		select {
		case m.user <- wakeToken{}:
		default:
			m.tokenPending.Store(false)
		}
	}
}

// mailboxOwner is an actor whose mailbox Proto.Actor makes (a cluster grain): the mailbox
// hands itself to the actor, which closes it when it stops.
type mailboxOwner interface {
	setMailbox(*mailbox)
}

// RegisterHandlers implements actor.Mailbox. The dispatcher is not used (see mailbox).
// Proto.Actor calls it once per spawn, after making the actor and this mailbox and before
// Start: the mailbox hands itself to an actor that is a mailboxOwner here, so that each
// actor gets its own mailbox whatever the order in which the producers ran.
func (m *mailbox) RegisterHandlers(invoker actor.MessageInvoker, _ actor.Dispatcher) {
	m.invoker = invoker
	if ctx, ok := invoker.(actor.Context); ok {
		if o, ok := ctx.Actor().(mailboxOwner); ok {
			o.setMailbox(m)
		}
	}
}

// Start implements actor.Mailbox: it starts the mailbox goroutine.
func (m *mailbox) Start() { m.host.start(m) }

// UserMessageCount implements actor.Mailbox.
func (m *mailbox) UserMessageCount() int { return int(m.queued.Load()) }

// close refuses every queued and future user message with the stopped error and ends the
// mailbox goroutine. The actor calls it when it has stopped; the host on shutdown.
func (m *mailbox) close() {
	m.closed.Store(true)
	m.drain()
	m.signal()
}

// drain refuses every queued user message with the stopped error.
func (m *mailbox) drain() {
	for {
		select {
		case msg := <-m.user:
			if _, ok := msg.(wakeToken); !ok {
				m.queued.Add(-1)
			}
			m.refuse(msg, m.stopped)
		default:
			return
		}
	}
}

func (m *mailbox) loop() {
	defer m.host.done(m)
	for m.run() {
	}
	if m.held != nil {
		m.refuse(m.held, m.stopped)
		m.held = nil
	}
	m.drain()
}

// run processes messages until the mailbox closes (false), or an actor panics (true: the
// failure was escalated and run is called again). System messages take priority: one
// posted before a user message is always handled before it.
func (m *mailbox) run() (again bool) {
	var msg any
	defer func() {
		if r := recover(); r != nil {
			m.invoker.EscalateFailure(r, msg)
			again = true
		}
	}()
	for {
		if m.sysN.Load() > 0 {
			msg = m.popSystem()
			switch msg.(type) {
			case *actor.SuspendMailbox:
				m.suspended = true
			case *actor.ResumeMailbox:
				m.suspended = false
			default:
				m.invoker.InvokeSystemMessage(msg)
			}
			continue
		}
		if m.closed.Load() {
			return false
		}
		if m.suspended {
			<-m.wake
			continue
		}
		if msg = m.held; msg != nil {
			m.held = nil
			m.invoker.InvokeUserMessage(msg)
			continue
		}
		msg = <-m.user
		if _, ok := msg.(wakeToken); ok {
			m.tokenPending.Store(false)
			continue
		}
		m.queued.Add(-1)
		if m.sysN.Load() > 0 {
			// A system message was posted before msg: handle it first.
			m.held = msg
			continue
		}
		m.invoker.InvokeUserMessage(msg)
	}
}

func (m *mailbox) popSystem() any {
	m.sysMu.Lock()
	msg := m.sys[0]
	m.sys[0] = nil
	m.sys = m.sys[1:]
	if len(m.sys) == 0 {
		m.sys = m.sys[:0:0]
	}
	m.sysMu.Unlock()
	m.sysN.Add(-1)
	return msg
}
