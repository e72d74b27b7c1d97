package main

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// allowed lists, per top-level package, the internal packages it may import
// (ARCHITECTURE.md: cmd → httpfront → actors → engine → {kv, load, config}; internal holds
// leaves any package may import).
var allowed = map[string][]string{
	"internal":  {},
	"config":    {"internal"},
	"tokenizer": {"internal"},
	"load":      {"internal"},
	"kv":        {"load", "internal"},
	"engine":    {"config", "load", "kv", "internal"},
	"actors":    {"engine", "kv", "load", "config", "internal"},
	"httpfront": {"actors", "engine", "kv", "load", "config", "httpfront", "tokenizer", "internal"},
	"bench":     {"actors", "engine", "kv", "load", "config", "httpfront", "bench", "tokenizer", "internal"},
	"deploy":    {}, // the dashboard generator
}

// TestImportDirection fails when a package imports against the architecture's one-way flow,
// or when anything but cmd imports bench.
func TestImportDirection(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for top, ok := range allowed {
		dir := filepath.Join(root, top)
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
				return err
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			for _, imp := range f.Imports {
				p := strings.Trim(imp.Path.Value, `"`)
				if !strings.HasPrefix(p, "switchyard/") {
					continue
				}
				target := strings.SplitN(strings.TrimPrefix(p, "switchyard/"), "/", 2)[0]
				if target == top && top != "httpfront" && top != "bench" {
					continue // sub-packages of one folder may import each other
				}
				if !contains(ok, target) {
					rel, _ := filepath.Rel(root, path)
					t.Errorf("%s imports %s: %s may import only %v", rel, p, top, ok)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// kvAllowed lists, per package under kv/, the kv packages it may import (besides load, which
// TestImportDirection checks): the leaves hashing and events, the index on them, the
// subscriptions and the indexer on the index. kv/internal/kvtest holds test helpers.
var kvAllowed = map[string][]string{
	"kv":                 {},
	"kv/hashing":         {},
	"kv/events":          {},
	"kv/index":           {"kv", "kv/hashing", "kv/events"},
	"kv/approx":          {"kv", "kv/index"},
	"kv/subscribe":       {"kv", "kv/hashing", "kv/events", "kv/index", "kv/internal/kvtest"},
	"kv/indexer":         {"kv", "kv/events", "kv/index", "kv/subscribe", "kv/internal/kvtest"},
	"kv/internal/kvtest": {"kv", "kv/hashing", "kv/index"},
}

// TestKVImportDirection fails when a kv package imports another kv package against the
// order of kvAllowed, or when a package under kv/ is missing from it.
func TestKVImportDirection(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(filepath.Join(root, "kv"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		rel = filepath.ToSlash(rel)
		if strings.HasPrefix(rel, "kv/hashing/internal") || strings.Contains(rel, "/testdata") {
			return nil // the assembly generator
		}
		ok, known := kvAllowed[rel]
		if !known {
			t.Errorf("%s: package %s is not in kvAllowed", filepath.Base(path), rel)
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		if strings.HasSuffix(f.Name.Name, "_test") {
			// An external test package sits above the package it tests: it may import that
			// package and the test helpers (which import the index).
			ok = append([]string{rel, "kv/internal/kvtest"}, ok...)
		}
		for _, imp := range f.Imports {
			p := strings.TrimPrefix(strings.Trim(imp.Path.Value, `"`), "switchyard/")
			if (p == "kv" || strings.HasPrefix(p, "kv/")) && !contains(ok, p) {
				t.Errorf("%s/%s imports %s: %s may import only %v", rel, filepath.Base(path), p, rel, ok)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
