//go:build !race

// Without the race detector, as the in-process cluster tests (cluster_test.go): the remote
// it starts races inside Proto.Actor (grpclog's global logger).

package actors

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
)

// TestRemoteShutdownWithEndpointEventInFlight: a peer that disconnects as this replica shuts
// down (two replicas of a scaled-down deployment stopping together) has its endpoint's
// terminated event published while the remote stops. The event reaches the endpoint
// manager after it stopped. Proto.Actor's endpoint manager dropped its endpoint table when it
// stopped and the late event dereferenced it: a nil-pointer panic on the publishing goroutine,
// in the router an endpoint writer's, which ends the process (CI saw it when members of the
// in-process cluster tests closed together). third_party/protoactor-go keeps the table.
func TestRemoteShutdownWithEndpointEventInFlight(t *testing.T) {
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	const peer = "127.0.0.1:1" // never dialled: the event only names it
	var once sync.Once
	entered, release := make(chan struct{}), make(chan struct{})
	// Subscribed before the remote starts, so it runs before the endpoint manager's handler
	// in the same publication: the publication is held between its two handlers.
	sub := sys.EventStream.SubscribeWithPredicate(func(any) {
		once.Do(func() { close(entered) })
		<-release
	}, func(m any) bool {
		ev, ok := m.(*remote.EndpointTerminatedEvent)
		return ok && ev.Address == peer
	})
	defer sys.EventStream.Unsubscribe(sub)
	r := remote.NewRemote(sys, remote.Configure("127.0.0.1", 0))
	r.Start()

	published := make(chan any, 1)
	go func() {
		defer func() { published <- recover() }()
		sys.EventStream.Publish(&remote.EndpointTerminatedEvent{Address: peer})
	}()
	<-entered
	r.Shutdown(true)
	close(release)
	if p := <-published; p != nil {
		t.Fatalf("an endpoint event published across the remote's shutdown panicked: %v", p)
	}
	// A message for a remote actor sent after the shutdown goes to the dead letters.
	sys.Root.Send(actor.NewPID(peer, "someone"), "late")
}

// TestRemoteShutdownIsPromptWithASilentPeer: a peer whose packets are dropped (its host gone,
// a firewall) accepts nothing and answers nothing; an endpoint writer connecting to it waits
// for the connection's handshake, 20 s by default. The remote's shutdown waits for its
// writers, so a router stopping beside such a peer took that long. The writer's connection
// attempt ends when the remote shuts down. The silent peer here accepts connections and never
// answers them, which holds the handshake the same way.
func TestRemoteShutdownIsPromptWithASilentPeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c // held open, never answered
		}
	}()
	defer func() {
		ln.Close()
		for c := range accepted {
			c.Close()
		}
	}()

	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	r := remote.NewRemote(sys, remote.Configure("127.0.0.1", 0))
	r.Start()
	sys.Root.Send(actor.NewPID(ln.Addr().String(), "someone"), "hello")
	// The writer is connecting once the peer accepted its connection.
	var held net.Conn
	select {
	case held = <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("the endpoint writer never connected to the silent peer")
	}
	defer held.Close()
	start := time.Now()
	r.Shutdown(true)
	d := time.Since(start)
	t.Logf("shut down in %v", d)
	if d > 2*time.Second {
		t.Fatalf("shutting down beside a silent peer took %v, want at most 2s", d)
	}
}
