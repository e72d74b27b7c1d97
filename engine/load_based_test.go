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
		dispatches []int   // dispatches after the report was captured (decode: counted as waiting)
		pending    []int64 // uncached tokens of one request pending prefill (no first token yet)
		want       int
		wantReason string
	}{
		{"least uncached wins", StagePrefill, []load.RankReport{native(0, 0, 500, 0), native(0, 0, 100, 0), native(0, 0, 300, 0)}, nil, nil, nil, 1, ReasonLeastLoad},
		{"decode least waiting", StageDecode, []load.RankReport{native(0, 2, 0, 0), native(0, 1, 0, 0), native(0, 3, 0, 0)}, nil, nil, nil, 1, ReasonLeastLoad},
		{"tie goes to lowest ID", StageDecode, []load.RankReport{native(1, 1, 0, 0), native(1, 1, 0, 0), native(1, 1, 0, 0)}, nil, nil, nil, 0, ReasonLeastLoad},
		{"prefill tie goes to lowest ID", StagePrefill, []load.RankReport{native(1, 1, 0, 0), native(1, 1, 0, 0), native(1, 1, 0, 0)}, nil, nil, nil, 0, ReasonLeastLoad},
		{"tie broken by in-flight", StageDecode, []load.RankReport{native(1, 1, 0, 0), native(1, 1, 0, 0), native(1, 1, 0, 0)}, []int{2, 1, 1}, nil, nil, 1, ReasonLeastLoad},
		{"recent dispatches correct a stale-looking idle engine", StageDecode, []load.RankReport{native(0, 0, 0, 0), native(0, 1, 0, 0)}, nil, []int{3, 0}, nil, 1, ReasonLeastLoad},
		{"finished dispatches are not queued work", StagePrefill, []load.RankReport{native(0, 0, 0, 0), native(0, 0, 20, 0)}, nil, []int{3, 0}, nil, 0, ReasonLeastLoad},
		{"the router's pending prefill counts with its own tokens", StagePrefill, []load.RankReport{native(0, 0, 0, 0), native(0, 0, 200, 0)}, nil, nil, []int64{5000, 0}, 1, ReasonLeastLoad},
		{"a long prompt in prefill outweighs short queued ones", StagePlain, []load.RankReport{native(1, 0, 0, 0), native(0, 3, 900, 0)}, nil, nil, []int64{30000, 0}, 1, ReasonLeastLoad},
		{"equal work: the lower decode load wins, not the lowest ID", StagePlain, []load.RankReport{native(6, 0, 0, 0), native(2, 0, 0, 0), native(4, 0, 0, 0)}, nil, nil, nil, 1, ReasonLeastLoad},
		{"work within 10% ties: decode load decides", StagePrefill, []load.RankReport{native(9, 0, 1000, 0), native(1, 0, 1080, 0)}, nil, nil, nil, 1, ReasonLeastLoad},
		{"work beyond 10% decides before decode load", StagePrefill, []load.RankReport{native(9, 0, 1000, 0), native(1, 0, 1200, 0)}, nil, nil, nil, 0, ReasonLeastLoad},
		{"missing telemetry falls back to in-flight", StagePlain, []load.RankReport{native(0, 0, 0, 0), {}, native(9, 9, 9, 9)}, []int{4, 2, 3}, nil, nil, 1, ReasonInFlight},
		{"basic reports fall back to in-flight", StagePlain, []load.RankReport{basic(0, 0, 0), basic(5, 5, 5)}, []int{1, 0}, nil, nil, 1, ReasonInFlight},
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
			for i, n := range tt.pending {
				if n > 0 {
					tr.AcquirePrefill(ws[i].Counters, t0, n)
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
