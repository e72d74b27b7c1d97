package subscribe

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

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
