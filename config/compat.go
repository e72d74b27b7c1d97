package config

import (
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// CompatSGLRouter is the value of --compat that reads sgl-router's command line.
const CompatSGLRouter = "sgl-router"

// The sgl-router compatibility layer: `switchyard serve --compat sgl-router` reads the
// command line of SGLang's router (sgl-router, the SGLang model gateway) with that
// router's grammar and meanings, and maps it onto Switchyard's keys. Its flags that would
// muddle Switchyard's own (--api-key is the key sent to the workers there) are why it is a
// mode of its own. Besides sgl-router's flags, the mode takes --config, --set, --model and
// --admin-api-key with their Switchyard meanings.

// sglKind is how an sgl-router flag takes its value.
type sglKind uint8

const (
	sglValue  sglKind = iota // one value: --flag V or --flag=V
	sglSwitch                // no value (argparse store_true)
	sglList                  // any number of values up to the next --flag (argparse nargs)
	sglRefused
)

// sglFlag is one flag of sgl-router's command line.
type sglFlag struct {
	name string
	kind sglKind
	// key is the configuration key it sets ("" for the flags the layer acts on itself).
	key string
	// conv turns the flag's text into the key's text (seconds into a duration, ...); nil
	// keeps it.
	conv func(string) (string, error)
	// note says how it maps, for --compat sgl-router --help and the refusal messages.
	note string
}

func secs(s string) (string, error) {
	n, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || n < 0 {
		return "", fmt.Errorf("expected a number of seconds, got %q", s)
	}
	return strconv.FormatFloat(n, 'f', -1, 64) + "s", nil
}

func millis(s string) (string, error) {
	n, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || n < 0 {
		return "", fmt.Errorf("expected a number of milliseconds, got %q", s)
	}
	return strconv.FormatFloat(n, 'f', -1, 64) + "ms", nil
}

// sglFlags is sgl-router's command line: each flag Switchyard maps, with its key, and each
// it knows and refuses, with why.
func sglFlags() []sglFlag {
	refuse := func(name, why string) sglFlag { return sglFlag{name: name, kind: sglRefused, note: why} }
	return []sglFlag{
		{name: "host", key: "server.host"},
		{name: "port", key: "server.port"},
		{name: "worker-urls", kind: sglList, note: "plain workers (space- or comma-separated); their model is the engines' own (/get_model_info, /v1/models or /server_info) unless --model names it"},
		{name: "policy", note: "the policy of the plain group, or of both pd groups unless overridden; default cache_aware (cache_aware.source approximate: the router's own prefix tree); a pd decode group gets load_based in place of cache_aware; consistent_hashing is consistent_hash keyed by x-smg-routing-key, else authorization, x-forwarded-for, cookie (hashing.key_headers)"},
		{name: "pd-disaggregation", kind: sglSwitch, note: "one pd bucket of the --prefill and --decode workers"},
		{name: "prefill", kind: sglList, note: "--prefill URL [BOOTSTRAP_PORT|none], repeatable: a prefill worker and its bootstrap port"},
		{name: "decode", kind: sglList, note: "--decode URL, repeatable: a decode worker"},
		{name: "prefill-policy", note: "the prefill group's policy"},
		{name: "decode-policy", note: "the decode group's policy (not cache_aware)"},
		{name: "api-key", key: "upstream.api_key", note: "the key sent to the workers, not a key the router checks (that is --admin-api-key, or --set server.api_key=KEY)"},
		{name: "max-payload-size", key: "server.max_body_bytes"},
		{name: "request-timeout-secs", key: "server.request_timeout", conv: secs},
		{name: "max-concurrent-requests", key: "server.max_concurrent_requests", conv: func(s string) (string, error) {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil {
				return "", fmt.Errorf("expected an integer, got %q", s)
			}
			return strconv.Itoa(max(n, 0)), nil // -1 (or 0): no limit
		}, note: "-1 means no limit (0)"},
		{name: "queue-size", key: "server.queue_size"},
		{name: "queue-timeout-secs", key: "server.queue_timeout", conv: secs},
		{name: "rate-limit-tokens-per-second", key: "server.rate_limit.requests_per_second", note: "with --max-concurrent-requests as the burst"},
		{name: "retry-max-retries", key: "retry.max_retries", conv: func(s string) (string, error) {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil {
				return "", fmt.Errorf("expected an integer, got %q", s)
			}
			if n-1 > MaxRetries {
				return "", fmt.Errorf("%d attempts: Switchyard makes at most %d (retry.max_retries %d)", n, MaxRetries+1, MaxRetries)
			}
			return strconv.Itoa(max(n-1, 0)), nil
		}, note: "sgl-router counts every attempt, the first included: N attempts are N-1 retries"},
		{name: "retry-initial-backoff-ms", key: "retry.initial_backoff", conv: millis},
		{name: "retry-max-backoff-ms", key: "retry.max_backoff", conv: millis},
		{name: "retry-backoff-multiplier", key: "retry.backoff_multiplier"},
		{name: "retry-jitter-factor", key: "retry.jitter"},
		{name: "disable-retries", kind: sglSwitch, key: "retry.enabled", conv: func(string) (string, error) { return "false", nil }},
		{name: "cb-failure-threshold", key: "health.breaker_failures"},
		{name: "cb-success-threshold", key: "health.breaker_successes"},
		{name: "cb-timeout-duration-secs", key: "health.breaker_cooldown", conv: secs},
		{name: "cb-window-duration-secs", key: "health.breaker_window", conv: secs},
		{name: "disable-circuit-breaker", kind: sglSwitch, key: "health.breaker_enabled", conv: func(string) (string, error) { return "false", nil }},
		{name: "health-failure-threshold", key: "health.failure_threshold"},
		{name: "health-success-threshold", key: "health.success_threshold"},
		{name: "health-check-timeout-secs", key: "health.timeout", conv: secs},
		{name: "health-check-interval-secs", key: "health.interval", conv: secs},
		{name: "health-check-endpoint", key: "health.endpoint"},
		{name: "cache-threshold", key: "cache_aware.approximate.cache_threshold"},
		{name: "balance-abs-threshold", key: "cache_aware.approximate.balance_abs_threshold"},
		{name: "balance-rel-threshold", key: "cache_aware.approximate.balance_rel_threshold"},
		{name: "eviction-interval-secs", key: "cache_aware.approximate.eviction_interval", conv: secs},
		{name: "eviction-interval", key: "cache_aware.approximate.eviction_interval", conv: secs, note: "the Rust binary's spelling of --eviction-interval-secs"},
		{name: "max-tree-size", key: "cache_aware.approximate.max_tree_size"},
		{name: "prometheus-host", key: "server.metrics_host", note: "the address of the metrics listener --prometheus-port opens"},
		{name: "prometheus-port", key: "server.metrics_port", note: "/metrics on a listener of its own, the router's port then answers 404 there; without it /metrics is on the router's port"},
		{name: "log-level", key: "log.level", conv: func(s string) (string, error) {
			switch s {
			case "warning":
				return LogLevelWarn, nil
			case "critical":
				return LogLevelError, nil
			}
			return s, nil
		}, note: "warning is warn, critical is error"},
		{name: "client-cert-path", key: "upstream.tls.cert_file", note: "the client certificate shown to https workers, with --client-key-path"},
		{name: "client-key-path", key: "upstream.tls.key_file", note: "the key of --client-cert-path"},
		{name: "ca-cert-paths", kind: sglList, key: "upstream.tls.ca_files", note: "authorities trusted for https workers beside the system's roots; several files"},
		{name: "worker-startup-timeout-secs", key: "health.startup_timeout", conv: secs},
		{name: "worker-startup-check-interval", key: "health.startup_check_interval", conv: secs},
		{name: "shutdown-grace-period-secs", key: "server.drain_timeout", conv: secs},
		{name: "model-path", note: "the model's tokenizer (models.<name>.tokenizer.path) when it is a local directory or file"},
		{name: "tokenizer-path", note: "the model's tokenizer (models.<name>.tokenizer.path); a local directory or file"},
		{name: "dp-aware", kind: sglSwitch, key: "dp_dispatch.enabled", conv: func(string) (string, error) { return "true", nil },
			note: "the router picks the data-parallel rank of a dp_size > 1 engine by each rank's load and sends it as data_parallel_rank"},
		refuse("enable-igw", "no equivalent: serve several models with a configuration file (models.<name>)"),
		refuse("mini-lb", "no equivalent: Switchyard's prefill/decode dispatch is always on"),
		refuse("backend", "no equivalent: Switchyard routes to SGLang and vLLM HTTP engines (declare vLLM workers with flavor: vllm in a configuration file)"),
		refuse("runtime", "no equivalent: Switchyard routes to SGLang and vLLM HTTP engines"),
		refuse("service-discovery", "no equivalent: add and remove workers with the admin API (POST /workers, DELETE /workers/{url})"),
		refuse("selector", "no equivalent (Kubernetes service discovery)"),
		refuse("prefill-selector", "no equivalent (Kubernetes service discovery)"),
		refuse("decode-selector", "no equivalent (Kubernetes service discovery)"),
		refuse("service-discovery-port", "no equivalent (Kubernetes service discovery)"),
		refuse("service-discovery-namespace", "no equivalent (Kubernetes service discovery)"),
		refuse("bootstrap-port-annotation", "no equivalent (Kubernetes service discovery)"),
		refuse("log-dir", "no equivalent: Switchyard logs to standard error"),
		refuse("json-log", "no equivalent: Switchyard logs text to standard error"),
		refuse("request-id-headers", "no equivalent: X-Request-Id and X-Correlation-Id are forwarded to engines"),
		refuse("cors-allowed-origins", "no equivalent: Switchyard sets no CORS headers"),
		refuse("tls-cert-path", "no equivalent: terminate client TLS in front of Switchyard"),
		refuse("tls-key-path", "no equivalent: terminate client TLS in front of Switchyard"),
		{name: "enable-trace", kind: sglSwitch, key: "tracing.enabled", conv: func(string) (string, error) { return "true", nil },
			note: "OpenTelemetry spans of every request, exported over OTLP/gRPC (tracing.*)"},
		{name: "otlp-traces-endpoint", key: "tracing.endpoint", conv: func(s string) (string, error) {
			if s = strings.TrimSpace(s); s != "" && !strings.Contains(s, "://") {
				s = "http://" + s // sgl-router exports in plain text
			}
			return s, nil
		}, note: "the collector's HOST:PORT, reached in plain text as sgl-router does"},
		refuse("prometheus-duration-buckets", "no equivalent: Switchyard's histograms have fixed buckets"),
		{name: "prefix-token-count", key: "hashing.prefix_tokens", note: "policy prefix_hash: the prompt tokens hashed"},
		{name: "prefix-hash-load-factor", key: "hashing.load_factor", note: "policies prefix_hash and consistent_hash: the bounded load"},
		refuse("history-backend", "no equivalent: Switchyard keeps no response history (/v1/responses is proxied to an engine)"),
		refuse("chat-template", "no equivalent: a tokenizer directory's tokenizer_config.json holds the chat template"),
		refuse("reasoning-parser", "no equivalent: engines parse their output"),
		refuse("tool-call-parser", "no equivalent: engines parse their output"),
		refuse("mcp-config-path", "no equivalent"),
		refuse("enable-wasm", "no equivalent"),
		refuse("control-plane-api-keys", "no equivalent: the admin API takes one bearer key (--admin-api-key)"),
		refuse("disable-audit-logging", "no equivalent"),
		refuse("jwt-issuer", "no equivalent: the admin API takes one bearer key (--admin-api-key)"),
		refuse("jwt-audience", "no equivalent: the admin API takes one bearer key (--admin-api-key)"),
		refuse("jwt-jwks-uri", "no equivalent"),
		refuse("jwt-role-claim", "no equivalent"),
		refuse("jwt-role-mapping", "no equivalent"),
	}
}

// isListKey reports whether segs name a list of the schema (upstream.tls.ca_files): the
// schema refuses a list key as a leaf.
func isListKey(segs []string) bool {
	_, _, ferr := schemaLeaf(segs)
	return ferr != nil && ferr.Kind == ErrInvalid && strings.Contains(ferr.Msg, "list")
}

// sglConsistentHashing is sgl-router's name of its consistent-hash policy: Switchyard's
// consistent_hash, keyed by sgl-router's headers (sglHashHeaders).
const sglConsistentHashing = "consistent_hashing"

// sglHashHeaders are the headers sgl-router's consistent_hashing takes its key from, in its
// order: its routing-key header, then the implicit keys of a client (its credentials, its
// address behind a proxy, its cookies). A request with none of them goes to the engine with
// the fewest requests in flight (sgl-router picks at random).
func sglHashHeaders() []string {
	return []string{"x-smg-routing-key", "authorization", "x-forwarded-for", "cookie"}
}

// sglPrefill is one --prefill URL [BOOTSTRAP_PORT].
type sglPrefill struct {
	url  string
	port *int
}

// sglLaunch is what an sgl-router command line describes beyond plain keys: its workers and
// their policies. Load turns it into workers and one model with one bucket.
type sglLaunch struct {
	workerURLs    []string
	prefill       []sglPrefill
	decode        []string
	pd            bool
	policy        string
	prefillPolicy string
	decodePolicy  string
	tokenizerPath string
	maxConcurrent int
	ratePerSec    bool
	sourceSet     bool // the command line set cache_aware.source itself
	// sglHashing: a group runs sgl-router's consistent_hashing, whose key comes from its
	// own headers.
	sglHashing bool
	visited    map[string]bool
}

// splitFlag splits "--name=value" (or "-name"); ok is false for a non-flag argument.
func splitFlag(a string) (name, value string, hasValue, ok bool) {
	if !strings.HasPrefix(a, "-") || a == "-" || a == "--" || isNumber(a) {
		return "", "", false, false
	}
	name, value, hasValue = strings.Cut(strings.TrimLeft(a, "-"), "=")
	return name, value, hasValue, true
}

func isNumber(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}

// parseCompat reads args as sgl-router's command line (plus --compat, --config, --set,
// --model and --admin-api-key) into o, reporting every problem at once.
func parseCompat(args []string, o *cliOptions) error {
	var p problems
	specs := map[string]sglFlag{}
	for _, f := range sglFlags() {
		specs[f.name] = f
	}
	l := &sglLaunch{policy: PolicyCacheAware, visited: map[string]bool{}}
	o.sgl = l
	// values returns the values of a list flag: every argument up to the next flag.
	values := func(i *int) []string {
		var out []string
		for *i+1 < len(args) {
			if _, _, _, isFlag := splitFlag(args[*i+1]); isFlag {
				break
			}
			*i++
			out = append(out, args[*i])
		}
		return out
	}
	// one returns the value of a single-value flag (which may start with a dash, as -1).
	one := func(name string, i *int) (string, bool) {
		if *i+1 >= len(args) {
			p.add("--"+name, ErrInvalid, "needs a value")
			return "", false
		}
		*i++
		return args[*i], true
	}
	for i := 0; i < len(args); i++ {
		name, value, hasValue, isFlag := splitFlag(args[i])
		if !isFlag {
			msg := fmt.Sprintf("unexpected argument %q", args[i])
			p.add("", ErrInvalid, msg)
			continue
		}
		path := "--" + name
		// Switchyard's own flags in this mode.
		switch name {
		case "compat", "config", "set", "model", "admin-api-key":
			if !hasValue {
				var ok bool
				if value, ok = one(name, &i); !ok {
					continue
				}
			}
			switch name {
			case "compat":
				if value != CompatSGLRouter {
					p.add(path, ErrInvalid, fmt.Sprintf("unknown compatibility mode %q (only %s)", value, CompatSGLRouter))
				}
			case "config":
				o.configPath = value
			case "set":
				if err := (&setFlag{opts: o}).Set(value); err != nil {
					p.add(path, ErrInvalid, err.Error())
				} else if k, _, _ := strings.Cut(value, "="); strings.TrimSpace(k) == "cache_aware.source" {
					l.sourceSet = true
				}
			case "model":
				o.model = value
				o.visited["model"] = true
			case "admin-api-key":
				o.sets = append(o.sets, setting{segs: []string{"server", "admin_api_key"}, value: value})
			}
			continue
		case "h", "help":
			return fmt.Errorf("cannot parse flags: %w", ErrCompatHelp)
		}
		f, known := specs[name]
		if !known {
			p.add(path, ErrUnknownKey, "not an sgl-router flag Switchyard knows (switchyard serve --compat sgl-router --help lists them)")
			if !hasValue {
				values(&i)
			}
			continue
		}
		l.visited[name] = true
		var vals []string
		switch f.kind {
		case sglRefused:
			p.add(path, ErrDropped, f.note)
			if !hasValue {
				values(&i)
			}
			continue
		case sglSwitch:
			if hasValue {
				if b, err := strconv.ParseBool(value); err != nil || !b {
					p.add(path, ErrInvalid, "takes no value")
					continue
				}
			}
		case sglList:
			if hasValue {
				vals = []string{value}
			}
			vals = append(vals, values(&i)...)
		default:
			if !hasValue {
				var ok bool
				if value, ok = one(name, &i); !ok {
					continue
				}
			}
			vals = []string{value}
		}
		l.take(&p, o, f, vals)
	}
	l.check(&p, o)
	return p.err()
}

// take applies one occurrence of f with its values.
func (l *sglLaunch) take(p *problems, o *cliOptions, f sglFlag, vals []string) {
	path := "--" + f.name
	switch f.name {
	case "worker-urls":
		for _, v := range vals {
			for u := range strings.SplitSeq(v, ",") {
				if u = strings.TrimSpace(u); u != "" {
					l.workerURLs = append(l.workerURLs, u)
				}
			}
		}
		return
	case "pd-disaggregation":
		l.pd = true
		return
	case "prefill":
		switch {
		case len(vals) == 0:
			p.add(path, ErrInvalid, "needs a URL (--prefill URL [BOOTSTRAP_PORT])")
			return
		case len(vals) > 2:
			p.add(path, ErrInvalid, fmt.Sprintf("takes a URL and an optional bootstrap port, got %d values", len(vals)))
			return
		}
		pf := sglPrefill{url: vals[0]}
		if len(vals) == 2 && !strings.EqualFold(vals[1], "none") {
			n, err := strconv.Atoi(vals[1])
			if err != nil || n < 1 || n > 65535 {
				p.add(path, ErrInvalid, fmt.Sprintf("bootstrap port of %s must be 1..65535 or none, got %q", vals[0], vals[1]))
				return
			}
			pf.port = &n
		}
		l.prefill = append(l.prefill, pf)
		return
	case "decode":
		if len(vals) != 1 {
			p.add(path, ErrInvalid, fmt.Sprintf("takes one URL, got %d values", len(vals)))
			return
		}
		l.decode = append(l.decode, vals[0])
		return
	case "policy", "prefill-policy", "decode-policy":
		v := vals[0]
		if v == sglConsistentHashing {
			v, l.sglHashing = PolicyConsistentHash, true
		}
		switch {
		case v == "manual":
			p.add(path, ErrDropped, `"manual" has no equivalent; use sticky (its key comes from the x-sgl-routing-key header)`)
			return
		case !knownPolicy(v):
			p.add(path, ErrInvalid, fmt.Sprintf("unknown policy %q (known: %s)", v, strings.Join(policyNames(), ", ")))
			return
		case f.name == "decode-policy" && v == PolicyCacheAware:
			p.add(path, ErrInvalid, "cache_aware is only valid on plain or prefill groups; use load_based or power_of_two for decode")
			return
		}
		switch f.name {
		case "policy":
			l.policy = v
		case "prefill-policy":
			l.prefillPolicy = v
		default:
			l.decodePolicy = v
		}
		return
	case "model-path", "tokenizer-path":
		if f.name == "model-path" && l.visited["tokenizer-path"] && l.tokenizerPath != "" {
			return // the explicit tokenizer wins, as in sgl-router
		}
		if _, err := os.Stat(vals[0]); err != nil {
			p.add(path, ErrInvalid, fmt.Sprintf("%q is not a local directory or file: Switchyard loads tokenizers from local files (models.<name>.tokenizer.path)", vals[0]))
			return
		}
		l.tokenizerPath = vals[0]
		return
	case "max-concurrent-requests":
		if n, err := strconv.Atoi(strings.TrimSpace(vals[0])); err == nil {
			l.maxConcurrent = max(n, 0)
		}
	case "rate-limit-tokens-per-second":
		l.ratePerSec = true
	}
	if f.key == "" {
		return
	}
	segs := strings.Split(f.key, ".")
	if f.kind == sglList {
		// A list key (upstream.tls.ca_files): present in the schema as a list.
		if !isListKey(segs) {
			p.add(path, ErrDropped, "no list key "+f.key+" in this build")
			return
		}
		list := make([]any, 0, len(vals))
		for _, v := range vals {
			list = append(list, v)
		}
		o.sets = append(o.sets, setting{segs: segs, value: list})
		return
	}
	_, typ, ferr := schemaLeaf(segs)
	if ferr != nil {
		// Not reached: TestCompatFlagKeysExist holds every flag's key to the schema.
		p.add(path, ErrDropped, "no key "+f.key+" in this build")
		return
	}
	text := ""
	if len(vals) > 0 {
		text = vals[0]
	}
	if f.conv != nil {
		var err error
		if text, err = f.conv(text); err != nil {
			p.add(path, ErrInvalid, err.Error())
			return
		}
	}
	v, err := convertString(typ, text)
	if err != nil {
		p.add(path, ErrInvalid, err.Error())
		return
	}
	if f.key == "cache_aware.source" {
		l.sourceSet = true
	}
	o.sets = append(o.sets, setting{segs: segs, value: v})
}

// check validates the launch as a whole.
func (l *sglLaunch) check(p *problems, o *cliOptions) {
	if l.ratePerSec && l.maxConcurrent > 0 {
		o.sets = append(o.sets, setting{segs: []string{"server", "rate_limit", "burst"}, value: int64(l.maxConcurrent)})
	}
	if l.pd {
		if len(l.workerURLs) > 0 {
			p.add("--worker-urls", ErrInvalid, "not used with --pd-disaggregation (list --prefill and --decode workers)")
		}
		if len(l.prefill) == 0 {
			p.add("--pd-disaggregation", ErrInvalid, "needs --prefill URL [BOOTSTRAP_PORT]")
		}
		if len(l.decode) == 0 {
			p.add("--pd-disaggregation", ErrInvalid, "needs --decode URL")
		}
	} else {
		for _, n := range []string{"prefill", "decode", "prefill-policy", "decode-policy"} {
			if l.visited[n] {
				p.add("--"+n, ErrInvalid, "needs --pd-disaggregation")
			}
		}
	}
	seen := map[string]string{}
	for _, u := range l.urls() {
		if msg := checkHTTPURL(u); msg != "" {
			p.add("--"+l.flagOf(u), ErrInvalid, msg)
			continue
		}
		id := workerIDOf(u)
		if prev, dup := seen[id]; dup {
			p.add("--"+l.flagOf(u), ErrInvalid, fmt.Sprintf("%s and %s are the same engine (%s)", prev, u, id))
		}
		seen[id] = u
	}
	switch {
	case o.model != "" && len(l.urls()) == 0:
		p.add("--model", ErrInvalid, "only used with workers on the command line")
	case len(l.urls()) == 0 && o.configPath == "" && !l.pd:
		p.add("--worker-urls", ErrInvalid, "sgl-router's command line needs its workers (--worker-urls, or --pd-disaggregation with --prefill and --decode), or a --config file")
	}
}

// urls returns every worker URL of the launch: plain, prefill, decode.
func (l *sglLaunch) urls() []string {
	out := append([]string(nil), l.workerURLs...)
	for _, pf := range l.prefill {
		out = append(out, pf.url)
	}
	return append(out, l.decode...)
}

func (l *sglLaunch) flagOf(u string) string {
	for _, pf := range l.prefill {
		if pf.url == u {
			return "prefill"
		}
	}
	for _, d := range l.decode {
		if d == u {
			return "decode"
		}
	}
	return "worker-urls"
}

// workerIDOf is the worker ID of an sgl-router worker: its host:port, as POST /workers
// names a worker given without an ID.
func workerIDOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	if u.Port() != "" {
		return u.Host
	}
	if u.Scheme == "https" {
		return u.Host + ":443"
	}
	return u.Host + ":80"
}

// apply builds the launch's workers and model into cfg: every worker of the command line
// serving model, and one unbounded bucket, plain or pd, with the launch's policies.
func (l *sglLaunch) apply(p *problems, cfg *Config, model string, explicitSource bool) {
	urls := l.urls()
	if len(urls) == 0 {
		return // workers come from the configuration file, or the admin API
	}
	if len(cfg.Workers) > 0 || len(cfg.Models) > 0 {
		p.add("--worker-urls", ErrInvalid, "cannot be combined with workers or models from --config or the environment; list the workers in the file instead")
		return
	}
	if model == "" {
		p.add("--model", ErrInvalid, "needs the model the engines serve (serve learns it from the engines when --model is not given)")
		return
	}
	add := func(u string, role Role, port *int) {
		w := defaultWorker()
		w.ID, w.URL, w.Model, w.Role, w.BootstrapPort = workerIDOf(u), u, model, role, port
		cfg.Workers = append(cfg.Workers, w)
	}
	for _, u := range l.workerURLs {
		add(u, RolePlain, nil)
	}
	for _, pf := range l.prefill {
		add(pf.url, RolePrefill, pf.port)
	}
	for _, u := range l.decode {
		add(u, RoleDecode, nil)
	}
	m := Model{}
	m.Tokenizer.Path = l.tokenizerPath
	cache := false
	if l.pd {
		prefill, decode := l.policy, l.policy
		if l.prefillPolicy != "" {
			prefill = l.prefillPolicy
		}
		if l.decodePolicy != "" {
			decode = l.decodePolicy
		} else if decode == PolicyCacheAware {
			decode = PolicyLoadBased // sgl-router's pd pair with one cache-aware policy: least load for decode
		}
		cache = prefill == PolicyCacheAware
		m.Buckets = []Bucket{{ID: "default", Groups: Groups{PD: &PDGroups{
			Prefill: &Group{Policy: &Policy{Type: prefill}}, Decode: &Group{Policy: &Policy{Type: decode}}}}}}
	} else {
		cache = l.policy == PolicyCacheAware
		m.Buckets = []Bucket{{ID: "default", Groups: Groups{Plain: &Group{Policy: &Policy{Type: l.policy}}}}}
	}
	cfg.Models = map[string]Model{model: m}
	// sgl-router's consistent_hashing reads its key from its own headers, unless the
	// configuration file chose them.
	if l.sglHashing && slices.Equal(cfg.Hashing.KeyHeaders, Default().Hashing.KeyHeaders) {
		cfg.Hashing.KeyHeaders = sglHashHeaders()
	}
	// sgl-router's cache_aware keeps a tree of what it dispatched; Switchyard does that
	// with the approximate source, unless the command line chose another one.
	if cache && !explicitSource && cfg.CacheAware.Source == CacheSourceLocal {
		cfg.CacheAware.Source = CacheSourceApproximate
	}
}

// CommandLine is a parsed serve command line before the configuration is built: with
// sgl-router's command line, the model its engines serve may have to be learnt from them
// first (NeedsModel, SetModel).
type CommandLine struct {
	opts *cliOptions
}

// ParseCommandLine parses serve's flags (Switchyard's, or sgl-router's after --compat
// sgl-router). With -h or --help it returns an error wrapping flag.ErrHelp.
func ParseCommandLine(args []string) (*CommandLine, error) {
	o, err := parseFlags(args)
	if err != nil {
		return nil, err
	}
	return &CommandLine{opts: o}, nil
}

// Compat returns the compatibility mode of the command line ("" or CompatSGLRouter).
func (c *CommandLine) Compat() string {
	if c.opts.sgl != nil {
		return CompatSGLRouter
	}
	return ""
}

// NeedsModel returns the worker URLs of an sgl-router command line that names no model:
// their engines must be asked which model they serve (SetModel) before Load.
func (c *CommandLine) NeedsModel() []string {
	if c.opts.sgl == nil || c.opts.model != "" {
		return nil
	}
	return c.opts.sgl.urls()
}

// SetModel sets the model the command line's workers serve.
func (c *CommandLine) SetModel(name string) { c.opts.model = name }

// StartupWait returns how long, and how often, to try to reach the engines of NeedsModel:
// the command line's health.startup_timeout and health.startup_check_interval (its
// --worker-startup-timeout-secs and --worker-startup-check-interval), else their defaults.
func (c *CommandLine) StartupWait() (timeout, interval time.Duration) {
	def := Default().Health
	timeout, interval = def.StartupTimeout, def.StartupCheckInterval
	for _, s := range c.opts.sets {
		v, _ := s.value.(string)
		d, err := parseDuration(v)
		if len(s.segs) != 2 || s.segs[0] != "health" || err != nil || d <= 0 {
			continue
		}
		switch s.segs[1] {
		case "startup_timeout":
			timeout = d
		case "startup_check_interval":
			interval = d
		}
	}
	return timeout, interval
}

// Setting returns the text a flag of the command line gave key (the last one), if any.
func (c *CommandLine) Setting(key string) (string, bool) {
	segs := strings.Split(key, ".")
	for i := len(c.opts.sets) - 1; i >= 0; i-- {
		if s := c.opts.sets[i]; slices.Equal(s.segs, segs) {
			return fmt.Sprint(s.value), true
		}
	}
	return "", false
}

// Load builds the configuration as Load does, from the parsed command line.
func (c *CommandLine) Load(environ []string) (*Config, error) { return load(c.opts, environ) }

// SGLRouterFlags returns the names (without dashes) of every sgl-router flag the
// compatibility mode knows, mapped or refused.
func SGLRouterFlags() []string {
	var out []string
	for _, f := range sglFlags() {
		out = append(out, f.name)
	}
	return out
}

// CompatUsage writes sgl-router's flags and how Switchyard maps each to w.
func CompatUsage(w io.Writer) {
	fmt.Fprintf(w, "switchyard serve --compat %s reads sgl-router's command line:\n\n", CompatSGLRouter)
	for _, f := range sglFlags() {
		switch {
		case f.kind == sglRefused:
			fmt.Fprintf(w, "  --%-32s refused: %s\n", f.name, f.note)
		case f.key != "":
			fmt.Fprintf(w, "  --%-32s %s", f.name, f.key)
			if f.note != "" {
				fmt.Fprintf(w, " (%s)", f.note)
			}
			fmt.Fprintln(w)
		default:
			fmt.Fprintf(w, "  --%-32s %s\n", f.name, f.note)
		}
	}
	fmt.Fprintln(w, "\nand Switchyard's --config FILE, --set KEY=VALUE, --model NAME, --admin-api-key KEY.")
}

// ErrCompatHelp marks -h or --help on sgl-router's command line; it wraps flag.ErrHelp, and
// the usage to print is CompatUsage.
var ErrCompatHelp = fmt.Errorf("sgl-router command line: %w", flag.ErrHelp)
