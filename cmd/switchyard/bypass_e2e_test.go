package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"switchyard/bench/mockengine"
	"switchyard/config"
)

// TestPDBypassEndToEnd: a PD bucket with bypass_below_tokens 64 over mock engines whose decode
// engine can prefill: a short prompt is served by the decode engine alone (no prefill
// request, no bootstrap), a long one by the pair; the decisions and the saved tokens are
// counted.
func TestPDBypassEndToEnd(t *testing.T) {
	p := startMock(t, mockengine.Config{WorkerID: "p1", Model: "llama-pd", Role: mockengine.RolePrefill, ZeroCost: true})
	d := startMock(t, mockengine.Config{WorkerID: "d1", Model: "llama-pd", Role: mockengine.RoleDecode, ZeroCost: true, DecodeCanPrefill: true})
	cfg := config.Default()
	cfg.Server.Port = 0
	cfg.Workers = []config.Worker{
		{ID: "p1", URL: p.URL(), Model: "llama-pd", Role: config.RolePrefill, DPSize: 1},
		{ID: "d1", URL: d.URL(), Model: "llama-pd", Role: config.RoleDecode, DPSize: 1, CanPrefill: true},
	}
	cfg.Models = map[string]config.Model{"llama-pd": {Buckets: []config.Bucket{{ID: "pd",
		Groups: config.Groups{PD: &config.PDGroups{Prefill: &config.Group{}, Decode: &config.Group{}, BypassBelowTokens: 64}}}}}}
	_, base := startRouter(t, cfg)

	chat := func(content string) (worker, prefill string) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": "llama-pd", "messages": []map[string]string{{"role": "user", "content": content}}, "max_tokens": 4})
		h, _ := postOK(t, base+"/v1/chat/completions", string(body))
		return h.Get("X-Switchyard-Worker"), h.Get("X-Switchyard-Prefill-Worker")
	}
	for i := range 3 {
		if w, pw := chat(fmt.Sprintf("hi %d", i)); w != "d1" || pw != "" {
			t.Fatalf("short prompt %d: worker %q prefill %q, want d1 alone", i, w, pw)
		}
	}
	long := strings.Repeat("a long prompt that needs its own prefill engine ", 40)
	if w, pw := chat(long); w != "d1" || pw != "p1" {
		t.Fatalf("long prompt: worker %q prefill %q, want the pair", w, pw)
	}
	for series, want := range map[string]float64{
		`switchyard_pd_bypass_decisions_total{model="llama-pd",bucket="pd",decision="bypass"}`: 3,
		`switchyard_pd_bypass_decisions_total{model="llama-pd",bucket="pd",decision="pair"}`:   1,
	} {
		if got := metricValue(t, base+"/metrics", series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if got := metricValue(t, base+"/metrics", `switchyard_pd_bypass_saved_tokens_total{model="llama-pd",bucket="pd"}`); got <= 0 {
		t.Errorf("saved tokens %v, want the bypassed prompts' tokens", got)
	}
}
