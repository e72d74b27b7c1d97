package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"switchyard/bench/loadgen"
	"switchyard/bench/reference"
	"switchyard/bench/report"
	"switchyard/bench/workload"
)

// ErrNoValgrind: the instructions scenario needs valgrind on PATH.
var ErrNoValgrind = errors.New("no valgrind binary on PATH (install the Debian package valgrind)")

// Bounds of a process run under valgrind, which translates the program's code as it first
// runs it: a Go binary takes seconds to answer its first request, and over a minute on a
// busy 2-core machine (load 18).
const (
	valgrindStartTimeout = 3 * time.Minute
	valgrindStopTimeout  = replicaStopTimeout
)

// instructionStreamShare divides the instructions scenario's request counts into its
// stream counts: a stream of 64 events costs a proxy several small requests' work.
const instructionStreamShare = 5

// ValgrindBinary returns the path of valgrind, or ErrNoValgrind.
func ValgrindBinary() (string, error) {
	p, err := exec.LookPath("valgrind")
	if err != nil {
		return "", ErrNoValgrind
	}
	return p, nil
}

// instrTarget is one proxy of the instructions scenario: start runs it under wrap (the
// valgrind command) and returns its URL and how to stop it.
type instrTarget struct {
	name  string
	start func(ctx context.Context, wrap []string) (url string, stop func() error, err error)
}

// instructions counts the user-space instructions (valgrind cachegrind's Ir) the router,
// the bare fasthttp proxy and the event-loop proxy (when Options.EvloopCommand is set)
// execute per request, each its own process in front of the same zero-cost engines, for
// small non-streaming requests and for streams of 64 events. Each target runs twice per
// mode, a fresh process each time: N1 = N2/5 requests, then N2; the process's count from
// its start to its exit differs by the N2 - N1 requests, its start and stop cancelling.
// Unlike CPU time on a shared machine, the counts repeat within about a percent.
func (h *harness) instructions(ctx context.Context) (scs []*report.Scenario, err error) {
	o := &h.opts
	clients := h.concurrency(DefaultInstructionClients)
	n2 := o.Requests
	if n2 == 0 {
		n2 = DefaultInstructionRequests
	}
	s2 := max(n2/instructionStreamShare, 5)
	sc := &report.Scenario{
		Name:     report.ScenarioInstructions,
		TimeBase: report.TimeWall, Speedup: 1,
		Description: fmt.Sprintf("%d then %d small non-streaming chat requests (16-token prompt, 1 output token); %d then %d streams of %d events (one chunk each)",
			n2/5, n2, s2/5, s2, streamTokens),
		Deployment: fmt.Sprintf("%d zero-cost engines in the bench process; the router (one bucket, round_robin), a bare fasthttp proxy%s each its own process under valgrind --tool=cachegrind, a fresh one per count; %d closed-loop keep-alive clients",
			o.Engines, evloopInstrDeployment(o), clients),
	}
	scs = []*report.Scenario{sc}
	vg, err := ValgrindBinary()
	if err != nil {
		return scs, fmt.Errorf("cannot count instructions: %w", err)
	}
	small, err := h.smallRequests()
	if err != nil {
		return scs, err
	}
	streams, err := h.streamRequests()
	if err != nil {
		return scs, err
	}
	c, err := o.startCluster(ctx, instrClusterSpec(o.Engines))
	if err != nil {
		return scs, err
	}
	defer func() { err = errors.Join(err, c.close()) }()
	dir, err := os.MkdirTemp("", "switchyard-instructions-")
	if err != nil {
		return scs, fmt.Errorf("cannot count instructions: %w", err)
	}
	defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()

	targets := h.instrTargets(c)
	for _, mode := range []instrMode{{"small", "", small, false, n2}, {"stream", " stream", streams, true, s2}} {
		var rows []report.Row
		for _, t := range targets {
			row, err := h.instructionRow(ctx, c, t, mode, vg, dir, clients)
			if err != nil {
				return scs, err
			}
			rows = append(rows, row)
		}
		for i := 1; i < len(rows); i++ {
			if ref := rows[i].Instructions.PerRequest; ref > 0 {
				sc.InstructionRatios = append(sc.InstructionRatios, report.InstructionRatio{Mode: mode.name,
					Against: targets[i].name, Ratio: rows[0].Instructions.PerRequest / ref})
			}
		}
		sc.Rows = append(sc.Rows, rows...)
	}
	sc.Notes = append(sc.Notes,
		"INSTRUCTIONS are the process's user-space instructions from its start to its exit (cachegrind's Ir) in the run of N1 and in the run of N2 requests; INSTR/REQ is their difference over N2 - N1, so what a process spends to start and stop cancels. REQS and ERR cover both runs",
		"not counted: the kernel's work in the process's system calls, cache misses and stalls, and the load generator's and engines' work; valgrind runs a process's threads one at a time. The engines' load gauges and the router's load polls and health checks are an hour apart, and the processes run with GOMAXPROCS=1 and GOGC=off (GOMEMLIMIT="+instrMemLimit+"): that work, idle Ps' spinning and the collector's marking follow timing rather than requests and would make the counts vary; allocation is counted, collection is not")
	return scs, nil
}

// instrEnv is the environment of a process run under valgrind: work that follows timing
// rather than requests is left out, so that the counts repeat.
//   - GOMAXPROCS=1: valgrind runs one thread at a time, and a Go process's idle Ps would
//     spin looking for work while the thread that has it waits its turn.
//   - GOGC=off: the concurrent collector's marking overlaps the program by as much as its
//     time-paced workers take, so a cycle's count varies by millions of instructions. The
//     allocations themselves are counted. GOMEMLIMIT bounds the heap all the same (a run of
//     hundreds of thousands of requests collects near it, and its count varies again).
//   - GODEBUG=cpu.rdtscp=off: valgrind 3.19 does not decode RDTSCP, which the runtime reads
//     the cycle counter with where the CPU has it (a contended runtime lock's spin): the
//     process died of SIGILL in about one run in two on an AMD EPYC host.
func instrEnv() []string {
	return []string{"env", "GOMAXPROCS=1", "GOGC=off", "GOMEMLIMIT=" + instrMemLimit, "GODEBUG=cpu.rdtscp=off"}
}

// instrMemLimit is GOMEMLIMIT of a process run under valgrind.
const instrMemLimit = "1GiB"

// instrClusterSpec is the instructions scenario's cluster: the overhead scenario's
// zero-cost engines, quiet.
func instrClusterSpec(engines int) clusterSpec {
	return clusterSpec{plain: engines, zeroCost: true, eventPerWrite: true, quiet: true}
}

// instrMode is one mode of the instructions scenario: its requests and N2.
type instrMode struct {
	name, suffix string
	reqs         []workload.Request
	stream       bool
	n            int
}

// instrTargets are the instructions scenario's processes in front of c: the router, the
// bare proxy and, when Options.EvloopCommand is set, the event-loop proxy.
func (h *harness) instrTargets(c *cluster) []instrTarget {
	o := &h.opts
	targets := []instrTarget{{name: "router", start: func(ctx context.Context, wrap []string) (string, func() error, error) {
		p, err := h.startOverheadRouterProc(ctx, c, wrap)
		if p == nil {
			return "", nil, err
		}
		stop := func() error {
			if err := stopReplicaProcs([]*replicaProc{p}); err != nil {
				return err
			}
			if !p.state.Success() {
				return fmt.Errorf("router process ended with %v; stderr: %s", p.state, p.stderr.String())
			}
			return nil
		}
		if err != nil {
			return "", nil, errors.Join(err, stop())
		}
		return p.url, stop, nil
	}}}
	procOpts := reference.ProcessOptions{StartTimeout: valgrindStartTimeout, StopTimeout: valgrindStopTimeout}
	proxy := func(name string, command []string, start func([]string, []string, reference.ProcessOptions) (*reference.Proxy, error)) instrTarget {
		return instrTarget{name: name, start: func(_ context.Context, wrap []string) (string, func() error, error) {
			p, err := start(append(slices.Clone(wrap), command...), urls(c.plain), procOpts)
			if err != nil {
				return "", nil, err
			}
			return p.URL(), p.Close, nil
		}}
	}
	targets = append(targets, proxy("bare", o.BareCommand, reference.StartBareProcess))
	if len(o.EvloopCommand) > 0 {
		targets = append(targets, proxy("evloop", o.EvloopCommand, reference.StartEvloopProcess))
	}
	return targets
}

// instructionRow counts t's instructions in mode: a fresh process under valgrind (vg,
// writing into dir) for N1 = mode.n/5 requests, another for mode.n.
func (h *harness) instructionRow(ctx context.Context, c *cluster, t instrTarget, mode instrMode, vg, dir string, clients int) (report.Row, error) {
	row := report.Row{Name: t.name + mode.suffix}
	f := &report.InstructionCount{Requests: [2]int{mode.n / 5, mode.n}}
	var results []loadgen.Result
	var elapsed time.Duration
	for i, n := range f.Requests {
		out := filepath.Join(dir, fmt.Sprintf("%s-%s-%d.out", t.name, mode.name, n))
		wrap := append(instrEnv(), vg, "-q", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file="+out)
		ir, m, err := h.countInstructions(ctx, t, wrap, out, load{label: fmt.Sprintf("instructions %s, %d requests", row.Name, n),
			reqs: mode.reqs, stream: mode.stream, concurrency: clients, repeat: true, maxRequests: n})
		if err != nil {
			return row, err
		}
		f.Instructions[i] = ir
		results = append(results, m.Results...)
		elapsed += m.Elapsed
	}
	f.PerRequest = (float64(f.Instructions[1]) - float64(f.Instructions[0])) / float64(f.Requests[1]-f.Requests[0])
	row.Instructions = f
	row.Summary = report.Summarize(results, report.SummaryOptions{Workers: ids(c.plain), TimeScale: 1, Elapsed: elapsed})
	return row, nil
}

// evloopInstrDeployment names the event-loop proxy in the instructions scenario's
// deployment when it runs.
func evloopInstrDeployment(o *Options) string {
	if len(o.EvloopCommand) == 0 {
		return ""
	}
	return " and an epoll event-loop proxy,"
}

// countInstructions starts t under wrap (valgrind, writing its counts to out), sends it l,
// stops it and returns its instruction count and the measurement. Every request of l must
// be sent.
func (h *harness) countInstructions(ctx context.Context, t instrTarget, wrap []string, out string, l load) (uint64, *loadgen.Measurement, error) {
	url, stop, err := t.start(ctx, wrap)
	if err != nil {
		return 0, nil, fmt.Errorf("cannot start %s under valgrind (a slow start, bounded by %v): %w", t.name, valgrindStartTimeout, err)
	}
	l.urls = []string{url}
	m, err := h.measure(ctx, l)
	if serr := stop(); serr != nil {
		err = errors.Join(err, fmt.Errorf("cannot stop %s under valgrind: %w", t.name, serr))
	}
	if err != nil {
		return 0, nil, err
	}
	if m.Truncated || len(m.Results) != l.maxRequests {
		return 0, nil, fmt.Errorf("%s: %d of %d requests sent", l.label, len(m.Results), l.maxRequests)
	}
	f, err := os.Open(out)
	if err != nil {
		return 0, nil, fmt.Errorf("cannot read %s's instruction count: %w", t.name, err)
	}
	defer f.Close()
	ir, err := cachegrindSummary(f)
	if rerr := os.Remove(out); err == nil && rerr != nil {
		err = rerr
	}
	if err != nil {
		return 0, nil, fmt.Errorf("cannot read %s's instruction count: %w", t.name, err)
	}
	return ir, m, nil
}

// cachegrindSummary reads the first count of a cachegrind output file's "summary:" line
// (the Ir total when Ir is its first event). Lines longer than 1 MiB are an error.
func cachegrindSummary(r io.Reader) (uint64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	firstEvent := ""
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "events:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				firstEvent = f[0]
			}
			continue
		}
		rest, ok := strings.CutPrefix(line, "summary:")
		if !ok {
			continue
		}
		if firstEvent != "Ir" {
			return 0, fmt.Errorf("cachegrind output's first event is %q, not Ir", firstEvent)
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, errors.New("cachegrind output's summary line is empty")
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cachegrind output's summary: %w", err)
		}
		return n, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("cannot read cachegrind output: %w", err)
	}
	return 0, errors.New("cachegrind output has no summary line")
}
