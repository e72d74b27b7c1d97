package config

import (
	"flag"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// TestFlagKeysCoverEveryFlag fails when a flag is added without telling FlagKeys (and so
// the configuration reference) which keys it sets, or when FlagKeys names a flag that
// does not exist.
func TestFlagKeysCoverEveryFlag(t *testing.T) {
	notKeys := map[string]bool{"compat": true, "config": true, "set": true, "worker-urls": true, "model": true, "filter": true, "affinity-mode": true}
	listed := map[string]bool{}
	for _, fk := range FlagKeys() {
		listed[fk.Flag] = true
	}
	defined := map[string]bool{}
	newFlagSet(&cliOptions{}).VisitAll(func(f *flag.Flag) {
		defined[f.Name] = true
		if !listed[f.Name] && !notKeys[f.Name] {
			t.Errorf("--%s is neither in FlagKeys nor known to set no key", f.Name)
		}
	})
	for name := range listed {
		if !defined[name] {
			t.Errorf("FlagKeys lists --%s, which is not defined", name)
		}
	}
}

// TestFlagKeysSetTheirKeys loads a configuration with each flag of FlagKeys and checks
// that the flag set every key FlagKeys says it sets.
func TestFlagKeysSetTheirKeys(t *testing.T) {
	file := writeFile(t, "c.yaml", `
models:
  m:
    policies: {plain: {type: random}, prefill: {type: random}, decode: {type: random}}
    buckets:
      - id: a
        groups: {plain: {policy: {type: random}}}
      - id: b
        groups: {pd: {prefill: {policy: {type: random}}, decode: {policy: {type: random}}}}
`)
	for _, fk := range FlagKeys() {
		t.Run(fk.Flag+"/"+fk.Key, func(t *testing.T) {
			value := "7"
			switch fk.Flag {
			case "policy", "prefill-policy", "decode-policy":
				value = PolicyLoadBased
			default:
				if segs := strings.Split(fk.Key, "."); !strings.Contains(fk.Key, "<") && !strings.Contains(fk.Key, "[]") {
					_, typ, ferr := schemaLeaf(segs)
					if ferr != nil {
						t.Fatalf("schemaLeaf(%s): %v", fk.Key, ferr)
					}
					if typ == durationType {
						value = "7s"
					} else if typ.Kind() == reflect.String {
						value = "x7"
					}
				}
			}
			cfg, err := Load([]string{"--config", file, "--" + fk.Flag, value}, nil)
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			got := valuesAt(reflect.ValueOf(cfg).Elem(), strings.Split(fk.Key, "."))
			if len(got) == 0 {
				t.Fatalf("%s: no such key in the loaded configuration", fk.Key)
			}
			for _, v := range got {
				if s := fmt.Sprint(v.Interface()); s != value {
					t.Errorf("%s = %s after --%s %s", fk.Key, s, fk.Flag, value)
				}
			}
		})
	}
}

// valuesAt returns the non-nil values at a FlagKey path: "<name>" walks every map entry,
// a "[]" suffix every list element; pointers are followed.
func valuesAt(v reflect.Value, segs []string) []reflect.Value {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return nil
		}
		v = v.Elem()
	}
	if len(segs) == 0 {
		return []reflect.Value{v}
	}
	seg, rest := segs[0], segs[1:]
	if seg == "<name>" {
		var out []reflect.Value
		for _, k := range v.MapKeys() {
			out = append(out, valuesAt(v.MapIndex(k), rest)...)
		}
		return out
	}
	name, list := strings.CutSuffix(seg, "[]")
	f := v.Field(fieldIndex(v.Type())[name])
	if !list {
		return valuesAt(f, rest)
	}
	var out []reflect.Value
	for i := range f.Len() {
		out = append(out, valuesAt(f.Index(i), rest)...)
	}
	return out
}
