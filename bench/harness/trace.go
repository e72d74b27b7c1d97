package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"switchyard/bench/loadgen"
	"switchyard/bench/mockengine"
	"switchyard/bench/report"
	"switchyard/bench/workload"
)

// trace replays opts.Trace under every policy of opts.Policies on plain engines behind one
// bucket: each request at its recorded arrival time divided by TimeScale (open loop), its
// prompt as token IDs on the engines' native route (or as chat text with TraceChat).
func (h *harness) trace(ctx context.Context) ([]*report.Scenario, error) {
	o := h.opts // a copy: the trace scenario has its own cache and duration defaults
	o.EngineCache, o.Duration = o.traceCache, o.traceDuration
	th := &harness{opts: o, tok: h.tok, progress: h.progress}
	wl, err := readTrace(&o)
	if err != nil {
		return nil, err
	}
	if o.Target == "" {
		if err := fits(wl, o.EngineCache); err != nil {
			return nil, err
		}
	}
	sc := &report.Scenario{
		Name: report.ScenarioTrace, Workload: wl.Name, Description: wl.Description + "; " + th.traceArrivals(wl),
		TimeBase: report.TimeSimulated, Speedup: o.Speedup,
	}
	orc, err := th.newFleetOracles(wl.Requests, o.Target == "")
	if err != nil {
		return nil, err
	}
	path := o.tracePath()
	if o.Target != "" {
		sc.Deployment = fmt.Sprintf("router at %s (%s); oracle assumes %d engines × %d cache tokens", o.Target, path, o.Engines, o.EngineCache)
		sc.TimeBase, sc.Speedup = report.TimeWall, 1
		row, err := th.targetRow(ctx, wl, orc, load{path: path, replay: o.TimeScale})
		sc.Oracle = orc.longest()
		if err != nil {
			return []*report.Scenario{sc}, err
		}
		sc.Rows = append(sc.Rows, row)
		return []*report.Scenario{sc}, nil
	}
	sc.Deployment = th.plainDeployment(o.Engines) + "; router: one bucket, the policy under test; requests to " + path
	sc.SlowWorkers = o.slowEngines()
	pr := o.plainRun(report.ScenarioTrace, wl, orc)
	pr.path, pr.replay = path, o.TimeScale*o.Speedup
	pr.loss = func(c *cluster, m *loadgen.Measurement, d *decisionLog) (*report.HitLoss, error) {
		return orc.sim.loss(m, ids(c.plain), d)
	}
	pr.decisions = true
	var out error
	for _, spec := range o.Policies {
		row, err := th.policyRow(ctx, pr, spec)
		if err != nil {
			out = err
			break
		}
		sc.Rows = append(sc.Rows, row)
	}
	if out == nil && o.TraceOracleRow {
		row, err := th.oraclePlacementRow(ctx, pr)
		if err != nil {
			out = err
		} else {
			sc.Rows = append(sc.Rows, row)
		}
	}
	sc.Oracle = orc.longest()
	sc.Notes = append(sc.Notes, routingNotes(sc, wl)...)
	return []*report.Scenario{sc}, out
}

// oraclePlacementRow measures the trace's oracle on the engines: each request sent straight
// to the engine the simulated holder placement chose for it.
func (h *harness) oraclePlacementRow(ctx context.Context, pr policyRun) (row report.Row, err error) {
	o := &h.opts
	row.Name = "oracle placement"
	n := len(pr.wl.Requests)
	if o.Requests > 0 {
		n = min(n, o.Requests)
	}
	place, err := pr.oracles.sim.holder(n)
	if err != nil {
		return row, err
	}
	c, err := o.startCluster(ctx, pr.spec)
	if err != nil {
		return row, err
	}
	defer func() { err = errors.Join(err, c.close()) }()
	us := urls(c.plain)
	m, err := h.measure(ctx, load{
		label: o.flavorPrefix() + pr.scenario + " " + pr.wl.Name + " " + row.Name, urls: us,
		route: func(i int) string { return us[place[i].Engine] }, reqs: pr.wl.Requests,
		stream: !o.NoStream, simulated: true, maxRequests: n, duration: o.Duration, path: pr.path, replay: pr.replay,
	})
	if err != nil {
		return row, err
	}
	row.Summary = report.Summarize(m.Results, report.SummaryOptions{Workers: pr.serving(c), TimeScale: o.Speedup, Elapsed: m.Elapsed})
	row.Truncated = m.Truncated
	if len(m.Results) > 0 {
		if row.Oracle, err = pr.oracles.of(len(m.Results)); err != nil {
			return row, err
		}
	}
	if row.Loss, err = pr.loss(c, m, nil); err != nil {
		return row, err
	}
	return row, nil
}

// readTrace reads the first Requests requests of o.Trace.
func readTrace(o *Options) (*workload.Workload, error) {
	f, err := os.Open(o.Trace)
	if err != nil {
		return nil, fmt.Errorf("cannot read trace: %w (give the trace file with --trace)", err)
	}
	defer f.Close()
	name := strings.TrimSuffix(filepath.Base(o.Trace), filepath.Ext(o.Trace))
	return workload.ReadTrace(f, workload.TraceConfig{Name: name, BlockSize: o.TraceBlockSize, MaxRequests: o.Requests,
		MaxOutput: o.TraceMaxOutput, Chat: o.TraceChat}, o.Seed)
}

// chatSlack bounds the chat template's tokens around a trace prompt sent as chat text.
const chatSlack = 16

// fits checks that every request of wl, prompt and output, fits an engine's cache (which is
// also its context length).
func fits(wl *workload.Workload, cacheTokens int) error {
	for i := range wl.Requests {
		r := &wl.Requests[i]
		if need := r.Tokens.Len + r.MaxTokens + chatSlack; need > cacheTokens {
			return fmt.Errorf("%w: engine_cache: trace request %s needs %d tokens (input %d, output %d), more than the engines' %d: raise --engine-cache or lower --trace-max-output",
				ErrInvalidOptions, strings.TrimPrefix(r.Class, "l"), need, r.Tokens.Len, r.MaxTokens, cacheTokens)
		}
	}
	return nil
}

// tracePath is the route trace requests take: chat with TraceChat, else the flavour's
// native token route (SGLang's /generate, vLLM's completions with a token-ID prompt).
func (o *Options) tracePath() string {
	switch {
	case o.TraceChat:
		return loadgen.DefaultPath
	case o.flavor == mockengine.FlavorVLLM:
		return "/v1/completions"
	}
	return "/generate"
}

// traceArrivals describes the replay: the time scale and the prefill load it offers the
// fleet (simulated engines only).
func (h *harness) traceArrivals(wl *workload.Workload) string {
	o := &h.opts
	mode := "streaming"
	if o.NoStream {
		mode = "non-streaming"
	}
	d := fmt.Sprintf("open loop at the recorded times ÷ %g, %s", o.TimeScale, mode)
	if o.Target == "" {
		if l := o.offeredLoad(wl); l > 0 {
			d += fmt.Sprintf("; offered prefill load %.0f%% of the fleet without cache hits", 100*l)
		}
	}
	return d
}

// offeredLoad is the prefill work of wl (every prompt computed in full, at the engines'
// cost model) over what the fleet computes while the replay lasts: how busy the engines'
// prefill would be without any cache hit. 0 when the span is empty.
func (o *Options) offeredLoad(wl *workload.Workload) float64 {
	span := wl.Span().Seconds() / o.TimeScale
	if !(span > 0) {
		return 0
	}
	work := 0.0
	for i := range wl.Requests {
		work += (o.Costs.PrefillOverhead + time.Duration(wl.Requests[i].Tokens.Len)*o.Costs.PrefillPerToken).Seconds()
	}
	capacity := float64(o.Engines)
	if len(o.EngineSpeeds) == o.Engines {
		capacity = 0
		for _, v := range o.EngineSpeeds {
			capacity += v
		}
	}
	return work / (capacity * span)
}
