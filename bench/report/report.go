package report

import (
	"encoding/json"
	"fmt"
	"io"
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
	// Notes explain figures a reader could misread.
	Notes []string `json:"notes,omitempty"`
}

// Title is the scenario's heading, e.g. "routing: shared_prefix".
func (s *Scenario) Title() string {
	if s.Workload == "" {
		return s.Name
	}
	return s.Name + ": " + s.Workload
}

// FileStem is the scenario's file name without extension, e.g. "routing-shared_prefix".
func (s *Scenario) FileStem() string {
	if s.Workload == "" {
		return s.Name
	}
	return s.Name + "-" + s.Workload
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
	// CPUSecondsPer1K is the process CPU time per 1,000 requests of an overhead row.
	CPUSecondsPer1K float64 `json:"cpu_s_per_1k,omitempty"`
	// Truncated is set when the duration bound ended the row before its request bound.
	Truncated bool `json:"truncated,omitempty"`
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
	// RouterCPUSecondsPer1K is the router's CPU time per 1,000 requests: the process's CPU
	// per request through the router minus its CPU per request direct (the load generator
	// and the engines do the same work in both), or -1 when unknown (an external router).
	RouterCPUSecondsPer1K float64 `json:"router_cpu_s_per_1k"`
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
