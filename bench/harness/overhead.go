package harness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"switchyard/bench/loadgen"
	"switchyard/bench/reference"
	"switchyard/bench/report"
	"switchyard/bench/workload"
	"switchyard/config"
)

// warmup is the length of the unmeasured run before each measured phase of the
// throughput scenarios: connections open and the Go runtime settles.
const warmup = time.Second

// smallRequests are the overhead, instructions and mailbox scenarios' requests: short unique prompts
// answered with one token, so the engines (at zero cost) do next to nothing.
func (h *harness) smallRequests() ([]workload.Request, error) {
	wl, err := workload.ZeroReuse(workload.ZeroReuseConfig{Requests: 1024, PromptLen: 16, OutputLen: 1}, h.opts.Seed)
	if err != nil {
		return nil, err
	}
	return wl.Requests, nil
}

// streamRequests are the overhead and instructions scenarios' streams: short unique
// prompts answered with streamTokens events.
func (h *harness) streamRequests() ([]workload.Request, error) {
	wl, err := workload.ZeroReuse(workload.ZeroReuseConfig{Requests: 1024, PromptLen: 16, OutputLen: streamTokens}, h.opts.Seed)
	if err != nil {
		return nil, err
	}
	return wl.Requests, nil
}

// overheadRounds is the number of interleaved rounds an overhead measurement is split into.
const overheadRounds = 3

// streamTokens is the length of the overhead scenario's streamed answers: 64 events, each
// its own HTTP chunk.
const streamTokens = 64

// overheadTarget is one way of reaching the engines, measured in one mode.
type overheadTarget struct {
	name string
	urls []string
	// own is the CPU time the target's own process (the router, the bare proxy, nginx's
	// master and worker) has used so far; nil: it runs in this process (direct, or a proxy
	// started in-process).
	own    func() (time.Duration, bool)
	m      loadgen.Measurement
	cpu    time.Duration // this process's CPU plus the target's own, over the measured phases
	ownCPU time.Duration // the target's own process's CPU over the measured phases
	okCPU  bool          // every phase's CPU was known
}

// overhead measures the same zero-cost engines reached directly, through the router
// (round_robin), through the bare fasthttp proxy, through the event-loop proxy (when
// Options.EvloopCommand is set) and through nginx (when installed), for
// small non-streaming requests and for streams of 64 events, each its own chunk. Every
// target gets a warm-up, then the measured time is split into rounds in which every target
// runs once, in rotating order, so that a change in the machine's load hits all of them
// alike. The router and the bare proxy run as their own processes when their commands are
// set (Options.ReplicaCommand, Options.BareCommand; switchyard bench sets both), as nginx
// does, so that one's garbage collection and scheduling do not land in another's phase;
// else in this process. CPU per 1,000 requests counts this process and the target's own
// processes; own CPU per 1,000 requests counts the target's own process alone.
func (h *harness) overhead(ctx context.Context) (scs []*report.Scenario, err error) {
	o := &h.opts
	clients := h.concurrency(DefaultOverheadClients)
	sc := &report.Scenario{
		Name:     report.ScenarioOverhead,
		TimeBase: report.TimeWall, Speedup: 1,
		Description: fmt.Sprintf("small non-streaming chat requests (16-token prompt, 1 output token), then streams of %d events (one chunk each)", streamTokens),
		Deployment: fmt.Sprintf("%d zero-cost engines reached directly, through the router (one bucket, round_robin), a bare fasthttp proxy, %snginx (1 worker, upstream keep-alive, proxy_buffering off); %d closed-loop clients; %d interleaved rounds",
			o.Engines, evloopDeployment(o), clients, overheadRounds),
	}
	scs = []*report.Scenario{sc}
	small, err := h.smallRequests()
	if err != nil {
		return scs, err
	}
	streams, err := h.streamRequests()
	if err != nil {
		return scs, err
	}
	c, err := o.startCluster(ctx, clusterSpec{plain: o.Engines, zeroCost: true, eventPerWrite: true})
	if err != nil {
		return scs, err
	}
	defer func() { err = errors.Join(err, c.close()) }()
	cfg := o.routerConfig(c)
	cfg.Models = map[string]config.Model{o.Model: {Buckets: []config.Bucket{
		plainBucket("all", ids(c.plain), config.Policy{Type: config.PolicyRoundRobin})}}}
	var routerURL string
	var routerCPU func() (time.Duration, bool)
	if len(o.ReplicaCommand) > 0 {
		var p *replicaProc
		p, err = h.startOverheadRouterProc(ctx, c, nil)
		if p != nil {
			defer func() { err = errors.Join(err, stopReplicaProcs([]*replicaProc{p})) }()
		}
		if err != nil {
			return scs, err
		}
		pid := p.cmd.Process.Pid
		routerURL, routerCPU = p.url, func() (time.Duration, bool) { return reference.ProcessTreeCPU(pid) }
	} else {
		var r *router
		if r, err = o.startRouter(ctx, cfg); err != nil {
			return scs, err
		}
		defer func() { err = errors.Join(err, r.close()) }()
		routerURL = r.url
	}
	var bare *reference.Proxy
	if len(o.BareCommand) > 0 {
		bare, err = reference.StartBareProcess(o.BareCommand, urls(c.plain), reference.ProcessOptions{})
	} else {
		bare, err = reference.StartBare(urls(c.plain))
	}
	if err != nil {
		return scs, err
	}
	defer func() { err = errors.Join(err, bare.Close()) }()
	bareCPU := func() (time.Duration, bool) { return bare.ExternalCPU() }
	if len(o.BareCommand) == 0 {
		bareCPU = nil
	}
	var evloop *reference.Proxy
	if len(o.EvloopCommand) > 0 {
		if evloop, err = reference.StartEvloopProcess(o.EvloopCommand, urls(c.plain), reference.ProcessOptions{}); err != nil {
			return scs, err
		}
		defer func() { err = errors.Join(err, evloop.Close()) }()
	}
	nginx, err := reference.StartNginx(urls(c.plain), reference.NginxOptions{Keepalive: 2 * clients})
	switch {
	case errors.Is(err, reference.ErrNoNginx):
		sc.Notes = append(sc.Notes, "NGINX SKIPPED: "+err.Error())
		if o.Logger != nil {
			o.Logger.Warn("overhead: nginx reference skipped", slog.String("reason", err.Error()))
		}
		nginx = nil
	case err != nil:
		return scs, err
	default:
		defer func() { err = errors.Join(err, nginx.Close()) }()
	}

	workers := ids(c.plain)
	for _, mode := range []struct {
		suffix string
		reqs   []workload.Request
		stream bool
	}{{"", small, false}, {" stream", streams, true}} {
		targets := []*overheadTarget{
			{name: "direct", urls: urls(c.plain), okCPU: true},
			{name: "router", urls: []string{routerURL}, own: routerCPU, okCPU: true},
			{name: "bare", urls: []string{bare.URL()}, own: bareCPU, okCPU: true},
		}
		if evloop != nil {
			targets = append(targets, &overheadTarget{name: "evloop", urls: []string{evloop.URL()}, own: evloop.ExternalCPU, okCPU: true})
		}
		if nginx != nil {
			targets = append(targets, &overheadTarget{name: "nginx", urls: []string{nginx.URL()}, own: nginx.ExternalCPU, okCPU: true})
		}
		for _, t := range targets {
			t.name += mode.suffix
			l := load{label: "overhead " + t.name + " warm-up", urls: t.urls, reqs: mode.reqs, stream: mode.stream,
				concurrency: clients, repeat: true, duration: warmup}
			if _, err := h.measure(ctx, l); err != nil {
				return scs, err
			}
		}
		for round := range overheadRounds {
			for i := range targets {
				t := targets[(round+i)%len(targets)]
				l := load{label: "overhead " + t.name, urls: t.urls, reqs: mode.reqs, stream: mode.stream,
					concurrency: clients, repeat: true, duration: o.Duration / overheadRounds}
				if o.Requests > 0 {
					l.maxRequests = max(1, o.Requests/overheadRounds)
				}
				if err := h.overheadPhase(ctx, t, l); err != nil {
					return scs, err
				}
			}
		}
		rows := make([]report.Row, len(targets))
		for i, t := range targets {
			rows[i] = report.Row{Name: t.name,
				Summary: report.Summarize(t.m.Results, report.SummaryOptions{Workers: workers, TimeScale: 1, Elapsed: t.m.Elapsed})}
			if t.okCPU && len(t.m.Results) > 0 {
				rows[i].CPUSecondsPer1K = t.cpu.Seconds() / float64(len(t.m.Results)) * 1000
				if t.own != nil {
					rows[i].OwnCPUSecondsPer1K = t.ownCPU.Seconds() / float64(len(t.m.Results)) * 1000
				}
			}
		}
		sc.Rows = append(sc.Rows, rows...)
		if !mode.stream {
			sc.Overhead = overheadFigures(rows[0], rows[1])
		}
		mname := "small"
		if mode.stream {
			mname = "stream"
		}
		for _, ref := range rows[2:] {
			sc.Overhead.References = append(sc.Overhead.References, referenceRatio(mname, rows[0], rows[1], ref))
		}
	}
	if evloop != nil {
		sc.Notes = append(sc.Notes, "evloop is an HTTP/1.1 reverse proxy on one edge-triggered epoll loop locked to one OS thread (switchyard evloop-proxy): what a Go process pays per request without Go's netpoller and scheduler, as nginx's one worker runs")
	}
	if len(o.ReplicaCommand) > 0 && len(o.BareCommand) > 0 {
		sc.Notes = append(sc.Notes,
			"the router, the bare proxy, the event-loop proxy (when run) and nginx each run as their own process; engines and load generator share this process. CPU s/1k req is this process's CPU time plus the target's own per 1,000 requests; OWN CPU s/1k is the target's own process's alone, which the CPU ratios against the references compare")
	} else {
		sc.Notes = append(sc.Notes,
			"engines, load generator and the router or bare proxy without their commands share this process and its CPUs (nginx and the rows with an OWN CPU figure run in their own processes); CPU s/1k req is this process's CPU time plus the target's own per 1,000 requests, so an in-process proxy's own cost is its row's minus direct's")
	}
	return scs, nil
}

// evloopDeployment names the event-loop proxy in the scenario's deployment when it runs.
func evloopDeployment(o *Options) string {
	if len(o.EvloopCommand) == 0 {
		return ""
	}
	return "an epoll event-loop proxy on one OS thread, "
}

// overheadPhase runs one measured phase of t and adds it to t's figures.
func (h *harness) overheadPhase(ctx context.Context, t *overheadTarget, l load) error {
	cpu0, ok0 := reference.ProcessCPU()
	own0, okOwn0 := t.ownProcessCPU()
	m, err := h.measure(ctx, l)
	if err != nil {
		return err
	}
	cpu1, ok1 := reference.ProcessCPU()
	own1, okOwn1 := t.ownProcessCPU()
	t.m.Results = append(t.m.Results, m.Results...)
	t.m.Elapsed += m.Elapsed
	t.okCPU = t.okCPU && ok0 && ok1 && okOwn0 && okOwn1
	t.cpu += cpu1 - cpu0 + own1 - own0
	t.ownCPU += own1 - own0
	return nil
}

func (t *overheadTarget) ownProcessCPU() (time.Duration, bool) {
	if t.own == nil {
		return 0, true
	}
	return t.own()
}

// wrappedReadyPoll is the readiness poll period of a router run by another program
// (valgrind), which starts slowly and counts what it answers.
const wrappedReadyPoll = 250 * time.Millisecond

// startOverheadRouterProc starts the overhead scenario's router as its own process (one
// plain bucket over c's engines, round_robin), run by wrap when it is not empty (valgrind),
// and waits until it is ready (replicaStartTimeout at most, valgrindStartTimeout when
// wrapped; an exit ends the wait). A process it returns, also with an error, is the
// caller's to stop.
func (h *harness) startOverheadRouterProc(ctx context.Context, c *cluster, wrap []string) (*replicaProc, error) {
	o := &h.opts
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "switchyard-overhead-")
	if err != nil {
		return nil, fmt.Errorf("cannot start the router process: %w", err)
	}
	defer os.RemoveAll(dir)
	b := o.routerProcConfig(c, ports[0])
	o.plainModelYAML(b, c, config.PolicyRoundRobin)
	p, err := o.startWrappedRouterProc(wrap, dir, "router", ports[0], b.String())
	if err != nil {
		return nil, err
	}
	period, timeout := readyPoll, replicaStartTimeout
	if len(wrap) > 0 {
		// Every readiness answer is work in the process's count: few of them.
		period, timeout = wrappedReadyPoll, valgrindStartTimeout
	}
	if err := waitProcReady(ctx, p, period, timeout); err != nil {
		return p, fmt.Errorf("router process: %w; stderr: %s", err, p.stderr.String())
	}
	return p, nil
}

// referenceRatio compares the router with a reference proxy measured in the same mode:
// throughput, and each one's own CPU per request: its own process's when both ran as
// their own processes, else its row's minus direct's.
func referenceRatio(mode string, direct, router, ref report.Row) report.ReferenceRatio {
	rr := report.ReferenceRatio{Mode: mode, Against: ref.Name, CPU: -1}
	if i := strings.IndexByte(rr.Against, ' '); i >= 0 {
		rr.Against = rr.Against[:i]
	}
	if ref.Summary != nil && ref.Summary.RequestsPerS > 0 && router.Summary != nil {
		rr.Throughput = router.Summary.RequestsPerS / ref.Summary.RequestsPerS
	}
	if router.OwnCPUSecondsPer1K > 0 && ref.OwnCPUSecondsPer1K > 0 {
		rr.CPU = router.OwnCPUSecondsPer1K / ref.OwnCPUSecondsPer1K
		return rr
	}
	rOwn, refOwn := router.CPUSecondsPer1K-direct.CPUSecondsPer1K, ref.CPUSecondsPer1K-direct.CPUSecondsPer1K
	if direct.CPUSecondsPer1K > 0 && router.CPUSecondsPer1K > 0 && ref.CPUSecondsPer1K > 0 && refOwn > 0 {
		rr.CPU = rOwn / refOwn
	}
	return rr
}

// overheadFigures derives the router's share of direct throughput, its added latency and
// its CPU time per 1,000 requests.
func overheadFigures(direct, routed report.Row) *report.Overhead {
	d, r := direct.Summary, routed.Summary
	f := &report.Overhead{RouterCPUSecondsPer1K: -1}
	if d.RequestsPerS > 0 {
		f.Share = r.RequestsPerS / d.RequestsPerS
	}
	f.AddedP50ms = r.E2E.P50 - d.E2E.P50
	f.AddedP99ms = r.E2E.P99 - d.E2E.P99
	switch {
	case routed.OwnCPUSecondsPer1K > 0:
		f.RouterCPUSecondsPer1K = routed.OwnCPUSecondsPer1K
	case direct.CPUSecondsPer1K > 0 && routed.CPUSecondsPer1K > 0:
		f.RouterCPUSecondsPer1K = routed.CPUSecondsPer1K - direct.CPUSecondsPer1K
	}
	return f
}

// mailbox sends an overload burst through routers whose bucket and group actor mailboxes
// have each size of opts.MailboxSizes, in front of the same zero-cost engines.
func (h *harness) mailbox(ctx context.Context) (scs []*report.Scenario, err error) {
	o := &h.opts
	clients := h.concurrency(DefaultMailboxClients)
	burst := o.MailboxRequests
	if o.Requests > 0 {
		burst = o.Requests
	}
	sc := &report.Scenario{
		Name:     report.ScenarioMailbox,
		TimeBase: report.TimeWall, Speedup: 1,
		Description: fmt.Sprintf("a burst of %d small non-streaming requests from %d closed-loop clients", burst, clients),
		Deployment: fmt.Sprintf("%d zero-cost engines; router: one bucket, round_robin; actors.mailbox.bucket and .group set to the row's size",
			o.Engines),
	}
	scs = []*report.Scenario{sc}
	reqs, err := h.smallRequests()
	if err != nil {
		return scs, err
	}
	c, err := o.startCluster(ctx, clusterSpec{plain: o.Engines, zeroCost: true})
	if err != nil {
		return scs, err
	}
	defer func() { err = errors.Join(err, c.close()) }()
	for _, size := range o.MailboxSizes {
		row, err := h.mailboxRow(ctx, c, reqs, size, clients, burst)
		if err != nil {
			return scs, err
		}
		sc.Rows = append(sc.Rows, row)
	}
	sc.Notes = append(sc.Notes, "429 is the router refusing a pick because an actor mailbox is full (error code overloaded); latency percentiles cover accepted requests")
	return scs, nil
}

func (h *harness) mailboxRow(ctx context.Context, c *cluster, reqs []workload.Request, size, clients, burst int) (row report.Row, err error) {
	o := &h.opts
	row = report.Row{Name: fmt.Sprintf("mailbox %d", size), Mailbox: size}
	cfg := o.routerConfig(c)
	cfg.Actors.Mailbox.Bucket = size
	cfg.Actors.Mailbox.Group = size
	cfg.Models = map[string]config.Model{o.Model: {Buckets: []config.Bucket{
		plainBucket("all", ids(c.plain), config.Policy{Type: config.PolicyRoundRobin})}}}
	r, err := o.startRouter(ctx, cfg)
	if errors.Is(err, errRouterBuild) {
		row.Skipped = skipReason(err)
		return row, nil
	}
	if err != nil {
		return row, err
	}
	defer func() { err = errors.Join(err, r.close()) }()
	var m *loadgen.Measurement
	m, err = h.measure(ctx, load{
		label: row.Name, urls: []string{r.url}, reqs: reqs, concurrency: clients,
		repeat: true, maxRequests: burst, duration: o.Duration,
	})
	if err != nil {
		return row, err
	}
	row.Summary = report.Summarize(m.Results, report.SummaryOptions{Workers: ids(c.plain), TimeScale: 1, Elapsed: m.Elapsed})
	row.Truncated = m.Truncated
	return row, nil
}
