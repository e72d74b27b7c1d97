package config

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// issueExample is the example of issue 2.
const issueExample = `
workers:
  - {id: P1, url: "http://127.0.0.1:30001", model: llama, role: prefill, bootstrap_port: 8998}
  - {id: D1, url: "http://127.0.0.1:30002", model: llama, role: decode}
models:
  llama:                      # map: model name -> its routing
    buckets:
      - id: short-context
        rank: 10
        limits: {min: 0, max: 4096}
        max_context_tokens: 8192
        groups:
          pd:
            prefill: {worker_ids: [P1], policy: {type: cache_aware, admission: {max_running_requests: 64}}}
            decode:  {worker_ids: [D1], policy: {type: power_of_two}}
`

func TestDecodeIssueExample(t *testing.T) {
	cfg := mustDecodeYAML(t, issueExample)
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if len(cfg.Workers) != 2 {
		t.Fatalf("workers = %d", len(cfg.Workers))
	}
	p1 := cfg.Workers[0]
	if p1.ID != "P1" || p1.Role != RolePrefill || p1.BootstrapPort == nil || *p1.BootstrapPort != 8998 || p1.DPSize != 1 {
		t.Errorf("P1 = %+v", p1)
	}
	if d1 := cfg.Workers[1]; d1.Role != RoleDecode || d1.BootstrapPort != nil {
		t.Errorf("D1 = %+v", d1)
	}
	b := cfg.Models["llama"].Buckets[0]
	if b.ID != "short-context" || b.Rank != 10 || b.Limits.Min != 0 || *b.Limits.Max != 4096 || *b.MaxContextTokens != 8192 {
		t.Errorf("bucket = %+v", b)
	}
	pf := b.Groups.PD.Prefill
	if got := *pf.WorkerIDs; len(got) != 1 || got[0] != "P1" {
		t.Errorf("prefill worker_ids = %v", got)
	}
	if pf.Policy.Type != PolicyCacheAware || *pf.Policy.Admission.MaxRunningRequests != 64 || pf.Policy.Admission.MaxKVTokens != nil {
		t.Errorf("prefill policy = %+v", pf.Policy)
	}
	if b.Groups.PD.Decode.Policy.Type != PolicyPowerOfTwo || b.Groups.Plain != nil {
		t.Errorf("groups = %+v", b.Groups)
	}
	// Everything the file does not mention keeps its default.
	if cfg.Server.Port != 8080 || cfg.CacheAware.MinMatchedTokens != 1024 || cfg.DefaultPolicy.Type != PolicyRoundRobin {
		t.Errorf("defaults lost: %+v", cfg.Server)
	}
}

// checkExample asserts the shape of testdata/example.yaml (POLICY_DESIGN section 7).
func checkExample(t *testing.T, cfg *Config) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if len(cfg.Workers) != 8 {
		t.Fatalf("workers = %d, want 8", len(cfg.Workers))
	}
	llama := cfg.Models["llama"]
	if len(llama.Buckets) != 2 {
		t.Fatalf("buckets = %d", len(llama.Buckets))
	}
	tests := []struct {
		id               string
		rank             int
		max, ctx         int64
		prefill, decodes []string
	}{
		{"short-context", 10, 4096, 8192, []string{"P1", "P2"}, []string{"D1", "D2"}},
		{"long-context", 20, 131072, 131072, []string{"P3", "P4"}, []string{"D3", "D4"}},
	}
	for i, tt := range tests {
		b := llama.Buckets[i]
		if b.ID != tt.id || b.Rank != tt.rank || *b.Limits.Max != tt.max || *b.MaxContextTokens != tt.ctx {
			t.Errorf("bucket %d = %+v", i, b)
		}
		pd := b.Groups.PD
		if strings.Join(*pd.Prefill.WorkerIDs, ",") != strings.Join(tt.prefill, ",") ||
			strings.Join(*pd.Decode.WorkerIDs, ",") != strings.Join(tt.decodes, ",") {
			t.Errorf("bucket %d members = %v / %v", i, *pd.Prefill.WorkerIDs, *pd.Decode.WorkerIDs)
		}
		for _, g := range []struct {
			p    *Policy
			want string
		}{{pd.Prefill.Policy, PolicyCacheAware}, {pd.Decode.Policy, PolicyPowerOfTwo}} {
			a := g.p.Admission
			if g.p.Type != g.want || *a.MaxRunningRequests != 64 || *a.MaxKVTokens != 1048576 || a.MaxInflightRequests != nil {
				t.Errorf("bucket %d policy = %+v", i, g.p)
			}
		}
	}
}

func TestDecodeExampleFile(t *testing.T) {
	data, err := os.ReadFile("testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Decode(data, FormatYAML)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	checkExample(t, cfg)
}

func TestDecodeExampleJSON(t *testing.T) {
	data, err := os.ReadFile("testdata/example.json")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Decode(data, FormatJSON)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	checkExample(t, cfg)
	if cfg.Load.Freshness != 3*time.Second || cfg.Server.Port != 9000 || cfg.CacheAware.CandidateRatio != 0.1 {
		t.Errorf("scalars = %v %v %v", cfg.Load.Freshness, cfg.Server.Port, cfg.CacheAware.CandidateRatio)
	}
}

func TestDecodeUnknownKeys(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []string
	}{
		{"top level", `severs: {port: 1}`, []string{"severs: unknown key"}},
		{"section", `server: {prot: 1}`, []string{"server.prot: unknown key"}},
		{"nested section", `actors: {mailbox: {buckets: 4}}`, []string{"actors.mailbox.buckets: unknown key"}},
		{"worker", `workers: [{id: a, url: "http://127.0.0.1:1", model: m}, {id: b, bootstrap: 1}]`,
			[]string{"workers[1].bootstrap: unknown key"}},
		{"model", `models: {llama: {polices: {}}}`, []string{"models.llama.polices: unknown key"}},
		{"stage default admission", `models: {llama: {policies: {decode: {type: random, admision: {}}}}}`,
			[]string{"models.llama.policies.decode.admision: unknown key"}},
		{"bucket", `models: {llama: {buckets: [{id: a, limit: {max: 1}}]}}`,
			[]string{"models.llama.buckets[0].limit: unknown key"}},
		{"limits", `models: {llama: {buckets: [{id: a, limits: {maximum: 1}}]}}`,
			[]string{"models.llama.buckets[0].limits.maximum: unknown key"}},
		{"groups", `models: {llama: {buckets: [{id: a, groups: {mixed: {}}}]}}`,
			[]string{"models.llama.buckets[0].groups.mixed: unknown key"}},
		{"group", `models: {llama: {buckets: [{id: a, groups: {plain: {workers: [a]}}}]}}`,
			[]string{"models.llama.buckets[0].groups.plain.workers: unknown key"}},
		{"pd", `models: {llama: {buckets: [{id: a, groups: {pd: {prefil: {}}}}]}}`,
			[]string{"models.llama.buckets[0].groups.pd.prefil: unknown key"}},
		{"policy", `models: {llama: {buckets: [{id: a, groups: {plain: {policy: {type: sticky, fallbak: random}}}}]}}`,
			[]string{"models.llama.buckets[0].groups.plain.policy.fallbak: unknown key"}},
		{"admission", `
models:
  llama:
    buckets:
      - id: a
        groups:
          pd:
            prefill:
              policy:
                type: cache_aware
                admission: {max_runing_requests: 64}
`, []string{"models.llama.buckets[0].groups.pd.prefill.policy.admission.max_runing_requests: unknown key"}},
		{"second bucket of odd model name", `
models:
  "meta-llama/Llama-3.1-8B":
    buckets:
      - {id: a, groups: {plain: {}}}
      - {id: b, groups: {plain: {}}, rnk: 2}
`, []string{`models["meta-llama/Llama-3.1-8B"].buckets[1].rnk: unknown key`}},
		{"default policy", `default_policy: {type: random, admission: {max_inflight: 3}}`,
			[]string{"default_policy.admission.max_inflight: unknown key"}},
		{"every unknown key at once, sorted within a mapping", `
zeta: 1
alpha: 2
server: {port: 1, b: 2, a: 3}
`, []string{"alpha: unknown key", "server.a: unknown key", "server.b: unknown key", "zeta: unknown key"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Decode([]byte(tt.doc), FormatYAML)
			if cfg != nil {
				t.Errorf("Decode returned a config with an error")
			}
			if got := errLines(err); !equalLines(got, tt.want) {
				t.Fatalf("Decode error =\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
			for _, fe := range fieldErrors(err) {
				if !errors.Is(fe, ErrUnknownKey) {
					t.Errorf("%v is not ErrUnknownKey", fe)
				}
			}
		})
	}
}

func TestDecodeTypeErrors(t *testing.T) {
	tests := []struct {
		name   string
		doc    string
		format Format
		want   []string
	}{
		{"string for int", `server: {port: abc}`, FormatYAML,
			[]string{`server.port: expected an integer, got string "abc"`}},
		{"quoted number for int", `server: {port: "9000"}`, FormatYAML,
			[]string{`server.port: expected an integer, got string "9000"`}},
		{"fraction for int", `models: {m: {buckets: [{id: a, limits: {max: 1.5}}]}}`, FormatYAML,
			[]string{"models.m.buckets[0].limits.max: expected an integer, got number 1.5"}},
		{"int overflow", `server: {port: 1e30}`, FormatYAML,
			[]string{"server.port: expected an integer, got number 1e+30"}},
		{"number for duration", `server: {request_timeout: 600}`, FormatYAML,
			[]string{`server.request_timeout: expected a duration string such as "5s", got number 600`}},
		{"bad duration", `load: {freshness: "5 parsecs"}`, FormatYAML,
			[]string{`load.freshness: invalid duration "5 parsecs" (use a form such as "500ms", "5s" or "1m")`}},
		{"number for string", `workers: [{id: 1, url: "http://127.0.0.1:1", model: m}]`, FormatYAML,
			[]string{"workers[0].id: expected a string, got number 1 (quote it)"}},
		{"string for bool", `kv: {enabled: "yes"}`, FormatYAML,
			[]string{`kv.enabled: expected true or false, got string "yes"`}},
		{"NaN for float", `cache_aware: {candidate_ratio: .nan}`, FormatYAML,
			[]string{"cache_aware.candidate_ratio: expected a finite number, got number NaN"}},
		{"mapping for list", `workers: {id: a}`, FormatYAML,
			[]string{"workers: expected a list, got a mapping"}},
		{"scalar for worker_ids", `models: {m: {buckets: [{id: a, groups: {plain: {worker_ids: P1}}}]}}`, FormatYAML,
			[]string{`models.m.buckets[0].groups.plain.worker_ids: expected a list, got string "P1"`}},
		{"null inside worker_ids", `models: {m: {buckets: [{id: a, groups: {plain: {worker_ids: [P1, null]}}}]}}`, FormatYAML,
			[]string{"models.m.buckets[0].groups.plain.worker_ids[1]: expected a string, got null"}},
		{"null bucket", `models: {m: {buckets: [null]}}`, FormatYAML,
			[]string{"models.m.buckets[0]: expected a mapping, got null"}},
		{"list for models", `models: [a]`, FormatYAML,
			[]string{"models: expected a mapping, got a list"}},
		{"scalar for section", `server: 8080`, FormatYAML,
			[]string{"server: expected a mapping, got number 8080"}},
		{"string for cap", `default_policy: {admission: {max_kv_tokens: lots}}`, FormatYAML,
			[]string{`default_policy.admission.max_kv_tokens: expected an integer, got string "lots"`}},
		{"timestamp for string", `models: {m: {tokenizer: {path: 2024-01-02}}}`, FormatYAML,
			[]string{"models.m.tokenizer.path: expected a string, got timestamp 2024-01-02T00:00:00Z (quote it)"}},
		{"json string for int", `{"server": {"port": "9000"}}`, FormatJSON,
			[]string{`server.port: expected an integer, got string "9000"`}},
		{"json fraction for int", `{"kv": {"shards": 2.5}}`, FormatJSON,
			[]string{"kv.shards: expected an integer, got number 2.5"}},
		{"json several at once", `{"kv": {"shards": "x", "enabled": 1}, "health": {"interval": 5}}`, FormatJSON, []string{
			"health.interval: expected a duration string such as \"5s\", got number 5",
			"kv.enabled: expected true or false, got number 1",
			`kv.shards: expected an integer, got string "x"`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode([]byte(tt.doc), tt.format)
			if got := errLines(err); !equalLines(got, tt.want) {
				t.Fatalf("Decode error =\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
			for _, fe := range fieldErrors(err) {
				if !errors.Is(fe, ErrType) {
					t.Errorf("%v is not ErrType", fe)
				}
			}
		})
	}
}

func TestDecodeValues(t *testing.T) {
	cfg := mustDecodeYAML(t, `
server: {port: 9000, request_timeout: 90s, max_body_bytes: 1048576}
load: {freshness: 1500ms, guard_max_age: 2h}
cache_aware: {candidate_ratio: 1, min_match_ratio: 0.25}
default_policy: {admission: {max_kv_tokens: 9223372036854775807}}
models:
  m:
    tokenizer: {path: /models/m}
    buckets: [{id: a, rank: -3, limits: {min: 10, max: 0x100}, groups: {plain: {}}}]
`)
	tests := []struct {
		name      string
		got, want any
	}{
		{"port", cfg.Server.Port, 9000},
		{"host kept", cfg.Server.Host, "127.0.0.1"},
		{"request_timeout", cfg.Server.RequestTimeout, 90 * time.Second},
		{"drain kept", cfg.Server.DrainTimeout, 30 * time.Second},
		{"max_body_bytes", cfg.Server.MaxBodyBytes, int64(1 << 20)},
		{"freshness", cfg.Load.Freshness, 1500 * time.Millisecond},
		{"guard_max_age", cfg.Load.GuardMaxAge, 2 * time.Hour},
		{"poll kept", cfg.Load.PollInterval, time.Second},
		{"candidate_ratio int", cfg.CacheAware.CandidateRatio, 1.0},
		{"min_match_ratio", cfg.CacheAware.MinMatchRatio, 0.25},
		{"max_kv_tokens", *cfg.DefaultPolicy.Admission.MaxKVTokens, int64(9223372036854775807)},
		{"default type kept", cfg.DefaultPolicy.Type, PolicyRoundRobin},
		{"tokenizer", cfg.Models["m"].Tokenizer.Path, "/models/m"},
		{"rank", cfg.Models["m"].Buckets[0].Rank, -3},
		{"limits.min", cfg.Models["m"].Buckets[0].Limits.Min, int64(10)},
		{"limits.max hex", *cfg.Models["m"].Buckets[0].Limits.Max, int64(256)},
		{"context unbounded", cfg.Models["m"].Buckets[0].MaxContextTokens == nil, true},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %v (%T), want %v (%T)", tt.name, tt.got, tt.got, tt.want, tt.want)
		}
	}
}

func TestDecodeWorkerIDsAbsentVersusEmpty(t *testing.T) {
	tests := []struct {
		name    string
		group   string
		format  Format
		wantNil bool
		want    []string
	}{
		{"absent", `{}`, FormatYAML, true, nil},
		{"null", `{worker_ids: null}`, FormatYAML, true, nil},
		{"tilde", `{worker_ids: ~}`, FormatYAML, true, nil},
		{"empty list", `{worker_ids: []}`, FormatYAML, false, []string{}},
		{"members", `{worker_ids: [w1, w2]}`, FormatYAML, false, []string{"w1", "w2"}},
		{"json absent", `{}`, FormatJSON, true, nil},
		{"json null", `{"worker_ids": null}`, FormatJSON, true, nil},
		{"json empty list", `{"worker_ids": []}`, FormatJSON, false, []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var doc string
			if tt.format == FormatJSON {
				doc = `{"workers": [{"id": "w1", "url": "http://127.0.0.1:1", "model": "m"}, {"id": "w2", "url": "http://127.0.0.1:2", "model": "m"}],
"models": {"m": {"buckets": [{"id": "a", "groups": {"plain": ` + tt.group + `}}]}}}`
			} else {
				doc = `
workers:
  - {id: w1, url: "http://127.0.0.1:1", model: m}
  - {id: w2, url: "http://127.0.0.1:2", model: m}
models: {m: {buckets: [{id: a, groups: {plain: ` + tt.group + `}}]}}`
			}
			cfg, err := Decode([]byte(doc), tt.format)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			ids := cfg.Models["m"].Buckets[0].Groups.Plain.WorkerIDs
			if (ids == nil) != tt.wantNil {
				t.Fatalf("worker_ids nil = %v, want %v", ids == nil, tt.wantNil)
			}
			if ids != nil && strings.Join(*ids, ",") != strings.Join(tt.want, ",") || ids != nil && len(*ids) != len(tt.want) {
				t.Errorf("worker_ids = %q, want %q", *ids, tt.want)
			}
		})
	}
}

func TestDecodePointerCaps(t *testing.T) {
	cfg := mustDecodeYAML(t, `
default_policy:
  type: sticky
  admission: {max_running_requests: 1, max_waiting_requests: null, max_inflight_requests: 64}
models:
  m:
    buckets:
      - {id: a, limits: {max: null}, max_context_tokens: null, groups: {plain: {policy: {type: random, admission: {}}}}}
`)
	a := cfg.DefaultPolicy.Admission
	if a.MaxRunningRequests == nil || *a.MaxRunningRequests != 1 || a.MaxWaitingRequests != nil ||
		a.MaxKVTokens != nil || a.MaxPendingPrefillTokens != nil || a.MaxInflightRequests == nil || *a.MaxInflightRequests != 64 {
		t.Errorf("default admission = %+v", a)
	}
	b := cfg.Models["m"].Buckets[0]
	if b.Limits.Max != nil || b.MaxContextTokens != nil {
		t.Errorf("null limits should be unbounded: %+v", b)
	}
	if g := b.Groups.Plain.Policy.Admission; g != (Admission{}) {
		t.Errorf("empty admission = %+v, want every cap unset", g)
	}
}

func TestDecodeSyntaxAndShapeErrors(t *testing.T) {
	tests := []struct {
		name   string
		data   string
		format Format
	}{
		{"yaml syntax", "server: {port: 1", FormatYAML},
		{"yaml duplicate key", "server: {port: 1}\nserver: {port: 2}", FormatYAML},
		{"yaml top-level list", "- a\n- b", FormatYAML},
		{"json syntax", `{"server": `, FormatJSON},
		{"json top-level list", `[1, 2]`, FormatJSON},
		{"unknown format", `{}`, Format("toml")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Decode([]byte(tt.data), tt.format)
			if err == nil || cfg != nil {
				t.Fatalf("Decode = %v, %v; want an error", cfg, err)
			}
			if !strings.HasPrefix(err.Error(), "cannot ") {
				t.Errorf("error %q does not follow the cannot-<verb> form", err)
			}
		})
	}
}

func TestDecodeEmptyDocument(t *testing.T) {
	for _, f := range []Format{FormatYAML, FormatJSON} {
		doc := ""
		if f == FormatJSON {
			doc = "{}"
		}
		cfg, err := Decode([]byte(doc), f)
		if err != nil {
			t.Fatalf("%s: Decode: %v", f, err)
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: Validate: %v", f, err)
		}
	}
}
