package fleet

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/config"
)

// watchfulEngine is an engine written with net/http that notices a caller hanging up, as
// vLLM's server does: a request named "hold" waits until its caller leaves (then gone
// receives) or the test releases it; any other request is answered at once.
type watchfulEngine struct {
	addr    string
	arrived chan string // the dispatch mark of each request, as it arrives
	gone    chan struct{}
	release chan struct{}
	aborts  chan string // the rids /abort_request names
	status  atomic.Int32
}

func startWatchfulEngine(t *testing.T) *watchfulEngine {
	t.Helper()
	e := &watchfulEngine{arrived: make(chan string, 16), gone: make(chan struct{}, 16), release: make(chan struct{}),
		aborts: make(chan string, 16)}
	e.status.Store(http.StatusOK)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(e.serve)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		close(e.release)
		_ = srv.Close()
		<-done
	})
	return e
}

func (e *watchfulEngine) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if r.URL.Path == PathAbort {
		var a struct{ Rid string }
		_ = json.Unmarshal(body, &a)
		e.aborts <- a.Rid
		w.WriteHeader(int(e.status.Load()))
		return
	}
	e.arrived <- r.Header.Get(HeaderDispatch)
	if string(body) == "hold" {
		select {
		case <-r.Context().Done():
			e.gone <- struct{}{}
			return
		case <-e.release:
		}
	}
	_, _ = io.WriteString(w, "ok")
}

// send posts body through u as a cancellable dispatch; before runs once the dispatch is
// marked and before it is sent.
func send(u *Upstream, body string, before func(Cancel)) (Cancel, string, error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI("/v1/completions")
	req.Header.SetHost(u.HostPort())
	req.SetBodyString(body)
	c := u.Cancellable(req)
	defer c.End()
	if before != nil {
		before(c)
	}
	err := u.Do(req, resp, time.Now().Add(30*time.Second))
	return c, string(resp.Body()), err
}

func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s after 10s", what)
		var zero T
		return zero
	}
}

// TestCancelClosesTheDispatchConnection: cancelling a dispatch that waits for its answer
// closes its connection (the engine sees its caller leave, the dispatch fails at once);
// cancelling before the dispatch is sent closes the connection it is sent on; a Cancel
// after the dispatch is over touches nothing, not even the connection a later dispatch
// reuses.
func TestCancelClosesTheDispatchConnection(t *testing.T) {
	e := startWatchfulEngine(t)
	u, _ := testUpstream(t, e.addr, config.Upstream{}, nil, nil)

	type result struct {
		c   Cancel
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, _, err := send(u, "hold", nil)
		done <- result{c, err}
	}()
	mark := wait(t, e.arrived, "held dispatch")
	if mark == "" {
		t.Fatal("the dispatch carries no mark")
	}
	// The dispatch's Cancel is inside send; reach it through the registry, as a watcher
	// holding it would.
	vc := u.cancels.lookup(parseID(t, mark))
	if vc == nil {
		t.Fatal("the dispatch is not registered")
	}
	Cancel{c: vc, gen: vc.state.Load() &^ cancelMask}.Cancel()
	wait(t, e.gone, "the engine seeing its caller leave")
	r := wait(t, done, "the cancelled dispatch's end")
	if r.err == nil || !r.c.Cancelled() {
		t.Fatalf("cancelled dispatch: err %v, cancelled %v", r.err, r.c.Cancelled())
	}

	// Cancelled before it is sent.
	_, _, err := send(u, "hold", func(c Cancel) { c.Cancel() })
	if err == nil {
		t.Fatal("a dispatch cancelled before it was sent succeeded")
	}

	// A Cancel after the end does nothing: the next dispatch reuses the connection.
	c, body, err := send(u, "quick", nil)
	if err != nil || body != "ok" {
		t.Fatalf("quick dispatch: %q, %v", body, err)
	}
	c.Cancel()
	if c.Cancelled() {
		t.Error("a finished dispatch reports a cancel")
	}
	if _, body, err := send(u, "quick", nil); err != nil || body != "ok" {
		t.Fatalf("the dispatch after a late Cancel: %q, %v", body, err)
	}
	if n := u.cancels.pending.Load(); n != 0 {
		t.Errorf("%d dispatches still registered", n)
	}
}

func parseID(t *testing.T, mark string) uint64 {
	t.Helper()
	var id uint64
	for _, ch := range mark {
		if ch < '0' || ch > '9' {
			t.Fatalf("mark %q", mark)
		}
		id = id*10 + uint64(ch-'0')
	}
	return id
}

// TestAbortAPI: Abort posts the rid to /abort_request, JSON-escaped; an engine that refuses
// is an error; which engines are stopped through the API follows their flavour and
// introspection.
func TestAbortAPI(t *testing.T) {
	e := startWatchfulEngine(t)
	f := New(nil, Options{})
	m := &Member{f: f, id: "w", url: "http://" + e.addr, spec: Spec{Flavor: config.FlavorSGLang}}
	m.up, _ = testUpstream(t, e.addr, config.Upstream{}, nil, nil)
	rid := "req-\"1\"\u00e9"
	if err := m.Abort(context.Background(), rid, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := wait(t, e.aborts, "the abort"); got != rid {
		t.Errorf("abort of %q, want %q", got, rid)
	}
	e.status.Store(http.StatusNotFound)
	if err := m.Abort(context.Background(), "x", 5*time.Second); err == nil {
		t.Error("a refused abort is no error")
	}
	for _, tt := range []struct {
		flavor string
		info   bool
		want   bool
	}{
		{config.FlavorSGLang, false, true},
		{config.FlavorVLLM, true, false},
		{config.FlavorAuto, true, true},
		{config.FlavorAuto, false, false},
		{"", true, true},
	} {
		m := &Member{spec: Spec{Flavor: tt.flavor}}
		if tt.info {
			m.info.Store(&Info{})
		}
		if got := m.AbortsByAPI(); got != tt.want {
			t.Errorf("flavor %q introspected %v: AbortsByAPI %v, want %v", tt.flavor, tt.info, got, tt.want)
		}
	}
}

// TestCancelRegistryBeyondTheTable: dispatches whose table slot is still held by an older
// one (more than cancelSlots ids apart) are found all the same, and every one leaves the
// registry at its end.
func TestCancelRegistryBeyondTheTable(t *testing.T) {
	e := startWatchfulEngine(t)
	u, _ := testUpstream(t, e.addr, config.Upstream{}, nil, nil)
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	const n = cancelSlots + 10
	cs := make([]Cancel, n)
	for i := range cs {
		cs[i] = u.Cancellable(req)
	}
	if got := u.cancels.pending.Load(); got != n {
		t.Fatalf("%d dispatches registered, want %d", got, n)
	}
	for i, c := range cs {
		if got := u.cancels.lookup(c.c.id.Load()); got != c.c {
			t.Fatalf("dispatch %d: lookup found %p, want %p", i, got, c.c)
		}
	}
	// The first ends: a later dispatch may take its slot while the colliding one stays found.
	cs[0].End()
	if u.cancels.lookup(cs[cancelSlots].c.id.Load()) != cs[cancelSlots].c {
		t.Fatal("a dispatch in the map is lost once its slot is free")
	}
	for _, c := range cs[1:] {
		c.End()
	}
	if got := u.cancels.pending.Load(); got != 0 {
		t.Fatalf("%d dispatches still registered", got)
	}
	for i := range u.cancels.tab {
		if u.cancels.tab[i].Load() != nil {
			t.Fatalf("slot %d still held", i)
		}
	}
}
