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
// (ARCHITECTURE.md: cmd → httpfront → actors → engine → {kv, load, config}).
var allowed = map[string][]string{
	"config":    {},
	"tokenizer": {},
	"load":      {},
	"kv":        {"load"},
	"engine":    {"config", "load", "kv"},
	"actors":    {"engine", "kv", "load", "config"},
	"httpfront": {"actors", "engine", "kv", "load", "config", "httpfront", "tokenizer"},
	"bench":     {"actors", "engine", "kv", "load", "config", "httpfront", "bench", "tokenizer"},
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

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
