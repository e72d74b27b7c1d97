package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"switchyard/bench/harness"
	"switchyard/bench/mockengine"
	"switchyard/config"
	"switchyard/httpfront"
)

// startMock starts a mock engine closed at the end of the test.
func startMock(t testing.TB, cfg mockengine.Config) *mockengine.Engine {
	t.Helper()
	cfg.KVEvents.Disabled = true
	cfg.LoadPublish.Disabled = true
	e, err := mockengine.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// startRouter runs an httpfront.Server for cfg until the end of the test and checks that every
// in-flight gauge is back to zero afterwards.
func startRouter(t testing.TB, cfg *config.Config) (*httpfront.Server, string) {
	t.Helper()
	return startRouterWith(t, cfg, httpfront.Options{HeartbeatInterval: 50 * time.Millisecond})
}

// startRouterWith is startRouter with opts.
func startRouterWith(t testing.TB, cfg *config.Config, opts httpfront.Options) (*httpfront.Server, string) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv, err := httpfront.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if n := srv.Tracker().Outstanding(); n != 0 {
			t.Errorf("%d in-flight guards outstanding", n)
		}
		for _, w := range srv.Workers().Workers() {
			if n := w.Counters.InFlight(); n != 0 {
				t.Errorf("worker %s in-flight %d", w.ID, n)
			}
		}
	})
	url := "http://" + srv.Addr().String()
	waitReady(t, url)
	return srv, url
}

// runServeConfig runs `switchyard serve --config` (runServe, as deployed) on the
// configuration text conf until the end of the test, and returns its base URL once it
// serves.
func runServeConfig(t *testing.T, conf string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "switchyard.yaml")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := &lineWriter{lines: make(chan string, 16)}
	done := make(chan error, 1)
	go func() { done <- runServe(ctx, []string{"--config", path}, out, io.Discard) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("runServe: %v", err)
		}
	})
	select {
	case line := <-out.lines:
		return strings.TrimPrefix(line, "switchyard serving on ")
	case err := <-done:
		t.Fatalf("runServe: %v", err)
	case <-time.After(cacheWait):
		t.Fatal("no serving line")
	}
	return ""
}

// waitReady waits for /readiness to answer 200 (harness.WaitReady, the one readiness poll).
func waitReady(t testing.TB, url string) {
	t.Helper()
	if err := harness.WaitReady(context.Background(), url, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

func chatRequest(t testing.TB, url, model string, stream bool) (int, http.Header, string) {
	t.Helper()
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"Tell me about switchyards."}],"max_tokens":8`
	if stream {
		body += `,"stream":true`
	}
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body+"}"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func TestServeInFrontOfMockEngines(t *testing.T) {
	plain := []*mockengine.Engine{
		startMock(t, mockengine.Config{WorkerID: "m1", Model: "llama", ZeroCost: true}),
		startMock(t, mockengine.Config{WorkerID: "m2", Model: "llama", ZeroCost: true}),
	}
	p := startMock(t, mockengine.Config{WorkerID: "p1", Model: "llama-pd", Role: mockengine.RolePrefill, Speedup: 50})
	d := startMock(t, mockengine.Config{WorkerID: "d1", Model: "llama-pd", Role: mockengine.RoleDecode, Speedup: 50})

	cfg := config.Default()
	cfg.Server.Port = 0
	cfg.Workers = []config.Worker{
		{ID: "m1", URL: plain[0].URL(), Model: "llama", Role: config.RolePlain, DPSize: 1},
		{ID: "m2", URL: plain[1].URL(), Model: "llama", Role: config.RolePlain, DPSize: 1},
		// No bootstrap port configured: introspection finds it.
		{ID: "p1", URL: p.URL(), Model: "llama-pd", Role: config.RolePrefill, DPSize: 1},
		{ID: "d1", URL: d.URL(), Model: "llama-pd", Role: config.RoleDecode, DPSize: 1},
	}
	short, long := int64(64), int64(100000)
	cfg.Models = map[string]config.Model{
		"llama": {Buckets: []config.Bucket{
			{ID: "short", Limits: config.Limits{Max: &short}, Groups: config.Groups{Plain: &config.Group{WorkerIDs: &[]string{"m1"}}}},
			{ID: "long", Limits: config.Limits{Max: &long}, Groups: config.Groups{Plain: &config.Group{WorkerIDs: &[]string{"m2"}}}},
		}},
		"llama-pd": {Buckets: []config.Bucket{{ID: "pd", Groups: config.Groups{PD: &config.PDGroups{
			Prefill: &config.Group{}, Decode: &config.Group{}}}}}},
	}
	srv, url := startRouter(t, cfg)
	if got := srv.Workers().Worker("p1").BootstrapPort; got != p.BootstrapPort() {
		t.Fatalf("introspected bootstrap port %d, want %d", got, p.BootstrapPort())
	}

	t.Run("plain short and long", func(t *testing.T) {
		status, h, body := chatRequest(t, url, "llama", false)
		if status != 200 || h.Get("X-Worker-Id") != "m1" {
			t.Fatalf("status %d worker %q: %s", status, h.Get("X-Worker-Id"), body)
		}
		long := `{"model":"llama","messages":[{"role":"user","content":"` + strings.Repeat("many words here ", 100) + `"}]}`
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(long))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Worker-Id") != "m2" {
			t.Fatalf("long request: status %d worker %q", resp.StatusCode, resp.Header.Get("X-Worker-Id"))
		}
	})
	t.Run("plain streaming", func(t *testing.T) {
		status, _, body := chatRequest(t, url, "llama", true)
		if status != 200 || strings.Count(body, "data: ") < 3 || !strings.HasSuffix(body, "data: [DONE]\n\n") {
			t.Fatalf("status %d body %q", status, body)
		}
	})
	for _, stream := range []bool{false, true} {
		t.Run("pd stream="+map[bool]string{false: "false", true: "true"}[stream], func(t *testing.T) {
			status, h, body := chatRequest(t, url, "llama-pd", stream)
			if status != 200 || h.Get("X-Worker-Id") != "d1" || h.Get("X-Switchyard-Prefill-Worker") != "p1" {
				t.Fatalf("status %d headers %v body %s", status, h, body)
			}
		})
	}
}

func TestServeUnhealthyMockLeavesAndReturns(t *testing.T) {
	a := startMock(t, mockengine.Config{WorkerID: "a", Model: "llama", ZeroCost: true})
	b := startMock(t, mockengine.Config{WorkerID: "b", Model: "llama", ZeroCost: true})
	cfg := config.Default()
	cfg.Server.Port = 0
	cfg.Health.Interval = 20 * time.Millisecond
	cfg.Health.FailureThreshold = 1
	cfg.Health.SuccessThreshold = 1
	cfg.Workers = []config.Worker{
		{ID: "a", URL: a.URL(), Model: "llama", Role: config.RolePlain, DPSize: 1},
		{ID: "b", URL: b.URL(), Model: "llama", Role: config.RolePlain, DPSize: 1},
	}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{{ID: "all", Groups: config.Groups{Plain: &config.Group{}}}}}}
	srv, url := startRouter(t, cfg)

	waitHealth := func(id string, want bool) {
		t.Helper()
		waitFor(t, fmt.Sprintf("worker %s healthy=%v", id, want), func() (bool, string) {
			h := srv.Workers().Worker(id).Healthy()
			return h == want, fmt.Sprintf("healthy=%v", h)
		})
	}
	if err := a.SetFaults(mockengine.Faults{Unhealthy: true}); err != nil {
		t.Fatal(err)
	}
	waitHealth("a", false)
	for range 4 {
		if _, h, _ := chatRequest(t, url, "llama", false); h.Get("X-Worker-Id") != "b" {
			t.Fatalf("traffic reached unhealthy engine %q", h.Get("X-Worker-Id"))
		}
	}
	if err := a.SetFaults(mockengine.Faults{}); err != nil {
		t.Fatal(err)
	}
	waitHealth("a", true)
	seen := map[string]bool{}
	for range 4 {
		_, h, _ := chatRequest(t, url, "llama", false)
		seen[h.Get("X-Worker-Id")] = true
	}
	if !seen["a"] || !seen["b"] {
		t.Fatalf("after recovery traffic went to %v", seen)
	}
}

// lineWriter signals each line written to it.
type lineWriter struct {
	mu    sync.Mutex
	buf   strings.Builder
	lines chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		s := w.buf.String()
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			break
		}
		w.lines <- s[:i]
		w.buf.Reset()
		w.buf.WriteString(s[i+1:])
	}
	return len(p), nil
}

func TestRunServeQuickStart(t *testing.T) {
	e := startMock(t, mockengine.Config{WorkerID: "q", Model: "quick", ZeroCost: true})
	ctx, cancel := context.WithCancel(context.Background())
	out := &lineWriter{lines: make(chan string, 16)}
	done := make(chan error, 1)
	go func() {
		done <- runServe(ctx, []string{"--worker-urls", e.URL(), "--model", "quick", "--policy", "round_robin",
			"--host", "127.0.0.1", "--port", "0"}, out, io.Discard)
	}()
	var url string
	select {
	case line := <-out.lines:
		url = strings.TrimPrefix(line, "switchyard serving on ")
	case err := <-done:
		t.Fatalf("runServe: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no serving line")
	}
	var access []string
	for len(access) < 3 {
		select {
		case line := <-out.lines:
			access = append(access, line)
		case <-time.After(10 * time.Second):
			t.Fatalf("route access lines: %q", access)
		}
	}
	for i, want := range []string{"data plane (/v1/*, /generate): open", "admin (/workers, /flush_cache):", "/metrics:"} {
		if !strings.Contains(strings.Join(strings.Fields(access[i]), " "), want) {
			t.Errorf("access line %d %q lacks %q", i, access[i], want)
		}
	}
	if !strings.Contains(access[1], "loopback") {
		t.Errorf("admin access on 127.0.0.1 without a key: %q", access[1])
	}
	waitReady(t, url)
	status, h, body := chatRequest(t, url, "quick", false)
	if status != 200 || h.Get("X-Worker-Id") != "q" {
		t.Fatalf("status %d body %s", status, body)
	}
	var models struct {
		Data []struct{ ID string } `json:"data"`
	}
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	_ = json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if len(models.Data) != 1 || models.Data[0].ID != "quick" {
		t.Fatalf("models %+v", models)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("runServe after SIGTERM: %v", err)
	}
}

func TestRunServeRejectsBadConfig(t *testing.T) {
	var stderr strings.Builder
	err := runServe(context.Background(), []string{"--policy", "fused_score"}, io.Discard, &stderr)
	if err == nil || !strings.Contains(stderr.String(), "fused_score") {
		t.Fatalf("err %v stderr %q", err, stderr.String())
	}
}

func TestServeDemo(t *testing.T) {
	var out strings.Builder
	if err := runServeDemo(context.Background(), nil, &out, io.Discard); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{"short-1", "long-1", "decode-1", "prefill-1"} {
		if !strings.Contains(s, want) {
			t.Errorf("demo output lacks %s:\n%s", want, s)
		}
	}
	t.Log("\n" + s)
}
