package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"switchyard/bench/mockengine"
)

// clusterWait bounds each wait of the multi-process cluster test.
const clusterWait = 60 * time.Second

// replica is one router process of the test cluster.
type replica struct {
	cmd    *exec.Cmd
	base   string
	stderr *bytes.Buffer
	done   chan error
}

// reservePorts returns n loopback ports the OS chose (the automanaged provider needs every
// replica's port before any starts).
func reservePorts(t *testing.T, n int) []int {
	t.Helper()
	var lns []net.Listener
	var out []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		_ = ln.Close()
	}
	return out
}

// startReplicas starts n router processes forming one automanaged cluster in front of the
// engines (session_aware with affinity.prefix_rebind, every engine a plain worker), and
// waits until every replica is ready, sees n members and indexes every engine's KV events.
// Every process is killed when the test ends.
func startReplicas(t *testing.T, bin string, n int, engines []*mockengine.Engine) []*replica {
	t.Helper()
	ports := reservePorts(t, 3*n) // HTTP, provider
	var members []string
	for i := range n {
		members = append(members, fmt.Sprintf("127.0.0.1:%d", ports[n+i]))
	}
	var workers, ids strings.Builder
	for _, e := range engines {
		fmt.Fprintf(&workers, "  - {id: %s, url: %q, model: %s, role: plain, dp_size: 1}\n", e.WorkerID(), e.URL(), affModel)
		fmt.Fprintf(&ids, "%s, ", e.WorkerID())
	}
	rs := make([]*replica, n)
	for i := range n {
		cfg := fmt.Sprintf(`server: {host: 127.0.0.1, port: %d, drain_timeout: 10s}
workers:
%smodels:
  %s:
    buckets:
      - id: all
        groups: {plain: {worker_ids: [%s], policy: {type: session_aware}}}
health: {interval: 1h}
log: {level: info}
affinity: {prefix_rebind: true}
cache_aware: {min_matched_tokens: 64, query_timeout: 10s}
cluster:
  enabled: true
  name: e2e
  listen: 127.0.0.1:0
  provider: automanaged
  provider_port: %d
  members: [%s]
  partitions: 32
  refresh_interval: 200ms
  gossip_interval: 50ms
  request_timeout: 500ms
  handoff_timeout: 20s
`, ports[i], workers.String(), affModel, strings.TrimSuffix(ids.String(), ", "), ports[n+i], strings.Join(members, ", "))
		path := filepath.Join(t.TempDir(), "switchyard.yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		r := &replica{base: fmt.Sprintf("http://127.0.0.1:%d", ports[i]), stderr: new(bytes.Buffer), done: make(chan error, 1)}
		r.cmd = exec.Command(bin, "serve", "--config", path)
		r.cmd.Stdout = io.Discard
		r.cmd.Stderr = &syncWriter{w: r.stderr}
		if err := r.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { r.done <- r.cmd.Wait() }()
		rs[i] = r
	}
	t.Cleanup(func() {
		for i, r := range rs {
			if r.cmd.ProcessState == nil {
				_ = r.cmd.Process.Kill()
				<-r.done
			}
			if t.Failed() {
				t.Logf("replica %d stderr (tail):\n%s", i, tail(r.stderr.String(), 3000))
			}
		}
	})
	for i, r := range rs {
		waitUntil(t, fmt.Sprintf("replica %d sees %d members", i, n), func() bool {
			return metricOf(r.base, "switchyard_cluster_members") == float64(n)
		})
	}
	// A KV-event subscriber misses what engines publish before it has joined: warm every
	// subscription up with requests straight to the engines until each replica's index
	// has every engine.
	for k := 0; ; k++ {
		all := true
		for _, r := range rs {
			all = all && metricOf(r.base, "switchyard_kv_index_owners") == float64(len(engines))
		}
		if all {
			break
		}
		if k > 500 {
			t.Fatal("the replicas' indexes never saw every engine's KV events")
		}
		for _, e := range engines {
			affChat(context.Background(), t, e.URL(), "", []affMessage{{Role: "user", Content: fmt.Sprintf("warm-up %d of %s", k, e.WorkerID())}})
		}
		pause(20 * time.Millisecond)
	}
	return rs
}

// kvEngine starts a mock engine of model answering at once that publishes its KV events.
func kvEngine(t *testing.T, model, id string) *mockengine.Engine {
	t.Helper()
	e, err := mockengine.Start(context.Background(), mockengine.Config{
		WorkerID: id, Model: model, ZeroCost: true, CacheTokens: 1 << 16,
		KVEvents: mockengine.KVEvents{Replay: true}, LoadPublish: mockengine.LoadPublish{Disabled: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// syncWriter serializes writes to w (the process's stderr copier and the test's reads).
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// metricOf reads one series from base's /metrics, or -1.
func metricOf(base, series string) float64 {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f
			}
		}
	}
	return -1
}

// waitUntil polls cond (it reads other processes' state over HTTP) until it holds, for at
// most clusterWait.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(clusterWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, clusterWait)
		}
		pause(20 * time.Millisecond)
	}
}

// TestClusterReplicasShareSessions runs three router processes as one cluster: turns of
// each session sent to random replicas all land on the session's engine. After a SIGKILL of
// one replica, whose partitions' bindings are lost, every turn sent at once (before the
// membership notices) is answered, and at least 90% of the sessions return to
// their engine (affinity.prefix_rebind binds them again to the engine caching their
// conversation); a replica then stopped with SIGTERM hands its bindings over (no session
// moves, no client error).
func TestClusterReplicasShareSessions(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs three processes")
	}
	bin := switchyardBinary(t)
	engines := []*mockengine.Engine{kvEngine(t, affModel, "E0"), kvEngine(t, affModel, "E1"), kvEngine(t, affModel, "E2"), kvEngine(t, affModel, "E3")}
	rs := startReplicas(t, bin, 3, engines)
	ctx, cancel := context.WithTimeout(context.Background(), 2*clusterWait)
	defer cancel()
	rng := rand.New(rand.NewPCG(7, 7))
	const sessions = 24
	engineOf := map[string]string{}
	history := map[string][]affMessage{}
	// turn sends one turn of session s to replica r and reports whether it left the
	// session's engine.
	turn := func(s string, r *replica) (moved bool) {
		t.Helper()
		if history[s] == nil {
			// Each session's conversation is its own from the first token: sessions share
			// no cached prefix, so prefix_rebind cannot pile them onto one engine.
			history[s] = []affMessage{{Role: "system", Content: s + strings.Repeat(" is a conversation of its own, session "+s+".", 8)}}
		}
		history[s] = append(history[s], userTurn(len(history[s])))
		rep := affChat(ctx, t, r.base, s, history[s])
		history[s] = append(history[s], affMessage{Role: "assistant", Content: rep.content})
		if prev, ok := engineOf[s]; ok && prev != rep.worker {
			engineOf[s] = rep.worker
			return true
		}
		engineOf[s] = rep.worker
		return false
	}
	live := rs
	for range 3 {
		for k := range sessions {
			if turn(fmt.Sprintf("s%d", k), live[rng.IntN(len(live))]) {
				t.Fatalf("session s%d moved to another engine with every replica up", k)
			}
		}
	}
	used := map[string]int{}
	for _, e := range engineOf {
		used[e]++
	}
	if len(used) < 3 {
		t.Fatalf("sessions by engine %v: want them spread over the engines", used)
	}

	// Crash: SIGKILL replica 1. Once the survivors see it gone, its partitions re-activate
	// empty on them, and each session whose binding was lost is bound again to the engine
	// holding its conversation.
	if err := rs[1].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-rs[1].done
	live = []*replica{rs[0], rs[2]}
	// The next turns go out at once, before the membership provider notices: a request
	// whose partition the crashed replica owned is retried on the next owner in time.
	moved := 0
	for k := range sessions {
		if turn(fmt.Sprintf("s%d", k), live[rng.IntN(len(live))]) {
			moved++
		}
	}
	rebound := metricOf(rs[0].base, `switchyard_selections_total{model="`+affModel+`",bucket="all",group="plain",policy="session_aware",reason="prefix_holder"}`) +
		metricOf(rs[2].base, `switchyard_selections_total{model="`+affModel+`",bucket="all",group="plain",policy="session_aware",reason="prefix_holder"}`)
	t.Logf("after the crash of one replica of 3: %d of %d sessions moved engine (%.0f%% returned); %v bindings re-created on the prefix holder",
		moved, sessions, 100*float64(sessions-moved)/sessions, rebound)
	if moved*10 > sessions {
		t.Fatalf("%d of %d sessions moved engine after the crash; want at least 90%% back on their engine", moved, sessions)
	}
	for i, r := range live {
		waitUntil(t, fmt.Sprintf("survivor %d sees the crash", i), func() bool { return metricOf(r.base, "switchyard_cluster_members") == 2 })
	}
	for k := range sessions {
		if turn(fmt.Sprintf("s%d", k), live[rng.IntN(len(live))]) {
			t.Fatalf("session s%d moved again after its binding was re-created", k)
		}
	}

	// Graceful stop: SIGTERM replica 2, then traffic to replica 0 only. No binding is lost.
	if err := rs[2].cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-rs[2].done:
		if err != nil {
			t.Fatalf("replica 2 exited with %v after SIGTERM", err)
		}
	case <-time.After(clusterWait):
		t.Fatal("replica 2 did not stop after SIGTERM")
	}
	if !strings.Contains(rs[2].stderr.String(), "bindings handed off") {
		t.Fatalf("replica 2 did not report its hand-off:\n%s", tail(rs[2].stderr.String(), 2000))
	}
	for range 2 {
		for k := range sessions {
			if turn(fmt.Sprintf("s%d", k), rs[0]) {
				t.Fatalf("session s%d lost its binding after a graceful stop", k)
			}
		}
	}
}
