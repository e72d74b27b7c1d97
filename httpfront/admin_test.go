package httpfront

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"switchyard/config"
	"switchyard/httpfront/fleet"
)

// TestAdminWorkersByURL: sgl-router's admin calls. A worker given by URL alone answers 202
// and is added in the background with the model its engine names, healthy at once; it is
// read and removed by its URL-encoded URL; the list carries sgl-router's fields; an engine
// that does not answer leaves its job status readable; sgl-router's fields without an
// equivalent are refused by name.
func TestAdminWorkersByURL(t *testing.T) {
	tele := &fakeTelemetry{added: make(chan string, 8)}
	a := newFakeEngine(t, "A", "llama")
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", a.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{{ID: "b", Groups: config.Groups{Plain: &config.Group{}}}}}}
	ts := startServer(t, cfg, Options{Telemetry: tele})
	<-tele.added // A

	c := newFakeEngine(t, "C", "llama")
	r := post(t, ts.url+"/workers", `{"url":"`+c.url+`"}`)
	if r.status != 202 {
		t.Fatalf("add by URL: %d %s", r.status, r.body)
	}
	var accepted struct {
		Status   string `json:"status"`
		WorkerID string `json:"worker_id"`
		URL      string `json:"url"`
		Location string `json:"location"`
	}
	if err := json.Unmarshal(r.body, &accepted); err != nil {
		t.Fatal(err)
	}
	escaped := url.PathEscape(c.url)
	if accepted.Status != "accepted" || accepted.WorkerID != strings.TrimPrefix(c.url, "http://") ||
		accepted.Location != "/workers/"+escaped || r.header.Get("Location") != accepted.Location {
		t.Fatalf("accepted %+v, Location %q", accepted, r.header.Get("Location"))
	}
	if id := <-tele.added; id != accepted.WorkerID {
		t.Fatalf("telemetry started for %q, want %q", id, accepted.WorkerID)
	}
	r = get(t, ts.url+"/workers/"+escaped)
	var got workerView
	if err := json.Unmarshal(r.body, &got); err != nil || r.status != 200 {
		t.Fatalf("GET by URL: %d %s", r.status, r.body)
	}
	if !got.IsHealthy || got.ModelID != "llama" || got.WorkerType != "regular" || got.URL != c.url || got.ID != accepted.WorkerID {
		t.Fatalf("worker %+v", got)
	}
	// Added healthy: it takes traffic at once.
	seen := map[string]bool{}
	for range 4 {
		seen[post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", "")).header.Get(headerWorker)] = true
	}
	if !seen[accepted.WorkerID] {
		t.Fatalf("the added worker got no traffic: %v", seen)
	}
	if r := get(t, ts.url+"/workers/A"); r.status != 200 || !contains(r.body, `"url":"`+a.url+`"`) {
		t.Fatalf("GET by ID: %d %s", r.status, r.body)
	}
	r = get(t, ts.url+"/workers")
	var list struct {
		Workers []workerView   `json:"workers"`
		Total   int            `json:"total"`
		Stats   map[string]int `json:"stats"`
	}
	if err := json.Unmarshal(r.body, &list); err != nil || list.Total != 2 || list.Stats["regular_count"] != 2 ||
		list.Stats["prefill_count"] != 0 || len(list.Workers) != 2 || list.Workers[0].WorkerType != "regular" {
		t.Fatalf("list %s", r.body)
	}
	if r := post(t, ts.url+"/workers", `{"url":"`+c.url+`"}`); r.status != 409 {
		t.Fatalf("adding a known URL again: %d %s", r.status, r.body)
	}
	if r := doMethod(t, "DELETE", ts.url+"/workers/"+escaped); r.status != 200 || !contains(r.body, `"success":true`) {
		t.Fatalf("DELETE by URL: %d %s", r.status, r.body)
	}
	if r := get(t, ts.url+"/workers/"+escaped); r.status != 404 || r.errorCode() != CodeWorkerNotFound {
		t.Fatalf("GET after DELETE: %d %s", r.status, r.body)
	}

	// An engine that does not answer: the job is followed by URL until it gives up.
	d := newFakeEngine(t, "D", "llama")
	d.health.Store(503)
	d.noInfo.Store(true)
	r = post(t, ts.url+"/workers", `{"url":"`+d.url+`"}`)
	if r.status != 202 {
		t.Fatalf("add by URL: %d %s", r.status, r.body)
	}
	r = get(t, ts.url+"/workers/"+url.PathEscape(d.url))
	var pending pendingView
	if err := json.Unmarshal(r.body, &pending); err != nil || r.status != 200 || pending.IsHealthy ||
		pending.ID != strings.TrimPrefix(d.url, "http://") ||
		pending.JobStatus.JobType != fleet.JobAddWorker || pending.JobStatus.WorkerURL != d.url ||
		(pending.JobStatus.Status != fleet.JobPending && pending.JobStatus.Status != fleet.JobProcessing) {
		t.Fatalf("pending worker: %d %s", r.status, r.body)
	}

	for _, tt := range []struct{ body, want string }{
		{`{"url":"` + a.url + `x","model":"llama","priority":5}`, "priority: no equivalent"},
		{`{"url":"` + a.url + `x","model":"llama","api_key":"other"}`, "api_key: a worker has no key of its own"},
		{`{"url":"` + a.url + `x","model":"llama","model_id":"qwen"}`, `and model_id`},
		{`{"url":"` + a.url + `x","frobnicate":1}`, "unknown field"},
	} {
		if r := post(t, ts.url+"/workers", tt.body); r.status != 400 || !contains(r.body, tt.want) {
			t.Errorf("POST %s: %d %s, want 400 with %q", tt.body, r.status, r.body, tt.want)
		}
	}
}

// TestAdminRefusesHostileWorkerFacts: POST /workers bodies whose facts the router would keep
// state for (a dp_size of 2e9 made the telemetry allocate a slot per rank and the runtime
// abort the router) or that cannot be right are refused with 400 invalid_worker, and the
// fleet is unchanged.
func TestAdminRefusesHostileWorkerFacts(t *testing.T) {
	e := newFakeEngine(t, "A", "llama")
	ts := startServer(t, oneEngineConfig(e), Options{SkipStartupChecks: true})
	tests := []struct {
		name, body, want string
	}{
		{"dp_size of 2e9", `"dp_size":2000000000`, "dp_size 2000000000 is not in 1..4096"},
		{"dp_size one past the bound", `"dp_size":4097`, "dp_size 4097 is not in 1..4096"},
		{"negative dp_size", `"dp_size":-5`, "dp_size -5 is not in 1..4096"},
		{"dp_size past int64", `"dp_size":99999999999999999999`, "cannot decode worker"},
		{"negative bootstrap_port", `"role":"prefill","bootstrap_port":-7`, "bootstrap_port -7 is not in 1..65535"},
		{"bootstrap_port past 65535", `"role":"prefill","bootstrap_port":65536`, "bootstrap_port 65536 is not in 1..65535"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := post(t, ts.url+"/workers", `{"url":"http://127.0.0.1:9","model":"llama","flavor":"vllm",`+tt.body+`}`)
			if r.status != 400 || r.errorCode() != CodeInvalidWorker || !contains(r.body, tt.want) {
				t.Fatalf("%d %s; want 400 %s saying %q", r.status, r.body, CodeInvalidWorker, tt.want)
			}
		})
	}
	if n := len(ts.workers.Members()); n != 1 {
		t.Fatalf("%d workers after the refusals, want 1", n)
	}
}
