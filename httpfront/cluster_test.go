//go:build !race

// The cluster tests run without the race detector: Proto.Actor's cluster races inside itself
// (docs/cluster.md, Testing, lists the races); make test runs every !race test by name in a
// separate step.

package httpfront

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"

	"switchyard/config"
)

// clientsetPods is client-go's fake clientset as the discovery's pod API.
type clientsetPods struct{ cs *fake.Clientset }

func (f clientsetPods) ListPods(ctx context.Context, ns string, o metav1.ListOptions) (*corev1.PodList, error) {
	return f.cs.CoreV1().Pods(ns).List(ctx, o)
}

func (f clientsetPods) WatchPods(ctx context.Context, ns string, o metav1.ListOptions) (watch.Interface, error) {
	return f.cs.CoreV1().Pods(ns).Watch(ctx, o)
}

func (f clientsetPods) IsWatchListSemanticsUnSupported() bool { return true }

// clusterPorts returns two ports the OS chose on loopback, released for the members to
// bind (the automanaged provider needs every member's port before any starts).
func clusterPorts(t *testing.T) []int {
	t.Helper()
	var ports []int
	for range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
		_ = ln.Close()
	}
	return ports
}

// replicaConfig is replica i of the two-member cluster on ports: model llama served by
// worker A (engine at url), gossip every 20ms.
func replicaConfig(ports []int, i int, url string) *config.Config {
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{{ID: "b", Groups: config.Groups{Plain: &config.Group{}}}}}}
	c := &cfg.Cluster
	c.Enabled, c.Name, c.Listen, c.ProviderPort = true, fmt.Sprintf("httpfront-%d", ports[0]), "127.0.0.1:0", ports[i]
	c.Members = []string{fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])}
	c.Partitions, c.RefreshInterval, c.GossipInterval = 8, 100*time.Millisecond, 20*time.Millisecond
	return cfg
}

// TestClusterWorkerChangesReachEveryReplica: two replicas of one cluster, each discovering
// the same engine pod. An addition by URL alone (202) on one replica is added on the other,
// which learns the model from the engine itself; a removal on one replica reaches the other,
// except for the worker the other's own discovery follows (it stays while its pod does).
func TestClusterWorkerChangesReachEveryReplica(t *testing.T) {
	static := newFakeEngine(t, "A", "llama")
	pod := newFakeEngine(t, "P", "llama")
	added := newFakeEngine(t, "C", "llama")
	sentinel := newFakeEngine(t, "Z", "llama")
	_, podPort, err := net.SplitHostPort(strings.TrimPrefix(pod.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	cs := fake.NewClientset(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: map[string]string{"app": "engine", "model": "llama"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "engine"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1", Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	})

	ports := clusterPorts(t)
	cfgOf := func(i int) *config.Config {
		cfg := replicaConfig(ports, i, static.url)
		cfg.Discovery.Kubernetes = config.Kubernetes{Enabled: true, Namespace: "ns", Selector: "app=engine", ModelLabel: "model",
			Scheme: "http"}
		if _, err := fmt.Sscan(podPort, &cfg.Discovery.Kubernetes.Port); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	rs := make([]*testServer, 2)
	var wg sync.WaitGroup
	for i := range rs {
		cfg := cfgOf(i)
		wg.Go(func() { rs[i] = startServer(t, cfg, Options{DiscoveryPods: clientsetPods{cs}, NoTelemetry: true}) })
	}
	wg.Wait()
	has := func(r *testServer, id string) bool { return r.workers.Member(id) != nil }
	for i, r := range rs {
		waitUntil(t, fmt.Sprintf("replica %d sees 2 members and discovered p.ns", i), func() bool {
			return len(r.Cluster().Members()) == 2 && has(r, "p.ns")
		})
	}

	// An addition by URL alone: 202 here, added over there with the engine's model.
	if r := post(t, rs[0].url+"/workers", `{"url":"`+added.url+`"}`); r.status != 202 {
		t.Fatalf("add by URL: %d %s", r.status, r.body)
	}
	id := strings.TrimPrefix(added.url, "http://")
	waitUntil(t, "the other replica adds the worker given by URL", func() bool {
		m := rs[1].workers.Member(id)
		return m != nil && m.Worker() != nil && m.Worker().Model == "llama"
	})
	if r := get(t, rs[1].url+"/workers/"+url.PathEscape(added.url)); r.status != 200 || !contains(r.body, `"model_id":"llama"`) {
		t.Fatalf("GET by URL on the other replica: %d %s", r.status, r.body)
	}

	// Removals: the discovered worker on replica 0, then the worker added by URL on replica
	// 1; then an addition whose ID sorts last, so that replica 1 has handled the first
	// removal once it has the sentinel.
	for _, d := range []struct {
		r   *testServer
		ref string
	}{{rs[0], "p.ns"}, {rs[1], url.PathEscape(added.url)}} {
		if r := doMethod(t, "DELETE", d.r.url+"/workers/"+d.ref); r.status != 200 {
			t.Fatalf("DELETE %s: %d %s", d.ref, r.status, r.body)
		}
	}
	if r := post(t, rs[0].url+"/workers", `{"id":"zz-sentinel","url":"`+sentinel.url+`","model":"llama"}`); r.status != 201 {
		t.Fatalf("add the sentinel: %d %s", r.status, r.body)
	}
	waitUntil(t, "replica 0 loses the worker removed on replica 1", func() bool { return !has(rs[0], id) })
	waitUntil(t, "replica 1 adds the sentinel", func() bool { return has(rs[1], "zz-sentinel") })
	if has(rs[0], "p.ns") {
		t.Fatal("replica 0 kept the discovered worker its admin API removed")
	}
	if !has(rs[1], "p.ns") {
		t.Fatal("replica 1 removed the worker its own discovery follows, on another replica's word")
	}
}

// buildGate is the telemetry of a replica under construction: starting the telemetry of
// the configured worker hold blocks New until release closes; a worker whose telemetry
// starts meanwhile is one the cluster's callbacks added to a half-built server.
type buildGate struct {
	hold    string
	entered chan struct{}
	release chan struct{}

	mu    sync.Mutex
	early []string // workers started while New was blocked
	later []string // workers started after
}

func (g *buildGate) StartWorker(src TelemetrySource) error {
	if src.WorkerID == g.hold {
		close(g.entered)
		<-g.release
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.release:
		g.later = append(g.later, src.WorkerID)
	default:
		g.early = append(g.early, src.WorkerID)
	}
	return nil
}

func (g *buildGate) StopWorker(string) {}

// TestClusterChangesWaitUntilTheServerIsBuilt: a replica joins the cluster while New still
// builds its fleet. A worker change the other replica made before is applied once New has
// returned, never by the gossip goroutine into the half-built server.
func TestClusterChangesWaitUntilTheServerIsBuilt(t *testing.T) {
	static := newFakeEngine(t, "A", "llama")
	added := newFakeEngine(t, "C", "llama")
	ports := clusterPorts(t)
	a := startServer(t, replicaConfig(ports, 0, static.url), Options{NoTelemetry: true})
	if r := post(t, a.url+"/workers", `{"id":"C","url":"`+added.url+`","model":"llama"}`); r.status != 201 {
		t.Fatalf("add C: %d %s", r.status, r.body)
	}

	gate := &buildGate{hold: "A", entered: make(chan struct{}), release: make(chan struct{})}
	started := make(chan *testServer, 1)
	go func() { started <- startServer(t, replicaConfig(ports, 1, static.url), Options{Telemetry: gate}) }()
	select {
	case <-gate.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the second replica never started its configured worker")
	}
	// The second replica is a member, its cluster gossiping, while New waits here.
	waitUntil(t, "the first replica sees the second", func() bool { return len(a.Cluster().Members()) == 2 })
	close(gate.release)
	var b *testServer
	select {
	case b = <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("New did not return")
	}
	waitUntil(t, "the second replica adds C", func() bool { return b.workers.Member("C") != nil })
	gate.mu.Lock()
	defer gate.mu.Unlock()
	if len(gate.early) != 0 || len(gate.later) != 1 || gate.later[0] != "C" {
		t.Fatalf("workers started during New %v, after %v: want only C, after", gate.early, gate.later)
	}
}
