package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"

	"switchyard/config"
)

// sinkOp is one call the discovery made on its sink, or the end of a reconcile.
type sinkOp struct {
	op   string // add, failed (an add that failed), remove or reconciled
	spec Spec   // add, failed
	id   string // remove; reconciled: the pod's key
}

func (o sinkOp) String() string {
	if o.op == "remove" {
		return "remove " + o.id
	}
	bp := "-"
	if o.spec.BootstrapPort != nil {
		bp = fmt.Sprint(*o.spec.BootstrapPort)
	}
	return fmt.Sprintf("add %s %s %s model=%q bootstrap=%s", o.spec.ID, o.spec.URL, o.spec.Role, o.spec.Model, bp)
}

// fakeSink records the discovery's calls; addErr, when set, decides an add's outcome (it
// runs on the discovery's one reconciler).
type fakeSink struct {
	ops    chan sinkOp
	addErr func(Spec) error
}

func (s *fakeSink) AddWorker(_ context.Context, spec Spec) error {
	if s.addErr != nil {
		if err := s.addErr(spec); err != nil {
			s.ops <- sinkOp{op: "failed", spec: spec}
			return err
		}
	}
	s.ops <- sinkOp{op: "add", spec: spec}
	return nil
}

func (s *fakeSink) RemoveWorker(id string) error {
	s.ops <- sinkOp{op: "remove", id: id}
	return nil
}

// fakePods is the fake clientset as a PodClient, saying (as the clientset does) that it
// cannot serve watch-list requests.
type fakePods struct{ cs *fake.Clientset }

func (f fakePods) ListPods(ctx context.Context, ns string, o metav1.ListOptions) (*corev1.PodList, error) {
	return f.cs.CoreV1().Pods(ns).List(ctx, o)
}

func (f fakePods) WatchPods(ctx context.Context, ns string, o metav1.ListOptions) (watch.Interface, error) {
	return f.cs.CoreV1().Pods(ns).Watch(ctx, o)
}

func (f fakePods) IsWatchListSemanticsUnSupported() bool {
	return f.cs.IsWatchListSemanticsUnSupported()
}

// discoveryEnv runs a Kubernetes discovery against client-go's fake clientset.
type discoveryEnv struct {
	t    *testing.T
	cs   *fake.Clientset
	sink *fakeSink
	k    *Kubernetes
	set  *metrics.Set
}

func startDiscovery(t *testing.T, cfg config.Kubernetes, addErr func(Spec) error) *discoveryEnv {
	t.Helper()
	cs := fake.NewClientset()
	sink := &fakeSink{ops: make(chan sinkOp, 256), addErr: addErr}
	set := metrics.NewSet()
	cfg.Enabled = true
	if cfg.Scheme == "" {
		cfg.Scheme = "http"
	}
	// One reconciler: the sink's calls and the reconciles' ends arrive on ops in the order
	// they happened.
	k, err := NewKubernetes(KubernetesOptions{Config: cfg, Pods: fakePods{cs}, Sink: sink, Metrics: set,
		Reconcilers: 1, RetryBase: time.Millisecond, RetryMax: 5 * time.Millisecond,
		OnReconciled: func(key string) { sink.ops <- sinkOp{op: "reconciled", id: key} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(runKubernetes(k))
	return &discoveryEnv{t: t, cs: cs, sink: sink, k: k, set: set}
}

// runKubernetes runs k until the returned stop is called, which waits for Run to return.
func runKubernetes(k *Kubernetes) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		k.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// next returns the sink's next call (past the ends of reconciles), failing after 10s.
func (e *discoveryEnv) next() sinkOp {
	e.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case op := <-e.sink.ops:
			if op.op != "reconciled" {
				return op
			}
		case <-timeout:
			e.t.Fatal("no call on the sink after 10s")
			return sinkOp{}
		}
	}
}

// settle waits for the end of the reconcile that made the sink call just seen: the next
// event on the sink's channel. The discovery's gauges and counters are final then.
func (e *discoveryEnv) settle() {
	e.t.Helper()
	select {
	case op := <-e.sink.ops:
		if op.op != "reconciled" {
			e.t.Fatalf("%v before the end of the reconcile that made the last call", op)
		}
	case <-time.After(10 * time.Second):
		e.t.Fatal("the reconcile did not end after 10s")
	}
}

// expect checks the sink's next calls.
func (e *discoveryEnv) expect(want ...string) {
	e.t.Helper()
	for _, w := range want {
		if got := e.next().String(); got != w {
			e.t.Fatalf("sink call %q, want %q", got, w)
		}
	}
}

func (e *discoveryEnv) create(p *corev1.Pod) {
	e.t.Helper()
	if _, err := e.cs.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *discoveryEnv) update(p *corev1.Pod) {
	e.t.Helper()
	if _, err := e.cs.CoreV1().Pods(p.Namespace).Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *discoveryEnv) delete(p *corev1.Pod) {
	e.t.Helper()
	if err := e.cs.CoreV1().Pods(p.Namespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *discoveryEnv) metric(series string) float64 {
	e.t.Helper()
	var b strings.Builder
	e.set.WritePrometheus(&b)
	for line := range strings.Lines(b.String()) {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			fmt.Sscan(v, &f)
			return f
		}
	}
	return -1
}

// testPod is a pod in namespace ns with an engine container port named http.
func testPod(name string, lbl map[string]string, ip string, ready bool) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: lbl},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "engine",
			Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 9090}, {Name: "http", ContainerPort: 30000}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
	if ip != "" {
		p.Status.PodIP = ip
		p.Status.Phase = corev1.PodRunning
	}
	setReady(p, ready)
	return p
}

func setReady(p *corev1.Pod, ready bool) {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}, {Type: corev1.PodReady, Status: st}}
}

// TestKubernetesPodLifecycle: a pod becomes a worker when it is Running and Ready, and
// leaves when it stops being ready, stops matching, changes its model, terminates or is
// deleted.
func TestKubernetesPodLifecycle(t *testing.T) {
	e := startDiscovery(t, config.Kubernetes{Namespace: "ns", Selector: "app=sglang", Port: 30000, ModelLabel: "model"}, nil)
	lbl := map[string]string{"app": "sglang", "model": "llama"}

	// Pending, then running but not ready: nothing; another pod ready at once is added.
	a := testPod("a", lbl, "", false)
	e.create(a)
	a = testPod("a", lbl, "10.0.0.1", false)
	e.update(a)
	e.create(testPod("other", map[string]string{"app": "vllm"}, "10.0.0.9", true)) // not selected
	e.create(testPod("b", lbl, "10.0.0.2", true))
	e.expect(`add b.ns http://10.0.0.2:30000 plain model="llama" bootstrap=-`)

	// Ready: a joins.
	setReady(a, true)
	e.update(a)
	e.expect(`add a.ns http://10.0.0.1:30000 plain model="llama" bootstrap=-`)
	e.settle()
	if got := e.metric(`switchyard_discovery_workers{role="plain"}`); got != 2 {
		t.Errorf("discovered plain workers %v, want 2", got)
	}

	// A status update that changes nothing of the worker: no call. Then not ready: a leaves.
	a.Status.Message = "still fine"
	e.update(a)
	setReady(a, false)
	e.update(a)
	e.expect("remove a.ns")

	// Ready again, then its model label changes: it leaves and joins as the new model.
	setReady(a, true)
	e.update(a)
	e.expect(`add a.ns http://10.0.0.1:30000 plain model="llama" bootstrap=-`)
	a.Labels = map[string]string{"app": "sglang", "model": "qwen"}
	e.update(a)
	e.expect("remove a.ns", `add a.ns http://10.0.0.1:30000 plain model="qwen" bootstrap=-`)

	// No model label: the model is left to introspection.
	a.Labels = map[string]string{"app": "sglang"}
	e.update(a)
	e.expect("remove a.ns", `add a.ns http://10.0.0.1:30000 plain model="" bootstrap=-`)

	// It stops matching the selector: it leaves.
	a.Labels = map[string]string{"app": "other"}
	e.update(a)
	e.expect("remove a.ns")

	// b terminates (deletion timestamp), then is deleted: it leaves once.
	b := testPod("b", lbl, "10.0.0.2", true)
	now := metav1.Now()
	b.DeletionTimestamp = &now
	e.update(b)
	e.expect("remove b.ns")
	e.delete(b)
	a.Labels = lbl
	e.update(a) // a marker: its add follows b's deletion, which calls nothing
	e.expect(`add a.ns http://10.0.0.1:30000 plain model="llama" bootstrap=-`)
	e.delete(a)
	e.expect("remove a.ns")
	e.settle()
	if got := e.metric(`switchyard_discovery_workers{role="plain"}`); got != 0 {
		t.Errorf("discovered plain workers %v, want 0", got)
	}
}

// TestKubernetesRoles: prefill and decode selectors give their roles; a prefill pod's
// bootstrap port comes from its annotation; a named port is read from the containers; a pod
// that cannot be a worker is counted and skipped.
func TestKubernetesRoles(t *testing.T) {
	e := startDiscovery(t, config.Kubernetes{Namespace: "ns", PrefillSelector: "role=prefill", DecodeSelector: "role=decode",
		PortName: "http", BootstrapPortAnnotation: config.DefaultBootstrapPortAnnotation}, nil)

	p := testPod("p", map[string]string{"role": "prefill"}, "10.0.1.1", true)
	p.Annotations = map[string]string{config.DefaultBootstrapPortAnnotation: "8998"}
	e.create(p)
	e.expect(`add p.ns http://10.0.1.1:30000 prefill model="" bootstrap=8998`)

	d := testPod("d", map[string]string{"role": "decode"}, "fd00::7", true)
	d.Annotations = map[string]string{config.DefaultBootstrapPortAnnotation: "8998"} // decode: ignored
	e.create(d)
	e.expect(`add d.ns http://[fd00::7]:30000 decode model="" bootstrap=-`)

	// A bad annotation: the worker leaves and is not added again until it is fixed.
	p.Annotations[config.DefaultBootstrapPortAnnotation] = "http"
	e.update(p)
	e.expect("remove p.ns")
	// No container port named http.
	n := testPod("n", map[string]string{"role": "decode"}, "10.0.1.3", true)
	n.Spec.Containers[0].Ports = n.Spec.Containers[0].Ports[:1]
	e.create(n)
	p.Annotations[config.DefaultBootstrapPortAnnotation] = "9000"
	e.update(p)
	e.expect(`add p.ns http://10.0.1.1:30000 prefill model="" bootstrap=9000`)
	e.settle()
	if got := e.metric(`switchyard_discovery_errors_total{kind="pod"}`); got != 2 {
		t.Errorf("pod errors %v, want 2 (bad annotation, no named port)", got)
	}
	for role, want := range map[string]float64{"prefill": 1, "decode": 1} {
		if got := e.metric(`switchyard_discovery_workers{role="` + role + `"}`); got != want {
			t.Errorf("discovered %s workers %v, want %v", role, got, want)
		}
	}
}

// TestKubernetesSelectorConflict: a pod both the prefill and the decode selector match
// becomes no worker.
func TestKubernetesSelectorConflict(t *testing.T) {
	e := startDiscovery(t, config.Kubernetes{Namespace: "ns", PrefillSelector: "app=x", DecodeSelector: "tier=gpu", Port: 8000}, nil)
	e.create(testPod("both", map[string]string{"app": "x", "tier": "gpu"}, "10.0.2.1", true))
	e.create(testPod("d", map[string]string{"tier": "gpu"}, "10.0.2.2", true))
	e.expect(`add d.ns http://10.0.2.2:8000 decode model="" bootstrap=-`)
	if got := e.metric(`switchyard_discovery_errors_total{kind="pod"}`); got < 1 {
		t.Errorf("pod errors %v, want the conflict counted", got)
	}
}

// TestKubernetesAddRetries: an add that fails for a passing reason (the engine not answering
// its introspection yet) is tried again with backoff; one whose ID another source owns is
// not.
func TestKubernetesAddRetries(t *testing.T) {
	var failures int
	e := startDiscovery(t, config.Kubernetes{Selector: "app=sglang", Port: 30000}, func(s Spec) error {
		switch {
		case s.ID == "taken.ns":
			return fmt.Errorf("cannot add worker: %w", ErrWorkerExists)
		case failures < 3:
			failures++
			return fmt.Errorf("%w: connection refused", ErrIntrospection)
		}
		return nil
	})
	e.create(testPod("taken", map[string]string{"app": "sglang"}, "10.0.3.1", true))
	if op := e.next(); op.op != "failed" || op.spec.ID != "taken.ns" {
		t.Fatalf("first call %v, want the failed add of taken.ns", op)
	}
	e.create(testPod("slow", map[string]string{"app": "sglang"}, "10.0.3.2", true))
	for i := range 3 {
		if op := e.next(); op.op != "failed" || op.spec.ID != "slow.ns" {
			t.Fatalf("call %d: %v, want a failed add of slow.ns", i, op)
		}
	}
	e.expect(`add slow.ns http://10.0.3.2:30000 plain model="" bootstrap=-`)
	if got := e.metric(`switchyard_discovery_errors_total{kind="add"}`); got != 4 {
		t.Errorf("add errors %v, want 4", got)
	}
	for len(e.sink.ops) > 0 { // what has arrived: ends of reconciles, no other call
		if op := <-e.sink.ops; op.op != "reconciled" {
			t.Fatalf("unexpected call %v: an ID taken by another source is not retried", op)
		}
	}
}

func TestNewKubernetesErrors(t *testing.T) {
	sink := &fakeSink{ops: make(chan sinkOp, 1)}
	pods := fakePods{fake.NewClientset()}
	for _, tt := range []struct {
		name string
		opts KubernetesOptions
		want string
	}{
		{"no sink", KubernetesOptions{Pods: pods, Config: config.Kubernetes{Selector: "a=b"}}, "no sink"},
		{"no selector", KubernetesOptions{Pods: pods, Sink: sink}, "no selector"},
		{"bad selector", KubernetesOptions{Pods: pods, Sink: sink, Config: config.Kubernetes{DecodeSelector: "a in ("}}, "decode selector"},
		{"missing kubeconfig", KubernetesOptions{Sink: sink, Config: config.Kubernetes{Selector: "a=b", Kubeconfig: "/nonexistent/kubeconfig"}},
			"discovery.kubernetes.kubeconfig"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewKubernetes(tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("NewKubernetes: %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
	if _, err := NewKubernetes(KubernetesOptions{Sink: sink, Config: config.Kubernetes{Selector: "a=b"}}); err == nil ||
		!strings.Contains(err.Error(), "in-cluster") {
		t.Errorf("outside a cluster without a kubeconfig: %v, want an error naming the in-cluster configuration", err)
	}
}

// deniedPods answers every list and watch as an API server without the RBAC rule does;
// lists signals each list.
type deniedPods struct{ lists chan struct{} }

func errDenied(verb string) error {
	return apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "",
		errors.New(`User "system:serviceaccount:switchyard:switchyard" cannot `+verb+` resource "pods"`))
}

func (d deniedPods) ListPods(context.Context, string, metav1.ListOptions) (*corev1.PodList, error) {
	d.lists <- struct{}{}
	return nil, errDenied("list")
}

func (d deniedPods) WatchPods(context.Context, string, metav1.ListOptions) (watch.Interface, error) {
	return nil, errDenied("watch")
}

// TestKubernetesWatchFailures: a list or watch the API server refuses is retried, counted
// each time and logged once.
func TestKubernetesWatchFailures(t *testing.T) {
	var logs strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pods := deniedPods{lists: make(chan struct{})}
	set := metrics.NewSet()
	k, err := NewKubernetes(KubernetesOptions{Config: config.Kubernetes{Selector: "app=sglang", Port: 1, Scheme: "http"},
		Pods: pods, Sink: &fakeSink{}, Logger: logger, Metrics: set})
	if err != nil {
		t.Fatal(err)
	}
	stop := runKubernetes(k)
	// Three lists: the failures of the first two have been handled when the third starts
	// (client-go backs off under 2s between attempts).
	for i := range 3 {
		select {
		case <-pods.lists:
		case <-time.After(10 * time.Second):
			t.Fatalf("list %d never came", i)
		}
	}
	drained := make(chan struct{})
	go func() { // a list under way when Run stops
		defer close(drained)
		for range pods.lists {
		}
	}()
	stop()
	close(pods.lists)
	<-drained
	e := &discoveryEnv{t: t, set: set}
	if got := e.metric(`switchyard_discovery_errors_total{kind="watch"}`); got < 2 {
		t.Errorf("watch errors %v, want every refused attempt counted", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logs.String(), "cannot list or watch engine pods"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, logs.String())
	}
	if k.Synced() {
		t.Error("Synced with every list refused")
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestSameSpecComparesLabelsAndPortsByValue: a discovered worker whose labels or bootstrap
// port change is a different worker; equal values in distinct maps and pointers are not.
func TestSameSpecComparesLabelsAndPortsByValue(t *testing.T) {
	p1, p2, p3 := 8998, 8998, 9000
	base := Spec{ID: "p.ns", URL: "http://10.0.0.1:30000", Role: "prefill", BootstrapPort: &p1,
		Labels: map[string]string{"transfer_backend": "mooncake"}}
	same := base
	same.BootstrapPort = &p2
	same.Labels = map[string]string{"transfer_backend": "mooncake"}
	if !sameSpec(base, same) {
		t.Fatal("equal specs in distinct maps and pointers differ")
	}
	otherLabels := same
	otherLabels.Labels = map[string]string{"transfer_backend": "nixl"}
	otherPort := same
	otherPort.BootstrapPort = &p3
	noPort := same
	noPort.BootstrapPort = nil
	otherURL := same
	otherURL.URL = "http://10.0.0.2:30000"
	for name, s := range map[string]Spec{"labels": otherLabels, "port": otherPort, "no port": noPort, "url": otherURL} {
		if sameSpec(base, s) {
			t.Errorf("%s: a changed spec is the same", name)
		}
	}
	if !maps.Equal(base.Labels, map[string]string{"transfer_backend": "mooncake"}) || *base.BootstrapPort != 8998 {
		t.Fatal("sameSpec changed its arguments' maps or pointers")
	}
}

// TestKubernetesOwns: the discovery says which workers it added, until it removes them.
func TestKubernetesOwns(t *testing.T) {
	e := startDiscovery(t, config.Kubernetes{Namespace: "ns", Selector: "app=sglang", Port: 30000, ModelLabel: "model"}, nil)
	lbl := map[string]string{"app": "sglang", "model": "llama"}
	a := testPod("a", lbl, "10.0.0.1", true)
	e.create(a)
	e.expect(`add a.ns http://10.0.0.1:30000 plain model="llama" bootstrap=-`)
	// One reconciler: b's add begins once a's is recorded.
	e.create(testPod("b", lbl, "10.0.0.2", true))
	e.expect(`add b.ns http://10.0.0.2:30000 plain model="llama" bootstrap=-`)
	if !e.k.Owns("a.ns") || e.k.Owns("static") || e.k.Owns("a") {
		t.Fatalf("Owns(a.ns, static, a) = %v, %v, %v; want true, false, false", e.k.Owns("a.ns"), e.k.Owns("static"), e.k.Owns("a"))
	}
	e.delete(a)
	e.expect("remove a.ns")
	e.create(testPod("c", lbl, "10.0.0.3", true))
	e.expect(`add c.ns http://10.0.0.3:30000 plain model="llama" bootstrap=-`)
	if e.k.Owns("a.ns") {
		t.Fatal("Owns(a.ns) after its pod was deleted")
	}
}
