package engine

import (
	"testing"

	"switchyard/load"
)

func TestLoadBased(t *testing.T) {
	tests := []struct {
		name       string
		stage      Stage
		reports    []load.RankReport // per worker, zero = none
		inflight   []int
		dispatches []int // dispatches after the report was captured (counted as waiting)
		want       int
		wantReason string
	}{
		{"least uncached wins", StagePrefill, []load.RankReport{native(0, 0, 500, 0), native(0, 0, 100, 0), native(0, 0, 300, 0)}, nil, nil, 1, ReasonLeastLoad},
		{"decode least waiting", StageDecode, []load.RankReport{native(0, 2, 0, 0), native(0, 1, 0, 0), native(0, 3, 0, 0)}, nil, nil, 1, ReasonLeastLoad},
		{"tie goes to lowest ID", StageDecode, []load.RankReport{native(1, 1, 0, 0), native(1, 1, 0, 0), native(1, 1, 0, 0)}, nil, nil, 0, ReasonLeastLoad},
		{"tie broken by in-flight", StageDecode, []load.RankReport{native(1, 1, 0, 0), native(1, 1, 0, 0), native(1, 1, 0, 0)}, []int{2, 1, 1}, nil, 1, ReasonLeastLoad},
		{"recent dispatches correct a stale-looking idle engine", StageDecode, []load.RankReport{native(0, 0, 0, 0), native(0, 1, 0, 0)}, nil, []int{3, 0}, 1, ReasonLeastLoad},
		{"recent dispatches add their input tokens to a stale idle engine's uncached tokens", StagePrefill, []load.RankReport{native(0, 0, 0, 0), native(0, 0, 20, 0)}, nil, []int{3, 0}, 1, ReasonLeastLoad},
		{"missing telemetry falls back to in-flight", StagePlain, []load.RankReport{native(0, 0, 0, 0), {}, native(9, 9, 9, 9)}, []int{4, 2, 3}, nil, 1, ReasonInFlight},
		{"basic reports fall back to in-flight", StagePlain, []load.RankReport{basic(0, 0, 0), basic(5, 5, 5)}, []int{1, 0}, nil, 1, ReasonInFlight},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := testWorkers(t, "llama", tt.stage, "w", len(tt.reports))
			tr := load.NewTracker()
			for i, w := range ws {
				w.Counters = tr.Counters(w.ID)
				if i < len(tt.inflight) {
					inflight(t, tr, w, tt.inflight[i])
				}
			}
			reports := map[*Worker]load.RankReport{}
			for i, r := range tt.reports {
				if r.Fields != 0 {
					reports[ws[i]] = r
				}
			}
			tab := loadTable(t, reports) // records each worker's dispatches at capture
			for i, n := range tt.dispatches {
				for range n {
					tr.Acquire(ws[i].Counters, t0).Release()
				}
			}
			got, err := NewLoadBased(nil, tab).Pick(ws, pickReq(tt.stage))
			if err != nil {
				t.Fatal(err)
			}
			if got.Worker != ws[tt.want] || got.Reason != tt.wantReason {
				t.Fatalf("got %v (%s), want %v (%s)", got.Worker, got.Reason, ws[tt.want], tt.wantReason)
			}
		})
	}
}

func TestRoundRobinCursorPerInstance(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 3)
	a, b := NewRoundRobin(nil, nil), NewRoundRobin(nil, nil)
	var got []string
	for range 4 {
		pa, _ := a.Pick(ws, pickReq(StagePlain))
		got = append(got, pa.Worker.ID)
	}
	pb, _ := b.Pick(ws, pickReq(StagePlain))
	if got[0] != ws[0].ID || got[1] != ws[1].ID || got[2] != ws[2].ID || got[3] != ws[0].ID || pb.Worker != ws[0] {
		t.Fatalf("rotation %v, second instance started at %v", got, pb.Worker)
	}
}
