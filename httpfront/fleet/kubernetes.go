package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"switchyard/config"
)

// Metric names of Kubernetes discovery.
const (
	MetricDiscoveryWorkers = "switchyard_discovery_workers"
	MetricDiscoveryErrors  = "switchyard_discovery_errors_total"
)

// Kinds of discovery errors (the kind label of switchyard_discovery_errors_total).
const (
	discoveryErrWatch = "watch" // listing or watching pods failed (RBAC, API server down)
	discoveryErrPod   = "pod"   // a pod that cannot become a worker (no such port, two roles, bad annotation)
	discoveryErrAdd   = "add"   // adding a pod's worker failed (introspection, an ID taken)
)

// Sink receives the workers Kubernetes discovery finds: the router's worker lifecycle, the
// same one POST /workers and DELETE /workers/{id} use.
type Sink interface {
	// AddWorker adds a worker, introspecting its engine; it may block for the
	// introspection's bounded time.
	AddWorker(ctx context.Context, spec Spec) error
	// RemoveWorker removes a worker: it takes no new request, its in-flight requests
	// finish, its bindings and index entries are dropped.
	RemoveWorker(id string) error
}

// KubernetesOptions are the settings and collaborators of a Kubernetes discovery.
type KubernetesOptions struct {
	// Config is the discovery.kubernetes section.
	Config config.Kubernetes
	// Pods is the Kubernetes API the pods are listed and watched through. Default: a
	// client of the API server the kubeconfig Config names, or of the in-cluster
	// configuration.
	Pods PodClient
	// Sink receives the workers. Required.
	Sink Sink
	// Logger receives the discovery's logs, client-go's included. Default: discard.
	Logger *slog.Logger
	// Metrics receives the discovery's metrics. Default: a new set.
	Metrics *metrics.Set
	// Reconcilers is how many pods are turned into workers at once (each may wait for an
	// introspection). Default 4.
	Reconcilers int
	// RetryBase and RetryMax bound the per-pod backoff after a failed add. Default 500ms
	// and 30s.
	RetryBase, RetryMax time.Duration
	// OnReconciled, when set, is called on the reconciler after each reconcile of a pod, with
	// the pod's key ("namespace/name"), once the sink's calls, the discovery's metrics and
	// its record of the pod are final. For tests; it must not block.
	OnReconciled func(key string)
}

// Kubernetes discovers workers from pods. One informer lists and watches the pods (with
// the selector on the API server when only one role has one, else every pod of the
// namespace, trimmed to what discovery reads); a pod that one role's selector matches
// becomes a worker of that role (plain, prefill, decode) while it is Running and Ready with
// an IP, and leaves the fleet when it is deleted, is terminating, stops being ready, stops
// matching or changes what its worker would be (then it is added again). A pod two
// selectors match is no worker. Workers from the configuration and the admin API are never
// touched: the discovery removes only what it added. Pods are reconciled on a work queue
// (client-go's: one pod at a time per key, a failed add retried with backoff).
type Kubernetes struct {
	cfg     config.Kubernetes
	pods    PodClient
	sink    Sink
	logger  *slog.Logger
	workers int
	queue   workqueue.TypedRateLimitingInterface[string]
	roles   []kubeRole
	// informer lists and watches the pods: those of the one selector when only one is
	// configured, else every pod of the namespace, matched to roles here.
	informer cache.SharedIndexInformer
	errs     map[string]*metrics.Counter
	// reconciled is KubernetesOptions.OnReconciled.
	reconciled func(key string)

	mu     sync.Mutex
	owned  map[string]Spec   // pod key → the worker added for it; guarded by mu
	failed map[string]string // pod key → the last problem logged for it; guarded by mu
	// watchErr is the last list or watch failure logged; guarded by mu.
	watchErr string
	counts   map[config.Role]int
}

// kubeRole is one role's selector.
type kubeRole struct {
	role  config.Role
	match labels.Selector
}

// NewKubernetes checks the selectors and builds the Kubernetes client (unless opts.Pods is
// given); it contacts nothing until Run.
func NewKubernetes(opts KubernetesOptions) (*Kubernetes, error) {
	if opts.Sink == nil {
		return nil, errors.New("cannot start kubernetes discovery: no sink")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.NewSet()
	}
	if opts.Reconcilers <= 0 {
		opts.Reconcilers = 4
	}
	if opts.RetryBase <= 0 {
		opts.RetryBase = 500 * time.Millisecond
	}
	if opts.RetryMax <= 0 {
		opts.RetryMax = 30 * time.Second
	}
	cfg := opts.Config
	if opts.Pods == nil {
		pods, err := podsClient(cfg)
		if err != nil {
			return nil, err
		}
		opts.Pods = pods
	}
	k := &Kubernetes{
		cfg:     cfg,
		pods:    opts.Pods,
		sink:    opts.Sink,
		logger:  opts.Logger,
		workers: opts.Reconcilers,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](opts.RetryBase, opts.RetryMax),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "switchyard-discovery"}),
		errs:       map[string]*metrics.Counter{},
		reconciled: opts.OnReconciled,
		owned:      map[string]Spec{},
		failed:     map[string]string{},
		counts:     map[config.Role]int{},
	}
	for _, kind := range []string{discoveryErrWatch, discoveryErrPod, discoveryErrAdd} {
		k.errs[kind] = opts.Metrics.NewCounter(MetricDiscoveryErrors + `{kind="` + kind + `"}`)
	}
	for _, role := range []config.Role{config.RolePlain, config.RolePrefill, config.RoleDecode} {
		sel, ok := cfg.Selectors()[role]
		if !ok {
			continue
		}
		match, err := labels.Parse(sel)
		if err != nil {
			return nil, fmt.Errorf("cannot start kubernetes discovery: %s selector %q: %w", role, sel, err)
		}
		opts.Metrics.NewGauge(MetricDiscoveryWorkers+`{role="`+string(role)+`"}`, func() float64 {
			k.mu.Lock()
			defer k.mu.Unlock()
			return float64(k.counts[role])
		})
		k.roles = append(k.roles, kubeRole{role: role, match: match})
	}
	if len(k.roles) == 0 {
		return nil, errors.New("cannot start kubernetes discovery: no selector")
	}
	server := "" // several selectors: every pod of the namespace, matched here
	if len(k.roles) == 1 {
		server = k.roles[0].match.String()
	}
	k.informer = k.newInformer(server)
	return k, nil
}

// PodClient lists and watches the pods of a namespace ("" for every namespace), as the
// Kubernetes API's core/v1 pods resource serves them. Tests adapt client-go's fake
// clientset to it.
type PodClient interface {
	ListPods(ctx context.Context, namespace string, opts metav1.ListOptions) (*corev1.PodList, error)
	WatchPods(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error)
}

// restPods is the PodClient of a real API server: a REST client that knows the core/v1
// types only (client-go's typed clientset would link every API group into the binary).
type restPods struct {
	c      rest.Interface
	params runtime.ParameterCodec
}

var _ PodClient = restPods{}

// podsClient builds the client from a kubeconfig or the in-cluster configuration.
func podsClient(cfg config.Kubernetes) (PodClient, error) {
	var rc *rest.Config
	var err error
	if cfg.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("cannot start kubernetes discovery: discovery.kubernetes.kubeconfig: %w", err)
		}
	} else if rc, err = rest.InClusterConfig(); err != nil {
		return nil, fmt.Errorf("cannot start kubernetes discovery: no in-cluster configuration (set discovery.kubernetes.kubeconfig outside a cluster): %w", err)
	}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("cannot start kubernetes discovery: %w", err)
	}
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	rc.GroupVersion = &corev1.SchemeGroupVersion
	rc.APIPath = "/api"
	rc.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	rc.UserAgent = "switchyard"
	c, err := rest.RESTClientFor(rc)
	if err != nil {
		return nil, fmt.Errorf("cannot start kubernetes discovery: %w", err)
	}
	return restPods{c: c, params: runtime.NewParameterCodec(scheme)}, nil
}

func (p restPods) ListPods(ctx context.Context, ns string, opts metav1.ListOptions) (*corev1.PodList, error) {
	var timeout time.Duration
	if opts.TimeoutSeconds != nil {
		timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	list := &corev1.PodList{}
	err := p.c.Get().Namespace(ns).Resource("pods").VersionedParams(&opts, p.params).Timeout(timeout).Do(ctx).Into(list)
	return list, err
}

func (p restPods) WatchPods(ctx context.Context, ns string, opts metav1.ListOptions) (watch.Interface, error) {
	var timeout time.Duration
	if opts.TimeoutSeconds != nil {
		timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	opts.Watch = true
	return p.c.Get().Namespace(ns).Resource("pods").VersionedParams(&opts, p.params).Timeout(timeout).Watch(ctx)
}

// newInformer makes the informer of the pods that sel selects ("": all of the namespace).
// One informer serves every role, so that a pod is matched to its role from one consistent
// view of its labels.
func (k *Kubernetes) newInformer(sel string) cache.SharedIndexInformer {
	ns := k.cfg.Namespace // "": every namespace
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sel
			return k.pods.ListPods(ctx, ns, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel
			return k.pods.WatchPods(ctx, ns, o)
		},
	}
	inf := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, k.pods), &corev1.Pod{},
		cache.SharedIndexInformerOptions{ObjectDescription: "engine pods"})
	_ = inf.SetTransform(trimPod)
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		k.errs[discoveryErrWatch].Inc()
		k.mu.Lock()
		changed := k.watchErr != err.Error()
		k.watchErr = err.Error()
		k.mu.Unlock()
		if changed {
			k.logger.Warn("cannot list or watch engine pods; retrying", slog.String("selector", sel),
				slog.String("namespace", ns), slog.Any("error", err))
		}
	})
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			k.queue.Add(key)
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	})
	return inf
}

// trimPod keeps of a pod only what discovery reads, so that the informers' caches hold
// little per pod.
func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	t := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
		Labels: p.Labels, Annotations: p.Annotations, DeletionTimestamp: p.DeletionTimestamp,
	}}
	t.Status.Phase, t.Status.PodIP = p.Status.Phase, p.Status.PodIP
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			t.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	for _, c := range p.Spec.Containers {
		if len(c.Ports) > 0 {
			t.Spec.Containers = append(t.Spec.Containers, corev1.Container{Name: c.Name, Ports: c.Ports})
		}
	}
	return t, nil
}

// Run lists and watches the pods and keeps the fleet in step with them until ctx is done.
// client-go's own logs go to the discovery's logger through ctx. The workers discovered
// stay in the fleet when Run returns; the fleet's Stop ends them.
func (k *Kubernetes) Run(ctx context.Context) {
	ctx = klog.NewContext(ctx, logr.FromSlogHandler(k.logger.Handler()))
	var wg sync.WaitGroup
	wg.Go(func() { k.informer.RunWithContext(ctx) })
	for range k.workers {
		wg.Go(func() {
			defer func() {
				if p := recover(); p != nil {
					k.logger.Error("kubernetes discovery panicked", slog.Any("panic", p))
				}
			}()
			for k.next(ctx) {
			}
		})
	}
	k.logger.Info("kubernetes discovery started", slog.String("namespace", k.cfg.Namespace), slog.Int("selectors", len(k.roles)))
	<-ctx.Done()
	k.queue.ShutDown()
	wg.Wait()
}

// Synced reports whether the pods have been listed once.
func (k *Kubernetes) Synced() bool { return k.informer.HasSynced() }

// Owns reports whether the worker with ID id is one this discovery added for a pod (and has
// not removed). Such a worker follows its pod: in a cluster of routers each replica
// discovers the pods itself, and a removal another replica publishes leaves it in place.
func (k *Kubernetes) Owns(id string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, s := range k.owned {
		if s.ID == id {
			return true
		}
	}
	return false
}

// next reconciles one queued pod; false once the queue is shut down.
func (k *Kubernetes) next(ctx context.Context) bool {
	key, quit := k.queue.Get()
	if quit {
		return false
	}
	defer k.queue.Done(key)
	retry := k.reconcile(ctx, key)
	if k.reconciled != nil {
		k.reconciled(key)
	}
	if retry && ctx.Err() == nil {
		k.queue.AddRateLimited(key)
		return true
	}
	k.queue.Forget(key)
	return true
}

// reconcile brings the fleet in line with the pod at key: the worker it should be (none
// when it is gone, not ready or unusable) against the worker it is. It reports whether to
// try again later.
func (k *Kubernetes) reconcile(ctx context.Context, key string) (retry bool) {
	want, problem := k.desired(key)
	k.mu.Lock()
	have, had := k.owned[key]
	k.mu.Unlock()
	if had && want != nil && sameSpec(have, *want) {
		k.settled(key)
		return false
	}
	if had {
		if err := k.sink.RemoveWorker(have.ID); err != nil && !errors.Is(err, ErrWorkerNotFound) {
			k.logger.Warn("cannot remove discovered worker", slog.String("worker", have.ID), slog.Any("error", err))
		}
		k.mu.Lock()
		delete(k.owned, key)
		k.counts[config.Role(have.Role)]--
		k.mu.Unlock()
		k.logger.Info("discovered worker left", slog.String("pod", key), slog.String("worker", have.ID))
	}
	if problem != "" {
		k.problem(key, discoveryErrPod, problem, nil)
		return false
	}
	if want == nil {
		k.settled(key)
		return false
	}
	err := k.sink.AddWorker(ctx, *want)
	switch {
	case err == nil:
		k.mu.Lock()
		k.owned[key] = *want
		k.counts[config.Role(want.Role)]++
		k.mu.Unlock()
		k.settled(key)
		k.logger.Info("discovered worker joined", slog.String("pod", key), slog.String("worker", want.ID), slog.String("url", want.URL),
			slog.String("role", want.Role))
		return false
	case ctx.Err() != nil:
		return false
	case errors.Is(err, ErrWorkerExists), errors.Is(err, ErrInvalidWorker):
		// Another source owns the ID, or the pod describes no usable worker: nothing
		// changes until the pod does.
		k.problem(key, discoveryErrAdd, "cannot add the pod's worker", err)
		return false
	default:
		k.problem(key, discoveryErrAdd, "cannot add the pod's worker yet; retrying", err)
		return true
	}
}

// problem counts a pod's problem and logs it when it differs from the last one logged for
// the pod. A failed add counts at every attempt; a pod that cannot be a worker counts once
// per new reason, however often its events repeat it.
func (k *Kubernetes) problem(key, kind, msg string, err error) {
	text := msg
	if err != nil {
		text += ": " + err.Error()
	}
	k.mu.Lock()
	changed := k.failed[key] != text
	k.failed[key] = text
	k.mu.Unlock()
	if kind == discoveryErrAdd || changed {
		k.errs[kind].Inc()
	}
	if changed {
		attrs := []any{slog.String("pod", key), slog.String("problem", msg)}
		if err != nil {
			attrs = append(attrs, slog.Any("error", err))
		}
		k.logger.Warn("discovered pod not added", attrs...)
	}
}

// settled forgets the pod's last problem.
func (k *Kubernetes) settled(key string) {
	k.mu.Lock()
	delete(k.failed, key)
	k.mu.Unlock()
}

// desired returns the worker the pod at key should be, nil when none (gone, not serving),
// or why it cannot be one.
func (k *Kubernetes) desired(key string) (*Spec, string) {
	obj, ok, err := k.informer.GetStore().GetByKey(key)
	if err != nil || !ok {
		return nil, ""
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, ""
	}
	var role config.Role
	for _, r := range k.roles {
		if !r.match.Matches(labels.Set(pod.Labels)) {
			continue
		}
		if role != "" {
			return nil, fmt.Sprintf("the pod matches the %s and the %s selectors", role, r.role)
		}
		role = r.role
	}
	if role == "" || !podServing(pod) {
		return nil, ""
	}
	return k.specOf(pod, role)
}

// podServing reports whether a pod can take requests: Running, Ready, with an IP, and not
// terminating.
func podServing(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// specOf is the worker a serving pod of role is, or why it cannot be one.
func (k *Kubernetes) specOf(p *corev1.Pod, role config.Role) (*Spec, string) {
	port := k.cfg.Port
	if port == 0 {
		for _, c := range p.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == k.cfg.PortName {
					port = int(cp.ContainerPort)
				}
			}
		}
		if port <= 0 || port > 65535 {
			return nil, fmt.Sprintf("the pod has no container port named %q", k.cfg.PortName)
		}
	}
	spec := &Spec{
		ID:     PodWorkerID(p.Namespace, p.Name),
		URL:    k.cfg.Scheme + "://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(port)),
		Role:   string(role),
		Flavor: k.cfg.Flavor,
	}
	if k.cfg.ModelLabel != "" {
		spec.Model = p.Labels[k.cfg.ModelLabel]
	}
	if a := k.cfg.BootstrapPortAnnotation; a != "" && role == config.RolePrefill {
		if v, ok := p.Annotations[a]; ok {
			bp, err := strconv.Atoi(v)
			if err != nil || bp < 1 || bp > 65535 {
				return nil, fmt.Sprintf("annotation %s=%q is not a port", a, v)
			}
			spec.BootstrapPort = &bp
		}
	}
	return spec, ""
}

// PodWorkerID is the worker ID of a discovered pod: "<name>.<namespace>".
func PodWorkerID(namespace, name string) string { return name + "." + namespace }

// sameSpec reports whether two discovered workers are the same worker: equal fields, the
// bootstrap port and labels compared by value.
func sameSpec(a, b Spec) bool {
	if !maps.Equal(a.Labels, b.Labels) {
		return false
	}
	a.Labels, b.Labels = nil, nil
	return reflect.DeepEqual(a, b)
}
