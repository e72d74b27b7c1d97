package httpfront

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// handledPaths returns the paths the case clauses of Server.route in src (routes.go) name.
func handledPaths(t *testing.T, src []byte) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "routes.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "route" || fn.Recv == nil {
			continue
		}
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			cc, ok := n.(*ast.CaseClause)
			if !ok {
				return true
			}
			for _, e := range cc.List {
				if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if p, err := strconv.Unquote(lit.Value); err == nil && strings.HasPrefix(p, "/") {
						paths = append(paths, p)
					}
				}
			}
			return true
		})
	}
	return paths
}

// docRoute is a "GET /path" (or POST, DELETE) in a route cell; {…} parts are placeholders.
var docRoute = regexp.MustCompile("(?:GET|POST|DELETE|PUT) (/[A-Za-z0-9_/.-]*(?:\\{[^}]*\\})?)")

// docRoutes returns the paths the first cells of doc's "## Routes" table name.
func docRoutes(doc string) []string {
	_, section, _ := strings.Cut(doc, "\n## Routes\n")
	section, _, _ = strings.Cut(section, "\n## ")
	var paths []string
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first, _, _ := strings.Cut(line[1:], " | ")
		for _, m := range docRoute.FindAllStringSubmatch(first, -1) {
			paths = append(paths, m[1])
		}
		// "(and `/rerank`)": a second path of the same route.
		for _, m := range regexp.MustCompile("\\(and `(/[^`]*)`\\)").FindAllStringSubmatch(first, -1) {
			paths = append(paths, m[1])
		}
	}
	return paths
}

// TestRoutesDocumented: every path the router answers is in docs/http-api.md's route table,
// and every path there is one the router answers (the admin API under /workers).
func TestRoutesDocumented(t *testing.T) {
	src, err := os.ReadFile("routes.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../docs/http-api.md")
	if err != nil {
		t.Fatal(err)
	}
	handled, documented := handledPaths(t, src), docRoutes(string(doc))
	if len(handled) < 15 || len(documented) < 15 {
		t.Fatalf("read %d handled and %d documented paths; is the layout still read?", len(handled), len(documented))
	}
	for _, p := range handled {
		if !slices.Contains(documented, p) {
			t.Errorf("%s is served but not in docs/http-api.md's route table", p)
		}
	}
	for _, p := range documented {
		if !slices.Contains(handled, p) && p != "/workers" && !strings.HasPrefix(p, "/workers/") {
			t.Errorf("docs/http-api.md lists %s, which the router does not serve", p)
		}
	}
	if !slices.Contains(documented, "/workers") || !slices.Contains(documented, "/workers/{id or url}") {
		t.Errorf("the admin API's /workers routes are missing from the table: %q", documented)
	}
}

func TestDocRoutes(t *testing.T) {
	doc := "# API\n\n## Routes\n\n| route | what |\n|---|---|\n" +
		"| `POST /a`, `GET /b/c` | x, not `GET /z` |\n| `POST /r` (and `/s`) | y |\n| `DELETE /w/{id or url}` | z |\n" +
		"\n## Errors\n\n| `GET /later` | not a route row |\n"
	want := []string{"/a", "/b/c", "/r", "/s", "/w/{id or url}"}
	if got := docRoutes(doc); !slices.Equal(got, want) {
		t.Errorf("docRoutes = %q, want %q", got, want)
	}
	src := []byte("package p\nfunc (s *S) route() {\n\tswitch p {\n\tcase \"/x\":\n\tcase \"/y\", \"/z\":\n\tcase \"nope\":\n\t}\n}\n" +
		"func other() {\n\tswitch p {\n\tcase \"/other\":\n\t}\n}\n")
	if got, want := handledPaths(t, src), []string{"/x", "/y", "/z"}; !slices.Equal(got, want) {
		t.Errorf("handledPaths = %q, want %q", got, want)
	}
}
