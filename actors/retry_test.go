package actors

import (
	"errors"
	"slices"
	"testing"

	"switchyard/config"
	"switchyard/engine"
)

// TestSelectRetryRule runs the retry rule through the actors: a retried PD request is asked
// of its failed bucket first with the failed engine left out, every attempt is a pair from
// one bucket, and once that bucket's group has no engine left the later bucket supplies a
// whole new pair; the earlier bucket is never asked again.
func TestSelectRetryRule(t *testing.T) {
	sp, sd := workers("SP", 2, engine.StagePrefill), workers("SD", 1, engine.StageDecode)
	mp, md := workers("MP", 1, engine.StagePrefill), workers("MD", 2, engine.StageDecode)
	lp, ld := workers("LP", 1, engine.StagePrefill), workers("LD", 1, engine.StageDecode)
	ids := func(ws []*engine.Worker) []string {
		var out []string
		for _, w := range ws {
			out = append(out, w.ID)
		}
		return out
	}
	short := pdBucket("short", 1000, engine.NewRoundRobin(nil, nil), engine.NewRoundRobin(nil, nil), ids(sp), ids(sd))
	mid := pdBucket("mid", 2000, engine.NewRoundRobin(nil, nil), engine.NewRoundRobin(nil, nil), ids(mp), ids(md))
	long := pdBucket("long", 4000, engine.NewRoundRobin(nil, nil), engine.NewRoundRobin(nil, nil), ids(lp), ids(ld))
	s := newTestSelector(t, workerSet(t, sp, sd, mp, md, lp, ld), config.Actors{}, nil, short, mid, long)
	res := engine.NewBucketResolver(testModel, []*engine.Bucket{short, mid, long})
	members := map[string][2][]*engine.Worker{"short": {sp, sd}, "mid": {mp, md}, "long": {lp, ld}}

	// The request fits the mid and long buckets only.
	req := request(1500)
	type step struct {
		bucket string
		fail   engine.Stage
	}
	// mid: MD1 fails, then MD2 (mid has no decode left), then long: LP1 fails (long has no
	// prefill left): exhausted.
	steps := []step{{"mid", engine.StageDecode}, {"mid", engine.StageDecode}, {"long", engine.StagePrefill}}
	var seen []string
	for i, st := range steps {
		pick, err := s.Select(res, req)
		if err != nil {
			t.Fatalf("attempt %d: %v", i, err)
		}
		m := members[pick.BucketID]
		if pick.BucketID != st.bucket || !slices.Contains(m[0], pick.Prefill.Worker) || !slices.Contains(m[1], pick.Decode.Worker) {
			t.Fatalf("attempt %d: %s+%s from %s, want a pair of bucket %s", i, pick.Prefill.Worker, pick.Decode.Worker, pick.BucketID, st.bucket)
		}
		seen = append(seen, pick.Decode.Worker.ID)
		if !req.RetryAfter(&pick, st.fail) {
			t.Fatal("RetryAfter refused")
		}
	}
	if !slices.Equal(seen, []string{"MD1", "MD2", "LD1"}) {
		t.Fatalf("decode engines %v", seen)
	}
	_, err := s.Select(res, req)
	var pe *engine.PickError
	if !errors.As(err, &pe) || pe.Outcome != engine.OutcomeNoCandidates || pe.BucketID != "long" || pe.Stage != engine.StagePrefill {
		t.Fatalf("after every engine failed: %v, want no candidates in long's prefill group", err)
	}
	// A first attempt of another request is unaffected by this one's exclusions.
	if p, err := s.Select(res, request(1500)); err != nil || p.BucketID != "mid" {
		t.Fatalf("fresh request: %+v %v", p, err)
	}
}
