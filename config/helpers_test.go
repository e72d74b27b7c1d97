package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// errLines returns the lines of a (joined) error, or nil.
func errLines(err error) []string {
	if err == nil {
		return nil
	}
	return strings.Split(err.Error(), "\n")
}

// fieldErrors flattens a joined error into its FieldErrors.
func fieldErrors(err error) []*FieldError {
	var out []*FieldError
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		var fe *FieldError
		if errors.As(e, &fe) {
			out = append(out, fe)
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

// writeFile writes content to name in a fresh temporary directory and returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// mustDecodeYAML decodes a YAML document and fails the test on error.
func mustDecodeYAML(t *testing.T, doc string) *Config {
	t.Helper()
	cfg, err := Decode([]byte(doc), FormatYAML)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	return cfg
}

func ptr[T any](v T) *T { return &v }

func equalLines(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
