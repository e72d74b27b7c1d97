//go:build !race

package actors

import (
	"testing"

	"switchyard/config"
	"switchyard/engine"
)

// TestSelectorAllocations locks in the allocation budget of the pick path through the
// actors: a plain and a PD round trip, and a whole Select (made in the caller), allocate
// nothing (pooled calls, reply channels and timers; pooled bucket slices).
func TestSelectorAllocations(t *testing.T) {
	ws := workers("W", 8, engine.StagePlain)
	ps := workers("P", 4, engine.StagePrefill)
	ds := workers("D", 4, engine.StageDecode)
	plain := plainBucket("plain", 4096, engine.NewRoundRobin(nil, nil), nil)
	pd := pdBucket("pd", 8192, engine.NewRoundRobin(nil, nil), engine.NewRoundRobin(nil, nil), nil, nil)
	s := newTestSelector(t, workerSet(t, ws, ps, ds), config.Actors{}, nil, plain, pd)
	res := engine.NewBucketResolver(testModel, []*engine.Bucket{plain})
	req := request(100)
	// A retried request: one engine of each group failed for it.
	retried := request(100)
	retried.RetryAfter(&engine.BucketPick{BucketID: "plain", Plain: engine.Pick{Worker: ws[0]}}, engine.StagePlain)
	retried.RetryAfter(&engine.BucketPick{BucketID: "pd", Prefill: engine.Pick{Worker: ps[0]}, Decode: engine.Pick{Worker: ds[0]}}, engine.StagePrefill)
	retried.RetryAfter(&engine.BucketPick{BucketID: "pd", Prefill: engine.Pick{Worker: ps[0]}, Decode: engine.Pick{Worker: ds[0]}}, engine.StageDecode)
	retriedPlain := request(100)
	retriedPlain.RetryAfter(&engine.BucketPick{BucketID: "plain", Plain: engine.Pick{Worker: ws[0]}}, engine.StagePlain)
	// The slo order with a target, and a PD bucket with a compatibility rule.
	plain2 := plainBucket("plain2", 4096, engine.NewRoundRobin(nil, nil), nil)
	pdc := pdBucket("pdc", 8192, engine.NewRoundRobin(nil, nil), engine.NewRoundRobin(nil, nil), nil, nil)
	pdc.Compat = engine.Compatibility{"transfer_backend"}
	for _, w := range append(append([]*engine.Worker{}, ps...), ds...) {
		w.SetLabels(map[string]string{"transfer_backend": "nixl"})
	}
	s2 := newTestSelector(t, workerSet(t, ws, ps, ds), config.Actors{}, nil, plain2, pdc)
	sloRes := engine.NewBucketResolver(testModel, []*engine.Bucket{plain2, pdc}, engine.WithSLOOrder(nil))
	sloReq := request(100)
	sloReq.SLO.TTFT = 1

	tests := []struct {
		name string
		run  func() (engine.BucketPick, error)
	}{
		{"plain PickEngines", func() (engine.BucketPick, error) { return s.PickEngines(plain, req) }},
		{"PD PickEngines", func() (engine.BucketPick, error) { return s.PickEngines(pd, req) }},
		{"plain Select", func() (engine.BucketPick, error) { return s.Select(res, req) }},
		{"retried PD PickEngines", func() (engine.BucketPick, error) { return s.PickEngines(pd, retried) }},
		{"retried plain Select", func() (engine.BucketPick, error) { return s.Select(res, retriedPlain) }},
		{"slo-ordered Select", func() (engine.BucketPick, error) { return s2.Select(sloRes, sloReq) }},
		{"PD PickEngines with compatibility", func() (engine.BucketPick, error) { return s2.PickEngines(pdc, req) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := tt.run(); err != nil { // warm the pools
				t.Fatal(err)
			}
			n := testing.AllocsPerRun(1000, func() {
				if _, err := tt.run(); err != nil {
					t.Fatal(err)
				}
			})
			if n != 0 {
				t.Fatalf("%v allocs per selection, want 0", n)
			}
		})
	}
}
