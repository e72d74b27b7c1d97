package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// validBase returns a valid configuration with a PD model (llama: P1, P2, D1, D2 in a
// short and a long bucket) and a plain model (qwen: Q1 with a catch-all group).
func validBase() *Config {
	c := Default()
	c.Workers = []Worker{
		{ID: "P1", URL: "http://127.0.0.1:30001", Model: "llama", Role: RolePrefill, DPSize: 1, BootstrapPort: ptr(8998)},
		{ID: "D1", URL: "http://127.0.0.1:30002", Model: "llama", Role: RoleDecode, DPSize: 1},
		{ID: "Q1", URL: "https://127.0.0.1:30003/base", Model: "qwen", Role: RolePlain, DPSize: 2,
			KVEvents: "tcp://127.0.0.1:5557", LoadPublish: "ipc:///tmp/load.sock"},
		{ID: "P2", URL: "http://127.0.0.1:30004", Model: "llama", Role: RolePrefill, DPSize: 1},
		{ID: "D2", URL: "http://127.0.0.1:30005", Model: "llama", Role: RoleDecode, DPSize: 1},
	}
	c.Models = map[string]Model{
		"llama": {
			Buckets: []Bucket{
				{
					ID: "short", Rank: 10,
					Limits:           Limits{Min: 0, Max: ptr[int64](4096)},
					MaxContextTokens: ptr[int64](8192),
					Groups: Groups{PD: &PDGroups{
						Prefill: &Group{WorkerIDs: &[]string{"P1"}, Policy: &Policy{Type: PolicyCacheAware,
							Admission: Admission{MaxRunningRequests: ptr[int64](64)}}},
						Decode: &Group{WorkerIDs: &[]string{"D1"}, Policy: &Policy{Type: PolicyPowerOfTwo}},
					}},
				},
				{
					ID: "long", Rank: 20,
					Limits: Limits{Min: 0},
					Groups: Groups{PD: &PDGroups{
						Prefill: &Group{WorkerIDs: &[]string{"P2"}},
						Decode:  &Group{WorkerIDs: &[]string{"D2"}},
					}},
				},
			},
		},
		"qwen": {
			Policies: StagePolicies{Plain: &Policy{Type: PolicySticky, Fallback: PolicyLoadBased}},
			Buckets:  []Bucket{{ID: "all", Groups: Groups{Plain: &Group{}}}},
		},
	}
	return c
}

// bucket returns a pointer into the model's bucket slice for mutation.
func bucket(c *Config, model string, i int) *Bucket { return &c.Models[model].Buckets[i] }

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *Config)
		want   []string // exact error lines, in order; nil means valid
		kind   error    // the sentinel every error unwraps to; nil means ErrInvalid
	}{
		{name: "valid base", mutate: func(*Config) {}},
		{name: "valid with admission caps, sticky fallbacks and remote cache", mutate: func(c *Config) {
			c.DefaultPolicy = Policy{Type: PolicySticky, Fallback: PolicyRandom, Admission: Admission{
				MaxRunningRequests: ptr[int64](1), MaxWaitingRequests: ptr[int64](2), MaxKVTokens: ptr[int64](3),
				MaxPendingPrefillTokens: ptr[int64](4), MaxInflightRequests: ptr[int64](5)}}
			c.CacheAware.Source = CacheSourceRemote
			c.CacheAware.RemoteURL = "http://127.0.0.1:9000"
			c.Server.Port = 0
			c.Models["llama"].Buckets[1].Groups.PD.Decode.WorkerIDs = &[]string{}
		}},

		// server
		{name: "server port out of range", mutate: func(c *Config) { c.Server.Port = 70000 },
			want: []string{"server.port: must be in 0..65535, got 70000"}},
		{name: "server negative port", mutate: func(c *Config) { c.Server.Port = -1 },
			want: []string{"server.port: must be in 0..65535, got -1"}},
		{name: "server sizes and durations", mutate: func(c *Config) {
			c.Server.MaxBodyBytes = 0
			c.Server.RequestTimeout = 0
			c.Server.StreamIdleTimeout = -time.Second
			c.Server.DrainTimeout = 0
		}, want: []string{
			"server.max_body_bytes: must be at least 1, got 0",
			"server.request_timeout: must be a positive duration, got 0s",
			"server.stream_idle_timeout: must be a positive duration, got -1s",
			"server.drain_timeout: must be a positive duration, got 0s",
		}},
		{name: "server client limits", mutate: func(c *Config) {
			c.Server.WriteTimeout = 0
			c.Server.MaxConnections = -1
			c.Server.MaxConnectionsPerIP = -2
			c.Server.MaxHeaderBytes = 512
			c.Server.MaxBodyBytesInFlight = c.Server.MaxBodyBytes - 1
		}, want: []string{
			"server.write_timeout: must be a positive duration, got 0s",
			"server.max_connections: must be at least 0, got -1",
			"server.max_connections_per_ip: must be at least 0, got -2",
			"server.max_header_bytes: must be in 1024..1048576, got 512",
			"server.max_body_bytes_in_flight: must be at least server.max_body_bytes (33554432), got 33554431: a body of the largest size must fit",
		}},
		{name: "server header cap too large", mutate: func(c *Config) { c.Server.MaxHeaderBytes = 2 << 20 },
			want: []string{"server.max_header_bytes: must be in 1024..1048576, got 2097152"}},

		// workers
		{name: "worker empty ID", mutate: func(c *Config) { c.Workers[2].ID = "" },
			want: []string{"workers[2].id: required"}},
		{name: "worker duplicate ID", mutate: func(c *Config) {
			c.Workers = append(c.Workers, Worker{ID: "Q1", URL: "http://127.0.0.1:1", Model: "qwen", Role: RolePlain, DPSize: 1})
		}, want: []string{`workers[5].id: duplicate worker ID "Q1" (also workers[2])`}},
		{name: "worker URL scheme", mutate: func(c *Config) { c.Workers[2].URL = "ftp://127.0.0.1:1" },
			want: []string{`workers[2].url: URL "ftp://127.0.0.1:1" must use http or https`}},
		{name: "worker URL without host", mutate: func(c *Config) { c.Workers[2].URL = "http:///x" },
			want: []string{`workers[2].url: URL "http:///x" has no host`}},
		{name: "worker URL missing", mutate: func(c *Config) { c.Workers[2].URL = "" },
			want: []string{"workers[2].url: required"}},
		{name: "worker URL bad port", mutate: func(c *Config) { c.Workers[2].URL = "http://127.0.0.1:99999" },
			want: []string{`workers[2].url: URL "http://127.0.0.1:99999" has an invalid port`}},
		{name: "worker URL unparsable", mutate: func(c *Config) { c.Workers[2].URL = "http://[::1" },
			want: []string{`workers[2].url: invalid URL "http://[::1"`}},
		{name: "worker model missing", mutate: func(c *Config) { c.Workers[2].Model = "" },
			want: []string{"workers[2].model: required"}},
		{name: "worker role unknown", mutate: func(c *Config) { c.Workers[2].Role = "mixed" },
			want: []string{`workers[2].role: unknown role "mixed" (plain, prefill or decode)`}},
		{name: "worker role empty", mutate: func(c *Config) { c.Workers[2].Role = "" },
			want: []string{`workers[2].role: unknown role "" (plain, prefill or decode)`}},
		{name: "worker dp_size", mutate: func(c *Config) { c.Workers[2].DPSize = 0 },
			want: []string{"workers[2].dp_size: must be in 1..4096, got 0"}},
		{name: "worker dp_size past the bound", mutate: func(c *Config) { c.Workers[2].DPSize = 2_000_000_000 },
			want: []string{"workers[2].dp_size: must be in 1..4096, got 2000000000"}},
		{name: "worker bootstrap port zero", mutate: func(c *Config) { c.Workers[0].BootstrapPort = ptr(0) },
			want: []string{"workers[0].bootstrap_port: must be in 1..65535, got 0"}},
		{name: "worker bootstrap port high", mutate: func(c *Config) { c.Workers[0].BootstrapPort = ptr(65536) },
			want: []string{"workers[0].bootstrap_port: must be in 1..65535, got 65536"}},
		{name: "worker endpoints", mutate: func(c *Config) {
			c.Workers[2].KVEvents = "127.0.0.1:5557"
			c.Workers[2].LoadPublish = "udp://127.0.0.1:1"
			c.Workers[1].KVEvents = "tcp://127.0.0.1"
			c.Workers[0].KVEvents = "tcp://127.0.0.1:0"
			c.Workers[3].KVEvents = "ipc://"
		}, want: []string{
			`workers[0].kv_events: endpoint "tcp://127.0.0.1:0" has an invalid port`,
			`workers[1].kv_events: endpoint "tcp://127.0.0.1" must be tcp://HOST:PORT`,
			`workers[2].kv_events: endpoint "127.0.0.1:5557" must be tcp://HOST:PORT or ipc://PATH`,
			`workers[2].load_publish: endpoint "udp://127.0.0.1:1" must use tcp or ipc`,
			`workers[3].kv_events: endpoint "ipc://" has no path`,
		}},
		{name: "worker KV facts", mutate: func(c *Config) {
			c.Workers[0].KVReplay = "tcp://127.0.0.1"
			c.Workers[1].KVBlockSize = -1
			c.Workers[2].KVHashScheme = "vllm"
		}, want: []string{
			`workers[0].kv_replay: endpoint "tcp://127.0.0.1" must be tcp://HOST:PORT`,
			"workers[1].kv_block_size: must be at least 0, got -1",
			`workers[2].kv_hash_scheme: unknown scheme "vllm" (auto, sglang or rekey)`,
		}},
		{name: "worker KV facts ok", mutate: func(c *Config) {
			c.Workers[0].KVReplay, c.Workers[0].KVBlockSize, c.Workers[0].KVHashScheme = "tcp://127.0.0.1:5558", 16, KVHashRekey
			c.Workers[1].KVHashScheme = KVHashSGLang
			c.Workers[2].KVHashScheme = KVHashAuto
		}},
		{name: "model mixes plain and pd workers", mutate: func(c *Config) {
			c.Workers = append(c.Workers, Worker{ID: "Q2", URL: "http://127.0.0.1:1", Model: "qwen", Role: RoleDecode, DPSize: 1})
		}, want: []string{`workers[5].role: model "qwen" mixes plain workers (workers[2]) with prefill/decode workers (workers[5]); a model is served either plain or prefill/decode`}},

		// models and buckets
		{name: "model without buckets", mutate: func(c *Config) { c.Models["qwen"] = Model{} },
			want: []string{"models.qwen.buckets: at least one bucket is required"}},
		{name: "empty model name", mutate: func(c *Config) {
			c.Models[""] = Model{Buckets: []Bucket{{ID: "b", Groups: Groups{Plain: &Group{}}}}}
		}, want: []string{`models[""]: model name must not be empty`}},
		{name: "bucket ID empty", mutate: func(c *Config) { bucket(c, "qwen", 0).ID = "" },
			want: []string{"models.qwen.buckets[0].id: required"}},
		{name: "bucket ID duplicate", mutate: func(c *Config) { bucket(c, "llama", 1).ID = "short" },
			want: []string{`models.llama.buckets[1].id: duplicate bucket ID "short" (also buckets[0])`}},
		{name: "limits min negative", mutate: func(c *Config) { bucket(c, "qwen", 0).Limits.Min = -1 },
			want: []string{"models.qwen.buckets[0].limits.min: must be at least 0, got -1"}},
		{name: "limits max zero", mutate: func(c *Config) { bucket(c, "qwen", 0).Limits.Max = ptr[int64](0) },
			want: []string{"models.qwen.buckets[0].limits.max: must be positive, got 0"}},
		{name: "limits min above max", mutate: func(c *Config) { bucket(c, "llama", 0).Limits.Min = 5000 },
			want: []string{
				"models.llama.buckets[0].limits.max: must be at least limits.min (5000), got 4096",
			}},
		{name: "limits min equal max is fine", mutate: func(c *Config) { bucket(c, "llama", 0).Limits.Min = 4096 }},
		{name: "max_context_tokens zero", mutate: func(c *Config) { bucket(c, "llama", 0).MaxContextTokens = ptr[int64](0) },
			want: []string{"models.llama.buckets[0].max_context_tokens: must be positive, got 0"}},
		{name: "max_context_tokens below min", mutate: func(c *Config) {
			b := bucket(c, "llama", 1)
			b.Limits.Min = 10000
			b.MaxContextTokens = ptr[int64](8192)
		}, want: []string{"models.llama.buckets[1].max_context_tokens: must be at least limits.min (10000), got 8192: the bucket could never match"}},

		// groups
		{name: "groups neither plain nor pd", mutate: func(c *Config) { bucket(c, "qwen", 0).Groups = Groups{} },
			want: []string{"models.qwen.buckets[0].groups: exactly one of plain or pd is required"}},
		{name: "groups both plain and pd", mutate: func(c *Config) {
			bucket(c, "qwen", 0).Groups.PD = &PDGroups{Prefill: &Group{}, Decode: &Group{}}
		}, want: []string{"models.qwen.buckets[0].groups: plain and pd are mutually exclusive; set exactly one"}},
		{name: "pd without prefill", mutate: func(c *Config) { bucket(c, "llama", 0).Groups.PD.Prefill = nil },
			want: []string{"models.llama.buckets[0].groups.pd.prefill: required: a pd bucket needs both prefill and decode groups"}},
		{name: "pd without decode", mutate: func(c *Config) { bucket(c, "llama", 1).Groups.PD.Decode = nil },
			want: []string{"models.llama.buckets[1].groups.pd.decode: required: a pd bucket needs both prefill and decode groups"}},
		{name: "unknown worker", mutate: func(c *Config) { bucket(c, "llama", 0).Groups.PD.Prefill.WorkerIDs = &[]string{"P1", "P9"} },
			want: []string{`models.llama.buckets[0].groups.pd.prefill.worker_ids[1]: unknown worker "P9"`}},
		{name: "worker of another model", mutate: func(c *Config) { bucket(c, "qwen", 0).Groups.Plain.WorkerIDs = &[]string{"Q1", "P1"} },
			want: []string{
				`models.qwen.buckets[0].groups.plain.worker_ids[1]: worker "P1" serves model "llama", not "qwen"`,
				`models.qwen.buckets[0].groups.plain.worker_ids[1]: worker "P1" has role prefill; a plain group takes only plain workers`,
			}},
		{name: "decode worker in prefill group", mutate: func(c *Config) { bucket(c, "llama", 0).Groups.PD.Prefill.WorkerIDs = &[]string{"D1"} },
			want: []string{`models.llama.buckets[0].groups.pd.prefill.worker_ids[0]: worker "D1" has role decode; a prefill group takes only prefill workers`}},
		{name: "prefill worker in decode group", mutate: func(c *Config) { bucket(c, "llama", 1).Groups.PD.Decode.WorkerIDs = &[]string{"P2"} },
			want: []string{`models.llama.buckets[1].groups.pd.decode.worker_ids[0]: worker "P2" has role prefill; a decode group takes only decode workers`}},
		{name: "duplicate and empty worker IDs in a group", mutate: func(c *Config) {
			bucket(c, "llama", 1).Groups.PD.Decode.WorkerIDs = &[]string{"D2", "", "D2"}
		}, want: []string{
			"models.llama.buckets[1].groups.pd.decode.worker_ids[1]: empty worker ID",
			`models.llama.buckets[1].groups.pd.decode.worker_ids[2]: duplicate worker "D2" (also worker_ids[0])`,
		}},

		// policies
		{name: "dropped fused_score on decode", kind: ErrDropped, mutate: func(c *Config) {
			bucket(c, "llama", 0).Groups.PD.Decode.Policy.Type = "fused_score"
		}, want: []string{`models.llama.buckets[0].groups.pd.decode.policy.type: unknown policy "fused_score" (dropped; use power_of_two or cache_aware)`}},
		{name: "dropped score_policy as stage default", kind: ErrDropped, mutate: func(c *Config) {
			m := c.Models["qwen"]
			m.Policies.Plain = &Policy{Type: "score_policy"}
			c.Models["qwen"] = m
		}, want: []string{`models.qwen.policies.plain.type: unknown policy "score_policy" (dropped; use power_of_two or cache_aware)`}},
		{name: "dropped legacy_host_affinity", kind: ErrDropped, mutate: func(c *Config) {
			bucket(c, "llama", 1).Groups.PD.Decode.Policy = &Policy{Type: "legacy_host_affinity"}
		}, want: []string{`models.llama.buckets[1].groups.pd.decode.policy.type: unknown policy "legacy_host_affinity" (dropped; use power_of_two, or session_aware for session reuse)`}},
		{name: "dropped default policy", kind: ErrDropped, mutate: func(c *Config) { c.DefaultPolicy.Type = "fused_score" },
			want: []string{`default_policy.type: unknown policy "fused_score" (dropped; use power_of_two or cache_aware)`}},
		{name: "unknown policy", mutate: func(c *Config) { bucket(c, "qwen", 0).Groups.Plain.Policy = &Policy{Type: "least_busy"} },
			want: []string{`models.qwen.buckets[0].groups.plain.policy.type: unknown policy "least_busy" (known: round_robin, random, power_of_two, load_based, session_aware, sticky, cache_aware, consistent_hash, prefix_hash)`}},
		{name: "policy without type", mutate: func(c *Config) { bucket(c, "qwen", 0).Groups.Plain.Policy = &Policy{} },
			want: []string{"models.qwen.buckets[0].groups.plain.policy.type: required (one of round_robin, random, power_of_two, load_based, session_aware, sticky, cache_aware, consistent_hash, prefix_hash)"}},
		{name: "hashing settings", mutate: func(c *Config) {
			c.Hashing = Hashing{KeyHeaders: []string{"x-user", "bad header"}, LoadFactor: 0.9, VirtualNodes: 0, PrefixTokens: 0}
		}, want: []string{
			`hashing.key_headers[1]: must be a non-empty HTTP header name, got "bad header"`,
			"hashing.load_factor: must be a finite number of at least 1, got 0.9",
			"hashing.virtual_nodes: must be in 1..4096, got 0",
			"hashing.prefix_tokens: must be at least 1, got 0",
		}},
		{name: "pd bypass and rank dispatch", mutate: func(c *Config) {
			c.Workers[1].CanPrefill = true
			bucket(c, "llama", 0).Groups.PD.BypassBelowTokens = 256
			c.DPDispatch = DPDispatch{Enabled: true, MaxWaitingPerRank: 4}
		}},
		{name: "pd bypass and rank dispatch errors", mutate: func(c *Config) {
			c.Workers[0].CanPrefill = true
			bucket(c, "llama", 0).Groups.PD.BypassBelowTokens = -1
			c.DPDispatch.MaxWaitingPerRank = -1
		}, want: []string{
			"workers[0].can_prefill: only valid on a decode worker (this one is prefill)",
			"models.llama.buckets[0].groups.pd.bypass_below_tokens: must be at least 0, got -1",
			"dp_dispatch.max_waiting_per_rank: must be at least 0, got -1",
		}},
		{name: "hashing without key headers", mutate: func(c *Config) { c.Hashing.KeyHeaders = nil },
			want: []string{"hashing.key_headers: must name at least one header"}},
		{name: "every known policy on a plain group", mutate: func(c *Config) {
			b := bucket(c, "qwen", 0)
			for _, name := range policyNames() {
				b.Groups.Plain.Policy = &Policy{Type: name}
			}
		}},
		{name: "cache_aware on decode group", mutate: func(c *Config) {
			bucket(c, "llama", 0).Groups.PD.Decode.Policy.Type = PolicyCacheAware
		}, want: []string{"models.llama.buckets[0].groups.pd.decode.policy.type: cache_aware is only valid on plain or prefill groups"}},
		{name: "cache_aware as decode stage default", mutate: func(c *Config) {
			m := c.Models["llama"]
			m.Policies.Decode = &Policy{Type: PolicyCacheAware}
			c.Models["llama"] = m
		}, want: []string{"models.llama.policies.decode.type: cache_aware is only valid on plain or prefill groups"}},
		{name: "cache_aware as plain and prefill stage default", mutate: func(c *Config) {
			m := c.Models["llama"]
			m.Policies.Prefill = &Policy{Type: PolicyCacheAware}
			c.Models["llama"] = m
			q := c.Models["qwen"]
			q.Policies.Plain = &Policy{Type: PolicyCacheAware}
			c.Models["qwen"] = q
		}},
		{name: "cache_aware default policy inherited by decode group", mutate: func(c *Config) {
			c.DefaultPolicy.Type = PolicyCacheAware
		}, want: []string{"models.llama.buckets[1].groups.pd.decode.policy: inherits default_policy cache_aware, which is only valid on plain or prefill groups; set models.llama.policies.decode or this group's policy"}},
		{name: "cache_aware default policy with decode stage default", mutate: func(c *Config) {
			c.DefaultPolicy.Type = PolicyCacheAware
			m := c.Models["llama"]
			m.Policies.Decode = &Policy{Type: PolicyLoadBased}
			c.Models["llama"] = m
		}},
		{name: "sticky fallback unknown", mutate: func(c *Config) {
			c.Models["qwen"].Policies.Plain.Fallback = "cache_aware"
		}, want: []string{`models.qwen.policies.plain.fallback: unknown fallback "cache_aware" (one of round_robin, random, power_of_two, load_based)`}},
		{name: "fallback on a non-sticky policy", mutate: func(c *Config) {
			bucket(c, "llama", 0).Groups.PD.Decode.Policy.Fallback = PolicyRandom
		}, want: []string{"models.llama.buckets[0].groups.pd.decode.policy.fallback: only valid on sticky policies"}},
		{name: "every sticky fallback", mutate: func(c *Config) {
			m := c.Models["qwen"]
			for _, fb := range stickyFallbacks() {
				m.Buckets = append(m.Buckets, Bucket{ID: "s-" + fb, Groups: Groups{Plain: &Group{Policy: &Policy{Type: PolicySticky, Fallback: fb}}}})
			}
			c.Models["qwen"] = m
		}},
		{name: "admission caps below 1", mutate: func(c *Config) {
			bucket(c, "qwen", 0).Groups.Plain.Policy = &Policy{Type: PolicyRandom, Admission: Admission{
				MaxRunningRequests: ptr[int64](0), MaxWaitingRequests: ptr[int64](-1), MaxKVTokens: ptr[int64](0),
				MaxPendingPrefillTokens: ptr[int64](0), MaxInflightRequests: ptr[int64](0)}}
		}, want: []string{
			"models.qwen.buckets[0].groups.plain.policy.admission.max_running_requests: must be at least 1, got 0",
			"models.qwen.buckets[0].groups.plain.policy.admission.max_waiting_requests: must be at least 1, got -1",
			"models.qwen.buckets[0].groups.plain.policy.admission.max_kv_tokens: must be at least 1, got 0",
			"models.qwen.buckets[0].groups.plain.policy.admission.max_pending_prefill_tokens: must be at least 1, got 0",
			"models.qwen.buckets[0].groups.plain.policy.admission.max_inflight_requests: must be at least 1, got 0",
		}},
		{name: "default policy cap below 1", mutate: func(c *Config) {
			c.DefaultPolicy.Admission.MaxInflightRequests = ptr[int64](0)
		}, want: []string{"default_policy.admission.max_inflight_requests: must be at least 1, got 0"}},

		// sections
		{name: "actors", mutate: func(c *Config) {
			c.Actors = Actors{Mailbox: Mailbox{Bucket: 0, Group: 0, Telemetry: 0, IndexShard: 0, Affinity: -1}}
		}, want: []string{
			"actors.mailbox.bucket: must be at least 1, got 0",
			"actors.mailbox.group: must be at least 1, got 0",
			"actors.mailbox.telemetry: must be at least 1, got 0",
			"actors.mailbox.index_shard: must be at least 1, got 0",
			"actors.mailbox.affinity: must be at least 1, got -1",
			"actors.pick_timeout: must be a positive duration, got 0s",
		}},
		{name: "load", mutate: func(c *Config) {
			c.Load = LoadSettings{Source: "grpc"}
		}, want: []string{
			"load.freshness: must be a positive duration, got 0s",
			"load.poll_interval: must be a positive duration, got 0s",
			"load.guard_max_age: must be a positive duration, got 0s",
			"load.scrape_timeout: must be a positive duration, got 0s",
			"load.scrape_max_bytes: must be in 4096..1073741824 bytes, got 0",
			`load.source: unknown source "grpc" (http, prometheus, zmq or auto)`,
		}},
		{name: "upstream answer bound too large", mutate: func(c *Config) { c.Upstream.MaxResponseBytes = 1<<30 + 1 }, want: []string{
			"upstream.max_response_bytes: must be in 4096..1073741824 bytes, got 1073741825",
		}},
		{name: "load source prometheus", mutate: func(c *Config) { c.Load.Source = LoadSourcePrometheus }},
		{name: "worker flavors and metrics paths", mutate: func(c *Config) {
			c.Workers[0].Flavor = FlavorVLLM
			c.Workers[0].MetricsPath = "/vllm/metrics"
			c.Workers[1].Flavor = FlavorSGLang
			c.Workers[3].Flavor = ""
			c.Workers[4].Flavor = "tgi"
			c.Workers[4].MetricsPath = "metrics"
		}, want: []string{
			`workers[4].flavor: unknown flavor "tgi" (auto, sglang or vllm)`,
			`workers[4].metrics_path: must be an absolute path such as /metrics, got "metrics"`,
		}},
		{name: "vllm workers have no load gauge", mutate: func(c *Config) {
			c.Load.Source = LoadSourceZMQ
			c.Workers[2].Flavor = FlavorVLLM
		}, want: []string{
			"workers[2].load_publish: a vllm worker publishes no ZMQ load gauge; its load is read from metrics_path",
			"workers[2].flavor: vllm engines publish no ZMQ load gauge, but load.source is zmq (use auto or prometheus)",
		}},
		{name: "load poll interval not below freshness", mutate: func(c *Config) {
			c.Load.PollInterval = 5 * time.Second
		}, want: []string{"load.poll_interval: must be shorter than load.freshness (5s), or polled reports go stale between polls; got 5s"}},
		{name: "load sources", mutate: func(c *Config) { c.Load.Source = LoadSourceZMQ }},
		{name: "kv", mutate: func(c *Config) {
			c.KV = KV{BindEndpoint: "tcp://:5557", Shards: -1, HashCacheChunks: -1}
		}, want: []string{
			"kv.block_size: must be at least 1, got 0",
			"kv.shards: must be at least 0, got -1",
			"kv.max_blocks: must be at least 1, got 0",
			"kv.reconnect_backoff: must be a positive duration, got 0s",
			"kv.hash_cache_chunks: must be at least 0, got -1",
			"kv.max_message_bytes: must be at least 4096, got 0",
			`kv.bind_endpoint: endpoint "tcp://:5557" must be tcp://HOST:PORT`,
		}},
		{name: "kv max message bytes small", mutate: func(c *Config) { c.KV.MaxMessageBytes = 4095 },
			want: []string{"kv.max_message_bytes: must be at least 4096, got 4095"}},
		{name: "kv max message bytes ok", mutate: func(c *Config) { c.KV.MaxMessageBytes = 1 << 30 }},
		{name: "kv bind endpoint ok", mutate: func(c *Config) { c.KV.BindEndpoint = "tcp://127.0.0.1:5557" }},
		{name: "kv shards zero is one per core", mutate: func(c *Config) { c.KV.Shards = 0 }},
		{name: "kv block key router", mutate: func(c *Config) { c.KV.BlockKey = BlockKeyRouter }},
		{name: "kv block key unknown", mutate: func(c *Config) { c.KV.BlockKey = "sha256" },
			want: []string{`kv.block_key: unknown block key "sha256" (engine or router)`}},
		{name: "kv shards explicit", mutate: func(c *Config) { c.KV.Shards = 8 }},
		{name: "kv hash cache off", mutate: func(c *Config) { c.KV.HashCacheChunks = 0 }},
		{name: "kv lookup split on", mutate: func(c *Config) { c.KV.BlockKey, c.KV.LookupSplitBlocks = BlockKeyRouter, MinLookupSplitBlocks }},
		{name: "kv lookup split on, engine keys (ignored)", mutate: func(c *Config) { c.KV.LookupSplitBlocks = 4096 }},
		{name: "kv lookup split below the least", mutate: func(c *Config) { c.KV.LookupSplitBlocks = MinLookupSplitBlocks - 1 },
			want: []string{"kv.lookup_split_blocks: must be 0 (off) or at least 1024 blocks, got 1023"}},
		{name: "kv lookup split negative", mutate: func(c *Config) { c.KV.LookupSplitBlocks = -1 },
			want: []string{"kv.lookup_split_blocks: must be 0 (off) or at least 1024 blocks, got -1"}},
		{name: "affinity", mutate: func(c *Config) {
			c.Affinity = Affinity{SessionHeader: "", RoutingKeyHeader: "x routing"}
		}, want: []string{
			`affinity.session_header: must be a non-empty HTTP header name, got ""`,
			`affinity.routing_key_header: must be a non-empty HTTP header name, got "x routing"`,
			"affinity.idle_timeout: must be a positive duration, got 0s",
			"affinity.sweep_interval: must be a positive duration, got 0s",
			"affinity.max_bindings: must be at least 1, got 0",
		}},
		{name: "cache_aware numbers", mutate: func(c *Config) {
			c.CacheAware = CacheAware{Source: CacheSourceLocal, Decision: CacheDecisionLatency, MinMatchedTokens: -1, MinMatchRatio: 1.5,
				MinCandidates: 0, CandidateRatio: 0, MaxCandidates: -1, WorkerQueueLimit: -1,
				SaturationFloor: -0.1, SwitchMargin: -1, PressureGuard: -1, MinLoadChoices: 1, DispatchWindow: -time.Second,
				Approximate: Default().CacheAware.Approximate}
		}, want: []string{
			"cache_aware.query_timeout: must be a positive duration, got 0s",
			"cache_aware.max_inflight_queries: must be at least 1, got 0",
			"cache_aware.min_matched_tokens: must be at least 0, got -1",
			"cache_aware.min_match_ratio: must be in [0, 1], got 1.5",
			"cache_aware.min_candidates: must be at least 1, got 0",
			"cache_aware.max_candidates: must be at least cache_aware.min_candidates (0), got -1",
			"cache_aware.candidate_ratio: must be in (0, 1], got 0",
			"cache_aware.worker_queue_limit: must be at least 0, got -1",
			"cache_aware.saturation_floor: must be in [0, 1], got -0.1",
			"cache_aware.switch_margin: must be at least 0, got -1",
			"cache_aware.pressure_guard: must be at least 0, got -1",
			"cache_aware.min_load_choices: must be at least 2, got 1",
			"cache_aware.dispatch_window: must be at least 0 (0 disables), got -1s",
		}},
		{name: "cache_aware candidate bounds", mutate: func(c *Config) {
			c.CacheAware.MinCandidates = 8
			c.CacheAware.MaxCandidates = 4
			c.CacheAware.CandidateRatio = 1.01
		}, want: []string{
			"cache_aware.max_candidates: must be at least cache_aware.min_candidates (8), got 4",
			"cache_aware.candidate_ratio: must be in (0, 1], got 1.01",
		}},
		{name: "cache_aware ratio one and max equals min", mutate: func(c *Config) {
			c.CacheAware.CandidateRatio = 1
			c.CacheAware.MaxCandidates = c.CacheAware.MinCandidates
		}},
		{name: "cache_aware unknown source", mutate: func(c *Config) { c.CacheAware.Source = "redis" },
			want: []string{`cache_aware.source: unknown source "redis" (local, remote or approximate)`}},
		{name: "cache_aware approximate", mutate: func(c *Config) {
			c.CacheAware.Source = CacheSourceApproximate
		}},
		{name: "cache_aware approximate with remote URL and bad knobs", mutate: func(c *Config) {
			c.CacheAware.Source = CacheSourceApproximate
			c.CacheAware.RemoteURL = "http://127.0.0.1:9000"
			c.CacheAware.Approximate = ApproximateCache{CacheThreshold: 1.2, BalanceAbsThreshold: -1,
				BalanceRelThreshold: 0.5, MaxTreeSize: 10}
		}, want: []string{
			"cache_aware.remote_url: only used with cache_aware.source remote",
			"cache_aware.approximate.cache_threshold: must be in [0, 1], got 1.2",
			"cache_aware.approximate.balance_abs_threshold: must be at least 0, got -1",
			"cache_aware.approximate.balance_rel_threshold: must be at least 1, got 0.5",
			"cache_aware.approximate.eviction_interval: must be a positive duration, got 0s",
			"cache_aware.approximate.max_tree_size: must be at least 1024, got 10",
		}},
		{name: "cache_aware unknown decision", mutate: func(c *Config) { c.CacheAware.Decision = "fastest" },
			want: []string{`cache_aware.decision: unknown decision "fastest" (latency or threshold)`}},
		{name: "cache_aware remote without URL", mutate: func(c *Config) { c.CacheAware.Source = CacheSourceRemote },
			want: []string{"cache_aware.remote_url: required when cache_aware.source is remote"}},
		{name: "cache_aware remote bad URL", mutate: func(c *Config) {
			c.CacheAware.Source = CacheSourceRemote
			c.CacheAware.RemoteURL = "127.0.0.1:9000"
		}, want: []string{`cache_aware.remote_url: URL "127.0.0.1:9000" must start with http:// or https://`}},
		{name: "cache_aware local with remote URL", mutate: func(c *Config) { c.CacheAware.RemoteURL = "http://127.0.0.1:9000" },
			want: []string{"cache_aware.remote_url: only used with cache_aware.source remote"}},
		{name: "health", mutate: func(c *Config) { c.Health = Health{} }, want: []string{
			"health.interval: must be a positive duration, got 0s",
			"health.timeout: must be a positive duration, got 0s",
			"health.startup_timeout: must be a positive duration, got 0s",
			"health.startup_check_interval: must be a positive duration, got 0s",
			`health.endpoint: must be a path starting with /, got ""`,
			"health.failure_threshold: must be at least 1, got 0",
			"health.success_threshold: must be at least 1, got 0",
			"health.breaker_failures: must be at least 1, got 0",
			"health.breaker_error_rate: must be in (0, 1], got 0",
			"health.breaker_min_requests: must be at least 1, got 0",
			"health.breaker_window: must be a positive duration, got 0s",
			"health.breaker_cooldown: must be a positive duration, got 0s",
			"health.breaker_successes: must be at least 1, got 0",
		}},
		{name: "valid concurrency limits, queues, rate limits and retries", mutate: func(c *Config) {
			c.Server.MaxConcurrentRequests = 2
			c.Server.QueueSize = 0
			c.Server.RateLimit = RateLimit{RequestsPerSecond: 0.5, PerKey: KeyRateLimit{RequestsPerSecond: 100, Burst: 5, MaxKeys: 1}}
			m := c.Models["qwen"]
			m.MaxConcurrentRequests = 1
			m.QueueSize = ptr(0)
			m.QueueTimeout = time.Second
			c.Models["qwen"] = m
			c.Retry = Retry{MaxRetries: MaxRetries, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond,
				BackoffMultiplier: 1, Jitter: 1, RetryableStatuses: []int{408, 429, 500, 599},
				Budget: RetryBudget{Window: 100 * time.Millisecond}}
		}},
		{name: "concurrency limits, queues and rate limits", mutate: func(c *Config) {
			c.Server.MaxConcurrentRequests = -1
			c.Server.QueueSize = -1
			c.Server.QueueTimeout = 0
			c.Server.RateLimit = RateLimit{RequestsPerSecond: -1, Burst: -1, PerKey: KeyRateLimit{RequestsPerSecond: -0.5, Burst: -2, MaxKeys: 0}}
			m := c.Models["qwen"]
			m.MaxConcurrentRequests = -3
			m.QueueSize = ptr(-1)
			m.QueueTimeout = -time.Second
			c.Models["qwen"] = m
		}, want: []string{
			"server.max_concurrent_requests: must be at least 0, got -1",
			"server.queue_size: must be at least 0, got -1",
			"server.queue_timeout: must be a positive duration, got 0s",
			"server.rate_limit.requests_per_second: must be at least 0, got -1",
			"server.rate_limit.burst: must be at least 0, got -1",
			"server.rate_limit.per_key.requests_per_second: must be at least 0, got -0.5",
			"server.rate_limit.per_key.burst: must be at least 0, got -2",
			"server.rate_limit.per_key.max_keys: must be at least 1, got 0",
			"models.qwen.max_concurrent_requests: must be at least 0, got -3",
			"models.qwen.queue_size: must be at least 0, got -1",
			"models.qwen.queue_timeout: must not be negative (0 takes server.queue_timeout), got -1s",
		}},
		{name: "retry", mutate: func(c *Config) {
			c.Retry = Retry{Enabled: true, MaxRetries: 9, InitialBackoff: time.Second, MaxBackoff: time.Millisecond,
				BackoffMultiplier: 0.5, Jitter: 1.5, RetryableStatuses: []int{502, 404, 200, 600},
				Budget: RetryBudget{Ratio: 2, MinRetriesPerSecond: -1, Window: 10 * time.Millisecond}}
		}, want: []string{
			"retry.max_retries: must be in 0..8, got 9",
			"retry.max_backoff: must be at least retry.initial_backoff (1s), got 1ms",
			"retry.backoff_multiplier: must be at least 1, got 0.5",
			"retry.jitter: must be in 0..1, got 1.5",
			"retry.retryable_statuses[1]: must be 408, 429 or 500..599, got 404",
			"retry.retryable_statuses[2]: must be 408, 429 or 500..599, got 200",
			"retry.retryable_statuses[3]: must be 408, 429 or 500..599, got 600",
			"retry.budget.ratio: must be in 0..1, got 2",
			"retry.budget.min_retries_per_second: must be at least 0, got -1",
			"retry.budget.window: must be at least 100ms, got 10ms",
		}},
		{name: "retry durations", mutate: func(c *Config) {
			c.Retry.MaxRetries = -1
			c.Retry.InitialBackoff = 0
			c.Retry.MaxBackoff = -time.Second
		}, want: []string{
			"retry.max_retries: must be in 0..8, got -1",
			"retry.initial_backoff: must be a positive duration, got 0s",
			"retry.max_backoff: must be a positive duration, got -1s",
		}},
		{name: "breaker error rate above one", mutate: func(c *Config) { c.Health.BreakerErrorRate = 1.5 },
			want: []string{"health.breaker_error_rate: must be in (0, 1], got 1.5"}},
		{name: "breaker disabled keeps the rest checked", mutate: func(c *Config) { c.Health.BreakerEnabled = false }},
		{name: "health endpoint", mutate: func(c *Config) { c.Health.Endpoint = "health_generate" },
			want: []string{`health.endpoint: must be a path starting with /, got "health_generate"`}},
		{name: "deep health endpoint", mutate: func(c *Config) { c.Health.Endpoint = "/health_generate" }},
		{name: "upstream", mutate: func(c *Config) { c.Upstream = Upstream{ResponseHeaderTimeout: -time.Second} }, want: []string{
			"upstream.max_idle_conn_duration: must be a positive duration, got 0s",
			"upstream.connect_timeout: must be a positive duration, got 0s",
			"upstream.response_header_timeout: must not be negative (0 disables it), got -1s",
			"upstream.max_conns_per_worker: must be at least 1, got 0",
			"upstream.max_response_bytes: must be in 4096..1073741824 bytes, got 0",
		}},
		{name: "upstream header timeout off", mutate: func(c *Config) { c.Upstream.ResponseHeaderTimeout = 0 }},
		{name: "upstream tls and a worker's override", mutate: func(c *Config) {
			c.Upstream.TLS = UpstreamTLS{CAFiles: []string{"/etc/ca.pem", "/etc/ca2.pem"}, CertFile: "/etc/c.pem", KeyFile: "/etc/k.pem"}
			c.Workers[2].TLS = &UpstreamTLS{ServerName: "engine.internal", CAFiles: []string{"/etc/other.pem"}}
		}},
		{name: "upstream tls halves of a client certificate", mutate: func(c *Config) {
			c.Upstream.TLS = UpstreamTLS{CertFile: "/etc/c.pem", CAFiles: []string{"/etc/ca.pem", " "}}
			c.Workers[2].TLS = &UpstreamTLS{KeyFile: "/etc/k.pem", ServerName: " engine"}
		}, want: []string{
			"workers[2].tls.cert_file: required with workers[2].tls.key_file: the client certificate",
			`workers[2].tls.server_name: must not begin or end with white space, got " engine"`,
			"upstream.tls.ca_files[1]: must name a PEM file",
			"upstream.tls.key_file: required with upstream.tls.cert_file: the client certificate's private key",
		}},
		{name: "tls on an http worker", mutate: func(c *Config) {
			c.Workers[0].TLS = &UpstreamTLS{CAFiles: []string{"/etc/ca.pem"}}
			c.Workers[1].TLS = &UpstreamTLS{} // sets nothing: harmless
		}, want: []string{"workers[0].tls: the worker's url is http://, which never uses TLS: use https:// or remove tls"}},
		{name: "metrics listener", mutate: func(c *Config) { c.Server.MetricsPort = ptr(29000) }},
		{name: "metrics listener on a port the OS chooses", mutate: func(c *Config) {
			c.Server.Port = 0
			c.Server.MetricsPort = ptr(0)
		}},
		{name: "metrics listener on the data plane's port", mutate: func(c *Config) { c.Server.MetricsPort = ptr(8080) },
			want: []string{"server.metrics_port: must differ from server.port (8080): the metrics listener is apart from the data plane"}},
		{name: "metrics listener port out of range", mutate: func(c *Config) { c.Server.MetricsPort = ptr(65536) },
			want: []string{"server.metrics_port: must be in 0..65535, got 65536"}},
		{name: "log level", mutate: func(c *Config) { c.Log.Level = "trace" },
			want: []string{`log.level: unknown level "trace" (debug, info, warn or error)`}},
		{name: "empty default policy type means round_robin", mutate: func(c *Config) { c.DefaultPolicy = Policy{} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validBase()
			tt.mutate(c)
			err := c.Validate()
			if got := errLines(err); !equalLines(got, tt.want) {
				t.Fatalf("Validate() =\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
			kind := tt.kind
			if kind == nil {
				kind = ErrInvalid
			}
			for _, fe := range fieldErrors(err) {
				if !errors.Is(fe, kind) {
					t.Errorf("%v does not unwrap to %v", fe, kind)
				}
			}
			if len(fieldErrors(err)) != len(tt.want) {
				t.Errorf("got %d FieldErrors, want %d", len(fieldErrors(err)), len(tt.want))
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := validBase()
	c.Server.Port = -5
	c.Workers[0].ID = ""
	bucket(c, "llama", 0).Groups.PD.Decode.Policy.Type = "fused_score"
	c.CacheAware.MinLoadChoices = 1
	c.Health.Timeout = 0
	err := c.Validate()
	want := []string{
		"server.port: must be in 0..65535, got -5",
		"workers[0].id: required",
		// P1 lost its ID, so the group that names it no longer finds it.
		`models.llama.buckets[0].groups.pd.prefill.worker_ids[0]: unknown worker "P1"`,
		`models.llama.buckets[0].groups.pd.decode.policy.type: unknown policy "fused_score" (dropped; use power_of_two or cache_aware)`,
		"cache_aware.min_load_choices: must be at least 2, got 1",
		"health.timeout: must be a positive duration, got 0s",
	}
	if got := errLines(err); !equalLines(got, want) {
		t.Fatalf("Validate() =\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if !errors.Is(err, ErrDropped) || !errors.Is(err, ErrInvalid) {
		t.Errorf("joined error should match ErrDropped and ErrInvalid: %v", err)
	}
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Path != "server.port" {
		t.Errorf("errors.As first FieldError = %+v", fe)
	}
}
