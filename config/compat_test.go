package config

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// loadCompat parses an sgl-router command line, names the engines' model "m" when the
// command line needs one, loads and validates.
func loadCompat(t *testing.T, line string, environ ...string) *Config {
	t.Helper()
	cl, err := ParseCommandLine(append([]string{"--compat", CompatSGLRouter}, strings.Fields(line)...))
	if err != nil {
		t.Fatalf("parse %q: %v", line, err)
	}
	if cl.Compat() != CompatSGLRouter {
		t.Fatalf("Compat() = %q", cl.Compat())
	}
	if len(cl.NeedsModel()) > 0 {
		cl.SetModel("m")
	}
	cfg, err := cl.Load(environ)
	if err != nil {
		t.Fatalf("load %q: %v", line, err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("validate %q: %v", line, err)
	}
	return cfg
}

func TestCompatPlainLaunch(t *testing.T) {
	cfg := loadCompat(t, "--worker-urls http://127.0.0.1:30001 http://127.0.0.1:30002,http://127.0.0.1:30003 "+
		"--policy round_robin --host 127.0.0.2 --port 30000 --log-level warning --max-payload-size 1048576 "+
		"--request-timeout-secs 120 --max-concurrent-requests -1 --queue-size 7 --queue-timeout-secs 9 "+
		"--api-key sk-workers --shutdown-grace-period-secs 12")
	var ids []string
	for _, w := range cfg.Workers {
		if w.Model != "m" || w.Role != RolePlain {
			t.Errorf("worker %+v", w)
		}
		ids = append(ids, w.ID)
	}
	if want := []string{"127.0.0.1:30001", "127.0.0.1:30002", "127.0.0.1:30003"}; !slices.Equal(ids, want) {
		t.Errorf("worker IDs %v, want %v", ids, want)
	}
	g := cfg.Models["m"].Buckets[0].Groups.Plain
	if g == nil || g.Policy.Type != PolicyRoundRobin || g.WorkerIDs != nil {
		t.Errorf("plain group %+v", g)
	}
	s := cfg.Server
	if s.Host != "127.0.0.2" || s.Port != 30000 || s.MaxBodyBytes != 1<<20 || s.RequestTimeout != 2*time.Minute ||
		s.MaxConcurrentRequests != 0 || s.QueueSize != 7 || s.QueueTimeout != 9*time.Second || s.DrainTimeout != 12*time.Second {
		t.Errorf("server %+v", s)
	}
	if cfg.Log.Level != LogLevelWarn {
		t.Errorf("log level %q", cfg.Log.Level)
	}
	// sgl-router's --api-key is the workers' key, never the router's own.
	if cfg.Upstream.APIKey != "sk-workers" || s.APIKey != "" {
		t.Errorf("upstream key %q, router key %q", cfg.Upstream.APIKey, s.APIKey)
	}
	if cfg.CacheAware.Source != CacheSourceLocal {
		t.Errorf("no cache_aware group, yet source %q", cfg.CacheAware.Source)
	}
}

// TestCompatDefaultPolicy: sgl-router's default policy is cache_aware over its own tree of
// dispatched requests: the approximate source, tuned by its flags.
func TestCompatDefaultPolicy(t *testing.T) {
	cfg := loadCompat(t, "--worker-urls=http://127.0.0.1:30001 --cache-threshold 0.5 --balance-abs-threshold 32 "+
		"--balance-rel-threshold 1.2 --eviction-interval-secs 60 --max-tree-size 65536")
	if g := cfg.Models["m"].Buckets[0].Groups.Plain; g.Policy.Type != PolicyCacheAware {
		t.Errorf("default policy %q, want cache_aware", g.Policy.Type)
	}
	want := ApproximateCache{CacheThreshold: 0.5, BalanceAbsThreshold: 32, BalanceRelThreshold: 1.2,
		EvictionInterval: time.Minute, MaxTreeSize: 65536}
	if cfg.CacheAware.Source != CacheSourceApproximate || cfg.CacheAware.Approximate != want {
		t.Errorf("cache_aware %q %+v, want approximate %+v", cfg.CacheAware.Source, cfg.CacheAware.Approximate, want)
	}
	// An explicit source is kept.
	cfg = loadCompat(t, "--worker-urls http://127.0.0.1:30001 --set cache_aware.source=local --eviction-interval 5")
	if cfg.CacheAware.Source != CacheSourceLocal || cfg.CacheAware.Approximate.EvictionInterval != 5*time.Second {
		t.Errorf("source %q, eviction %s", cfg.CacheAware.Source, cfg.CacheAware.Approximate.EvictionInterval)
	}
}

// TestCompatHashingAndRanks: sgl-router's prefix_hash policy and its flags, and --dp-aware,
// map to Switchyard's prefix_hash, hashing keys and rank dispatch.
func TestCompatHashingAndRanks(t *testing.T) {
	cfg := loadCompat(t, "--worker-urls http://127.0.0.1:30001 --policy prefix_hash --prefix-token-count 128 --prefix-hash-load-factor 1.5 --dp-aware")
	if g := cfg.Models["m"].Buckets[0].Groups.Plain; g.Policy.Type != PolicyPrefixHash {
		t.Errorf("policy %q, want prefix_hash", g.Policy.Type)
	}
	if cfg.Hashing.PrefixTokens != 128 || cfg.Hashing.LoadFactor != 1.5 || !cfg.DPDispatch.Enabled {
		t.Errorf("hashing %+v, dp_dispatch %+v", cfg.Hashing, cfg.DPDispatch)
	}
	if cfg = loadCompat(t, "--worker-urls http://127.0.0.1:30001"); cfg.DPDispatch.Enabled {
		t.Error("rank dispatch on without --dp-aware")
	}
}

// TestCompatConsistentHashing: sgl-router's consistent_hashing policy is consistent_hash keyed
// by sgl-router's headers (x-smg-routing-key, then a client's implicit keys), unless the
// configuration file names the headers; Switchyard's own name keeps its defaults.
func TestCompatConsistentHashing(t *testing.T) {
	sgl := []string{"x-smg-routing-key", "authorization", "x-forwarded-for", "cookie"}
	file := filepath.Join(t.TempDir(), "hashing.yaml")
	if err := os.WriteFile(file, []byte("hashing:\n  key_headers: [x-user]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		line    string
		plain   string // the plain group's policy ("" for the pd launch)
		headers []string
	}{
		{"plain", "--worker-urls http://127.0.0.1:30001 --policy consistent_hashing", PolicyConsistentHash, sgl},
		{"pd prefill", "--pd-disaggregation --prefill http://127.0.0.1:30001 --decode http://127.0.0.1:30002 " +
			"--prefill-policy consistent_hashing --decode-policy consistent_hashing", "", sgl},
		{"headers from the file", "--config " + file + " --worker-urls http://127.0.0.1:30001 --policy consistent_hashing",
			PolicyConsistentHash, []string{"x-user"}},
		{"own name", "--worker-urls http://127.0.0.1:30001 --policy consistent_hash", PolicyConsistentHash,
			Default().Hashing.KeyHeaders},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := loadCompat(t, tt.line)
			g := cfg.Models["m"].Buckets[0].Groups
			if tt.plain != "" {
				if g.Plain == nil || g.Plain.Policy.Type != tt.plain {
					t.Fatalf("plain group %+v, want policy %s", g.Plain, tt.plain)
				}
			} else if g.PD == nil || g.PD.Prefill.Policy.Type != PolicyConsistentHash || g.PD.Decode.Policy.Type != PolicyConsistentHash {
				t.Fatalf("pd groups %+v, want consistent_hash on both", g.PD)
			}
			if !slices.Equal(cfg.Hashing.KeyHeaders, tt.headers) {
				t.Errorf("hashing.key_headers %q, want %q", cfg.Hashing.KeyHeaders, tt.headers)
			}
		})
	}
}

func TestCompatPDLaunch(t *testing.T) {
	cfg := loadCompat(t, "--pd-disaggregation --prefill http://127.0.0.1:30001 9001 --prefill http://127.0.0.2:30002 "+
		"--prefill http://127.0.0.3:30005 none --decode http://127.0.0.3:30003 --decode http://127.0.0.4:30004 --policy cache_aware")
	type w struct {
		id   string
		role Role
		port int
	}
	var got []w
	for _, x := range cfg.Workers {
		p := 0
		if x.BootstrapPort != nil {
			p = *x.BootstrapPort
		}
		got = append(got, w{x.ID, x.Role, p})
	}
	want := []w{{"127.0.0.1:30001", RolePrefill, 9001}, {"127.0.0.2:30002", RolePrefill, 0}, {"127.0.0.3:30005", RolePrefill, 0},
		{"127.0.0.3:30003", RoleDecode, 0}, {"127.0.0.4:30004", RoleDecode, 0}}
	if !slices.Equal(got, want) {
		t.Errorf("workers %v, want %v", got, want)
	}
	pd := cfg.Models["m"].Buckets[0].Groups.PD
	if pd.Prefill.Policy.Type != PolicyCacheAware || pd.Decode.Policy.Type != PolicyLoadBased {
		t.Errorf("pd policies %s/%s, want cache_aware/load_based", pd.Prefill.Policy.Type, pd.Decode.Policy.Type)
	}
	if cfg.CacheAware.Source != CacheSourceApproximate {
		t.Errorf("source %q", cfg.CacheAware.Source)
	}
	cfg = loadCompat(t, "--pd-disaggregation --prefill http://127.0.0.1:30001 --decode http://127.0.0.3:30003 "+
		"--prefill-policy cache_aware --decode-policy power_of_two --policy random")
	pd = cfg.Models["m"].Buckets[0].Groups.PD
	if pd.Prefill.Policy.Type != PolicyCacheAware || pd.Decode.Policy.Type != PolicyPowerOfTwo {
		t.Errorf("pd policies %s/%s, want cache_aware/power_of_two", pd.Prefill.Policy.Type, pd.Decode.Policy.Type)
	}
}

func TestCompatResilienceFlags(t *testing.T) {
	cfg := loadCompat(t, "--worker-urls http://127.0.0.1:30001 --policy power_of_two "+
		"--retry-max-retries 4 --retry-initial-backoff-ms 100 --retry-max-backoff-ms 2500 --retry-backoff-multiplier 1.5 "+
		"--retry-jitter-factor 0.1 --cb-failure-threshold 3 --cb-success-threshold 2 --cb-timeout-duration-secs 10 "+
		"--cb-window-duration-secs 30 --health-failure-threshold 4 --health-success-threshold 1 --health-check-timeout-secs 3 "+
		"--health-check-interval-secs 1 --health-check-endpoint /ping --max-concurrent-requests 8 --rate-limit-tokens-per-second 20 "+
		"--worker-startup-timeout-secs 30 --worker-startup-check-interval 2")
	r := cfg.Retry
	if !r.Enabled || r.MaxRetries != 3 || r.InitialBackoff != 100*time.Millisecond || r.MaxBackoff != 2500*time.Millisecond ||
		r.BackoffMultiplier != 1.5 || r.Jitter != 0.1 {
		t.Errorf("retry %+v", r)
	}
	h := cfg.Health
	if !h.BreakerEnabled || h.BreakerFailures != 3 || h.BreakerSuccesses != 2 || h.BreakerCooldown != 10*time.Second ||
		h.BreakerWindow != 30*time.Second || h.FailureThreshold != 4 || h.SuccessThreshold != 1 || h.Timeout != 3*time.Second ||
		h.Interval != time.Second || h.Endpoint != "/ping" || h.StartupTimeout != 30*time.Second || h.StartupCheckInterval != 2*time.Second {
		t.Errorf("health %+v", h)
	}
	if s := cfg.Server; s.MaxConcurrentRequests != 8 || s.RateLimit.RequestsPerSecond != 20 || s.RateLimit.Burst != 8 {
		t.Errorf("server limits %d, %v/%d", s.MaxConcurrentRequests, s.RateLimit.RequestsPerSecond, s.RateLimit.Burst)
	}
	cfg = loadCompat(t, "--worker-urls http://127.0.0.1:30001 --disable-retries --disable-circuit-breaker")
	if cfg.Retry.Enabled || cfg.Health.BreakerEnabled {
		t.Errorf("retries %v, breaker %v: want both off", cfg.Retry.Enabled, cfg.Health.BreakerEnabled)
	}
}

// TestCompatMetricsAndWorkerTLS: --prometheus-host and --prometheus-port open the separate
// metrics listener (server.metrics_*), and the client-certificate flags are the TLS of the
// connections to https workers (upstream.tls.*), --ca-cert-paths taking several files.
func TestCompatMetricsAndWorkerTLS(t *testing.T) {
	cfg := loadCompat(t, "--worker-urls https://127.0.0.1:30001 --prometheus-host 0.0.0.0 --prometheus-port 29000 "+
		"--client-cert-path /etc/router/client.pem --client-key-path /etc/router/client.key "+
		"--ca-cert-paths /etc/router/ca1.pem /etc/router/ca2.pem --port 30000")
	if s := cfg.Server; s.MetricsHost != "0.0.0.0" || s.MetricsPort == nil || *s.MetricsPort != 29000 {
		t.Errorf("metrics listener %q:%v", s.MetricsHost, s.MetricsPort)
	}
	u := cfg.Upstream.TLS
	if u.CertFile != "/etc/router/client.pem" || u.KeyFile != "/etc/router/client.key" ||
		!slices.Equal(u.CAFiles, []string{"/etc/router/ca1.pem", "/etc/router/ca2.pem"}) {
		t.Errorf("upstream.tls %+v", u)
	}
	if cfg := loadCompat(t, "--worker-urls http://127.0.0.1:30001"); cfg.Server.MetricsPort != nil || !cfg.Upstream.TLS.IsZero() {
		t.Errorf("without the flags: metrics port %v, upstream.tls %+v", cfg.Server.MetricsPort, cfg.Upstream.TLS)
	}
}

// TestCompatFlagKeysExist: every sgl-router flag that maps onto a key names a key of the
// schema (a list for a list flag), so that none is refused for want of its key.
func TestCompatFlagKeysExist(t *testing.T) {
	for _, f := range sglFlags() {
		if f.key == "" {
			continue
		}
		segs := strings.Split(f.key, ".")
		if f.kind == sglList {
			if !isListKey(segs) {
				t.Errorf("--%s: %s is not a list key", f.name, f.key)
			}
			continue
		}
		if _, _, ferr := schemaLeaf(segs); ferr != nil {
			t.Errorf("--%s: %s: %v", f.name, f.key, ferr)
		}
	}
}

func TestCompatStartupWait(t *testing.T) {
	cl, err := ParseCommandLine([]string{"--compat", "sgl-router", "--worker-urls", "http://127.0.0.1:1",
		"--worker-startup-timeout-secs", "45", "--worker-startup-check-interval", "3"})
	if err != nil {
		t.Fatal(err)
	}
	if got := cl.NeedsModel(); !slices.Equal(got, []string{"http://127.0.0.1:1"}) {
		t.Errorf("NeedsModel = %v", got)
	}
	if to, iv := cl.StartupWait(); to != 45*time.Second || iv != 3*time.Second {
		t.Errorf("StartupWait = %s, %s", to, iv)
	}
	if v, ok := cl.Setting("health.startup_timeout"); !ok || v != "45s" {
		t.Errorf("Setting = %q, %v", v, ok)
	}
	if _, ok := cl.Setting("upstream.api_key"); ok {
		t.Errorf("a key no flag set")
	}
	if _, err := cl.Load(nil); err == nil || !strings.Contains(err.Error(), "--model") {
		t.Errorf("Load without the model: %v", err)
	}
	cl, _ = ParseCommandLine([]string{"--compat=sgl-router", "--worker-urls", "http://127.0.0.1:1", "--model", "x"})
	if cl.NeedsModel() != nil {
		t.Errorf("a named model still needs discovery")
	}
	if to, iv := cl.StartupWait(); to != Default().Health.StartupTimeout || iv != Default().Health.StartupCheckInterval {
		t.Errorf("default StartupWait = %s, %s", to, iv)
	}
}

func TestCompatErrors(t *testing.T) {
	tests := []struct {
		name string
		line string
		want []string // every error line
	}{
		{"unknown flag", "--worker-urls http://127.0.0.1:1 --frobnicate 3",
			[]string{"--frobnicate: not an sgl-router flag Switchyard knows (switchyard serve --compat sgl-router --help lists them)"}},
		{"refused flags", "--worker-urls http://127.0.0.1:1 --log-dir /tmp/x --service-discovery --selector app=x tier=y",
			[]string{
				"--log-dir: no equivalent: Switchyard logs to standard error",
				"--service-discovery: no equivalent: add and remove workers with the admin API (POST /workers, DELETE /workers/{url})",
				"--selector: no equivalent (Kubernetes service discovery)",
			}},
		{"policies", "--pd-disaggregation --prefill http://127.0.0.1:1 --decode http://127.0.0.1:2 --policy manual --decode-policy cache_aware --prefill-policy fused",
			[]string{
				`--policy: "manual" has no equivalent; use sticky (its key comes from the x-sgl-routing-key header)`,
				"--decode-policy: cache_aware is only valid on plain or prefill groups; use load_based or power_of_two for decode",
				`--prefill-policy: unknown policy "fused" (known: round_robin, random, power_of_two, load_based, session_aware, sticky, cache_aware, consistent_hash, prefix_hash)`,
			}},
		{"values", "--worker-urls http://127.0.0.1:1 --port x --request-timeout-secs -3 --retry-max-retries 12 --cache-threshold y --disable-retries=false",
			[]string{
				`--port: expected an integer, got "x"`,
				`--request-timeout-secs: expected a number of seconds, got "-3"`,
				"--retry-max-retries: 12 attempts: Switchyard makes at most 9 (retry.max_retries 8)",
				`--cache-threshold: expected a finite number, got "y"`,
				"--disable-retries: takes no value",
			}},
		{"pd shape", "--prefill http://127.0.0.1:1 9001 extra --decode",
			[]string{
				"--prefill: takes a URL and an optional bootstrap port, got 3 values",
				"--decode: takes one URL, got 0 values",
				"--prefill: needs --pd-disaggregation",
				"--decode: needs --pd-disaggregation",
				"--worker-urls: sgl-router's command line needs its workers (--worker-urls, or --pd-disaggregation with --prefill and --decode), or a --config file",
			}},
		{"pd without workers", "--pd-disaggregation --prefill http://127.0.0.1:1 70000",
			[]string{
				`--prefill: bootstrap port of http://127.0.0.1:1 must be 1..65535 or none, got "70000"`,
				"--pd-disaggregation: needs --prefill URL [BOOTSTRAP_PORT]",
				"--pd-disaggregation: needs --decode URL",
			}},
		{"prefill without pd", "--worker-urls http://127.0.0.1:1 --prefill http://127.0.0.1:2",
			[]string{"--prefill: needs --pd-disaggregation"}},
		{"urls", "--worker-urls 127.0.0.1:1 http://127.0.0.1:2 http://127.0.0.1:2/",
			[]string{
				`--worker-urls: URL "127.0.0.1:1" must start with http:// or https://`,
				"--worker-urls: http://127.0.0.1:2 and http://127.0.0.1:2/ are the same engine (127.0.0.1:2)",
			}},
		{"missing value", "--worker-urls http://127.0.0.1:1 --port",
			[]string{"--port: needs a value"}},
		{"stray argument and mode", "--compat vllm --worker-urls http://127.0.0.1:1 --port 1 extra",
			[]string{`--compat: unknown compatibility mode "vllm" (only sgl-router)`, `unexpected argument "extra"`}},
		{"model without workers", "--config x.yaml --model m",
			[]string{"--model: only used with workers on the command line"}},
		{"tokenizer", "--worker-urls http://127.0.0.1:1 --model-path meta-llama/Llama-3.1-8B",
			[]string{`--model-path: "meta-llama/Llama-3.1-8B" is not a local directory or file: Switchyard loads tokenizers from local files (models.<name>.tokenizer.path)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseCommandLine(append([]string{"--compat", CompatSGLRouter}, strings.Fields(tt.line)...))
			got := errLines(err)
			if !slices.Equal(got, tt.want) {
				t.Errorf("errors:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
		})
	}
}

func TestCompatHelpAndMixing(t *testing.T) {
	_, err := ParseCommandLine([]string{"--compat", "sgl-router", "--help"})
	if !errors.Is(err, ErrCompatHelp) || !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: %v", err)
	}
	var b strings.Builder
	CompatUsage(&b)
	for _, f := range sglFlags() {
		if !strings.Contains(b.String(), "--"+f.name+" ") {
			t.Errorf("usage does not list --%s", f.name)
		}
	}
	// The workers of the command line cannot be mixed with a file's.
	file := writeFile(t, "c.yaml", "workers: [{id: a, url: 'http://127.0.0.1:9', model: m}]\n")
	cl, err := ParseCommandLine([]string{"--compat", "sgl-router", "--config", file, "--worker-urls", "http://127.0.0.1:1", "--model", "m"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Load(nil); err == nil || !strings.Contains(err.Error(), "cannot be combined") {
		t.Errorf("mixed workers: %v", err)
	}
	// A file alone (workers added later by the admin API, or listed in it) is fine, and
	// Switchyard's --admin-api-key keeps its meaning.
	cl, err = ParseCommandLine([]string{"--compat", "sgl-router", "--config", file, "--admin-api-key", "adm", "--port", "30000"})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := cl.Load(nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Server.AdminAPIKey != "adm" || cfg.Server.Port != 30000 || len(cfg.Workers) != 1 {
		t.Errorf("server %+v, %d workers", cfg.Server, len(cfg.Workers))
	}
	// Without --compat, sgl-router's grammar is not Switchyard's.
	if _, err := Load([]string{"--worker-urls", "http://127.0.0.1:1", "http://127.0.0.1:2", "--model", "m"}, nil); err == nil {
		t.Error("space-separated --worker-urls accepted without --compat")
	}
}
