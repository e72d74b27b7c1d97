package config

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
)

// This file holds the strict decoder: it maps the nested tree koanf merges from a file,
// the environment and flags onto a Config that already holds the defaults. Every key must
// be part of the schema and every value must have its key's type; each problem is
// reported with its full path (models.llama.buckets[0].groups.pd.prefill.policy.admission.x).
//
// Rules:
//   - A mapping fills a struct key by key: keys that are absent keep their current value
//     (the default).
//   - null leaves a scalar or struct key unchanged, and sets a pointer, list or map key to
//     nil: `worker_ids: null` is the same as no worker_ids, `worker_ids: []` is an empty
//     list, and `limits: {max: null}` is unbounded.
//   - A list or a map replaces the current one; list elements and map values start from
//     their type's default (a worker starts as role plain, DP size 1).
//   - Durations are strings in time.ParseDuration form ("500ms", "5s", "1m"); a bare number
//     is rejected rather than read as nanoseconds.
//   - Integers accept integral numbers in range (JSON numbers arrive as floats); strings are
//     never converted to numbers in files.

var (
	durationType = reflect.TypeFor[time.Duration]()
	workerType   = reflect.TypeFor[Worker]()
	configType   = reflect.TypeFor[Config]()
)

// decodeTree decodes tree onto dst, reporting every problem.
func decodeTree(dst *Config, tree map[string]any) error {
	var p problems
	decodeValue(&p, "", tree, reflect.ValueOf(dst).Elem())
	return p.err()
}

func decodeValue(p *problems, path string, src any, dst reflect.Value) {
	t := dst.Type()
	if t == durationType {
		if src == nil {
			return
		}
		s, ok := src.(string)
		if !ok {
			p.add(path, ErrType, `expected a duration string such as "5s", got `+describe(src))
			return
		}
		d, err := parseDuration(s)
		if err != nil {
			p.add(path, ErrType, err.Error())
			return
		}
		dst.SetInt(int64(d))
		return
	}
	switch t.Kind() {
	case reflect.Pointer:
		if src == nil {
			dst.SetZero()
			return
		}
		v := reflect.New(t.Elem())
		if !dst.IsNil() {
			v.Elem().Set(dst.Elem())
		}
		decodeValue(p, path, src, v.Elem())
		dst.Set(v)
	case reflect.Struct:
		if src == nil {
			return
		}
		m, ok := asMap(src)
		if !ok {
			p.add(path, ErrType, "expected a mapping, got "+describe(src))
			return
		}
		fields := fieldIndex(t)
		for _, k := range sortedKeys(m) {
			kpath := joinKey(path, k)
			i, ok := fields[k]
			if !ok {
				p.add(kpath, ErrUnknownKey, "unknown key")
				continue
			}
			decodeValue(p, kpath, m[k], dst.Field(i))
		}
	case reflect.Slice:
		if src == nil {
			dst.SetZero()
			return
		}
		list, ok := src.([]any)
		if !ok {
			p.add(path, ErrType, "expected a list, got "+describe(src))
			return
		}
		out := reflect.MakeSlice(t, len(list), len(list))
		for i, item := range list {
			ipath := joinIndex(path, i)
			if item == nil && t.Elem().Kind() != reflect.Pointer {
				p.add(ipath, ErrType, "expected "+expected(t.Elem())+", got null")
				continue
			}
			el := out.Index(i)
			if t.Elem() == workerType {
				el.Set(reflect.ValueOf(defaultWorker()))
			}
			decodeValue(p, ipath, item, el)
		}
		dst.Set(out)
	case reflect.Map:
		if src == nil {
			dst.SetZero()
			return
		}
		m, ok := asMap(src)
		if !ok {
			p.add(path, ErrType, "expected a mapping, got "+describe(src))
			return
		}
		out := reflect.MakeMapWithSize(t, len(m))
		for _, k := range sortedKeys(m) {
			el := reflect.New(t.Elem()).Elem()
			decodeValue(p, joinKey(path, k), m[k], el)
			out.SetMapIndex(reflect.ValueOf(k).Convert(t.Key()), el)
		}
		dst.Set(out)
	case reflect.String:
		if src == nil {
			return
		}
		s, ok := src.(string)
		if !ok {
			p.add(path, ErrType, "expected a string, got "+describe(src)+" (quote it)")
			return
		}
		dst.SetString(s)
	case reflect.Bool:
		if src == nil {
			return
		}
		b, ok := src.(bool)
		if !ok {
			p.add(path, ErrType, "expected true or false, got "+describe(src))
			return
		}
		dst.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if src == nil {
			return
		}
		n, ok := toInt64(src)
		if !ok || dst.OverflowInt(n) {
			p.add(path, ErrType, "expected an integer, got "+describe(src))
			return
		}
		dst.SetInt(n)
	case reflect.Float32, reflect.Float64:
		if src == nil {
			return
		}
		f, ok := toFloat64(src)
		if !ok || math.IsNaN(f) || math.IsInf(f, 0) {
			p.add(path, ErrType, "expected a finite number, got "+describe(src))
			return
		}
		dst.SetFloat(f)
	default:
		panic("BUG: config: unsupported field type " + t.String() + " at " + path)
	}
}

// parseDuration parses a duration in time.ParseDuration form.
func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf(`invalid duration %q (use a form such as "500ms", "5s" or "1m")`, s)
	}
	return d, nil
}

// fieldIndex maps each koanf tag of struct type t to its field index.
func fieldIndex(t reflect.Type) map[string]int {
	out := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		if name := tagName(t.Field(i)); name != "" {
			out[name] = i
		}
	}
	return out
}

// FieldKey returns the configuration key of a field of Config or of one of its sections
// (its koanf tag), or "" for a field outside the schema.
func FieldKey(f reflect.StructField) string { return tagName(f) }

// tagName is a field's koanf key, or "" for fields outside the schema.
func tagName(f reflect.StructField) string {
	if !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(f.Tag.Get("koanf"), ",")
	if name == "-" {
		return ""
	}
	return name
}

// asMap accepts the two map shapes YAML and JSON decoders produce.
func asMap(v any) (map[string]any, bool) {
	switch m := v.(type) {
	case map[string]any:
		return m, true
	case map[any]any:
		out := make(map[string]any, len(m))
		for k, v := range m {
			out[fmt.Sprint(k)] = v
		}
		return out, true
	}
	return nil, false
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// joinKey appends a key to a path: "a.b", or `a["odd key"]` when the key holds
// characters other than letters, digits, '_' and '-' (model names such as
// "meta-llama/Llama-3.1-8B").
func joinKey(path, key string) string {
	if !plainKey(key) {
		return path + "[" + strconv.Quote(key) + "]"
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

func plainKey(key string) bool {
	if key == "" {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func joinIndex(path string, i int) string {
	return path + "[" + strconv.Itoa(i) + "]"
}

// describe names a decoded value for an error message.
func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		if len(x) > 40 {
			x = x[:40] + "..."
		}
		return "string " + strconv.Quote(x)
	case bool:
		return "boolean " + strconv.FormatBool(x)
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, float32, float64:
		return fmt.Sprintf("number %v", x)
	case []any:
		return "a list"
	case map[string]any, map[any]any:
		return "a mapping"
	case time.Time:
		return "timestamp " + x.Format(time.RFC3339)
	}
	return fmt.Sprintf("a value of type %T", v)
}

// expected names the kind of value type t takes.
func expected(t reflect.Type) string {
	if t == durationType {
		return "a duration"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return expected(t.Elem())
	case reflect.Struct, reflect.Map:
		return "a mapping"
	case reflect.Slice:
		return "a list"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Float32, reflect.Float64:
		return "a number"
	default:
		return "an integer"
	}
}

func toInt64(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint:
		return int64(x), uint64(x) <= math.MaxInt64
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint64:
		return int64(x), x <= math.MaxInt64
	case float32:
		return floatToInt64(float64(x))
	case float64:
		return floatToInt64(x)
	}
	return 0, false
}

func floatToInt64(f float64) (int64, bool) {
	// 2^63 is exactly representable; anything at or above it overflows int64.
	if f != math.Trunc(f) || f < -(1<<63) || f >= 1<<63 {
		return 0, false
	}
	return int64(f), true
}

func toFloat64(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case float32:
		return float64(x), true
	}
	if n, ok := toInt64(v); ok {
		return float64(n), true
	}
	if u, ok := v.(uint64); ok {
		return float64(u), true
	}
	return 0, false
}

// schemaLeaf resolves a key path given as segments (from the environment or --set)
// against the schema. It returns the canonical path and the scalar type to convert the
// value to. Lists cannot be addressed; sections are not keys.
func schemaLeaf(segs []string) (string, reflect.Type, *FieldError) {
	t := configType
	path := ""
	for _, seg := range segs {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch {
		case t != durationType && t.Kind() == reflect.Struct:
			i, ok := fieldIndex(t)[seg]
			if !ok {
				return "", nil, &FieldError{Path: joinKey(path, seg), Msg: "unknown key", Kind: ErrUnknownKey}
			}
			path = joinKey(path, seg)
			t = t.Field(i).Type
		case t.Kind() == reflect.Map:
			path = joinKey(path, seg)
			t = t.Elem()
		case t.Kind() == reflect.Slice:
			return "", nil, &FieldError{Path: path, Msg: "is a list; set it in the config file", Kind: ErrInvalid}
		default:
			return "", nil, &FieldError{Path: joinKey(path, seg), Msg: "unknown key", Kind: ErrUnknownKey}
		}
	}
	leaf := t
	for leaf.Kind() == reflect.Pointer {
		leaf = leaf.Elem()
	}
	switch {
	case path == "":
		return "", nil, &FieldError{Msg: "empty key", Kind: ErrUnknownKey}
	case leaf.Kind() == reflect.Slice:
		return "", nil, &FieldError{Path: path, Msg: "is a list; set it in the config file", Kind: ErrInvalid}
	case leaf != durationType && (leaf.Kind() == reflect.Struct || leaf.Kind() == reflect.Map):
		return "", nil, &FieldError{Path: path, Msg: "is a section, not a key; set the keys inside it", Kind: ErrInvalid}
	}
	return path, t, nil
}

// convertString converts the text of an environment variable or flag to the value the
// decoder expects for type t. An empty string unsets a pointer key.
func convertString(t reflect.Type, s string) (any, error) {
	if t.Kind() == reflect.Pointer {
		if s == "" {
			return nil, nil
		}
		return convertString(t.Elem(), s)
	}
	if t == durationType {
		if _, err := parseDuration(s); err != nil {
			return nil, err
		}
		return s, nil
	}
	switch t.Kind() {
	case reflect.String:
		return s, nil
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return nil, fmt.Errorf("expected true or false, got %q", s)
		}
		return b, nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, t.Bits())
		if err != nil {
			return nil, fmt.Errorf("expected an integer, got %q", s)
		}
		return n, nil
	case reflect.Float32, reflect.Float64:
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("expected a finite number, got %q", s)
		}
		return f, nil
	}
	panic("BUG: config: no string conversion for " + t.String())
}

// setNested stores v at segs in the nested map m, creating sections on the way.
func setNested(m map[string]any, segs []string, v any) {
	for _, s := range segs[:len(segs)-1] {
		next, ok := m[s].(map[string]any)
		if !ok {
			next = make(map[string]any)
			m[s] = next
		}
		m = next
	}
	m[segs[len(segs)-1]] = v
}
