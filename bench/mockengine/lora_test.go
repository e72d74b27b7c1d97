package mockengine

import (
	"strings"
	"testing"
	"time"
)

func TestLoRASlotsAndLoads(t *testing.T) {
	for _, flavor := range []Flavor{FlavorVLLM, FlavorSGLang} {
		t.Run(string(flavor), func(t *testing.T) {
			clk := NewManualClock(time.Unix(1_700_000_000, 0))
			runClock(t, clk)
			e := startEngine(t, Config{Model: "base", Flavor: flavor, ZeroCost: true, Clock: clk,
				LoRA:     LoRA{Slots: 2, LoadTime: 3 * time.Second, Adapters: map[string]string{"sql": "/adapters/sql"}},
				KVEvents: KVEvents{Disabled: true}, LoadPublish: LoadPublish{Disabled: true}})
			c := newClient(t)
			loadPath := "/load_lora_adapter"
			if flavor == FlavorVLLM {
				loadPath = "/v1/load_lora_adapter"
			}
			chat := func(model string) int {
				return do(t, c, "POST", e.URL()+"/v1/chat/completions", map[string]any{
					"model": model, "messages": []map[string]string{{"role": "user", "content": "hi"}}, "max_tokens": 2}).status
			}
			if s := chat("sql"); s != 200 {
				t.Fatalf("preloaded adapter: %d", s)
			}
			if s := chat("base"); s != 200 {
				t.Fatalf("base model: %d", s)
			}
			r := do(t, c, "POST", e.URL()+"/v1/chat/completions", map[string]any{"model": "math", "messages": []map[string]string{{"role": "user", "content": "hi"}}})
			if r.status != 404 || !strings.Contains(string(r.body), "does not exist") {
				t.Fatalf("unloaded adapter: %d %s", r.status, r.body)
			}
			// A load takes the simulated load time (the manual clock runs it).
			if r := do(t, c, "POST", e.URL()+loadPath, map[string]string{"lora_name": "math", "lora_path": "/adapters/math"}); r.status != 200 {
				t.Fatalf("load: %d %s", r.status, r.body)
			}
			if got := clk.Now().Sub(time.Unix(1_700_000_000, 0)); got < 3*time.Second {
				t.Fatalf("the load took %v of simulated time, want 3s", got)
			}
			if s := chat("math"); s != 200 || e.LoRALoads() != 1 {
				t.Fatalf("after the load: %d, loads %d", s, e.LoRALoads())
			}
			for _, tc := range []struct {
				body map[string]string
				want string
			}{
				{map[string]string{"lora_name": "math", "lora_path": "/adapters/math"}, "already been loaded"},
				{map[string]string{"lora_name": "code", "lora_path": "/adapters/code"}, "no free LoRA adapter slot"},
				{map[string]string{"lora_name": "code"}, "required"},
			} {
				if r := do(t, c, "POST", e.URL()+loadPath, tc.body); r.status != 400 || !strings.Contains(string(r.body), tc.want) {
					t.Fatalf("load %v: %d %s", tc.body, r.status, r.body)
				}
			}
			models := do(t, c, "GET", e.URL()+"/v1/models", nil).json(t)
			data := models["data"].([]any)
			if len(data) != 3 || path(t, data[1], "id") != "math" || path(t, data[1], "parent") != "base" || path(t, data[2], "root") != "/adapters/sql" {
				t.Fatalf("/v1/models: %v", data)
			}
			if r := do(t, c, "POST", e.URL()+strings.Replace(loadPath, "load", "unload", 1), map[string]string{"lora_name": "math"}); r.status != 200 {
				t.Fatalf("unload: %d %s", r.status, r.body)
			}
			if got := e.LoRAAdapters(); len(got) != 1 || got[0] != "sql" {
				t.Fatalf("adapters after the unload: %v", got)
			}
		})
	}
}
