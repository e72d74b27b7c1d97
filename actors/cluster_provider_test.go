package actors

import (
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/cluster"
)

// startMonitor runs p's poll loop, handing each topology to the returned channel.
func startMonitor(p *memberProvider) <-chan cluster.Members {
	updates := make(chan cluster.Members, 16)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.monitor(func(m cluster.Members) { updates <- m })
	}()
	return updates
}

// nodeServer answers GET /_health with node n.
func nodeServer(t *testing.T, n providerNode) string {
	t.Helper()
	body, err := json.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/_health" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func loopbackListener(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// TestMemberProviderTopology: the members that answer with this cluster's name are the
// topology; another cluster's member, a member that answers garbage and one that is down
// are not.
func TestMemberProviderTopology(t *testing.T) {
	a := nodeServer(t, providerNode{ID: "a", Address: "127.0.0.1", Port: 7001, Kinds: []string{"k"}, ClusterName: "c"})
	b := nodeServer(t, providerNode{ID: "b", Address: "127.0.0.1", Port: 7002, Kinds: []string{"k"}, ClusterName: "c"})
	other := nodeServer(t, providerNode{ID: "x", Address: "127.0.0.1", Port: 7003, ClusterName: "other"})
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(strings.Repeat("[", 1<<20))) // beyond the read bound
	}))
	defer garbage.Close()
	downLn := loopbackListener(t)
	down := downLn.Addr().String()
	downLn.Close()

	p := newMemberProvider("c", []string{a, other, strings.TrimPrefix(garbage.URL, "http://"), down, b}, 0, time.Hour,
		loopbackListener(t), slog.New(slog.DiscardHandler))
	updates := startMonitor(p)
	var got cluster.Members
	select {
	case got = <-updates:
	case <-time.After(10 * time.Second):
		t.Fatal("no topology")
	}
	if err := p.Shutdown(true); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Id != "a" || got[1].Id != "b" || got[1].Port != 7002 || got[0].Kinds[0] != "k" {
		t.Fatalf("topology %v, want members a and b", got)
	}
}

// TestMemberProviderShutdownWaitsForItsPoll: Shutdown during a poll that a member leaves
// hanging cancels the poll and returns once the loop has ended, and no topology is handed
// on after it (Proto.Actor's provider could publish a departed member's termination after
// its Shutdown, into a remote whose endpoint manager was stopping: a panic).
func TestMemberProviderShutdownWaitsForItsPoll(t *testing.T) {
	a := nodeServer(t, providerNode{ID: "a", Address: "127.0.0.1", Port: 7001, ClusterName: "c"})
	hang := loopbackListener(t)
	defer hang.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		for {
			c, err := hang.Accept()
			if err != nil {
				return
			}
			accepted <- c // held open, never answered
		}
	}()
	p := newMemberProvider("c", []string{a, hang.Addr().String()}, 0, time.Hour, loopbackListener(t), slog.New(slog.DiscardHandler))
	updates := startMonitor(p)
	var conn net.Conn
	select {
	case conn = <-accepted: // the first poll waits for the hanging member
	case <-time.After(10 * time.Second):
		t.Fatal("the poll did not reach the hanging member")
	}
	defer conn.Close()
	done := make(chan struct{})
	go func() {
		_ = p.Shutdown(true)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return while a poll hung")
	}
	select {
	case m := <-updates:
		t.Fatalf("a topology %v was handed on by a poll that Shutdown cut short", m)
	default:
	}
}
