package config

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
)

// Discovery configures the sources of workers beyond workers[] and the admin API (the
// "discovery" section).
type Discovery struct {
	// Kubernetes discovers engines from the pods of a Kubernetes cluster.
	Kubernetes Kubernetes `koanf:"kubernetes" json:"kubernetes"`
}

// Kubernetes configures the discovery of engines from Kubernetes pods: a pod that a selector
// matches becomes a worker of that selector's role while it is Running and Ready, and leaves
// the fleet when it is deleted, stops being ready or stops matching.
type Kubernetes struct {
	// Enabled turns discovery on. Default false.
	Enabled bool `koanf:"enabled" json:"enabled"`
	// Kubeconfig is the path of a kubeconfig file; empty uses the in-cluster configuration
	// (the pod's service account). Default: none.
	Kubeconfig string `koanf:"kubeconfig" json:"kubeconfig"`
	// Namespace is the namespace whose pods are watched; empty watches every namespace (a
	// ClusterRole is then needed). Default: none (every namespace).
	Namespace string `koanf:"namespace" json:"namespace"`
	// Selector is the label selector of plain engine pods ("app=sglang,tier in (a,b)");
	// empty discovers no plain engine. Default: none.
	Selector string `koanf:"selector" json:"selector"`
	// PrefillSelector is the label selector of prefill engine pods; empty discovers none.
	// Default: none.
	PrefillSelector string `koanf:"prefill_selector" json:"prefill_selector"`
	// DecodeSelector is the label selector of decode engine pods; empty discovers none.
	// Default: none.
	DecodeSelector string `koanf:"decode_selector" json:"decode_selector"`
	// Port is the engines' HTTP port on the pod IP, 1..65535; 0 takes the container port
	// named port_name. Default 0.
	Port int `koanf:"port" json:"port" unit:"port"`
	// PortName is the name of the container port engines serve on, used when port is 0.
	// Default: none.
	PortName string `koanf:"port_name" json:"port_name"`
	// Scheme is http or https. Default "http".
	Scheme string `koanf:"scheme" json:"scheme"`
	// ModelLabel is the pod label whose value is the served model name; empty, or a pod
	// without the label, learns the model from introspection (/server_info). Default: none.
	ModelLabel string `koanf:"model_label" json:"model_label"`
	// BootstrapPortAnnotation is the pod annotation holding a prefill engine's PD bootstrap
	// port; a pod without it learns the port from introspection. Default
	// "sglang.ai/bootstrap-port".
	BootstrapPortAnnotation string `koanf:"bootstrap_port_annotation" json:"bootstrap_port_annotation"`
	// Flavor is the discovered engines' kind: auto, sglang or vllm (as workers[].flavor; a
	// vllm engine has no introspection, so model_label is required). Default auto.
	Flavor string `koanf:"flavor" json:"flavor"`
}

// Selectors returns the configured selectors by role, the unset ones left out.
func (k *Kubernetes) Selectors() map[Role]string {
	out := map[Role]string{}
	for role, s := range map[Role]string{RolePlain: k.Selector, RolePrefill: k.PrefillSelector, RoleDecode: k.DecodeSelector} {
		if strings.TrimSpace(s) != "" {
			out[role] = s
		}
	}
	return out
}

// DefaultBootstrapPortAnnotation is the default discovery.kubernetes.bootstrap_port_annotation.
const DefaultBootstrapPortAnnotation = "sglang.ai/bootstrap-port"

func defaultDiscovery() Discovery {
	return Discovery{Kubernetes: Kubernetes{
		Scheme:                  "http",
		BootstrapPortAnnotation: DefaultBootstrapPortAnnotation,
		Flavor:                  FlavorAuto,
	}}
}

func (c *Config) validateDiscovery(p *problems) {
	k := c.Discovery.Kubernetes
	const path = "discovery.kubernetes"
	for _, s := range []struct{ key, v string }{
		{"selector", k.Selector}, {"prefill_selector", k.PrefillSelector}, {"decode_selector", k.DecodeSelector},
	} {
		if strings.TrimSpace(s.v) == "" {
			continue
		}
		if _, err := labels.Parse(s.v); err != nil {
			p.add(path+"."+s.key, ErrInvalid, fmt.Sprintf("invalid label selector %q: %v", s.v, err))
		}
	}
	if k.Port < 0 || k.Port > 65535 {
		p.add(path+".port", ErrInvalid, fmt.Sprintf("must be in 0..65535, got %d", k.Port))
	}
	if k.Scheme != "http" && k.Scheme != "https" {
		p.add(path+".scheme", ErrInvalid, fmt.Sprintf("unknown scheme %q (http or https)", k.Scheme))
	}
	switch k.Flavor {
	case FlavorAuto, FlavorSGLang, "":
	case FlavorVLLM:
		if k.Enabled && k.ModelLabel == "" {
			p.add(path+".model_label", ErrInvalid, "required with flavor vllm: a vLLM engine has no introspection to name its model")
		}
	default:
		p.add(path+".flavor", ErrInvalid, fmt.Sprintf("unknown flavor %q (auto, sglang or vllm)", k.Flavor))
	}
	if !k.Enabled {
		return
	}
	if len(k.Selectors()) == 0 {
		p.add(path+".selector", ErrInvalid, "discovery is enabled but selector, prefill_selector and decode_selector are all empty")
	}
	if k.Port == 0 && k.PortName == "" {
		p.add(path+".port", ErrInvalid, "discovery is enabled: set port, or port_name to take a named container port")
	}
	if k.Port != 0 && k.PortName != "" {
		p.add(path+".port_name", ErrInvalid, fmt.Sprintf("set port (%d) or port_name (%q), not both", k.Port, k.PortName))
	}
}
