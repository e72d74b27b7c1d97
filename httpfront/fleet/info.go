package fleet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"switchyard/config"
	"switchyard/kv/events"
	"switchyard/kv/subscribe"
)

// ErrIntrospection is wrapped by every introspection failure: a body that cannot be read as
// server info, or an engine that answers neither introspection route.
var ErrIntrospection = errors.New("cannot introspect worker")

// ErrNoIntrospection means the engine has neither /server_info nor /get_server_info (both
// answered 404), as vLLM: its facts come from the configuration. It wraps ErrIntrospection.
var ErrNoIntrospection = fmt.Errorf("%w: no introspection route", ErrIntrospection)

// Bounds of the decoded facts.
const (
	maxDPSize    = config.MaxDPSize
	maxPageSize  = 1 << 20
	maxLoRASlots = 1 << 16
)

// Info is what the one introspection of an engine learns from /server_info (or
// /get_server_info), INTEROP "Engine HTTP API": the facts the registry, telemetry and the
// KV-event subscriptions need. It is immutable once decoded.
type Info struct {
	// ModelPath is model_path.
	ModelPath string
	// ServedModelName is served_model_name; empty when not reported.
	ServedModelName string
	// Mode is the disaggregation mode: "" (plain), "prefill" or "decode".
	Mode string
	// BootstrapPort is disaggregation_bootstrap_port; 0 when not reported.
	BootstrapPort int
	// DPSize is dp_size; 0 when not reported.
	DPSize int
	// PageSize is page_size; 0 when not reported.
	PageSize int
	// KV is the KV-event publisher section; nil when the engine reports none, or reports
	// one that cannot be read (KVErr says why: the worker still serves, cache_aware just
	// sees it hold nothing).
	KV *KVInfo
	// KVErr is why a kv_events section could not be read; nil otherwise.
	KVErr error
	// LoadEndpoint is a top-level load_publish_endpoint ("tcp://host:port"), the rank-0
	// load gauge when kv_events names no load port; "" when not reported.
	LoadEndpoint string
	// Labels are the PD compatibility labels the engine reports (config.IntrospectedLabels):
	// transfer_backend (disaggregation_transfer_backend), page_size, kv_cache_dtype and
	// tp_size, each when reported; nil when none is.
	Labels map[string]string
	// LoRASlots is how many LoRA adapters the engine holds at once (SGLang's
	// max_loaded_loras, else max_loras_per_batch); 0 when not reported.
	LoRASlots int
}

// KVInfo is the kv_events section of the server info (or, without one, the engine's own
// kv_events_config): the ZMQ endpoints the engine publishes on.
type KVInfo struct {
	// Publisher is "zmq", "" (not said: taken as zmq when a port is given) or another
	// publisher, which the router cannot subscribe to.
	Publisher string
	// Host is endpoint_host, or the host of the single-string endpoint form; a wildcard
	// means the worker URL's host.
	Host string
	// PortBase is endpoint_port_base, or the port of the endpoint form; rank r publishes on
	// PortBase+r. 0: none.
	PortBase int
	// ReplayHost and ReplayPortBase are the replay ROUTER socket (replay_endpoint_port_base
	// or replay_endpoint); 0: none.
	ReplayHost     string
	ReplayPortBase int
	// Topic is the subscription topic.
	Topic string
	// BlockSize is block_size in tokens; 0 when not reported.
	BlockSize int
	// DPSize is the section's dp_size; 0 when not reported.
	DPSize int
	// LoadPortBase is load_endpoint_port_base, the ZMQ load gauge of rank 0 (rank r on
	// LoadPortBase+r); 0: none.
	LoadPortBase int
	// LoadTopic is load_topic.
	LoadTopic string
}

// Model is the name the engine serves: served_model_name, else model_path.
func (i *Info) Model() string {
	if i.ServedModelName != "" {
		return i.ServedModelName
	}
	return i.ModelPath
}

// ranks is the engine's number of DP ranks: the larger of the advertised sizes, at least 1.
func (i *Info) ranks() int {
	n := max(i.DPSize, 1)
	if i.KV != nil {
		n = max(n, i.KV.DPSize)
	}
	return n
}

// blockSize is the engine's tokens per KV block: kv_events.block_size, else page_size; 0
// when neither is reported.
func (i *Info) blockSize() int {
	if i.KV != nil && i.KV.BlockSize > 0 {
		return i.KV.BlockSize
	}
	return i.PageSize
}

// KVDiscovery returns the KV-event publishers the engine advertises, one per DP rank, with
// wildcard hosts resolved against workerURL (subscribe.EndpointHost, like every engine endpoint).
// An engine without a ZMQ publisher is subscribe.ErrNoKVEvents.
func (i *Info) KVDiscovery(workerURL string) (subscribe.Discovery, error) {
	k := i.KV
	switch {
	case k == nil && i.KVErr != nil:
		return subscribe.Discovery{}, fmt.Errorf("%w: %w", subscribe.ErrNoKVEvents, i.KVErr)
	case k == nil:
		return subscribe.Discovery{}, subscribe.ErrNoKVEvents
	case k.Publisher != "" && k.Publisher != "zmq":
		return subscribe.Discovery{}, fmt.Errorf("%w: publisher %q", subscribe.ErrNoKVEvents, k.Publisher)
	case k.PortBase <= 0:
		return subscribe.Discovery{}, fmt.Errorf("%w: no endpoint port", subscribe.ErrNoKVEvents)
	}
	replay := ""
	if k.ReplayPortBase > 0 {
		replay = subscribe.TCPEndpoint(subscribe.EndpointHost(k.ReplayHost, workerURL), k.ReplayPortBase)
	}
	n := i.ranks()
	pubs, err := subscribe.PublishersFor(subscribe.TCPEndpoint(subscribe.EndpointHost(k.Host, workerURL), k.PortBase), replay, k.Topic, workerURL, n)
	if err != nil {
		return subscribe.Discovery{}, fmt.Errorf("%w: %w", subscribe.ErrNoKVEvents, err)
	}
	return subscribe.Discovery{Publishers: pubs, BlockSize: i.blockSize(), DPSize: n}, nil
}

// GaugeEndpoints returns the ZMQ load-gauge endpoints the engine advertises, one per DP rank
// (kv_events.load_endpoint_port_base, else a rank-0 load_publish_endpoint), with wildcard
// hosts resolved against workerURL; nil when it advertises none.
func (i *Info) GaugeEndpoints(workerURL string) []string {
	var host string
	var base int
	switch {
	case i.KV != nil && i.KV.LoadPortBase > 0:
		host, base = i.KV.Host, i.KV.LoadPortBase
	case i.LoadEndpoint != "":
		h, p, err := subscribe.SplitEndpoint(i.LoadEndpoint)
		if err != nil {
			return nil
		}
		return []string{subscribe.TCPEndpoint(subscribe.EndpointHost(h, workerURL), p)}
	default:
		return nil
	}
	n := i.ranks()
	if base+n-1 > 65535 {
		return nil
	}
	host = subscribe.EndpointHost(host, workerURL)
	out := make([]string, n)
	for r := range n {
		out[r] = subscribe.TCPEndpoint(host, base+r)
	}
	return out
}

// wireInfo holds the server-info members the router reads, undecoded: engines disagree on
// their types (numbers sent as strings, null for absent, sections sent as JSON strings).
type wireInfo struct {
	ModelPath       json.RawMessage `json:"model_path"`
	ServedModelName json.RawMessage `json:"served_model_name"`
	Mode            json.RawMessage `json:"disaggregation_mode"`
	BootstrapPort   json.RawMessage `json:"disaggregation_bootstrap_port"`
	DPSize          json.RawMessage `json:"dp_size"`
	PageSize        json.RawMessage `json:"page_size"`
	KVEvents        json.RawMessage `json:"kv_events"`
	KVEventsConfig  json.RawMessage `json:"kv_events_config"`
	LoadEndpoint    json.RawMessage `json:"load_publish_endpoint"`
	TransferBackend json.RawMessage `json:"disaggregation_transfer_backend"`
	KVCacheDType    json.RawMessage `json:"kv_cache_dtype"`
	TPSize          json.RawMessage `json:"tp_size"`
	MaxLoadedLoras  json.RawMessage `json:"max_loaded_loras"`
	MaxLorasBatch   json.RawMessage `json:"max_loras_per_batch"`
}

// Bounds of the decoded labels.
const (
	maxLabelValue = 256
	maxTPSize     = 1 << 16
)

// wireKV is a kv_events section (or the engine's kv_events_config).
type wireKV struct {
	Publisher      json.RawMessage `json:"publisher"`
	EndpointHost   json.RawMessage `json:"endpoint_host"`
	PortBase       json.RawMessage `json:"endpoint_port_base"`
	Endpoint       json.RawMessage `json:"endpoint"`
	ReplayPortBase json.RawMessage `json:"replay_endpoint_port_base"`
	ReplayEndpoint json.RawMessage `json:"replay_endpoint"`
	Topic          json.RawMessage `json:"topic"`
	BlockSize      json.RawMessage `json:"block_size"`
	DPSize         json.RawMessage `json:"dp_size"`
	LoadPortBase   json.RawMessage `json:"load_endpoint_port_base"`
	LoadTopic      json.RawMessage `json:"load_topic"`
}

// DecodeInfo decodes a /server_info or /get_server_info body: the router's one decoder of
// it. It is lenient where engines differ: an integer may be a JSON number or a string of
// digits, null means absent, the mode may be "null", a section may arrive as a string
// holding JSON, a publisher endpoint may be the single "tcp://host:port" form. A fact the
// router routes by (model, mode, bootstrap port, DP size, page size) that is unreadable
// fails the decode with ErrIntrospection; an unreadable kv_events section only leaves
// KV nil with KVErr set.
func DecodeInfo(body []byte) (Info, error) {
	var w wireInfo
	if err := json.Unmarshal(body, &w); err != nil {
		return Info{}, fmt.Errorf("%w: %w", ErrIntrospection, err)
	}
	var info Info
	var err error
	field := func(name string, e error) error {
		return fmt.Errorf("%w: %s: %w", ErrIntrospection, name, e)
	}
	if info.ModelPath, err = optString(w.ModelPath); err != nil {
		return Info{}, field("model_path", err)
	}
	if info.ServedModelName, err = modelName(w.ServedModelName); err != nil {
		return Info{}, field("served_model_name", err)
	}
	mode, err := optString(w.Mode)
	if err != nil {
		return Info{}, field("disaggregation_mode", err)
	}
	switch m := strings.ToLower(strings.TrimSpace(mode)); m {
	case "", "null", "none", "plain":
	case "prefill", "decode":
		info.Mode = m
	default:
		return Info{}, field("disaggregation_mode", fmt.Errorf("unknown mode %q", mode))
	}
	if info.BootstrapPort, err = optInt(w.BootstrapPort, 0, 65535); err != nil {
		return Info{}, field("disaggregation_bootstrap_port", err)
	}
	if info.DPSize, err = optInt(w.DPSize, 0, maxDPSize); err != nil {
		return Info{}, field("dp_size", err)
	}
	if info.PageSize, err = optInt(w.PageSize, 0, maxPageSize); err != nil {
		return Info{}, field("page_size", err)
	}
	if info.Labels, err = decodeLabels(&w, info.PageSize); err != nil {
		return Info{}, fmt.Errorf("%w: %w", ErrIntrospection, err)
	}
	section := w.KVEvents
	if isNull(section) {
		section = w.KVEventsConfig
	}
	if !isNull(section) {
		kvi, err := decodeKV(section)
		if err != nil {
			info.KVErr = fmt.Errorf("kv_events: %w", err)
		} else {
			info.KV = &kvi
		}
	}
	// The adapter slots only bound adapter routing: an unreadable value is not reported.
	if n, err := optInt(w.MaxLoadedLoras, 0, maxLoRASlots); err == nil && n > 0 {
		info.LoRASlots = n
	} else if n, err := optInt(w.MaxLorasBatch, 0, maxLoRASlots); err == nil {
		info.LoRASlots = n
	}
	if ep, err := optString(w.LoadEndpoint); err == nil && ep != "" {
		if _, _, err := subscribe.SplitEndpoint(ep); err == nil {
			info.LoadEndpoint = ep
		}
	}
	return info, nil
}

// decodeLabels reads the PD compatibility labels of w (page size already decoded). They
// decide which engines may pair, so one that cannot be read fails the decode.
func decodeLabels(w *wireInfo, pageSize int) (map[string]string, error) {
	var labels map[string]string
	set := func(name, v string) error {
		if v = strings.TrimSpace(v); v == "" {
			return nil
		}
		if len(v) > maxLabelValue {
			return fmt.Errorf("%s: longer than %d bytes", name, maxLabelValue)
		}
		if labels == nil {
			labels = make(map[string]string, 4)
		}
		labels[name] = v
		return nil
	}
	backend, err := optString(w.TransferBackend)
	if err != nil {
		return nil, fmt.Errorf("disaggregation_transfer_backend: %w", err)
	}
	dtype, err := optString(w.KVCacheDType)
	if err != nil {
		return nil, fmt.Errorf("kv_cache_dtype: %w", err)
	}
	tp, err := optInt(w.TPSize, 0, maxTPSize)
	if err != nil {
		return nil, fmt.Errorf("tp_size: %w", err)
	}
	num := func(n int) string {
		if n <= 0 {
			return ""
		}
		return strconv.Itoa(n)
	}
	if err := errors.Join(set(config.LabelTransferBackend, backend), set(config.LabelKVCacheDType, dtype),
		set(config.LabelTPSize, num(tp)), set(config.LabelPageSize, num(pageSize))); err != nil {
		return nil, err
	}
	return labels, nil
}

// decodeKV decodes a kv_events section: an object, or a string holding one.
func decodeKV(raw json.RawMessage) (KVInfo, error) {
	if s, err := optString(raw); err == nil {
		raw = json.RawMessage(s) // a section sent as a JSON string (SGLang's kv_events_config)
	}
	var w wireKV
	if err := json.Unmarshal(raw, &w); err != nil {
		return KVInfo{}, err
	}
	var k KVInfo
	var err error
	str := func(raw json.RawMessage, name string, dst *string) {
		if err == nil {
			if *dst, err = optString(raw); err != nil {
				err = fmt.Errorf("%s: %w", name, err)
			}
		}
	}
	num := func(raw json.RawMessage, name string, hi int, dst *int) {
		if err == nil {
			if *dst, err = optInt(raw, 0, hi); err != nil {
				err = fmt.Errorf("%s: %w", name, err)
			}
		}
	}
	var endpoint, replay string
	str(w.Publisher, "publisher", &k.Publisher)
	str(w.EndpointHost, "endpoint_host", &k.Host)
	str(w.Endpoint, "endpoint", &endpoint)
	str(w.ReplayEndpoint, "replay_endpoint", &replay)
	str(w.Topic, "topic", &k.Topic)
	str(w.LoadTopic, "load_topic", &k.LoadTopic)
	num(w.PortBase, "endpoint_port_base", 65535, &k.PortBase)
	num(w.ReplayPortBase, "replay_endpoint_port_base", 65535, &k.ReplayPortBase)
	num(w.BlockSize, "block_size", events.MaxTokensPerEvent, &k.BlockSize)
	num(w.DPSize, "dp_size", maxDPSize, &k.DPSize)
	num(w.LoadPortBase, "load_endpoint_port_base", 65535, &k.LoadPortBase)
	if err != nil {
		return KVInfo{}, err
	}
	k.Publisher = strings.ToLower(strings.TrimSpace(k.Publisher))
	if k.PortBase == 0 && endpoint != "" {
		if k.Host, k.PortBase, err = subscribe.SplitEndpoint(endpoint); err != nil {
			return KVInfo{}, fmt.Errorf("endpoint: %w", err)
		}
	}
	k.ReplayHost = k.Host
	if k.ReplayPortBase == 0 && replay != "" {
		if k.ReplayHost, k.ReplayPortBase, err = subscribe.SplitEndpoint(replay); err != nil {
			return KVInfo{}, fmt.Errorf("replay_endpoint: %w", err)
		}
	}
	ranks := max(k.DPSize, 1)
	for _, p := range []struct {
		name string
		base int
	}{{"endpoint", k.PortBase}, {"replay endpoint", k.ReplayPortBase}, {"load endpoint", k.LoadPortBase}} {
		if p.base > 0 && p.base+ranks-1 > 65535 {
			return KVInfo{}, fmt.Errorf("%s ports of %d ranks from %d pass 65535", p.name, ranks, p.base)
		}
	}
	return k, nil
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// optString reads an optional string; absent or null is "".
func optString(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", errors.New("not a string")
	}
	return s, nil
}

// modelName reads served_model_name: a string, or a list whose first entry is the name.
func modelName(raw json.RawMessage) (string, error) {
	if s, err := optString(raw); err == nil {
		return s, nil
	}
	var names []string
	if err := json.Unmarshal(raw, &names); err != nil {
		return "", errors.New("not a string or a list of strings")
	}
	if len(names) == 0 {
		return "", nil
	}
	return names[0], nil
}

// optInt reads an optional integer in [lo, hi] sent as a number (integral) or as a string of
// one; absent, null or "" is 0.
func optInt(raw json.RawMessage, lo, hi int) (int, error) {
	if isNull(raw) {
		return 0, nil
	}
	text := string(bytes.TrimSpace(raw))
	if text[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, errors.New("not a number")
		}
		if text = strings.TrimSpace(s); text == "" {
			return 0, nil
		}
	}
	v, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(text, 64)
		if ferr != nil || f != math.Trunc(f) || math.IsInf(f, 0) || f < math.MinInt32 || f > math.MaxInt32 {
			return 0, fmt.Errorf("%q is not an integer", text)
		}
		v = int64(f)
	}
	if v < int64(lo) || v > int64(hi) {
		return 0, fmt.Errorf("%d is outside [%d, %d]", v, lo, hi)
	}
	return int(v), nil
}
