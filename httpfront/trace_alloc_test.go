//go:build !race

package httpfront

import (
	"testing"

	"github.com/valyala/fasthttp"

	"switchyard/engine"
	"switchyard/load"
)

// TestTracingOffAllocations locks in tracing's cost when it is off: every hook on the
// request path, called as a request calls them with an untraced (zero) reqTrace, allocates
// nothing. (The selection's hook, engine.BucketRequest.Observer, is nil then; the actors'
// TestSelectorAllocations pins Select at zero.)
func TestTracingOffAllocations(t *testing.T) {
	w := &engine.Worker{ID: "A", URL: "http://127.0.0.1:1", Counters: load.NewTracker().Counters("A")}
	pick := engine.BucketPick{BucketID: "b", Plain: engine.Pick{Worker: w, Reason: engine.ReasonRoundRobin}}
	breq := engine.BucketRequest{Model: "llama", InputTokens: 10, ExpectedPeak: 20}
	failed := &failedAnswer{status: 503, pick: pick}
	var ex exchange
	run := func() {
		tr := &ex.tr
		endAdmission(tr.startAdmission(), nil)
		tr.startPrepare("llama", true)
		sp := tr.startPrefixLookup()
		endPrefixLookup(sp, nil)
		if tr.on() {
			tr.endPrepare(&breq, "estimate")
		}
		if tr.recording {
			breq.Observer = tr
		}
		tr.startSelect(1)
		tr.endSelect(&pick, nil)
		tr.refused(w)
		d := dispatch{pick: pick}
		if tr.on() {
			tr.startDispatch(&d, 1, "", 0)
		}
		tr.prefillDone(200, nil)
		tr.endDispatch(503, failed)
		var r relay
		r.trace(tr)
		firstToken(r.span, 12.5)
		abandonStream(r.span, nil)
		r.tr.endStream(r.span, endEOF, fasthttp.StatusOK, 5, 1)
		tr.endRequest(fasthttp.StatusOK)
		ex.tr.reset()
	}
	if n := testing.AllocsPerRun(1000, run); n != 0 {
		t.Fatalf("%v allocations per untraced request, want 0", n)
	}
	if breq.Observer != nil {
		t.Fatal("an untraced request got a selection observer")
	}
}
