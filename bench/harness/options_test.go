package harness

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"switchyard/bench/workload"
	"switchyard/config"
)

func TestParsePolicies(t *testing.T) {
	tests := []struct {
		name    string
		list    string
		want    []PolicySpec
		wantErr []string
	}{
		{name: "names", list: "round_robin, power_of_two", want: []PolicySpec{
			{Name: "round_robin", Policy: config.Policy{Type: "round_robin"}},
			{Name: "power_of_two", Policy: config.Policy{Type: "power_of_two"}}}},
		{name: "sticky fallback", list: "sticky,sticky:power_of_two", want: []PolicySpec{
			{Name: "sticky", Policy: config.Policy{Type: "sticky"}},
			{Name: "sticky:power_of_two", Policy: config.Policy{Type: "sticky", Fallback: "power_of_two"}}}},
		{name: "cache_aware source", list: "cache_aware,cache_aware:approximate", want: []PolicySpec{
			{Name: "cache_aware", Policy: config.Policy{Type: "cache_aware"}},
			{Name: "cache_aware:approximate", Policy: config.Policy{Type: "cache_aware"}, CacheSource: "approximate"}}},
		{name: "cache_aware decision", list: "cache_aware:threshold,cache_aware:latency", want: []PolicySpec{
			{Name: "cache_aware:threshold", Policy: config.Policy{Type: "cache_aware"}, CacheDecision: "threshold"},
			{Name: "cache_aware:latency", Policy: config.Policy{Type: "cache_aware"}, CacheDecision: "latency"}}},
		{name: "bad cache source", list: "cache_aware:remote", wantErr: []string{"cache_aware takes a source"}},
		{name: "unknown and duplicate", list: "fused_score,random,random,random:x", wantErr: []string{`unknown policy "fused_score"`, `"random" listed twice`, "only sticky takes a fallback"}},
		{name: "empty", list: " , ", wantErr: []string{"empty list"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePolicies(tt.list)
			if len(tt.wantErr) > 0 {
				if !errors.Is(err, ErrInvalidOptions) {
					t.Fatalf("err = %v", err)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error lacks %q: %v", w, err)
					}
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Errorf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
	// The defaults cover every policy the configuration knows.
	var names []string
	for _, p := range DefaultPolicies() {
		names = append(names, p.Policy.Type)
	}
	for _, want := range []string{config.PolicyRoundRobin, config.PolicyRandom, config.PolicyPowerOfTwo, config.PolicyLoadBased,
		config.PolicyCacheAware, config.PolicySessionAware, config.PolicySticky} {
		if !slices.Contains(names, want) {
			t.Errorf("DefaultPolicies lacks %s", want)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want []string
	}{
		{"defaults", Options{}, nil},
		{"every scenario", Options{Scenarios: Scenarios(), ReplicaCommand: []string{"switchyard", "serve"}}, nil},
		{"replicas without a router command", Options{Scenarios: []string{"replicas"}, Replicas: 1},
			[]string{"replicas: 1 is outside 2..16", "replica_command: the replicas scenario needs the command"}},
		{"bad values", Options{Scenarios: []string{"nope"}, Engines: -1, Speedup: -2, Duration: -1, Rate: -1, Workloads: []string{"x"}, MailboxSizes: []int{0}},
			[]string{`unknown scenario "nope"`, "engines", "speedup", "duration", "rate", `unknown workload "x"`, "mailbox_sizes"}},
		{"target with engines of its own", Options{Target: "http://127.0.0.1:1", Scenarios: []string{"overhead"}}, []string{"cannot run against --target"}},
		{"target not a URL", Options{Target: "127.0.0.1:1"}, []string{"not an http(s) URL"}},
		{"heterogeneous vllm fleet", Options{Flavors: []string{"vllm", "sglang"}, Engines: 2, EngineSpeeds: []float64{1, 0.2}}, nil},
		{"bad speeds and flavors", Options{Flavors: []string{"tgi", "vllm", "vllm"}, Engines: 3, EngineSpeeds: []float64{1, 0}},
			[]string{"2 speeds for 3 engines", "0 is outside (0, 100]", `unknown flavor "tgi"`, `"vllm" listed twice`}},
		{"buckets need an engine per class", Options{Scenarios: []string{"buckets"}, Engines: 2}, []string{"one engine per length class"}},
		{"cache too small for the long mix", Options{Scenarios: []string{"buckets"}, EngineCache: 8192}, []string{"cannot hold the long-context mix"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.opts.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidOptions) {
				t.Fatalf("err = %v", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
		})
	}
}

func TestAllocateEngines(t *testing.T) {
	def := workload.DefaultLengthClasses()
	tests := []struct {
		name    string
		n       int
		classes []workload.LengthClass
		want    []int
	}{
		// Token shares of the defaults: short 0.7×896, medium 0.2×4608, long 0.1×18432.
		{"defaults on 4", 4, def, []int{1, 1, 2}},
		{"defaults on 3", 3, def, []int{1, 1, 1}},
		{"defaults on 10", 10, def, []int{2, 3, 5}},
		{"equal classes", 7, []workload.LengthClass{{Min: 1, Max: 1, Weight: 1}, {Min: 1, Max: 1, Weight: 1}}, []int{4, 3}},
		{"zero weights", 4, []workload.LengthClass{{Min: 1, Max: 1}, {Min: 1, Max: 1}}, []int{3, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := allocateEngines(tt.n, tt.classes)
			sum := 0
			for _, v := range got {
				sum += v
			}
			if !slices.Equal(got, tt.want) || sum != tt.n {
				t.Errorf("allocateEngines(%d) = %v, want %v", tt.n, got, tt.want)
			}
		})
	}
}
