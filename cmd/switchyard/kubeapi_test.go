package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// kubeAPI is a minimal Kubernetes API server for tests: the pods of the core group, listed
// and watched over HTTPS (a certificate made for the test) as a real API server serves them (resource versions, label and
// namespace filtering, a watch that sends DELETED when an object stops matching its
// selector and ADDED when it starts to, watch-list requests answered with the initial
// events and the initial-events-end bookmark), behind a bearer token. The test drives it:
// it creates, updates and deletes pods, and counts the events it delivered.
type kubeAPI struct {
	t      *testing.T
	token  string
	srv    *http.Server
	ln     net.Listener
	mu     sync.Mutex
	rv     int64
	pods   map[string]*corev1.Pod // namespace/name → pod
	events []kubeEvent            // every change, in resource-version order
	subs   map[*kubeWatch]struct{}
	// delivered counts the watch events sent to clients by pod (namespace/name).
	delivered map[string]int
	requests  []string // method and path?query of every request
	certPEM   []byte   // the server's certificate, its own authority
	wg        sync.WaitGroup
	closed    chan struct{}
}

// kubeEvent is one change: the pod before (nil: created) and after (nil: deleted).
type kubeEvent struct {
	rv       int64
	old, new *corev1.Pod
}

// kubeWatch is one open watch.
type kubeWatch struct {
	ns  string // "": every namespace
	sel labels.Selector
	ch  chan kubeEvent
}

// startKubeAPI starts the server on a loopback port; it is closed at the end of the test.
func startKubeAPI(t *testing.T) *kubeAPI {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &kubeAPI{t: t, token: "test-token", ln: ln, pods: map[string]*corev1.Pod{}, subs: map[*kubeWatch]struct{}{},
		delivered: map[string]int{}, closed: make(chan struct{})}
	cert, key := selfSignedCert(t)
	a.certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert})
	a.srv = &http.Server{Handler: http.HandlerFunc(a.serve), TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12,
		Certificates: []tls.Certificate{{Certificate: [][]byte{cert}, PrivateKey: key}}}}
	a.wg.Go(func() { _ = a.srv.ServeTLS(ln, "", "") })
	t.Cleanup(func() {
		close(a.closed)
		_ = a.srv.Close()
		a.wg.Wait()
	})
	return a
}

// URL is the server's base URL.
func (a *kubeAPI) URL() string { return "https://" + a.ln.Addr().String() }

// selfSignedCert makes a certificate for 127.0.0.1 that is its own authority.
func selfSignedCert(t *testing.T) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

// kubeconfig writes a kubeconfig naming the server and its token, and returns its path.
func (a *kubeAPI) kubeconfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	doc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
  - name: test
    cluster: {server: %q, certificate-authority-data: %q}
users:
  - name: router
    user: {token: %q}
contexts:
  - name: test
    context: {cluster: test, user: router}
current-context: test
`, a.URL(), base64.StdEncoding.EncodeToString(a.certPEM), a.token)
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// apply stores p (created or replaced; nil deletes namespace/name) and tells the watches.
func (a *kubeAPI) apply(ns, name string, p *corev1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := ns + "/" + name
	old := a.pods[key]
	if old == nil && p == nil {
		return
	}
	a.rv++
	if p != nil {
		p = p.DeepCopy()
		p.Namespace, p.Name = ns, name
		p.ResourceVersion = strconv.FormatInt(a.rv, 10)
		if old == nil {
			p.UID = types.UID("uid-" + key)
		} else {
			p.UID = old.UID
		}
		a.pods[key] = p
	} else {
		delete(a.pods, key)
	}
	ev := kubeEvent{rv: a.rv, old: old, new: p}
	a.events = append(a.events, ev)
	for w := range a.subs {
		select {
		case w.ch <- ev:
		default:
			// A watcher that does not keep up is closed, as a real API server does; the
			// client lists again.
			close(w.ch)
			delete(a.subs, w)
		}
	}
}

// put creates or replaces a pod.
func (a *kubeAPI) put(p *corev1.Pod) { a.apply(p.Namespace, p.Name, p) }

// remove deletes a pod.
func (a *kubeAPI) remove(ns, name string) { a.apply(ns, name, nil) }

// deliveredEvents is how many watch events about a pod the server has sent.
func (a *kubeAPI) deliveredEvents(ns, name string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.delivered[ns+"/"+name]
}

// watchers is how many watches are open.
func (a *kubeAPI) watchers() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.subs)
}

// translate is what a watch of ns and sel sees of ev: ADDED, MODIFIED or DELETED and the
// object, or "" for nothing.
func (w *kubeWatch) translate(ev kubeEvent) (string, *corev1.Pod) {
	in := func(p *corev1.Pod) bool {
		return p != nil && (w.ns == "" || p.Namespace == w.ns) && w.sel.Matches(labels.Set(p.Labels))
	}
	was, is := in(ev.old), in(ev.new)
	switch {
	case !was && is:
		return "ADDED", ev.new
	case was && is:
		return "MODIFIED", ev.new
	case was && !is:
		gone := ev.old.DeepCopy()
		gone.ResourceVersion = strconv.FormatInt(ev.rv, 10)
		return "DELETED", gone
	}
	return "", nil
}

func (a *kubeAPI) fail(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status: metav1.StatusFailure, Code: int32(code), Reason: metav1.StatusReason(reason), Message: msg})
}

func (a *kubeAPI) serve(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	a.requests = append(a.requests, r.Method+" "+r.URL.RequestURI())
	a.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer "+a.token {
		a.fail(w, http.StatusUnauthorized, "Unauthorized", "Unauthorized")
		return
	}
	var ns string
	switch path := r.URL.Path; {
	case path == "/api/v1/pods":
	case strings.HasPrefix(path, "/api/v1/namespaces/") && strings.HasSuffix(path, "/pods"):
		ns = strings.TrimSuffix(strings.TrimPrefix(path, "/api/v1/namespaces/"), "/pods")
	default:
		a.fail(w, http.StatusNotFound, "NotFound", "the server could not find the requested resource")
		return
	}
	if r.Method != http.MethodGet {
		a.fail(w, http.StatusMethodNotAllowed, "MethodNotAllowed", "the server does not allow this method")
		return
	}
	q := r.URL.Query()
	sel, err := labels.Parse(q.Get("labelSelector"))
	if err != nil {
		a.fail(w, http.StatusBadRequest, "BadRequest", "invalid labelSelector: "+err.Error())
		return
	}
	kw := &kubeWatch{ns: ns, sel: sel}
	if q.Get("watch") == "true" || q.Get("watch") == "1" {
		a.watch(w, r, kw)
		return
	}
	a.mu.Lock()
	list := corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"},
		ListMeta: metav1.ListMeta{ResourceVersion: strconv.FormatInt(a.rv, 10)}}
	for _, p := range a.pods {
		if kind, obj := kw.translate(kubeEvent{new: p}); kind != "" {
			list.Items = append(list.Items, *obj)
		}
	}
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}

// watch streams the events of kw: with sendInitialEvents, the current pods then the
// initial-events-end bookmark; else the changes after resourceVersion.
func (a *kubeAPI) watch(w http.ResponseWriter, r *http.Request, kw *kubeWatch) {
	q := r.URL.Query()
	initial := q.Get("sendInitialEvents") == "true"
	var since int64
	if !initial {
		if v := q.Get("resourceVersion"); v != "" && v != "0" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				a.fail(w, http.StatusBadRequest, "BadRequest", "invalid resourceVersion")
				return
			}
			since = n
		} else {
			since = -1 // "0" or none: from now
		}
	}
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Transfer-Encoding", "chunked")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	send := func(kind string, obj *corev1.Pod, count bool) bool {
		raw, err := json.Marshal(obj)
		if err != nil {
			a.t.Errorf("kube API: %v", err)
			return false
		}
		if err := enc.Encode(metav1.WatchEvent{Type: kind, Object: runtime.RawExtension{Raw: raw}}); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		if count {
			a.mu.Lock()
			a.delivered[obj.Namespace+"/"+obj.Name]++
			a.mu.Unlock()
		}
		return true
	}

	kw.ch = make(chan kubeEvent, 256)
	a.mu.Lock()
	var backlog []kubeEvent
	var initialPods []*corev1.Pod
	rv := a.rv
	switch {
	case initial:
		for _, p := range a.pods {
			initialPods = append(initialPods, p)
		}
	case since >= 0:
		for _, ev := range a.events {
			if ev.rv > since {
				backlog = append(backlog, ev)
			}
		}
	}
	a.subs[kw] = struct{}{}
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.subs, kw)
		a.mu.Unlock()
	}()

	for _, p := range initialPods {
		if kind, obj := kw.translate(kubeEvent{new: p}); kind != "" && !send(kind, withKind(obj), true) {
			return
		}
	}
	if initial {
		mark := &corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}, ObjectMeta: metav1.ObjectMeta{
			ResourceVersion: strconv.FormatInt(rv, 10), Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
		if !send("BOOKMARK", mark, false) {
			return
		}
	}
	for _, ev := range backlog {
		if kind, obj := kw.translate(ev); kind != "" && !send(kind, withKind(obj), true) {
			return
		}
	}
	for {
		select {
		case ev, ok := <-kw.ch:
			if !ok {
				return
			}
			if kind, obj := kw.translate(ev); kind != "" && !send(kind, withKind(obj), true) {
				return
			}
		case <-r.Context().Done():
			return
		case <-a.closed:
			return
		}
	}
}

func withKind(p *corev1.Pod) *corev1.Pod {
	p = p.DeepCopy()
	p.TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
	return p
}
