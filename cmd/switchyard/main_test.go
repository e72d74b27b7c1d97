package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestSelectPrintsSection7Picks(t *testing.T) {
	code, out, errOut := runCmd(t, "select")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"4k in, 16k peak      llama  4096    16384  long-context",
		"4k in, 8k peak       llama  4096    8192   short-context",
		"no_matching_bucket",
		"qwen #3 (held)       qwen   100     300    large",
		"small/plain/Q1: max_inflight_requests, large/plain/Q3: max_inflight_requests",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("select output lacks %q:\n%s", want, out)
		}
	}
}

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(`
workers:
  - {id: W1, url: "http://127.0.0.1:1", model: m}
models:
  m:
    buckets:
      - id: a
        limits: {min: 10, max: 5}
        groups:
          plain: {worker_ids: [W9], policy: {type: fused_score}}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCmd(t, "check", "--config", bad)
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	for _, want := range []string{"models.m.buckets[0].limits", "W9", "fused_score"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("check output lacks %q:\n%s", want, errOut)
		}
	}
	if n := strings.Count(strings.TrimSpace(errOut), "\n") + 1; n < 3 {
		t.Errorf("want every problem on its own line, got %d lines:\n%s", n, errOut)
	}

	for _, example := range []string{"example.yaml", "vllm_fleet.yaml"} {
		code, out, errOut := runCmd(t, "check", "--config", "../../config/testdata/"+example)
		if code != 0 || !strings.Contains(out, "configuration ok") {
			t.Fatalf("%s: exit %d\n%s%s", example, code, out, errOut)
		}
	}

	badVLLM := filepath.Join(dir, "bad_vllm.yaml")
	if err := os.WriteFile(badVLLM, []byte(`
load: {source: zmq, scrape_max_bytes: 10}
workers:
  - {id: V1, url: "http://127.0.0.1:1", model: m, flavor: vllm, load_publish: "tcp://127.0.0.1:2"}
  - {id: V2, url: "http://127.0.0.1:2", model: m, flavor: tgi, metrics_path: metrics}
models:
  m: {buckets: [{id: a, groups: {plain: {policy: {type: load_based}}}}]}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = runCmd(t, "check", "--config", badVLLM)
	if code != 1 {
		t.Fatalf("bad vLLM config: exit %d, want 1", code)
	}
	for _, want := range []string{"workers[0].load_publish", "workers[0].flavor", `workers[1].flavor: unknown flavor "tgi"`,
		"workers[1].metrics_path", "load.scrape_max_bytes"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("check output lacks %q:\n%s", want, errOut)
		}
	}
}

func TestUnknownCommand(t *testing.T) {
	code, _, errOut := runCmd(t, "nope")
	if code != 2 || !strings.Contains(errOut, `unknown command "nope"`) {
		t.Fatalf("exit %d: %s", code, errOut)
	}
}

// TestConfigCommandsLoadAlike runs check, serve and indexer on one bad configuration and with
// --help: each prints every problem on its own line with its field path and exits 1, and
// each prints its own usage line before the configuration flags.
func TestConfigCommandsLoadAlike(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte(`
workers:
  - {id: W1, url: "http://127.0.0.1:1", model: m}
models:
  m: {buckets: [{id: a, limits: {min: 10, max: 5}, groups: {plain: {worker_ids: [W9]}}}]}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		cmd       string
		wantUsage string
	}{
		{"check", "usage: switchyard check [--config FILE] [flags]"},
		{"serve", "usage: switchyard serve [--config FILE] [flags]"},
		{"indexer", "--listen HOST:PORT  address of the indexer's HTTP service (default " + defaultIndexerListen + ")"},
	}
	for _, tt := range tests {
		t.Run(tt.cmd, func(t *testing.T) {
			code, out, errOut := runCmd(t, tt.cmd, "--config", bad)
			if code != 1 || out != "" {
				t.Fatalf("bad configuration: exit %d, stdout %q", code, out)
			}
			lines := strings.Split(strings.TrimSpace(errOut), "\n")
			if len(lines) < 2 || !strings.Contains(errOut, "models.m.buckets[0].limits") || !strings.Contains(errOut, "W9") {
				t.Fatalf("want each problem on its own line with its field path, got:\n%s", errOut)
			}
			code, out, errOut = runCmd(t, tt.cmd, "--help")
			if code != 0 || errOut != "" || !strings.Contains(out, "--config") {
				t.Fatalf("--help: exit %d, stdout %q, stderr %q", code, out, errOut)
			}
			if tt.wantUsage != "" && !strings.Contains(out, tt.wantUsage) {
				t.Fatalf("--help lacks %q:\n%s", tt.wantUsage, out)
			}
			// With sgl-router's command line, the help is sgl-router's flags, under a usage
			// line naming this command.
			code, out, errOut = runCmd(t, tt.cmd, "--compat", "sgl-router", "--help")
			want := "usage: switchyard " + tt.cmd + " --compat sgl-router "
			if code != 0 || errOut != "" || !strings.HasPrefix(out, want) {
				t.Fatalf("--compat sgl-router --help: exit %d, stderr %q, want stdout to start with %q:\n%s", code, errOut, want, out)
			}
		})
	}
}

// TestEveryCommandHelpNamesIt runs CMD -h for every command switchyard -h lists: each exits 0
// and its help starts with the line "usage: switchyard CMD", before its flags.
func TestEveryCommandHelpNamesIt(t *testing.T) {
	code, out, errOut := runCmd(t, "-h")
	if code != 0 || !strings.HasPrefix(out, "usage: switchyard <command>") {
		t.Fatalf("switchyard -h: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	_, list, ok := strings.Cut(out, "\ncommands:\n")
	if !ok {
		t.Fatalf("switchyard -h lists no commands:\n%s", out)
	}
	var names []string
	for _, line := range strings.Split(strings.TrimRight(list, "\n"), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(line, "  ") {
			names = append(names, f[0])
		}
	}
	if len(names) < len(commands()) {
		t.Fatalf("switchyard -h lists %d commands (%q), the binary has %d", len(names), names, len(commands()))
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			code, out, errOut := runCmd(t, name, "-h")
			if code != 0 {
				t.Fatalf("%s -h: exit %d: %s%s", name, code, out, errOut)
			}
			if out != "" && errOut != "" {
				t.Fatalf("%s -h writes its help to both stdout and stderr:\nstdout: %s\nstderr: %s", name, out, errOut)
			}
			first, _, _ := strings.Cut(out+errOut, "\n")
			if want := "usage: switchyard " + name; first != want && !strings.HasPrefix(first, want+" ") {
				t.Errorf("%s -h: first line %q, want it to start with %q", name, first, want)
			}
		})
	}
}
