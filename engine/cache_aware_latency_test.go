package engine

import (
	"errors"
	"testing"
	"time"

	"switchyard/load"
)

// TestCacheAwareLatency covers the latency decision (the default): a prefix counts for the
// prefill it saves, weighed against the work queued ahead on each engine.
func TestCacheAwareLatency(t *testing.T) {
	type engine struct {
		matched  int64
		pending  int64 // the router's own pending prefill tokens there
		inflight int
	}
	tests := []struct {
		name       string
		input      int64
		engines    []engine
		noLookup   bool
		want       int
		wantReason string
	}{
		{name: "a conversation's early turn below 1,024 matched tokens stays on its engine", input: 600,
			engines: []engine{{}, {matched: 400}, {}}, want: 1, wantReason: ReasonCacheCandidate},
		{name: "the longest prefix saves the most", input: 9000,
			engines: []engine{{matched: 2000}, {matched: 8000}, {matched: 4000}}, want: 1, wantReason: ReasonCacheCandidate},
		{name: "a holder whose queue costs more than the hit saves is left", input: 600,
			engines: []engine{{}, {matched: 400, pending: 5000}, {}}, want: 0, wantReason: ReasonCacheMissFallback},
		{name: "a holder queued one and a half times its hit is kept", input: 2000,
			engines: []engine{{}, {matched: 1000, pending: 1500}, {}}, want: 1, wantReason: ReasonCacheCandidate},
		// The holder alone busy: a weight of 4/3, a credit of 2,667 tokens.
		{name: "a holder queued between two and three times its hit is kept", input: 2000,
			engines: []engine{{}, {matched: 1000, pending: 3000}, {}}, want: 1, wantReason: ReasonCacheCandidate},
		{name: "a holder queued beyond its weighted credits is left while the other engines are idle", input: 2000,
			engines: []engine{{}, {matched: 1000, pending: 4500}, {}}, want: 0, wantReason: ReasonCacheMissFallback},
		{name: "the same holder is kept while every engine has the hit's prefill queued: the hit saves the fleet more", input: 2000,
			engines: []engine{{pending: 1000}, {matched: 1000, pending: 5000}, {pending: 1000}}, want: 1, wantReason: ReasonCacheCandidate},
		{name: "queues shorter than the hit do not weigh it", input: 2000,
			engines: []engine{{pending: 900}, {matched: 1000, pending: 5000}, {pending: 900}}, want: 0, wantReason: ReasonCacheMissFallback},
		{name: "a holder's queue smaller than the hit's saving is kept", input: 9000,
			engines: []engine{{}, {matched: 8000, pending: 3000}, {}}, want: 1, wantReason: ReasonCacheCandidate},
		{name: "a tie goes to the longer prefix, then among its holders to the lower decode load", input: 10000,
			engines: []engine{{matched: 16, inflight: 3}, {inflight: 1}, {matched: 16, inflight: 2}}, want: 2, wantReason: ReasonCacheCandidate},
		{name: "equally busy ties go to the longer prefix", input: 10000,
			engines: []engine{{matched: 16}, {}, {matched: 32}}, want: 2, wantReason: ReasonCacheCandidate},
		{name: "no lookup: the least loaded engine", input: 1000, noLookup: true,
			engines: []engine{{pending: 900}, {pending: 100}, {pending: 2000}}, want: 1, wantReason: ReasonCacheMissFallback},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := sortedWorkers(t, len(tt.engines))
			tr := load.NewTracker()
			fp := &fakePrefix{matched: map[string]int64{}}
			for i, e := range tt.engines {
				ws[i].Counters = tr.Counters(ws[i].ID)
				fp.matched[ws[i].ID] = e.matched
				if e.pending > 0 {
					tr.AcquirePrefill(ws[i].Counters, t0, e.pending)
				}
				inflight(t, tr, ws[i], e.inflight)
			}
			var prefix PrefixMatcher = fp
			if tt.noLookup {
				prefix = nil
			}
			p := NewCacheAware(nil, nil, nil, testCacheSettings(), testRNG(), nil)
			got, err := p.Pick(ws, cacheReq(tt.input, prefix))
			if err != nil {
				t.Fatal(err)
			}
			if got.Worker != ws[tt.want] || got.Reason != tt.wantReason {
				t.Fatalf("got %v (%s), want %v (%s)", got.Worker, got.Reason, ws[tt.want], tt.wantReason)
			}
		})
	}
}

// TestCacheAwareLatencyLearnedRates: an engine that learned it prefills five times slower
// loses a hit worth less than the time it would cost, and keeps one worth more.
func TestCacheAwareLatencyLearnedRates(t *testing.T) {
	ws := sortedWorkers(t, 2)
	tr := load.NewTracker()
	for i, w := range ws {
		w.Counters = tr.Counters(w.ID)
		slope := 50e-6 * float64(1+4*i) // w1 five times slower per token
		for x := 1000.0; x <= 20000; x += 1000 {
			w.Counters.Rates().Prefill.Observe(x, 0.01+slope*x)
		}
	}
	p := NewCacheAware(nil, nil, nil, testCacheSettings(), testRNG(), nil)
	// 1,000 of 5,000 tokens held by the slow engine: 4,000 to prefill there (1 s), 0.75 s
	// less the hit's credit, against 5,000 on the fast one (0.25 s): the fast engine.
	// 4,900 held: 100 there: the slow engine.
	got, err := p.Pick(ws, cacheReq(5000, &fakePrefix{matched: map[string]int64{ws[1].ID: 1000}}))
	if err != nil || got.Worker != ws[0] || got.Reason != ReasonCacheMissFallback {
		t.Fatalf("small hit on the slow engine: got %v (%s), err %v", got.Worker, got.Reason, err)
	}
	got, err = p.Pick(ws, cacheReq(5000, &fakePrefix{matched: map[string]int64{ws[1].ID: 4900}}))
	if err != nil || got.Worker != ws[1] || got.Reason != ReasonCacheCandidate {
		t.Fatalf("large hit on the slow engine: got %v (%s), err %v", got.Worker, got.Reason, err)
	}
	if c := p.Metrics().Counts(); c.Candidate != 1 || c.Fallback != 1 || c.Slower != 1 {
		t.Fatalf("counts %+v", c)
	}
}

func TestCacheAwareLatencyAdmission(t *testing.T) {
	ws := sortedWorkers(t, 3)
	fp := &fakePrefix{matched: map[string]int64{ws[2].ID: 3000}}
	adm := &countingAdmission{reject: map[string]bool{ws[2].ID: true}}
	p := NewCacheAware(adm, nil, nil, testCacheSettings(), testRNG(), nil)
	_, err := p.Pick(ws, cacheReq(4000, fp))
	var pe *PickError
	if !errors.As(err, &pe) || pe.Outcome != OutcomeAdmissionRejected || adm.calls != 1 || len(pe.Rejections) != 1 || pe.Rejections[0].WorkerID != ws[2].ID {
		t.Fatalf("err = %v, calls %d", err, adm.calls)
	}
	// The same request with the holder admitted: one check, the holder.
	adm = &countingAdmission{}
	p = NewCacheAware(adm, nil, nil, testCacheSettings(), testRNG(), nil)
	got, err := p.Pick(ws, cacheReq(4000, fp))
	if err != nil || got.Worker != ws[2] || adm.calls != 1 {
		t.Fatalf("got %v err %v calls %d", got.Worker, err, adm.calls)
	}
	c := p.Metrics().Counts()
	if c.Candidate != 1 || c.Fallback != 0 {
		t.Fatalf("counts %+v", c)
	}
	_, _ = p.Pick(ws, cacheReq(4000, &fakePrefix{matched: map[string]int64{}}))
	_, _ = p.Pick(ws, cacheReq(4000, nil))
	if c := p.Metrics().Counts(); c.Fallback != 2 || c.NoHolder != 1 || c.NoLookup != 1 {
		t.Fatalf("counts %+v", c)
	}
}

// TestCacheAwareLatencyPrefillProgress: a holder busy with a long prompt it has mostly
// prefilled is not slower than it looks: the router counts what is left of that prompt at
// the holder's learned rate (load.Counters.PendingPrefillLeft), so the hit stays there.
func TestCacheAwareLatencyPrefillProgress(t *testing.T) {
	for _, tt := range []struct {
		name    string
		started time.Duration // before the pick, the holder's 20,000-token prompt was dispatched
		want    int
		reason  string
	}{
		// 20,000 + 1,000 tokens at 100 µs: 2.1 s less the hit's 0.3 s credited twice times
		// the weight of 3/2 (0.9 s), against 0.4 s idle.
		{name: "just dispatched: counted in full, the idle engine", started: 0, want: 0, reason: ReasonCacheMissFallback},
		// 1.8 s into it, 2,000 tokens are left: 0.3 s less the credit.
		{name: "nine tenths prefilled: the holder", started: 1800 * time.Millisecond, want: 1, reason: ReasonCacheCandidate},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ws := sortedWorkers(t, 2)
			tr := load.NewTracker()
			for _, w := range ws {
				w.Counters = tr.Counters(w.ID)
				for x := 1000.0; x <= 20000; x += 1000 {
					w.Counters.Rates().Prefill.Observe(x, 100e-6*x)
				}
			}
			g := tr.AcquirePrefill(ws[1].Counters, t0.Add(-tt.started), 20000)
			defer g.Release()
			p := NewCacheAware(nil, nil, nil, testCacheSettings(), testRNG(), nil)
			got, err := p.Pick(ws, cacheReq(4000, &fakePrefix{matched: map[string]int64{ws[1].ID: 3000}}))
			if err != nil || got.Worker != ws[tt.want] || got.Reason != tt.reason {
				t.Fatalf("got %v (%s), err %v; want %v (%s)", got.Worker, got.Reason, err, ws[tt.want], tt.reason)
			}
		})
	}
}
