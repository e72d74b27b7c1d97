package engine

import (
	"testing"
	"time"

	"switchyard/load"
)

var t0 = time.Unix(1_800_000_000, 0)

// native returns a fresh native report (valid capacity) for one rank.
func native(running, waiting, uncached, used int64) load.RankReport {
	return load.RankReport{
		Fields:  load.HasRunning | load.HasWaiting | load.HasUsedTokens | load.HasWaitingUncached | load.HasCapacity | load.HasNative,
		Running: running, Waiting: waiting, WaitingUncachedTokens: uncached, UsedTokens: used,
		MaxTotalTokens: 100000, At: t0,
	}
}

// basic returns a fresh legacy report: running, waiting and used tokens, not native.
func basic(running, waiting, used int64) load.RankReport {
	return load.RankReport{
		Fields:  load.HasRunning | load.HasWaiting | load.HasUsedTokens,
		Running: running, Waiting: waiting, UsedTokens: used, At: t0,
	}
}

// loadTable publishes reports for workers (one rank each) into a table at t0.
func loadTable(t testing.TB, reports map[*Worker]load.RankReport) *load.Table {
	t.Helper()
	agg := load.NewAggregator(5 * time.Second)
	for w, r := range reports {
		agg.SetWorker(w.ID, 1, w.Counters)
		agg.Ingest(w.ID, r)
	}
	tab := load.NewTable()
	tab.Store(agg.Snapshot(t0))
	return tab
}

// pickReq returns a PickRequest at t0 for stage.
func pickReq(stage Stage) *PickRequest {
	return &PickRequest{BucketRequest: &BucketRequest{Model: "llama", InputTokens: 10, ExpectedPeak: -1, Now: t0}, Stage: stage, BucketID: "b"}
}

// inflight sets w's in-flight count to n by acquiring guards.
func inflight(t testing.TB, tr *load.Tracker, w *Worker, n int) {
	t.Helper()
	for range n {
		tr.Acquire(w.Counters, t0)
	}
}
