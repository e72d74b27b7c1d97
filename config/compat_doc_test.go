package config

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The migration guide's flag table and refused list are sglFlags, as written for people: a flag
// the command line maps is a row naming its key, a flag it refuses is in the refused list, and
// the guide names no sgl-router flag the command line does not know.

// sglDocFlag is one sgl-router flag of the migration guide.
type sglDocFlag struct {
	row     string // the table row that names it; "" for a refused flag
	refused bool
}

var docFlagName = regexp.MustCompile(`--([a-z][a-z0-9-]*)`)

// sglDocFlags reads the guide's "### Flags" table (the flags in each row's first cell) and the
// paragraph after it that starts "Refused".
func sglDocFlags(doc string) map[string]sglDocFlag {
	out := map[string]sglDocFlag{}
	_, section, _ := strings.Cut(doc, "\n### Flags\n")
	section, _, _ = strings.Cut(section, "\n#")
	inRefused := false
	for _, line := range strings.Split(section, "\n") {
		switch {
		case strings.HasPrefix(line, "| `--"):
			first, _, _ := strings.Cut(strings.ReplaceAll(line[1:], `\|`, ""), "|")
			for _, m := range docFlagName.FindAllStringSubmatch(first, -1) {
				out[m[1]] = sglDocFlag{row: line}
			}
		case strings.HasPrefix(line, "Refused"):
			inRefused = true
		case strings.TrimSpace(line) == "":
			inRefused = false
		}
		if inRefused {
			for _, m := range docFlagName.FindAllStringSubmatch(line, -1) {
				if _, ok := out[m[1]]; !ok {
					out[m[1]] = sglDocFlag{refused: true}
				}
			}
		}
	}
	return out
}

// sglDocProblems compares flags with the guide's view of them.
func sglDocProblems(flags []sglFlag, doc map[string]sglDocFlag) []string {
	var problems []string
	known := map[string]bool{
		// Switchyard's own flags the mode takes, named in the guide's refused paragraph.
		"admin-api-key": true,
	}
	for _, f := range flags {
		known[f.name] = true
		d, ok := doc[f.name]
		switch {
		case !ok:
			problems = append(problems, "--"+f.name+": not in the guide")
		case f.kind == sglRefused && !d.refused:
			problems = append(problems, "--"+f.name+": refused, but a row of the flag table")
		case f.kind != sglRefused && d.refused:
			problems = append(problems, "--"+f.name+": accepted, but in the refused list")
		case f.key != "":
			last := f.key[strings.LastIndexByte(f.key, '.')+1:]
			if !strings.Contains(d.row, f.key) && !strings.Contains(d.row, "`"+last+"`") {
				problems = append(problems, "--"+f.name+": its row does not name "+f.key)
			}
		}
	}
	for name := range doc {
		if !known[name] {
			problems = append(problems, "--"+name+": in the guide, unknown to --compat sgl-router")
		}
	}
	slices.Sort(problems)
	return problems
}

func TestMigrationGuideFlags(t *testing.T) {
	doc, err := os.ReadFile("../docs/migrating-from-sgl-router.md")
	if err != nil {
		t.Fatal(err)
	}
	flags := sglDocFlags(string(doc))
	if len(flags) < 60 {
		t.Fatalf("only %d flags read from the guide; is its layout still read?", len(flags))
	}
	for _, p := range sglDocProblems(sglFlags(), flags) {
		t.Error(p)
	}
}

func TestSglDocProblems(t *testing.T) {
	doc := sglDocFlags("# Guide\n\n### Flags\n\n| sgl-router flag | key | notes |\n|---|---|---|\n" +
		"| `--host` | `server.host` | |\n" +
		"| `--prefill URL [PORT\\|none]` | `workers` | |\n" +
		"| `--cache-threshold`, `--balance-abs-threshold` | `cache_aware.approximate.cache_threshold`, `balance_abs_threshold` | |\n" +
		"| `--old` | `x.y` | |\n\n" +
		"Refused, with a message: `--log-dir`,\n`--json-log` (see `--admin-api-key`).\n\n" +
		"`--port` is named outside both.\n\n## Next\n\n| `--next-section` | |\n")
	flags := []sglFlag{
		{name: "host", key: "server.host"},
		{name: "port", key: "server.port"},
		{name: "prefill", kind: sglList},
		{name: "cache-threshold", key: "cache_aware.approximate.cache_threshold"},
		{name: "balance-abs-threshold", key: "cache_aware.approximate.balance_abs_threshold"},
		{name: "log-dir", kind: sglRefused},
		{name: "json-log"},
		{name: "mini-lb", kind: sglRefused},
	}
	want := []string{
		"--json-log: accepted, but in the refused list",
		"--mini-lb: not in the guide",
		"--old: in the guide, unknown to --compat sgl-router",
		"--port: not in the guide",
	}
	if got := sglDocProblems(flags, doc); !slices.Equal(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
	flags[0].key = "server.listen"
	if got := sglDocProblems(flags[:1], doc); !slices.Contains(got, "--host: its row does not name server.listen") {
		t.Errorf("a row naming another key passed: %q", got)
	}
}
