package config

import (
	"slices"
	"testing"
	"time"
)

func TestTracingKeys(t *testing.T) {
	if d := Default().Tracing; d.Enabled || d.Protocol != TracingGRPC || d.SamplingRatio != 1 || d.ServiceName != "switchyard" {
		t.Errorf("defaults %+v", d)
	}
	file := writeFile(t, "tracing.yaml", `tracing:
  enabled: true
  endpoint: https://collector.example:4318/otlp/v1/traces
  protocol: http
  sampling_ratio: 0.25
  service_name: router-a
  headers: {X-Api-Key: k1}
  timeout: 3s
  tls: {ca_files: [/etc/ca.pem]}
`)
	cfg, err := Load([]string{"--config", file}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := cfg.Tracing
	if !tr.Enabled || tr.Protocol != TracingHTTP || tr.SamplingRatio != 0.25 || tr.ServiceName != "router-a" ||
		tr.Headers["X-Api-Key"] != "k1" || tr.Timeout != 3*time.Second || !slices.Equal(tr.TLS.CAFiles, []string{"/etc/ca.pem"}) {
		t.Errorf("tracing = %+v", tr)
	}
	got, err := tr.Target()
	if want := (TracingTarget{HostPort: "collector.example:4318", Path: "/otlp/v1/traces"}); err != nil || got != want {
		t.Errorf("target = %+v, %v; want %+v", got, err, want)
	}
}

func TestTracingTarget(t *testing.T) {
	tests := []struct {
		name     string
		endpoint string
		protocol string
		insecure bool
		want     TracingTarget
		wantErr  bool
	}{
		{name: "default grpc", protocol: TracingGRPC, want: TracingTarget{HostPort: "127.0.0.1:4317", Insecure: true}},
		{name: "default http", protocol: TracingHTTP, want: TracingTarget{HostPort: "127.0.0.1:4318", Insecure: true}},
		{name: "host port is TLS", endpoint: "otel:4317", protocol: TracingGRPC, want: TracingTarget{HostPort: "otel:4317"}},
		{name: "host port insecure", endpoint: "otel:4317", protocol: TracingGRPC, insecure: true,
			want: TracingTarget{HostPort: "otel:4317", Insecure: true}},
		{name: "http url", endpoint: "http://otel:4317", protocol: TracingGRPC, want: TracingTarget{HostPort: "otel:4317", Insecure: true}},
		{name: "https url wins over insecure", endpoint: "https://otel:4317/", protocol: TracingGRPC, insecure: true,
			want: TracingTarget{HostPort: "otel:4317"}},
		{name: "grpc url with a path", endpoint: "http://otel:4317/v1/traces", protocol: TracingGRPC, wantErr: true},
		{name: "no port", endpoint: "http://otel", protocol: TracingHTTP, wantErr: true},
		{name: "bad scheme", endpoint: "ftp://otel:21", protocol: TracingHTTP, wantErr: true},
		{name: "credentials in url", endpoint: "http://u:p@otel:4318", protocol: TracingHTTP, wantErr: true},
		{name: "not host port", endpoint: "otel", protocol: TracingGRPC, wantErr: true},
		{name: "port out of range", endpoint: "otel:70000", protocol: TracingGRPC, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := Tracing{Endpoint: tt.endpoint, Protocol: tt.protocol, Insecure: tt.insecure}
			got, err := tr.Target()
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if !tt.wantErr && got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestTracingValidate(t *testing.T) {
	cfg := Default()
	cfg.Tracing = Tracing{Enabled: true, Protocol: "udp", SamplingRatio: 1.5, ServiceName: " ", QueueSize: 0,
		Headers: map[string]string{"Bad Name": "v", "X-Key": "a\r\nb"}, TLS: UpstreamTLS{CertFile: "c.pem"}}
	var paths []string
	for _, fe := range fieldErrors(cfg.Validate()) {
		paths = append(paths, fe.Path)
	}
	want := []string{"tracing.protocol", "tracing.sampling_ratio", "tracing.service_name", "tracing.timeout",
		"tracing.shutdown_timeout", "tracing.queue_size", "tracing.headers.Bad Name", "tracing.headers.X-Key",
		"tracing.tls.key_file"}
	if !slices.Equal(paths, want) {
		t.Errorf("problems at %v, want %v", paths, want)
	}
	cfg = Default()
	cfg.Tracing.Endpoint = "collector"
	if got := fieldErrors(cfg.Validate()); len(got) != 1 || got[0].Path != "tracing.endpoint" {
		t.Errorf("problems %v, want tracing.endpoint", got)
	}
}

// TestCompatTracing: sgl-router's --enable-trace and --otlp-traces-endpoint turn tracing on
// towards the collector, in plain text as sgl-router sends.
func TestCompatTracing(t *testing.T) {
	cfg := loadCompat(t, "--worker-urls http://127.0.0.1:30001 --enable-trace --otlp-traces-endpoint 127.0.0.1:4317")
	if !cfg.Tracing.Enabled || cfg.Tracing.Endpoint != "http://127.0.0.1:4317" || cfg.Tracing.Protocol != TracingGRPC {
		t.Errorf("tracing = %+v", cfg.Tracing)
	}
	if got, err := cfg.Tracing.Target(); err != nil || !got.Insecure || got.HostPort != "127.0.0.1:4317" {
		t.Errorf("target = %+v, %v", got, err)
	}
	if cfg = loadCompat(t, "--worker-urls http://127.0.0.1:30001"); cfg.Tracing.Enabled {
		t.Error("tracing on without --enable-trace")
	}
}
