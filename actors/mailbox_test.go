package actors

import (
	"errors"
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"switchyard/engine"
)

// probe is a test command that records how it was refused.
type probe struct {
	refused chan *engine.PickError
}

func newProbe() *probe { return &probe{refused: make(chan *engine.PickError, 1)} }

func (p *probe) reject(err *engine.PickError) { p.refused <- err }

// blockingActor signals entered and waits for release on every *probe it receives, then
// reports it on done.
type blockingActor struct {
	entered, release chan struct{}
	done             chan *probe
}

func (a *blockingActor) Receive(ctx actor.Context) {
	if p, ok := ctx.Message().(*probe); ok {
		a.entered <- struct{}{}
		<-a.release
		a.done <- p
	}
}

func TestMailboxRejectsFastWhenFull(t *testing.T) {
	own := NewSystem(SystemOptions{})
	defer own.Close()
	sys := own.sys
	h := newHost()
	kc := own.counters.kinds[KindGroup]
	overloaded := &engine.PickError{Outcome: engine.OutcomeOverloaded, Detail: "full"}
	stopped := &engine.PickError{Outcome: engine.OutcomeInternal, Detail: "stopped", Err: ErrStopped}
	const size = 2
	mb := newMailbox(size, h, &kc, overloaded, stopped)
	a := &blockingActor{entered: make(chan struct{}, 8), release: make(chan struct{}), done: make(chan *probe, 8)}
	pid, err := sys.Root.SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return a }, actor.WithMailbox(mb.producer())), "blocking")
	if err != nil {
		t.Fatal(err)
	}

	first := newProbe()
	sys.Root.Send(pid, first)
	<-a.entered // the actor holds first; the queue is empty
	queued := []*probe{newProbe(), newProbe()}
	for _, p := range queued {
		sys.Root.Send(pid, p)
	}
	if n := mb.UserMessageCount(); n != size {
		t.Fatalf("queued = %d, want %d", n, size)
	}

	// Full: a rejecter is answered at once, an event is dropped; both are counted.
	over := newProbe()
	sys.Root.Send(pid, over)
	select {
	case err := <-over.refused:
		if err != overloaded {
			t.Fatalf("refusal = %v, want the mailbox's overloaded error", err)
		}
	default:
		t.Fatal("a refused rejecter was not answered before Send returned")
	}
	sys.Root.Send(pid, &LoadReported{WorkerID: "W1"}) // not a rejecter
	if got := kc.rejected.Get(); got != 2 {
		t.Fatalf("rejected = %d, want 2", got)
	}

	close(a.release)
	for _, want := range append([]*probe{first}, queued...) {
		if got := <-a.done; got != want {
			t.Fatal("messages were not delivered in order")
		}
	}

	// Stopped: queued and later messages are refused with the stopped error.
	if err := sys.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
	mb.close() // what the Selector's actors do on Stopped
	late := newProbe()
	mb.PostUserMessage(late)
	if err := <-late.refused; !errors.Is(err, ErrStopped) {
		t.Fatalf("refusal after close = %v, want ErrStopped", err)
	}
	h.shutdown()
}

func TestKindNames(t *testing.T) {
	tests := []struct {
		kind Kind
		want string
	}{
		{KindBucket, "bucket"},
		{KindGroup, "group"},
		{KindTelemetry, "telemetry"},
		{Kind(200), "unknown"},
	}
	for _, tt := range tests {
		if got := tt.kind.String(); got != tt.want {
			t.Errorf("Kind(%d) = %q, want %q", tt.kind, got, tt.want)
		}
	}
}

// ownerActor is a mailboxOwner: it answers every *probe on reply and closes its own mailbox
// when it stops, as a partition grain does.
type ownerActor struct {
	mb    *mailbox
	reply chan *probe
}

func (a *ownerActor) setMailbox(mb *mailbox) { a.mb = mb }

func (a *ownerActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *probe:
		a.reply <- m
	case *actor.Stopped:
		a.mb.close()
	}
}

// TestMailboxHandsItselfToItsActor: when Proto.Actor makes the mailboxes (a cluster kind's
// props spawn every grain), each actor gets the mailbox made for it, so one that stops
// closes its own mailbox and never another live actor's.
func TestMailboxHandsItselfToItsActor(t *testing.T) {
	own := NewSystem(SystemOptions{})
	defer own.Close()
	h := newHost()
	defer h.shutdown()
	kc := own.counters.kinds[KindPartition]
	stopped := &engine.PickError{Outcome: engine.OutcomeInternal, Detail: "stopped", Err: ErrStopped}
	var made []*ownerActor
	props := actor.PropsFromProducer(func() actor.Actor {
		a := &ownerActor{reply: make(chan *probe, 1)}
		made = append(made, a) // spawns run one at a time on this goroutine
		return a
	}, actor.WithMailbox(func() actor.Mailbox {
		return newMailbox(4, h, &kc, &engine.PickError{Outcome: engine.OutcomeOverloaded}, stopped)
	}))
	var pids []*actor.PID
	for range 3 {
		pids = append(pids, own.sys.Root.SpawnPrefix(props, "owner"))
	}
	for i, a := range made {
		if a.mb == nil {
			t.Fatalf("actor %d got no mailbox", i)
		}
		for j := range i {
			if made[j].mb == a.mb {
				t.Fatalf("actors %d and %d share a mailbox", j, i)
			}
		}
	}
	// The first stops and closes its mailbox; the others still answer.
	if err := own.sys.Root.StopFuture(pids[0]).Wait(); err != nil {
		t.Fatal(err)
	}
	for i, pid := range pids[1:] {
		p := newProbe()
		own.sys.Root.Send(pid, p)
		select {
		case got := <-made[i+1].reply:
			if got != p {
				t.Fatalf("actor %d answered another probe", i+1)
			}
		case err := <-p.refused:
			t.Fatalf("actor %d refused a probe after actor 0 stopped: %v", i+1, err)
		}
	}
}
