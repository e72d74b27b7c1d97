//go:build !race

// The in-process cluster tests run without the race detector: Proto.Actor's cluster
// (v0.0.0-20240822202345, the newest the module proxy serves) races inside itself (gossip
// state, block list, member list, endpoint shutdown, the etcd provider, grpclog's global
// logger), and the detector fails any test that starts a member. make test runs them in a
// separate step; docs/cluster.md (Testing) lists the races with their stack locations.

package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/cluster"

	"switchyard/actors/clusterpb"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/load"
	"switchyard/load/series/seriestest"
)

// clusterWait bounds every wait of the cluster tests on membership and gossip.
const clusterWait = 20 * time.Second

// clusterRequestTimeout is the cluster tests' cluster.request_timeout, a bound on failures
// most tests do not cause. A request's first attempt has half of it before the request is
// retried on the partition's next owner (a slow owner is taken for a hung one), and a
// partition's first use (its activation over a new connection) took more than 0.5 s on a
// loaded two-core host: then a bind lands on the next owner, or a request fails, and a test
// of something else sees a binding where it does not expect one. The tests of the request
// timeout itself set a shorter one.
const clusterRequestTimeout = 10 * time.Second

// freePorts returns n TCP ports the OS chose on loopback (the automanaged provider needs
// every member's port before any starts).
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var out []int
	var lns []net.Listener
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

// testMember is one in-process replica: its System, Cluster, and a channel that ticks on
// every topology or gossip event it sees.
type testMember struct {
	sys      *System
	cl       *Cluster
	events   chan struct{}
	counters map[string]*load.Counters
	changes  chan WorkerChange
	closed   bool
	tweak    func(*config.Cluster) // changes the member's configuration (nil: none)
	// ready and ticks are the member's ClusterOptions.Ready and Ticks (nil: the defaults);
	// countersRead counts the calls of its Counters callback.
	ready        chan struct{}
	ticks        chan time.Time
	countersRead atomic.Int64
}

func testClusterConfig(ports []int, i int) config.Cluster {
	cfg := config.Default().Cluster
	cfg.Enabled = true
	cfg.Name = fmt.Sprintf("test-%d", ports[0])
	cfg.ProviderPort = ports[i]
	for _, p := range ports {
		cfg.Members = append(cfg.Members, fmt.Sprintf("127.0.0.1:%d", p))
	}
	cfg.Partitions = 16
	cfg.RefreshInterval = 100 * time.Millisecond
	cfg.GossipInterval = 20 * time.Millisecond
	cfg.RequestTimeout = clusterRequestTimeout
	cfg.HandoffTimeout = 5 * time.Second
	return cfg
}

// startMembers starts n members of one automanaged cluster concurrently and waits until
// each sees all of them. Every member is closed when the test ends.
func startMembers(t testing.TB, n int, workers ...string) []*testMember {
	t.Helper()
	return startMembersWith(t, n, func(int) SystemOptions { return SystemOptions{} }, workers...)
}

// startMembersWith is startMembers with member i's actor system built from sysOpts(i).
func startMembersWith(t testing.TB, n int, sysOpts func(i int) SystemOptions, workers ...string) []*testMember {
	t.Helper()
	return startMembersOf(t, freePorts(t, n), n, sysOpts, workers...)
}

// startMembersOf starts members 0..n-1 of the automanaged cluster whose member list is ports
// (a later member may join on one of the ports left) and waits until each sees n members.
func startMembersOf(t testing.TB, ports []int, n int, sysOpts func(i int) SystemOptions, workers ...string) []*testMember {
	t.Helper()
	return startMembersCfg(t, ports, n, sysOpts, nil, workers...)
}

// startMembersTweaked is startMembers with each member's configuration changed by tweak.
func startMembersTweaked(t testing.TB, n int, tweak func(*config.Cluster), workers ...string) []*testMember {
	t.Helper()
	return startMembersCfg(t, freePorts(t, n), n, func(int) SystemOptions { return SystemOptions{} }, tweak, workers...)
}

// startMembersCfg is startMembersOf with each member's configuration changed by tweak (nil:
// none).
func startMembersCfg(t testing.TB, ports []int, n int, sysOpts func(i int) SystemOptions, tweak func(*config.Cluster), workers ...string) []*testMember {
	t.Helper()
	ms := make([]*testMember, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		ms[i] = newTestMember(sysOpts(i), workers)
		ms[i].tweak = tweak
		wg.Go(func() { errs[i] = ms[i].start(ports, i) })
	}
	wg.Wait()
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, m := range ms {
			wg.Go(m.close)
		}
		wg.Wait()
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	for i, m := range ms {
		m.waitFor(t, fmt.Sprintf("member %d sees %d members", i, n), func() bool { return m.placed(n) })
	}
	return ms
}

// placed reports whether m sees n members and has placed the partitions over them (the
// placement is recomputed after the member list changes).
func (m *testMember) placed(n int) bool {
	pl := m.cl.placement.Load()
	return len(m.cl.Members()) == n && pl != nil && pl.n == n
}

// newTestMember builds a member's actor system; start joins it to the cluster.
func newTestMember(opts SystemOptions, workers []string) *testMember {
	m := &testMember{events: make(chan struct{}, 1), counters: map[string]*load.Counters{}, changes: make(chan WorkerChange, 64)}
	for _, w := range workers {
		m.counters[w] = new(load.Counters)
	}
	m.sys = NewSystem(opts)
	m.sys.sys.EventStream.Subscribe(func(evt any) {
		switch evt.(type) {
		case *cluster.ClusterTopology, *cluster.GossipUpdate:
			select {
			case m.events <- struct{}{}:
			default:
			}
		}
	})
	return m
}

// start makes m member i of the cluster whose member list is ports.
func (m *testMember) start(ports []int, i int) (err error) {
	cfg := testClusterConfig(ports, i)
	if m.tweak != nil {
		m.tweak(&cfg)
	}
	opts := ClusterOptions{
		Counters: func() map[string]CountersOf {
			m.countersRead.Add(1)
			out := map[string]CountersOf{}
			for id, c := range m.counters {
				out[id] = c
			}
			return out
		},
		OnWorkerChange: func(wc WorkerChange) { m.changes <- wc },
	}
	if m.ready != nil {
		opts.Ready = m.ready
	}
	if m.ticks != nil {
		opts.Ticks = m.ticks
	}
	m.cl, err = NewCluster(m.sys, cfg, opts)
	return err
}

func (m *testMember) close() {
	if m.closed {
		return
	}
	m.closed = true
	if m.cl != nil {
		m.cl.Close()
	}
	m.sys.Close()
}

// waitFor waits until cond holds, re-checking it on every topology or gossip event the
// member sees (and at least every 50ms, as some conditions follow a provider's poll).
func (m *testMember) waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(clusterWait)
	defer deadline.Stop()
	recheck := time.NewTicker(50 * time.Millisecond)
	defer recheck.Stop()
	for !cond() {
		select {
		case <-m.events:
		case <-recheck.C:
		case <-deadline.C:
			t.Fatalf("%s: not within %v", what, clusterWait)
		}
	}
}

var clusterScope = engine.AffinityScope{Model: testModel, BucketID: "b", Stage: engine.StagePlain}

func TestClusterMembersAgreeOnBindings(t *testing.T) {
	ms := startMembers(t, 3)
	now := time.Now()
	const keys = 64
	for k := range keys {
		key := fmt.Sprintf("session-%d", k)
		w, set, err := ms[k%3].cl.Bind(clusterScope, key, "", fmt.Sprintf("W%d", k%5), now)
		if err != nil || !set {
			t.Fatalf("bind %s: %q %v %v", key, w, set, err)
		}
	}
	for i, m := range ms {
		for k := range keys {
			key := fmt.Sprintf("session-%d", k)
			got, err := m.cl.Lookup(clusterScope, key, now)
			if err != nil || got != fmt.Sprintf("W%d", k%5) {
				t.Fatalf("member %d: lookup %s = %q, %v", i, key, got, err)
			}
		}
	}
	// A compare-and-set from another replica sees the binding in force.
	if w, set, err := ms[1].cl.Bind(clusterScope, "session-0", "", "W9", now); err != nil || set || w != "W0" {
		t.Fatalf("conflicting bind = %q, %v, %v; want the binding in force W0", w, set, err)
	}
	// Each member asked locally exactly when it owns a key's partition, and remotely when
	// another member does. Which member owns which partition follows the members' random IDs,
	// so a member may own none of the keys' partitions (16 partitions over 3 members).
	mixed := false
	for i, m := range ms {
		pl := m.cl.placement.Load()
		owns, others := false, false
		for k := range keys {
			if pl.owners[m.cl.partitionOf(fmt.Sprintf("session-%d", k))] == pl.self {
				owns = true
			} else {
				others = true
			}
		}
		local, remote := m.cl.lookups.Get(), m.cl.remote.Get()
		if (local > 0) != owns || (remote > 0) != others {
			t.Errorf("member %d made %d local and %d remote requests; owns a key's partition %v, another member does %v",
				i, local, remote, owns, others)
		}
		mixed = mixed || (owns && others)
	}
	if !mixed {
		t.Log("no member owned some but not all of the keys' partitions")
	}
	// Every remote request is timed: the latency histogram's count is the member's remote
	// requests, exposed until the member closes.
	for i, m := range ms {
		lines := seriestest.FamilyLines(m.sys.set, metricClusterRemoteLatency)
		if want := fmt.Sprintf("%s_count %d\n", metricClusterRemoteLatency, m.cl.remote.Get()); !strings.HasSuffix(lines, want) {
			t.Errorf("member %d: remote latency series end %q, want %q", i, lines[max(0, len(lines)-80):], want)
		}
	}
	ms[0].close()
	if lines := seriestest.FamilyLines(ms[0].sys.set, metricClusterRemoteLatency); lines != "" {
		t.Errorf("a closed member still exposes its remote latency:\n%s", lines)
	}
}

func TestClusterConcurrentFirstBindsConverge(t *testing.T) {
	ms := startMembers(t, 2)
	now := time.Now()
	for k := range 20 {
		key := fmt.Sprintf("race-%d", k)
		var sets atomic.Int32
		got := make([]string, 2)
		var wg sync.WaitGroup
		for i, m := range ms {
			wg.Go(func() {
				w, set, err := m.cl.Bind(clusterScope, key, "", fmt.Sprintf("M%d", i), now)
				if err != nil {
					t.Error(err)
				}
				if set {
					sets.Add(1)
				}
				got[i] = w
			})
		}
		wg.Wait()
		if sets.Load() != 1 || got[0] != got[1] {
			t.Fatalf("%s: %d binds set, members see %q; want exactly one winner both see", key, sets.Load(), got)
		}
	}
}

func TestClusterGracefulLeaveLosesNoBinding(t *testing.T) {
	ms := startMembers(t, 3)
	now := time.Now()
	const keys = 200
	for k := range keys {
		if _, _, err := ms[0].cl.Bind(clusterScope, fmt.Sprintf("s%d", k), "", fmt.Sprintf("W%d", k%7), now); err != nil {
			t.Fatal(err)
		}
	}
	leaver := ms[2]
	owned := 0
	for p := range leaver.cl.local {
		if leaver.cl.local[p].Load() != nil {
			owned++
		}
	}
	if owned == 0 {
		t.Fatal("the leaving member owns no partition; the test proves nothing")
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterWait)
	defer cancel()
	if err := leaver.cl.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	// While it is still a member, the survivors already route around it.
	for k := range keys {
		key := fmt.Sprintf("s%d", k)
		if got, err := ms[1].cl.Lookup(clusterScope, key, now); err != nil || got != fmt.Sprintf("W%d", k%7) {
			t.Fatalf("during the leave: lookup %s = %q, %v", key, got, err)
		}
	}
	leaver.close()
	for _, m := range ms[:2] {
		m.waitFor(t, "the survivors see 2 members", func() bool { return m.placed(2) })
	}
	lost := 0
	for k := range keys {
		key := fmt.Sprintf("s%d", k)
		for _, m := range ms[:2] {
			got, err := m.cl.Lookup(clusterScope, key, now)
			if err != nil {
				t.Fatalf("after the leave: %v", err)
			}
			if got != fmt.Sprintf("W%d", k%7) {
				lost++
			}
		}
	}
	if lost != 0 {
		t.Fatalf("%d lookups lost their binding after a graceful leave", lost)
	}
	if ms[0].cl.handedOff.Get()+ms[1].cl.handedOff.Get() == 0 {
		t.Fatal("no binding was handed off")
	}
}

// TestClusterJoinHandsMovedPartitionsOver: a member joining takes over some partitions; the
// grains that move hand their bindings to it, so every member still resolves every key to
// its binding.
func TestClusterJoinHandsMovedPartitionsOver(t *testing.T) {
	ports := freePorts(t, 3)
	ms := startMembersOf(t, ports, 2, func(int) SystemOptions { return SystemOptions{} })
	now := time.Now()
	const keys = 200
	for k := range keys {
		if _, _, err := ms[0].cl.Bind(clusterScope, fmt.Sprintf("j%d", k), "", fmt.Sprintf("W%d", k%7), now); err != nil {
			t.Fatal(err)
		}
	}
	joiner := newTestMember(SystemOptions{}, nil)
	t.Cleanup(joiner.close)
	if err := joiner.start(ports, 2); err != nil {
		t.Fatal(err)
	}
	all := append(ms, joiner)
	for i, m := range all {
		m.waitFor(t, fmt.Sprintf("member %d sees 3 members", i), func() bool { return m.placed(3) })
	}
	// The keys whose partition moved to the joiner, and the bindings it must adopt.
	pl := joiner.cl.placement.Load()
	moved := 0
	for k := range keys {
		if pl.owners[joiner.cl.partitionOf(fmt.Sprintf("j%d", k))] == pl.self {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("no partition moved to the joining member; the test proves nothing")
	}
	joiner.waitFor(t, fmt.Sprintf("the joiner adopts %d bindings", moved), func() bool {
		return joiner.cl.handedOff.Get() == uint64(moved)
	})
	for i, m := range all {
		for k := range keys {
			key := fmt.Sprintf("j%d", k)
			if got, err := m.cl.Lookup(clusterScope, key, now); err != nil || got != fmt.Sprintf("W%d", k%7) {
				p := m.cl.partitionOf(key)
				for j, o := range all {
					opl := o.cl.placement.Load()
					t.Logf("member %d (%s): owner of partition %d = %s, local grain %v, handedOff %d", j, opl.self, p, opl.owners[p], o.cl.local[p].Load() != nil, o.cl.handedOff.Get())
				}
				t.Fatalf("member %d after the join: lookup %s = %q, %v", i, key, got, err)
			}
		}
	}
}

func TestClusterCrashedOwnerPartitionsReactivate(t *testing.T) {
	ms := startMembers(t, 3)
	now := time.Now()
	for k := range 60 {
		if _, _, err := ms[0].cl.Bind(clusterScope, fmt.Sprintf("c%d", k), "", "W1", now); err != nil {
			t.Fatal(err)
		}
	}
	// Close without Leave: the member's grains stop with their bindings, as in a crash.
	ms[2].close()
	for _, m := range ms[:2] {
		m.waitFor(t, "the survivors see 2 members", func() bool { return m.placed(2) })
	}
	kept, missing := 0, 0
	for k := range 60 {
		key := fmt.Sprintf("c%d", k)
		got, err := ms[1].cl.Lookup(clusterScope, key, now)
		if err != nil {
			t.Fatalf("lookup after the crash: %v", err)
		}
		switch got {
		case "W1":
			kept++
		case "":
			missing++
			// The policy binds again on a miss: the partition is live on a survivor.
			if w, set, err := ms[0].cl.Bind(clusterScope, key, "", "W2", now); err != nil || !set || w != "W2" {
				t.Fatalf("rebind %s: %q %v %v", key, w, set, err)
			}
		}
	}
	if kept == 0 || missing == 0 {
		t.Fatalf("kept %d, missing %d: want the survivors' partitions kept and the crashed member's re-created empty", kept, missing)
	}
}

// TestClusterCloseIsPromptWithADeadPeer: a replica closing while a peer is gone (the replicas
// bench kills one router, then stops the others) stops within a second. Proto.Actor's
// endpoint writer to the dead peer retried its connection five times, two seconds apart,
// and the remote's stop waited for it; its graceful cluster shutdown then slept 2 s more.
func TestClusterCloseIsPromptWithADeadPeer(t *testing.T) {
	failed := make(chan struct{}, 1)
	logger := slog.New(&messageSignal{msg: "EndpointWriter failed to connect", signal: failed})
	ms := startMembersWith(t, 3, func(i int) SystemOptions {
		if i == 0 {
			return SystemOptions{Logger: logger}
		}
		return SystemOptions{}
	})
	// Member 2 dies: its remote stops answering, while its provider still lists it, so
	// member 0 keeps dialling it (as a killed router is listed until its health check fails).
	ms[2].cl.c.Remote.Shutdown(false)
	select {
	case <-failed:
	case <-time.After(clusterWait):
		t.Fatalf("member 0 never failed to connect to the dead member within %v", clusterWait)
	}
	start := time.Now()
	ms[0].close()
	d := time.Since(start)
	t.Logf("closed in %v", d)
	if d > time.Second {
		t.Fatalf("closing a member with a dead peer took %v, want at most 1s", d)
	}
}

// messageSignal is a slog handler that signals (without blocking) each record whose message
// is msg, and drops every record.
type messageSignal struct {
	msg    string
	signal chan struct{}
}

func (h *messageSignal) Enabled(context.Context, slog.Level) bool { return true }
func (h *messageSignal) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *messageSignal) WithGroup(string) slog.Handler            { return h }
func (h *messageSignal) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		select {
		case h.signal <- struct{}{}:
		default:
		}
	}
	return nil
}

func TestClusterSharesInflightCounts(t *testing.T) {
	ms := startMembers(t, 3, "W1", "W2")
	tracker := load.NewTracker()
	t0 := time.Now()
	g1 := tracker.Acquire(ms[0].counters["W1"], t0)
	g2 := tracker.Acquire(ms[1].counters["W1"], t0)
	g3 := tracker.Acquire(ms[1].counters["W2"], t0)
	ms[2].waitFor(t, "member 2 sees the fleet's in-flight requests", func() bool {
		return ms[2].counters["W1"].InFlight() == 2 && ms[2].counters["W2"].InFlight() == 1
	})
	if ms[2].counters["W1"].LocalInFlight() != 0 || ms[2].counters["W1"].Dispatched() != 2 {
		t.Fatalf("member 2: local %d, dispatched %d", ms[2].counters["W1"].LocalInFlight(), ms[2].counters["W1"].Dispatched())
	}
	ms[0].waitFor(t, "member 0 counts member 1's requests", func() bool { return ms[0].counters["W1"].InFlight() == 2 })
	g1.Release()
	g2.Release()
	g3.Release()
	ms[2].waitFor(t, "the fleet's requests finished", func() bool {
		return ms[2].counters["W1"].InFlight() == 0 && ms[2].counters["W2"].InFlight() == 0
	})
}

func TestClusterPropagatesWorkerChanges(t *testing.T) {
	ms := startMembers(t, 3)
	ms[0].cl.PublishWorkerChange("W7", false, []byte(`{"id":"W7","url":"http://127.0.0.1:1"}`))
	for i, m := range ms[1:] {
		select {
		case wc := <-m.changes:
			if wc.WorkerID != "W7" || wc.Removed || string(wc.Spec) != `{"id":"W7","url":"http://127.0.0.1:1"}` || wc.Origin != ms[0].cl.MemberID() {
				t.Fatalf("member %d applied %+v", i+1, wc)
			}
		case <-time.After(clusterWait):
			t.Fatalf("member %d never applied the change", i+1)
		}
	}
	// A later removal made on another replica wins everywhere.
	ms[2].cl.PublishWorkerChange("W7", true, nil)
	for _, m := range []*testMember{ms[0], ms[1]} {
		select {
		case wc := <-m.changes:
			if wc.WorkerID != "W7" || !wc.Removed {
				t.Fatalf("applied %+v, want the removal", wc)
			}
		case <-time.After(clusterWait):
			t.Fatal("the removal never arrived")
		}
	}
	select {
	case wc := <-ms[0].changes:
		t.Fatalf("the origin re-applied a change: %+v", wc)
	default:
	}
}

// TestClusterCallbacksWaitForReady: a replica whose owner is still being built (Ready open)
// calls neither Counters nor OnWorkerChange, however many gossip rounds run and whatever
// the other replicas gossip meanwhile; once Ready closes it applies what it learnt: the
// peers' counts and the worker changes. (The HTTP server joins the cluster while it builds
// its fleet, which both callbacks read.)
func TestClusterCallbacksWaitForReady(t *testing.T) {
	ports := freePorts(t, 2)
	a := newTestMember(SystemOptions{}, []string{"W1"})
	b := newTestMember(SystemOptions{}, []string{"W1"})
	b.ready, b.ticks = make(chan struct{}), make(chan time.Time)
	t.Cleanup(func() {
		var wg sync.WaitGroup
		wg.Go(a.close)
		wg.Go(b.close)
		wg.Wait()
	})
	errs := make([]error, 2)
	var wg sync.WaitGroup
	wg.Go(func() { errs[0] = a.start(ports, 0) })
	wg.Go(func() { errs[1] = b.start(ports, 1) })
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	for _, m := range []*testMember{a, b} {
		m.waitFor(t, "2 members", func() bool { return m.placed(2) })
	}

	g := load.NewTracker().Acquire(a.counters["W1"], time.Now())
	defer g.Release()
	a.cl.PublishWorkerChange("W7", false, []byte(`{"id":"W7","url":"http://127.0.0.1:1"}`))
	b.waitFor(t, "b learns a's counts and worker change", func() bool {
		b.cl.mu.Lock()
		defer b.cl.mu.Unlock()
		pc := b.cl.peers[a.cl.MemberID()]
		return pc != nil && pc.Workers["W1"].GetInflight() == 1 && b.cl.changes["W7"].WorkerID == "W7"
	})
	// Two rounds: the second tick is taken only once the first round is over.
	for range 2 {
		select {
		case b.ticks <- time.Now():
		case <-time.After(clusterWait):
			t.Fatal("b's gossip loop takes no tick")
		}
	}
	if n := b.countersRead.Load(); n != 0 {
		t.Fatalf("b read its owner's counters %d times before it was ready", n)
	}
	select {
	case wc := <-b.changes:
		t.Fatalf("b applied %+v before it was ready", wc)
	default:
	}
	if got := b.counters["W1"].InFlight(); got != 0 {
		t.Fatalf("b added a's counts to a counter before it was ready: in flight %d", got)
	}

	close(b.ready)
	select {
	case wc := <-b.changes:
		if wc.WorkerID != "W7" || wc.Removed {
			t.Fatalf("b applied %+v, want W7 added", wc)
		}
	case <-time.After(clusterWait):
		t.Fatal("b never applied the change it learnt before it was ready")
	}
	if got := b.counters["W1"].InFlight(); got != 1 {
		t.Fatalf("b's W1 in flight %d once ready, want a's 1", got)
	}
	if b.countersRead.Load() == 0 {
		t.Fatal("b never read its counters once ready")
	}
}

// TestClusterLocalOwnerAllocations: a lookup whose partition this member owns costs what the
// single-router store's does: no allocation (the grain's kind carries no cluster middleware,
// which would wrap every message in an envelope).
func TestClusterLocalOwnerAllocations(t *testing.T) {
	ms := startMembers(t, 2)
	now := time.Now()
	key, _ := keyOwnedByOneOf(t, ms[0], "alloc", ms[0])
	if _, set, err := ms[0].cl.Bind(clusterScope, key, "", "W1", now); err != nil || !set {
		t.Fatal(set, err)
	}
	before := ms[0].cl.lookups.Get()
	if n := testing.AllocsPerRun(1000, func() {
		if w, err := ms[0].cl.Lookup(clusterScope, key, now); err != nil || w != "W1" {
			t.Fatal(w, err)
		}
	}); n != 0 {
		t.Fatalf("local-owner lookup: %v allocs, want 0", n)
	}
	if ms[0].cl.lookups.Get() == before {
		t.Fatal("the lookups did not take the local path")
	}
}

// TestClusterRetriesOnTheNextOwnerWhenTheOwnerHangs: a partition owner that answers
// nothing (a crashed replica before the membership notices) costs the first attempt at most
// half of cluster.request_timeout; the retry on the partition's next owner answers within
// the same deadline. A slow owner is not taken for a gone one: once it answers again, the
// partition's requests return to it and find its bindings.
func TestClusterRetriesOnTheNextOwnerWhenTheOwnerHangs(t *testing.T) {
	release := make(chan struct{})
	var releaseOnce sync.Once
	unhang := func() { releaseOnce.Do(func() { close(release) }) }
	var hung atomic.Bool
	// The lookup with its owner hung lasts half of the request timeout and more: 4 s, so that
	// the requests that must reach the owner (the bind, the last lookup) do within their
	// first attempt's 2 s on a loaded host.
	ms := startMembersCfg(t, freePorts(t, 3), 3, func(i int) SystemOptions {
		if i != 2 {
			return SystemOptions{}
		}
		return SystemOptions{Observe: func(k Kind, msg any) {
			if k == KindPartition && hung.Load() {
				<-release // member 2's partition grains hang
			}
		}}
	}, func(c *config.Cluster) { c.RequestTimeout = 4 * time.Second })
	defer unhang()
	// A binding only the owner holds. A bind's first attempt (the partition's first use:
	// activation on the owner, maybe a new connection) may outlast half of the request
	// timeout on a loaded machine; the bind then lands on the next owner, as designed, and
	// the retry below would find it there. Such a partition is left for another.
	pl := ms[0].cl.placement.Load()
	now := time.Now()
	key := ""
	tried := map[int]bool{}
	for k := 0; key == "" && k < 10000; k++ {
		c := fmt.Sprintf("hang-%d", k)
		p := ms[0].cl.partitionOf(c)
		if pl.owners[p] != ms[2].cl.Address() || tried[p] {
			continue
		}
		tried[p] = true
		if _, set, err := ms[0].cl.Bind(clusterScope, c, "", "W1", now); err != nil || !set {
			t.Fatal(set, err)
		}
		if ms[0].cl.local[p].Load() != nil || ms[1].cl.local[p].Load() != nil {
			t.Logf("the bind of %q landed on partition %d's next owner (its first attempt outlasted half of the request timeout)", c, p)
			continue
		}
		key = c
	}
	if key == "" {
		t.Fatalf("no bind of the %d partitions member 2 owns landed on it alone", len(tried))
	}
	hung.Store(true)
	// The binding member 0 read (its bind's answer) answers from its near cache without
	// asking the hung owner; once the copies are forgotten, the owner is asked.
	if got, err := ms[0].cl.Lookup(clusterScope, key, now); err != nil || got != "W1" {
		t.Fatalf("lookup from the near cache = %q, %v; want W1", got, err)
	}
	ms[0].cl.near.invalidate(ms[0].cl.partitionOf(key))
	start := time.Now()
	got, err := ms[0].cl.Lookup(clusterScope, key, now)
	if err != nil {
		t.Fatalf("lookup with its owner hung: %v (after %v)", err, time.Since(start))
	}
	if got != "" {
		t.Fatalf("lookup = %q, want a miss on the next owner (the hung owner's bindings are out of reach)", got)
	}
	if d := time.Since(start); d > ms[0].cl.timeout {
		t.Fatalf("lookup took %v, more than cluster.request_timeout %v", d, ms[0].cl.timeout)
	}
	hung.Store(false)
	unhang()
	if got, err := ms[0].cl.Lookup(clusterScope, key, now); err != nil || got != "W1" {
		t.Fatalf("lookup once the owner answers again = %q, %v; want its binding W1 (the placement must not change)", got, err)
	}
}

// TestClusterLeaveIsBoundedWhenANewOwnerHangs: a leaving member hands every partition off
// at once, so a new owner that answers nothing costs the leave cluster.handoff_timeout (the
// caller's deadline) in all, not that much per partition.
func TestClusterLeaveIsBoundedWhenANewOwnerHangs(t *testing.T) {
	release := make(chan struct{})
	var hungMember atomic.Int32
	hungMember.Store(-1)
	ms := startMembersWith(t, 3, func(i int) SystemOptions {
		return SystemOptions{Observe: func(k Kind, msg any) {
			if _, ok := msg.(*clusterpb.HandOffBindings); ok && hungMember.Load() == int32(i) {
				<-release // this member never adopts a hand-off
			}
		}}
	})
	defer close(release)
	// The leaver and the hung member are the pair with the most partitions that go from the
	// one to the other on the leave (placement depends on the members' ports): the test
	// needs several hand-offs to hang, whatever the ports.
	pl := ms[0].cl.placement.Load()
	leaver, hung, most := -1, -1, 0
	for l := range ms {
		for h := range ms {
			n := 0
			for p := range pl.owners {
				if l != h && pl.owners[p] == ms[l].cl.Address() && pl.next[p] == ms[h].cl.Address() {
					n++
				}
			}
			if n > most {
				leaver, hung, most = l, h, n
			}
		}
	}
	if most < 2 {
		t.Fatalf("at most %d partitions move from one member to another; 16 partitions over 3 members give more", most)
	}
	hungMember.Store(int32(hung))
	// A binding in every partition, so that every hand-off carries bindings.
	now := time.Now()
	covered := map[int]bool{}
	for k := 0; len(covered) < len(pl.owners); k++ {
		key := fmt.Sprintf("leave-%d", k)
		if p := ms[leaver].cl.partitionOf(key); !covered[p] {
			if _, _, err := ms[leaver].cl.Bind(clusterScope, key, "", "W1", now); err != nil {
				t.Fatal(err)
			}
			covered[p] = true
		}
	}
	const budget = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	start := time.Now()
	err := ms[leaver].cl.Leave(ctx)
	took := time.Since(start)
	if err == nil {
		t.Fatalf("the leave succeeded although member %d adopted none of its %d partitions", hung, most)
	}
	t.Logf("leave took %v (%d partitions to the hung member)", took, most)
	if took > budget+time.Second {
		t.Fatalf("the leave took %v with a %v deadline (%d partitions to the hung member)", took, budget, most)
	}
}

// The topology, a suspicion, gossip and Leave each recompute the placement from their own
// goroutine: whatever order they run in, the placement published last is the one the
// latest members and suspects give (a recomputation changes nothing), not one computed
// before a change and published after it.
func TestClusterPlacementFollowsTheLatestChange(t *testing.T) {
	ms := startMembers(t, 3)
	m, target := ms[0], ms[1].cl.Address()
	for i := range 50 {
		var wg sync.WaitGroup
		wg.Go(func() { m.cl.suspect(target) })
		wg.Go(func() { // what a new topology does
			m.cl.mu.Lock()
			clear(m.cl.suspects)
			m.cl.mu.Unlock()
			m.cl.refreshPlacement()
		})
		wg.Wait()
		published := m.cl.placement.Load()
		m.cl.refreshPlacement()
		if now := m.cl.placement.Load(); !slices.Equal(published.owners, now.owners) || !slices.Equal(published.next, now.next) {
			t.Fatalf("round %d: the published placement was not the latest state's: owners %v, recomputed %v", i, published.owners, now.owners)
		}
		m.cl.mu.Lock()
		clear(m.cl.suspects)
		m.cl.mu.Unlock()
		m.cl.refreshPlacement()
	}
}

// keyOwnedByOneOf returns a key with prefix whose partition, as m sees it, one of owners
// owns, and that owner. Which member owns which partitions follows the members' addresses
// (OS-chosen ports): a given member of three owns none of 16 partitions in about 1 cluster
// in 600, one of two in 1 in 65,536, so a test that needs a key another member owns takes whichever of them owns one.
func keyOwnedByOneOf(t testing.TB, m *testMember, prefix string, owners ...*testMember) (string, *testMember) {
	t.Helper()
	pl := m.cl.placement.Load()
	for k := range 10_000 {
		key := fmt.Sprintf("%s-%d", prefix, k)
		for _, o := range owners {
			if pl.owners[m.cl.partitionOf(key)] == o.cl.Address() {
				return key, o
			}
		}
	}
	t.Fatalf("no key of %s owned by any of %d members; the owners: %v", prefix, len(owners), pl.owners)
	return "", nil
}

// A replica answers a repeat lookup of a key another replica owns from its near cache, and
// a change of the binding on the owner — made by the owner itself, by a third replica or by
// a worker's removal — reaches it before its next lookup answers.
func TestClusterNearCacheFollowsTheOwner(t *testing.T) {
	ms := startMembers(t, 3)
	reader := ms[0]
	key, owner := keyOwnedByOneOf(t, reader, "near", ms[1], ms[2])
	other := ms[1]
	if owner == ms[1] {
		other = ms[2]
	}
	now := time.Now()
	if w, set, err := reader.cl.Bind(clusterScope, key, "", "W1", now); err != nil || !set || w != "W1" {
		t.Fatalf("bind = %q, %v, %v", w, set, err)
	}
	remote, hits := reader.cl.remote.Get(), reader.cl.near.hits.Get()
	lookup := func(want string) {
		t.Helper()
		if w, err := reader.cl.Lookup(clusterScope, key, now); err != nil || w != want {
			t.Fatalf("lookup = %q, %v; want %q", w, err, want)
		}
	}
	lookup("W1")
	lookup("W1")
	if r, h := reader.cl.remote.Get()-remote, reader.cl.near.hits.Get()-hits; r != 0 || h != 2 {
		t.Fatalf("2 repeat lookups made %d remote requests and %d near cache hits; want 0 and 2", r, h)
	}

	// step changes the binding through change, waits for the reader's invalidation and
	// checks that its next lookup asks the owner and sees want.
	step := func(what string, change func(), want string) {
		t.Helper()
		inv, remote := reader.cl.near.invalidations.Get(), reader.cl.remote.Get()
		change()
		reader.waitFor(t, what+": the reader is told", func() bool { return reader.cl.near.invalidations.Get() > inv })
		lookup(want)
		if reader.cl.remote.Get() == remote {
			t.Fatalf("%s: the lookup after the invalidation was not sent to the owner", what)
		}
	}
	step("the owner rebinds", func() {
		if w, set, err := owner.cl.Bind(clusterScope, key, "W1", "W2", now); err != nil || !set || w != "W2" {
			t.Fatalf("owner rebind = %q, %v, %v", w, set, err)
		}
	}, "W2")
	lookup("W2") // cached again
	step("a third replica rebinds", func() {
		if w, set, err := other.cl.Bind(clusterScope, key, "W2", "W3", now); err != nil || !set || w != "W3" {
			t.Fatalf("third replica's rebind = %q, %v, %v", w, set, err)
		}
	}, "W3")
	lookup("W3")
	step("the worker is removed on the owner", func() {
		if n, err := owner.cl.InvalidateWorker("W3"); err != nil || n != 1 {
			t.Fatalf("InvalidateWorker = %d, %v; want 1", n, err)
		}
	}, "")
	// A copy lives near_cache_ttl at most: past it the owner is asked (and refreshes the
	// binding's last use).
	if _, _, err := reader.cl.Bind(clusterScope, key, "", "W4", now); err != nil {
		t.Fatal(err)
	}
	remote = reader.cl.remote.Get()
	later := now.Add(reader.cl.cfg.NearCacheTTL)
	if w, err := reader.cl.Lookup(clusterScope, key, later); err != nil || w != "W4" || reader.cl.remote.Get() != remote+1 {
		t.Fatalf("lookup past the ttl = %q, %v with %d remote requests; want W4 from the owner", w, err, reader.cl.remote.Get()-remote)
	}
}

// When a partition's owner leaves, the replicas forget their copies of its bindings and ask
// the new owner; with cluster.near_cache_ttl 0 every lookup asks the owner.
func TestClusterNearCacheForgetsMovedPartitions(t *testing.T) {
	ms := startMembers(t, 3)
	reader := ms[0]
	key, leaver := keyOwnedByOneOf(t, reader, "moved", ms[1], ms[2])
	now := time.Now()
	if _, _, err := reader.cl.Bind(clusterScope, key, "", "W1", now); err != nil {
		t.Fatal(err)
	}
	p := reader.cl.partitionOf(key)
	gen := reader.cl.near.gen(p)
	ctx, cancel := context.WithTimeout(context.Background(), clusterWait)
	defer cancel()
	if err := leaver.cl.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	reader.waitFor(t, "the reader routes around the leaver", func() bool {
		return reader.cl.placement.Load().owners[p] != leaver.cl.Address()
	})
	if reader.cl.near.gen(p) == gen {
		t.Fatal("the partition's owner changed and the reader kept its copies")
	}
	remote := reader.cl.remote.Get()
	if w, err := reader.cl.Lookup(clusterScope, key, now); err != nil || w != "W1" {
		t.Fatalf("lookup after the leave = %q, %v; want the handed-off W1", w, err)
	}
	if pl := reader.cl.placement.Load(); pl.owners[p] != pl.self && reader.cl.remote.Get() == remote {
		t.Fatal("the lookup after the leave was answered from a copy of the old owner's binding")
	}

	off := startMembersTweaked(t, 2, func(c *config.Cluster) { c.NearCacheTTL = 0 })
	if off[0].cl.near != nil {
		t.Fatal("near_cache_ttl 0 made a near cache")
	}
	key, _ = keyOwnedByOneOf(t, off[0], "off", off[1]) // off[1] owns none of 16 in 1 cluster of 65,536
	if _, _, err := off[0].cl.Bind(clusterScope, key, "", "W1", now); err != nil {
		t.Fatal(err)
	}
	remote = off[0].cl.remote.Get()
	for range 3 {
		if w, err := off[0].cl.Lookup(clusterScope, key, now); err != nil || w != "W1" {
			t.Fatalf("lookup = %q, %v", w, err)
		}
	}
	if got := off[0].cl.remote.Get() - remote; got != 3 {
		t.Fatalf("3 lookups without a near cache made %d remote requests, want 3", got)
	}
}

// TestClusterCloseWaitsForRemoteRequests: a member closed while one of its binding requests
// is in flight at another member (whose grain is held) stops its remote only after that
// request has its answer: the request neither fails nor sends into a stopped endpoint
// manager (Proto.Actor then panics), and requests made after Close began fail at once. The
// request timeout (20s) outlasts Proto.Actor's own two-second wait in its shutdown, after
// which the remote stopped under the request before.
func TestClusterCloseWaitsForRemoteRequests(t *testing.T) {
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	var hold atomic.Bool
	ports := freePorts(t, 2)
	ms := startMembersCfg(t, ports, 2, func(i int) SystemOptions {
		if i != 1 {
			return SystemOptions{}
		}
		return SystemOptions{Observe: func(k Kind, msg any) {
			if k == KindPartition && hold.Load() {
				if _, ok := msg.(*clusterpb.LookupBinding); ok {
					arrived <- struct{}{}
					<-release
				}
			}
		}}
	}, func(c *config.Cluster) {
		c.RequestTimeout = 20 * time.Second
		c.NearCacheTTL = 0 // every lookup asks the owner
	})
	key, _ := keyOwnedByOneOf(t, ms[0], "close", ms[1])
	now := time.Now()
	if _, set, err := ms[0].cl.Bind(clusterScope, key, "", "W1", now); err != nil || !set {
		t.Fatal(set, err)
	}

	hold.Store(true)
	type answer struct {
		worker string
		err    error
	}
	inFlight := make(chan answer, 1)
	go func() {
		w, err := ms[0].cl.Lookup(clusterScope, key, now)
		inFlight <- answer{w, err}
	}()
	<-arrived // the lookup waits for member 1's grain
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		ms[0].close()
	}()
	<-ms[0].cl.stop // Close has begun
	if _, err := ms[0].cl.Lookup(clusterScope, key, now); !errors.Is(err, ErrAffinityClosed) {
		t.Errorf("a lookup after Close began: %v, want ErrAffinityClosed", err)
	}
	// Close must not finish while the lookup is held. The grain is released when Close
	// returns (the failure) or after Proto.Actor's shutdown would have stopped the remote
	// under the lookup (3s, past its two-second wait): a bound on the test's length only.
	select {
	case <-closed:
		t.Error("Close returned while a binding request was in flight")
	case <-time.After(3 * time.Second):
	}
	close(release)
	if a := <-inFlight; a.err != nil || a.worker != "W1" {
		t.Errorf("the lookup in flight during Close = %q, %v; want its binding W1", a.worker, a.err)
	}
	select {
	case <-closed:
	case <-time.After(clusterWait):
		t.Fatal("Close did not return once the request had ended")
	}
}
