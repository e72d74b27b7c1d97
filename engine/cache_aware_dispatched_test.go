package engine

import (
	"testing"
	"time"

	"switchyard/kv"
	"switchyard/load"
)

// prompt returns n tokens whose first shared tokens are common to every prompt of the test
// and the rest unique to seed.
func prompt(n, shared int, seed uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		if i < shared {
			out[i] = uint32(i) + 7
		} else {
			out[i] = seed<<20 | uint32(i)
		}
	}
	return out
}

// memoReq is a pick request whose prefix lookup is an unresolved PrefixMemo of tokens (the
// index knows no holder: the engines have published nothing yet) at now.
func memoReq(model string, tokens []uint32, now time.Time) *PickRequest {
	req := cacheReq(int64(len(tokens)), kv.NewPrefixMemo(model, tokens))
	req.Model, req.Now = model, now
	return req
}

// TestCacheAwareDispatchedMemory: a prompt the latency decision dispatched counts as held by
// its engine before any KV event shows it, within dispatch_window, for its model, to whole
// 1,024-token steps; a request sharing its prefix joins it there instead of computing the
// prefix again elsewhere.
func TestCacheAwareDispatchedMemory(t *testing.T) {
	const shared = 9 * 1024
	first := prompt(shared+500, shared, 1)
	follow := prompt(shared+2000, shared, 2) // shares 9 whole steps with first
	tests := []struct {
		name    string
		window  time.Duration
		model   string
		after   time.Duration
		filler  int // other prompts dispatched in between
		joins   bool
		matched int64
	}{
		{name: "a request sharing a queued prompt's prefix joins it", window: 10 * time.Second, model: "llama", after: time.Second, joins: true, matched: shared},
		{name: "off with a zero window", window: 0, model: "llama", after: time.Second},
		{name: "forgotten after the window", window: 10 * time.Second, model: "llama", after: 11 * time.Second},
		{name: "another model's prompt is not a holder", window: 10 * time.Second, model: "other", after: time.Second},
		{name: "the last 128 dispatches only", window: 10 * time.Second, model: "llama", after: time.Second, filler: 128},
		{name: "within the last 128 dispatches", window: 10 * time.Second, model: "llama", after: time.Second, filler: 127, joins: true, matched: shared},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := sortedWorkers(t, 3)
			tr := load.NewTracker()
			for _, w := range ws {
				w.Counters = tr.Counters(w.ID)
			}
			s := testCacheSettings()
			s.DispatchWindow = tt.window
			p := NewCacheAware(nil, nil, nil, s, testRNG(), nil)
			got, err := p.Pick(ws, memoReq("llama", first, t0))
			if err != nil || got.Reason != ReasonCacheMissFallback {
				t.Fatalf("first: %v (%s), %v", got.Worker, got.Reason, err)
			}
			holder := got.Worker
			// The engine now prefills it, as the group's dispatch records.
			tr.AcquirePrefill(holder.Counters, t0, int64(len(first)))
			for i := range tt.filler {
				// Short unrelated prompts on the least loaded engines.
				if _, err := p.Pick(ws, memoReq("llama", prompt(1100, 0, uint32(10+i)), t0)); err != nil {
					t.Fatal(err)
				}
			}
			got, err = p.Pick(ws, memoReq(tt.model, follow, t0.Add(tt.after)))
			if err != nil {
				t.Fatal(err)
			}
			if joined := got.Worker == holder; joined != tt.joins {
				t.Fatalf("follow-up on %v (%s), holder %v: joined %v, want %v", got.Worker, got.Reason, holder, joined, tt.joins)
			}
			// The holder's credit is twice its matched tokens, weighted by the busy engines
			// (itself).
			want := hitCredits * float64(tt.matched) * float64(len(ws)+1) / float64(len(ws))
			if tt.joins && (got.Reason != ReasonCacheCandidate || p.latency[slicesIndex(ws, holder)].credit != want) {
				t.Errorf("reason %s, credit %v, want %s and %v", got.Reason, p.latency[slicesIndex(ws, holder)].credit, ReasonCacheCandidate, want)
			}
		})
	}
}

func slicesIndex(ws []*Worker, w *Worker) int {
	for i := range ws {
		if ws[i] == w {
			return i
		}
	}
	return -1
}

// TestDispatchedMemoryMatch: a match is the whole steps shared with a prompt dispatched to
// that engine since notBefore.
func TestDispatchedMemoryMatch(t *testing.T) {
	var d dispatchedMemory
	ws := sortedWorkers(t, 2)
	if !d.fingerprint("m", prompt(3*1024+5, 3*1024, 1)) {
		t.Fatal("no fingerprint for a prompt of three steps")
	}
	d.remember(ws[0], t0)
	if d.fingerprint("m", prompt(1000, 1000, 1)) {
		t.Fatal("a prompt shorter than a step has a fingerprint")
	}
	if !d.fingerprint("m", prompt(5*1024, 2*1024+10, 2)) {
		t.Fatal("no fingerprint")
	}
	if got := d.matched(ws[0], t0); got != 2*1024 {
		t.Errorf("matched %d, want 2048 (two whole shared steps)", got)
	}
	if got := d.matched(ws[1], t0); got != 0 {
		t.Errorf("another engine matched %d", got)
	}
	if got := d.matched(ws[0], t0.Add(time.Nanosecond)); got != 0 {
		t.Errorf("a dispatch before notBefore matched %d", got)
	}
}
