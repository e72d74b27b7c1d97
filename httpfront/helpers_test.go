package httpfront

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/httpfront/fleet"
)

// fakeEngine is a hand-written SGLang-like engine on a loopback port: chat, completions and
// /generate (plain, prefill or decode role), SSE streaming with an optional gate after the
// first chunk, /health, /server_info, and fault injection. A decode engine refuses requests
// whose bootstrap fields do not name its expected prefill engine.
type fakeEngine struct {
	t     *testing.T
	id    string
	model string
	mode  string // "", "prefill", "decode"
	// bootstrapPort is what a prefill engine advertises.
	bootstrapPort int
	// expectHost/expectPort are what a decode engine requires (expectPort 0: null; anyPort:
	// any bootstrap port).
	expectHost string
	expectPort int
	anyPort    bool
	// canPrefill: a decode engine also serves a request without bootstrap fields alone.
	canPrefill bool
	// dpSize is what /server_info advertises; 0 means 1.
	dpSize int

	ln  net.Listener
	srv *fasthttp.Server
	url string

	health   atomic.Int32 // status of /health; 0 means 200
	fail     atomic.Int32 // status answered to inference; 0 means normal
	noInfo   atomic.Bool  // /server_info and /get_server_info answer 404
	hits     atomic.Int64
	aborts   atomic.Int64   // POST /abort_request calls
	chunks   int            // stream chunks after the first
	gate     chan struct{}  // when set, a stream waits here after its first chunk
	hold     chan struct{}  // when set, a non-stream answer waits here
	delay    chan struct{}  // when set, every inference request waits here before anything (fail included)
	entered  chan struct{}  // when set, receives as a held non-stream request starts waiting
	streamed chan struct{}  // receives after a stream's first chunk was flushed (dropped when 16 wait unread)
	gone     chan struct{}  // receives when a stream write fails (client side closed; dropped likewise)
	silent   bool           // a gated stream sends nothing while it waits
	flood    bool           // after its first chunk, a stream sends 64 KiB events until the write fails
	info     map[string]any // extra /server_info fields
	// tls, when set, makes the engine serve https with it (withTLS).
	tls *tls.Config
	// raw records the first byte of every connection (TLS engines).
	raw *firstByteListener
	// polled, when set, receives the path of every load poll (without blocking).
	polled chan string
	// lora, when set, makes the engine serve LoRA adapters (withLoRA).
	lora *fakeLoRA

	done     chan struct{}
	killOnce sync.Once

	mu      sync.Mutex
	bodies  [][]byte
	headers []http.Header
	// peers lists "<path> <client certificate CN>" for every request over TLS ("-" when
	// the client showed no certificate).
	peers []string
	paths []string
}

type engineOpt func(*fakeEngine)

func withMode(mode string) engineOpt { return func(e *fakeEngine) { e.mode = mode } }

// withTLS makes the engine serve https with cfg.
func withTLS(cfg *tls.Config) engineOpt { return func(e *fakeEngine) { e.tls = cfg } }

// firstByteListener records the first byte every accepted connection sends: 0x16 opens a
// TLS handshake; anything else was sent in clear text.
type firstByteListener struct {
	net.Listener
	mu    sync.Mutex
	first []byte
}

func (l *firstByteListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &firstByteConn{Conn: c, l: l}, nil
}

// firsts returns the first bytes recorded so far.
func (l *firstByteListener) firsts() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]byte(nil), l.first...)
}

type firstByteConn struct {
	net.Conn
	l    *firstByteListener
	seen bool
}

func (c *firstByteConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && !c.seen {
		c.seen = true
		c.l.mu.Lock()
		c.l.first = append(c.l.first, b[0])
		c.l.mu.Unlock()
	}
	return n, err
}

// withInfo adds fields to the engine's /server_info answer.
func withInfo(kv ...any) engineOpt {
	return func(e *fakeEngine) {
		if e.info == nil {
			e.info = map[string]any{}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			e.info[kv[i].(string)] = kv[i+1]
		}
	}
}

// fakeLoRA is a fake engine's LoRA adapters: listed in /v1/models with the base model as
// parent, loaded and unloaded through vLLM's routes; calls records each call in order.
type fakeLoRA struct {
	mu    sync.Mutex
	names []string
	calls []string // "load NAME" or "unload NAME"
	// gate, when set (withLoRALoadGate), holds every load until the test closes it; loading
	// receives as a load starts waiting there. loadStatus, when not 0, is the status of the
	// loads answered after it is set (the adapter is then not loaded).
	gate       chan struct{}
	loading    chan struct{}
	loadStatus atomic.Int32
}

// withLoRA makes the engine serve LoRA adapters, holding names at start, with slots
// adapter slots (advertised as max_loaded_loras).
func withLoRA(slots int, names ...string) engineOpt {
	return func(e *fakeEngine) {
		e.lora = &fakeLoRA{names: names}
		withInfo("max_loaded_loras", slots)(e)
	}
}

// withLoRALoadGate holds the engine's adapter loads until the test closes e.lora.gate
// (after withLoRA).
func withLoRALoadGate() engineOpt {
	return func(e *fakeEngine) {
		e.lora.gate, e.lora.loading = make(chan struct{}), make(chan struct{}, 16)
	}
}

// loraState returns the adapters the engine holds and the load and unload calls it got.
func (e *fakeEngine) loraState() (names, calls []string) {
	e.lora.mu.Lock()
	defer e.lora.mu.Unlock()
	return slices.Clone(e.lora.names), slices.Clone(e.lora.calls)
}

// serveLoRA answers the LoRA routes; it reports whether the path was one.
func (e *fakeEngine) serveLoRA(ctx *fasthttp.RequestCtx) bool {
	l := e.lora
	var req struct {
		Name string `json:"lora_name"`
	}
	switch string(ctx.Path()) {
	case "/v1/models":
		l.mu.Lock()
		data := []map[string]any{{"id": e.model, "object": "model", "parent": nil}}
		for _, n := range l.names {
			data = append(data, map[string]any{"id": n, "object": "model", "parent": e.model, "root": "/adapters/" + n})
		}
		l.mu.Unlock()
		b, _ := json.Marshal(map[string]any{"object": "list", "data": data})
		ctx.SetContentType("application/json")
		ctx.SetBody(b)
	case "/v1/load_lora_adapter":
		_ = json.Unmarshal(ctx.PostBody(), &req)
		l.mu.Lock()
		l.calls = append(l.calls, "load "+req.Name)
		l.mu.Unlock()
		if l.gate != nil {
			select {
			case l.loading <- struct{}{}:
			default:
			}
			<-l.gate
		}
		if st := l.loadStatus.Load(); st != 0 {
			ctx.SetStatusCode(int(st))
			ctx.SetBodyString(`{"error":{"message":"cannot load the lora adapter"}}`)
			return true
		}
		l.mu.Lock()
		l.names = append(l.names, req.Name)
		l.mu.Unlock()
	case "/v1/unload_lora_adapter":
		_ = json.Unmarshal(ctx.PostBody(), &req)
		l.mu.Lock()
		l.calls = append(l.calls, "unload "+req.Name)
		n := len(l.names)
		l.names = slices.DeleteFunc(l.names, func(s string) bool { return s == req.Name })
		l.mu.Unlock()
		if len(l.names) == n {
			ctx.SetStatusCode(404)
			ctx.SetBodyString(`{"error":{"message":"The lora adapter '` + req.Name + `' cannot be found."}}`)
		}
	default:
		return false
	}
	return true
}

func withGate() engineOpt {
	return func(e *fakeEngine) { e.gate = make(chan struct{}) }
}

func newFakeEngine(t *testing.T, id, model string, opts ...engineOpt) *fakeEngine {
	t.Helper()
	e := &fakeEngine{t: t, id: id, model: model, chunks: 3,
		streamed: make(chan struct{}, 16), gone: make(chan struct{}, 16)}
	for _, o := range opts {
		o(e)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.ln = ln
	e.url = "http://" + ln.Addr().String()
	if e.tls != nil {
		e.raw = &firstByteListener{Listener: ln}
		ln = tls.NewListener(e.raw, e.tls)
		e.url = "https://" + e.ln.Addr().String()
	}
	e.srv = &fasthttp.Server{Handler: e.handle, CloseOnShutdown: true, IdleTimeout: time.Second,
		Logger: fasthttpLogger{slog.New(slog.DiscardHandler)}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = e.srv.Serve(ln)
	}()
	e.done = done
	t.Cleanup(func() {
		if e.delay != nil {
			select {
			case <-e.delay:
			default:
				close(e.delay)
			}
		}
		if e.gate != nil {
			select {
			case <-e.gate:
			default:
				close(e.gate)
			}
		}
		if e.lora != nil && e.lora.gate != nil {
			select {
			case <-e.lora.gate:
			default:
				close(e.lora.gate)
			}
		}
		if e.hold != nil {
			select {
			case <-e.hold:
			default:
				close(e.hold)
			}
		}
		e.kill()
	})
	return e
}

// kill stops the engine as a killed process stops: it accepts nothing more and its open
// connections close. It may be called more than once.
func (e *fakeEngine) kill() {
	e.killOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = e.srv.ShutdownWithContext(ctx)
		_ = e.ln.Close()
		<-e.done
	})
}

// requested returns "METHOD /path" of every request the engine served beyond /health and
// introspection.
func (e *fakeEngine) requested() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.paths...)
}

func (e *fakeEngine) received() ([][]byte, []http.Header) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([][]byte(nil), e.bodies...), append([]http.Header(nil), e.headers...)
}

func (e *fakeEngine) handle(ctx *fasthttp.RequestCtx) {
	ctx.Response.Header.Set("X-Worker-Id", e.id)
	if st := ctx.TLSConnectionState(); st != nil {
		cn := "-"
		if len(st.PeerCertificates) > 0 {
			cn = st.PeerCertificates[0].Subject.CommonName
		}
		e.mu.Lock()
		e.peers = append(e.peers, string(ctx.Path())+" "+cn)
		e.mu.Unlock()
	}
	switch string(ctx.Path()) {
	case "/health":
		if s := e.health.Load(); s != 0 {
			ctx.SetStatusCode(int(s))
		}
		return
	case "/v1/loads", "/get_load", "/metrics":
		if e.polled != nil {
			select {
			case e.polled <- string(ctx.Path()):
			default:
			}
		}
		ctx.SetStatusCode(404) // no load reports: every metric stays unknown
		return
	case "/server_info", "/get_server_info":
		if e.noInfo.Load() {
			ctx.SetStatusCode(404)
			return
		}
		info := map[string]any{"model_path": "/models/" + e.model, "served_model_name": e.model,
			"disaggregation_mode": nil, "dp_size": max(e.dpSize, 1), "page_size": 16}
		if e.mode != "" {
			info["disaggregation_mode"] = e.mode
		}
		if e.mode == "prefill" {
			info["disaggregation_bootstrap_port"] = e.bootstrapPort
		}
		for k, v := range e.info {
			info[k] = v
		}
		b, _ := json.Marshal(info)
		ctx.SetContentType("application/json")
		ctx.SetBody(b)
		return
	}
	if string(ctx.Path()) == fleet.PathAbort {
		e.aborts.Add(1)
		return
	}
	if e.lora != nil && e.serveLoRA(ctx) {
		return
	}
	e.hits.Add(1)
	body := append([]byte(nil), ctx.PostBody()...)
	h := http.Header{}
	for k, v := range ctx.Request.Header.All() {
		h.Add(string(k), string(v))
	}
	e.mu.Lock()
	e.bodies = append(e.bodies, body)
	e.headers = append(e.headers, h)
	e.paths = append(e.paths, string(ctx.Method())+" "+string(ctx.Path()))
	e.mu.Unlock()
	if e.delay != nil {
		<-e.delay
	}
	if s := e.fail.Load(); s != 0 {
		ctx.SetStatusCode(int(s))
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"injected failure","code":` + strconv.Itoa(int(s)) + `}}`)
		return
	}
	var req map[string]any
	_ = json.Unmarshal(body, &req)
	if _, paired := req["bootstrap_host"]; e.mode == "decode" && (paired || !e.canPrefill) {
		if msg := e.checkBootstrap(req); msg != "" {
			ctx.SetStatusCode(400)
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"error":{"message":"` + msg + `"}}`)
			return
		}
	}
	logprob := -0.5
	if e.mode == "prefill" {
		logprob = -0.1
	}
	meta := `"meta_info":{"id":"` + e.id + `","input_token_logprobs":[[` + strconv.FormatFloat(logprob, 'f', -1, 64) + `,1,null]]}`
	if stream, _ := req["stream"].(bool); stream {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			write := func(s string) bool {
				_, _ = w.WriteString(s)
				if err := w.Flush(); err != nil {
					signal(e.gone)
					return false
				}
				return true
			}
			if !write(`data: {"id":"c0","text":"tok0",` + meta + "}\n\n") {
				return
			}
			signal(e.streamed)
			if e.flood {
				ev := `data: {"id":"f","text":"` + strings.Repeat("x", 64<<10) + `"}` + "\n\n"
				for write(ev) {
				}
				return
			}
			if e.gate != nil {
				// Keep writing heartbeats-like nothing: wait, but notice a vanished client
				// by probing with SSE comments.
				t := time.NewTicker(5 * time.Millisecond)
				defer t.Stop()
				for waiting := true; waiting; {
					select {
					case <-e.gate:
						waiting = false
					case <-t.C:
						if !e.silent && !write(": ping\n\n") {
							return
						}
					}
				}
			}
			for i := 1; i <= e.chunks; i++ {
				if !write(`data: {"id":"c` + strconv.Itoa(i) + `","text":"tok` + strconv.Itoa(i) + `"}` + "\n\n") {
					return
				}
			}
			write("data: [DONE]\n\n")
		})
		return
	}
	if e.hold != nil {
		if e.entered != nil {
			e.entered <- struct{}{}
		}
		<-e.hold
	}
	ctx.SetContentType("application/json")
	ctx.SetBodyString(`{"id":"r-` + e.id + `","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello from ` + e.id + `"}}],` + meta + `}`)
}

func (e *fakeEngine) checkBootstrap(req map[string]any) string {
	host, ok := req["bootstrap_host"].(string)
	if !ok || host != e.expectHost {
		return "bad bootstrap_host"
	}
	switch p := req["bootstrap_port"].(type) {
	case nil:
		if e.expectPort != 0 {
			return "missing bootstrap_port"
		}
	case float64:
		if int(p) != e.expectPort && !e.anyPort {
			return "bad bootstrap_port"
		}
	default:
		return "bad bootstrap_port type"
	}
	room, ok := req["bootstrap_room"].(float64)
	if !ok || room < 0 {
		return "bad bootstrap_room"
	}
	return ""
}

// Configuration builders.

func ptr[T any](v T) *T { return &v }

func plainWorker(id, url, model string) config.Worker {
	return config.Worker{ID: id, URL: url, Model: model, Role: config.RolePlain, DPSize: 1}
}

func plainBucket(id string, maxInput, maxContext *int64, workers ...string) config.Bucket {
	ids := append([]string{}, workers...)
	return config.Bucket{ID: id, Limits: config.Limits{Max: maxInput}, MaxContextTokens: maxContext,
		Groups: config.Groups{Plain: &config.Group{WorkerIDs: &ids}}}
}

func baseConfig() *config.Config {
	cfg := config.Default()
	cfg.Server.Port = 0
	cfg.Server.DrainTimeout = 5 * time.Second
	cfg.Health.Interval = time.Hour // tests drive health rounds themselves
	cfg.Health.Timeout = 2 * time.Second
	// A prefix lookup past cache_aware.query_timeout routes as a miss; the default 100 ms
	// passes on a loaded machine before the index's shard actors run.
	cfg.CacheAware.QueryTimeout = 10 * time.Second
	return cfg
}

// testServer is a running Server with its base URL.
type testServer struct {
	*Server
	url    string
	cancel context.CancelFunc
	done   chan error
}

func startServer(t *testing.T, cfg *config.Config, opts Options) *testServer {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("invalid test configuration: %v", err)
	}
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = 20 * time.Millisecond
	}
	s, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{Server: s, url: "http://" + s.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { ts.done <- s.Run(ctx) }()
	select {
	case <-s.serving:
	case <-time.After(30 * time.Second):
		t.Fatal("server did not start serving")
	}
	t.Cleanup(func() {
		ts.stop(t)
		ts.assertIdle(t)
	})
	return ts
}

func (ts *testServer) stop(t *testing.T) {
	t.Helper()
	ts.cancel()
	select {
	case err, ok := <-ts.done:
		if !ok {
			return // stopped already
		}
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		close(ts.done)
	case <-time.After(30 * time.Second):
		t.Fatal("server did not stop")
	}
}

// assertIdle checks that every in-flight gauge is back to zero.
func (ts *testServer) assertIdle(t *testing.T) {
	t.Helper()
	if n := ts.tracker.Outstanding(); n != 0 {
		t.Errorf("%d in-flight guards outstanding", n)
	}
	for _, w := range ts.wset.Load().Workers() {
		if n := w.Counters.InFlight(); n != 0 {
			t.Errorf("worker %s: in-flight %d", w.ID, n)
		}
	}
	if n := ts.metrics.inflight.Load(); n != 0 {
		t.Errorf("router in-flight gauge %d", n)
	}
}

var testClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableCompression: true}}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) errorCode() string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(r.body, &e)
	return e.Error.Code
}

func post(t *testing.T, url, body string, headers ...string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return do(t, req)
}

// postRaw posts body over a plain TCP connection and reads the answer even when the server
// answers (and closes) before the body is all written, as it does for a body over the size
// limit: an http.Client may then report the broken pipe instead of the answer.
func postRaw(t *testing.T, rawURL, body string, headers ...string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, rawURL, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	conn, err := net.DialTimeout("tcp", req.URL.Host, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		_ = req.Write(conn) // may fail once the server has answered and closed
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		conn.Close()
		<-wrote
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	conn.Close()
	<-wrote
	if err != nil {
		t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

func do(t *testing.T, req *http.Request) response {
	t.Helper()
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// doMethod sends a request of method with no body.
func doMethod(t *testing.T, method, url string, headers ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return do(t, req)
}

func get(t *testing.T, url string, headers ...string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return do(t, req)
}

func chatBody(model, content string, extra string) string {
	b, _ := json.Marshal(content)
	s := `{"model":"` + model + `","messages":[{"role":"user","content":` + string(b) + `}]`
	if extra != "" {
		s += "," + extra
	}
	return s + "}"
}

// signal sends on ch without blocking: a stream of a test that does not read its signals
// must not hang in the engine (and hold its connection past the test) once the buffer is full.
func signal(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// waitFor waits for a signal on ch, failing after a bounded deadline.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// waitBackground waits until every request-owned goroutine of ts that outlives its handler
// (stream relays, prefill requests) has ended: after it, their guards and gauges are
// released. No handler may be running (one could start another such goroutine).
func (ts *testServer) waitBackground(t *testing.T) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		ts.bg.Wait()
		close(done)
	}()
	waitFor(t, done, "the server's streams and prefill requests to end")
}

// waitUntil waits until cond holds, for at most 10 s, looking again every few milliseconds.
// It is for state the server signals no event for (a connection's release after the socket
// closed); prefer an event (waitFor, waitBackground).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

// fakeClock is a manually advanced clock (fleet.Clock): Advance runs the timers that fall
// due, in order, on the caller's goroutine.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	// scheduled and stopped, when set, receive (without blocking) each timer's duration as
	// it is scheduled and a signal as a pending timer is stopped.
	scheduled chan time.Duration
	stopped   chan struct{}
}

type fakeTimer struct {
	at      time.Time
	f       func()
	stopped bool
}

var _ fleet.Clock = (*fakeClock)(nil)

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	if c.scheduled != nil {
		select {
		case c.scheduled <- d:
		default:
		}
	}
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		was := !t.stopped
		t.stopped = true
		if was && c.stopped != nil {
			select {
			case c.stopped <- struct{}{}:
			default:
			}
		}
		return was
	}
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*fakeTimer
	rest := c.timers[:0]
	for _, t := range c.timers {
		switch {
		case t.stopped:
		case !t.at.After(c.now):
			t.stopped = true
			due = append(due, t)
		default:
			rest = append(rest, t)
		}
	}
	c.timers = rest
	c.mu.Unlock()
	slices.SortFunc(due, func(a, b *fakeTimer) int { return a.at.Compare(b.at) })
	for _, t := range due {
		t.f()
	}
}

// stubSelector answers every selection with a fixed error.
type stubSelector struct{ err error }

func (s stubSelector) Select(*engine.BucketResolver, *engine.BucketRequest) (engine.BucketPick, error) {
	return engine.BucketPick{}, s.err
}

var _ selector = stubSelector{}

func contains(b []byte, s string) bool { return bytes.Contains(b, []byte(s)) }

// closeSignalListener closes closed once the server has closed it.
type closeSignalListener struct {
	net.Listener
	once   sync.Once
	closed chan struct{}
}

// listenSignallingClose listens on a loopback port the OS chooses; the listener's closed
// channel closes once the server closes it.
func listenSignallingClose(t *testing.T) *closeSignalListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return &closeSignalListener{Listener: ln, closed: make(chan struct{})}
}

func (l *closeSignalListener) Close() error {
	err := l.Listener.Close()
	l.once.Do(func() { close(l.closed) })
	return err
}

// routerRID matches the "rid" member the router adds to a body for an engine with an abort
// API when the client sent none (abort.go).
var routerRID = regexp.MustCompile(`,?"rid":"switchyard-[0-9a-f]{32}"`)

// withoutRouterRID is body without the rid the router added: what the client sent.
func withoutRouterRID(body []byte) []byte {
	return routerRID.ReplaceAll(body, nil)
}

// sendChat opens a connection to ts and writes a chat completion request with body on it,
// without reading the answer: the test closes the connection to play a client that leaves.
func sendChat(t *testing.T, ts *testServer, body string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", ts.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)); err != nil {
		t.Fatal(err)
	}
	return conn
}
