package engine

import (
	"math"
	"testing"

	"switchyard/load"
)

// decisionLog is a CacheAwareObserver keeping a copy of every decision.
type decisionLog struct{ got []LatencyDecision }

func (l *decisionLog) LatencyDecided(_ *PickRequest, d *LatencyDecision) {
	c := *d
	c.Candidates = append([]LatencyCandidate(nil), d.Candidates...)
	l.got = append(l.got, c)
}

// TestCacheAwareObserver: the observer sees each latency decision as the policy weighed it:
// every candidate's prefix, uncached tokens, work ahead, expected TTFT and score, the tie
// ceiling, the hit weight and the engine chosen, here a holder left because its queue
// costs more than its weighted hit (the record says so: its score is above the ceiling).
func TestCacheAwareObserver(t *testing.T) {
	ws := sortedWorkers(t, 3)
	tr := load.NewTracker()
	for _, w := range ws {
		w.Counters = tr.Counters(w.ID)
		learn(w, 100e-6)
	}
	tr.AcquirePrefill(ws[1].Counters, t0, 5000) // the holder has 5,000 tokens pending
	log := &decisionLog{}
	s := testCacheSettings()
	s.Observer = log
	p := NewCacheAware(nil, nil, nil, s, testRNG(), nil)
	got, err := p.Pick(ws, cacheReq(2000, &fakePrefix{matched: map[string]int64{ws[1].ID: 1000}}))
	if err != nil {
		t.Fatal(err)
	}
	if got.Worker != ws[0] || got.Reason != ReasonCacheMissFallback {
		t.Fatalf("got %v (%s), want w0 away from the busy holder", got.Worker, got.Reason)
	}
	if len(log.got) != 1 {
		t.Fatalf("%d decisions recorded, want 1", len(log.got))
	}
	d := log.got[0]
	if d.Chosen != 0 || !d.Timed || d.Rejected != "" || len(d.Candidates) != 3 {
		t.Fatalf("decision %+v, want w0 chosen, timed, admitted, 3 candidates", d)
	}
	h := d.Candidates[1]
	per := h.PerToken
	if h.WorkerID != ws[1].ID || h.Matched != 1000 || h.Uncached != 1000 || h.Work != 6000 || !(per > 0) {
		t.Fatalf("holder %+v, want 1,000 matched, 1,000 uncached, 6,000 tokens of work, a learned cost", h)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }
	// One of three engines busy: the hit weighs 4/3.
	if !near(d.HitWeight, 4.0/3) {
		t.Errorf("hit weight %g, want 4/3", d.HitWeight)
	}
	if !near(h.TTFT, 6000*per) || !near(h.Score, (6000-2*1000*4.0/3)*per) || !near(h.Queue(), 5000*per) {
		t.Errorf("holder TTFT %g score %g queue %g, want %g, %g, %g", h.TTFT, h.Score, h.Queue(), 6000*per, (6000-2*1000*4.0/3)*per, 5000*per)
	}
	c := d.Candidates[0]
	if c.Matched != 0 || c.Work != 2000 || !near(c.Score, 2000*per) || c.Queue() != 0 {
		t.Errorf("chosen %+v, want 2,000 tokens of work and nothing ahead", c)
	}
	if !near(d.Ceiling, 2200*per) || !(h.Score > d.Ceiling) {
		t.Errorf("ceiling %g, want %g, below the holder's score %g", d.Ceiling, 2200*per, h.Score)
	}

	// Without a learned rate the record is in tokens.
	ws2 := sortedWorkers(t, 2)
	log.got = nil
	p = NewCacheAware(nil, nil, nil, s, testRNG(), nil)
	if _, err := p.Pick(ws2, cacheReq(3000, &fakePrefix{matched: map[string]int64{ws2[1].ID: 2048}})); err != nil {
		t.Fatal(err)
	}
	if d := log.got[0]; d.Timed || d.Chosen != 1 || d.HitWeight != 1 || d.Candidates[1].PerToken != 0 || d.Candidates[1].Score != 3000-3*2048 {
		t.Errorf("untimed decision %+v, want the holder chosen in tokens (score %d)", d, 3000-3*2048)
	}
}
