package engine

import (
	"fmt"
	"testing"

	"switchyard/load"
)

// BenchmarkPolicyPick measures one policy pick over n candidates with fresh native reports.
func BenchmarkPolicyPick(b *testing.B) {
	for _, n := range []int{8, 64, 512} {
		ws := make([]*Worker, n)
		reports := map[*Worker]load.RankReport{}
		for i := range ws {
			ws[i] = NewWorker(fmt.Sprintf("w%04d", i), "http://127.0.0.1:1", "llama", StagePrefill, nil)
			reports[ws[i]] = native(int64(i%7), int64(i%5), int64(i%13*100), int64(i))
		}
		tab := loadTable(b, reports)
		for name, mk := range policyFactories() {
			b.Run(fmt.Sprintf("%s/engines=%d", name, n), func(b *testing.B) {
				p := mk(AdmissionLimits{MaxRunning: 1 << 40}, tab)
				req := pickReq(StagePrefill)
				b.ReportAllocs()
				for b.Loop() {
					if _, err := p.Pick(ws, req); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkBucketPickEngines measures a direct (actor-free) complete selection, plain and PD.
func BenchmarkBucketPickEngines(b *testing.B) {
	for _, n := range []int{8, 64, 512} {
		for _, pd := range []bool{false, true} {
			var all []*Worker
			mk := func(stage Stage, prefix string) {
				for i := range n {
					all = append(all, NewWorker(fmt.Sprintf("%s%04d", prefix, i), "http://127.0.0.1:1", "llama", stage, nil))
				}
			}
			bk := bucket("b", 0, 0, Unbounded, Unbounded)
			if pd {
				mk(StagePrefill, "p")
				mk(StageDecode, "d")
				bk.Prefill = NewEngineGroup("llama", StagePrefill, nil, NewPowerOfTwo(nil, nil, testRNG()))
				bk.Decode = NewEngineGroup("llama", StageDecode, nil, NewPowerOfTwo(nil, nil, testRNG()))
			} else {
				mk(StagePlain, "w")
				bk.Plain = NewEngineGroup("llama", StagePlain, nil, NewPowerOfTwo(nil, nil, testRNG()))
			}
			set := mustSet(b, all)
			kind := map[bool]string{false: "plain", true: "pd"}[pd]
			b.Run(fmt.Sprintf("%s/engines=%d", kind, n), func(b *testing.B) {
				req := breq("llama", 100, -1)
				req.Now = t0
				b.ReportAllocs()
				for b.Loop() {
					if _, err := bk.PickEngines(set.Load(), req); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
