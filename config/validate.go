package config

import (
	"fmt"
	"math"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// policyNames lists the known policy types in configuration order.
func policyNames() []string {
	return []string{PolicyRoundRobin, PolicyRandom, PolicyPowerOfTwo, PolicyLoadBased,
		PolicySessionAware, PolicySticky, PolicyCacheAware, PolicyConsistentHash, PolicyPrefixHash}
}

func knownPolicy(name string) bool { return slices.Contains(policyNames(), name) }

// stickyFallbacks lists the policies sticky may fall back to.
func stickyFallbacks() []string {
	return []string{PolicyRoundRobin, PolicyRandom, PolicyPowerOfTwo, PolicyLoadBased}
}

// Validate checks the whole configuration and reports every problem at once, each a
// *FieldError naming its path, joined with errors.Join. It returns nil when the
// configuration is usable.
func (c *Config) Validate() error {
	var p problems
	c.validateServer(&p)
	workers := c.validateWorkers(&p)
	for _, name := range sortedKeys(c.Models) {
		c.validateModel(&p, name, workers)
	}
	c.validatePolicy(&p, "default_policy", &c.DefaultPolicy, "", true)
	c.validateActors(&p)
	c.validateLoad(&p)
	c.validateKV(&p)
	c.validateAffinity(&p)
	c.validateCluster(&p)
	c.validateCacheAware(&p)
	c.validateHashing(&p)
	atLeast(&p, "dp_dispatch.max_waiting_per_rank", c.DPDispatch.MaxWaitingPerRank, 0)
	c.validateLoRA(&p)
	c.validateHealth(&p)
	c.validateRetry(&p)
	c.validateUpstream(&p)
	c.validateDiscovery(&p)
	c.validateAbort(&p)
	c.validateTracing(&p)
	if !slices.Contains([]string{LogLevelDebug, LogLevelInfo, LogLevelWarn, LogLevelError}, c.Log.Level) {
		p.add("log.level", ErrInvalid, fmt.Sprintf("unknown level %q (debug, info, warn or error)", c.Log.Level))
	}
	return p.err()
}

func positive(p *problems, path string, d time.Duration) {
	if d <= 0 {
		p.add(path, ErrInvalid, "must be a positive duration, got "+d.String())
	}
}

func atLeast(p *problems, path string, v, least int64) {
	if v < least {
		p.add(path, ErrInvalid, fmt.Sprintf("must be at least %d, got %d", least, v))
	}
}

func (c *Config) validateServer(p *problems) {
	s := c.Server
	if s.Port < 0 || s.Port > 65535 {
		p.add("server.port", ErrInvalid, fmt.Sprintf("must be in 0..65535, got %d", s.Port))
	}
	atLeast(p, "server.max_body_bytes", s.MaxBodyBytes, 1)
	positive(p, "server.request_timeout", s.RequestTimeout)
	positive(p, "server.stream_idle_timeout", s.StreamIdleTimeout)
	positive(p, "server.drain_timeout", s.DrainTimeout)
	positive(p, "server.write_timeout", s.WriteTimeout)
	atLeast(p, "server.max_connections", int64(s.MaxConnections), 0)
	atLeast(p, "server.max_connections_per_ip", int64(s.MaxConnectionsPerIP), 0)
	if s.MaxHeaderBytes < 1024 || s.MaxHeaderBytes > 1<<20 {
		p.add("server.max_header_bytes", ErrInvalid, fmt.Sprintf("must be in 1024..1048576, got %d", s.MaxHeaderBytes))
	}
	if s.MaxBodyBytesInFlight < s.MaxBodyBytes {
		p.add("server.max_body_bytes_in_flight", ErrInvalid, fmt.Sprintf(
			"must be at least server.max_body_bytes (%d), got %d: a body of the largest size must fit", s.MaxBodyBytes, s.MaxBodyBytesInFlight))
	}
	if mp := s.MetricsPort; mp != nil {
		switch {
		case *mp < 0 || *mp > 65535:
			p.add("server.metrics_port", ErrInvalid, fmt.Sprintf("must be in 0..65535, got %d", *mp))
		case *mp != 0 && *mp == s.Port:
			p.add("server.metrics_port", ErrInvalid, fmt.Sprintf("must differ from server.port (%d): the metrics listener is apart from the data plane", s.Port))
		}
	}
	c.validateFlow(p)
}

// validateWorkers checks the workers and returns the index of each worker ID (first
// occurrence).
func (c *Config) validateWorkers(p *problems) map[string]int {
	ids := make(map[string]int, len(c.Workers))
	type kinds struct{ plain, pd int }
	firsts := make(map[string]*kinds)
	var models []string
	for i, w := range c.Workers {
		path := joinIndex("workers", i)
		switch prev, dup := ids[w.ID]; {
		case w.ID == "":
			p.add(path+".id", ErrInvalid, "required")
		case dup:
			p.add(path+".id", ErrInvalid, fmt.Sprintf("duplicate worker ID %q (also workers[%d])", w.ID, prev))
		default:
			ids[w.ID] = i
		}
		if msg := checkHTTPURL(w.URL); msg != "" {
			p.add(path+".url", ErrInvalid, msg)
		}
		if w.Model == "" {
			p.add(path+".model", ErrInvalid, "required")
		}
		switch w.Role {
		case RolePlain, RolePrefill, RoleDecode:
		default:
			p.add(path+".role", ErrInvalid, fmt.Sprintf("unknown role %q (plain, prefill or decode)", w.Role))
		}
		if w.DPSize < 1 || w.DPSize > MaxDPSize {
			p.add(path+".dp_size", ErrInvalid, fmt.Sprintf("must be in 1..%d, got %d", MaxDPSize, w.DPSize))
		}
		if w.CanPrefill && w.Role != RoleDecode {
			p.add(path+".can_prefill", ErrInvalid, fmt.Sprintf("only valid on a decode worker (this one is %s)", w.Role))
		}
		if w.BootstrapPort != nil && (*w.BootstrapPort < 1 || *w.BootstrapPort > 65535) {
			p.add(path+".bootstrap_port", ErrInvalid, fmt.Sprintf("must be in 1..65535, got %d", *w.BootstrapPort))
		}
		if w.KVEvents != "" {
			if msg := checkZMQEndpoint(w.KVEvents); msg != "" {
				p.add(path+".kv_events", ErrInvalid, msg)
			}
		}
		if w.LoadPublish != "" {
			if msg := checkZMQEndpoint(w.LoadPublish); msg != "" {
				p.add(path+".load_publish", ErrInvalid, msg)
			}
		}
		switch w.Flavor {
		case "", FlavorAuto, FlavorSGLang:
		case FlavorVLLM:
			if w.LoadPublish != "" {
				p.add(path+".load_publish", ErrInvalid, "a vllm worker publishes no ZMQ load gauge; its load is read from metrics_path")
			}
			if c.Load.Source == LoadSourceZMQ {
				p.add(path+".flavor", ErrInvalid, "vllm engines publish no ZMQ load gauge, but load.source is zmq (use auto or prometheus)")
			}
		default:
			p.add(path+".flavor", ErrInvalid, fmt.Sprintf("unknown flavor %q (auto, sglang or vllm)", w.Flavor))
		}
		if w.TLS != nil {
			validateTLS(p, path+".tls", w.TLS)
			if u, err := url.Parse(w.URL); err == nil && u.Scheme == "http" && !w.TLS.IsZero() {
				p.add(path+".tls", ErrInvalid, "the worker's url is http://, which never uses TLS: use https:// or remove tls")
			}
		}
		if w.MetricsPath != "" && (w.MetricsPath[0] != '/' || strings.ContainsAny(w.MetricsPath, " ?#\t\r\n")) {
			p.add(path+".metrics_path", ErrInvalid, fmt.Sprintf("must be an absolute path such as /metrics, got %q", w.MetricsPath))
		}
		if w.KVReplay != "" {
			if msg := checkZMQEndpoint(w.KVReplay); msg != "" {
				p.add(path+".kv_replay", ErrInvalid, msg)
			}
		}
		atLeast(p, path+".kv_block_size", int64(w.KVBlockSize), 0) // 0: introspected
		switch w.KVHashScheme {
		case "", KVHashAuto, KVHashSGLang, KVHashRekey:
		default:
			p.add(path+".kv_hash_scheme", ErrInvalid, fmt.Sprintf("unknown scheme %q (auto, sglang or rekey)", w.KVHashScheme))
		}
		if len(w.Labels) > MaxLabels {
			p.add(path+".labels", ErrInvalid, fmt.Sprintf("%d labels, more than %d", len(w.Labels), MaxLabels))
		}
		for _, k := range sortedKeys(w.Labels) {
			if msg := CheckLabel(k, w.Labels[k]); msg != "" {
				p.add(joinKey(path+".labels", k), ErrInvalid, msg)
			}
		}
		k := firsts[w.Model]
		if k == nil {
			k = &kinds{plain: -1, pd: -1}
			firsts[w.Model] = k
			models = append(models, w.Model)
		}
		switch w.Role {
		case RolePlain:
			if k.plain < 0 {
				k.plain = i
			}
		case RolePrefill, RoleDecode:
			if k.pd < 0 {
				k.pd = i
			}
		}
	}
	for _, m := range models {
		if k := firsts[m]; k.plain >= 0 && k.pd >= 0 {
			later := max(k.plain, k.pd)
			p.add(joinIndex("workers", later)+".role", ErrInvalid, fmt.Sprintf(
				"model %q mixes plain workers (workers[%d]) with prefill/decode workers (workers[%d]); a model is served either plain or prefill/decode",
				m, k.plain, k.pd))
		}
	}
	return ids
}

func (c *Config) validateModel(p *problems, name string, workers map[string]int) {
	m := c.Models[name]
	path := joinKey("models", name)
	if name == "" {
		p.add(path, ErrInvalid, "model name must not be empty")
	}
	c.validatePolicy(p, path+".policies.plain", m.Policies.Plain, RolePlain, false)
	c.validatePolicy(p, path+".policies.prefill", m.Policies.Prefill, RolePrefill, false)
	c.validatePolicy(p, path+".policies.decode", m.Policies.Decode, RoleDecode, false)
	if len(m.Buckets) == 0 {
		p.add(path+".buckets", ErrInvalid, "at least one bucket is required")
	}
	validateTokenizer(p, path+".tokenizer", m.Tokenizer)
	validateModelFlow(p, path, m)
	validateSLO(p, path+".slo", m.SLO)
	switch m.BucketOrder {
	case "", BucketOrderCapacity, BucketOrderSLO:
	default:
		p.add(path+".bucket_order", ErrInvalid, fmt.Sprintf("unknown order %q (capacity or slo)", m.BucketOrder))
	}
	ids := make(map[string]int, len(m.Buckets))
	for i := range m.Buckets {
		b := &m.Buckets[i]
		bpath := joinIndex(path+".buckets", i)
		switch prev, dup := ids[b.ID]; {
		case b.ID == "":
			p.add(bpath+".id", ErrInvalid, "required")
		case dup:
			p.add(bpath+".id", ErrInvalid, fmt.Sprintf("duplicate bucket ID %q (also buckets[%d])", b.ID, prev))
		default:
			ids[b.ID] = i
		}
		validateLimits(p, bpath, b)
		c.validateGroups(p, bpath+".groups", name, b.Groups, workers)
	}
}

func validateTokenizer(p *problems, path string, t Tokenizer) {
	if t.Path != "" && strings.TrimSpace(t.Path) == "" {
		p.add(path+".path", ErrInvalid, "must not be blank")
	}
	if t.CacheBytes != nil {
		switch {
		case *t.CacheBytes < 0:
			p.add(path+".cache_bytes", ErrInvalid, fmt.Sprintf("must be at least 0 (0 disables the prefix cache), got %d", *t.CacheBytes))
		case t.Path == "":
			p.add(path+".cache_bytes", ErrInvalid, "requires "+path+".path")
		}
	}
	if t.ForwardInputIDs && t.Path == "" {
		p.add(path+".forward_input_ids", ErrInvalid, "requires "+path+".path: without a tokenizer there are no input_ids to forward")
	}
	switch t.OnError {
	case "":
	case TokenizerOnErrorEstimate, TokenizerOnErrorReject:
		if t.Path == "" {
			p.add(path+".on_error", ErrInvalid, "requires "+path+".path")
		}
	default:
		p.add(path+".on_error", ErrInvalid, fmt.Sprintf("unknown value %q (%s or %s)", t.OnError, TokenizerOnErrorEstimate, TokenizerOnErrorReject))
	}
}

func validateLimits(p *problems, bpath string, b *Bucket) {
	lmin := b.Limits.Min
	if lmin < 0 {
		p.add(bpath+".limits.min", ErrInvalid, fmt.Sprintf("must be at least 0, got %d", lmin))
	}
	if mx := b.Limits.Max; mx != nil {
		switch {
		case *mx < 1:
			p.add(bpath+".limits.max", ErrInvalid, fmt.Sprintf("must be positive, got %d", *mx))
		case *mx < lmin:
			p.add(bpath+".limits.max", ErrInvalid, fmt.Sprintf("must be at least limits.min (%d), got %d", lmin, *mx))
		}
	}
	if ctx := b.MaxContextTokens; ctx != nil {
		switch {
		case *ctx < 1:
			p.add(bpath+".max_context_tokens", ErrInvalid, fmt.Sprintf("must be positive, got %d", *ctx))
		case *ctx < lmin:
			p.add(bpath+".max_context_tokens", ErrInvalid, fmt.Sprintf(
				"must be at least limits.min (%d), got %d: the bucket could never match", lmin, *ctx))
		}
	}
}

func (c *Config) validateGroups(p *problems, path, model string, g Groups, workers map[string]int) {
	switch {
	case g.Plain == nil && g.PD == nil:
		p.add(path, ErrInvalid, "exactly one of plain or pd is required")
	case g.Plain != nil && g.PD != nil:
		p.add(path, ErrInvalid, "plain and pd are mutually exclusive; set exactly one")
	}
	if g.Plain != nil {
		c.validateGroup(p, path+".plain", model, RolePlain, g.Plain, workers)
	}
	if g.PD != nil {
		if g.PD.Prefill == nil {
			p.add(path+".pd.prefill", ErrInvalid, "required: a pd bucket needs both prefill and decode groups")
		} else {
			c.validateGroup(p, path+".pd.prefill", model, RolePrefill, g.PD.Prefill, workers)
		}
		if g.PD.Decode == nil {
			p.add(path+".pd.decode", ErrInvalid, "required: a pd bucket needs both prefill and decode groups")
		} else {
			c.validateGroup(p, path+".pd.decode", model, RoleDecode, g.PD.Decode, workers)
		}
		c.validateCompatibility(p, path+".pd", model, g.PD, workers)
		if g.PD.BypassBelowTokens < 0 {
			p.add(path+".pd.bypass_below_tokens", ErrInvalid, fmt.Sprintf("must be at least 0, got %d", g.PD.BypassBelowTokens))
		}
	}
}

func (c *Config) validateGroup(p *problems, path, model string, role Role, g *Group, workers map[string]int) {
	if g.WorkerIDs != nil {
		seen := make(map[string]int, len(*g.WorkerIDs))
		for i, id := range *g.WorkerIDs {
			ipath := joinIndex(path+".worker_ids", i)
			if id == "" {
				p.add(ipath, ErrInvalid, "empty worker ID")
				continue
			}
			if prev, dup := seen[id]; dup {
				p.add(ipath, ErrInvalid, fmt.Sprintf("duplicate worker %q (also worker_ids[%d])", id, prev))
				continue
			}
			seen[id] = i
			wi, ok := workers[id]
			if !ok {
				p.add(ipath, ErrInvalid, fmt.Sprintf("unknown worker %q", id))
				continue
			}
			w := c.Workers[wi]
			if w.Model != model {
				p.add(ipath, ErrInvalid, fmt.Sprintf("worker %q serves model %q, not %q", id, w.Model, model))
			}
			if w.Role != role {
				p.add(ipath, ErrInvalid, fmt.Sprintf("worker %q has role %s; a %s group takes only %s workers", id, w.Role, role, role))
			}
		}
	}
	if g.Policy != nil {
		c.validatePolicy(p, path+".policy", g.Policy, role, false)
		return
	}
	// The group inherits: its model's stage default (checked on its own) or the default
	// policy, which must suit this group's stage.
	if m := c.Models[model]; m.Policies.forRole(role) == nil && role == RoleDecode && c.DefaultPolicy.Type == PolicyCacheAware {
		p.add(path+".policy", ErrInvalid, "inherits default_policy cache_aware, which is only valid on plain or prefill groups; "+
			"set models."+model+".policies.decode or this group's policy")
	}
}

// validatePolicy checks one policy attachment for a stage ("" for the default policy,
// which may apply to any stage). The default policy may leave its type empty
// (round_robin).
func (c *Config) validatePolicy(p *problems, path string, pol *Policy, role Role, isDefault bool) {
	if pol == nil {
		return
	}
	switch t := pol.Type; {
	case t == "" && isDefault:
	case t == "":
		p.add(path+".type", ErrInvalid, "required (one of "+strings.Join(policyNames(), ", ")+")")
	case droppedPolicyReplacement(t) != "":
		p.add(path+".type", ErrDropped, fmt.Sprintf("unknown policy %q (dropped; %s)", t, droppedPolicyReplacement(t)))
	case !knownPolicy(t):
		p.add(path+".type", ErrInvalid, fmt.Sprintf("unknown policy %q (known: %s)", t, strings.Join(policyNames(), ", ")))
	case t == PolicyCacheAware && role == RoleDecode:
		p.add(path+".type", ErrInvalid, "cache_aware is only valid on plain or prefill groups")
	}
	if pol.Fallback != "" {
		if pol.Type != PolicySticky {
			p.add(path+".fallback", ErrInvalid, "only valid on sticky policies")
		} else if !slices.Contains(stickyFallbacks(), pol.Fallback) {
			p.add(path+".fallback", ErrInvalid, fmt.Sprintf("unknown fallback %q (one of %s)",
				pol.Fallback, strings.Join(stickyFallbacks(), ", ")))
		}
	}
	a := pol.Admission
	for _, cp := range []struct {
		key string
		v   *int64
	}{
		{"max_running_requests", a.MaxRunningRequests},
		{"max_waiting_requests", a.MaxWaitingRequests},
		{"max_kv_tokens", a.MaxKVTokens},
		{"max_pending_prefill_tokens", a.MaxPendingPrefillTokens},
		{"max_inflight_requests", a.MaxInflightRequests},
	} {
		if cp.v != nil {
			atLeast(p, path+".admission."+cp.key, *cp.v, 1)
		}
	}
}

func (c *Config) validateActors(p *problems) {
	m := c.Actors.Mailbox
	atLeast(p, "actors.mailbox.bucket", int64(m.Bucket), 1)
	atLeast(p, "actors.mailbox.group", int64(m.Group), 1)
	atLeast(p, "actors.mailbox.telemetry", int64(m.Telemetry), 1)
	atLeast(p, "actors.mailbox.index_shard", int64(m.IndexShard), 1)
	atLeast(p, "actors.mailbox.affinity", int64(m.Affinity), 1)
	positive(p, "actors.pick_timeout", c.Actors.PickTimeout)
}

func (c *Config) validateLoad(p *problems) {
	l := c.Load
	positive(p, "load.freshness", l.Freshness)
	positive(p, "load.poll_interval", l.PollInterval)
	positive(p, "load.guard_max_age", l.GuardMaxAge)
	if l.Freshness > 0 && l.PollInterval >= l.Freshness {
		p.add("load.poll_interval", ErrInvalid, fmt.Sprintf(
			"must be shorter than load.freshness (%s), or polled reports go stale between polls; got %s", l.Freshness, l.PollInterval))
	}
	positive(p, "load.scrape_timeout", l.ScrapeTimeout)
	if l.ScrapeMaxBytes < 4096 || l.ScrapeMaxBytes > 1<<30 {
		p.add("load.scrape_max_bytes", ErrInvalid, fmt.Sprintf("must be in 4096..1073741824 bytes, got %d", l.ScrapeMaxBytes))
	}
	switch l.Source {
	case LoadSourceHTTP, LoadSourceZMQ, LoadSourceAuto, LoadSourcePrometheus:
	default:
		p.add("load.source", ErrInvalid, fmt.Sprintf("unknown source %q (http, prometheus, zmq or auto)", l.Source))
	}
}

func (c *Config) validateKV(p *problems) {
	k := c.KV
	atLeast(p, "kv.block_size", int64(k.BlockSize), 1)
	atLeast(p, "kv.shards", int64(k.Shards), 0) // 0: one per core
	atLeast(p, "kv.max_blocks", int64(k.MaxBlocks), 1)
	positive(p, "kv.reconnect_backoff", k.ReconnectBackoff)
	atLeast(p, "kv.hash_cache_chunks", int64(k.HashCacheChunks), 0) // 0: off
	atLeast(p, "kv.max_message_bytes", k.MaxMessageBytes, 4096)
	if k.LookupSplitBlocks != 0 && k.LookupSplitBlocks < MinLookupSplitBlocks {
		p.add("kv.lookup_split_blocks", ErrInvalid, fmt.Sprintf("must be 0 (off) or at least %d blocks, got %d", MinLookupSplitBlocks, k.LookupSplitBlocks))
	}
	switch k.BlockKey {
	case "", BlockKeyEngine, BlockKeyRouter: // "": engine
	default:
		p.add("kv.block_key", ErrInvalid, fmt.Sprintf("unknown block key %q (%s or %s)", k.BlockKey, BlockKeyEngine, BlockKeyRouter))
	}
	if k.BindEndpoint != "" {
		if msg := checkZMQEndpoint(k.BindEndpoint); msg != "" {
			p.add("kv.bind_endpoint", ErrInvalid, msg)
		}
	}
}

func (c *Config) validateAffinity(p *problems) {
	a := c.Affinity
	for _, h := range []struct{ path, v string }{
		{"affinity.session_header", a.SessionHeader},
		{"affinity.routing_key_header", a.RoutingKeyHeader},
	} {
		if !validHeaderName(h.v) {
			p.add(h.path, ErrInvalid, fmt.Sprintf("must be a non-empty HTTP header name, got %q", h.v))
		}
	}
	positive(p, "affinity.idle_timeout", a.IdleTimeout)
	positive(p, "affinity.sweep_interval", a.SweepInterval)
	atLeast(p, "affinity.max_bindings", int64(a.MaxBindings), 1)
}

func (c *Config) validateLoRA(p *problems) {
	l := c.LoRA
	atLeast(p, "lora.slots_per_engine", int64(l.SlotsPerEngine), 0)
	atLeast(p, "lora.replicate_above", l.ReplicateAbove, 0)
	atLeast(p, "lora.max_slot_waiters", int64(l.MaxSlotWaiters), 0)
	positive(p, "lora.refresh_interval", l.RefreshInterval)
	positive(p, "lora.load_timeout", l.LoadTimeout)
	owner := map[string]string{}
	for _, model := range sortedKeys(c.Models) {
		adapters := c.Models[model].LoRAAdapters
		for _, name := range sortedKeys(adapters) {
			path := ModelPath(model) + ".lora_adapters." + name
			switch {
			case !l.Enabled:
				p.add(path, ErrInvalid, "needs lora.enabled")
			case name == "" || adapters[name] == "":
				p.add(path, ErrInvalid, "an adapter needs a name and a path")
			case hasModel(c.Models, name):
				p.add(path, ErrInvalid, fmt.Sprintf("%q is also a configured model", name))
			case owner[name] != "":
				p.add(path, ErrInvalid, fmt.Sprintf("adapter %q is also an adapter of model %s", name, owner[name]))
			}
			owner[name] = model
		}
	}
}

func (c *Config) validateHashing(p *problems) {
	h := c.Hashing
	if len(h.KeyHeaders) == 0 {
		p.add("hashing.key_headers", ErrInvalid, "must name at least one header")
	}
	for i, name := range h.KeyHeaders {
		if !validHeaderName(name) {
			p.add(fmt.Sprintf("hashing.key_headers[%d]", i), ErrInvalid, fmt.Sprintf("must be a non-empty HTTP header name, got %q", name))
		}
	}
	if !(h.LoadFactor >= 1) || math.IsInf(h.LoadFactor, 1) {
		p.add("hashing.load_factor", ErrInvalid, fmt.Sprintf("must be a finite number of at least 1, got %v", h.LoadFactor))
	}
	if h.VirtualNodes < 1 || h.VirtualNodes > 4096 {
		p.add("hashing.virtual_nodes", ErrInvalid, fmt.Sprintf("must be in 1..4096, got %d", h.VirtualNodes))
	}
	atLeast(p, "hashing.prefix_tokens", int64(h.PrefixTokens), 1)
}

func (c *Config) validateCacheAware(p *problems) {
	ca := c.CacheAware
	switch ca.Source {
	case CacheSourceLocal:
		if ca.RemoteURL != "" {
			p.add("cache_aware.remote_url", ErrInvalid, "only used with cache_aware.source remote")
		}
	case CacheSourceApproximate:
		if ca.RemoteURL != "" {
			p.add("cache_aware.remote_url", ErrInvalid, "only used with cache_aware.source remote")
		}
	case CacheSourceRemote:
		if ca.RemoteURL == "" {
			p.add("cache_aware.remote_url", ErrInvalid, "required when cache_aware.source is remote")
		} else if msg := checkHTTPURL(ca.RemoteURL); msg != "" {
			p.add("cache_aware.remote_url", ErrInvalid, msg)
		}
	default:
		p.add("cache_aware.source", ErrInvalid, fmt.Sprintf("unknown source %q (local, remote or approximate)", ca.Source))
	}
	switch ca.Decision {
	case CacheDecisionLatency, CacheDecisionThreshold:
	default:
		p.add("cache_aware.decision", ErrInvalid, fmt.Sprintf("unknown decision %q (latency or threshold)", ca.Decision))
	}
	positive(p, "cache_aware.query_timeout", ca.QueryTimeout)
	atLeast(p, "cache_aware.max_inflight_queries", int64(ca.MaxInflightQueries), 1)
	atLeast(p, "cache_aware.min_matched_tokens", int64(ca.MinMatchedTokens), 0)
	if !(ca.MinMatchRatio >= 0 && ca.MinMatchRatio <= 1) {
		p.add("cache_aware.min_match_ratio", ErrInvalid, fmt.Sprintf("must be in [0, 1], got %v", ca.MinMatchRatio))
	}
	atLeast(p, "cache_aware.min_candidates", int64(ca.MinCandidates), 1)
	if ca.MaxCandidates < ca.MinCandidates {
		p.add("cache_aware.max_candidates", ErrInvalid, fmt.Sprintf(
			"must be at least cache_aware.min_candidates (%d), got %d", ca.MinCandidates, ca.MaxCandidates))
	}
	if !(ca.CandidateRatio > 0 && ca.CandidateRatio <= 1) {
		p.add("cache_aware.candidate_ratio", ErrInvalid, fmt.Sprintf("must be in (0, 1], got %v", ca.CandidateRatio))
	}
	atLeast(p, "cache_aware.worker_queue_limit", int64(ca.WorkerQueueLimit), 0)
	if !(ca.SaturationFloor >= 0 && ca.SaturationFloor <= 1) {
		p.add("cache_aware.saturation_floor", ErrInvalid, fmt.Sprintf("must be in [0, 1], got %v", ca.SaturationFloor))
	}
	atLeast(p, "cache_aware.switch_margin", int64(ca.SwitchMargin), 0)
	atLeast(p, "cache_aware.pressure_guard", int64(ca.PressureGuard), 0)
	atLeast(p, "cache_aware.min_load_choices", int64(ca.MinLoadChoices), 2)
	if ca.DispatchWindow < 0 {
		p.add("cache_aware.dispatch_window", ErrInvalid, fmt.Sprintf("must be at least 0 (0 disables), got %v", ca.DispatchWindow))
	}
	ap := ca.Approximate
	if !(ap.CacheThreshold >= 0 && ap.CacheThreshold <= 1) {
		p.add("cache_aware.approximate.cache_threshold", ErrInvalid, fmt.Sprintf("must be in [0, 1], got %v", ap.CacheThreshold))
	}
	atLeast(p, "cache_aware.approximate.balance_abs_threshold", int64(ap.BalanceAbsThreshold), 0)
	if !(ap.BalanceRelThreshold >= 1) {
		p.add("cache_aware.approximate.balance_rel_threshold", ErrInvalid, fmt.Sprintf("must be at least 1, got %v", ap.BalanceRelThreshold))
	}
	positive(p, "cache_aware.approximate.eviction_interval", ap.EvictionInterval)
	atLeast(p, "cache_aware.approximate.max_tree_size", int64(ap.MaxTreeSize), 1024)
}

func (c *Config) validateHealth(p *problems) {
	h := c.Health
	positive(p, "health.interval", h.Interval)
	positive(p, "health.timeout", h.Timeout)
	positive(p, "health.startup_timeout", h.StartupTimeout)
	positive(p, "health.startup_check_interval", h.StartupCheckInterval)
	if !strings.HasPrefix(h.Endpoint, "/") || strings.ContainsAny(h.Endpoint, " ?#") {
		p.add("health.endpoint", ErrInvalid, fmt.Sprintf("must be a path starting with /, got %q", h.Endpoint))
	}
	atLeast(p, "health.failure_threshold", int64(h.FailureThreshold), 1)
	atLeast(p, "health.success_threshold", int64(h.SuccessThreshold), 1)
	atLeast(p, "health.breaker_failures", int64(h.BreakerFailures), 1)
	if !(h.BreakerErrorRate > 0 && h.BreakerErrorRate <= 1) {
		p.add("health.breaker_error_rate", ErrInvalid, fmt.Sprintf("must be in (0, 1], got %v", h.BreakerErrorRate))
	}
	atLeast(p, "health.breaker_min_requests", int64(h.BreakerMinRequests), 1)
	positive(p, "health.breaker_window", h.BreakerWindow)
	positive(p, "health.breaker_cooldown", h.BreakerCooldown)
	atLeast(p, "health.breaker_successes", int64(h.BreakerSuccesses), 1)
}

func (c *Config) validateUpstream(p *problems) {
	u := c.Upstream
	positive(p, "upstream.max_idle_conn_duration", u.MaxIdleConnDuration)
	positive(p, "upstream.connect_timeout", u.ConnectTimeout)
	if u.ResponseHeaderTimeout < 0 {
		p.add("upstream.response_header_timeout", ErrInvalid, "must not be negative (0 disables it), got "+u.ResponseHeaderTimeout.String())
	}
	atLeast(p, "upstream.max_conns_per_worker", int64(u.MaxConnsPerWorker), 1)
	if u.MaxResponseBytes < 4096 || u.MaxResponseBytes > 1<<30 {
		p.add("upstream.max_response_bytes", ErrInvalid, fmt.Sprintf("must be in 4096..1073741824 bytes, got %d", u.MaxResponseBytes))
	}
	validateTLS(p, "upstream.tls", &u.TLS)
}

// MaxDPSize bounds a worker's data-parallel ranks, configured, added or introspected: the
// router keeps state per rank.
const MaxDPSize = 4096

// Bounds of a worker's labels: how many, and a value's length in bytes.
const (
	MaxLabels     = 64
	maxLabelValue = 256
)

// CheckLabel returns why name=value is not a worker label, or "": the one check of
// workers[].labels and of the labels of a worker the admin API adds.
func CheckLabel(name, value string) string {
	if msg := checkLabelName(name); msg != "" {
		return msg
	}
	if len(value) > maxLabelValue {
		return fmt.Sprintf("value is %d bytes long, more than %d", len(value), maxLabelValue)
	}
	return ""
}

// checkLabelName returns why s is not a label name, or "".
func checkLabelName(s string) string {
	if s == "" {
		return "label name must not be empty"
	}
	if len(s) > 63 {
		return fmt.Sprintf("label name %q is longer than 63 bytes", s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("_-./", c) >= 0) {
			return fmt.Sprintf("label name %q holds %q (use letters, digits, '_', '-', '.' or '/')", s, c)
		}
	}
	return ""
}

// maxTargetMs bounds an SLO target, in milliseconds (about 2.8 hours).
const maxTargetMs = 10_000_000

func validateSLO(p *problems, path string, s SLO) {
	for _, t := range []struct {
		key string
		v   *float64
	}{{"ttft_ms", s.TTFTMs}, {"tpot_ms", s.TPOTMs}} {
		if t.v != nil && !(*t.v > 0 && *t.v <= maxTargetMs) {
			p.add(path+"."+t.key, ErrInvalid, fmt.Sprintf("must be more than 0 and at most %d milliseconds, got %v", maxTargetMs, *t.v))
		}
	}
}

// validateCompatibility checks a PD bucket's compatibility labels and that its prefill and
// decode members can form at least one pair. Only what configuration says is judged: a
// label that introspection may fill (IntrospectedLabels, on a worker that is not vllm) and
// that a worker's configuration does not set can be anything, so it never rules a pair out
// here; groups whose members come from the admin API (no configured member) are not judged.
func (c *Config) validateCompatibility(p *problems, path, model string, pd *PDGroups, workers map[string]int) {
	seen := make(map[string]int, len(pd.Compatibility))
	bad := false
	for i, k := range pd.Compatibility {
		ipath := joinIndex(path+".compatibility", i)
		if msg := checkLabelName(k); msg != "" {
			p.add(ipath, ErrInvalid, msg)
			bad = true
			continue
		}
		if prev, dup := seen[k]; dup {
			p.add(ipath, ErrInvalid, fmt.Sprintf("duplicate label %q (also compatibility[%d])", k, prev))
			continue
		}
		seen[k] = i
	}
	if bad || len(pd.Compatibility) == 0 || pd.Prefill == nil || pd.Decode == nil {
		return
	}
	pre := c.groupWorkers(model, RolePrefill, pd.Prefill, workers)
	dec := c.groupWorkers(model, RoleDecode, pd.Decode, workers)
	if len(pre) == 0 || len(dec) == 0 {
		return
	}
	for _, pw := range pre {
		for _, dw := range dec {
			if mayPair(pw, dw, pd.Compatibility) {
				return
			}
		}
	}
	describe := func(ws []*Worker) string {
		parts := make([]string, 0, min(len(ws), 4))
		for i, w := range ws {
			if i == 3 {
				parts = append(parts, fmt.Sprintf("and %d more", len(ws)-3))
				break
			}
			var ls []string
			for _, k := range pd.Compatibility {
				if v, ok := w.Labels[k]; ok {
					ls = append(ls, k+"="+v)
				} else if !mayIntrospect(w, k) {
					ls = append(ls, k+" unset")
				}
			}
			parts = append(parts, w.ID+" ("+strings.Join(ls, ", ")+")")
		}
		return strings.Join(parts, ", ")
	}
	p.add(path+".compatibility", ErrInvalid, fmt.Sprintf(
		"no prefill member can ever pair with a decode member: prefill %s; decode %s", describe(pre), describe(dec)))
}

// groupWorkers returns the configured workers a group holds: its worker_ids, or every
// configured worker of the model and role. Unknown IDs are skipped (reported elsewhere).
func (c *Config) groupWorkers(model string, role Role, g *Group, workers map[string]int) []*Worker {
	var out []*Worker
	if g.WorkerIDs != nil {
		for _, id := range *g.WorkerIDs {
			if i, ok := workers[id]; ok {
				out = append(out, &c.Workers[i])
			}
		}
		return out
	}
	for i := range c.Workers {
		if w := &c.Workers[i]; w.Model == model && w.Role == role {
			out = append(out, w)
		}
	}
	return out
}

// mayPair reports whether a prefill and a decode worker may share every label of keys, as
// far as configuration tells: a label both configure must be equal; a label a worker can
// not get from introspection (any but IntrospectedLabels, or any on a vllm worker, which has
// no /server_info) counts as empty when unset.
func mayPair(pw, dw *Worker, keys []string) bool {
	for _, k := range keys {
		pv, pok := pw.Labels[k]
		dv, dok := dw.Labels[k]
		if !pok && mayIntrospect(pw, k) || !dok && mayIntrospect(dw, k) {
			continue // the unset side may learn the label from its engine
		}
		if pv != dv {
			return false
		}
	}
	return true
}

// mayIntrospect reports whether w's engine may report label k in /server_info.
func mayIntrospect(w *Worker, k string) bool {
	return w.Flavor != FlavorVLLM && slices.Contains(IntrospectedLabels(), k)
}

// checkHTTPURL returns why s is not an http(s) URL with a host, or "".
func checkHTTPURL(s string) string {
	u, err := url.Parse(s)
	switch {
	case s == "":
		return "required"
	case !strings.Contains(s, "://"):
		return fmt.Sprintf("URL %q must start with http:// or https://", s)
	case err != nil:
		return fmt.Sprintf("invalid URL %q", s)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Sprintf("URL %q must use http or https", s)
	case u.Host == "" || u.Hostname() == "":
		return fmt.Sprintf("URL %q has no host", s)
	}
	if port := u.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Sprintf("URL %q has an invalid port", s)
		}
	}
	return ""
}

// checkZMQEndpoint returns why s is not a tcp://host:port or ipc://path endpoint, or "".
func checkZMQEndpoint(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	switch {
	case !ok:
		return fmt.Sprintf("endpoint %q must be tcp://HOST:PORT or ipc://PATH", s)
	case scheme == "ipc":
		if rest == "" {
			return fmt.Sprintf("endpoint %q has no path", s)
		}
		return ""
	case scheme != "tcp":
		return fmt.Sprintf("endpoint %q must use tcp or ipc", s)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil || host == "" {
		return fmt.Sprintf("endpoint %q must be tcp://HOST:PORT", s)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Sprintf("endpoint %q has an invalid port", s)
	}
	return ""
}

// validHeaderName reports whether s is a non-empty RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
		if !ok {
			return false
		}
	}
	return true
}

// validateTLS checks one upstream TLS setting: its files are named (switchyard check and the
// router's start read them), and the client certificate comes with its key.
func validateTLS(p *problems, path string, t *UpstreamTLS) {
	for i, f := range t.CAFiles {
		if strings.TrimSpace(f) == "" {
			p.add(joinIndex(path+".ca_files", i), ErrInvalid, "must name a PEM file")
		}
	}
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		p.add(path+".key_file", ErrInvalid, "required with "+path+".cert_file: the client certificate's private key")
	case t.KeyFile != "" && t.CertFile == "":
		p.add(path+".cert_file", ErrInvalid, "required with "+path+".key_file: the client certificate")
	}
	for _, f := range []struct{ key, v string }{{"cert_file", t.CertFile}, {"key_file", t.KeyFile}, {"server_name", t.ServerName}} {
		if f.v != "" && strings.TrimSpace(f.v) != f.v {
			p.add(path+"."+f.key, ErrInvalid, fmt.Sprintf("must not begin or end with white space, got %q", f.v))
		}
	}
}

// hasModel reports whether name is a configured model.
func hasModel(models map[string]Model, name string) bool {
	_, ok := models[name]
	return ok
}
