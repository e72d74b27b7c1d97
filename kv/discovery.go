package kv

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

// maxServerInfoBody bounds a /server_info body.
const maxServerInfoBody = 4 << 20

// maxDPSize bounds an advertised DP size.
const maxDPSize = 4096

// ErrNoKVEvents means the engine advertises no ZMQ KV-event publisher (no kv_events section,
// another publisher, or no introspection route at all, as with vLLM-style engines).
var ErrNoKVEvents = errors.New("engine advertises no ZMQ KV-event publisher")

// Discoverer finds the KV-event publishers an engine advertises. The router's worker
// lifecycle (httpfront/fleet) implements it on its one introspection of the engine; an
// engine that advertises none answers an error wrapping ErrNoKVEvents, any other error is
// transient and worth retrying.
type Discoverer interface {
	DiscoverKV(ctx context.Context, workerURL string) (Discovery, error)
}

// Publisher is one DP rank's KV-event publisher.
type Publisher struct {
	// Rank is the DP rank.
	Rank int
	// Endpoint is the engine's bound PUB socket, "tcp://host:port".
	Endpoint string
	// Replay is the engine's replay ROUTER socket, or "" when it has none.
	Replay string
	// Topic is the subscription topic ("" for every topic).
	Topic string
}

// Discovery is what an engine advertises about its KV events in /server_info.
type Discovery struct {
	// Publishers has one entry per DP rank.
	Publishers []Publisher
	// BlockSize is the engine's tokens per block (kv_events.block_size, else page_size);
	// 0 when not advertised.
	BlockSize int
	// DPSize is the number of DP ranks (at least 1).
	DPSize int
}

// wireKVEvents is the kv_events section of /server_info; numbers may arrive as strings.
type wireKVEvents struct {
	Publisher        string          `json:"publisher"`
	EndpointHost     string          `json:"endpoint_host"`
	EndpointPortBase json.RawMessage `json:"endpoint_port_base"`
	Endpoint         string          `json:"endpoint"`
	Topic            string          `json:"topic"`
	BlockSize        json.RawMessage `json:"block_size"`
	DPSize           json.RawMessage `json:"dp_size"`
	ReplayPortBase   json.RawMessage `json:"replay_endpoint_port_base"`
	ReplayEndpoint   *string         `json:"replay_endpoint"`
}

type wireInfo struct {
	PageSize json.RawMessage `json:"page_size"`
	DPSize   json.RawMessage `json:"dp_size"`
	KVEvents json.RawMessage `json:"kv_events"`
}

// ParseServerInfo reads the KV-event publishers an engine advertises in a /server_info (or
// /get_server_info) body. A wildcard endpoint host ("*", "0.0.0.0", "::", or none) means the
// host of workerURL. Rank r publishes on endpoint_port_base + r (and replays on
// replay_endpoint_port_base + r when advertised). An engine without a ZMQ publisher is
// ErrNoKVEvents; a malformed body wraps ErrMalformed.
func ParseServerInfo(body []byte, workerURL string) (Discovery, error) {
	var w wireInfo
	if err := json.Unmarshal(body, &w); err != nil {
		return Discovery{}, fmt.Errorf("cannot parse server info: %w: %w", ErrMalformed, err)
	}
	d := Discovery{}
	var err error
	if d.BlockSize, err = lenientInt(w.PageSize); err != nil {
		return Discovery{}, fmt.Errorf("cannot parse server info page_size: %w: %w", ErrMalformed, err)
	}
	if d.DPSize, err = lenientInt(w.DPSize); err != nil {
		return Discovery{}, fmt.Errorf("cannot parse server info dp_size: %w: %w", ErrMalformed, err)
	}
	if len(w.KVEvents) == 0 || string(w.KVEvents) == "null" {
		return Discovery{}, ErrNoKVEvents
	}
	var k wireKVEvents
	if err := json.Unmarshal(w.KVEvents, &k); err != nil {
		return Discovery{}, fmt.Errorf("cannot parse server info kv_events: %w: %w", ErrMalformed, err)
	}
	if k.Publisher != "" && k.Publisher != "zmq" {
		return Discovery{}, fmt.Errorf("%w: publisher %q", ErrNoKVEvents, k.Publisher)
	}
	bs, err := lenientInt(k.BlockSize)
	if err != nil {
		return Discovery{}, fmt.Errorf("cannot parse kv_events.block_size: %w: %w", ErrMalformed, err)
	}
	if bs > 0 {
		d.BlockSize = bs
	}
	dp, err := lenientInt(k.DPSize)
	if err != nil {
		return Discovery{}, fmt.Errorf("cannot parse kv_events.dp_size: %w: %w", ErrMalformed, err)
	}
	d.DPSize = max(d.DPSize, dp, 1)
	if d.DPSize > maxDPSize || d.BlockSize < 0 || d.BlockSize > MaxTokensPerEvent {
		return Discovery{}, fmt.Errorf("cannot parse server info: %w: dp_size %d or block size %d out of range", ErrMalformed, d.DPSize, d.BlockSize)
	}
	host, port := k.EndpointHost, 0
	if port, err = lenientInt(k.EndpointPortBase); err != nil {
		return Discovery{}, fmt.Errorf("cannot parse kv_events.endpoint_port_base: %w: %w", ErrMalformed, err)
	}
	if port == 0 && k.Endpoint != "" {
		if host, port, err = SplitEndpoint(k.Endpoint); err != nil {
			return Discovery{}, fmt.Errorf("cannot parse kv_events.endpoint: %w: %w", ErrMalformed, err)
		}
	}
	if port <= 0 {
		return Discovery{}, fmt.Errorf("%w: no endpoint port", ErrNoKVEvents)
	}
	replayPort, err := lenientInt(k.ReplayPortBase)
	if err != nil {
		return Discovery{}, fmt.Errorf("cannot parse kv_events.replay_endpoint_port_base: %w: %w", ErrMalformed, err)
	}
	replayHost := host
	if replayPort == 0 && k.ReplayEndpoint != nil && *k.ReplayEndpoint != "" {
		if replayHost, replayPort, err = SplitEndpoint(*k.ReplayEndpoint); err != nil {
			return Discovery{}, fmt.Errorf("cannot parse kv_events.replay_endpoint: %w: %w", ErrMalformed, err)
		}
	}
	host, replayHost = EndpointHost(host, workerURL), EndpointHost(replayHost, workerURL)
	if port+d.DPSize-1 > 65535 || replayPort < 0 || replayPort+d.DPSize-1 > 65535 {
		return Discovery{}, fmt.Errorf("cannot parse kv_events: %w: ports out of range", ErrMalformed)
	}
	for r := range d.DPSize {
		p := Publisher{Rank: r, Endpoint: TCPEndpoint(host, port+r), Topic: k.Topic}
		if replayPort > 0 {
			p.Replay = TCPEndpoint(replayHost, replayPort+r)
		}
		d.Publishers = append(d.Publishers, p)
	}
	return d, nil
}

// PublishersFor derives the publishers of dpSize ranks from a configured rank-0 endpoint
// "tcp://host:port" (rank r on port+r) and an optional rank-0 replay endpoint. A wildcard
// host means workerURL's host.
func PublishersFor(endpoint, replay, topic, workerURL string, dpSize int) ([]Publisher, error) {
	host, port, err := SplitEndpoint(endpoint)
	if err != nil {
		return nil, fmt.Errorf("cannot use KV-event endpoint %q: %w", endpoint, err)
	}
	var rhost string
	var rport int
	if replay != "" {
		if rhost, rport, err = SplitEndpoint(replay); err != nil {
			return nil, fmt.Errorf("cannot use KV-event replay endpoint %q: %w", replay, err)
		}
	}
	dpSize = max(dpSize, 1)
	if port+dpSize-1 > 65535 || rport+dpSize-1 > 65535 {
		return nil, fmt.Errorf("cannot use KV-event endpoint %q: ports of %d ranks out of range", endpoint, dpSize)
	}
	host, rhost = EndpointHost(host, workerURL), EndpointHost(rhost, workerURL)
	out := make([]Publisher, dpSize)
	for r := range out {
		out[r] = Publisher{Rank: r, Endpoint: TCPEndpoint(host, port+r), Topic: topic}
		if rport > 0 {
			out[r].Replay = TCPEndpoint(rhost, rport+r)
		}
	}
	return out, nil
}

// Discover asks the engine at baseURL for its KV-event publishers: /server_info, then
// /get_server_info. An engine answering neither route (404) or advertising no ZMQ publisher
// is ErrNoKVEvents; other failures are transient and worth retrying.
func Discover(ctx context.Context, client *fasthttp.Client, baseURL string, timeout time.Duration) (Discovery, error) {
	var firstErr error
	missing := 0
	for _, route := range [...]string{"/server_info", "/get_server_info"} {
		body, status, err := httpGet(ctx, client, strings.TrimSuffix(baseURL, "/")+route, timeout)
		switch {
		case err == nil && status == fasthttp.StatusOK:
			return ParseServerInfo(body, baseURL)
		case err == nil && status == fasthttp.StatusNotFound:
			missing++
			err = fmt.Errorf("%s answered 404", route)
		case err == nil:
			err = fmt.Errorf("%s answered %d", route, status)
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	if missing == 2 {
		return Discovery{}, fmt.Errorf("cannot discover KV events of %s: %w (no introspection route)", baseURL, ErrNoKVEvents)
	}
	return Discovery{}, fmt.Errorf("cannot discover KV events of %s: %w", baseURL, firstErr)
}

func httpGet(ctx context.Context, client *fasthttp.Client, u string, timeout time.Duration) ([]byte, int, error) {
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
	if len(resp.Body()) > maxServerInfoBody {
		return nil, 0, fmt.Errorf("%s: body over %d bytes", u, maxServerInfoBody)
	}
	return append([]byte(nil), resp.Body()...), resp.StatusCode(), nil
}

// lenientInt reads an optional integer sent as a number or a string; absent or null is 0.
func lenientInt(raw json.RawMessage) (int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err != nil {
		var s string
		if err2 := json.Unmarshal(raw, &s); err2 != nil {
			return 0, err
		}
		n = json.Number(strings.TrimSpace(s))
	}
	v, err := strconv.ParseInt(n.String(), 10, 32)
	if err != nil {
		return 0, err
	}
	if v < 0 {
		return 0, fmt.Errorf("negative value %d", v)
	}
	return int(v), nil
}

// SplitEndpoint splits a ZMQ endpoint "tcp://host:port" (the host may be a wildcard).
func SplitEndpoint(ep string) (string, int, error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", 0, fmt.Errorf("endpoint %q is not tcp://HOST:PORT", ep)
	}
	host, p, err := net.SplitHostPort(rest)
	if err != nil {
		return "", 0, fmt.Errorf("endpoint %q: %w", ep, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("endpoint %q has an invalid port", ep)
	}
	return host, port, nil
}

// EndpointHost is the host to dial for an engine's ZMQ endpoint host (advertised in
// /server_info or configured): a wildcard ("", "*", "0.0.0.0", "::") means the host of
// workerURL (or 127.0.0.1 when it has none); brackets are dropped. The router resolves every
// engine endpoint, KV events and load gauge alike, with this one function.
func EndpointHost(host, workerURL string) string {
	switch host {
	case "", "*", "0.0.0.0", "::", "[::]":
		if h := hostOf(workerURL); h != "" {
			return h
		}
		return "127.0.0.1"
	}
	return strings.Trim(host, "[]")
}

// TCPEndpoint returns the ZMQ endpoint "tcp://host:port".
func TCPEndpoint(host string, port int) string {
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port))
}

// hostOf returns the host of a base URL, or "".
func hostOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// hostPortOf returns "host:port" of a base URL (the port defaulted by scheme), or "".
func hostPortOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Hostname() == "" {
		return ""
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(normalizeHost(u.Hostname()), port)
}

// normalizeHost maps the loopback name to its address so that a topic naming 127.0.0.1 finds a
// worker configured as localhost.
func normalizeHost(h string) string {
	if strings.EqualFold(h, "localhost") {
		return "127.0.0.1"
	}
	return strings.Trim(h, "[]")
}
