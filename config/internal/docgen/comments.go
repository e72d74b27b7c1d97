package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
)

// typeDocs are the doc comments of the config package's struct types: the type's own
// comment and its fields', by field name.
type typeDocs struct {
	doc    string
	fields map[string]string
}

// parseDocs reads the doc comments of every struct type declared in the non-test Go
// files of dir.
func parseDocs(dir string) (map[string]typeDocs, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	out := map[string]typeDocs{}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("cannot read config source: %w", err)
		}
		f, err := parser.ParseFile(fset, name, src, parser.ParseComments)
		if err != nil {
			return nil, fmt.Errorf("cannot parse config source: %w", err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, spec := range gd.Specs {
				ts := spec.(*ast.TypeSpec)
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					continue
				}
				td := typeDocs{doc: commentText(ts.Doc), fields: map[string]string{}}
				if td.doc == "" && len(gd.Specs) == 1 {
					td.doc = commentText(gd.Doc)
				}
				for _, field := range st.Fields.List {
					for _, n := range field.Names {
						td.fields[n.Name] = commentText(field.Doc)
					}
				}
				out[ts.Name.Name] = td
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no struct types in %s: is it the config package's directory?", dir)
	}
	return out, nil
}

// commentText is a comment group's text on one line.
func commentText(g *ast.CommentGroup) string {
	if g == nil {
		return ""
	}
	return strings.Join(strings.Fields(g.Text()), " ")
}

// sentences splits a comment into sentences: a period followed by a space or the end
// closes one, except in "e.g." and "i.e.".
func sentences(text string) []string {
	var out []string
	start := 0
	for i := 0; i < len(text); i++ {
		if text[i] != '.' || (i+1 < len(text) && text[i+1] != ' ') {
			continue
		}
		if strings.HasSuffix(text[:i], "e.g") || strings.HasSuffix(text[:i], "i.e") {
			continue
		}
		if s := strings.TrimSpace(text[start : i+1]); s != "" {
			out = append(out, s)
		}
		start = i + 1
	}
	if s := strings.TrimSpace(text[start:]); s != "" {
		out = append(out, s)
	}
	return out
}

// fieldDoc is what a field comment says: the default (as written) and the meaning
// without the default sentence.
type fieldDoc struct {
	def     string
	meaning string
}

// splitFieldDoc separates the default sentence ("Default 5s.", "Default: none.") or the
// "Required." sentence from the rest of a field comment, and starts the meaning with the
// key instead of the Go field name.
func splitFieldDoc(goName, key, text string) (fieldDoc, error) {
	var fd fieldDoc
	var rest []string
	required := false
	for _, s := range sentences(text) {
		switch {
		case fd.def == "" && (strings.HasPrefix(s, "Default ") || strings.HasPrefix(s, "Default:")):
			d := strings.TrimSuffix(strings.TrimPrefix(s, "Default"), ".")
			fd.def = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(d), ":"))
		case s == "Required.":
			required = true
		default:
			if strings.Contains(strings.ToLower(s), "required") {
				required = true
			}
			rest = append(rest, s)
		}
	}
	if fd.def == "" && required {
		fd.def = "required"
	}
	fd.meaning = strings.Join(rest, " ")
	if m, ok := strings.CutPrefix(fd.meaning, goName); ok && (m == "" || m[0] == ' ' || m[0] == ',') {
		fd.meaning = "`" + key + "`" + m
	}
	if fd.def == "" {
		return fd, fmt.Errorf("the comment states no default (write \"Default X.\", \"Default: none.\" or \"Required.\")")
	}
	return fd, nil
}
