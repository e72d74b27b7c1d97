package config

import (
	"strconv"
	"strings"
	"testing"
)

// TestValidateSLOAndCompatibility covers the SLO targets, the bucket order, worker labels
// and the prefill/decode compatibility rule, including the pairs that can never form.
func TestValidateSLOAndCompatibility(t *testing.T) {
	pd := func(c *Config, i int) *PDGroups { return bucket(c, "llama", i).Groups.PD }
	label := func(c *Config, id string, kv ...string) {
		for i := range c.Workers {
			if c.Workers[i].ID == id {
				if c.Workers[i].Labels == nil {
					c.Workers[i].Labels = map[string]string{}
				}
				for j := 0; j+1 < len(kv); j += 2 {
					c.Workers[i].Labels[kv[j]] = kv[j+1]
				}
			}
		}
	}
	setModel := func(c *Config, name string, f func(m *Model)) {
		m := c.Models[name]
		f(&m)
		c.Models[name] = m
	}
	tests := []struct {
		name   string
		mutate func(c *Config)
		want   []string
	}{
		{name: "targets and slo order", mutate: func(c *Config) {
			setModel(c, "llama", func(m *Model) {
				m.SLO = SLO{TTFTMs: ptr(250.0), TPOTMs: ptr(12.5)}
				m.BucketOrder = BucketOrderSLO
			})
			setModel(c, "qwen", func(m *Model) { m.BucketOrder = BucketOrderCapacity })
		}},
		{name: "bad targets and order", mutate: func(c *Config) {
			setModel(c, "llama", func(m *Model) {
				m.SLO = SLO{TTFTMs: ptr(0.0), TPOTMs: ptr(2e7)}
				m.BucketOrder = "fastest"
			})
		}, want: []string{
			"models.llama.slo.ttft_ms: must be more than 0 and at most 10000000 milliseconds, got 0",
			"models.llama.slo.tpot_ms: must be more than 0 and at most 10000000 milliseconds, got 2e+07",
			`models.llama.bucket_order: unknown order "fastest" (capacity or slo)`,
		}},
		{name: "compatible labels", mutate: func(c *Config) {
			label(c, "P1", LabelTransferBackend, "nixl", "zone", "a")
			label(c, "D1", LabelTransferBackend, "nixl", "zone", "a")
			pd(c, 0).Compatibility = []string{LabelTransferBackend, "zone"}
		}},
		{name: "introspected label unset on one side may still pair", mutate: func(c *Config) {
			label(c, "P1", LabelTransferBackend, "nixl")
			pd(c, 0).Compatibility = []string{LabelTransferBackend, LabelPageSize}
		}},
		{name: "one compatible pair among several is enough", mutate: func(c *Config) {
			// The long bucket's groups take every PD worker of llama.
			pd(c, 1).Prefill.WorkerIDs, pd(c, 1).Decode.WorkerIDs = nil, nil
			label(c, "P1", LabelTransferBackend, "nixl")
			label(c, "P2", LabelTransferBackend, "mooncake")
			label(c, "D1", LabelTransferBackend, "mooncake")
			label(c, "D2", LabelTransferBackend, "mooncake")
			pd(c, 1).Compatibility = []string{LabelTransferBackend}
		}},
		{name: "transfer backends never match", mutate: func(c *Config) {
			label(c, "P1", LabelTransferBackend, "nixl")
			label(c, "D1", LabelTransferBackend, "mooncake")
			pd(c, 0).Compatibility = []string{LabelTransferBackend}
		}, want: []string{
			"models.llama.buckets[0].groups.pd.compatibility: no prefill member can ever pair with a decode member: " +
				"prefill P1 (transfer_backend=nixl); decode D1 (transfer_backend=mooncake)",
		}},
		{name: "a configuration-only label unset on one side", mutate: func(c *Config) {
			label(c, "D2", "zone", "b")
			pd(c, 1).Compatibility = []string{"zone"}
		}, want: []string{
			"models.llama.buckets[1].groups.pd.compatibility: no prefill member can ever pair with a decode member: " +
				"prefill P2 (zone unset); decode D2 (zone=b)",
		}},
		{name: "a vllm worker introspects nothing", mutate: func(c *Config) {
			label(c, "P1", LabelTransferBackend, "nixl")
			c.Workers[1].Flavor = FlavorVLLM // D1
			pd(c, 0).Compatibility = []string{LabelTransferBackend}
		}, want: []string{
			"models.llama.buckets[0].groups.pd.compatibility: no prefill member can ever pair with a decode member: " +
				"prefill P1 (transfer_backend=nixl); decode D1 (transfer_backend unset)",
		}},
		{name: "too many labels", mutate: func(c *Config) {
			for i := range MaxLabels + 1 {
				label(c, "Q1", "l"+strconv.Itoa(i), "v")
			}
		}, want: []string{"workers[2].labels: 65 labels, more than 64"}},
		{name: "groups of admin-API workers are not judged", mutate: func(c *Config) {
			pd(c, 0).Prefill.WorkerIDs = &[]string{}
			pd(c, 0).Compatibility = []string{"zone"}
			label(c, "D1", "zone", "b")
		}},
		{name: "bad compatibility names and labels", mutate: func(c *Config) {
			pd(c, 0).Compatibility = []string{"zone", "", "zone", "a b"}
			label(c, "P1", "", "x", "ok", strings.Repeat("v", 300))
		}, want: []string{
			`workers[0].labels[""]: label name must not be empty`,
			"workers[0].labels.ok: value is 300 bytes long, more than 256",
			"models.llama.buckets[0].groups.pd.compatibility[1]: label name must not be empty",
			`models.llama.buckets[0].groups.pd.compatibility[2]: duplicate label "zone" (also compatibility[0])`,
			`models.llama.buckets[0].groups.pd.compatibility[3]: label name "a b" holds ' ' (use letters, digits, '_', '-', '.' or '/')`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validBase()
			tt.mutate(c)
			if got := errLines(c.Validate()); !equalLines(got, tt.want) {
				t.Fatalf("Validate() =\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
		})
	}
}

func TestDecodeSLOAndLabels(t *testing.T) {
	c := mustDecodeYAML(t, `
workers:
  - {id: P1, url: "http://127.0.0.1:1", model: m, role: prefill, labels: {transfer_backend: nixl, zone: a}}
  - {id: D1, url: "http://127.0.0.1:2", model: m, role: decode, labels: {zone: a}}
models:
  m:
    bucket_order: slo
    slo: {ttft_ms: 200, tpot_ms: 7.5}
    buckets:
      - id: b
        groups:
          pd:
            prefill: {}
            decode: {}
            compatibility: [transfer_backend, zone]
`)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	m := c.Models["m"]
	if m.BucketOrder != BucketOrderSLO || *m.SLO.TTFTMs != 200 || *m.SLO.TPOTMs != 7.5 {
		t.Fatalf("model %+v", m)
	}
	if got := m.Buckets[0].Groups.PD.Compatibility; len(got) != 2 || got[1] != "zone" {
		t.Fatalf("compatibility %v", got)
	}
	if c.Workers[0].Labels["transfer_backend"] != "nixl" || c.Workers[1].Labels["zone"] != "a" {
		t.Fatalf("labels %v %v", c.Workers[0].Labels, c.Workers[1].Labels)
	}
	// A label value must be a string.
	_, err := Decode([]byte(`
workers:
  - {id: P1, url: "http://127.0.0.1:1", model: m, role: prefill, labels: {tp_size: 2}}
`), FormatYAML)
	if err == nil || !strings.Contains(err.Error(), "workers[0].labels.tp_size") {
		t.Fatalf("numeric label value: %v", err)
	}
}
