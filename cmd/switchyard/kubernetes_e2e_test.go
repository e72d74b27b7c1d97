package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"switchyard/bench/mockengine"
)

// enginePod is a pod of namespace ns serving engine e: its container port "http" is the
// engine's port on the pod IP 127.0.0.1. Without ready it is Pending, with no IP.
func enginePod(ns, name string, lbl map[string]string, e *mockengine.Engine, ready bool) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbl},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "lmsysorg/sglang",
			Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: 1}, {Name: "http", ContainerPort: int32(e.Port())}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}},
	}
	if ready {
		p.Status.Phase, p.Status.PodIP, p.Status.PodIPs = corev1.PodRunning, "127.0.0.1", []corev1.PodIP{{IP: "127.0.0.1"}}
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
	}
	return p
}

// unready is p running with its readiness probe failing.
func unready(p *corev1.Pod) *corev1.Pod {
	p = p.DeepCopy()
	for i, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			p.Status.Conditions[i].Status = corev1.ConditionFalse
		}
	}
	return p
}

// routerWorkers is GET /workers by ID.
func routerWorkers(t *testing.T, base string) map[string]map[string]any {
	t.Helper()
	status, body, err := httpGet(base + "/workers")
	if err != nil || status != http.StatusOK {
		t.Fatalf("GET /workers: %d %v %s", status, err, body)
	}
	var list struct {
		Workers []map[string]any `json:"workers"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]any{}
	for _, w := range list.Workers {
		out[w["id"].(string)] = w
	}
	return out
}

// waitWorkers waits until the router's workers satisfy ok.
func waitWorkers(t *testing.T, base, what string, ok func(map[string]map[string]any) bool) {
	t.Helper()
	waitFor(t, what, func() (bool, string) {
		ws := routerWorkers(t, base)
		return ok(ws), fmt.Sprint(ws)
	})
}

// chatVia sends a chat request for model and returns the status and the engines that
// served it (decode or plain, and prefill).
func chatVia(t *testing.T, base, model string, stream bool) (status int, worker, prefill string) {
	t.Helper()
	code, h, body := chatRequest(t, base, model, stream)
	if code == http.StatusOK && stream && !strings.Contains(body, "data: [DONE]") {
		t.Fatalf("stream without [DONE]: %s", body)
	}
	return code, h.Get("X-Switchyard-Worker"), h.Get("X-Switchyard-Prefill-Worker")
}

// TestKubernetesDiscoveryE2E runs `switchyard serve` with Kubernetes discovery against a
// Kubernetes API server written for the test (list and watch of pods over HTTP) in front of
// mock engines: a pod made ready serves within one watch event; one not ready, terminating,
// deleted or relabelled leaves, its in-flight requests finishing; prefill and decode pods
// pair with the bootstrap port of their annotation; configured and admin-API workers stay
// beside the discovered ones.
func TestKubernetesDiscoveryE2E(t *testing.T) {
	api := startKubeAPI(t)
	m1 := startMock(t, mockengine.Config{WorkerID: "m1", Model: "llama", ZeroCost: true})
	m2 := startMock(t, mockengine.Config{WorkerID: "m2", Model: "llama", ZeroCost: true})
	p1 := startMock(t, mockengine.Config{WorkerID: "p1", Model: "llama-pd", Role: mockengine.RolePrefill, Speedup: 50})
	d1 := startMock(t, mockengine.Config{WorkerID: "d1", Model: "llama-pd", Role: mockengine.RoleDecode, Speedup: 50})
	s1 := startMock(t, mockengine.Config{WorkerID: "s1", Model: "llama-static", ZeroCost: true})
	s2 := startMock(t, mockengine.Config{WorkerID: "s2", Model: "llama-static", ZeroCost: true})

	base := runServeConfig(t, fmt.Sprintf(`
server: {host: 127.0.0.1, port: 0, drain_timeout: 5s}
health: {interval: 100ms, timeout: 5s}
discovery:
  kubernetes:
    enabled: true
    kubeconfig: %q
    namespace: serving
    selector: app=engine
    prefill_selector: app=pd,role=prefill
    decode_selector: app=pd,role=decode
    port_name: http
    model_label: example.com/model
workers:
  - {id: static, url: %q, model: llama-static}
models:
  llama:
    buckets: [{id: all, groups: {plain: {policy: {type: round_robin}}}}]
  llama-pd:
    buckets: [{id: pd, groups: {pd: {prefill: {}, decode: {}}}}]
  llama-static:
    buckets: [{id: all, groups: {plain: {}}}]
`, api.kubeconfig(t), s1.URL()))
	waitFor(t, "the discovery's watch", func() (bool, string) { return api.watchers() > 0, "no watch open" })
	if _, _, err := httpPost(base+"/workers", fmt.Sprintf(`{"id":"admin","url":%q}`, s2.URL())); err != nil {
		t.Fatal(err)
	}
	llama := map[string]string{"app": "engine", "example.com/model": "llama"}

	// Pending, and a ready pod of another namespace: no worker.
	e1 := enginePod("serving", "e1", llama, m1, false)
	api.put(e1)
	api.put(enginePod("elsewhere", "x1", llama, m2, true))
	if code, _, _ := chatVia(t, base, "llama", false); code != http.StatusServiceUnavailable {
		t.Fatalf("no ready pod: status %d, want 503", code)
	}

	// Ready: one more watch event, and the pod serves.
	e1 = enginePod("serving", "e1", llama, m1, true)
	api.put(e1)
	waitWorkers(t, base, "e1 joins", func(ws map[string]map[string]any) bool { return ws["e1.serving"] != nil })
	if code, w, _ := chatVia(t, base, "llama", false); code != http.StatusOK || w != "e1.serving" {
		t.Fatalf("after e1 is ready: status %d via %q, want 200 via e1.serving", code, w)
	}
	if n := api.deliveredEvents("serving", "e1"); n != 2 {
		t.Errorf("the pod served after %d watch events about it, want 2 (created pending, then ready)", n)
	}
	if ws := routerWorkers(t, base); ws["x1.elsewhere"] != nil || ws["e1.serving"]["model"] != "llama" ||
		ws["e1.serving"]["url"] != "http://127.0.0.1:"+strconv.Itoa(m1.Port()) {
		t.Errorf("workers %v: want e1.serving on m1's port, model llama from its label, nothing of namespace elsewhere", ws)
	}

	// A second pod; then a request held in e1's engine while e1 is deleted: e1 leaves at
	// once, new requests go to e2, the held one finishes.
	e2 := enginePod("serving", "e2", llama, m2, true)
	api.put(e2)
	waitWorkers(t, base, "e2 joins", func(ws map[string]map[string]any) bool { return ws["e2.serving"] != nil })
	if err := m1.SetFaults(mockengine.Faults{Hang: true}); err != nil {
		t.Fatal(err)
	}
	held := make(chan string, 1)
	go func() {
		for range 2 { // round robin: one of two lands on e1 and hangs; the other returns
			resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(
				`{"model":"llama","messages":[{"role":"user","content":"Hold on."}],"max_tokens":8,"stream":true}`))
			if err != nil {
				held <- err.Error()
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.Header.Get("X-Switchyard-Worker") == "e1.serving" {
				held <- fmt.Sprintf("%d %t", resp.StatusCode, strings.Contains(string(body), "data: [DONE]"))
				return
			}
		}
		held <- "no request reached e1"
	}()
	waitWorkers(t, base, "a request in flight on e1", func(ws map[string]map[string]any) bool {
		return ws["e1.serving"]["in_flight"] == 1.0
	})
	api.remove("serving", "e1")
	waitWorkers(t, base, "e1 leaves", func(ws map[string]map[string]any) bool { return ws["e1.serving"] == nil })
	for range 4 {
		if code, w, _ := chatVia(t, base, "llama", false); code != http.StatusOK || w != "e2.serving" {
			t.Fatalf("after e1 is deleted: status %d via %q, want 200 via e2.serving", code, w)
		}
	}
	if err := m1.SetFaults(mockengine.Faults{}); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-held:
		if got != "200 true" {
			t.Fatalf("the request in flight on the deleted pod: %s, want 200 with [DONE]", got)
		}
	case <-time.After(cacheWait):
		t.Fatal("the request in flight on the deleted pod never finished")
	}

	// Not ready: e2 leaves (503); ready again: back. Terminating, then relabelled: gone.
	api.put(unready(e2))
	waitWorkers(t, base, "e2 leaves when not ready", func(ws map[string]map[string]any) bool { return ws["e2.serving"] == nil })
	if code, _, _ := chatVia(t, base, "llama", false); code != http.StatusServiceUnavailable {
		t.Fatalf("no ready pod: status %d, want 503", code)
	}
	api.put(e2)
	waitWorkers(t, base, "e2 back", func(ws map[string]map[string]any) bool { return ws["e2.serving"] != nil })
	if code, w, _ := chatVia(t, base, "llama", true); code != http.StatusOK || w != "e2.serving" {
		t.Fatalf("e2 ready again: status %d via %q", code, w)
	}
	relabelled := e2.DeepCopy()
	relabelled.Labels = map[string]string{"app": "retired"}
	api.put(relabelled)
	waitWorkers(t, base, "e2 leaves when relabelled", func(ws map[string]map[string]any) bool { return ws["e2.serving"] == nil })

	// Prefill and decode pods: the model from introspection, the bootstrap port from the
	// annotation.
	p := enginePod("serving", "p", map[string]string{"app": "pd", "role": "prefill"}, p1, true)
	p.Annotations = map[string]string{"sglang.ai/bootstrap-port": strconv.Itoa(p1.BootstrapPort())}
	api.put(p)
	api.put(enginePod("serving", "d", map[string]string{"app": "pd", "role": "decode"}, d1, true))
	waitWorkers(t, base, "the PD pair joins", func(ws map[string]map[string]any) bool {
		return ws["p.serving"] != nil && ws["d.serving"] != nil
	})
	ws := routerWorkers(t, base)
	if ws["p.serving"]["role"] != "prefill" || ws["p.serving"]["model"] != "llama-pd" ||
		ws["p.serving"]["bootstrap_port"] != float64(p1.BootstrapPort()) || ws["d.serving"]["role"] != "decode" {
		t.Errorf("PD workers %v / %v", ws["p.serving"], ws["d.serving"])
	}
	for _, stream := range []bool{false, true} {
		if code, w, pw := chatVia(t, base, "llama-pd", stream); code != http.StatusOK || w != "d.serving" || pw != "p.serving" {
			t.Fatalf("PD request (stream %t): status %d via %q and %q", stream, code, w, pw)
		}
	}

	// The configured and the admin-API workers were never touched.
	if ws["static"] == nil || ws["admin"] == nil {
		t.Errorf("configured or admin workers gone: %v", ws)
	}
	if code, w, _ := chatVia(t, base, "llama-static", false); code != http.StatusOK || (w != "static" && w != "admin") {
		t.Errorf("llama-static: %d via %q", code, w)
	}
	// The discovery counts a worker once the fleet has added or removed it: the gauges may
	// trail the worker list just read.
	for series, want := range map[string]float64{
		`switchyard_discovery_workers{role="plain"}`:   0,
		`switchyard_discovery_workers{role="prefill"}`: 1,
		`switchyard_discovery_workers{role="decode"}`:  1,
	} {
		waitFor(t, fmt.Sprintf("%s = %v", series, want), func() (bool, string) {
			got := metricValue(t, base+"/metrics", series)
			return got == want, fmt.Sprint(got)
		})
	}
	// The router lists and watches the way client-go does against a current API server: a
	// watch-list request (the initial events, then the bookmark).
	api.mu.Lock()
	reqs := strings.Join(api.requests, "\n")
	api.mu.Unlock()
	if !strings.Contains(reqs, "sendInitialEvents=true") || !strings.Contains(reqs, "/api/v1/namespaces/serving/pods") {
		t.Errorf("API requests:\n%s", reqs)
	}
}
