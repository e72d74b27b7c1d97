package actors

import (
	"errors"
	"testing"

	"switchyard/config"
	"switchyard/engine"
)

// TestPickEnginesPDBypass: through the bucket and group actors, a PD bucket with the bypass
// on sends a short request to its decode engine alone and a long one to a pair; a decode
// failure in the bypass order fails at the decode stage with no prefill pick.
func TestPickEnginesPDBypass(t *testing.T) {
	ps := workers("P", 1, engine.StagePrefill)
	ds := workers("D", 2, engine.StageDecode)
	ds[0].CanPrefill = true
	b := pdBucket("pd", engine.Unbounded, engine.NewRoundRobin(nil, nil), engine.NewRoundRobin(nil, nil), []string{"P1"}, []string{"D1", "D2"})
	b.BypassBelow = 64
	empty := pdBucket("empty", engine.Unbounded, engine.NewRoundRobin(nil, nil), engine.NewRoundRobin(nil, nil), []string{"P1"}, []string{})
	empty.BypassBelow = 64
	s := newTestSelector(t, workerSet(t, ps, ds), config.Actors{}, nil, b, empty)

	// Round robin over D1 (can prefill) and D2 (cannot): a short request is bypassed on D1
	// and paired on D2.
	first, err := s.PickEngines(b, request(10))
	if err != nil {
		t.Fatal(err)
	}
	if !first.Bypass || first.IsPD() || first.Plain.Worker != ds[0] || first.BucketID != "pd" {
		t.Fatalf("short request on D1: %+v", first)
	}
	second, err := s.PickEngines(b, request(10))
	if err != nil {
		t.Fatal(err)
	}
	if second.Bypass || !second.IsPD() || second.Decode.Worker != ds[1] || second.Prefill.Worker != ps[0] || second.BucketID != "pd" {
		t.Fatalf("short request on D2 (cannot prefill): %+v", second)
	}
	long, err := s.PickEngines(b, request(1000))
	if err != nil {
		t.Fatal(err)
	}
	if long.Bypass || long.Decode.Worker != ds[0] || long.Prefill.Worker != ps[0] {
		t.Fatalf("long request: %+v", long)
	}
	_, err = s.PickEngines(empty, request(10))
	var pe *engine.PickError
	if !errors.As(err, &pe) || pe.Stage != engine.StageDecode || !errors.Is(err, engine.ErrNoCandidates) {
		t.Fatalf("empty decode group: %v", err)
	}
}

// TestPickEnginesPDBypassKeepsPairsCompatible: through the actors, with the bypass on the
// decode group actor picks first, and a request that is not bypassed gets a prefill engine
// compatible with that decode engine.
func TestPickEnginesPDBypassKeepsPairsCompatible(t *testing.T) {
	ps := workers("P", 2, engine.StagePrefill)
	ds := workers("D", 1, engine.StageDecode)
	ps[0].SetLabels(map[string]string{"transfer_backend": "nixl"})
	ps[1].SetLabels(map[string]string{"transfer_backend": "mooncake"})
	ds[0].SetLabels(map[string]string{"transfer_backend": "mooncake"})
	b := pdBucket("pd", engine.Unbounded, engine.NewRoundRobin(nil, nil), engine.NewRoundRobin(nil, nil), []string{"P1", "P2"}, []string{"D1"})
	b.BypassBelow, b.Compat = 64, engine.Compatibility{"transfer_backend"}
	s := newTestSelector(t, workerSet(t, ps, ds), config.Actors{}, nil, b)
	for i := range 4 {
		p, err := s.PickEngines(b, request(1000))
		if err != nil {
			t.Fatalf("pick %d: %v", i, err)
		}
		if p.Bypass || p.Decode.Worker != ds[0] || p.Prefill.Worker != ps[1] {
			t.Fatalf("pick %d: %s+%s, want P2 (mooncake) with D1 (mooncake)", i, p.Prefill.Worker, p.Decode.Worker)
		}
	}
}
