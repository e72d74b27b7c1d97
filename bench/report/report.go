package report

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	"switchyard/bench/workload"
)

// Scenario names.
const (
	ScenarioOverhead = "overhead"
	ScenarioRouting  = "routing"
	ScenarioPD       = "pd"
	ScenarioBuckets  = "buckets"
	ScenarioMailbox  = "mailbox"
	ScenarioTrace    = "trace"
	ScenarioReplicas = "replicas"
	ScenarioSLO      = "slo"
	// ScenarioInstructions counts the user-space instructions a proxy process executes per
	// request, under valgrind.
	ScenarioInstructions = "instructions"
)

// Time bases of a scenario's figures.
const (
	TimeSimulated = "simulated"
	TimeWall      = "wall"
)

// Report is one invocation of the harness.
type Report struct {
	// Tool names the producer, "switchyard bench".
	Tool string `json:"tool"`
	// Started is when the run began.
	Started time.Time `json:"started"`
	// Machine describes where it ran.
	Machine Machine `json:"machine"`
	// Settings are the options the harness ran with.
	Settings any `json:"settings"`
	// Scenarios are the measured scenarios, in order.
	Scenarios []*Scenario `json:"scenarios"`
}

// Machine describes the host of a run.
type Machine struct {
	OS        string `json:"os"`
	Arch      string `json:"arch"`
	CPUs      int    `json:"cpus"`
	GoVersion string `json:"go_version"`
	// LoadAverage is /proc/loadavg's 1, 5 and 15 minute figures when the run started, where
	// available: a busy machine inflates every latency.
	LoadAverage string `json:"load_average,omitempty"`
}

// Scenario is one measured comparison: its rows share a workload and a deployment.
type Scenario struct {
	// Name is one of the Scenario* names.
	Name string `json:"name"`
	// Workload names the workload, and Description its shape.
	Workload    string `json:"workload,omitempty"`
	Description string `json:"description,omitempty"`
	// Deployment describes the engines and the router.
	Deployment string `json:"deployment"`
	// TimeBase is TimeSimulated (wall × speedup) or TimeWall.
	TimeBase string `json:"time_base"`
	// Speedup is the engines' speedup (the simulated time scale).
	Speedup float64 `json:"speedup"`
	// Rows are the policies, variants or sizes compared.
	Rows []Row `json:"rows"`
	// Oracle bounds the hit rate of the longest row's requests (routing and pd).
	Oracle *workload.OracleResult `json:"oracle,omitempty"`
	// Overhead holds the overhead scenario's derived figures.
	Overhead *Overhead `json:"overhead,omitempty"`
	// InstructionRatios compare the router's instructions per request with each reference
	// proxy's, in each mode (the instructions scenario).
	InstructionRatios []InstructionRatio `json:"instruction_ratios,omitempty"`
	// Notes explain figures a reader could misread.
	Notes []string `json:"notes,omitempty"`
	// Flavor is the engines' flavour ("vllm", "sglang") when the run compares flavours or
	// uses a non-default one; "" otherwise.
	Flavor string `json:"flavor,omitempty"`
	// SlowWorkers are the engines slower than the rest of a heterogeneous fleet; the table
	// then shows the share of requests they served (SLOW).
	SlowWorkers []string `json:"slow_workers,omitempty"`
}

// Title is the scenario's heading, e.g. "routing: shared_prefix" or
// "routing: shared_prefix [vllm]".
func (s *Scenario) Title() string {
	t := s.Name
	if s.Workload != "" {
		t += ": " + s.Workload
	}
	if s.Flavor != "" {
		t += " [" + s.Flavor + "]"
	}
	return t
}

// FileStem is the scenario's file name without extension, e.g. "routing-shared_prefix" or
// "routing-shared_prefix-vllm".
func (s *Scenario) FileStem() string {
	t := s.Name
	if s.Workload != "" {
		t += "-" + s.Workload
	}
	if s.Flavor != "" {
		t += "-" + s.Flavor
	}
	return t
}

// SlowShare is the share of a row's successful requests the scenario's SlowWorkers served,
// or -1 when the scenario has none or the row no summary.
func (s *Scenario) SlowShare(r *Row) float64 {
	if len(s.SlowWorkers) == 0 || r.Summary == nil || r.Summary.OK == 0 {
		return -1
	}
	n := 0
	for _, w := range r.Summary.Workers {
		if slices.Contains(s.SlowWorkers, w.Worker) {
			n += w.Requests
		}
	}
	return float64(n) / float64(r.Summary.OK)
}

// Row is one policy, variant or mailbox size of a scenario.
type Row struct {
	// Name is the policy ("power_of_two"), variant ("buckets/short") or mode ("router").
	Name string `json:"name"`
	// Skipped, when set, says why the row was not measured (e.g. the policy cannot be built
	// yet); nothing else is set.
	Skipped string `json:"skipped,omitempty"`
	// Summary holds the measured figures.
	Summary *Summary `json:"summary,omitempty"`
	// Oracle bounds the hit rate of the requests this row sent (routing and pd).
	Oracle *workload.OracleResult `json:"oracle,omitempty"`
	// Mailbox is the actors.mailbox size of a mailbox row.
	Mailbox int `json:"mailbox,omitempty"`
	// CPUSecondsPer1K is the process CPU time per 1,000 requests of an overhead row: the
	// bench process's plus the target's own processes'.
	CPUSecondsPer1K float64 `json:"cpu_s_per_1k,omitempty"`
	// OwnCPUSecondsPer1K is the CPU time per 1,000 requests of an overhead row's target in
	// its own process (the router, the bare proxy, nginx), alone; 0 when it ran in the bench
	// process.
	OwnCPUSecondsPer1K float64 `json:"own_cpu_s_per_1k,omitempty"`
	// Truncated is set when the duration bound ended the row before its request bound.
	Truncated bool `json:"truncated,omitempty"`
	// Replicas holds a replicas row's cluster figures.
	Replicas *ReplicaFigures `json:"replicas,omitempty"`
	// SLO holds the slo scenario's attainment and estimate figures.
	SLO *SLOSummary `json:"slo,omitempty"`
	// RankPromptTokens are the prompt tokens each data-parallel rank of the row's engines
	// admitted, engine by engine, rank by rank (the routing scenario's dp table).
	RankPromptTokens []int64 `json:"rank_prompt_tokens,omitempty"`
	// LoRA are the adapter figures of the routing scenario's LoRA table.
	LoRA *LoRAFigures `json:"lora,omitempty"`
	// Loss explains a trace row's hit rate against the oracle.
	Loss *HitLoss `json:"hit_loss,omitempty"`
	// Instructions are an instructions row's counts.
	Instructions *InstructionCount `json:"instructions,omitempty"`
}

// InstructionCount is one row of the instructions scenario: the user-space instructions
// (valgrind cachegrind's Ir) a proxy process executed from its start to its exit, in a run
// that served Requests[0] requests and in one that served Requests[1]. Their difference
// over the difference of the requests is the instructions per request: what the process
// spends to start and to stop cancels.
type InstructionCount struct {
	Requests     [2]int    `json:"requests"`
	Instructions [2]uint64 `json:"instructions"`
	// PerRequest is (Instructions[1] - Instructions[0]) / (Requests[1] - Requests[0]).
	PerRequest float64 `json:"per_request"`
}

// InstructionRatio is the router's instructions per request divided by a reference
// proxy's, in one mode of the instructions scenario.
type InstructionRatio struct {
	// Mode is "small" (non-streaming requests) or "stream" (streamed answers).
	Mode string `json:"mode"`
	// Against is the reference: "bare" or "evloop".
	Against string  `json:"against"`
	Ratio   float64 `json:"ratio"`
}

// HitLoss explains a trace row's hit rate against the oracle, request by request: the row's
// own placement (the engine each request went to) replayed on the simulated engines says
// what the fleet held when each request arrived.
type HitLoss struct {
	// Simulated is the hit rate the simulation gives the row's placement. Beside the
	// measured one it shows how closely the simulation follows the engines of the run.
	Simulated float64 `json:"simulated_hit_rate"`
	// OracleCached is the prompt tokens the oracle serves from cache, over the row's
	// successful requests.
	OracleCached int64 `json:"oracle_cached_tokens"`
	// The oracle's cached tokens the row did not get, by what the fleet held when the
	// request arrived:
	// Gone: no engine held its prefix (evicted from every cache, or never cached);
	// Elsewhere: an engine had it cached and the request went to another;
	// Queued: only an engine about to cache it (a request with the prefix queued or being
	// prefilled there) and the request went to another;
	// OnHolder: it went to an engine holding it and hit less (admitted in the same prefill
	// batch as the prefix's request, or the prefix was evicted before it was admitted).
	Gone      LossClass `json:"gone"`
	Elsewhere LossClass `json:"elsewhere"`
	Queued    LossClass `json:"queued"`
	OnHolder  LossClass `json:"on_holder"`
	// Gained is what the row served from cache beyond the oracle, request by request.
	Gained LossClass `json:"gained"`
	// Left splits Elsewhere and Queued by what the router saw when it placed the request
	// (its recorded decision); nil when the row's policy records none.
	Left *LeftHolder `json:"left_holder,omitempty"`
}

// LeftHolder is why the router sent requests away from the engine holding their prefix,
// from its decision records (cache_aware's latency decision).
type LeftHolder struct {
	// Unseen: the router's prefix lookup matched less on every engine than the prefix the
	// fleet held (the index had not seen it, or the dispatch memory did not cover it).
	Unseen LossClass `json:"unseen"`
	// Slower: the router saw the holder and expected it slower than another engine beyond
	// the tie margin (its queue costing more than the hit, weighted by how busy the fleet was).
	Slower LossClass `json:"slower"`
	// Tie: the holder tied with the chosen engine and lost the tie order (decode load).
	Tie LossClass `json:"tie"`
	// Unrecorded: no decision matched the request.
	Unrecorded LossClass `json:"unrecorded"`
	// Over the Slower requests, medians: the work ahead of the request's prefill as the
	// router saw it on the holder and on the engine it chose, and the holder's backlog in
	// the simulation (what was left of its prefill in progress and its waiting prompts),
	// seconds.
	HolderQueue  float64 `json:"holder_queue_s"`
	ChosenQueue  float64 `json:"chosen_queue_s"`
	HolderActual float64 `json:"holder_backlog_s"`
}

// LossClass counts prompt tokens and the requests they belong to.
type LossClass struct {
	Tokens   int64 `json:"tokens"`
	Requests int   `json:"requests"`
}

// LoRAFigures count a row's LoRA-adapter selections.
type LoRAFigures struct {
	// Hits and Loads are the router's selections whose engine held the request's adapter and
	// those that loaded it first (or waited for its load); Replicas those that loaded it
	// beside its busy holders (switchyard_lora_picks_total, lora.replicate_above).
	Hits     int64 `json:"hits"`
	Loads    int64 `json:"loads"`
	Replicas int64 `json:"replicas"`
	// EngineLoads are the adapter loads the engines completed.
	EngineLoads int64 `json:"engine_loads"`
	// Evictions are the adapters the router unloaded to make room
	// (switchyard_lora_evictions_total).
	Evictions int64 `json:"evictions"`
	// SlotWaits are the router's waits for an adapter slot taken by an adapter in use that
	// ended with a slot perhaps freed (switchyard_lora_slot_waits_total{result="freed"},
	// lora.max_slot_waiters); one request may wait more than once.
	SlotWaits int64 `json:"slot_waits"`
}

// ReplicaFigures are the figures of one replicas row: router processes in front of one
// fleet, each session's turns spread over them at random.
type ReplicaFigures struct {
	// Replicas is the number of router processes at the start.
	Replicas int `json:"replicas"`
	// Agreement is the share of a session's turns (after its first) that landed on the
	// engine of its previous turn; AgreementAfterCrash the same over the turns sent after
	// the crash, or -1 without one.
	Agreement           float64 `json:"session_agreement"`
	AgreementAfterCrash float64 `json:"session_agreement_after_crash"`
	// HitRateVsSingle is the row's hit rate as a fraction of the single router's (the
	// scenario's first row), or 0 when unknown.
	HitRateVsSingle float64 `json:"hit_rate_vs_single"`
	// CrashErrors are failed requests sent to the crashed replica (in flight on it when it
	// died); OtherErrors every other failure.
	CrashErrors int `json:"crash_errors"`
	OtherErrors int `json:"other_errors"`
	// CPUSecondsPer1K is each replica's process CPU time per 1,000 requests it was sent.
	CPUSecondsPer1K []float64 `json:"router_cpu_s_per_1k"`
	// Events say what happened mid-run ("stopped r2 (SIGTERM) at request 160").
	Events []string `json:"events,omitempty"`
}

// VsOracle is the row's hit rate as a fraction of its oracle's, or 0 when unknown.
func (r *Row) VsOracle() float64 {
	if r.Summary == nil || r.Oracle == nil || r.Oracle.HitRate <= 0 {
		return 0
	}
	return r.Summary.HitRate / r.Oracle.HitRate
}

// Overhead are the router-versus-direct figures of the overhead scenario.
type Overhead struct {
	// Share is the router's requests/s as a fraction of direct.
	Share float64 `json:"share_of_direct"`
	// AddedP50ms and AddedP99ms are the latency the router adds, in wall milliseconds.
	AddedP50ms float64 `json:"added_p50_ms"`
	AddedP99ms float64 `json:"added_p99_ms"`
	// RouterCPUSecondsPer1K is the router's CPU time per 1,000 requests: its own process's
	// when it ran as one, else the bench process's CPU per request through the router minus
	// its CPU per request direct (the load generator and the engines do the same work in
	// both), or -1 when unknown (an external router).
	RouterCPUSecondsPer1K float64 `json:"router_cpu_s_per_1k"`
	// References compare the router with the reference proxies measured in the same run.
	References []ReferenceRatio `json:"references,omitempty"`
}

// ReferenceRatio is the router against one reference proxy, in one mode of the overhead
// scenario.
type ReferenceRatio struct {
	// Mode is "small" (non-streaming requests) or "stream" (streamed answers).
	Mode string `json:"mode"`
	// Against is the reference: "bare" (a bare fasthttp proxy) or "nginx".
	Against string `json:"against"`
	// Throughput is the router's requests/s divided by the reference's.
	Throughput float64 `json:"throughput_ratio"`
	// CPU is the router's own CPU time per request divided by the reference's (each its own
	// process's when both ran as their own, else its row's CPU minus direct's), or -1 when
	// unknown.
	CPU float64 `json:"cpu_ratio"`
}

// WriteJSON writes r as indented JSON.
func WriteJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("cannot write report JSON: %w", err)
	}
	return nil
}
