package config

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"
)

const precedenceFile = `
server: {port: 1001}
load: {freshness: 7s}
cache_aware: {min_load_choices: 3}
default_policy: {admission: {max_inflight_requests: 11}}
`

func TestLoadPrecedence(t *testing.T) {
	file := writeFile(t, "router.yaml", precedenceFile)
	tests := []struct {
		name      string
		args      []string
		env       []string
		port      int
		freshness time.Duration
		choices   int
		inflight  int64
	}{
		{name: "defaults", port: 8080, freshness: 5 * time.Second, choices: 2, inflight: -1},
		{name: "file over defaults", args: []string{"--config", file},
			port: 1001, freshness: 7 * time.Second, choices: 3, inflight: 11},
		{name: "env over file", args: []string{"--config", file},
			env: []string{"SWITCHYARD_SERVER__PORT=1002", "SWITCHYARD_LOAD__FRESHNESS=8s",
				"SWITCHYARD_CACHE_AWARE__MIN_LOAD_CHOICES=4", "SWITCHYARD_DEFAULT_POLICY__ADMISSION__MAX_INFLIGHT_REQUESTS=12"},
			port: 1002, freshness: 8 * time.Second, choices: 4, inflight: 12},
		{name: "flags over env", args: []string{"--config", file, "--port", "1003", "--set", "load.freshness=9s",
			"--min-load-choices=5", "--set", "default_policy.admission.max_inflight_requests=13"},
			env: []string{"SWITCHYARD_SERVER__PORT=1002", "SWITCHYARD_LOAD__FRESHNESS=8s",
				"SWITCHYARD_CACHE_AWARE__MIN_LOAD_CHOICES=4", "SWITCHYARD_DEFAULT_POLICY__ADMISSION__MAX_INFLIGHT_REQUESTS=12"},
			port: 1003, freshness: 9 * time.Second, choices: 5, inflight: 13},
		{name: "flags over file without env", args: []string{"--port=1003", "--config=" + file},
			port: 1003, freshness: 7 * time.Second, choices: 3, inflight: 11},
		{name: "env over defaults without file", env: []string{"SWITCHYARD_SERVER__PORT=1002"},
			port: 1002, freshness: 5 * time.Second, choices: 2, inflight: -1},
		{name: "env empty value unsets a pointer key", args: []string{"--config", file},
			env:  []string{"SWITCHYARD_DEFAULT_POLICY__ADMISSION__MAX_INFLIGHT_REQUESTS="},
			port: 1001, freshness: 7 * time.Second, choices: 3, inflight: -1},
		{name: "last flag wins", args: []string{"--port", "1", "--set", "server.port=2", "--port", "1004"},
			port: 1004, freshness: 5 * time.Second, choices: 2, inflight: -1},
		{name: "unrelated environment ignored", env: []string{"PATH=/bin", "switchyard_server__port=1", "SWITCHYARDX=1", "NOEQUALS"},
			port: 8080, freshness: 5 * time.Second, choices: 2, inflight: -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Load(tt.args, tt.env)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			inflight := int64(-1)
			if p := cfg.DefaultPolicy.Admission.MaxInflightRequests; p != nil {
				inflight = *p
			}
			if cfg.Server.Port != tt.port || cfg.Load.Freshness != tt.freshness ||
				cfg.CacheAware.MinLoadChoices != tt.choices || inflight != tt.inflight {
				t.Errorf("port %d freshness %v choices %d inflight %d; want %d %v %d %d",
					cfg.Server.Port, cfg.Load.Freshness, cfg.CacheAware.MinLoadChoices, inflight,
					tt.port, tt.freshness, tt.choices, tt.inflight)
			}
			if err := cfg.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

func TestLoadEnvMergesIntoFile(t *testing.T) {
	file := writeFile(t, "example.yaml", issueExample)
	cfg, err := Load([]string{"--config", file}, []string{
		"SWITCHYARD_MODELS__LLAMA__TOKENIZER__PATH=/models/llama",
		"SWITCHYARD_MODELS__LLAMA__POLICIES__DECODE__TYPE=load_based",
		"SWITCHYARD_KV__ENABLED=false",
		"SWITCHYARD_SERVER__API_KEY=secret",
		"SWITCHYARD_CACHE_AWARE__CANDIDATE_RATIO=0.5",
	})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	m := cfg.Models["llama"]
	if m.Tokenizer.Path != "/models/llama" || len(m.Buckets) != 1 || m.Policies.Decode == nil || m.Policies.Decode.Type != PolicyLoadBased {
		t.Errorf("model = %+v", m)
	}
	if cfg.KV.Enabled || cfg.Server.APIKey != "secret" || cfg.CacheAware.CandidateRatio != 0.5 {
		t.Errorf("kv.enabled %v api_key %q ratio %v", cfg.KV.Enabled, cfg.Server.APIKey, cfg.CacheAware.CandidateRatio)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

func TestLoadEnvErrors(t *testing.T) {
	env := []string{
		"SWITCHYARD_SERVER__PROT=1",
		"SWITCHYARD_SERVER__PORT=abc",
		"SWITCHYARD_WORKERS=x",
		"SWITCHYARD_SERVER=x",
		"SWITCHYARD_LOAD__FRESHNESS=5",
		"SWITCHYARD_=1",
		"SWITCHYARD_SERVER____PORT=1",
		"SWITCHYARD_SERVER.PORT=1",
		"SWITCHYARD_SERVER__PORT__X=1",
	}
	_, err := Load(nil, env)
	want := map[string]bool{
		"SWITCHYARD_SERVER__PROT (server.prot): unknown key (an unknown SWITCHYARD_* variable stops the start: unset it or correct its name)":                                                 true,
		`SWITCHYARD_SERVER__PORT (server.port): expected an integer, got "abc"`:                                                                                                               true,
		"SWITCHYARD_WORKERS (workers): is a list; set it in the config file":                                                                                                                  true,
		"SWITCHYARD_SERVER (server): is a section, not a key; set the keys inside it":                                                                                                         true,
		`SWITCHYARD_LOAD__FRESHNESS (load.freshness): invalid duration "5" (use a form such as "500ms", "5s" or "1m")`:                                                                        true,
		"SWITCHYARD_: invalid variable name (empty level; '__' separates levels) (an unknown SWITCHYARD_* variable stops the start: unset it or correct its name)":                            true,
		"SWITCHYARD_SERVER____PORT: invalid variable name (empty level; '__' separates levels) (an unknown SWITCHYARD_* variable stops the start: unset it or correct its name)":              true,
		"SWITCHYARD_SERVER.PORT: invalid variable name (use letters, digits and '_'; '__' separates levels) (an unknown SWITCHYARD_* variable stops the start: unset it or correct its name)": true,
		"SWITCHYARD_SERVER__PORT__X (server.port.x): unknown key (an unknown SWITCHYARD_* variable stops the start: unset it or correct its name)":                                            true,
	}
	got := errLines(err)
	if len(got) != len(want) {
		t.Errorf("got %d errors, want %d:\n  %s", len(got), len(want), strings.Join(got, "\n  "))
	}
	for _, line := range got {
		if !want[line] {
			t.Errorf("unexpected error line %q", line)
		}
	}
}

func TestLoadDroppedOptions(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string // exact error lines
	}{
		{"policy fused_score", []string{"--policy", "fused_score"},
			[]string{`--policy: "fused_score" was dropped; use power_of_two or cache_aware`}},
		{"policy score_policy", []string{"--policy=score_policy"},
			[]string{`--policy: "score_policy" was dropped; use power_of_two or cache_aware`}},
		{"prefill policy fused_score", []string{"--prefill-policy", "fused_score"},
			[]string{`--prefill-policy: "fused_score" was dropped; use power_of_two or cache_aware`}},
		{"fuse bare", []string{"--fuse"}, []string{"--fuse: " + fuseReplacement}},
		{"fuse with value", []string{"--fuse=prefix:0.7,load:0.3"}, []string{"--fuse: " + fuseReplacement}},
		{"fuse with separate value, later flags still parsed", []string{"--fuse", "terms", "--port", "1"},
			[]string{"--fuse: " + fuseReplacement}},
		{"fuse weights", []string{"-fuse-weights", "0.5"}, []string{"--fuse-weights: " + fuseReplacement}},
		{"decode policy legacy_host_affinity", []string{"--decode-policy", "legacy_host_affinity"},
			[]string{`--decode-policy: "legacy_host_affinity" was dropped; use power_of_two, or session_aware for session reuse`}},
		{"stable pair", []string{"--stable-pair"}, []string{"--stable-pair: " + stablePairReplacement}},
		{"stable pair with value", []string{"--stable-pair=true"}, []string{"--stable-pair: " + stablePairReplacement}},
		{"affinity mode soft", []string{"--affinity-mode", "soft"},
			[]string{`--affinity-mode: "soft" was ` + softAffinityReplace}},
		{"filter prefix_cache", []string{"--filter", "prefix_cache"},
			[]string{`--filter: "prefix_cache" was ` + prefixShareReplacement}},
		{"filter prefix_cache beside overloaded", []string{"--filter", "overloaded,prefix_cache", "--max-in-flight", "8"},
			[]string{`--filter: "prefix_cache" was ` + prefixShareReplacement}},
		{"prefix cache min share", []string{"--prefix-cache-min-share", "0.3"},
			[]string{"--prefix-cache-min-share: " + prefixShareReplacement}},
		{"prefix cache min share with equals", []string{"--prefix-cache-min-share=0.3"},
			[]string{"--prefix-cache-min-share: " + prefixShareReplacement}},
		{"all at once", []string{"--stable-pair", "--policy", "fused_score", "--fuse", "x", "--affinity-mode=soft"}, []string{
			"--stable-pair: " + stablePairReplacement,
			"--fuse: " + fuseReplacement,
			`--policy: "fused_score" was dropped; use power_of_two or cache_aware`,
			`--affinity-mode: "soft" was ` + softAffinityReplace,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Load(tt.args, nil)
			if cfg != nil {
				t.Errorf("Load returned a config with a dropped option")
			}
			if got := errLines(err); !equalLines(got, tt.want) {
				t.Fatalf("Load error =\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
			if !errors.Is(err, ErrDropped) {
				t.Errorf("error does not match ErrDropped: %v", err)
			}
		})
	}
}

func TestLoadDroppedPolicyInFile(t *testing.T) {
	for _, name := range []string{"fused_score", "score_policy", "legacy_host_affinity"} {
		t.Run(name, func(t *testing.T) {
			file := writeFile(t, "r.yaml", strings.Replace(issueExample, "type: power_of_two", "type: "+name, 1))
			cfg, err := Load([]string{"--config", file}, nil)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			err = cfg.Validate()
			if !errors.Is(err, ErrDropped) {
				t.Fatalf("Validate = %v, want ErrDropped", err)
			}
			want := `models.llama.buckets[0].groups.pd.decode.policy.type: unknown policy "` + name + `" (dropped; use power_of_two`
			if !strings.HasPrefix(err.Error(), want) {
				t.Errorf("Validate = %q, want prefix %q", err, want)
			}
		})
	}
}

func TestLoadAcceptedOptions(t *testing.T) {
	file := writeFile(t, "example.yaml", issueExample)
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, c *Config)
	}{
		{"affinity mode strict is a no-op", []string{"--affinity-mode", "strict"}, func(t *testing.T, c *Config) {
			if d := Default(); c.Affinity != d.Affinity {
				t.Errorf("affinity = %+v", c.Affinity)
			}
		}},
		{"simple key flags", []string{"--host", "0.0.0.0", "--api-key", "k1", "--admin-api-key", "k2",
			"--request-timeout", "2m", "--log-level", "debug", "--max-body-bytes", "1024", "--min-load-choices", "4"},
			func(t *testing.T, c *Config) {
				s := c.Server
				if s.Host != "0.0.0.0" || s.APIKey != "k1" || s.AdminAPIKey != "k2" || s.RequestTimeout != 2*time.Minute ||
					s.MaxBodyBytes != 1024 || c.Log.Level != "debug" || c.CacheAware.MinLoadChoices != 4 {
					t.Errorf("server = %+v log %q k %d", s, c.Log.Level, c.CacheAware.MinLoadChoices)
				}
			}},
		{"policy with a file sets the default policy", []string{"--config", file, "--policy", "load_based"}, func(t *testing.T, c *Config) {
			if c.DefaultPolicy.Type != PolicyLoadBased {
				t.Errorf("default policy = %+v", c.DefaultPolicy)
			}
			if c.Models["llama"].Buckets[0].Groups.PD.Decode.Policy.Type != PolicyPowerOfTwo {
				t.Errorf("--policy must not override group policies")
			}
		}},
		{"stage policy flags", []string{"--config", file, "--prefill-policy", "random", "--decode-policy", "load_based"}, func(t *testing.T, c *Config) {
			p := c.Models["llama"].Policies
			if p.Prefill == nil || p.Prefill.Type != PolicyRandom || p.Decode == nil || p.Decode.Type != PolicyLoadBased || p.Plain != nil {
				t.Errorf("stage policies = %+v", p)
			}
		}},
		{"max in flight caps every policy", []string{"--config", file, "--max-in-flight", "32", "--filter", "overloaded"}, func(t *testing.T, c *Config) {
			n := 0
			c.forEachPolicy(func(p *Policy) {
				n++
				if p.Admission.MaxInflightRequests == nil || *p.Admission.MaxInflightRequests != 32 {
					t.Errorf("policy %+v not capped", p)
				}
			})
			if n != 3 {
				t.Errorf("visited %d policies, want 3 (default, prefill, decode)", n)
			}
			// Other caps from the file are kept.
			if *c.Models["llama"].Buckets[0].Groups.PD.Prefill.Policy.Admission.MaxRunningRequests != 64 {
				t.Errorf("max_running_requests lost")
			}
			eff := c.EffectivePolicy("llama", RoleDecode, &Group{})
			if eff.Admission.MaxInflightRequests == nil || *eff.Admission.MaxInflightRequests != 32 {
				t.Errorf("inherited policy not capped: %+v", eff)
			}
		}},
		{"max in flight without filter", []string{"--max-in-flight", "5"}, func(t *testing.T, c *Config) {
			if p := c.DefaultPolicy.Admission.MaxInflightRequests; p == nil || *p != 5 {
				t.Errorf("default cap = %v", p)
			}
		}},
		{"a flag value that looks like a dropped flag is a value", []string{"--api-key", "--fuse", "--admin-api-key", "-stable-pair"},
			func(t *testing.T, c *Config) {
				if c.Server.APIKey != "--fuse" || c.Server.AdminAPIKey != "-stable-pair" {
					t.Errorf("keys = %q %q", c.Server.APIKey, c.Server.AdminAPIKey)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Load(tt.args, nil)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			tt.check(t, cfg)
			if err := cfg.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

func TestLoadQuickStart(t *testing.T) {
	cfg, err := Load([]string{"--worker-urls", "http://127.0.0.1:30001, http://127.0.0.1:30002",
		"--worker-urls=http://127.0.0.1:30003", "--model", "llama", "--policy", "power_of_two"}, nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if len(cfg.Workers) != 3 {
		t.Fatalf("workers = %+v", cfg.Workers)
	}
	for i, w := range cfg.Workers {
		wantID := []string{"w1", "w2", "w3"}[i]
		if w.ID != wantID || w.Model != "llama" || w.Role != RolePlain || w.DPSize != 1 || !strings.HasPrefix(w.URL, "http://127.0.0.1:3000") {
			t.Errorf("workers[%d] = %+v", i, w)
		}
	}
	m := cfg.Models["llama"]
	if len(cfg.Models) != 1 || len(m.Buckets) != 1 {
		t.Fatalf("models = %+v", cfg.Models)
	}
	b := m.Buckets[0]
	if b.ID != "default" || b.Limits.Min != 0 || b.Limits.Max != nil || b.MaxContextTokens != nil || b.Groups.PD != nil {
		t.Errorf("bucket = %+v", b)
	}
	g := b.Groups.Plain
	if g == nil || g.WorkerIDs != nil || g.Policy == nil || g.Policy.Type != PolicyPowerOfTwo {
		t.Errorf("group = %+v", g)
	}
	if got := cfg.EffectivePolicy("llama", RolePlain, g); got.Type != PolicyPowerOfTwo {
		t.Errorf("effective = %+v", got)
	}

	// Without --policy the group inherits the default round_robin.
	cfg, err = Load([]string{"--worker-urls", "http://127.0.0.1:1", "--model", "m"}, nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if g := cfg.Models["m"].Buckets[0].Groups.Plain; g.Policy != nil || cfg.EffectivePolicy("m", RolePlain, g).Type != PolicyRoundRobin {
		t.Errorf("group policy = %+v", g.Policy)
	}
}

func TestLoadFlagErrors(t *testing.T) {
	file := writeFile(t, "example.yaml", issueExample)
	plain := writeFile(t, "plain.yaml", "server: {port: 1}\n")
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"worker urls without model", []string{"--worker-urls", "http://127.0.0.1:1"},
			[]string{"--worker-urls: needs --model NAME"}},
		{"model without worker urls", []string{"--model", "m"}, []string{"--model: only used with --worker-urls"}},
		{"bad worker url", []string{"--worker-urls", "http://127.0.0.1:1,,127.0.0.1:2", "--model", "m"}, []string{
			`--worker-urls: URL 2 "": required`,
			`--worker-urls: URL 3 "127.0.0.1:2": URL "127.0.0.1:2" must start with http:// or https://`,
		}},
		{"space-separated worker urls", []string{"--worker-urls", "http://127.0.0.1:1", "http://127.0.0.1:2", "--model", "m"}, []string{
			"--worker-urls: needs --model NAME",
			`unexpected argument "http://127.0.0.1:2" (list engines as --worker-urls URL1,URL2)`,
			`unexpected argument "--model"`,
			`unexpected argument "m"`,
		}},
		{"worker urls with a file that has workers", []string{"--config", file, "--worker-urls", "http://127.0.0.1:1", "--model", "m"},
			[]string{"--worker-urls: cannot be combined with workers or models from --config or the environment; list the workers in the file instead"}},
		{"filter overloaded without cap", []string{"--filter", "overloaded"},
			[]string{"--filter: overloaded needs --max-in-flight N (the in-flight cap it applies)"}},
		{"unknown filter", []string{"--filter", "busy"}, []string{`--filter: unknown filter "busy" (only overloaded)`}},
		{"max in flight zero", []string{"--max-in-flight", "0"}, []string{"--max-in-flight: must be at least 1, got 0"}},
		{"unknown affinity mode", []string{"--affinity-mode", "loose"}, []string{`--affinity-mode: unknown mode "loose" (only strict)`}},
		{"unknown policy", []string{"--policy", "fastest"},
			[]string{`--policy: unknown policy "fastest" (known: round_robin, random, power_of_two, load_based, session_aware, sticky, cache_aware, consistent_hash, prefix_hash)`}},
		{"cache_aware decode policy", []string{"--decode-policy", "cache_aware"},
			[]string{"--decode-policy: cache_aware is only valid on plain or prefill groups"}},
		{"decode policy without pd buckets", []string{"--config", plain, "--decode-policy", "random"},
			[]string{"--decode-policy: has no effect: no model has a pd bucket"}},
		{"positional argument", []string{"serve"}, []string{`unexpected argument "serve"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Load(tt.args, nil)
			if cfg != nil {
				t.Errorf("Load returned a config")
			}
			if got := errLines(err); !equalLines(got, tt.want) {
				t.Fatalf("Load error =\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
		})
	}
}

func TestLoadParseErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // substring
	}{
		{"bad int", []string{"--port", "abc"}, `invalid value "abc" for flag -port: expected an integer, got "abc"`},
		{"bad duration", []string{"--request-timeout", "soon"}, `invalid value "soon" for flag -request-timeout`},
		{"unknown flag", []string{"--colour"}, "flag provided but not defined: -colour"},
		{"missing value", []string{"--port"}, "flag needs an argument: -port"},
		{"set unknown key", []string{"--set", "server.prot=1"}, "server.prot: unknown key"},
		{"set list", []string{"--set", "workers=1"}, "workers: is a list; set it in the config file"},
		{"set without equals", []string{"--set", "server.port"}, "expected KEY=VALUE"},
		{"set bad value", []string{"--set", "kv.enabled=maybe"}, `kv.enabled: expected true or false, got "maybe"`},
		{"max in flight not a number", []string{"--max-in-flight", "many"}, `expected an integer, got "many"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Load(tt.args, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load error = %v, want it to contain %q", err, tt.want)
			}
			if !strings.HasPrefix(err.Error(), "cannot parse flags: ") {
				t.Errorf("error %q lacks the cannot-parse prefix", err)
			}
		})
	}
}

func TestLoadHelp(t *testing.T) {
	for _, arg := range []string{"-h", "--help", "-help"} {
		_, err := Load([]string{"--port", "1", arg}, nil)
		if !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%s: err = %v, want flag.ErrHelp", arg, err)
		}
	}
}

func TestLoadFiles(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		content string
		wantErr string // substring; "" means success
	}{
		{"yaml", "r.yaml", issueExample, ""},
		{"yml upper case", "R.YML", issueExample, ""},
		{"json", "r.json", `{"server": {"port": 9}, "workers": []}`, ""},
		{"unsupported extension", "r.toml", "", `unsupported extension ".toml" (use .yaml, .yml or .json)`},
		{"no extension", "router", "", `unsupported extension ""`},
		{"yaml syntax", "r.yaml", "server: [", "cannot load config file"},
		{"json in yaml clothing is fine", "r.yaml", `{"server": {"port": 9}}`, ""},
		{"strict errors from a file", "r.json", `{"server": {"port": 9, "hots": "x"}}`, "server.hots: unknown key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, tt.file, tt.content)
			cfg, err := Load([]string{"--config", path}, nil)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				if err := cfg.Validate(); err != nil {
					t.Errorf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Load error = %v, want %q", err, tt.wantErr)
			}
		})
	}
	if _, err := Load([]string{"--config", "testdata/does-not-exist.yaml"}, nil); err == nil ||
		!strings.Contains(err.Error(), `cannot load config file "testdata/does-not-exist.yaml"`) {
		t.Errorf("missing file: %v", err)
	}
}

func TestLoadExampleFiles(t *testing.T) {
	for _, f := range []string{"testdata/example.yaml", "testdata/example.json"} {
		t.Run(f, func(t *testing.T) {
			cfg, err := Load([]string{"--config", f}, nil)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			checkExample(t, cfg)
		})
	}
}

func TestFormatOf(t *testing.T) {
	tests := []struct {
		name string
		want Format
		err  bool
	}{
		{"a.yaml", FormatYAML, false}, {"a.YML", FormatYAML, false}, {"dir.d/a.json", FormatJSON, false},
		{"a.toml", "", true}, {"a", "", true}, {"a.yaml.bak", "", true},
	}
	for _, tt := range tests {
		got, err := FormatOf(tt.name)
		if got != tt.want || (err != nil) != tt.err {
			t.Errorf("FormatOf(%q) = %q, %v", tt.name, got, err)
		}
	}
}

func TestUsage(t *testing.T) {
	var buf bytes.Buffer
	Usage(&buf)
	out := buf.String()
	for _, want := range []string{
		"--config FILE", "--host ADDRESS", "(default: 127.0.0.1)", "--port PORT", "(default: 8080)",
		"--api-key KEY", "--admin-api-key KEY", "--worker-urls URLs", "--model NAME", "--policy NAME",
		"--prefill-policy NAME", "--decode-policy NAME", "--request-timeout DURATION", "(default: 10m0s)",
		"--log-level LEVEL", "(default: info)", "--filter FILTERS", "--max-in-flight N", "--min-load-choices K",
		"(default: 2)", "--max-body-bytes BYTES", "(default: 33554432)", "--affinity-mode MODE", "(default: strict)",
		"--set KEY=VALUE", "SWITCHYARD_SERVER__PORT",
		"--policy fused_score|score_policy", "--fuse", "--decode-policy legacy_host_affinity", "--stable-pair",
		"--affinity-mode soft", "--filter prefix_cache", "--prefix-cache-min-share",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("Usage lacks %q", want)
		}
	}
	// Every defined flag is listed with a default.
	var opts cliOptions
	newFlagSet(&opts).VisitAll(func(f *flag.Flag) {
		if !strings.Contains(out, "  --"+f.Name+" ") && !strings.Contains(out, "  --"+f.Name+"\n") {
			t.Errorf("Usage lacks --%s", f.Name)
		}
	})
	if n, m := strings.Count(out, "(default: "), strings.Count(out, "\n  --"); n < m-8 {
		t.Errorf("%d defaults for %d flag lines", n, m)
	}
}
