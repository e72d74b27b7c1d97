package engine

import (
	"fmt"
	"testing"
	"time"

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

// BenchmarkBucketPickEngines measures a direct (actor-free) complete selection, plain and PD:
// the steps of Bucket.FirstStage and PickStage in turn (pickEngines).
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
					if _, err := pickEngines(bk, set.Load(), req); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkResolveAndOrder is the per-request cost of the bucket order: Resolve alone (the
// capacity order, the baseline) and Resolve plus the slo rule, which estimates every engine
// of every compatible bucket, over 2 and 4 buckets of 8 engines each.
func BenchmarkResolveAndOrder(b *testing.B) {
	for _, nb := range []int{2, 4} {
		var all []*Worker
		var buckets []*Bucket
		reports := map[*Worker]load.RankReport{}
		for i := range nb {
			var ids []string
			for j := range 8 {
				w := NewWorker(fmt.Sprintf("b%dw%d", i, j), "http://127.0.0.1:1", "llama", StagePlain, nil)
				w.Counters.Rates().Prefill.Observe(float64(1000*(j+1)), 0.05*float64(i+1))
				w.Counters.Rates().Decode.Observe(4, 0.01)
				reports[w] = native(int64(j), int64(i), int64(100*j), 10)
				all = append(all, w)
				ids = append(ids, w.ID)
			}
			buckets = append(buckets, &Bucket{ID: fmt.Sprint("b", i), Rank: i, MaxInput: Unbounded, MaxContext: Unbounded,
				Plain: NewEngineGroup("llama", StagePlain, ids, NewRoundRobin(nil, nil))})
		}
		set := mustSet(b, all)
		tab := loadTable(b, reports)
		capRes := NewBucketResolver("llama", buckets)
		sloRes := NewBucketResolver("llama", buckets, WithSLOOrder(tab))
		req := &BucketRequest{Model: "llama", InputTokens: 1000, ExpectedPeak: -1, Now: t0,
			SLO: SLOTargets{TTFT: 100 * time.Millisecond}}
		dst := make([]*Bucket, 0, nb)
		for _, tc := range []struct {
			name string
			res  *BucketResolver
		}{{"capacity", capRes}, {"slo", sloRes}} {
			b.Run(fmt.Sprintf("buckets=%d/%s", nb, tc.name), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					bs, _ := tc.res.Resolve(dst[:0], req.InputTokens, req.ExpectedPeak)
					tc.res.Order(bs, req, set.Load())
				}
			})
		}
	}
}

// BenchmarkRankPick measures a group's pick of an engine of 8 DP ranks with rank dispatch:
// by load alone (the baseline), then in a cache_aware group whose request's prefix lookup
// names the ranks holding its prefix.
func BenchmarkRankPick(b *testing.B) {
	w := NewWorker("dp0", "http://127.0.0.1:1", "llama", StagePlain, nil)
	w.DPSize = 8
	reports := make([]load.RankReport, 8)
	for i := range reports {
		reports[i] = native(4, int64(i%3), 0, 100)
	}
	tab := rankTable(b, w, reports...)
	reg, _ := NewRegistry([]*Worker{w})
	memo := &rankPrefix{fakePrefix: fakePrefix{matched: map[string]int64{w.ID: 4096}}, ranks: map[string]uint64{w.ID: 1<<2 | 1<<5}}
	for _, c := range []struct {
		name   string
		prefix bool
	}{{"load", false}, {"prefix", true}} {
		b.Run(c.name, func(b *testing.B) {
			g := NewEngineGroup("llama", StagePlain, nil, NewRoundRobin(nil, nil))
			g.SetRankDispatch(tab, 0)
			req := &BucketRequest{Model: "llama", ExpectedPeak: -1, Now: t0}
			if c.prefix {
				g.SetRankPrefix(1 << 40) // always the holders: the cost of the rule, not of the load
				req.Prefix = memo
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := g.Pick(reg, "b", req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
