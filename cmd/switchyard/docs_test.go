package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The documentation names every flag a command's --help lists, so that a new or renamed flag
// fails here until README.md or docs/ say what it does.

// helpFlag is a flag line of a command's help: two spaces or a tab, then -name or --name.
var helpFlag = regexp.MustCompile(`(?m)^[ \t]+--?([a-z][a-z0-9-]*)`)

// helpFlags returns the flag names (without dashes) a help text lists, in order, once each.
func helpFlags(help string) []string {
	var names []string
	for _, m := range helpFlag.FindAllStringSubmatch(help, -1) {
		if !slices.Contains(names, m[1]) {
			names = append(names, m[1])
		}
	}
	return names
}

// undocumentedFlags returns the names of flags that docs never writes as --name (followed by
// anything but a name byte, so --model does not document --model-path).
func undocumentedFlags(flags []string, docs string) []string {
	var missing []string
	for _, f := range flags {
		re := regexp.MustCompile(`--` + regexp.QuoteMeta(f) + `([^a-z0-9-]|$)`)
		if !re.MatchString(docs) {
			missing = append(missing, f)
		}
	}
	return missing
}

// readDocs returns README.md and every docs/*.md of this checkout, concatenated.
func readDocs(t *testing.T) string {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../README.md")
	var b strings.Builder
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(text)
		b.WriteByte('\n')
	}
	if b.Len() < 10000 {
		t.Fatalf("only %d bytes of documentation in %d files", b.Len(), len(files))
	}
	return b.String()
}

func TestEveryFlagDocumented(t *testing.T) {
	docs := readDocs(t)
	total := 0
	for _, c := range commands() {
		t.Run(c.name, func(t *testing.T) {
			code, stdout, stderr := runCmd(t, c.name, "-h")
			if code != 0 {
				t.Fatalf("%s -h: exit %d: %s%s", c.name, code, stdout, stderr)
			}
			flags := helpFlags(stdout + stderr)
			total += len(flags)
			for _, f := range undocumentedFlags(flags, docs) {
				t.Errorf("switchyard %s --%s is not named in README.md or docs/*.md", c.name, f)
			}
		})
	}
	if total < 100 {
		t.Errorf("only %d flags found in the commands' help; is the help format still read?", total)
	}
}

func TestUndocumentedFlags(t *testing.T) {
	help := "usage: switchyard x [flags]\n  --config FILE\n        a file (default: none)\n" +
		"  -model string\n    \tthe model\n\t-json string\n  --model NAME\n  overhead  a scenario, not a flag\n"
	if got, want := helpFlags(help), []string{"config", "model", "json"}; !slices.Equal(got, want) {
		t.Fatalf("helpFlags = %q, want %q", got, want)
	}
	tests := []struct {
		name, docs string
		want       []string
	}{
		{"all named", "`--config FILE`, `--model`; --json.", nil},
		{"a longer flag does not document a prefix", "--config-file, --model-path, --json", []string{"config", "model"}},
		{"a single dash is not the documented form", "-config, --model, --json", []string{"config"}},
		{"at the end of the text", "--config --model --json", nil},
		{"nothing named", "", []string{"config", "model", "json"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := undocumentedFlags([]string{"config", "model", "json"}, tt.docs); !slices.Equal(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// helpDefaults returns each flag's default as a command's help prints it, "(default X)",
// "(default: X)" or `(default "X")` at the end of its description; flags without one, or
// with an empty or "none" default, or one in words ("this one"), are left out.
func helpDefaults(help string) map[string]string {
	out := map[string]string{}
	locs := helpFlag.FindAllStringSubmatchIndex(help, -1)
	for i, l := range locs {
		end := len(help)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		m := helpDefault.FindStringSubmatch(strings.TrimSpace(help[l[1]:end]))
		if m == nil {
			continue
		}
		if d := strings.Trim(m[1], `"`); d != "" && d != "none" && (!strings.Contains(d, " ") || m[1][0] == '"') {
			out[help[l[2]:l[3]]] = d
		}
	}
	return out
}

var (
	helpDefault = regexp.MustCompile(`\(default:? ("[^"]*"|[^()]*)\)$`)
	docDuration = regexp.MustCompile(`[0-9][0-9.]*(?:ns|µs|us|ms|s|m|h)(?:[0-9.]+(?:ns|µs|us|ms|s|m|h))*`)
)

// docDefaults returns the default cell of every row of doc's flag tables (a header row
// "| flag | ... | default | ...") by the flags its first cell names.
func docDefaults(doc string) map[string]string {
	out := map[string]string{}
	col := -1
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(line, "|") {
			col = -1
			continue
		}
		cells := strings.Split(strings.ReplaceAll(strings.Trim(line, "| "), `\|`, ""), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		switch {
		case cells[0] == "flag":
			col = slices.Index(cells, "default")
		case col > 0 && col < len(cells) && strings.HasPrefix(cells[0], "`--"):
			for _, m := range docFlagName.FindAllStringSubmatch(cells[0], -1) {
				out[m[1]] = cells[col]
			}
		}
	}
	return out
}

var docFlagName = regexp.MustCompile(`--([a-z][a-z0-9-]*)`)

// sameDefault reports whether a doc's default cell states the help's default: as a word (1
// is not stated by 16), or as the same duration written another way (2m for 2m0s).
func sameDefault(cell, def string) bool {
	if regexp.MustCompile(`(^|[^0-9A-Za-z.])` + regexp.QuoteMeta(def) + `($|[^0-9A-Za-z.])`).MatchString(cell) {
		return true
	}
	d, err := time.ParseDuration(def)
	if err != nil {
		return false
	}
	for _, s := range docDuration.FindAllString(cell, -1) {
		if c, err := time.ParseDuration(s); err == nil && c == d {
			return true
		}
	}
	return false
}

// TestFlagDefaultsDocumented: the flag tables of a command's page state the defaults its help
// prints.
func TestFlagDefaultsDocumented(t *testing.T) {
	for _, tc := range []struct{ cmd, doc string }{
		{"serve", "configuration.md"},
		{"mockengine", "mock-engine.md"},
		{"bench", "benchmarks.md"},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			text, err := os.ReadFile(filepath.Join("../../docs", tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			code, stdout, stderr := runCmd(t, tc.cmd, "-h")
			if code != 0 {
				t.Fatalf("%s -h: exit %d: %s", tc.cmd, code, stderr)
			}
			defs, cells := helpDefaults(stdout+stderr), docDefaults(string(text))
			checked := 0
			for name, def := range defs {
				cell, ok := cells[name]
				if !ok {
					continue // named elsewhere in the page (TestEveryFlagDocumented)
				}
				checked++
				if !sameDefault(cell, def) {
					t.Errorf("--%s: docs/%s says the default is %q, %s -h says %q", name, tc.doc, cell, tc.cmd, def)
				}
			}
			if checked < 5 {
				t.Errorf("only %d defaults compared with docs/%s; is its flag table still read?", checked, tc.doc)
			}
		})
	}
}

func TestFlagDefaultParsing(t *testing.T) {
	help := "  --port PORT\n        listen PORT (default: 8080)\n  --key KEY\n        a key (default: none)\n" +
		"  -chart string\n    \tdirectory (default \"/tmp/x\")\n  -timeout duration\n    \tbound (default 2m0s)\n" +
		"  -json string\n    \twrite JSON\n  -binary string\n    \tthe binary (default: this one)\n  --topic string\n        first frame (default \"\")\n"
	want := map[string]string{"port": "8080", "chart": "/tmp/x", "timeout": "2m0s"}
	if got := helpDefaults(help); !maps.Equal(got, want) {
		t.Errorf("helpDefaults = %q, want %q", got, want)
	}
	doc := "| flag | effect | default |\n|---|---|---|\n| `--port PORT` | `server.port` | `8080` |\n" +
		"| `--a`, `--b` | x \\| y | `1` |\n\n| `--port` | outside a flag table | 1 |\n" +
		"| flag | default |\n|---|---|\n| `--timeout` | 2m (trace: none) |\n"
	wantDoc := map[string]string{"port": "`8080`", "a": "`1`", "b": "`1`", "timeout": "2m (trace: none)"}
	if got := docDefaults(doc); !maps.Equal(got, wantDoc) {
		t.Errorf("docDefaults = %q, want %q", got, wantDoc)
	}
	for _, tt := range []struct {
		cell, def string
		want      bool
	}{
		{"`8080`", "8080", true},
		{"`8081`", "8080", false},
		{"`16`", "1", false},
		{"`1` (off)", "1", true},
		{"`0.2`", "0", false},
		{"2m (trace: none)", "2m0s", true},
		{"`100µs`", "100µs", true},
		{"3m", "2m0s", false},
		{"none", "2m0s", false},
	} {
		if got := sameDefault(tt.cell, tt.def); got != tt.want {
			t.Errorf("sameDefault(%q, %q) = %v, want %v", tt.cell, tt.def, got, tt.want)
		}
	}
}

// sourceMetricName is a whole switchyard_* metric name at the start of a Go string literal
// (a family, or a series with its labels after it); a literal ending in "_" is a prefix.
var sourceMetricName = regexp.MustCompile(`^switchyard_[a-z0-9_]*[a-z0-9]($|\{)`)

// sourceMetricNames returns every switchyard_* metric name the module's non-test Go files
// (outside third_party/) write as a string literal, with the files naming it. Every metric
// name is a constant or a literal (house style: handles are created once, never named per
// request), so this finds the metrics of every feature, including those a test router does
// not turn on (the cluster, Kubernetes discovery).
func sourceMetricNames(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (d.Name() == "third_party" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != "../..":
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil || !sourceMetricName.MatchString(s) {
				return true
			}
			name, _, _ := strings.Cut(s, "{")
			if !slices.Contains(out[name], path) {
				out[name] = append(out[name], path)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSourceMetricsDocumented: docs/operations.md, the metric reference, names every metric
// the code names, whether or not the router of TestDeployArtifactsMatchARunningRouter
// exports it.
func TestSourceMetricsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	names := sourceMetricNames(t)
	if len(names) < 80 {
		t.Fatalf("only %d metric names found in the source; is it still read?", len(names))
	}
	for _, name := range slices.Sorted(maps.Keys(names)) {
		if !namesWord(string(doc), name) {
			t.Errorf("%s (%s) is not in docs/operations.md's metric reference", name, strings.Join(names[name], ", "))
		}
	}
}
