package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// runBenchCmd runs the bench subcommand and maps its error to an exit code as run does
// (the command is registered in main.go; calling runBench directly keeps these tests
// independent of that list).
func runBenchCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	err := runBench(context.Background(), args, &out, &errb)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0, out.String(), errb.String()
	case errors.Is(err, errReported):
		return 1, out.String(), errb.String()
	}
	errb.WriteString(err.Error())
	return 1, out.String(), errb.String()
}

func TestBenchHelpDocumentsEveryFlag(t *testing.T) {
	code, out, errOut := runBenchCmd(t, "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	help := out + errOut
	fs, _ := newBenchFlagSet(nil)
	fs.VisitAll(func(f *flag.Flag) {
		if !strings.Contains(help, "-"+f.Name) {
			t.Errorf("--help lacks -%s", f.Name)
		}
	})
	for _, want := range []string{"overhead", "routing", "pd", "buckets", "mailbox", `(default "routing")`, "(default 20s)",
		"(default 4)", "cache_aware", "shared_prefix"} {
		if !strings.Contains(help, want) {
			t.Errorf("--help lacks %q:\n%s", want, help)
		}
	}
}

func TestBenchRejectsBadFlags(t *testing.T) {
	code, _, errOut := runBenchCmd(t, "--scenario", "nope", "--policies", "fused_score", "--mailbox-sizes", "x",
		"--long-classes", "short:1", "--speedup", "-1")
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	for _, want := range []string{`unknown scenario "nope"`, `unknown policy "fused_score"`, `"x" is not a number`, `"short:1" is not NAME:MIN-MAX:WEIGHT`} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if code, _, errOut := runBenchCmd(t, "--target", "http://127.0.0.1:1", "--scenario", "overhead"); code != 1 || !strings.Contains(errOut, "--target") {
		t.Errorf("overhead against a target: exit %d: %s", code, errOut)
	}
	// The instructions scenario gets its router and bare proxy commands from the flags; its
	// N2 must leave an N1.
	code, _, errOut = runBenchCmd(t, "--scenario", "instructions", "--requests", "5")
	if code != 1 || !strings.Contains(errOut, "needs at least 10") || strings.Contains(errOut, "_command") {
		t.Errorf("instructions with 5 requests: exit %d: %s", code, errOut)
	}
}

func TestBenchWritesTableJSONAndChart(t *testing.T) {
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "report.json")
	code, out, errOut := runBenchCmd(t, "--scenario", "mailbox", "--engines", "2", "--mailbox-sizes", "1024",
		"--mailbox-requests", "200", "--concurrency", "8", "--json", jsonPath, "--chart", dir, "--quiet")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"== mailbox ==", "MAILBOX", "1024", "report: " + jsonPath, "chart: " + filepath.Join(dir, "mailbox.svg")} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Tool      string `json:"tool"`
		Scenarios []struct {
			Name string `json:"name"`
			Rows []struct {
				Mailbox int `json:"mailbox"`
				Summary struct {
					Requests int `json:"requests"`
					OK       int `json:"ok"`
				} `json:"summary"`
			} `json:"rows"`
		} `json:"scenarios"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Tool != "switchyard bench" || len(rep.Scenarios) != 1 || rep.Scenarios[0].Name != "mailbox" ||
		len(rep.Scenarios[0].Rows) != 1 || rep.Scenarios[0].Rows[0].Summary.OK != 200 {
		t.Errorf("report %+v", rep)
	}
	if svg, err := os.ReadFile(filepath.Join(dir, "mailbox.svg")); err != nil || !strings.HasPrefix(string(svg), "<svg") {
		t.Errorf("chart: %v", err)
	}
}

// TestBenchDemo runs the demo for a few seconds: engines and the router start, every policy
// is compared on the shared-prefix workload, the table is printed and the chart written.
func TestBenchDemo(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	if err := runBenchDemo(context.Background(), []string{"--duration", "3s", "--chart", dir, "--quiet"}, &out, &errb); err != nil {
		t.Fatalf("%v: %s", err, errb.String())
	}
	for _, want := range []string{
		"switchyard demo: 4 mock engines",
		"== routing: shared_prefix ==",
		"POLICY", "TTFT p50", "HIT", "SPREAD req",
		"round_robin", "random", "power_of_two", "load_based", "sticky",
		"oracle",
		"chart: " + filepath.Join(dir, "routing-shared_prefix.svg"),
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
	svg, err := os.ReadFile(filepath.Join(dir, "routing-shared_prefix.svg"))
	if err != nil || !bytes.HasPrefix(svg, []byte("<svg")) || !bytes.Contains(svg, []byte("power_of_two")) {
		t.Errorf("chart: %v\n%.200s", err, svg)
	}
	if err := runBenchDemo(context.Background(), []string{"--duration", "0s"}, &out, &errb); err == nil {
		t.Error("--duration 0s accepted")
	}
}

// TestBenchTrace replays a trace written here through the command: its table and chart,
// and the trace flags' errors.
func TestBenchTrace(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "two.jsonl")
	lines := `{"timestamp": 0, "input_length": 1500, "output_length": 4, "hash_ids": [1, 2, 3]}
{"timestamp": 20, "input_length": 1100, "output_length": 3, "hash_ids": [9, 8, 7]}
{"timestamp": 50, "input_length": 2000, "output_length": 5, "hash_ids": [1, 2, 3, 4]}
`
	if err := os.WriteFile(trace, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runBenchCmd(t, "--scenario", "trace", "--trace", trace, "--policies", "round_robin,cache_aware",
		"--engines", "2", "--speedup", "10", "--time-scale", "2", "--chart", dir, "--quiet")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"== trace: two ==", "3 requests over 0.1 s", "÷ 2", "round_robin", "cache_aware", "oracle",
		"chart: " + filepath.Join(dir, "trace-two.svg")} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	code, _, errOut = runBenchCmd(t, "--scenario", "trace", "--trace", trace, "--time-scale", "-1", "--trace-block-size", "-2")
	if code != 1 || !strings.Contains(errOut, "time_scale") || !strings.Contains(errOut, "trace_block_size") {
		t.Errorf("bad trace flags: exit %d: %s", code, errOut)
	}
	code, _, errOut = runBenchCmd(t, "--scenario", "trace", "--trace", trace, "--trace-block-size", "256", "--quiet")
	if code != 1 || !strings.Contains(errOut, "line 1") || !strings.Contains(errOut, "--trace-block-size") {
		t.Errorf("wrong block size: exit %d: %s", code, errOut)
	}
}

// TestBenchReplicas runs the replicas scenario on router processes of this package's
// binary: turns spread at random over three replicas stay on their session's engine, the
// hit rate matches one router's, and a replica stopped gracefully then another killed
// mid-run cost no request but those in flight on the killed one.
func TestBenchReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs router processes")
	}
	bin := switchyardBinary(t)
	jsonPath := filepath.Join(t.TempDir(), "report.json")
	code, out, errOut := runBenchCmd(t, "--scenario", "replicas", "--router-binary", bin, "--engines", "3",
		"--users", "16", "--turns", "6", "--concurrency", "8", "--duration", "2m", "--json", jsonPath, "--quiet")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"== replicas: multi_turn ==", "1 router", "3 replicas", "3, stop + crash", "events 3, stop + crash: stopped r2 (SIGTERM)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Scenarios []struct {
			Rows []struct {
				Name     string                     `json:"name"`
				Summary  struct{ Requests, OK int } `json:"summary"`
				Replicas struct {
					Replicas            int       `json:"replicas"`
					Agreement           float64   `json:"session_agreement"`
					AgreementAfterCrash float64   `json:"session_agreement_after_crash"`
					HitRateVsSingle     float64   `json:"hit_rate_vs_single"`
					CrashErrors         int       `json:"crash_errors"`
					OtherErrors         int       `json:"other_errors"`
					CPU                 []float64 `json:"router_cpu_s_per_1k"`
				} `json:"replicas"`
			} `json:"rows"`
		} `json:"scenarios"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Scenarios) != 1 || len(rep.Scenarios[0].Rows) != 3 {
		t.Fatalf("report %+v", rep)
	}
	for i, r := range rep.Scenarios[0].Rows {
		f := r.Replicas
		if r.Summary.Requests != 96 || f.OtherErrors != 0 || f.Agreement < 0.9 || f.HitRateVsSingle < 0.9 || len(f.CPU) != f.Replicas {
			// The report's "errors ROW:" lines name the failures' statuses and codes.
			t.Errorf("row %d %s: %d requests, figures %+v\n%s", i, r.Name, r.Summary.Requests, f, errorLines(out))
		}
		if i == 2 && (f.AgreementAfterCrash < 0.9 || f.CrashErrors > 8) {
			t.Errorf("after the crash: agreement %v, %d errors on the crashed replica (at most its 8 clients' requests)", f.AgreementAfterCrash, f.CrashErrors)
		}
	}
}

// errorLines returns the "errors ROW: ..." lines of a bench report's text, or a note that it
// has none.
func errorLines(out string) string {
	var b strings.Builder
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "errors ") {
			b.WriteString(line)
		}
	}
	if b.Len() == 0 {
		return "(the report names no failed request)"
	}
	return b.String()
}

// TestBenchOverheadProcesses runs the overhead scenario from the binary: the router and
// the bare proxy run as their own processes (as nginx does), every proxy row carries its
// own process's CPU, and the CPU ratios against the references compare those.
func TestBenchOverheadProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs proxy processes")
	}
	bin := switchyardBinary(t)
	jsonPath := filepath.Join(t.TempDir(), "report.json")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "bench", "--scenario", "overhead", "--engines", "2", "--concurrency", "4",
		"--duration", "1500ms", "--json", jsonPath, "--quiet")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if !strings.Contains(string(out), "each run as their own process") {
		t.Errorf("the table's notes do not say the proxies ran as their own processes:\n%s", out)
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Scenarios []struct {
			Rows []struct {
				Name    string                     `json:"name"`
				Summary struct{ Requests, OK int } `json:"summary"`
				CPU     float64                    `json:"cpu_s_per_1k"`
				Own     float64                    `json:"own_cpu_s_per_1k"`
			} `json:"rows"`
			Overhead struct {
				RouterCPU  float64 `json:"router_cpu_s_per_1k"`
				References []struct {
					Mode, Against string
					CPU           float64 `json:"cpu_ratio"`
				} `json:"references"`
			} `json:"overhead"`
		} `json:"scenarios"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Scenarios) != 1 {
		t.Fatalf("report %+v", rep)
	}
	sc := rep.Scenarios[0]
	own := map[string]float64{}
	for _, r := range sc.Rows {
		if r.Summary.Requests == 0 || r.Summary.OK != r.Summary.Requests {
			t.Errorf("row %s: %d requests, %d ok", r.Name, r.Summary.Requests, r.Summary.OK)
		}
		// Direct has no process of its own; every proxy does (its CPU is counted in ticks of
		// 10 ms over thousands of requests: never zero).
		if (r.Own > 0) == strings.HasPrefix(r.Name, "direct") || r.Own > r.CPU {
			t.Errorf("row %s: own CPU %v s/1k, total %v", r.Name, r.Own, r.CPU)
		}
		own[r.Name] = r.Own
	}
	if _, ok := own["evloop stream"]; runtime.GOOS == "linux" && (own["evloop"] == 0 || !ok) {
		t.Errorf("no event-loop proxy rows on Linux: %v", own)
	}
	if sc.Overhead.RouterCPU != own["router"] {
		t.Errorf("router CPU %v, want its own process's %v", sc.Overhead.RouterCPU, own["router"])
	}
	if len(sc.Overhead.References) == 0 {
		t.Fatal("no reference ratios")
	}
	for _, rr := range sc.Overhead.References {
		prefix := ""
		if rr.Mode == "stream" {
			prefix = " stream"
		}
		want := own["router"+prefix] / own[rr.Against+prefix]
		if math.Abs(rr.CPU-want) > 1e-9*want {
			t.Errorf("%s against %s: CPU ratio %v, want own %v", rr.Mode, rr.Against, rr.CPU, want)
		}
	}
}
