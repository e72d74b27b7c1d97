package engine

import (
	"math"
	"testing"

	"switchyard/load"
)

const nativeFields = load.HasRunning | load.HasWaiting | load.HasUsedTokens | load.HasWaitingUncached | load.HasCapacity | load.HasNative

func TestKeyOfCorrectsForDispatchesSinceCapture(t *testing.T) {
	tests := []struct {
		name        string
		obs         load.Observation
		dispatched  int   // dispatches the worker has made in total; the report saw obs.DispatchesAtCapture
		perDispatch int64 // uncached tokens estimated per pending dispatch
		want        loadKey
	}{
		{
			name:       "no report: in-flight only",
			obs:        load.Observation{},
			dispatched: 3,
			want:       loadKey{inflight: 3},
		},
		{
			name:       "basic report is not native",
			obs:        load.Observation{Fields: load.HasRunning | load.HasWaiting, Running: 4, Waiting: 2},
			dispatched: 1,
			want:       loadKey{inflight: 1},
		},
		{
			name:        "no dispatch since: exactly as reported",
			obs:         load.Observation{Fields: nativeFields | load.HasPrefillQueue, Running: 4, Waiting: 2, WaitingUncachedTokens: 300, PrefillQueueMs: 30, MaxTotalTokens: 1000, UsedTokens: 250, DispatchesAtCapture: 5},
			dispatched:  5,
			perDispatch: 100,
			want:        loadKey{queueMs: 30, uncached: 300, waiting: 2, running: 4, kvUsage: 0.25, used: 250, inflight: 5, native: true, fields: nativeFields | load.HasPrefillQueue},
		},
		{
			name:        "pending dispatches are waiting requests of the request's input tokens",
			obs:         load.Observation{Fields: nativeFields, Running: 1, MaxTotalTokens: 1000, DispatchesAtCapture: 2},
			dispatched:  10,
			perDispatch: 100,
			want:        loadKey{uncached: 800, waiting: 8, running: 1, inflight: 10, pending: 8, native: true, fields: nativeFields},
		},
		{
			name:        "queue estimate grows at the report's rate",
			obs:         load.Observation{Fields: nativeFields | load.HasPrefillQueue, Waiting: 1, WaitingUncachedTokens: 200, PrefillQueueMs: 20, MaxTotalTokens: 1000},
			dispatched:  2,
			perDispatch: 100,
			want:        loadKey{queueMs: 40, uncached: 400, waiting: 3, inflight: 2, pending: 2, native: true, fields: nativeFields | load.HasPrefillQueue},
		},
		{
			name:        "an idle queue has no rate: the queue estimate is not compared",
			obs:         load.Observation{Fields: nativeFields | load.HasPrefillQueue, MaxTotalTokens: 1000},
			dispatched:  1,
			perDispatch: 100,
			want:        loadKey{uncached: 100, waiting: 1, inflight: 1, pending: 1, native: true, fields: nativeFields},
		},
		{
			name:       "no token estimate: neither uncached tokens nor queue are compared",
			obs:        load.Observation{Fields: nativeFields | load.HasPrefillQueue, Waiting: 1, WaitingUncachedTokens: 200, PrefillQueueMs: 20, MaxTotalTokens: 1000},
			dispatched: 1,
			want:       loadKey{queueMs: 20, uncached: 200, waiting: 2, inflight: 1, pending: 1, native: true, fields: nativeFields &^ load.HasWaitingUncached},
		},
		{
			name:        "a dispatch count behind the report (worker re-registered) is no correction",
			obs:         load.Observation{Fields: nativeFields, Waiting: 1, MaxTotalTokens: 1000, DispatchesAtCapture: 9},
			dispatched:  3,
			perDispatch: 100,
			want:        loadKey{waiting: 1, inflight: 3, native: true, fields: nativeFields},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := testWorkers(t, "llama", StagePrefill, "w", 1)[0]
			inflight(t, load.NewTracker(), w, tt.dispatched)
			if got := keyOf(w, &tt.obs, tt.perDispatch); got != tt.want {
				t.Fatalf("keyOf = %+v\nwant    %+v", got, tt.want)
			}
		})
	}
}

func TestKeyOfSaturates(t *testing.T) {
	w := testWorkers(t, "llama", StagePrefill, "w", 1)[0]
	inflight(t, load.NewTracker(), w, 2)
	obs := load.Observation{Fields: nativeFields, Waiting: math.MaxInt64 - 1, WaitingUncachedTokens: math.MaxInt64 - 1, MaxTotalTokens: 1}
	k := keyOf(w, &obs, math.MaxInt64)
	if k.waiting != math.MaxInt64 || k.uncached != math.MaxInt64 {
		t.Fatalf("waiting %d, uncached %d: want saturation", k.waiting, k.uncached)
	}
}

func TestComparePressureCorrected(t *testing.T) {
	tests := []struct {
		name  string
		stage Stage
		a, b  loadKey
		want  int
	}{
		{"queue first when both have it", StagePrefill,
			loadKey{queueMs: 10, uncached: 900, fields: nativeFields | load.HasPrefillQueue},
			loadKey{queueMs: 20, uncached: 100, fields: nativeFields | load.HasPrefillQueue}, -1},
		{"queue skipped when one key lost it", StagePrefill,
			loadKey{queueMs: 0, uncached: 900, fields: nativeFields},
			loadKey{queueMs: 20, uncached: 100, fields: nativeFields | load.HasPrefillQueue}, 1},
		{"uncached skipped when one key lost it: waiting decides", StagePlain,
			loadKey{uncached: 0, waiting: 5, fields: nativeFields &^ load.HasWaitingUncached},
			loadKey{uncached: 100, waiting: 2, fields: nativeFields}, 1},
		{"then running", StagePrefill,
			loadKey{waiting: 2, running: 1, fields: nativeFields},
			loadKey{waiting: 2, running: 3, fields: nativeFields}, -1},
		{"decode: waiting, then running, kv usage, used", StageDecode,
			loadKey{waiting: 2, running: 1, kvUsage: 0.5, used: 10},
			loadKey{waiting: 2, running: 1, kvUsage: 0.5, used: 9}, 1},
		{"full tie", StageDecode, loadKey{waiting: 1, running: 1}, loadKey{waiting: 1, running: 1}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := comparePressure(tt.stage, &tt.a, &tt.b); got != tt.want {
				t.Fatalf("comparePressure = %d, want %d", got, tt.want)
			}
			if got := comparePressure(tt.stage, &tt.b, &tt.a); got != -tt.want {
				t.Fatalf("reversed comparePressure = %d, want %d", got, -tt.want)
			}
		})
	}
}
