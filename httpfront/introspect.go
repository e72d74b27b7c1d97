package httpfront

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// Introspection routes of an engine, newest first.
const (
	pathServerInfo    = "/server_info"
	pathGetServerInfo = "/get_server_info"
	pathHealth        = "/health"
)

// maxInfoBody bounds an introspection or health response body.
const maxInfoBody = 4 << 20

// ErrIntrospection is wrapped by every introspection failure.
var ErrIntrospection = errors.New("cannot introspect worker")

// ServerInfo is what introspection learns about an engine (INTEROP "Engine HTTP API").
type ServerInfo struct {
	// ModelPath is the engine's model_path.
	ModelPath string
	// ServedModelName is the engine's served_model_name; empty when not reported.
	ServedModelName string
	// Mode is the disaggregation mode: "" (plain), "prefill" or "decode".
	Mode string
	// BootstrapPort is disaggregation_bootstrap_port; 0 when not reported.
	BootstrapPort int
	// DPSize is dp_size; 0 when not reported.
	DPSize int
	// PageSize is page_size; 0 when not reported.
	PageSize int
	// KVEvents is the KV-event publisher description; nil when not reported.
	KVEvents *KVEventsInfo
}

// KVEventsInfo is the kv_events section of /server_info.
type KVEventsInfo struct {
	Publisher            string `json:"publisher"`
	EndpointHost         string `json:"endpoint_host"`
	EndpointPortBase     int    `json:"endpoint_port_base"`
	Topic                string `json:"topic"`
	BlockSize            int    `json:"block_size"`
	DPSize               int    `json:"dp_size"`
	LoadEndpointPortBase *int   `json:"load_endpoint_port_base"`
	LoadTopic            string `json:"load_topic"`
}

// Model is the name the engine serves: served_model_name, else model_path.
func (i *ServerInfo) Model() string {
	if i.ServedModelName != "" {
		return i.ServedModelName
	}
	return i.ModelPath
}

// GaugeEndpoints returns the ZMQ load-gauge endpoints, one per DP rank, that the engine
// advertises; a wildcard host means the worker URL's host. Nil when none.
func (i *ServerInfo) GaugeEndpoints(workerURL string) []string {
	kv := i.KVEvents
	if kv == nil || kv.LoadEndpointPortBase == nil || *kv.LoadEndpointPortBase <= 0 {
		return nil
	}
	host := kv.EndpointHost
	switch host {
	case "", "*", "0.0.0.0", "::", "[::]":
		host = urlHost(workerURL)
	}
	n := max(kv.DPSize, i.DPSize, 1)
	out := make([]string, n)
	for r := range n {
		out[r] = "tcp://" + net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(*kv.LoadEndpointPortBase+r))
	}
	return out
}

// wireServerInfo accepts every shape listed in INTEROP: numbers may arrive as strings, the
// mode as null.
type wireServerInfo struct {
	ModelPath       string          `json:"model_path"`
	ServedModelName json.RawMessage `json:"served_model_name"`
	Mode            json.RawMessage `json:"disaggregation_mode"`
	BootstrapPort   json.RawMessage `json:"disaggregation_bootstrap_port"`
	DPSize          json.RawMessage `json:"dp_size"`
	PageSize        json.RawMessage `json:"page_size"`
	KVEvents        json.RawMessage `json:"kv_events"`
}

// decodeServerInfo decodes a /server_info or /get_server_info body.
func decodeServerInfo(body []byte) (ServerInfo, error) {
	var w wireServerInfo
	if err := json.Unmarshal(body, &w); err != nil {
		return ServerInfo{}, fmt.Errorf("%w: %w", ErrIntrospection, err)
	}
	info := ServerInfo{ModelPath: w.ModelPath}
	var err error
	if info.ServedModelName, err = optString(w.ServedModelName); err != nil {
		return ServerInfo{}, fmt.Errorf("%w: served_model_name: %w", ErrIntrospection, err)
	}
	mode, err := optString(w.Mode)
	if err != nil {
		return ServerInfo{}, fmt.Errorf("%w: disaggregation_mode: %w", ErrIntrospection, err)
	}
	switch strings.ToLower(mode) {
	case "", "null", "none", "plain":
	case "prefill", "decode":
		info.Mode = strings.ToLower(mode)
	default:
		return ServerInfo{}, fmt.Errorf("%w: unknown disaggregation_mode %q", ErrIntrospection, mode)
	}
	if info.BootstrapPort, err = optInt(w.BootstrapPort); err != nil || info.BootstrapPort < 0 || info.BootstrapPort > 65535 {
		return ServerInfo{}, fmt.Errorf("%w: disaggregation_bootstrap_port: invalid", ErrIntrospection)
	}
	if info.DPSize, err = optInt(w.DPSize); err != nil || info.DPSize < 0 || info.DPSize > 4096 {
		return ServerInfo{}, fmt.Errorf("%w: dp_size: invalid", ErrIntrospection)
	}
	if info.PageSize, err = optInt(w.PageSize); err != nil || info.PageSize < 0 {
		return ServerInfo{}, fmt.Errorf("%w: page_size: invalid", ErrIntrospection)
	}
	if len(w.KVEvents) > 0 && string(w.KVEvents) != "null" {
		var kv KVEventsInfo
		if err := json.Unmarshal(w.KVEvents, &kv); err != nil {
			return ServerInfo{}, fmt.Errorf("%w: kv_events: %w", ErrIntrospection, err)
		}
		info.KVEvents = &kv
	}
	return info, nil
}

func optString(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}

func optInt(raw json.RawMessage) (int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err != nil {
		var s string
		if err2 := json.Unmarshal(raw, &s); err2 != nil {
			return 0, err
		}
		n = json.Number(s)
	}
	v, err := strconv.Atoi(n.String())
	return v, err
}

// introspect asks the engine at base for its server info: /server_info, then
// /get_server_info when the newer route is missing or fails.
func introspect(ctx context.Context, client *fasthttp.Client, base string, timeout time.Duration) (ServerInfo, error) {
	var firstErr error
	for _, p := range [...]string{pathServerInfo, pathGetServerInfo} {
		body, status, err := getJSON(ctx, client, base+p, timeout)
		if err == nil && status == fasthttp.StatusOK {
			return decodeServerInfo(body)
		}
		if err == nil {
			err = fmt.Errorf("%s answered %d", p, status)
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return ServerInfo{}, fmt.Errorf("%w at %s: %w", ErrIntrospection, base, firstErr)
}

// getJSON performs one bounded GET and returns a copy of the body.
func getJSON(ctx context.Context, client *fasthttp.Client, u string, timeout time.Duration) ([]byte, int, error) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = time.Until(dl)
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(u)
	req.Header.SetMethod(fasthttp.MethodGet)
	if err := client.DoTimeout(req, resp, timeout); err != nil {
		return nil, 0, err
	}
	return append([]byte(nil), resp.Body()...), resp.StatusCode(), nil
}

// urlHost returns the host (without port or brackets) of a base URL, or "".
func urlHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// urlHostPort returns host:port of a base URL, defaulting the port by scheme.
func urlHostPort(raw string) (hostPort string, tls bool, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", false, err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", false, fmt.Errorf("url %q is not an http(s) base URL", raw)
	}
	tls = u.Scheme == "https"
	if u.Port() != "" {
		return u.Host, tls, nil
	}
	port := "80"
	if tls {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port), tls, nil
}
