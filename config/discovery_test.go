package config

import (
	"strings"
	"testing"
)

// TestLoadDiscoveryKeys reads every discovery.kubernetes key from a file and the
// environment.
func TestLoadDiscoveryKeys(t *testing.T) {
	file := writeFile(t, "disc.yaml", `
discovery:
  kubernetes:
    enabled: true
    kubeconfig: /etc/kube/config
    namespace: inference
    selector: "app=sglang,tier in (a, b)"
    prefill_selector: app=sglang,role=prefill
    decode_selector: app=sglang,role=decode
    port_name: http
    scheme: https
    model_label: model
    bootstrap_port_annotation: example.com/bootstrap
    flavor: sglang
`)
	cfg, err := Load([]string{"--config", file}, []string{"SWITCHYARD_DISCOVERY__KUBERNETES__NAMESPACE=serving"})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	want := Kubernetes{Enabled: true, Kubeconfig: "/etc/kube/config", Namespace: "serving",
		Selector: "app=sglang,tier in (a, b)", PrefillSelector: "app=sglang,role=prefill", DecodeSelector: "app=sglang,role=decode",
		PortName: "http", Scheme: "https", ModelLabel: "model", BootstrapPortAnnotation: "example.com/bootstrap", Flavor: FlavorSGLang}
	if got := cfg.Discovery.Kubernetes; got != want {
		t.Errorf("discovery.kubernetes = %+v\nwant %+v", got, want)
	}
	if got := len(cfg.Discovery.Kubernetes.Selectors()); got != 3 {
		t.Errorf("Selectors() has %d roles, want 3", got)
	}
}

func TestValidateDiscovery(t *testing.T) {
	tests := []struct {
		name string
		k    Kubernetes
		want []string // field paths, in order; none: valid
	}{
		{"off by default", defaultDiscovery().Kubernetes, nil},
		{"plain pods on a port", Kubernetes{Enabled: true, Selector: "app=sglang", Port: 30000, Scheme: "http"}, nil},
		{"pd pods on a named port", Kubernetes{Enabled: true, PrefillSelector: "role=prefill", DecodeSelector: "role=decode", PortName: "http", Scheme: "http"}, nil},
		{"no selector", Kubernetes{Enabled: true, Port: 1, Scheme: "http"}, []string{"discovery.kubernetes.selector"}},
		{"no port", Kubernetes{Enabled: true, Selector: "a=b", Scheme: "http"}, []string{"discovery.kubernetes.port"}},
		{"both ports", Kubernetes{Enabled: true, Selector: "a=b", Port: 8000, PortName: "http", Scheme: "http"}, []string{"discovery.kubernetes.port_name"}},
		{"bad selectors", Kubernetes{Enabled: true, Selector: "a==b==c", PrefillSelector: "x in (", DecodeSelector: "!!", Port: 1, Scheme: "http"},
			[]string{"discovery.kubernetes.selector", "discovery.kubernetes.prefill_selector", "discovery.kubernetes.decode_selector"}},
		{"bad port and scheme", Kubernetes{Selector: "a=b", Port: 70000, Scheme: "grpc"}, []string{"discovery.kubernetes.port", "discovery.kubernetes.scheme"}},
		{"vllm needs a model label", Kubernetes{Enabled: true, Selector: "a=b", Port: 8000, Scheme: "http", Flavor: FlavorVLLM}, []string{"discovery.kubernetes.model_label"}},
		{"unknown flavor", Kubernetes{Selector: "a=b", Scheme: "http", Flavor: "tgi"}, []string{"discovery.kubernetes.flavor"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Default()
			cfg.Discovery.Kubernetes = tt.k
			var got []string
			for _, e := range fieldErrors(cfg.Validate()) {
				got = append(got, e.Path)
			}
			if strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Errorf("problems at %v, want %v (%v)", got, tt.want, cfg.Validate())
			}
		})
	}
}
