package report

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
	"strings"
	"testing"
	"time"

	"switchyard/bench/loadgen"
	"switchyard/bench/workload"
)

func routingScenario() *Scenario {
	ms := time.Millisecond
	sum := func(worker string, cached int) *Summary {
		return Summarize([]loadgen.Result{ok(worker, 100, cached, 8, 10*ms, ms, 20*ms), ok("e1", 100, cached, 8, 30*ms, ms, 40*ms)},
			SummaryOptions{Workers: []string{"e0", "e1"}, TimeScale: 4, Elapsed: time.Second})
	}
	orc := &workload.OracleResult{Requests: 2, PromptTokens: 200, CachedTokens: 160, HitRate: 0.8}
	return &Scenario{
		Name: ScenarioRouting, Workload: "shared_prefix", Description: "2 groups <&> 1 prompt", Deployment: "2 plain engines",
		TimeBase: TimeSimulated, Speedup: 4, Oracle: orc,
		Rows: []Row{
			{Name: "round_robin", Summary: sum("e0", 20), Oracle: orc},
			{Name: "sticky", Summary: sum("e1", 80), Oracle: orc, Truncated: true},
			{Name: "cache_aware", Skipped: "needs a cache source"},
		},
		Notes: []string{"a note"},
	}
}

func TestWriteTableRouting(t *testing.T) {
	var b bytes.Buffer
	if err := WriteTable(&b, routingScenario()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"== routing: shared_prefix ==", "simulated (wall × speedup 4)", "POLICY", "TTFT p50",
		"round_robin", "sticky*", "skipped", "skipped cache_aware: needs a cache source",
		"oracle", "80.0%", "note: a note",
		"20.0%", "25.0%", // round_robin's hit rate and its share of the oracle's
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// TestWriteTableSendLate: an open-loop row says how late its requests were sent; a closed
// loop's rows say nothing.
func TestWriteTableSendLate(t *testing.T) {
	sc := routingScenario()
	var b bytes.Buffer
	if err := WriteTable(&b, sc); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "sent late") {
		t.Errorf("closed-loop rows report send lateness:\n%s", b.String())
	}
	sc.Rows[0].Summary.SendLate = &Lateness{P50: 0.3, P99: 3.5, Max: 41}
	b.Reset()
	if err := WriteTable(&b, sc); err != nil {
		t.Fatal(err)
	}
	if want := "sent late (wall ms after the arrival, p50 / p99 / max): round_robin 0.3 / 3.5 / 41.0\n"; !strings.Contains(b.String(), want) {
		t.Errorf("table lacks %q:\n%s", want, b.String())
	}
}

func TestWriteTablePooledBound(t *testing.T) {
	sc := routingScenario()
	pooled := &workload.OracleResult{Requests: 2, PromptTokens: 200, CachedTokens: 170, HitRate: 0.85}
	orc := *sc.Oracle
	orc.Pooled = pooled
	sc.Oracle = &orc
	var b bytes.Buffer
	if err := WriteTable(&b, sc); err != nil {
		t.Fatal(err)
	}
	// The pooled bound's hit rate and its ratio to the oracle's.
	if out := b.String(); !strings.Contains(out, "pooled bound") || !strings.Contains(out, "85.0%") || !strings.Contains(out, "106.2%") {
		t.Errorf("table lacks the pooled bound:\n%s", out)
	}
	// The trace's oracle: the no-queue fleet oracle beside it, with its ratio.
	orc.NoQueue = &workload.OracleResult{Requests: 2, PromptTokens: 200, CachedTokens: 164, HitRate: 0.82}
	b.Reset()
	if err := WriteTable(&b, sc); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "no-queue oracle") || !strings.Contains(out, "82.0%") || !strings.Contains(out, "102.5%") {
		t.Errorf("table lacks the no-queue oracle:\n%s", out)
	}
	b.Reset()
	if err := WriteTable(&b, routingScenario()); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "pooled") || strings.Contains(b.String(), "no-queue") {
		t.Errorf("a pooled oracle has no pooled bound or no-queue row:\n%s", b.String())
	}
}

// TestWriteTableHitLoss writes a row's HitLoss as shares of the oracle's cached tokens.
func TestWriteTableHitLoss(t *testing.T) {
	sc := routingScenario()
	sc.Rows[0].Loss = &HitLoss{Simulated: 0.5, OracleCached: 1000, Gone: LossClass{Tokens: 100, Requests: 1},
		Elsewhere: LossClass{Tokens: 250, Requests: 2}, Queued: LossClass{Tokens: 50, Requests: 1},
		OnHolder: LossClass{Tokens: 10, Requests: 1}, Gained: LossClass{Tokens: 5, Requests: 1}}
	var b bytes.Buffer
	if err := WriteTable(&b, sc); err != nil {
		t.Fatal(err)
	}
	want := "hits " + sc.Rows[0].Name + ": measured " + pct(sc.Rows[0].Summary.HitRate) + ", simulated 50.0%; of the oracle's cached tokens lost: " +
		"gone 10.0% (1 req), elsewhere 25.0% (2 req), queued 5.0% (1 req), on holder 1.0% (1 req); gained 0.5% (1 req)"
	if !strings.Contains(b.String(), want) {
		t.Errorf("table lacks %q:\n%s", want, b.String())
	}
	if n := strings.Count(b.String(), "hits "); n != 1 {
		t.Errorf("%d loss lines, want 1 (rows without a loss have none):\n%s", n, b.String())
	}
	if strings.Contains(b.String(), "left ") {
		t.Errorf("a row without decision records has a left line:\n%s", b.String())
	}

	sc.Rows[0].Loss.Left = &LeftHolder{Unseen: LossClass{Tokens: 100, Requests: 1}, Slower: LossClass{Tokens: 120, Requests: 2},
		Tie: LossClass{Tokens: 30, Requests: 1}, HolderQueue: 1.5, ChosenQueue: 0.25, HolderActual: 0.75}
	b.Reset()
	if err := WriteTable(&b, sc); err != nil {
		t.Fatal(err)
	}
	want = "left " + sc.Rows[0].Name + ": elsewhere and queued by the router's view: unseen 10.0% (1 req), slower 12.0% (2 req), tie 3.0% (1 req), unrecorded 0.0% (0 req); " +
		"slower: queue ahead on the holder 1.50 s (simulated 0.75 s), on the engine chosen 0.25 s (medians)"
	if !strings.Contains(b.String(), want) {
		t.Errorf("table lacks %q:\n%s", want, b.String())
	}
}

func TestWriteTableOverheadAndMailbox(t *testing.T) {
	ms := time.Millisecond
	direct := Row{Name: "direct", CPUSecondsPer1K: 0.030, Summary: Summarize([]loadgen.Result{ok("e0", 1, 0, 1, ms, 0, ms)}, SummaryOptions{Workers: []string{"e0"}, Elapsed: ms})}
	router := Row{Name: "router", CPUSecondsPer1K: 0.050, Summary: Summarize([]loadgen.Result{ok("e0", 1, 0, 1, 2*ms, 0, 2*ms)}, SummaryOptions{Workers: []string{"e0"}, Elapsed: 2 * ms})}
	sc := &Scenario{Name: ScenarioOverhead, Deployment: "d", TimeBase: TimeWall, Rows: []Row{direct, router},
		Overhead: &Overhead{Share: 0.5, AddedP50ms: 1, AddedP99ms: 1, RouterCPUSecondsPer1K: 0.02}}
	var b bytes.Buffer
	if err := WriteTable(&b, sc); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"== overhead ==", "wall clock", "MODE", "0.030", "0.050", "keeps 50.0% of direct", "router CPU 0.020 s per 1,000"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("overhead table lacks %q:\n%s", want, b.String())
		}
	}

	rejected := Summarize([]loadgen.Result{ok("e0", 1, 0, 1, ms, 0, ms), {Status: 429, Error: "overloaded"}, {Status: 429, Error: "overloaded"}, ok("e0", 1, 0, 1, ms, 0, ms)},
		SummaryOptions{Workers: []string{"e0"}, Elapsed: time.Second})
	mb := &Scenario{Name: ScenarioMailbox, Deployment: "d", TimeBase: TimeWall, Rows: []Row{{Name: "mailbox 1", Mailbox: 1, Summary: rejected}}}
	b.Reset()
	if err := WriteTable(&b, mb); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"MAILBOX", "429 RATE", "50.0%", "errors mailbox 1: 429×2 (overloaded×2)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("mailbox table lacks %q:\n%s", want, b.String())
		}
	}
	if got := RejectRate(rejected); got != 0.5 {
		t.Errorf("RejectRate = %v", got)
	}
}

func TestWriteJSONRoundTrips(t *testing.T) {
	rep := &Report{Tool: "switchyard bench", Started: time.Unix(0, 0).UTC(), Scenarios: []*Scenario{routingScenario()}}
	var b bytes.Buffer
	if err := WriteJSON(&b, rep); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	sc := back.Scenarios[0]
	if sc.Name != ScenarioRouting || len(sc.Rows) != 3 || sc.Rows[0].Summary.TTFT.P50 == 0 || sc.Oracle.HitRate != 0.8 || sc.Rows[2].Skipped == "" {
		t.Errorf("round trip lost data: %+v", sc)
	}
	for _, key := range []string{`"ttft_ms"`, `"hit_rate"`, `"spread_requests"`, `"spread_prefill_tokens"`, `"oracle"`} {
		if !bytes.Contains(b.Bytes(), []byte(key)) {
			t.Errorf("JSON lacks %s", key)
		}
	}
}

// checkSVG parses out as XML and returns its text content.
func checkSVG(t *testing.T, out []byte) string {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(out))
	var text strings.Builder
	root := ""
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("chart is not well-formed XML: %v", err)
		}
		switch v := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = v.Name.Local
			}
		case xml.CharData:
			text.Write(v)
			text.WriteByte('\n')
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q", root)
	}
	return text.String()
}

func TestWriteSVG(t *testing.T) {
	for _, sc := range []*Scenario{
		routingScenario(),
		{Name: ScenarioMailbox, Deployment: "d", TimeBase: TimeWall, Rows: []Row{{Name: "mailbox 4", Mailbox: 4, Summary: &Summary{Requests: 4, OK: 2, ErrorsByStatus: map[string]int{"429": 2}}}}},
		{Name: ScenarioOverhead, Deployment: "d", TimeBase: TimeWall, Rows: []Row{{Name: "direct", Summary: &Summary{RequestsPerS: 10}, CPUSecondsPer1K: 0.1}}},
	} {
		t.Run(sc.Name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteSVG(&b, sc); err != nil {
				t.Fatal(err)
			}
			text := checkSVG(t, b.Bytes())
			for i := range sc.Rows {
				name := sc.Rows[i].Name
				if !strings.Contains(text, name) {
					t.Errorf("chart lacks row %q", name)
				}
			}
		})
	}
	var b bytes.Buffer
	if err := WriteSVG(&b, routingScenario()); err != nil {
		t.Fatal(err)
	}
	text := checkSVG(t, b.Bytes())
	for _, want := range []string{"Time to first token", "Cache hit rate", "oracle 80.0%", "Load spread", "cache_aware (skipped)", "2 groups <&> 1 prompt"} {
		if !strings.Contains(text, want) {
			t.Errorf("routing chart lacks %q", want)
		}
	}
}

func TestWrap(t *testing.T) {
	tests := []struct {
		s     string
		width int
		want  []string
	}{
		{"", 10, []string{""}},
		{"a b c", 10, []string{"a b c"}},
		{"aaaa bbbb cccc", 9, []string{"aaaa bbbb", "cccc"}},
		{"averyveryverylongword x", 5, []string{"averyveryverylongword", "x"}},
	}
	for _, tt := range tests {
		if got := wrap(tt.s, tt.width); strings.Join(got, "|") != strings.Join(tt.want, "|") {
			t.Errorf("wrap(%q, %d) = %q, want %q", tt.s, tt.width, got, tt.want)
		}
	}
}
