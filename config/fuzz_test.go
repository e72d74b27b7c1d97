package config

import (
	"os"
	"strings"
	"testing"
)

// FuzzDecode feeds arbitrary bytes to Decode as YAML or JSON. Decode must never panic
// and must return either a Config or an error; a decoded Config must survive Validate
// and EffectivePolicy for each of its groups. The seed corpus is in
// testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	for _, file := range []struct {
		path   string
		isJSON bool
	}{{"testdata/example.yaml", false}, {"testdata/example.json", true}} {
		data, err := os.ReadFile(file.path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, file.isJSON)
	}
	f.Fuzz(func(t *testing.T, data []byte, isJSON bool) {
		format := FormatYAML
		if isJSON {
			format = FormatJSON
		}
		cfg, err := Decode(data, format)
		if (cfg == nil) == (err == nil) {
			t.Fatalf("Decode returned config %v and error %v; want exactly one", cfg != nil, err)
		}
		if err != nil {
			return
		}
		_ = cfg.Validate()
		for name, m := range cfg.Models {
			for _, b := range m.Buckets {
				if g := b.Groups.Plain; g != nil {
					_ = cfg.EffectivePolicy(name, RolePlain, g)
				}
				if pd := b.Groups.PD; pd != nil {
					_ = cfg.EffectivePolicy(name, RolePrefill, pd.Prefill)
					_ = cfg.EffectivePolicy(name, RoleDecode, pd.Decode)
				}
			}
		}
	})
}

// FuzzCompatCommandLine feeds arbitrary argument lists (NUL-separated) to sgl-router's
// command line: parsing never panics, and what parses loads (with a model) or fails with
// errors that name what is wrong.
func FuzzCompatCommandLine(f *testing.F) {
	for _, s := range []string{
		"--worker-urls\x00http://127.0.0.1:1\x00http://127.0.0.1:2\x00--policy\x00cache_aware",
		"--pd-disaggregation\x00--prefill\x00http://127.0.0.1:1\x009001\x00--decode\x00http://127.0.0.1:2",
		"--max-concurrent-requests\x00-1\x00--retry-max-retries=3\x00--worker-urls=http://a:1,http://b:2",
		"--prefill\x00http://x\x00none\x00extra\x00--dp-aware\x00--help",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		args := append([]string{"--compat", CompatSGLRouter}, strings.Split(s, "\x00")...)
		cl, err := ParseCommandLine(args)
		if err != nil {
			for _, fe := range fieldErrors(err) {
				if fe.Msg == "" {
					t.Fatalf("an error without a message: %v", err)
				}
			}
			return
		}
		if len(cl.NeedsModel()) > 0 {
			cl.SetModel("m")
		}
		if cfg, err := cl.Load(nil); err == nil {
			_ = cfg.Validate()
		}
	})
}
