package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// setting is one key a flag sets, already converted to the decoder's value type.
type setting struct {
	segs  []string
	value any
}

// cliOptions holds the parsed command line.
type cliOptions struct {
	configPath    string
	sets          []setting
	workerURLs    []string
	model         string
	policy        string
	prefillPolicy string
	decodePolicy  string
	maxInFlight   int64
	filters       []string
	affinityMode  string
	visited       map[string]bool
	// sgl is sgl-router's command line (serve --compat sgl-router); nil otherwise.
	sgl *sglLaunch
}

// keyFlag is a flag that sets one scalar configuration key.
type keyFlag struct {
	segs []string
	typ  reflect.Type
	def  string
	opts *cliOptions
}

func (f *keyFlag) String() string {
	if f == nil {
		return ""
	}
	return f.def
}

func (f *keyFlag) Set(s string) error {
	v, err := convertString(f.typ, s)
	if err != nil {
		return err
	}
	f.opts.sets = append(f.opts.sets, setting{segs: f.segs, value: v})
	return nil
}

// setFlag is --set KEY=VALUE: any scalar key, at flag precedence.
type setFlag struct{ opts *cliOptions }

func (f *setFlag) String() string { return "" }

func (f *setFlag) Set(s string) error {
	key, value, ok := strings.Cut(s, "=")
	if !ok {
		return errors.New("expected KEY=VALUE")
	}
	segs := strings.Split(strings.TrimSpace(key), ".")
	_, t, ferr := schemaLeaf(segs)
	if ferr != nil {
		return ferr
	}
	v, err := convertString(t, value)
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	f.opts.sets = append(f.opts.sets, setting{segs: segs, value: v})
	return nil
}

// listFlag appends comma-separated items; it may be repeated.
type listFlag struct {
	dst *[]string
	def string
}

func (f *listFlag) String() string {
	if f == nil {
		return ""
	}
	return f.def
}

func (f *listFlag) Set(s string) error {
	for item := range strings.SplitSeq(s, ",") {
		*f.dst = append(*f.dst, strings.TrimSpace(item))
	}
	return nil
}

// int64Flag is an optional integer flag whose default is "none".
type int64Flag struct{ dst *int64 }

func (f *int64Flag) String() string { return "" }

func (f *int64Flag) Set(s string) error {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return fmt.Errorf("expected an integer, got %q", s)
	}
	*f.dst = n
	return nil
}

// keyFlagSpec names a flag that sets one configuration key.
type keyFlagSpec struct {
	name, key, usage string
}

func keyFlagSpecs() []keyFlagSpec {
	return []keyFlagSpec{
		{"host", "server.host", "listen `ADDRESS`"},
		{"port", "server.port", "listen `PORT` (0 lets the OS choose)"},
		{"api-key", "server.api_key", "bearer `KEY` required on the data plane"},
		{"admin-api-key", "server.admin_api_key", "bearer `KEY` required on the admin API"},
		{"max-body-bytes", "server.max_body_bytes", "request body cap in `BYTES`, also after decompression"},
		{"request-timeout", "server.request_timeout", "end-to-end request `DURATION`"},
		{"log-level", "log.level", "log `LEVEL`: debug, info, warn or error"},
		{"min-load-choices", "cache_aware.min_load_choices", "`K` of cache_aware's power-of-k fallback on a miss (at least 2)"},
	}
}

// FlagKey is a command-line flag and one configuration key it sets.
type FlagKey struct {
	// Flag is the flag's name, without dashes.
	Flag string
	// Key is the key's dotted path; "<name>" stands for every model name and "[]" for
	// every element of a list.
	Key string
}

// FlagKeys returns every flag that sets configuration keys, once per key it sets, in flag
// order: the key flags (--host, --port, ...) and the flags that act on the decoded
// configuration (--policy, --prefill-policy, --decode-policy, --max-in-flight). --set,
// which sets any scalar key, and the quick-start flags --worker-urls and --model are not
// listed. The configuration reference is generated from it.
func FlagKeys() []FlagKey {
	var out []FlagKey
	for _, s := range keyFlagSpecs() {
		out = append(out, FlagKey{Flag: s.name, Key: s.key})
	}
	out = append(out,
		FlagKey{Flag: "policy", Key: "default_policy.type"},
		FlagKey{Flag: "prefill-policy", Key: "models.<name>.policies.prefill.type"},
		FlagKey{Flag: "decode-policy", Key: "models.<name>.policies.decode.type"},
	)
	for _, p := range policyPaths() {
		out = append(out, FlagKey{Flag: "max-in-flight", Key: p + ".admission.max_inflight_requests"})
	}
	return out
}

// policyPaths are the key paths of every policy attachment, as forEachPolicy visits them.
func policyPaths() []string {
	return []string{
		"default_policy",
		"models.<name>.policies.plain",
		"models.<name>.policies.prefill",
		"models.<name>.policies.decode",
		"models.<name>.buckets[].groups.plain.policy",
		"models.<name>.buckets[].groups.pd.prefill.policy",
		"models.<name>.buckets[].groups.pd.decode.policy",
	}
}

// droppedFlag returns the replacement text of a dropped flag name (without dashes).
func droppedFlag(name string) (string, bool) {
	switch {
	case name == "fuse" || strings.HasPrefix(name, "fuse-") || strings.HasPrefix(name, "fuse_"):
		return fuseReplacement, true
	case name == "stable-pair":
		return stablePairReplacement, true
	case name == "prefix-cache-min-share":
		return prefixShareReplacement, true
	}
	return "", false
}

// extractDropped removes every dropped flag from args, with the value that follows it
// when it is not written as --flag=value, and reports each. It follows the flag
// package's rules: parsing stops at "--" or the first non-flag argument, and a known
// non-boolean flag written without "=" consumes the next argument.
func extractDropped(fs *flag.FlagSet, args []string, p *problems) []string {
	rest := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || a == "-" || !strings.HasPrefix(a, "-") {
			return append(rest, args[i:]...)
		}
		name, _, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if msg, ok := droppedFlag(name); ok {
			p.add("--"+name, ErrDropped, msg)
			if !hasValue && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++
			}
			continue
		}
		rest = append(rest, a)
		if f := fs.Lookup(name); f != nil && !hasValue && !isBoolFlag(f) && i+1 < len(args) {
			i++
			rest = append(rest, args[i])
		}
	}
	return rest
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// Replacement texts of dropped options.
const (
	fuseReplacement        = "dropped with fused scoring; use --policy power_of_two or cache_aware (cache tuning lives under cache_aware.*)"
	stablePairReplacement  = "dropped; a PD pair always comes from one bucket; use session_aware or sticky groups for repeat placement"
	softAffinityReplace    = "dropped; only strict admitted-binding reuse remains; omit --affinity-mode or pass strict"
	prefixShareReplacement = "dropped; the prefix-share filter has no equivalent; use a cache_aware policy (cache_aware.min_matched_tokens, cache_aware.min_match_ratio)"
)

// droppedPolicyReplacement returns the replacement of a dropped policy name, or "".
func droppedPolicyReplacement(name string) string {
	switch name {
	case "fused_score", "score_policy":
		return "use power_of_two or cache_aware"
	case "legacy_host_affinity":
		return "use power_of_two, or session_aware for session reuse"
	}
	return ""
}

func droppedHelp() [][2]string {
	return [][2]string{
		{"--policy fused_score|score_policy", "use --policy power_of_two or cache_aware"},
		{"--fuse, --fuse-* (any value)", "use --policy power_of_two or cache_aware"},
		{"--decode-policy legacy_host_affinity", "use --decode-policy power_of_two (or session_aware)"},
		{"--stable-pair", "PD pairs always come from one bucket; use session_aware or sticky"},
		{"--affinity-mode soft", "omit --affinity-mode (strict is the only mode)"},
		{"--filter prefix_cache", "use a cache_aware policy (cache_aware.min_matched_tokens)"},
		{"--prefix-cache-min-share", "use a cache_aware policy (cache_aware.min_match_ratio)"},
	}
}

// newFlagSet defines every flag, recording into o. Defaults shown come from Default().
func newFlagSet(o *cliOptions) *flag.FlagSet {
	def := reflect.ValueOf(Default()).Elem()
	fs := flag.NewFlagSet("switchyard", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}

	fs.StringVar(&o.configPath, "config", "", "configuration `FILE`: YAML (.yaml, .yml) or JSON (.json)")
	for _, s := range keyFlagSpecs() {
		segs := strings.Split(s.key, ".")
		_, t, ferr := schemaLeaf(segs)
		if ferr != nil {
			panic("BUG: config: flag --" + s.name + ": " + ferr.Error())
		}
		fs.Var(&keyFlag{segs: segs, typ: t, def: formatDefault(valueAt(def, segs)), opts: o}, s.name,
			s.usage+"; sets "+s.key)
	}
	fs.Var(&setFlag{opts: o}, "set", "set any scalar configuration `KEY=VALUE` (dotted key, e.g. load.freshness=3s); repeatable")
	fs.Var(&listFlag{dst: &o.workerURLs}, "worker-urls", "quick start: comma-separated engine `URLs`, registered as plain workers w1..wN of --model; needs --model")
	fs.StringVar(&o.model, "model", "", "quick start: the model `NAME` the --worker-urls serve; one unbounded plain bucket routes it")
	fs.StringVar(&o.policy, "policy", "", "policy `NAME` of the quick-start group; with a config file, sets default_policy.type (used by every group with no policy and no model stage default)")
	fs.StringVar(&o.prefillPolicy, "prefill-policy", "", "sets policies.prefill.type of every model, the `NAME` of the default prefill policy")
	fs.StringVar(&o.decodePolicy, "decode-policy", "", "sets policies.decode.type of every model, the `NAME` of the default decode policy")
	fs.Var(&int64Flag{dst: &o.maxInFlight}, "max-in-flight", "sets admission.max_inflight_requests to `N` on every policy (default_policy, model stage defaults, group policies)")
	fs.Var(&listFlag{dst: &o.filters}, "filter", "comma-separated admission `FILTERS`; only overloaded, which needs --max-in-flight")
	fs.StringVar(&o.affinityMode, "affinity-mode", "strict", "affinity `MODE`; only strict (admitted-binding reuse) remains")
	fs.String("compat", "", "read sgl-router's command line: --compat "+CompatSGLRouter+" (see --compat "+CompatSGLRouter+" --help)")
	return fs
}

// valueAt walks v along key segments.
func valueAt(v reflect.Value, segs []string) reflect.Value {
	for _, s := range segs {
		v = v.Field(fieldIndex(v.Type())[s])
	}
	return v
}

func formatDefault(v reflect.Value) string {
	if v.Type() == durationType {
		return time.Duration(v.Int()).String()
	}
	return fmt.Sprint(v.Interface())
}

// parseFlags parses args and rejects dropped or inconsistent options.
func parseFlags(args []string) (*cliOptions, error) {
	o := &cliOptions{visited: make(map[string]bool)}
	if compatMode(args) {
		if err := parseCompat(args, o); err != nil {
			return nil, err
		}
		return o, nil
	}
	fs := newFlagSet(o)
	var p problems
	// Dropped flags are not defined on fs: take them out first so that every dropped
	// option is reported together, with the other problems of the command line.
	args = extractDropped(fs, args, &p)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, fmt.Errorf("cannot parse flags: %w", err)
		}
		return nil, errors.Join(append(p.errs, fmt.Errorf("cannot parse flags: %w", err))...)
	}
	fs.Visit(func(f *flag.Flag) { o.visited[f.Name] = true })
	checkPolicyFlag(&p, o, "policy", o.policy, "")
	checkPolicyFlag(&p, o, "prefill-policy", o.prefillPolicy, RolePrefill)
	checkPolicyFlag(&p, o, "decode-policy", o.decodePolicy, RoleDecode)

	switch o.affinityMode {
	case "strict":
	case "soft":
		p.add("--affinity-mode", ErrDropped, `"soft" was `+softAffinityReplace)
	default:
		p.add("--affinity-mode", ErrInvalid, fmt.Sprintf("unknown mode %q (only strict)", o.affinityMode))
	}

	overloaded := false
	for _, f := range o.filters {
		switch f {
		case "overloaded":
			overloaded = true
		case "prefix_cache":
			p.add("--filter", ErrDropped, `"prefix_cache" was `+prefixShareReplacement)
		default:
			p.add("--filter", ErrInvalid, fmt.Sprintf("unknown filter %q (only overloaded)", f))
		}
	}
	switch {
	case o.visited["max-in-flight"] && o.maxInFlight < 1:
		p.add("--max-in-flight", ErrInvalid, fmt.Sprintf("must be at least 1, got %d", o.maxInFlight))
	case overloaded && !o.visited["max-in-flight"]:
		p.add("--filter", ErrInvalid, "overloaded needs --max-in-flight N (the in-flight cap it applies)")
	}

	if o.visited["worker-urls"] {
		if o.model == "" {
			p.add("--worker-urls", ErrInvalid, "needs --model NAME")
		}
		for i, u := range o.workerURLs {
			if msg := checkHTTPURL(u); msg != "" {
				p.add("--worker-urls", ErrInvalid, fmt.Sprintf("URL %d %q: %s", i+1, u, msg))
			}
		}
	} else if o.visited["model"] {
		p.add("--model", ErrInvalid, "only used with --worker-urls")
	}

	for _, a := range fs.Args() {
		msg := fmt.Sprintf("unexpected argument %q", a)
		if strings.Contains(a, "://") {
			msg += " (list engines as --worker-urls URL1,URL2)"
		}
		p.add("", ErrInvalid, msg)
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	return o, nil
}

func checkPolicyFlag(p *problems, o *cliOptions, name, value string, role Role) {
	if !o.visited[name] {
		return
	}
	path := "--" + name
	switch {
	case droppedPolicyReplacement(value) != "":
		p.add(path, ErrDropped, fmt.Sprintf("%q was dropped; %s", value, droppedPolicyReplacement(value)))
	case !knownPolicy(value):
		p.add(path, ErrInvalid, fmt.Sprintf("unknown policy %q (known: %s)", value, strings.Join(policyNames(), ", ")))
	case role == RoleDecode && value == PolicyCacheAware:
		p.add(path, ErrInvalid, "cache_aware is only valid on plain or prefill groups")
	}
}

// compatMode reports whether args hold --compat (before any "--"): they are then read as
// the compatibility mode's command line.
func compatMode(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a == "--compat" || a == "-compat" || strings.HasPrefix(a, "--compat=") || strings.HasPrefix(a, "-compat=") {
			return true
		}
	}
	return false
}

// apply applies the flags that act on the decoded configuration; they take precedence
// over everything else.
func (o *cliOptions) apply(cfg *Config) error {
	var p problems
	if o.sgl != nil {
		o.sgl.apply(&p, cfg, o.model, o.sgl.sourceSet)
		return p.err()
	}
	if o.visited["worker-urls"] {
		if len(cfg.Workers) > 0 || len(cfg.Models) > 0 {
			p.add("--worker-urls", ErrInvalid, "cannot be combined with workers or models from --config or the environment; list the workers in the file instead")
		} else {
			cfg.Workers = make([]Worker, len(o.workerURLs))
			for i, u := range o.workerURLs {
				w := defaultWorker()
				w.ID, w.URL, w.Model = "w"+strconv.Itoa(i+1), u, o.model
				cfg.Workers[i] = w
			}
			g := &Group{}
			if o.visited["policy"] {
				g.Policy = &Policy{Type: o.policy}
			}
			cfg.Models = map[string]Model{o.model: {Buckets: []Bucket{{ID: "default", Groups: Groups{Plain: g}}}}}
		}
	}
	if o.visited["policy"] {
		cfg.DefaultPolicy.Type = o.policy
	}
	o.applyStagePolicy(&p, cfg, "prefill-policy", o.prefillPolicy, func(s *StagePolicies) **Policy { return &s.Prefill })
	o.applyStagePolicy(&p, cfg, "decode-policy", o.decodePolicy, func(s *StagePolicies) **Policy { return &s.Decode })
	if o.visited["max-in-flight"] {
		cfg.forEachPolicy(func(pol *Policy) {
			n := o.maxInFlight
			pol.Admission.MaxInflightRequests = &n
		})
	}
	return p.err()
}

func (o *cliOptions) applyStagePolicy(p *problems, cfg *Config, name, value string, stage func(*StagePolicies) **Policy) {
	if !o.visited[name] {
		return
	}
	used := false
	for _, m := range cfg.Models {
		for _, b := range m.Buckets {
			if b.Groups.PD != nil {
				used = true
			}
		}
	}
	if !used {
		p.add("--"+name, ErrInvalid, "has no effect: no model has a pd bucket")
		return
	}
	for _, k := range sortedKeys(cfg.Models) {
		m := cfg.Models[k]
		slot := stage(&m.Policies)
		if *slot == nil {
			*slot = &Policy{Type: value}
		} else {
			cp := **slot
			cp.Type = value
			*slot = &cp
		}
		cfg.Models[k] = m
	}
}

// forEachPolicy calls fn on every policy attachment: the default policy, every model's
// stage defaults and every group's policy.
func (c *Config) forEachPolicy(fn func(*Policy)) {
	fn(&c.DefaultPolicy)
	for _, m := range c.Models {
		for _, p := range []*Policy{m.Policies.Plain, m.Policies.Prefill, m.Policies.Decode} {
			if p != nil {
				fn(p)
			}
		}
		for _, b := range m.Buckets {
			for _, g := range b.Groups.all() {
				if g.Policy != nil {
					fn(g.Policy)
				}
			}
		}
	}
}

// all returns the bucket's non-nil groups.
func (g Groups) all() []*Group {
	var out []*Group
	if g.Plain != nil {
		out = append(out, g.Plain)
	}
	if g.PD != nil {
		if g.PD.Prefill != nil {
			out = append(out, g.PD.Prefill)
		}
		if g.PD.Decode != nil {
			out = append(out, g.PD.Decode)
		}
	}
	return out
}
