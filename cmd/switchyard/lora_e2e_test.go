package main

import (
	"encoding/json"
	"strings"
	"testing"

	"switchyard/bench/mockengine"
	"switchyard/config"
)

// TestLoRARoutingEndToEnd: three mock engines with two adapter slots each, one holding adapter
// "sql". The router learns it from the engines' /v1/models and lists it in its own; every
// "sql" request goes to its holder; "math" (configured, auto_load) is loaded once onto one
// engine, which then serves every "math" request; an adapter nobody has and nobody can load
// is a 404; the picks and loads are counted.
func TestLoRARoutingEndToEnd(t *testing.T) {
	var engines []*mockengine.Engine
	for i, id := range []string{"E0", "E1", "E2"} {
		lora := mockengine.LoRA{Slots: 2}
		if i == 0 {
			lora.Adapters = map[string]string{"sql": "/adapters/sql"}
		}
		engines = append(engines, startMock(t, mockengine.Config{WorkerID: id, Model: affModel, ZeroCost: true, LoRA: lora}))
	}
	cfg := hashConfig(engines, config.PolicyRoundRobin)
	cfg.LoRA.Enabled, cfg.LoRA.AutoLoad = true, true
	m := cfg.Models[affModel]
	m.LoRAAdapters = map[string]string{"math": "/adapters/math"}
	cfg.Models[affModel] = m
	_, base := startRouter(t, cfg)

	waitFor(t, "the router lists the engines' adapter", func() (bool, string) {
		_, body, err := httpGet(base + "/v1/models")
		return err == nil && strings.Contains(string(body), `{"id":"sql","object":"model","created":0,"owned_by":"switchyard","parent":"`+affModel+`"}`), string(body)
	})
	chat := func(model string) (int, string) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": model, "messages": []affMessage{{Role: "user", Content: "hi"}}, "max_tokens": 2})
		status, raw, _ := httpPost(base+"/v1/chat/completions", string(body))
		var out struct {
			Model string `json:"model"`
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(raw, &out)
		if status == 200 && out.Model != model {
			t.Fatalf("the engine answered as model %q, the request named %q", out.Model, model)
		}
		return status, out.Error.Code
	}
	for i := range 6 {
		if s, _ := chat("sql"); s != 200 {
			t.Fatalf("sql request %d: %d", i, s)
		}
	}
	if n := metricValue(t, base+"/metrics", `switchyard_lora_picks_total{model="`+affModel+`",result="hit"}`); n != 6 {
		t.Fatalf("%v hits, want 6", n)
	}
	for i := range 6 {
		if s, _ := chat("math"); s != 200 {
			t.Fatalf("math request %d: %d", i, s)
		}
	}
	var loads int64
	holders := 0
	for _, e := range engines {
		loads += e.LoRALoads()
		for _, a := range e.LoRAAdapters() {
			if a == "math" {
				holders++
			}
		}
	}
	if loads != 1 || holders != 1 {
		t.Fatalf("%d loads, %d engines hold math: want one load", loads, holders)
	}
	for series, want := range map[string]float64{
		`switchyard_lora_picks_total{model="` + affModel + `",result="load"}`: 1,
		`switchyard_lora_picks_total{model="` + affModel + `",result="hit"}`:  11,
		`switchyard_lora_loads_total{model="` + affModel + `",result="ok"}`:   1,
	} {
		if got := metricValue(t, base+"/metrics", series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if s, code := chat("nope"); s != 404 || code != "model_not_found" {
		t.Fatalf("an unknown adapter: %d %s", s, code)
	}
}

// TestLoRAEvictionEndToEnd: engines whose one adapter slot is full (a vLLM engine and an
// SGLang one, each through its own unload and load routes) make room for a requested adapter
// by unloading the least recently used one, and take the evicted one back on request.
func TestLoRAEvictionEndToEnd(t *testing.T) {
	for _, flavor := range []mockengine.Flavor{mockengine.FlavorVLLM, mockengine.FlavorSGLang} {
		t.Run(string(flavor), func(t *testing.T) {
			e := startMock(t, mockengine.Config{WorkerID: "E0", Model: affModel, ZeroCost: true, Flavor: flavor,
				LoRA: mockengine.LoRA{Slots: 1, Adapters: map[string]string{"sql": "/adapters/sql"}}})
			cfg := hashConfig([]*mockengine.Engine{e}, config.PolicyRoundRobin)
			cfg.Workers[0].Flavor = flavorOf(flavor)
			cfg.LoRA.Enabled, cfg.LoRA.AutoLoad = true, true
			cfg.LoRA.SlotsPerEngine = 1 // a vLLM engine does not say; an SGLang one does (max_loaded_loras)
			m := cfg.Models[affModel]
			m.LoRAAdapters = map[string]string{"sql": "/adapters/sql", "math": "/adapters/math"}
			cfg.Models[affModel] = m
			_, base := startRouter(t, cfg)
			waitFor(t, "the router learns the engine's adapter and slot", func() (bool, string) {
				_, body, err := httpGet(base + "/workers")
				return err == nil && strings.Contains(string(body), `"lora":{"slots":1,"adapters":[{"name":"sql","in_flight":0}]}`), string(body)
			})
			for i, model := range []string{"sql", "math", "math", "sql"} {
				body, _ := json.Marshal(map[string]any{"model": model, "messages": []affMessage{{Role: "user", Content: "hi"}}, "max_tokens": 2})
				status, raw, err := httpPost(base+"/v1/chat/completions", string(body))
				if err != nil || status != 200 {
					t.Fatalf("request %d (%s): %d %s %v", i, model, status, raw, err)
				}
				if got := e.LoRAAdapters(); len(got) != 1 || got[0] != model {
					t.Fatalf("after request %d (%s) the engine holds %v", i, model, got)
				}
			}
			for series, want := range map[string]float64{
				`switchyard_lora_evictions_total{model="` + affModel + `",result="ok"}`: 2,
				`switchyard_lora_loads_total{model="` + affModel + `",result="ok"}`:     2,
				`switchyard_lora_picks_total{model="` + affModel + `",result="hit"}`:    2,
			} {
				if got := metricValue(t, base+"/metrics", series); got != want {
					t.Errorf("%s = %v, want %v", series, got, want)
				}
			}
			if n := e.LoRALoads(); n != 2 {
				t.Errorf("the engine loaded %d adapters, want 2", n)
			}
		})
	}
}
