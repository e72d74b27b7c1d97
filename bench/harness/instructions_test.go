package harness

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"switchyard/bench/report"
)

func TestCachegrindSummary(t *testing.T) {
	tests := []struct {
		name, in string
		want     uint64
		wantErr  string
	}{
		{"cachegrind 3.19", "desc: I1 cache: 65536 B\ncmd: ./switchyard serve\nevents: Ir\nfn=main\n0 71745\nsummary: 25754997\n", 25754997, ""},
		{"several events", "events: Ir Dr Dw\nsummary: 100 20 30\n", 100, ""},
		{"Ir not first", "events: Dr Ir\nsummary: 100 20\n", 0, "not Ir"},
		{"no events line", "summary: 100\n", 0, "not Ir"},
		{"no summary", "events: Ir\nfn=main\n0 1\n", 0, "no summary line"},
		{"empty summary", "events: Ir\nsummary:\n", 0, "empty"},
		{"not a number", "events: Ir\nsummary: 12x\n", 0, "summary"},
		{"negative", "events: Ir\nsummary: -5\n", 0, "summary"},
		{"line too long", "events: Ir\nfn=" + strings.Repeat("a", 2<<20) + "\nsummary: 1\n", 0, "cannot read"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := cachegrindSummary(strings.NewReader(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %d, %v; want an error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %d, %v; want %d", got, err, tt.want)
			}
		})
	}
}

// FuzzCachegrindSummary feeds arbitrary files to the summary reader: it must not panic, and
// a count it returns must be the one the summary line names.
func FuzzCachegrindSummary(f *testing.F) {
	f.Add([]byte("events: Ir\nfn=main\n0 71745\nsummary: 25754997\n"))
	f.Add([]byte("events: Ir Dr\nsummary: 1 2\nsummary: 3\n"))
	f.Add([]byte("events:\nsummary:"))
	f.Fuzz(func(t *testing.T, in []byte) {
		n, err := cachegrindSummary(strings.NewReader(string(in)))
		if err == nil && !strings.Contains(string(in), fmt.Sprint(n)) {
			t.Fatalf("count %d is not in the input", n)
		}
	})
}

// TestInstructionsWithoutValgrind: without valgrind on PATH the scenario fails with
// ErrNoValgrind, before it starts anything.
func TestInstructionsWithoutValgrind(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := Run(context.Background(), Options{Scenarios: []string{report.ScenarioInstructions},
		ReplicaCommand: []string{"switchyard", "serve"}, BareCommand: []string{"switchyard", "bare-proxy"}})
	if err == nil || !strings.Contains(err.Error(), ErrNoValgrind.Error()) {
		t.Fatalf("err = %v, want %v", err, ErrNoValgrind)
	}
}

func TestInstructionsOptions(t *testing.T) {
	err := Options{Scenarios: []string{report.ScenarioInstructions}, Requests: 9}.Validate()
	for _, want := range []string{"replica_command", "bare_command", "requests: the instructions scenario needs at least 10"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want %q", err, want)
		}
	}
	if slices.Contains(Scenarios(), report.ScenarioInstructions) {
		t.Error("all runs the instructions scenario, which needs valgrind")
	}
}

// TestInstructionsEndToEnd runs the instructions scenario on processes of the switchyard
// binary under valgrind: every row counted, every request answered, figures within sane
// bounds, and the router counted again in a fresh cluster agreeing within 5% (the point of
// the scenario: CPU time on a shared machine spreads much wider).
func TestInstructionsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs it under valgrind")
	}
	vg, err := ValgrindBinary()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("valgrind not found: CI counts the router's instructions (make testdeps; Debian: apt-get install valgrind)")
		}
		t.Skip("SKIPPED: valgrind not found, the instructions scenario is not tested (make testdeps; Debian: apt-get install valgrind)")
	}
	bin := buildSwitchyard(t)
	const n2, clients = 500, 4
	opts := Options{
		Scenarios: []string{report.ScenarioInstructions}, Engines: 2, Requests: n2, Concurrency: clients,
		ReplicaCommand: []string{bin, "serve"}, BareCommand: []string{bin, "bare-proxy"},
	}
	rep, err := Run(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	sc := rep.Scenarios[0]
	var names []string
	for _, r := range sc.Rows {
		names = append(names, r.Name)
	}
	if want := []string{"router", "bare", "router stream", "bare stream"}; sc.Name != report.ScenarioInstructions || !slices.Equal(names, want) {
		t.Fatalf("rows %q, want %q", names, want)
	}
	perReq := map[string]float64{}
	for _, r := range sc.Rows {
		f, m := r.Instructions, r.Summary
		n := n2
		if strings.HasSuffix(r.Name, " stream") {
			n = n2 / instructionStreamShare
		}
		if f == nil || m == nil || f.Requests != [2]int{n / 5, n} || m.Requests != n/5+n || m.OK != m.Requests {
			t.Fatalf("%s: counts %+v, summary %+v", r.Name, f, m)
		}
		if f.Instructions[0] == 0 || f.Instructions[1] <= f.Instructions[0] {
			t.Errorf("%s: instructions %v", r.Name, f.Instructions)
		}
		if lo, hi := 5e3, 500e3; strings.HasSuffix(r.Name, " stream") {
			lo, hi = 64*lo/10, 64*hi
			if f.PerRequest < lo || f.PerRequest > hi {
				t.Errorf("%s: %.0f instructions per stream, want %.0f..%.0f", r.Name, f.PerRequest, lo, hi)
			}
		} else if f.PerRequest < lo || f.PerRequest > hi {
			t.Errorf("%s: %.0f instructions per request, want %.0f..%.0f", r.Name, f.PerRequest, lo, hi)
		}
		perReq[r.Name] = f.PerRequest
		t.Logf("%s: %v instructions for %v requests", r.Name, f.Instructions, f.Requests)
	}
	if len(sc.InstructionRatios) != 2 {
		t.Fatalf("ratios %+v", sc.InstructionRatios)
	}
	for _, ir := range sc.InstructionRatios {
		prefix := ""
		if ir.Mode == "stream" {
			prefix = " stream"
		}
		if want := perReq["router"+prefix] / perReq[ir.Against+prefix]; ir.Against != "bare" || math.Abs(ir.Ratio-want) > 1e-9*want {
			t.Errorf("ratio %+v, want %v against bare", ir, want)
		}
	}
	checkRendered(t, rep)

	// The router again, in a fresh cluster.
	h := &harness{opts: opts.withDefaults()}
	c, err := h.opts.startCluster(t.Context(), instrClusterSpec(2))
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	small, err := h.smallRequests()
	if err != nil {
		t.Fatal(err)
	}
	row, err := h.instructionRow(t.Context(), c, h.instrTargets(c)[0], instrMode{name: "small", reqs: small, n: n2}, vg, t.TempDir(), clients)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("router again: %v instructions for %v requests", row.Instructions.Instructions, row.Instructions.Requests)
	again, first := row.Instructions.PerRequest, perReq["router"]
	t.Logf("router: %.0f then %.0f instructions per request; bare %.0f", first, again, perReq["bare"])
	if math.Abs(again-first) > 0.05*first {
		t.Errorf("the router's two counts differ by more than 5%%: %.0f and %.0f instructions per request", first, again)
	}
}

// buildSwitchyard builds cmd/switchyard without the race detector into a temporary
// directory and returns its path.
func buildSwitchyard(t *testing.T) string {
	t.Helper()
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		if goTool, err = exec.LookPath("go"); err != nil {
			t.Fatalf("no go tool to build the router: %v", err)
		}
	}
	bin := filepath.Join(t.TempDir(), "switchyard")
	if out, err := exec.Command(goTool, "build", "-o", bin, "switchyard/cmd/switchyard").CombinedOutput(); err != nil {
		t.Fatalf("cannot build the router: %v\n%s", err, out)
	}
	return bin
}
