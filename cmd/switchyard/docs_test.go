package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
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
