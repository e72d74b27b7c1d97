package harness

import (
	"context"
	"errors"
	"fmt"
	"time"

	"switchyard/bench/loadgen"
	"switchyard/bench/report"
	"switchyard/bench/workload"
	"switchyard/config"
)

// warmup is the length of the unmeasured run before each measured phase of the
// throughput scenarios: connections open and the Go runtime settles.
const warmup = time.Second

// smallRequests are the overhead and mailbox scenarios' requests: short unique prompts
// answered with one token, so the engines (at zero cost) do next to nothing.
func (h *harness) smallRequests() ([]workload.Request, error) {
	wl, err := workload.ZeroReuse(workload.ZeroReuseConfig{Requests: 1024, PromptLen: 16, OutputLen: 1}, h.opts.Seed)
	if err != nil {
		return nil, err
	}
	return wl.Requests, nil
}

// overhead measures the same small non-streaming requests sent to zero-cost engines
// directly (rotating over them) and through the router (round_robin over the same engines),
// one phase after the other, with the process's CPU time around each phase.
func (h *harness) overhead(ctx context.Context) (scs []*report.Scenario, err error) {
	o := &h.opts
	sc := &report.Scenario{
		Name:     report.ScenarioOverhead,
		TimeBase: report.TimeWall, Speedup: 1,
		Description: "small non-streaming chat requests (16-token prompt, 1 output token)",
		Deployment: fmt.Sprintf("%d zero-cost engines; router: one bucket, round_robin; %d closed-loop clients",
			o.Engines, h.concurrency(DefaultOverheadClients)),
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
	cfg := o.routerConfig(c)
	cfg.Models = map[string]config.Model{o.Model: {Buckets: []config.Bucket{
		plainBucket("all", ids(c.plain), config.Policy{Type: config.PolicyRoundRobin})}}}
	r, err := o.startRouter(ctx, cfg)
	if err != nil {
		return scs, err
	}
	defer func() { err = errors.Join(err, r.close()) }()

	workers := ids(c.plain)
	phase := func(name string, target []string) (report.Row, error) {
		l := load{urls: target, reqs: reqs, concurrency: h.concurrency(DefaultOverheadClients), repeat: true}
		l.label, l.duration = "overhead "+name+" warm-up", warmup
		if _, err := h.measure(ctx, l); err != nil {
			return report.Row{}, err
		}
		l.label, l.duration, l.maxRequests = "overhead "+name, o.Duration, o.Requests
		cpu0, okCPU := processCPU()
		m, err := h.measure(ctx, l)
		if err != nil {
			return report.Row{}, err
		}
		cpu1, _ := processCPU()
		row := report.Row{Name: name, Truncated: false,
			Summary: report.Summarize(m.Results, report.SummaryOptions{Workers: workers, TimeScale: 1, Elapsed: m.Elapsed})}
		if okCPU && len(m.Results) > 0 {
			row.CPUSecondsPer1K = (cpu1 - cpu0).Seconds() / float64(len(m.Results)) * 1000
		}
		return row, nil
	}
	direct, err := phase("direct", urls(c.plain))
	if err != nil {
		return scs, err
	}
	sc.Rows = append(sc.Rows, direct)
	routed, err := phase("router", []string{r.url})
	if err != nil {
		return scs, err
	}
	sc.Rows = append(sc.Rows, routed)
	sc.Overhead = overheadFigures(direct, routed)
	sc.Notes = append(sc.Notes,
		"engines, router and load generator share this process and its CPUs; CPU s/1k req is the whole process's CPU time per 1,000 requests, and the router's share is the difference between the two rows")
	return scs, nil
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
	if direct.CPUSecondsPer1K > 0 && routed.CPUSecondsPer1K > 0 {
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
