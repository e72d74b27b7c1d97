package main

import (
	"context"
	_ "embed"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"switchyard/actors"
	"switchyard/config"
	"switchyard/engine"
	"switchyard/load"
)

//go:embed select.yaml
var selectConfig []byte

// runSelect runs the selection core, hosted on its actors, over the built-in example
// configuration with synthetic load reports, and prints every pick it makes. It sends no
// network traffic: the workers' URLs are never contacted.
func runSelect(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("select", flag.ContinueOnError)
	fs.SetOutput(stderr)
	setUsage(fs, "usage: switchyard select",
		"Prints the selection core's picks for the built-in example configuration, with synthetic load (no engines needed).")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := config.Decode(selectConfig, config.FormatYAML)
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	tracker := load.NewTracker()
	workers, err := engine.WorkersFromConfig(cfg, tracker.Counters)
	if err != nil {
		return err
	}
	set, err := engine.NewWorkerSet(workers)
	if err != nil {
		return err
	}
	now := time.Now()
	table := load.NewTable()
	table.Store(selectLoads(workers, now))
	resolvers, err := engine.BuildResolvers(cfg, engine.Deps{Loads: table, Seed: 42})
	if err != nil {
		return err
	}
	sel, err := actors.NewSelector(resolvers, set, cfg.Actors, actors.SelectorOptions{})
	if err != nil {
		return err
	}
	defer sel.Close()

	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "REQUEST\tMODEL\tINPUT\tPEAK\tBUCKET\tENGINES\tREASONS")
	pick := func(label, model string, input, peak int64) {
		req := &engine.BucketRequest{Model: model, InputTokens: input, ExpectedPeak: peak, Now: now}
		p, err := sel.Select(resolvers[model], req)
		peakS := "?"
		if peak >= 0 {
			peakS = fmt.Sprint(peak)
		}
		if err != nil {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t-\t-\t%s\n", label, model, input, peakS, err)
			return
		}
		if p.IsPD() {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\tP=%s D=%s\t%s, %s\n", label, model, input, peakS, p.BucketID,
				p.Prefill.Worker.ID, p.Decode.Worker.ID, p.Prefill.Reason, p.Decode.Reason)
			return
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", label, model, input, peakS, p.BucketID, p.Plain.Worker.ID, p.Plain.Reason)
		// Hold the pick as a dispatched request would, so in-flight caps take effect.
		tracker.Acquire(p.Plain.Worker.Counters, now)
	}
	pick("4k in, 16k peak", "llama", 4096, 16384)
	pick("4k in, 8k peak", "llama", 4096, 8192)
	pick("4k in, unknown peak", "llama", 4096, -1)
	pick("5k in", "llama", 5000, 6000)
	pick("200k in", "llama", 200000, -1)
	for i := range 5 {
		pick(fmt.Sprintf("qwen #%d (held)", i+1), "qwen", 100, 300)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "\nllama decode picks use power_of_two over the synthetic reports (D1 and D3 busier);")
	fmt.Fprintln(stdout, "qwen picks are held in flight: the small bucket caps each engine at 1, the large at 2,")
	fmt.Fprintln(stdout, "so requests move to the next bucket and finally fail with the accumulated rejections.")
	return nil
}

// selectLoads builds a snapshot with a fresh native report for every worker: D1 and D3 busier
// than D2 and D4, prefill engines with different queues.
func selectLoads(workers []*engine.Worker, now time.Time) *load.Snapshot {
	agg := load.NewAggregator(5 * time.Second)
	busy := map[string]int64{"P1": 3, "P2": 1, "P3": 0, "P4": 2, "D1": 9, "D2": 2, "D3": 7, "D4": 1}
	for _, w := range workers {
		agg.SetWorker(w.ID, w.DPSize, w.Counters)
		n := busy[w.ID]
		agg.Ingest(w.ID, load.RankReport{
			Fields:  load.HasRunning | load.HasWaiting | load.HasUsedTokens | load.HasWaitingUncached | load.HasCapacity | load.HasNative,
			Running: n, Waiting: n / 2, UsedTokens: n * 1000, WaitingUncachedTokens: n * 512,
			MaxTotalTokens: 200000, At: now,
		})
	}
	return agg.Snapshot(now)
}
