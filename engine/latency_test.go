package engine

import (
	"testing"

	"switchyard/load"
)

// learn teaches w's prefill line a cost of slope seconds per token over a range of work.
func learn(w *Worker, slope float64) {
	for x := 1000.0; x <= 20000; x += 1000 {
		w.Counters.Rates().Prefill.Observe(x, 0.01+slope*x)
	}
}

// TestLatencyLearnedRates: once every candidate has learned its prefill line, expected
// latency is compared in time, so an engine five times slower loses at equal (or somewhat
// smaller) queued work, under load_based and power_of_two, on both report sources; until
// then work in tokens decides.
func TestLatencyLearnedRates(t *testing.T) {
	for _, stage := range []Stage{StagePlain, StagePrefill} {
		t.Run(stage.String(), func(t *testing.T) {
			ws := testWorkers(t, "llama", stage, "w", 2)
			tr := load.NewTracker()
			for _, w := range ws {
				w.Counters = tr.Counters(w.ID)
			}
			// w0 is slower and has less queued: 400 against 1,000 waiting uncached tokens.
			tab := loadTable(t, map[*Worker]load.RankReport{ws[0]: native(0, 1, 400, 0), ws[1]: native(0, 2, 1000, 0)})
			req := pickReq(stage)
			req.InputTokens = 500
			lb := NewLoadBased(nil, tab)
			p2c := NewPowerOfTwo(nil, tab, rngPicking(t, 2, 0, 0))
			if got, _ := lb.Pick(ws, req); got.Worker != ws[0] {
				t.Fatalf("untimed load_based: got %v, want w0 by tokens (900 < 1,500)", got.Worker)
			}
			learn(ws[0], 250e-6)
			if got, _ := lb.Pick(ws, req); got.Worker != ws[0] {
				t.Fatalf("one line learned: got %v, want w0 still by tokens", got.Worker)
			}
			learn(ws[1], 50e-6)
			if got, _ := lb.Pick(ws, req); got.Worker != ws[1] {
				t.Fatalf("load_based: got %v, want the fast engine (900 × 250µs > 1,500 × 50µs)", got.Worker)
			}
			if got, _ := p2c.Pick(ws, req); got.Worker != ws[1] || got.Reason != ReasonPressure {
				t.Fatalf("power_of_two: got %v (%s), want the fast engine", got.Worker, got.Reason)
			}
		})
	}
}

func TestFastest(t *testing.T) {
	tests := []struct {
		name string
		keys []latencyKey
		want int
	}{
		{name: "none", want: -1},
		{name: "lowest work", keys: []latencyKey{{work: 300}, {work: 100}, {work: 200}}, want: 1},
		{name: "time when every key is timed", keys: []latencyKey{{work: 100, perToken: 5e-3}, {work: 300, perToken: 1e-4}}, want: 1},
		{name: "rates within 1.5× of the median are the median's", keys: []latencyKey{{work: 100, perToken: 1.4e-4}, {work: 120, perToken: 1e-4}, {work: 300, perToken: 1.2e-4}}, want: 0},
		{name: "work when one key is not timed", keys: []latencyKey{{work: 100, perToken: 5e-3}, {work: 300}}, want: 0},
		{name: "a credit lowers the score", keys: []latencyKey{{work: 1000}, {work: 1500, credit: 700}}, want: 1},
		{name: "within 10% of the best time: decode load", keys: []latencyKey{{work: 100, decode: 5}, {work: 109, decode: 2}, {work: 111, decode: 1}}, want: 1},
		{name: "the slack is a share of the fastest time, not of the best score", keys: []latencyKey{{work: 1000, credit: 900, decode: 5}, {work: 105, decode: 1}}, want: 1},
		{name: "then in-flight", keys: []latencyKey{{work: 100, decode: 2, inflight: 2}, {work: 105, decode: 2, inflight: 1}}, want: 1},
		{name: "then the first", keys: []latencyKey{{work: 100, decode: 2}, {work: 100, decode: 2}}, want: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			timed, _ := prepareKeys(tt.keys, nil)
			if got := fastest(tt.keys, timed); got != tt.want {
				t.Fatalf("fastest = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestWeighHits: a hit's credit is weighted by (n+1)/(n+1−b), b the candidates with at
// least the hit's prefill queued ahead of the request (work beyond its own uncached
// tokens).
func TestWeighHits(t *testing.T) {
	const input = 1000
	for _, tt := range []struct {
		name string
		work []float64 // each candidate's work; candidate 0 holds 600 tokens
		want float64   // candidate 0's credit after weighing
	}{
		{name: "idle fleet: the hit counts once more", work: []float64{400, 1000, 1000}, want: 600},
		{name: "the holder busy", work: []float64{1000, 1000, 1000}, want: 600 * 4.0 / 3},
		{name: "two of three busy", work: []float64{1000, 1600, 1000}, want: 600 * 2},
		{name: "every engine busy: n+1", work: []float64{1000, 1600, 1600}, want: 600 * 4},
		{name: "a queue shorter than the hit is idle", work: []float64{999.5, 1599, 1500}, want: 600},
	} {
		t.Run(tt.name, func(t *testing.T) {
			keys := make([]latencyKey, len(tt.work))
			matched := make([]int64, len(tt.work))
			matched[0] = 600
			for i, w := range tt.work {
				keys[i] = latencyKey{work: w, credit: float64(matched[i])}
			}
			weighHits(keys, matched, input)
			if keys[0].credit != tt.want || keys[1].credit != 0 {
				t.Fatalf("credits %v, %v, want %v, 0", keys[0].credit, keys[1].credit, tt.want)
			}
		})
	}
}

// TestLatencyFlatLine: an engine whose first tokens cost a flat 0.5 s (its learned line
// mostly fixed part, a small slope) is slow, not fast: engines compare by the mean cost per
// token of their lines.
func TestLatencyFlatLine(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 2)
	tr := load.NewTracker()
	for _, w := range ws {
		w.Counters = tr.Counters(w.ID)
	}
	for i := range 300 {
		ws[0].Counters.Rates().Prefill.Observe(1000+float64(i%3)*1000, 0.5)
	}
	learn(ws[1], 50e-6)
	tab := loadTable(t, map[*Worker]load.RankReport{ws[0]: native(0, 0, 0, 0), ws[1]: native(0, 0, 0, 0)})
	req := pickReq(StagePlain)
	req.InputTokens = 2000
	if got, _ := NewLoadBased(nil, tab).Pick(ws, req); got.Worker != ws[1] {
		t.Fatalf("load_based: got %v, want the engine of 50 µs per token", got.Worker)
	}
	if got, _ := NewPowerOfTwo(nil, tab, rngPicking(t, 2, 0, 0)).Pick(ws, req); got.Worker != ws[1] {
		t.Fatalf("power_of_two: got %v, want the engine of 50 µs per token", got.Worker)
	}
}
