package harness

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"switchyard/bench/loadgen"
	"switchyard/bench/report"
	"switchyard/bench/workload"
	"switchyard/config"
)

// Defaults of the slo scenario, in simulated time.
const (
	// DefaultSLOTTFT is the foreground requests' time-to-first-token target.
	DefaultSLOTTFT = 200 * time.Millisecond
	// DefaultSLORate is the foreground arrival rate, requests per simulated second.
	DefaultSLORate = 4
	// DefaultSLOBackgroundRate is the background arrival rate per loaded engine, requests
	// per simulated second: with 4,000-token prompts at the default 50µs a token, about 70%
	// of an engine's prefill time.
	DefaultSLOBackgroundRate = 3.5
	// DefaultSLOBackgroundPromptLen is the background prompts' length, in tokens.
	DefaultSLOBackgroundPromptLen = 4000
)

// sloBackgroundOutputLen is the background requests' output: short, so the background
// loads prefill (the time to first token) rather than decode.
const sloBackgroundOutputLen = 8

// slo compares the capacity and slo bucket orders on two plain buckets that cover the same
// lengths: "a" (rank 0, first in capacity order) whose engines also serve background load
// sent to them directly (as another router's traffic would be), and "b" (rank 1) whose
// engines serve only the router. The foreground requests carry a TTFT target (the model's
// slo.ttft_ms) and arrive open loop at the same rate in both rows, so throughput is
// comparable; each row starts fresh engines and a fresh router.
func (h *harness) slo(ctx context.Context) ([]*report.Scenario, error) {
	o := &h.opts
	fg := o.Workload.ZeroReuse
	wl, err := workload.ZeroReuse(fg, o.Seed)
	if err != nil {
		return nil, err
	}
	bgCfg := workload.ZeroReuseConfig{Requests: 2000, PromptLen: o.SLOBackgroundPromptLen, OutputLen: sloBackgroundOutputLen}
	bg, err := workload.ZeroReuse(bgCfg, o.Seed+1000)
	if err != nil {
		return nil, err
	}
	loaded := o.Engines / 2
	sc := &report.Scenario{
		Name: report.ScenarioSLO, Workload: wl.Name, Description: wl.Description,
		TimeBase: report.TimeSimulated, Speedup: o.Speedup,
		Deployment: fmt.Sprintf("%s; router: buckets a (rank 0, %d engines) and b (rank 1, %d engines) over the same lengths, power_of_two in each; "+
			"background: %g requests/s per engine of a (%d-token prompts, %d output tokens) sent to the engines directly; "+
			"foreground: open-loop Poisson arrivals at %g requests/s through the router, streaming, TTFT target %v",
			h.plainDeployment(o.Engines), loaded, o.Engines-loaded, o.SLOBackgroundRate, o.SLOBackgroundPromptLen, sloBackgroundOutputLen,
			o.SLORate, o.SLOTTFT),
	}
	for _, order := range []string{config.BucketOrderCapacity, config.BucketOrderSLO} {
		row, err := h.sloRow(ctx, order, wl, bg)
		if err != nil {
			return []*report.Scenario{sc}, err
		}
		sc.Rows = append(sc.Rows, row)
	}
	for i := range sc.Rows {
		if sc.Rows[i].Truncated {
			sc.Notes = append(sc.Notes, "* the duration bound ended the row before the whole workload was sent; both rows send the same open-loop arrivals for the same time")
			break
		}
	}
	sc.Notes = append(sc.Notes,
		"SLO MET is the share of foreground requests whose first token came within the target (a failed request misses); GOODPUT/S counts them per second",
		"EST is the router's TTFT estimate at dispatch (X-Switchyard-Estimated-Ttft-Ms); EST/OBS its ratio to the TTFT the client observed, per request; WITHIN 30% the share within ±30%",
		"BUCKETS counts the foreground requests each bucket served")
	return []*report.Scenario{sc}, nil
}

// sloRow measures one bucket order on fresh engines and a fresh router, with the
// background load running for the whole row.
func (h *harness) sloRow(ctx context.Context, order string, wl, bg *workload.Workload) (row report.Row, err error) {
	o := &h.opts
	row.Name = order
	c, err := o.startCluster(ctx, clusterSpec{plain: o.Engines})
	if err != nil {
		return row, err
	}
	defer func() { err = errors.Join(err, c.close()) }()
	loaded, spare := c.plain[:o.Engines/2], c.plain[o.Engines/2:]
	cfg := o.routerConfig(c)
	p2c := config.Policy{Type: config.PolicyPowerOfTwo}
	a, b := plainBucket("a", ids(loaded), p2c), plainBucket("b", ids(spare), p2c)
	b.Rank = 1
	// The router measures wall time: the target is the simulated one over the speedup.
	wallTarget := time.Duration(float64(o.SLOTTFT) / o.Speedup)
	ttftMs := float64(wallTarget) / float64(time.Millisecond)
	cfg.Models = map[string]config.Model{o.Model: {Buckets: []config.Bucket{a, b}, BucketOrder: order,
		SLO: config.SLO{TTFTMs: &ttftMs}}}
	r, err := o.startRouter(ctx, cfg)
	if err != nil {
		return row, err
	}
	defer func() { err = errors.Join(err, r.close()) }()

	// The background load, sent to bucket a's engines directly until the row ends.
	bgCtx, stopBG := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var bgErr error
	wg.Go(func() {
		_, err := loadgen.Measure(bgCtx, loadgen.Config{
			URLs: urls(loaded), Model: o.Model, Rate: o.SLOBackgroundRate * float64(len(loaded)) * o.Speedup,
			Repeat: true, Duration: o.Duration * 2, Seed: o.Seed + 7, Timeout: o.RequestTimeout,
		}, bg.Requests)
		if err != nil && bgCtx.Err() == nil {
			bgErr = err
		}
	})
	defer func() {
		stopBG()
		wg.Wait()
		err = errors.Join(err, bgErr)
	}()
	// Let the background queue build before the foreground starts.
	warm := time.NewTimer(o.Duration / 10)
	select {
	case <-warm.C:
	case <-ctx.Done():
		warm.Stop()
		return row, ctx.Err()
	}

	m, err := h.measure(ctx, load{
		label: "slo " + order, urls: []string{r.url}, reqs: wl.Requests, stream: true, simulated: true,
		rate: o.SLORate, maxRequests: o.Requests, duration: o.Duration,
	})
	if err != nil {
		return row, err
	}
	row.Summary = report.Summarize(m.Results, report.SummaryOptions{Workers: ids(c.plain), TimeScale: o.Speedup, Elapsed: m.Elapsed})
	row.SLO = report.SummarizeSLO(m.Results, wallTarget, o.Speedup, m.Elapsed)
	row.Truncated = m.Truncated
	return row, nil
}
