package engine

import (
	"cmp"

	"switchyard/load"
)

// comparePressure orders two native observations by stage pressure: negative when a is less
// loaded than b, positive when more, 0 on a tie of every reported metric.
//
// Plain and prefill compare the estimated prefill queue time when both reports provide it,
// then waiting uncached tokens, waiting requests and running requests. Decode compares
// waiting requests, running requests, KV usage fraction, then used KV tokens.
func comparePressure(stage Stage, a, b *load.Observation) int {
	if stage == StageDecode {
		if c := cmp.Compare(a.Waiting, b.Waiting); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Running, b.Running); c != 0 {
			return c
		}
		if c := cmp.Compare(a.KVUsage(), b.KVUsage()); c != 0 {
			return c
		}
		return cmp.Compare(a.UsedTokens, b.UsedTokens)
	}
	if a.Has(load.HasPrefillQueue) && b.Has(load.HasPrefillQueue) {
		if c := cmp.Compare(a.PrefillQueueMs, b.PrefillQueueMs); c != 0 {
			return c
		}
	}
	if a.Has(load.HasWaitingUncached) && b.Has(load.HasWaitingUncached) {
		if c := cmp.Compare(a.WaitingUncachedTokens, b.WaitingUncachedTokens); c != 0 {
			return c
		}
	}
	if c := cmp.Compare(a.Waiting, b.Waiting); c != 0 {
		return c
	}
	return cmp.Compare(a.Running, b.Running)
}

// compareInFlight orders two workers by router-local in-flight requests.
func compareInFlight(a, b *Worker) int {
	return cmp.Compare(a.Counters.InFlight(), b.Counters.InFlight())
}
