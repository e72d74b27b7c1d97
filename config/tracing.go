package config

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Tracing protocols (tracing.protocol): OTLP over gRPC, or over HTTP with protobuf bodies.
const (
	TracingGRPC = "grpc"
	TracingHTTP = "http"
)

// Tracing configures OpenTelemetry tracing (the "tracing" section): a span for every
// inference request, with children for its preparation, selection, dispatch attempts and
// stream, exported over OTLP to a collector. An incoming W3C traceparent is continued, and
// each dispatch's span context is sent to the engines as their traceparent. Off by default.
type Tracing struct {
	// Enabled turns tracing on (sgl-router's --enable-trace). Default false.
	Enabled bool `koanf:"enabled" json:"enabled"`
	// Endpoint is the collector: host:port, or a URL (http:// sends in plain text, https://
	// with TLS; with protocol http its path, default /v1/traces, is kept). Default: none
	// (plain text to 127.0.0.1:4317 with protocol grpc, 127.0.0.1:4318 with http, as
	// OpenTelemetry's own default endpoints).
	Endpoint string `koanf:"endpoint" json:"endpoint"`
	// Protocol is the OTLP transport: grpc or http (protobuf bodies). Default grpc.
	Protocol string `koanf:"protocol" json:"protocol"`
	// Insecure sends spans in plain text to a host:port endpoint (a URL's scheme decides
	// for itself). Default false (TLS).
	Insecure bool `koanf:"insecure" json:"insecure"`
	// TLS is the client TLS towards the collector: its authorities, a client certificate,
	// the name it must carry. Default: none (the system's roots).
	TLS UpstreamTLS `koanf:"tls" json:"tls"`
	// Headers are sent with every export (a collector's API key). Default: none.
	Headers map[string]string `koanf:"headers" json:"headers"`
	// SamplingRatio is the share of new traces recorded, 0..1; a request that carries a
	// traceparent follows its sampled flag. Default 1.
	SamplingRatio float64 `koanf:"sampling_ratio" json:"sampling_ratio" unit:"fraction of requests"`
	// ServiceName is the service.name resource attribute of the router's spans. Default
	// "switchyard".
	ServiceName string `koanf:"service_name" json:"service_name"`
	// Timeout bounds one export to the collector. Default 10s.
	Timeout time.Duration `koanf:"timeout" json:"timeout"`
	// ShutdownTimeout bounds the export of the spans still held when the router stops.
	// Default 5s.
	ShutdownTimeout time.Duration `koanf:"shutdown_timeout" json:"shutdown_timeout"`
	// QueueSize is how many finished spans wait for export; past it new spans are dropped
	// (not counted: switchyard_tracing_spans_exported_total falls behind). Default 2048.
	QueueSize int `koanf:"queue_size" json:"queue_size" unit:"spans"`
}

func defaultTracing() Tracing {
	return Tracing{Protocol: TracingGRPC, SamplingRatio: 1, ServiceName: "switchyard", Timeout: 10 * time.Second,
		ShutdownTimeout: 5 * time.Second, QueueSize: 2048}
}

// TracingTarget is where tracing.endpoint sends spans: the host:port, whether in plain text,
// and the URL path (protocol http; empty: the exporter's default, /v1/traces).
type TracingTarget struct {
	HostPort string
	Insecure bool
	Path     string
}

// Target reads the endpoint (its default when unset); the error says what is wrong with it.
func (t *Tracing) Target() (TracingTarget, error) {
	ep := t.Endpoint
	if ep == "" {
		port := "4317"
		if t.Protocol == TracingHTTP {
			port = "4318"
		}
		return TracingTarget{HostPort: "127.0.0.1:" + port, Insecure: true}, nil
	}
	out := TracingTarget{HostPort: ep, Insecure: t.Insecure}
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil {
			return out, fmt.Errorf("endpoint %q is not a URL", ep)
		}
		switch u.Scheme {
		case "http":
			out.Insecure = true
		case "https":
			out.Insecure = false
		default:
			return out, fmt.Errorf("endpoint %q must use http or https", ep)
		}
		if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return out, fmt.Errorf("endpoint %q must have no user, query or fragment (headers carry credentials)", ep)
		}
		if u.Path != "" && u.Path != "/" {
			if t.Protocol != TracingHTTP {
				return out, fmt.Errorf("endpoint %q has a path, which only protocol http uses", ep)
			}
			out.Path = u.Path
		}
		out.HostPort = u.Host
		if u.Port() == "" {
			return out, fmt.Errorf("endpoint %q must name a port", ep)
		}
	}
	host, port, err := net.SplitHostPort(out.HostPort)
	if err != nil || host == "" {
		return out, fmt.Errorf("endpoint %q must be HOST:PORT or a URL", ep)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return out, fmt.Errorf("endpoint %q has an invalid port", ep)
	}
	return out, nil
}

func (c *Config) validateTracing(p *problems) {
	t := &c.Tracing
	if !slices.Contains([]string{TracingGRPC, TracingHTTP}, t.Protocol) {
		p.add("tracing.protocol", ErrInvalid, fmt.Sprintf("unknown protocol %q (grpc or http)", t.Protocol))
	} else if _, err := t.Target(); err != nil {
		p.add("tracing.endpoint", ErrInvalid, err.Error())
	}
	if !(t.SamplingRatio >= 0 && t.SamplingRatio <= 1) {
		p.add("tracing.sampling_ratio", ErrInvalid, fmt.Sprintf("must be between 0 and 1, got %v", t.SamplingRatio))
	}
	if strings.TrimSpace(t.ServiceName) == "" {
		p.add("tracing.service_name", ErrInvalid, "must not be empty")
	}
	positive(p, "tracing.timeout", t.Timeout)
	positive(p, "tracing.shutdown_timeout", t.ShutdownTimeout)
	atLeast(p, "tracing.queue_size", int64(t.QueueSize), 1)
	for _, name := range sortedKeys(t.Headers) {
		if !validHeaderName(name) {
			p.add("tracing.headers."+name, ErrInvalid, fmt.Sprintf("%q is not a header name", name))
		} else if strings.ContainsAny(t.Headers[name], "\r\n\x00") {
			p.add("tracing.headers."+name, ErrInvalid, "the value must not hold a line break or NUL")
		}
	}
	validateTLS(p, "tracing.tls", &t.TLS)
}
