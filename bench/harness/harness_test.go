package harness

import (
	"bytes"
	"context"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"switchyard/bench/reference"
	"switchyard/bench/report"
	"switchyard/bench/workload"
	"switchyard/config"
)

// mayBeSkipped are the policies whose router wiring may still be missing; every other row
// must be measured.
var mayBeSkipped = map[string]bool{config.PolicySessionAware: true}

// checkRow asserts that a measured row is complete: every request answered, every figure
// present, every request on a known engine, the hit rate within the oracle.
func checkRow(t *testing.T, r *report.Row, requests, engines int, streamed bool) {
	t.Helper()
	m := r.Summary
	if m == nil {
		t.Fatalf("%s: no summary (skipped: %q)", r.Name, r.Skipped)
	}
	if m.Requests != requests || m.OK != requests || m.Unknown != 0 || r.Truncated {
		t.Errorf("%s: %d requests, %d ok (errors by status %v, by code %v), %d on unknown engines, truncated %v; want %d ok",
			r.Name, m.Requests, m.OK, m.ErrorsByStatus, m.ErrorsByCode, m.Unknown, r.Truncated, requests)
	}
	if m.TTFT.N != requests || m.E2E.N != requests || m.TTFT.P50 <= 0 || m.E2E.P99 < m.E2E.P50 || m.TTFT.P99 < m.TTFT.P90 {
		t.Errorf("%s: latency figures incomplete: ttft %+v e2e %+v", r.Name, m.TTFT, m.E2E)
	}
	if streamed && m.ITL.N != requests {
		t.Errorf("%s: ITL over %d requests, want %d", r.Name, m.ITL.N, requests)
	}
	if m.RequestsPerS <= 0 || m.OutputTokensPerS <= 0 || m.PromptTokens <= 0 || len(m.Workers) != engines {
		t.Errorf("%s: throughput %v req/s %v tok/s, %d prompt tokens, %d workers", r.Name, m.RequestsPerS, m.OutputTokensPerS, m.PromptTokens, len(m.Workers))
	}
	served := 0
	for _, w := range m.Workers {
		served += w.Requests
	}
	if served != requests && engines > 0 && r.Name != "" && !strings.HasPrefix(r.Name, "pd") {
		t.Errorf("%s: engines served %d of %d requests", r.Name, served, requests)
	}
	if r.Oracle != nil && m.HitRate > r.Oracle.HitRate+1e-9 {
		t.Errorf("%s: hit rate %.4f exceeds the oracle's %.4f", r.Name, m.HitRate, r.Oracle.HitRate)
	}
}

func checkRendered(t *testing.T, rep *report.Report) {
	t.Helper()
	var b bytes.Buffer
	if err := report.WriteJSON(&b, rep); err != nil {
		t.Error(err)
	}
	for _, sc := range rep.Scenarios {
		b.Reset()
		if err := report.WriteTable(&b, sc); err != nil {
			t.Error(err)
		}
		for i := range sc.Rows {
			if !strings.Contains(b.String(), sc.Rows[i].Name) && sc.Name != report.ScenarioMailbox {
				t.Errorf("%s table lacks row %s", sc.Title(), sc.Rows[i].Name)
			}
		}
		b.Reset()
		if err := report.WriteSVG(&b, sc); err != nil || !bytes.HasPrefix(b.Bytes(), []byte("<svg")) {
			t.Errorf("%s chart: %v", sc.Title(), err)
		}
	}
}

// TestRoutingEndToEnd runs the routing scenario on a small shared-prefix workload with two
// groups over four engines, every policy on fresh engines and a fresh router, and checks
// that the report is complete and that the policies differ where they must: round_robin
// spreads requests exactly evenly, and sticky, which ignores load and pins each group's
// routing key, puts everything on two engines (spread 2), which no load-aware policy does.
func TestRoutingEndToEnd(t *testing.T) {
	var progress bytes.Buffer
	opts := Options{
		Scenarios: []string{report.ScenarioRouting},
		Workloads: []string{workload.NameSharedPrefix},
		Workload: workload.Config{SharedPrefix: workload.SharedPrefixConfig{
			Groups: 2, PromptsPerGroup: 32, SystemPromptLen: 512, QuestionLen: 32, OutputLen: 8}},
		Engines: 4, Speedup: 10, Concurrency: 8, Duration: 45 * time.Second, Seed: 1,
		Progress: &progress,
	}
	rep, err := Run(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Scenarios) != 1 {
		t.Fatalf("%d scenarios", len(rep.Scenarios))
	}
	sc := rep.Scenarios[0]
	if sc.Name != report.ScenarioRouting || sc.Workload != workload.NameSharedPrefix || sc.TimeBase != report.TimeSimulated || sc.Speedup != 10 {
		t.Errorf("scenario %+v", sc)
	}
	if len(sc.Rows) != len(DefaultPolicies()) {
		t.Fatalf("%d rows, want one per default policy", len(sc.Rows))
	}
	if sc.Oracle == nil || sc.Oracle.Requests != 64 || !(sc.Oracle.HitRate > 0.5 && sc.Oracle.HitRate < 1) {
		t.Fatalf("oracle %+v", sc.Oracle)
	}
	rows := map[string]*report.Row{}
	for i := range sc.Rows {
		r := &sc.Rows[i]
		rows[r.Name] = r
		if r.Skipped != "" {
			if !mayBeSkipped[r.Name] {
				t.Errorf("%s skipped: %s", r.Name, r.Skipped)
			}
			continue
		}
		checkRow(t, r, 64, 4, true)
		if *r.Oracle != *sc.Oracle {
			t.Errorf("%s: oracle %+v, want the scenario's", r.Name, r.Oracle)
		}
		if r.Summary.HitRate <= 0 {
			t.Errorf("%s: no cache hits on a shared-prefix workload", r.Name)
		}
	}
	if got := rows[config.PolicyRoundRobin].Summary.SpreadRequests; got != 1 {
		t.Errorf("round_robin request spread %v, want exactly 1 (16 requests on each engine)", got)
	}
	sticky, p2c := rows[config.PolicySticky], rows[config.PolicyPowerOfTwo]
	if sticky.Skipped != "" {
		t.Fatalf("sticky skipped: %s", sticky.Skipped)
	}
	if got := sticky.Summary.SpreadRequests; got < 2 {
		t.Errorf("sticky request spread %v, want at least 2 (two routing keys on four engines)", got)
	}
	if s, p := sticky.Summary.SpreadRequests, p2c.Summary.SpreadRequests; !(s > p) {
		t.Errorf("sticky spread %v is not larger than power_of_two's %v", s, p)
	}
	for _, name := range []string{config.PolicyRoundRobin, config.PolicySticky} {
		if !strings.Contains(progress.String(), "routing shared_prefix "+name+": ") {
			t.Errorf("no progress line for %s:\n%s", name, progress.String())
		}
	}
	checkRendered(t, rep)
}

// TestPDAndBucketsEndToEnd runs the pd and buckets scenarios briefly.
func TestPDAndBucketsEndToEnd(t *testing.T) {
	opts := Options{
		Scenarios:  []string{report.ScenarioPD, report.ScenarioBuckets},
		PDPolicies: mustPolicies("round_robin,power_of_two"),
		Workload: workload.Config{
			SharedPrefix: workload.SharedPrefixConfig{Groups: 2, PromptsPerGroup: 8, SystemPromptLen: 256, QuestionLen: 16, OutputLen: 4},
			LongContext: workload.LongContextConfig{Requests: 24, OutputLen: 4, Classes: []workload.LengthClass{
				{Name: "short", Min: 20, Max: 60, Weight: 2}, {Name: "medium", Min: 200, Max: 300, Weight: 1}, {Name: "long", Min: 800, Max: 1000, Weight: 1}}},
		},
		Engines: 3, Prefill: 1, Decode: 2, Speedup: 20, Concurrency: 4, Duration: 45 * time.Second,
	}
	rep, err := Run(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Scenarios) != 2 {
		t.Fatalf("%d scenarios", len(rep.Scenarios))
	}
	pd := rep.Scenarios[0]
	if pd.Name != report.ScenarioPD || len(pd.Rows) != 2 || pd.Oracle == nil {
		t.Fatalf("pd scenario %+v", pd)
	}
	for i := range pd.Rows {
		r := &pd.Rows[i]
		checkRow(t, r, 16, 3, true)
		for _, w := range r.Summary.Workers {
			if strings.HasPrefix(w.Worker, "p") && (w.Requests != 0 || w.PrefillTokens == 0) {
				t.Errorf("%s: prefill engine %+v", r.Name, w)
			}
		}
		// One prefill engine: every prefill lands on it.
		if r.Summary.SpreadPrefill != 1 {
			t.Errorf("%s: prefill spread %v over one engine", r.Name, r.Summary.SpreadPrefill)
		}
	}
	bk := rep.Scenarios[1]
	var names []string
	for i := range bk.Rows {
		names = append(names, bk.Rows[i].Name)
	}
	want := "single_pool,single_pool/short,single_pool/medium,single_pool/long,buckets,buckets/short,buckets/medium,buckets/long"
	if strings.Join(names, ",") != want {
		t.Fatalf("buckets rows %v", names)
	}
	perClass := 0
	for i := range bk.Rows {
		r := &bk.Rows[i]
		// Unknown == 0 on buckets/<class>: every request of the class was served by one of
		// its bucket's engines.
		if r.Summary == nil || r.Summary.Unknown != 0 || r.Summary.ErrorCount() != 0 {
			t.Errorf("%s: %+v", r.Name, r.Summary)
		}
		if strings.HasPrefix(r.Name, "buckets/") {
			perClass += r.Summary.Requests
		}
	}
	if perClass != 24 || bk.Rows[4].Summary.Requests != 24 {
		t.Errorf("per-class rows cover %d of 24 requests", perClass)
	}
	checkRendered(t, rep)
}

// TestOverheadAndMailboxEndToEnd runs the throughput scenarios briefly.
func TestOverheadAndMailboxEndToEnd(t *testing.T) {
	opts := Options{
		Scenarios:   []string{report.ScenarioOverhead},
		Engines:     2,
		Duration:    time.Second,
		Concurrency: 16,
	}
	rep, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	// The mailbox rows are bursts of a fixed size; their duration is only a safety bound,
	// generous so that a loaded machine still sends the whole burst.
	opts.Scenarios, opts.Duration = []string{report.ScenarioMailbox}, time.Minute
	opts.MailboxSizes, opts.MailboxRequests = []int{1, 1024}, 400
	mrep, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	ov := rep.Scenarios[0]
	// direct, the router and the references, for small requests and for streams.
	want := []string{"direct", "router", "bare", "nginx", "direct stream", "router stream", "bare stream", "nginx stream"}
	if _, err := reference.NginxBinary(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("nginx not found: the overhead scenario measures the router against it (make testdeps)")
		}
		t.Log("SKIPPED: nginx not found, the overhead scenario's nginx rows are not checked (make testdeps)")
		want = []string{"direct", "router", "bare", "direct stream", "router stream", "bare stream"}
	}
	var names []string
	for _, r := range ov.Rows {
		names = append(names, r.Name)
	}
	if ov.Name != report.ScenarioOverhead || !slices.Equal(names, want) || ov.Overhead == nil {
		t.Fatalf("overhead scenario rows %q, want %q", names, want)
	}
	for i := range ov.Rows {
		r := &ov.Rows[i]
		if r.Summary.OK == 0 || r.Summary.ErrorCount() != 0 || r.CPUSecondsPer1K <= 0 || r.Summary.RequestsPerS <= 0 || r.Summary.Unknown != 0 {
			t.Errorf("%s: cpu %v, %+v", r.Name, r.CPUSecondsPer1K, r.Summary)
		}
		if per := r.Summary.OutputTokensPerS / r.Summary.RequestsPerS; strings.HasSuffix(r.Name, " stream") && math.Abs(per-streamTokens) > 0.01 {
			t.Errorf("%s: %.2f output tokens per stream", r.Name, per)
		}
	}
	if ov.Overhead.Share <= 0 || len(ov.Overhead.References) != 2*(len(want)/2-2) {
		t.Errorf("overhead figures %+v", ov.Overhead)
	}
	for _, rr := range ov.Overhead.References {
		if rr.Throughput <= 0 || (rr.Mode != "small" && rr.Mode != "stream") {
			t.Errorf("reference ratio %+v", rr)
		}
	}
	mb := mrep.Scenarios[0]
	if mb.Name != report.ScenarioMailbox || len(mb.Rows) != 2 || mb.Rows[0].Mailbox != 1 || mb.Rows[1].Mailbox != 1024 {
		t.Fatalf("mailbox scenario %+v", mb)
	}
	for i := range mb.Rows {
		m := mb.Rows[i].Summary
		if m.Requests != 400 || m.OK+m.ErrorsByStatus["429"] != 400 {
			t.Errorf("mailbox %d: %d requests, %d ok, errors %v", mb.Rows[i].Mailbox, m.Requests, m.OK, m.ErrorsByStatus)
		}
	}
	// Sixteen clients cannot fill a mailbox of 1024.
	if n := mb.Rows[1].Summary.ErrorsByStatus["429"]; n != 0 {
		t.Errorf("mailbox 1024 refused %d requests", n)
	}
	checkRendered(t, rep)
	checkRendered(t, mrep)
}

func TestRunRejectsBadOptions(t *testing.T) {
	if _, err := Run(context.Background(), Options{Engines: -1}); err == nil {
		t.Fatal("no error")
	}
}

// TestHeterogeneousFlavorsEndToEnd runs the routing scenario on a fleet with one engine five
// times slower, on both flavours: two scenarios tagged with their flavour, the slow engine's
// share in the table, round_robin's share exactly a quarter, load_based's smaller. The
// engines run two requests at a time, so queues form and their length (from /v1/loads or
// the gauge on SGLang, from /metrics on vLLM) steers load_based.
func TestHeterogeneousFlavorsEndToEnd(t *testing.T) {
	opts := Options{
		Scenarios: []string{report.ScenarioRouting},
		Workloads: []string{workload.NameZeroReuse},
		Workload:  workload.Config{ZeroReuse: workload.ZeroReuseConfig{Requests: 64, PromptLen: 256, OutputLen: 32}},
		Policies:  mustPolicies("round_robin,load_based"),
		Flavors:   []string{"sglang", "vllm"},
		Engines:   4, EngineSpeeds: []float64{1, 1, 1, 0.2}, MaxRunning: 2,
		Speedup: 4, Concurrency: 16, Duration: 45 * time.Second, Seed: 1,
	}
	rep, err := Run(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Scenarios) != 2 {
		t.Fatalf("%d scenarios, want one per flavour", len(rep.Scenarios))
	}
	for i, flavor := range []string{"sglang", "vllm"} {
		sc := rep.Scenarios[i]
		if sc.Flavor != flavor || !strings.HasSuffix(sc.Title(), "["+flavor+"]") || len(sc.SlowWorkers) != 1 || sc.SlowWorkers[0] != "e3" ||
			!strings.Contains(sc.Deployment, "e3 0.2×") || !strings.Contains(sc.Deployment, flavor+" engines") {
			t.Fatalf("scenario %d: flavor %q title %q slow %v deployment %q", i, sc.Flavor, sc.Title(), sc.SlowWorkers, sc.Deployment)
		}
		for j := range sc.Rows {
			checkRow(t, &sc.Rows[j], 64, 4, true)
		}
		rr, lb := sc.SlowShare(&sc.Rows[0]), sc.SlowShare(&sc.Rows[1])
		t.Logf("%s: slow engine's share %.3f under round_robin, %.3f under load_based", flavor, rr, lb)
		if rr != 0.25 || !(lb < rr) {
			t.Errorf("%s: slow engine's share %.3f under round_robin (want 0.25), %.3f under load_based (want less)", flavor, rr, lb)
		}
		var b bytes.Buffer
		if err := report.WriteTable(&b, sc); err != nil || !strings.Contains(b.String(), "SLOW") || !strings.Contains(b.String(), "25.0%") {
			t.Errorf("%s table: %v\n%s", flavor, err, b.String())
		}
	}
	checkRendered(t, rep)
}

// TestSLOEndToEnd runs the slo scenario briefly: both orders on fresh engines with the
// background load, every foreground request answered, and capacity order keeping every
// request on the first bucket.
func TestSLOEndToEnd(t *testing.T) {
	opts := Options{
		Scenarios: []string{report.ScenarioSLO},
		Workload:  workload.Config{ZeroReuse: workload.ZeroReuseConfig{Requests: 30, PromptLen: 256, OutputLen: 4}},
		Engines:   2, Speedup: 10, Duration: 3 * time.Second, SLORate: 20, SLOBackgroundPromptLen: 1000,
	}
	rep, err := Run(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	sc := rep.Scenarios[0]
	if sc.Name != report.ScenarioSLO || len(sc.Rows) != 2 || sc.Rows[0].Name != "capacity" || sc.Rows[1].Name != "slo" {
		t.Fatalf("scenario %+v", sc)
	}
	for i := range sc.Rows {
		r := &sc.Rows[i]
		checkRow(t, r, 30, 2, true)
		o := r.SLO
		if o == nil || o.TargetTTFTMs != 200 || o.Attainment < 0 || o.Attainment > 1 || o.Met > 30 {
			t.Fatalf("%s: slo summary %+v", r.Name, o)
		}
		// A request finds an estimate once the router has learned from an earlier stream;
		// how many do depends on timing (the whole row may be sent before the first token),
		// so only their consistency is checked here.
		if o.EstimateRatio.N > 30 || (o.EstimateRatio.N > 0) != (o.Estimated.P50 > 0) {
			t.Errorf("%s: estimates %+v, estimated %+v", r.Name, o.EstimateRatio, o.Estimated)
		}
	}
	if got := sc.Rows[0].SLO.Buckets; got["a"] != 30 {
		t.Errorf("capacity order: requests by bucket %v, want all 30 on a", got)
	}
	checkRendered(t, rep)
}

// TestExtraTablesEndToEnd runs the routing scenario's data-parallel (by load and by prefix
// holdings), fairness and LoRA tables
// and the pd scenario's bypass table briefly: each has its rows in order; every rank of both
// engines admits prompts; the fairness rows per tenant split their deployment's requests;
// preloaded adapters need no load and adapters loaded on demand fill at most the slots; the
// bypass row sends requests to a decode engine alone and the pair row none.
func TestExtraTablesEndToEnd(t *testing.T) {
	opts := Options{
		Scenarios: []string{report.ScenarioRouting, report.ScenarioPD},
		Workloads: []string{workload.NameSharedPrefix}, Policies: mustPolicies("round_robin"),
		PDPolicies: mustPolicies("round_robin"),
		Workload: workload.Config{
			SharedPrefix: workload.SharedPrefixConfig{Groups: 2, PromptsPerGroup: 4, SystemPromptLen: 64, QuestionLen: 8, OutputLen: 2},
			LongContext: workload.LongContextConfig{Requests: 32, OutputLen: 2, Classes: []workload.LengthClass{
				{Name: "short", Min: 20, Max: 60, Weight: 2}, {Name: "long", Min: 400, Max: 600, Weight: 1}}},
		},
		Engines: 2, Prefill: 1, Decode: 1, Speedup: 20, Concurrency: 4, Seed: 1,
		// The bypass table's mix has 800 requests: the bound ends its rows early, which the
		// assertions below allow (they count, they do not time).
		Duration: 3 * time.Second, DPRanks: 2, PDBypassTokens: 256, FairnessLimit: 2, LoRAAdapters: 2,
	}
	rep, err := Run(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	byTitle := map[string]*report.Scenario{}
	for _, sc := range rep.Scenarios {
		byTitle[sc.Title()] = sc
	}
	dp := byTitle["routing: long_context_dp"]
	if dp == nil || len(dp.Rows) != 2 || dp.Rows[0].Name != "engine's balancer" || dp.Rows[1].Name != "router's ranks" {
		t.Fatalf("dp table %+v (scenarios %v)", dp, slices.Sorted(maps.Keys(byTitle)))
	}
	for i := range dp.Rows {
		r := &dp.Rows[i]
		if r.Summary == nil || r.Summary.OK == 0 || r.Summary.ErrorCount() != 0 || len(r.RankPromptTokens) != 4 {
			t.Fatalf("%s: summary %+v, rank tokens %v", r.Name, r.Summary, r.RankPromptTokens)
		}
		var sum int64
		for rank, n := range r.RankPromptTokens {
			if n == 0 {
				t.Errorf("%s: rank %d of engine %d admitted no prompt", r.Name, rank%2, rank/2)
			}
			sum += n
		}
		if sum != r.Summary.PromptTokens {
			t.Errorf("%s: ranks admitted %d prompt tokens, the requests carried %d", r.Name, sum, r.Summary.PromptTokens)
		}
	}
	dpp := byTitle["routing: shared_prefix_dp"]
	var dppNames []string
	if dpp != nil {
		for i := range dpp.Rows {
			r := &dpp.Rows[i]
			dppNames = append(dppNames, r.Name)
			if r.Summary == nil || r.Summary.OK == 0 || r.Summary.ErrorCount() != 0 || len(r.RankPromptTokens) != 4 {
				t.Errorf("%s: summary %+v, rank tokens %v", r.Name, r.Summary, r.RankPromptTokens)
			}
		}
	}
	if want := "engine's balancer,router's ranks by load,router's ranks by prefix"; strings.Join(dppNames, ",") != want {
		t.Fatalf("dp prefix rows %v, want %s", dppNames, want)
	}
	fair := byTitle["routing: tenant_mix"]
	var names []string
	if fair != nil {
		for i := range fair.Rows {
			names = append(names, fair.Rows[i].Name)
		}
	}
	if want := "fifo,fifo/bulk,fifo/chat,fair,fair/bulk,fair/chat"; strings.Join(names, ",") != want {
		t.Fatalf("fairness rows %v, want %s (scenarios %v)", names, want, slices.Sorted(maps.Keys(byTitle)))
	}
	for i := 0; i < len(fair.Rows); i += 3 {
		whole, bulk, chat := fair.Rows[i].Summary, fair.Rows[i+1].Summary, fair.Rows[i+2].Summary
		if whole == nil || bulk == nil || chat == nil || whole.ErrorCount() != 0 || bulk.OK == 0 || chat.OK == 0 || bulk.OK+chat.OK != whole.OK {
			t.Errorf("%s: %+v split into bulk %+v and chat %+v", fair.Rows[i].Name, whole, bulk, chat)
		}
	}
	lora := byTitle["routing: adapter_mix"]
	if lora == nil || len(lora.Rows) != 2 || lora.Rows[0].Name != "preloaded" || lora.Rows[1].Name != "on demand" {
		t.Fatalf("LoRA table %+v", lora)
	}
	for i := range lora.Rows {
		r := &lora.Rows[i]
		if r.Summary == nil || r.Summary.OK == 0 || r.Summary.ErrorCount() != 0 || r.LoRA == nil || r.LoRA.Hits+r.LoRA.Loads+r.LoRA.Replicas < int64(r.Summary.OK) {
			t.Fatalf("%s: summary %+v, adapter figures %+v", r.Name, r.Summary, r.LoRA)
		}
	}
	// Two engines of one slot each on demand: each adapter loaded once.
	if pre, od := lora.Rows[0].LoRA, lora.Rows[1].LoRA; pre.EngineLoads != 0 || od.EngineLoads != 2 || od.Loads == 0 {
		t.Errorf("adapter loads: %+v preloaded, %+v on demand", pre, od)
	}
	bp := byTitle["pd: short_mix"]
	if bp == nil || len(bp.Rows) != 2 {
		t.Fatalf("bypass table %+v (scenarios %v)", bp, slices.Sorted(maps.Keys(byTitle)))
	}
	pair, bypass := bp.Rows[0].Summary, bp.Rows[1].Summary
	if pair == nil || bypass == nil || pair.OK == 0 || bypass.OK == 0 {
		t.Fatalf("bypass rows %+v %+v", pair, bypass)
	}
	if pair.Bypassed != 0 || bypass.Bypassed == 0 {
		t.Errorf("bypassed: %d without the bypass, %d with it", pair.Bypassed, bypass.Bypassed)
	}
	checkRendered(t, rep)
}
