package config

import (
	"os"
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
