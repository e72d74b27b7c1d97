package config

import (
	"reflect"
	"strings"
	"testing"
)

// TestSchemaKinds guards the decoder against a field type it cannot decode: every field
// carries a koanf tag and every leaf has a kind the decoder and the environment
// converter handle.
func TestSchemaKinds(t *testing.T) {
	seen := map[reflect.Type]bool{}
	var walk func(path string, typ reflect.Type, inList bool)
	walk = func(path string, typ reflect.Type, inList bool) {
		if typ == durationType {
			return
		}
		switch typ.Kind() {
		case reflect.Pointer:
			walk(path, typ.Elem(), inList)
		case reflect.Slice:
			walk(path+"[]", typ.Elem(), true)
		case reflect.Map:
			if typ.Key().Kind() != reflect.String {
				t.Errorf("%s: map key %s is not a string", path, typ.Key())
			}
			walk(path+".NAME", typ.Elem(), inList)
		case reflect.Struct:
			if seen[typ] && inList {
				return
			}
			seen[typ] = true
			for i := range typ.NumField() {
				f := typ.Field(i)
				name := tagName(f)
				if name == "" || !plainKey(name) || strings.ToLower(name) != name {
					t.Errorf("%s.%s: koanf tag %q is missing or not a lower-case key", path, f.Name, name)
					continue
				}
				walk(joinKey(path, name), f.Type, inList)
			}
		case reflect.String, reflect.Bool, reflect.Int, reflect.Int64, reflect.Float64:
			if inList || strings.Contains(path, "[]") {
				return
			}
			// Scalar keys outside lists must be settable from the environment.
			segs := strings.Split(strings.ReplaceAll(path, "NAME", "m"), ".")
			if _, leaf, ferr := schemaLeaf(segs); ferr != nil {
				t.Errorf("%s: schemaLeaf: %v", path, ferr)
			} else if _, err := convertString(leaf, sampleFor(leaf)); err != nil {
				t.Errorf("%s: convertString: %v", path, err)
			}
		default:
			t.Errorf("%s: unsupported kind %s", path, typ.Kind())
		}
	}
	walk("", configType, false)
}

func sampleFor(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == durationType {
		return "1s"
	}
	switch t.Kind() {
	case reflect.Bool:
		return "true"
	case reflect.String:
		return "x"
	}
	return "1"
}
