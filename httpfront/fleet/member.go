package fleet

import (
	"cmp"
	"context"
	"crypto/tls"
	"net"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/kv/subscribe"
)

// Spec describes a worker to add, from the configuration or a POST /workers body. Empty
// fields are filled by introspection.
type Spec struct {
	ID            string `json:"id"`
	URL           string `json:"url"`
	Model         string `json:"model"`
	Role          string `json:"role"`
	BootstrapPort *int   `json:"bootstrap_port"`
	DPSize        int    `json:"dp_size"`
	// CanPrefill declares a decode engine that can also serve a request alone (PD bypass).
	CanPrefill bool `json:"can_prefill"`
	// LoadPublish is the engine's ZMQ load-gauge endpoint; empty: the one introspection finds.
	LoadPublish string `json:"load_publish"`
	// KVEvents is the engine's KV-event publisher endpoint ("tcp://host:port") for
	// cache_aware; empty: the one introspection finds.
	KVEvents string `json:"kv_events"`
	// Flavor is auto, sglang or vllm ("" is auto). A vllm worker is never introspected (it
	// has no /server_info): its model must be given.
	Flavor string `json:"flavor"`
	// MetricsPath is the engine's Prometheus page; "" is /metrics.
	MetricsPath string `json:"metrics_path"`
	// KVReplay, KVBlockSize and KVHashScheme are KV facts the engine does not advertise
	// (config.Worker's kv_replay, kv_block_size, kv_hash_scheme); zero: introspected or
	// the defaults.
	KVReplay     string `json:"kv_replay"`
	KVBlockSize  int    `json:"kv_block_size"`
	KVHashScheme string `json:"kv_hash_scheme"`
	// TLS is the client TLS of an https:// worker that has its own (workers[].tls); nil
	// takes the Fleet's (Options.TLS). Never from a POST /workers body.
	TLS *tls.Config `json:"-"`
	// Labels are the worker's labels for PD compatibility (groups.pd.compatibility); each
	// wins over the same label introspected from /server_info.
	Labels map[string]string `json:"labels"`
}

// introspects reports whether the worker's engine has /server_info to ask.
func (s *Spec) introspects() bool { return s.Flavor != config.FlavorVLLM }

// Member is one worker's lifecycle state: its registry entry (engine.Worker, whose Handle
// points back here, so that dispatch reaches it from a pick without a lookup), its upstream
// client, circuit breaker, health-check verdict and introspected facts.
type Member struct {
	f             *Fleet
	id            string
	url           string
	bootstrapHost string
	spec          Spec
	up            *Upstream
	breaker       *Breaker
	worker        atomic.Pointer[engine.Worker]
	info          atomic.Pointer[Info]
	// healthOK is the health-check verdict; succ and fail are owned by the health loop (and
	// by the start-up check, which runs before it).
	healthOK   atomic.Bool
	succ, fail int
	removed    atomic.Bool
	// noInfo: the engine answered neither introspection route (vLLM); it is not asked again.
	noInfo atomic.Bool

	// mu orders eligibility publication, the cool-down timer and the followers' updates.
	mu        sync.Mutex
	stopTimer func() bool
	tele      *TelemetrySource      // what telemetry follows; nil: not started
	kvSpec    *subscribe.WorkerSpec // what the KV subscriptions follow; nil: nothing
	cancel    context.CancelFunc
	done      chan struct{}
	ungauge   func()
}

// MemberOf returns the lifecycle state of w, or nil for a worker the lifecycle did not
// register (tests, tools). It is a field read: dispatch calls it for every pick.
func MemberOf(w *engine.Worker) *Member {
	m, _ := w.Handle.(*Member)
	return m
}

// ID is the worker's ID.
func (m *Member) ID() string { return m.id }

// URL is the worker's base URL.
func (m *Member) URL() string { return m.url }

// BootstrapHost is the host of the worker's URL (PD bootstrap_host).
func (m *Member) BootstrapHost() string { return m.bootstrapHost }

// Worker is the worker's current registry entry.
func (m *Member) Worker() *engine.Worker { return m.worker.Load() }

// Upstream is the worker's HTTP client.
func (m *Member) Upstream() *Upstream { return m.up }

// Breaker is the worker's circuit breaker.
func (m *Member) Breaker() *Breaker { return m.breaker }

// Info is the worker's introspected facts, or nil when it has not been introspected.
func (m *Member) Info() *Info { return m.info.Load() }

// Healthy is the health-check verdict.
func (m *Member) Healthy() bool { return m.healthOK.Load() }

// Spec is what the worker was added with.
func (m *Member) Spec() Spec { return m.spec }

// eligible reports whether picks may choose the worker: healthy, and a breaker that lets
// a dispatch through.
func (m *Member) eligible() bool { return m.healthOK.Load() && m.breaker.Eligible() }

// Ticket is one dispatch admitted by Admit; Done records how it ended. The zero Ticket
// records nothing.
type Ticket struct {
	m     *Member
	probe bool
	start time.Time
}

// Admit is called when a dispatch that starts at start is about to be sent to the worker:
// its outcome counts in the breaker's error-rate window at start (a retry's start is its
// own, not its request's). It refuses when the worker was removed, its breaker is open, or
// its breaker is half-open with the probe already in flight; the worker is then withdrawn
// from picks before Admit returns, so the caller's next selection chooses another engine.
// The fast path (a closed breaker) is two atomic loads.
func (m *Member) Admit(start time.Time) (Ticket, bool) {
	if m.removed.Load() {
		return Ticket{}, false
	}
	probe, t, ok := m.breaker.Admit()
	if !ok {
		m.f.publish(m)
		return Ticket{}, false
	}
	if t != NoChange {
		m.f.transition(m, t)
	}
	return Ticket{m: m, probe: probe, start: start}, true
}

// Done records the dispatch's outcome on the worker's breaker. Call it once per admitted
// dispatch, on every path.
func (t Ticket) Done(o Outcome) {
	if t.m == nil {
		return
	}
	if tr := t.m.breaker.Record(o, t.probe, t.start); tr != NoChange {
		t.m.f.transition(t.m, tr)
	}
}

// Probe reports whether the ticket is the half-open breaker's probe.
func (t Ticket) Probe() bool { return t.probe }

// View is one worker as GET /workers shows it.
type View struct {
	ID            string `json:"id"`
	URL           string `json:"url"`
	Model         string `json:"model"`
	Role          string `json:"role"`
	Healthy       bool   `json:"healthy"`
	Eligible      bool   `json:"eligible"`
	Breaker       string `json:"breaker"`
	InFlight      int64  `json:"in_flight"`
	Dispatched    uint64 `json:"dispatched"`
	BootstrapPort *int   `json:"bootstrap_port"`
	DPSize        int    `json:"dp_size"`
	Introspected  bool   `json:"introspected"`
	// Flavor is the configured flavour (auto, sglang, vllm).
	Flavor string `json:"flavor"`
	// Labels are the worker's PD compatibility labels (configured over introspected).
	Labels map[string]string `json:"labels"`
	// PendingPrefill is the router's requests on the worker that have no first token yet.
	PendingPrefill PendingView `json:"pending_prefill"`
	// Learned are the worker's learned service rates (SLO estimates).
	Learned LearnedView `json:"learned"`
	// LoRA is the LoRA adapters the router knows the worker holds; nil until learned.
	LoRA *LoRAView `json:"lora,omitempty"`
}

// LoRAView is a worker's LoRA adapters: its slots (0: no known bound) and each adapter it
// holds with the router's requests using it.
type LoRAView struct {
	Slots    int           `json:"slots"`
	Adapters []AdapterView `json:"adapters"`
}

// AdapterView is one adapter a worker holds.
type AdapterView struct {
	Name     string `json:"name"`
	InFlight int64  `json:"in_flight"`
}

// PendingView is a worker's pending prefill: the requests the router sent it that have no
// first token yet, and their uncached prompt tokens.
type PendingView struct {
	Requests int64 `json:"requests"`
	Tokens   int64 `json:"tokens"`
}

// LearnedView is a worker's learned rates: time to first token = ttft_base_ms + prefill
// tokens / prefill_tokens_per_second; time per output token = tpot_base_ms +
// tpot_per_request_ms × decode requests. Zero before the first observation (samples 0).
type LearnedView struct {
	TTFTBaseMs             float64 `json:"ttft_base_ms"`
	PrefillTokensPerSecond float64 `json:"prefill_tokens_per_second"`
	PrefillSamples         uint64  `json:"prefill_samples"`
	TPOTBaseMs             float64 `json:"tpot_base_ms"`
	TPOTPerRequestMs       float64 `json:"tpot_per_request_ms"`
	DecodeSamples          uint64  `json:"decode_samples"`
}

// View returns the worker's admin view.
func (m *Member) View() View {
	w := m.worker.Load()
	v := View{
		ID:           w.ID,
		URL:          w.URL,
		Model:        w.Model,
		Role:         w.Stage.String(),
		Healthy:      m.healthOK.Load(),
		Eligible:     w.Healthy(),
		Breaker:      m.breaker.State().String(),
		InFlight:     w.Counters.InFlight(),
		Dispatched:   w.Counters.Dispatched(),
		DPSize:       w.DPSize,
		Introspected: m.info.Load() != nil,
		Flavor:       cmp.Or(m.spec.Flavor, config.FlavorAuto),
		Labels:       w.Labels(),
	}
	v.PendingPrefill.Requests, v.PendingPrefill.Tokens = w.Counters.PendingPrefill()
	r := w.Counters.Rates()
	base, _, n := r.Prefill.Params()
	v.Learned.TTFTBaseMs, v.Learned.PrefillTokensPerSecond, v.Learned.PrefillSamples = 1000*base, r.PrefillTokensPerSecond(), n
	base, slope, n := r.Decode.Params()
	v.Learned.TPOTBaseMs, v.Learned.TPOTPerRequestMs, v.Learned.DecodeSamples = 1000*base, 1000*slope, n
	if w.BootstrapPort > 0 {
		p := w.BootstrapPort
		v.BootstrapPort = &p
	}
	if a := w.Adapters(); a != nil {
		v.LoRA = &LoRAView{Slots: a.Slots, Adapters: []AdapterView{}}
		for _, n := range a.Names() {
			v.LoRA.Adapters = append(v.LoRA.Adapters, AdapterView{Name: n, InFlight: a.InFlight(n)})
		}
	}
	return v
}

// urlHost returns the host (without port or brackets) of a base URL, or "".
func urlHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// urlHostPort returns host:port of an http(s) base URL, the port defaulted by scheme.
func urlHostPort(raw string) (hostPort string, isTLS bool, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", false, err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", false, errNotHTTP(raw)
	}
	isTLS = u.Scheme == "https"
	if u.Port() != "" {
		return u.Host, isTLS, nil
	}
	port := "80"
	if isTLS {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port), isTLS, nil
}

type errNotHTTP string

func (e errNotHTTP) Error() string {
	return "url " + strconv.Quote(string(e)) + " is not an http(s) base URL"
}
