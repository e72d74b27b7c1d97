package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"switchyard/bench/mockengine"
)

// The sgl-router command lines, run by the switchyard binary: `switchyard --compat
// sgl-router` followed by the flags a deployment of SGLang's router passes, against mock
// engines on loopback, each behaviour the flags promise checked through the API.

// launch runs the switchyard binary with sgl-router's command line args (the caller's
// --host and --port included) and waits until it serves; it is stopped at the end of the
// test.
func launch(t *testing.T, args ...string) string {
	t.Helper()
	_, u := launchChild(t, args...)
	return u
}

// launchChild is launch that also returns the process, to read what else it printed.
func launchChild(t *testing.T, args ...string) (*child, string) {
	t.Helper()
	c := startChild(t, 0, append([]string{"--compat", "sgl-router"}, args...)...)
	return c, c.waitLine(t, servingLine)[1]
}

// metricsListenerLine is serve's line for the metrics listener of server.metrics_port.
var metricsListenerLine = regexp.MustCompile(`/metrics \(on (\S+), server\.metrics_port\)`)

// exitOf runs bin with args to completion and returns its exit code and output.
func exitOf(t *testing.T, args ...string) (int, string) {
	t.Helper()
	out, err := exec.Command(switchyardBinary(t), args...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

type apiAnswer struct {
	status int
	header http.Header
	body   string
}

func call(t *testing.T, method, u, body string) apiAnswer {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return apiAnswer{resp.StatusCode, resp.Header, string(b)}
}

func chatAt(t *testing.T, base, model, system, user string) apiAnswer {
	t.Helper()
	msgs, _ := json.Marshal([]map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}})
	return call(t, "POST", base+"/v1/chat/completions", `{"model":"`+model+`","max_tokens":4,"messages":`+string(msgs)+`}`)
}

// workerState returns the GET /workers entry of id.
func workerState(t *testing.T, base, id string) map[string]any {
	t.Helper()
	r := call(t, "GET", base+"/workers/"+url.PathEscape(id), "")
	var v map[string]any
	if err := json.Unmarshal([]byte(r.body), &v); err != nil || r.status != 200 {
		t.Fatalf("GET /workers/%s: %d %s", id, r.status, r.body)
	}
	return v
}

func TestSGLRouterCommandLines(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	const model = "Qwen/Qwen3-8B"
	mock := func(id string, role mockengine.Role) *mockengine.Engine {
		return startMock(t, mockengine.Config{WorkerID: id, Model: model, Role: role, ZeroCost: true})
	}
	host := func(e *mockengine.Engine) string { return strings.TrimPrefix(e.URL(), "http://") }

	t.Run("plain", func(t *testing.T) {
		a, b := mock("a", mockengine.RolePlain), mock("b", mockengine.RolePlain)
		r := launch(t, "--worker-urls", a.URL(), b.URL(), "--policy", "round_robin",
			"--host", "127.0.0.1", "--port", "0", "--log-level", "warning", "--request-timeout-secs", "60")
		waitReady(t, r)
		seen := map[string]int{}
		for range 4 {
			res := chatAt(t, r, model, "You are terse.", "hello")
			if res.status != 200 {
				t.Fatalf("chat: %d %s", res.status, res.body)
			}
			seen[res.header.Get("X-Switchyard-Worker")]++
		}
		if seen[host(a)] != 2 || seen[host(b)] != 2 {
			t.Errorf("round_robin over two engines: %v", seen)
		}
		// The model the engines serve is the fleet's, learnt from them.
		if res := call(t, "GET", r+"/v1/models", ""); !strings.Contains(res.body, `"id":"`+model+`"`) {
			t.Errorf("models: %s", res.body)
		}
		if res := call(t, "POST", r+"/v1/embeddings", `{"model":"`+model+`","input":"x"}`); res.status != 200 || !strings.Contains(res.body, `"embedding"`) {
			t.Errorf("embeddings: %d %s", res.status, res.body)
		}
	})

	t.Run("metrics listener", func(t *testing.T) {
		a := mock("m-a", mockengine.RolePlain)
		c, r := launchChild(t, "--worker-urls", a.URL(), "--prometheus-host", "127.0.0.1", "--prometheus-port", "0",
			"--host", "127.0.0.1", "--port", "0")
		addr := c.waitLine(t, metricsListenerLine)[1]
		waitReady(t, r)
		if res := chatAt(t, r, model, "sys", "hi"); res.status != 200 {
			t.Fatalf("chat: %d %s", res.status, res.body)
		}
		if res := call(t, "GET", "http://"+addr+"/metrics", ""); res.status != 200 ||
			!strings.Contains(res.body, "switchyard_requests_total") {
			t.Errorf("/metrics on the --prometheus-port listener %s: %d\n%.300s", addr, res.status, res.body)
		}
		if res := call(t, "GET", r+"/metrics", ""); res.status != 404 {
			t.Errorf("/metrics on the router's port: %d, want 404", res.status)
		}
	})

	t.Run("pd", func(t *testing.T) {
		p1, p2 := mock("p1", mockengine.RolePrefill), mock("p2", mockengine.RolePrefill)
		d1, d2 := mock("d1", mockengine.RoleDecode), mock("d2", mockengine.RoleDecode)
		r := launch(t, "--pd-disaggregation",
			"--prefill", p1.URL(), strconv.Itoa(p1.BootstrapPort()), "--prefill", p2.URL(),
			"--decode", d1.URL(), "--decode", d2.URL(), "--policy", "cache_aware", "--host", "127.0.0.1", "--port", "0")
		waitReady(t, r)
		prefills, decodes := map[string]bool{}, map[string]bool{}
		for i := range 6 {
			res := chatAt(t, r, model, fmt.Sprintf("system prompt %d of the pd test", i), "hi")
			if res.status != 200 {
				t.Fatalf("pd chat: %d %s", res.status, res.body)
			}
			prefills[res.header.Get("X-Switchyard-Prefill-Worker")] = true
			decodes[res.header.Get("X-Switchyard-Worker")] = true
		}
		if !prefills[host(p1)] || !prefills[host(p2)] || len(decodes) == 0 {
			t.Errorf("prefill engines %v, decode engines %v", prefills, decodes)
		}
		for id, role := range map[string]string{host(p1): "prefill", host(p2): "prefill", host(d1): "decode"} {
			if w := workerState(t, r, id); w["worker_type"] != role || w["is_healthy"] != true {
				t.Errorf("worker %s: %v", id, w)
			}
		}
		// The prefill without a bootstrap port on the command line takes the one it advertises.
		if w := workerState(t, r, host(p2)); w["bootstrap_port"] != float64(p2.BootstrapPort()) {
			t.Errorf("p2's bootstrap port %v, want %d", w["bootstrap_port"], p2.BootstrapPort())
		}
	})

	t.Run("cache-aware", func(t *testing.T) {
		engines := []*mockengine.Engine{mock("c1", mockengine.RolePlain), mock("c2", mockengine.RolePlain), mock("c3", mockengine.RolePlain)}
		args := []string{"--worker-urls"}
		for _, e := range engines {
			args = append(args, e.URL())
		}
		args = append(args, "--policy", "cache_aware", "--cache-threshold", "0.3", "--balance-abs-threshold", "64",
			"--balance-rel-threshold", "1.5", "--eviction-interval-secs", "120", "--max-tree-size", "67108864",
			"--host", "127.0.0.1", "--port", "0")
		r := launch(t, args...)
		waitReady(t, r)
		system := func(i int) string {
			return strings.Repeat(fmt.Sprintf("Conversation %d: the assistant answers questions about trains. ", i), 4)
		}
		first := map[int]string{}
		spread := map[string]int{}
		for i := range 6 {
			res := chatAt(t, r, model, system(i), "first question")
			if res.status != 200 {
				t.Fatalf("chat: %d %s", res.status, res.body)
			}
			first[i] = res.header.Get("X-Switchyard-Worker")
			spread[first[i]]++
		}
		for _, e := range engines {
			// Distinct prompts go where the tree holds least: with the loads within the
			// balance thresholds, every engine gets some.
			if spread[host(e)] == 0 {
				t.Errorf("6 distinct conversations left %s out: %v", host(e), spread)
			}
		}
		for i := range 6 {
			res := chatAt(t, r, model, system(i), fmt.Sprintf("a different question, number %d", i))
			if w := res.header.Get("X-Switchyard-Worker"); res.status != 200 || w != first[i] {
				t.Errorf("conversation %d with another suffix went to %q, first to %q", i, w, first[i])
			}
		}
		m := call(t, "GET", r+"/metrics", "").body
		if !strings.Contains(m, `switchyard_cache_aware_decisions_total{outcome="cache_candidate"} 6`) {
			t.Errorf("metrics do not count 6 cache hits:\n%s", grepLines(m, "switchyard_cache_aware_decisions_total"))
		}
	})

	t.Run("retries and breakers", func(t *testing.T) {
		good, bad := mock("good", mockengine.RolePlain), mock("bad", mockengine.RolePlain)
		r := launch(t, "--worker-urls", good.URL(), bad.URL(), "--policy", "round_robin",
			"--retry-max-retries", "3", "--retry-initial-backoff-ms", "10", "--retry-max-backoff-ms", "100",
			"--retry-backoff-multiplier", "2", "--retry-jitter-factor", "0.1",
			"--cb-failure-threshold", "2", "--cb-success-threshold", "1", "--cb-timeout-duration-secs", "600",
			"--cb-window-duration-secs", "120", "--health-check-interval-secs", "600", "--health-check-timeout-secs", "5",
			"--health-failure-threshold", "3", "--health-success-threshold", "1", "--host", "127.0.0.1", "--port", "0")
		waitReady(t, r)
		if err := bad.SetFaults(mockengine.Faults{Status: 503}); err != nil {
			t.Fatal(err)
		}
		for range 8 {
			chatAt(t, r, model, "sys", "hi")
		}
		// Two failures the engine answers for open its breaker: every request goes to the
		// good engine, and the breaker stays open (600 s cool-down).
		if w := workerState(t, r, host(bad)); w["breaker"] != "open" || w["is_healthy"] != false {
			t.Fatalf("the failing engine: %v", w)
		}
		for range 4 {
			if res := chatAt(t, r, model, "sys", "hi"); res.status != 200 || res.header.Get("X-Switchyard-Worker") != host(good) {
				t.Fatalf("with the breaker open: %d on %q", res.status, res.header.Get("X-Switchyard-Worker"))
			}
		}

		// --disable-circuit-breaker: the same failures open nothing.
		r2 := launch(t, "--worker-urls", good.URL(), bad.URL(), "--policy", "round_robin",
			"--disable-circuit-breaker", "--disable-retries", "--health-check-interval-secs", "600", "--host", "127.0.0.1", "--port", "0")
		waitReady(t, r2)
		failed := 0
		for range 6 {
			if res := chatAt(t, r2, model, "sys", "hi"); res.status == 503 {
				failed++
			}
		}
		if w := workerState(t, r2, host(bad)); w["breaker"] == "open" || failed != 3 {
			t.Errorf("without breakers: %d of 6 failed, the failing engine %v", failed, w)
		}
	})

	t.Run("admin", func(t *testing.T) {
		a := mock("adm-a", mockengine.RolePlain)
		r := launch(t, "--worker-urls", a.URL(), "--policy", "power_of_two",
			"--health-check-interval-secs", "1", "--host", "127.0.0.1", "--port", "0")
		waitReady(t, r)
		b := mock("adm-b", mockengine.RolePlain)
		res := call(t, "POST", r+"/workers", `{"url":"`+b.URL()+`"}`)
		if res.status != 202 {
			t.Fatalf("POST /workers: %d %s", res.status, res.body)
		}
		// Read by its URL: pending until its engine named its model, then registered and
		// healthy at once (well within one health interval, 1 s: no health check is awaited).
		var w map[string]any
		waitFor(t, "the worker added by URL is registered", func() (bool, string) {
			w = workerState(t, r, b.URL())
			return w["model_id"] == model, fmt.Sprint(w)
		})
		if w["is_healthy"] != true || w["url"] != b.URL() {
			t.Fatalf("added worker as it is registered: %v", w)
		}
		if res := call(t, "DELETE", r+"/workers/"+url.PathEscape(b.URL()), ""); res.status != 200 {
			t.Fatalf("DELETE: %d %s", res.status, res.body)
		}
		if res := call(t, "GET", r+"/workers/"+url.PathEscape(b.URL()), ""); res.status != 404 {
			t.Fatalf("GET after DELETE: %d %s", res.status, res.body)
		}
	})

	t.Run("refusals", func(t *testing.T) {
		code, out := exitOf(t, "--compat", "sgl-router", "--worker-urls", "http://127.0.0.1:1", "--dp-aware", "--log-dir", "/tmp")
		if code == 0 || strings.Contains(out, "--dp-aware") || !strings.Contains(out, "--log-dir: no equivalent") {
			t.Errorf("refused flags: exit %d\n%s", code, out)
		}
		code, out = exitOf(t, "--compat", "sgl-router", "--help")
		if code != 0 || !strings.Contains(out, "--cb-failure-threshold") {
			t.Errorf("--help: exit %d\n%s", code, out)
		}
		code, out = exitOf(t, "--compat", "sgl-router", "--worker-urls", "http://127.0.0.1:1",
			"--worker-startup-timeout-secs", "1", "--worker-startup-check-interval", "1")
		if code == 0 || !strings.Contains(out, "cannot learn the model") {
			t.Errorf("an engine that never answers: exit %d\n%s", code, out)
		}
		env := append(os.Environ(), "SWITCHYARD_SERVR__PORT=1")
		cmd := exec.Command(switchyardBinary(t), "--worker-urls", "http://127.0.0.1:1", "--model", "m")
		cmd.Env = env
		o, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(o), "SWITCHYARD_SERVR__PORT") || !strings.Contains(string(o), "stops the start") {
			t.Errorf("an unknown SWITCHYARD_ variable: %v\n%s", err, o)
		}
	})
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
