package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"switchyard/config"
)

const (
	configDir = "../.."
	reference = "../../../docs/config-reference.md"
)

func mustDocs(t *testing.T) map[string]typeDocs {
	t.Helper()
	docs, err := parseDocs(configDir)
	if err != nil {
		t.Fatal(err)
	}
	return docs
}

// TestReferenceUpToDate fails when docs/config-reference.md is not what the schema
// generates: a key, default, comment, unit or flag changed without `make docs`.
func TestReferenceUpToDate(t *testing.T) {
	err := run([]string{"-config", configDir, "-check", reference}, &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
}

func TestRunWritesAndChecks(t *testing.T) {
	out := filepath.Join(t.TempDir(), "ref.md")
	if err := run([]string{"-config", configDir, "-o", out}, &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	if err := run([]string{"-config", configDir}, &stdout, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	written, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(written, stdout.Bytes()) {
		t.Fatal("-o and standard output differ")
	}
	if err := run([]string{"-config", configDir, "-check", out}, &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
		t.Fatalf("-check on the file just written: %v", err)
	}

	stale := bytes.Replace(written, []byte("| `server.port` | integer | — | 8080 |"), []byte("| `server.port` | integer | — | 9090 |"), 1)
	if bytes.Equal(stale, written) {
		t.Fatal("the server.port row was not found")
	}
	if err := os.WriteFile(out, stale, 0o600); err != nil {
		t.Fatal(err)
	}
	err = run([]string{"-config", configDir, "-check", out}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "run `make docs`") || !strings.Contains(err.Error(), "9090") {
		t.Fatalf("-check on a stale page: got %v, want an error naming the line and `make docs`", err)
	}
	if err := run([]string{"-config", t.TempDir()}, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
		t.Fatal("a directory without the config source was accepted")
	}
}

// TestCommentsMustStateTheirDefault edits the parsed comments as a developer might get
// them wrong and checks that generation fails naming the field.
func TestCommentsMustStateTheirDefault(t *testing.T) {
	tests := []struct {
		name, typ, field, from, to, want string
	}{
		{"no default", "Server", "Port", "Default 8080.", "", "config.Server.Port (server.port): the comment states no default"},
		{"wrong integer", "Server", "Port", "Default 8080.", "Default 8081.", `config.Server.Port (server.port): the comment says the default is "8081", config.Default holds 8080`},
		{"wrong size", "Server", "MaxBodyBytes", "Default 32 MiB.", "Default 16 MiB.", "config.Server.MaxBodyBytes (server.max_body_bytes): the comment says"},
		{"wrong duration", "Health", "Interval", "Default 5s.", "Default 10s.", "config.Health.Interval (health.interval): the comment says"},
		{"unreadable duration", "Health", "Interval", "Default 5s.", "Default five seconds.", `cannot read the default "five seconds" as a duration`},
		{"no comment in a list", "Worker", "URL", "", "", "config.Worker.URL (workers[].url): no doc comment"},
		{"no default in a map", "Tokenizer", "ForwardInputIDs", "Default false.", "", "config.Tokenizer.ForwardInputIDs (models.<name>.tokenizer.forward_input_ids): the comment states no default"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			docs := mustDocs(t)
			td := docs[tt.typ]
			fields := map[string]string{}
			for k, v := range td.fields {
				fields[k] = v
			}
			if tt.from == "" {
				fields[tt.field] = ""
			} else {
				if !strings.Contains(fields[tt.field], tt.from) {
					t.Fatalf("config.%s.%s comment %q lacks %q", tt.typ, tt.field, fields[tt.field], tt.from)
				}
				fields[tt.field] = strings.Replace(fields[tt.field], tt.from, tt.to, 1)
			}
			td.fields = fields
			docs[tt.typ] = td
			_, err := generate(docs)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("generate: got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestCheckDefault(t *testing.T) {
	tests := []struct {
		stated  string
		v       any
		wantErr bool
	}{
		{"8080", 8080, false},
		{"8080", 8081, true},
		{"4,000,000", int64(4_000_000), false},
		{"32 MiB", int64(32 << 20), false},
		{"64 KiB (when absent)", int64(64 << 10), false},
		{"32 MiB", int64(32), true},
		{"16384 (about 9 MiB)", 16384, false},
		{"600s", 10 * time.Minute, false},
		{"1h", time.Hour, false},
		{"500ms", time.Second, true},
		{`"127.0.0.1"`, "127.0.0.1", false},
		{"info", "info", false},
		{"info", "debug", true},
		{"none", "", false},
		{"none", "x", true},
		{"unset; sets later", 0, false},
		{"1.0 (all)", 1.0, false},
		{"0.05", 0.05, false},
		{"0.5", 0.05, true},
		{"true", true, false},
		{"false", true, true},
		{"one per core", 0, true},
		{"[502, 503, 504]; add 500", []int{502, 503, 504}, false},
		{"[502, 503]", []int{502, 503, 504}, true},
		{"[502, 504, 503]", []int{502, 503, 504}, true},
		{"[]", []int{}, false},
		{"502, 503", []int{502, 503}, true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%v", tt.stated, tt.v), func(t *testing.T) {
			err := checkDefault(tt.stated, reflect.ValueOf(tt.v))
			if (err != nil) != tt.wantErr {
				t.Fatalf("checkDefault(%q, %v) = %v, wantErr %v", tt.stated, tt.v, err, tt.wantErr)
			}
		})
	}
}

func TestSentences(t *testing.T) {
	got := sentences(`Bind, when set, is an endpoint (e.g. "tcp://127.0.0.1:5557"). Default 1.0 (all). Required.`)
	want := []string{`Bind, when set, is an endpoint (e.g. "tcp://127.0.0.1:5557").`, "Default 1.0 (all).", "Required."}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("sentences = %q, want %q", got, want)
	}
}

// TestEnvironmentAndSetReachTheirKeys sets every key the reference gives an environment
// variable, through that variable and through --set, with config.Load, and checks that
// the value lands at the key: the reference's names are the ones the loader reads.
func TestEnvironmentAndSetReachTheirKeys(t *testing.T) {
	sections, attachments, err := build(mustDocs(t))
	if err != nil {
		t.Fatal(err)
	}
	type target struct{ env, key string }
	var targets []target
	for _, s := range sections {
		for _, r := range s.rows {
			switch {
			case strings.HasPrefix(r.env, "`"+config.EnvPrefix):
				targets = append(targets, target{strings.Trim(r.env, "`"), r.key})
				if !strings.HasPrefix(r.flag, "`--") {
					t.Errorf("%s has an environment variable but no flag", r.key)
				}
			case strings.HasPrefix(r.env, "`…__"):
				for _, a := range attachments[sharedType(t, s.title)] {
					if a.envOK {
						targets = append(targets, target{envName(a.path) + strings.Trim(strings.TrimPrefix(r.env, "`…"), "`"), a.path + "." + r.key})
					}
				}
			}
		}
	}
	if len(targets) < 50 {
		t.Fatalf("only %d keys with an environment variable", len(targets))
	}
	for _, tg := range targets {
		t.Run(tg.key, func(t *testing.T) {
			env := strings.ReplaceAll(tg.env, "<NAME>", "M")
			key := strings.ReplaceAll(tg.key, "<name>", "m")
			segs := strings.Split(key, ".")
			value := sample(t, segs)
			for _, src := range []struct {
				name       string
				args, envs []string
			}{
				{"env", nil, []string{env + "=" + value}},
				{"set", []string{"--set", key + "=" + value}, nil},
			} {
				cfg, err := config.Load(src.args, src.envs)
				if err != nil {
					t.Fatalf("%s: Load: %v", src.name, err)
				}
				got, ok := valueAt(reflect.ValueOf(cfg).Elem(), segs)
				if !ok {
					t.Fatalf("%s: %s not set", src.name, key)
				}
				if s := fmt.Sprint(got.Interface()); s != value {
					t.Fatalf("%s: %s = %s, want %s", src.name, key, s, value)
				}
			}
		})
	}
}

func sharedType(t *testing.T, title string) reflect.Type {
	t.Helper()
	for _, typ := range []reflect.Type{reflect.TypeFor[config.Policy](), reflect.TypeFor[config.Group](), reflect.TypeFor[config.UpstreamTLS]()} {
		if sharedName(typ) == title {
			return typ
		}
	}
	t.Fatalf("no shared type %q", title)
	return nil
}

// sample returns a value, other than the default, for the key at segs.
func sample(t *testing.T, segs []string) string {
	t.Helper()
	typ := reflect.TypeFor[config.Config]()
	for _, s := range segs {
		typ = deref(typ)
		if typ.Kind() == reflect.Map {
			typ = typ.Elem()
			continue
		}
		f, ok := fieldByKey(typ, s)
		if !ok {
			t.Fatalf("no key %q in %s", s, typ)
		}
		typ = f.Type
	}
	typ = deref(typ)
	switch {
	case typ == durationType:
		return "7s"
	case typ.Kind() == reflect.String:
		return "x7"
	case typ.Kind() == reflect.Bool:
		return "false"
	case typ.Kind() == reflect.Float64:
		return "0.5"
	}
	return "7"
}

func fieldByKey(t reflect.Type, key string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		if koanfKey(t.Field(i)) == key {
			return t.Field(i), true
		}
	}
	return reflect.StructField{}, false
}

// valueAt follows segs (map keys, struct keys, pointers) from v.
func valueAt(v reflect.Value, segs []string) (reflect.Value, bool) {
	for _, s := range segs {
		for v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return v, false
			}
			v = v.Elem()
		}
		if v.Kind() == reflect.Map {
			v = v.MapIndex(reflect.ValueOf(s))
			if !v.IsValid() {
				return v, false
			}
			continue
		}
		f, ok := fieldByKey(v.Type(), s)
		if !ok {
			return v, false
		}
		v = v.FieldByIndex(f.Index)
	}
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return v, false
		}
		v = v.Elem()
	}
	return v, true
}
