package actors

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/load"
)

// benchLoads returns a load table holding a fresh, native report for every worker, so
// power_of_two compares reported pressure as in production.
func benchLoads(now time.Time, ws ...[]*engine.Worker) *load.Table {
	agg := load.NewAggregator(time.Hour)
	for _, group := range ws {
		for i, w := range group {
			agg.SetWorker(w.ID, 1, w.Counters)
			agg.Ingest(w.ID, load.RankReport{
				Fields:         load.HasRunning | load.HasWaiting | load.HasUsedTokens | load.HasCapacity | load.HasNative | load.HasWaitingUncached,
				Running:        int64(i % 7),
				Waiting:        int64(i % 3),
				UsedTokens:     int64(1000 * (i % 11)),
				MaxTotalTokens: 100_000,
				At:             now,
			})
		}
	}
	t := load.NewTable()
	t.Store(agg.Snapshot(now))
	return t
}

func benchPolicy(name string, loads engine.LoadReader, seed uint64) engine.Policy {
	switch name {
	case engine.PolicyPowerOfTwo:
		return engine.NewPowerOfTwo(nil, loads, rand.New(rand.NewPCG(seed, 1)))
	default:
		return engine.NewRoundRobin(nil, loads)
	}
}

// benchFixture is one bucket of n engines (plain, or n/2 prefill and n/2 decode).
type benchFixture struct {
	set    *engine.WorkerSet
	bucket *engine.Bucket
	res    *engine.BucketResolver
	req    *engine.BucketRequest
}

func newBenchFixture(b *testing.B, pd bool, policy string, n int) *benchFixture {
	b.Helper()
	now := time.Now()
	f := &benchFixture{req: &engine.BucketRequest{Model: testModel, InputTokens: 100, ExpectedPeak: -1, Now: now}}
	if pd {
		ps := workers("P", n/2, engine.StagePrefill)
		ds := workers("D", n/2, engine.StageDecode)
		loads := benchLoads(now, ps, ds)
		f.set = workerSet(b, ps, ds)
		f.bucket = pdBucket("pd", 4096, benchPolicy(policy, loads, 1), benchPolicy(policy, loads, 2), nil, nil)
	} else {
		ws := workers("W", n, engine.StagePlain)
		loads := benchLoads(now, ws)
		f.set = workerSet(b, ws)
		f.bucket = plainBucket("plain", 4096, benchPolicy(policy, loads, 1), nil)
	}
	f.res = engine.NewBucketResolver(testModel, []*engine.Bucket{f.bucket})
	return f
}

func checkPick(b *testing.B, p engine.BucketPick, err error) {
	if err != nil {
		b.Fatal(err)
	}
	if p.Plain.Worker == nil && p.Decode.Worker == nil {
		b.Fatal("empty pick")
	}
}

// directPick is one bucket's complete selection on the caller's goroutine: the steps the
// group actors take (engine.Bucket.FirstStage, PickStage), called in turn.
func directPick(b *engine.Bucket, reg *engine.Registry, req *engine.BucketRequest) (engine.BucketPick, error) {
	var sel engine.BucketPick
	for stage, more := b.FirstStage(), true; more; {
		var err error
		if stage, more, err = b.PickStage(reg, req, stage, &sel); err != nil {
			return engine.BucketPick{}, err
		}
	}
	return sel, nil
}

// BenchmarkPick measures one bucket's complete selection: through the actors
// (Selector.PickEngines: one round trip, bucket actor → group actor(s) → caller), as Select
// makes it (Selector.pick: in the caller when the bucket is idle, else the round trip),
// beside the direct calls of the same steps (directPick, the baseline; under RunParallel the
// bucket is behind a mutex, as its groups must be owned by one goroutine at a time).
func BenchmarkPick(b *testing.B) {
	for _, mode := range []string{"plain", "pd"} {
		for _, policy := range []string{engine.PolicyRoundRobin, engine.PolicyPowerOfTwo} {
			for _, n := range []int{8, 64, 512} {
				name := fmt.Sprintf("%s/%s/engines=%d", mode, policy, n)
				b.Run(name+"/actors/serial", func(b *testing.B) {
					f := newBenchFixture(b, mode == "pd", policy, n)
					s := newTestSelector(b, f.set, config.Actors{}, nil, f.bucket)
					b.ReportAllocs()
					for b.Loop() {
						p, err := s.PickEngines(f.bucket, f.req)
						checkPick(b, p, err)
					}
				})
				b.Run(name+"/actors/parallel", func(b *testing.B) {
					f := newBenchFixture(b, mode == "pd", policy, n)
					s := newTestSelector(b, f.set, config.Actors{Mailbox: config.Mailbox{Bucket: 4096, Group: 4096}}, nil, f.bucket)
					b.ReportAllocs()
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							p, err := s.PickEngines(f.bucket, f.req)
							checkPick(b, p, err)
						}
					})
				})
				b.Run(name+"/caller/serial", func(b *testing.B) {
					f := newBenchFixture(b, mode == "pd", policy, n)
					s := newTestSelector(b, f.set, config.Actors{}, nil, f.bucket)
					b.ReportAllocs()
					for b.Loop() {
						p, err := s.pick(f.bucket, f.req)
						checkPick(b, p, err)
					}
				})
				b.Run(name+"/caller/parallel", func(b *testing.B) {
					f := newBenchFixture(b, mode == "pd", policy, n)
					s := newTestSelector(b, f.set, config.Actors{Mailbox: config.Mailbox{Bucket: 4096, Group: 4096}}, nil, f.bucket)
					b.ReportAllocs()
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							p, err := s.pick(f.bucket, f.req)
							checkPick(b, p, err)
						}
					})
				})
				b.Run(name+"/direct/serial", func(b *testing.B) {
					f := newBenchFixture(b, mode == "pd", policy, n)
					b.ReportAllocs()
					for b.Loop() {
						p, err := directPick(f.bucket, f.set.Load(), f.req)
						checkPick(b, p, err)
					}
				})
				b.Run(name+"/direct/parallel", func(b *testing.B) {
					f := newBenchFixture(b, mode == "pd", policy, n)
					var mu sync.Mutex
					b.ReportAllocs()
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							mu.Lock()
							p, err := directPick(f.bucket, f.set.Load(), f.req)
							mu.Unlock()
							checkPick(b, p, err)
						}
					})
				})
			}
		}
	}
}

// BenchmarkSelect measures the whole selection of Selector.Select (Resolve, then the bucket
// loop with the bucket's selection as the attempt) on one compatible bucket of 64 engines.
func BenchmarkSelect(b *testing.B) {
	for _, mode := range []string{"plain", "pd"} {
		b.Run(mode, func(b *testing.B) {
			f := newBenchFixture(b, mode == "pd", engine.PolicyPowerOfTwo, 64)
			s := newTestSelector(b, f.set, config.Actors{}, nil, f.bucket)
			b.ReportAllocs()
			for b.Loop() {
				p, err := s.Select(f.res, f.req)
				checkPick(b, p, err)
			}
		})
	}
}

// BenchmarkSelectOrder measures Selector.Select over two plain buckets of 8 engines each
// (power_of_two, fresh native reports, learned rates): capacity order (the baseline) beside
// the slo order for a request with a TTFT target, which estimates all 16 engines before the
// round trip; and a PD bucket of 8+8 engines with and without a compatibility rule.
func BenchmarkSelectOrder(b *testing.B) {
	now := time.Now()
	a, c := workers("A", 8, engine.StagePlain), workers("B", 8, engine.StagePlain)
	for _, w := range append(append([]*engine.Worker{}, a...), c...) {
		w.Counters.Rates().Prefill.Observe(1000, 0.05)
		w.Counters.Rates().Decode.Observe(4, 0.01)
	}
	loads := benchLoads(now, a, c)
	ids := func(ws []*engine.Worker) []string {
		var out []string
		for _, w := range ws {
			out = append(out, w.ID)
		}
		return out
	}
	ba := plainBucket("a", 4096, benchPolicy(engine.PolicyPowerOfTwo, loads, 1), ids(a))
	bb := plainBucket("b", 4096, benchPolicy(engine.PolicyPowerOfTwo, loads, 2), ids(c))
	bb.Rank = 1
	ps, ds := workers("P", 8, engine.StagePrefill), workers("D", 8, engine.StageDecode)
	for i, w := range append(append([]*engine.Worker{}, ps...), ds...) {
		w.SetLabels(map[string]string{"transfer_backend": []string{"nixl", "mooncake"}[i%2]})
	}
	pdLoads := benchLoads(now, ps, ds)
	pdPlainRule := pdBucket("pd", 4096, benchPolicy(engine.PolicyPowerOfTwo, pdLoads, 3), benchPolicy(engine.PolicyPowerOfTwo, pdLoads, 4), ids(ps), ids(ds))
	pdRule := pdBucket("pdc", 4096, benchPolicy(engine.PolicyPowerOfTwo, pdLoads, 5), benchPolicy(engine.PolicyPowerOfTwo, pdLoads, 6), ids(ps), ids(ds))
	pdRule.Compat = engine.Compatibility{"transfer_backend"}
	s := newTestSelector(b, workerSet(b, a, c, ps, ds), config.Actors{}, nil, ba, bb, pdPlainRule, pdRule)
	req := &engine.BucketRequest{Model: testModel, InputTokens: 1000, ExpectedPeak: -1, Now: now,
		SLO: engine.SLOTargets{TTFT: 200 * time.Millisecond}}
	for _, tc := range []struct {
		name string
		res  *engine.BucketResolver
	}{
		{"plain/capacity", engine.NewBucketResolver(testModel, []*engine.Bucket{ba, bb})},
		{"plain/slo", engine.NewBucketResolver(testModel, []*engine.Bucket{ba, bb}, engine.WithSLOOrder(loads))},
		{"pd/no-rule", engine.NewBucketResolver(testModel, []*engine.Bucket{pdPlainRule})},
		{"pd/compatibility", engine.NewBucketResolver(testModel, []*engine.Bucket{pdRule})},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p, err := s.Select(tc.res, req)
				checkPick(b, p, err)
			}
		})
	}
}
