package httpfront

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"switchyard/config"
)

// vllmFake is an independent stand-in for a vLLM OpenAI server, written here with net/http
// (not the mock engine, not the fasthttp fake): it serves what vLLM serves and nothing
// SGLang-specific. Its /metrics page is the captured vLLM page of the load package's test
// data with the scheduler gauges set by the test. Every other path answers 404 the way
// FastAPI does, and is counted.
type vllmFake struct {
	srv     *httptest.Server
	id      string
	mu      sync.Mutex
	page    string
	running int
	waiting int
	hits    map[string]int
	scraped chan struct{}
	served  int
}

var (
	vllmRunningLine = regexp.MustCompile(`(?m)^(vllm:num_requests_running\{[^}]*\}) .*$`)
	vllmWaitingLine = regexp.MustCompile(`(?m)^(vllm:num_requests_waiting\{[^}]*\}) .*$`)
)

func newVLLMFake(t *testing.T, id string, running, waiting int) *vllmFake {
	t.Helper()
	page, err := os.ReadFile("../load/testdata/vllm_metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	f := &vllmFake{id: id, page: string(page), running: running, waiting: waiting, hits: map[string]int{},
		scraped: make(chan struct{}, 1024)}
	f.srv = httptest.NewServer(http.HandlerFunc(f.handle))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *vllmFake) handle(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.hits[r.URL.Path]++
	running, waiting := f.running, f.waiting
	f.mu.Unlock()
	switch {
	case r.URL.Path == "/health" && r.Method == http.MethodGet:
		w.WriteHeader(http.StatusOK)
	case r.URL.Path == "/metrics" && r.Method == http.MethodGet:
		page := vllmRunningLine.ReplaceAllString(f.page, fmt.Sprintf("${1} %d.0", running))
		page = vllmWaitingLine.ReplaceAllString(page, fmt.Sprintf("${1} %d.0", waiting))
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write([]byte(page))
		select {
		case f.scraped <- struct{}{}:
		default:
		}
	case r.URL.Path == "/v1/models" && r.Method == http.MethodGet:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"Qwen/Qwen3-8B","object":"model","created":1772366400,"owned_by":"vllm","root":"Qwen/Qwen3-8B","parent":null,"max_model_len":4096,"permission":[]}]}`))
	case r.URL.Path == "/v1/chat/completions" && r.Method == http.MethodPost:
		f.mu.Lock()
		f.served++
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"chatcmpl-` + f.id + `","object":"chat.completion","created":1772366400,"model":"Qwen/Qwen3-8B",` +
			`"choices":[{"index":0,"message":{"role":"assistant","content":"ok","tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null}],` +
			`"usage":{"prompt_tokens":9,"total_tokens":10,"completion_tokens":1,"prompt_tokens_details":null},"prompt_logprobs":null}`))
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"detail":"Not Found"}`))
	}
}

func (f *vllmFake) hitCount(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hits[path]
}

func (f *vllmFake) servedCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.served
}

// vllmFleet starts a router over a busy engine A (flavor auto: detected) and an idle engine
// B (flavor vllm: declared), one plain bucket with policy p, and waits until the router
// knows both engines' load.
func vllmFleet(t *testing.T, p config.Policy) (*testServer, *vllmFake, *vllmFake) {
	t.Helper()
	a := newVLLMFake(t, "A", 30, 20)
	b := newVLLMFake(t, "B", 1, 0)
	cfg := baseConfig()
	// Each scrape's timeout is the poll interval: 1 s leaves a loaded, race-enabled run
	// time to answer (250 ms did not, at a load average of 20); the loop waits for scrapes,
	// not for time.
	cfg.Load.PollInterval = time.Second
	const model = "Qwen/Qwen3-8B"
	cfg.Workers = []config.Worker{plainWorker("A", a.srv.URL, model), plainWorker("B", b.srv.URL, model)}
	cfg.Workers[1].Flavor = config.FlavorVLLM
	bucket := plainBucket("all", nil, nil, "A", "B")
	bucket.Groups.Plain.Policy = &p
	cfg.Models = map[string]config.Model{model: {Buckets: []config.Bucket{bucket}}}
	ts := startServer(t, cfg, Options{})
	for round := 0; ; round++ {
		waitFor(t, a.scraped, "a scrape of A")
		waitFor(t, b.scraped, "a scrape of B")
		views := workerViews(t, ts)
		if views["A"].Load != nil && views["A"].Load.Known && views["B"].Load != nil && views["B"].Load.Known {
			break
		}
		if round == 100 {
			t.Fatalf("load still unknown after %d scrapes: A %+v, B %+v", round, views["A"].Load, views["B"].Load)
		}
	}
	return ts, a, b
}

func workerViews(t *testing.T, ts *testServer) map[string]workerView {
	t.Helper()
	r := get(t, ts.url+"/workers")
	var body struct {
		Workers []workerView `json:"workers"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil {
		t.Fatalf("GET /workers: %v: %s", err, r.body)
	}
	out := map[string]workerView{}
	for _, v := range body.Workers {
		out[v.ID] = v
	}
	return out
}

// TestRouterReadsVLLMLoad is issue 14 end to end: in front of engines that speak only the
// vLLM API the router knew no load, load_based fell back to in-flight counts and admission
// caps passed. Now it scrapes /metrics, never asks the vLLM-declared engine an SGLang route,
// asks the auto one each native route once, and load_based sends nothing to the busy engine.
func TestRouterReadsVLLMLoad(t *testing.T) {
	ts, a, b := vllmFleet(t, config.Policy{Type: config.PolicyLoadBased})
	for i := range 8 {
		r := post(t, ts.url+"/v1/chat/completions", chatBody("Qwen/Qwen3-8B", fmt.Sprintf("question %d", i), `"max_tokens":1`))
		if r.status != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, r.status, r.body)
		}
	}
	if na, nb := a.servedCount(), b.servedCount(); na != 0 || nb != 8 {
		t.Fatalf("busy A served %d, idle B %d; want 0 and 8", na, nb)
	}

	views := workerViews(t, ts)
	for id, want := range map[string]struct {
		flavor           string
		running, waiting int64
	}{"A": {config.FlavorAuto, 30, 20}, "B": {config.FlavorVLLM, 1, 0}} {
		v := views[id]
		l := v.Load
		if v.Flavor != want.flavor || l == nil || l.Source != "prometheus" || l.Flavor != "vllm" || !l.Known ||
			*l.Running != want.running || *l.Waiting != want.waiting || *l.KVTotal != 4096*16 {
			t.Errorf("worker %s: %+v load %+v", id, v, l)
		}
	}
	for _, path := range []string{"/server_info", "/get_server_info", "/v1/loads", "/get_load"} {
		if n := b.hitCount(path); n != 0 {
			t.Errorf("vllm-declared B was asked %s %d times", path, n)
		}
		if n := a.hitCount(path); n > 1 {
			t.Errorf("auto A was asked %s %d times, want at most once", path, n)
		}
	}
	m := get(t, ts.url+"/metrics")
	for _, want := range []string{
		`switchyard_worker_load_source{worker="A",source="prometheus"} 1`,
		`switchyard_worker_load_source{worker="B",source="prometheus"} 1`,
		`switchyard_worker_load_source{worker="B",source="v1_loads"} 0`,
	} {
		if !strings.Contains(string(m.body), want) {
			t.Errorf("router /metrics lacks %s", want)
		}
	}
}

// TestRouterAdmitsOnVLLMLoad: an admission cap on waiting requests rejects the engine whose
// scraped queue is over it (before, an unknown load passed every cap).
func TestRouterAdmitsOnVLLMLoad(t *testing.T) {
	ts, a, b := vllmFleet(t, config.Policy{Type: config.PolicyRoundRobin,
		Admission: config.Admission{MaxWaitingRequests: ptr[int64](10)}})
	ok, rejected := 0, 0
	for i := range 6 {
		r := post(t, ts.url+"/v1/chat/completions", chatBody("Qwen/Qwen3-8B", fmt.Sprintf("q%d", i), `"max_tokens":1`))
		switch {
		case r.status == http.StatusOK:
			ok++
		case r.status == http.StatusServiceUnavailable && strings.Contains(string(r.body), "max_waiting_requests"):
			rejected++
		default:
			t.Fatalf("request %d: status %d: %s", i, r.status, r.body)
		}
	}
	if ok != 3 || rejected != 3 || a.servedCount() != 0 || b.servedCount() != 3 {
		t.Fatalf("ok %d rejected %d, A served %d, B %d; want round robin's turns on A rejected", ok, rejected, a.servedCount(), b.servedCount())
	}
}
