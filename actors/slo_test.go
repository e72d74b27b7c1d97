package actors

import (
	"errors"
	"testing"
	"time"

	"switchyard/config"
	"switchyard/engine"
)

// TestSelectPDCompatibility runs PD compatibility through the actors: the decode group
// actor picks among the engines compatible with the prefill engine its bucket actor's
// prefill group picked, and a bucket without one moves the loop on, a whole new pair from
// the next bucket.
func TestSelectPDCompatibility(t *testing.T) {
	sp, sd := workers("SP", 2, engine.StagePrefill), workers("SD", 3, engine.StageDecode)
	lp, ld := workers("LP", 1, engine.StagePrefill), workers("LD", 1, engine.StageDecode)
	label := func(w *engine.Worker, backend string) { w.SetLabels(map[string]string{"transfer_backend": backend}) }
	label(sp[0], "nixl")
	label(sp[1], "mooncake")
	label(sd[0], "mooncake")
	label(sd[1], "nixl")
	label(sd[2], "mooncake")
	label(lp[0], "nixl")
	label(ld[0], "nixl")
	rule := engine.Compatibility{"transfer_backend"}
	short := pdBucket("short", 1000, engine.NewRoundRobin(nil, nil), engine.NewRoundRobin(nil, nil), []string{"SP1", "SP2"}, []string{"SD1", "SD2", "SD3"})
	long := pdBucket("long", 4000, engine.NewRoundRobin(nil, nil), engine.NewRoundRobin(nil, nil), []string{"LP1"}, []string{"LD1"})
	short.Compat, long.Compat = rule, rule
	ws := workerSet(t, sp, sd, lp, ld)
	s := newTestSelector(t, ws, config.Actors{}, nil, short, long)
	res := engine.NewBucketResolver(testModel, []*engine.Bucket{short, long})

	for i := range 1000 {
		p, err := s.Select(res, request(100))
		if err != nil {
			t.Fatalf("select %d: %v", i, err)
		}
		if p.BucketID != "short" || p.Prefill.Worker.Label("transfer_backend") != p.Decode.Worker.Label("transfer_backend") {
			t.Fatalf("select %d: %s+%s from %s", i, p.Prefill.Worker, p.Decode.Worker, p.BucketID)
		}
	}
	// The nixl decode engine of short goes away: SP1's attempts move to long.
	ws.SetHealthy("SD2", false)
	sawLong := false
	for i := range 20 {
		p, err := s.Select(res, request(100))
		if err != nil {
			t.Fatalf("select %d: %v", i, err)
		}
		if p.Prefill.Worker.Label("transfer_backend") != p.Decode.Worker.Label("transfer_backend") {
			t.Fatalf("select %d: incompatible %s+%s", i, p.Prefill.Worker, p.Decode.Worker)
		}
		if p.BucketID == "long" {
			sawLong = true
			if p.Prefill.Worker != lp[0] || p.Decode.Worker != ld[0] {
				t.Fatalf("long pair %s+%s", p.Prefill.Worker, p.Decode.Worker)
			}
		}
	}
	if !sawLong {
		t.Fatal("no attempt moved on to the long bucket")
	}
	// Only short fits and its one nixl prefill engine has no partner left: the failure
	// names pd_incompatible.
	ws.SetHealthy("SP2", false)
	_, err := s.Select(engine.NewBucketResolver(testModel, []*engine.Bucket{short}), request(100))
	var pe *engine.PickError
	if !errors.As(err, &pe) || pe.Outcome != engine.OutcomeNoAdmissibleEngine || len(pe.Rejections) != 1 ||
		pe.Rejections[0].Limit != engine.LimitPDIncompatible || pe.Rejections[0].WorkerID != "SP1" {
		t.Fatalf("err %v", err)
	}
}

// TestSelectSLOOrder: Select orders by the resolver's rule and records it in the pick.
func TestSelectSLOOrder(t *testing.T) {
	a, b := workers("A", 1, engine.StagePlain), workers("B", 1, engine.StagePlain)
	a[0].Counters.Rates().Prefill.Observe(1000, 2) // slow
	b[0].Counters.Rates().Prefill.Observe(1000, 0.05)
	first := plainBucket("a", 1000, engine.NewRoundRobin(nil, nil), []string{"A1"})
	second := plainBucket("b", 1000, engine.NewRoundRobin(nil, nil), []string{"B1"})
	second.Rank = 1
	s := newTestSelector(t, workerSet(t, a, b), config.Actors{}, nil, first, second)
	sloRes := engine.NewBucketResolver(testModel, []*engine.Bucket{first, second}, engine.WithSLOOrder(nil))
	capRes := engine.NewBucketResolver(testModel, []*engine.Bucket{first, second})

	req := request(1000)
	req.SLO.TTFT = 200 * time.Millisecond
	tests := []struct {
		name   string
		res    *engine.BucketResolver
		req    *engine.BucketRequest
		bucket string
		order  engine.BucketOrder
	}{
		{"slo order, with a target", sloRes, req, "b", engine.OrderSLO},
		{"slo order, no target", sloRes, request(1000), "a", engine.OrderCapacity},
		{"capacity order", capRes, req, "a", engine.OrderCapacity},
	}
	for _, tt := range tests {
		p, err := s.Select(tt.res, tt.req)
		if err != nil || p.BucketID != tt.bucket || p.Order != tt.order {
			t.Errorf("%s: bucket %s order %v err %v; want %s, %v", tt.name, p.BucketID, p.Order, err, tt.bucket, tt.order)
		}
	}
}
