package httpfront

import (
	"testing"
)

// TestAdapterLoadFailure: an engine that fails the adapter load leaves the request answered
// 502 adapter_load_failed, the load counted as failed, and the request never forwarded.
func TestAdapterLoadFailure(t *testing.T) {
	a := newFakeEngine(t, "A", "llama")
	b := newFakeEngine(t, "B", "llama")
	a.fail.Store(500)
	cfg := flowConfig(a, b)
	cfg.Workers = cfg.Workers[:1]
	cfg.Models["llama"].Buckets[0].Groups.Plain.WorkerIDs = &[]string{"A"}
	cfg.LoRA.Enabled, cfg.LoRA.AutoLoad = true, true
	m := cfg.Models["llama"]
	m.LoRAAdapters = map[string]string{"math": "/adapters/math"}
	cfg.Models["llama"] = m
	ts := startServer(t, cfg, Options{SkipStartupChecks: true})
	r := post(t, ts.url+"/v1/chat/completions", chatBody("math", "hi", ""))
	if r.status != 502 || r.errorCode() != CodeAdapterLoad {
		t.Fatalf("status %d %s: %s", r.status, r.errorCode(), r.body)
	}
	bodies, _ := a.received()
	loads := 0
	for _, b := range bodies {
		switch {
		case string(b) == `{"lora_name":"math","lora_path":"/adapters/math"}`:
			loads++
		case contains(b, "messages"):
			t.Fatalf("the request was forwarded: %s", b)
		}
	}
	if loads == 0 {
		t.Fatal("no load was asked")
	}
	if m := scrape(t, ts.url); !contains([]byte(m), `switchyard_lora_loads_total{model="llama",result="failed"} 1`) {
		t.Fatalf("metrics:\n%s", m)
	}
	// A model that is neither configured nor an adapter is still a 404.
	if r := post(t, ts.url+"/v1/chat/completions", chatBody("nope", "hi", "")); r.status != 404 {
		t.Fatalf("unknown model: %d", r.status)
	}
}
