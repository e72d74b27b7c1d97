package engine

import (
	"errors"
	"math/rand/v2"
	"testing"

	"switchyard/load"
)

// rngPicking returns a random source whose first IntN(n) is i and whose second IntN(n-1) is
// j, so a test decides which pair power-of-two samples (first sample c[i], second c[j'] with
// j' = j or j+1 when j >= i). It searches PCG seeds deterministically.
func rngPicking(t *testing.T, n, i, j int) *rand.Rand {
	t.Helper()
	for seed := uint64(1); seed < 100000; seed++ {
		r := rand.New(rand.NewPCG(seed, seed))
		if r.IntN(n) == i && r.IntN(n-1) == j {
			return rand.New(rand.NewPCG(seed, seed))
		}
	}
	t.Fatalf("no seed samples (%d, %d) of %d", i, j, n)
	return nil
}

func TestPowerOfTwoSamplesTwoDistinct(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 2)
	// Equal load: the first sample wins the tie; over many picks both must be chosen, and never
	// the same engine twice in one sample (with two candidates the pair is always {w0, w1}).
	p := NewPowerOfTwo(nil, nil, rand.New(rand.NewPCG(7, 7)))
	seen := map[*Worker]int{}
	for range 400 {
		got, err := p.Pick(ws, pickReq(StagePlain))
		if err != nil {
			t.Fatal(err)
		}
		seen[got.Worker]++
	}
	if seen[ws[0]] < 120 || seen[ws[1]] < 120 {
		t.Fatalf("first-sample tie-breaking should be uniform over the pair: %v", seen)
	}
}

func TestPowerOfTwoComparison(t *testing.T) {
	missing := load.RankReport{}
	tests := []struct {
		name       string
		stage      Stage
		a, b       load.RankReport // reports of the first and second sample; zero = no report
		inA, inB   int             // router-local in-flight
		wantFirst  bool
		wantReason string
	}{
		{"prefill: fewer uncached tokens wins", StagePrefill, native(9, 9, 100, 0), native(0, 0, 200, 0), 0, 0, true, ReasonPressure},
		{"prefill: equal work, the lower decode load wins", StagePrefill, native(5, 2, 100, 0), native(4, 2, 100, 0), 0, 0, false, ReasonPressure},
		{"prefill: work within 10% ties, decode load decides", StagePrefill, native(0, 0, 1000, 0), native(3, 0, 1050, 0), 0, 0, true, ReasonPressure},
		{"prefill: work beyond 10% decides first", StagePrefill, native(9, 0, 1000, 0), native(0, 0, 1200, 0), 0, 0, true, ReasonPressure},
		{"plain uses prefill order", StagePlain, native(0, 0, 300, 0), native(9, 9, 10, 0), 0, 0, false, ReasonPressure},
		{"decode: waiting first", StageDecode, native(9, 1, 0, 9000), native(0, 2, 0, 0), 0, 0, true, ReasonPressure},
		{"decode: then running", StageDecode, native(3, 1, 0, 0), native(2, 1, 0, 9000), 0, 0, false, ReasonPressure},
		{"decode: then kv usage", StageDecode, native(2, 1, 0, 500), native(2, 1, 0, 400), 0, 0, false, ReasonPressure},
		{"pressure tie falls to in-flight", StagePrefill, native(5, 1, 1, 1), native(5, 1, 1, 1), 2, 1, false, ReasonInFlight},
		{"in-flight beyond running is decode load", StagePrefill, native(1, 1, 1, 1), native(1, 1, 1, 1), 4, 1, false, ReasonPressure},
		{"prefill complete tie keeps the first sample", StagePrefill, native(1, 1, 1, 1), native(1, 1, 1, 1), 1, 1, true, ReasonTie},
		{"complete tie keeps the first sample", StageDecode, native(1, 1, 1, 1), native(1, 1, 1, 1), 1, 1, true, ReasonTie},
		{"missing report: in-flight decides", StagePrefill, missing, native(0, 0, 0, 0), 1, 3, true, ReasonInFlight},
		{"basic report is not native: in-flight decides", StageDecode, basic(0, 0, 0), basic(9, 9, 9), 3, 1, false, ReasonInFlight},
		{"in-flight tie keeps first", StagePlain, missing, missing, 2, 2, true, ReasonInFlight},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := testWorkers(t, "llama", tt.stage, "w", 3)
			a, b := ws[2], ws[0] // sample order differs from ID order on purpose
			reports := map[*Worker]load.RankReport{}
			if tt.a.Fields != 0 {
				reports[a] = tt.a
			}
			if tt.b.Fields != 0 {
				reports[b] = tt.b
			}
			// In-flight requests were dispatched before the reports were captured: they are
			// in the reports, not pending dispatches.
			tr := load.NewTracker()
			inflight(t, tr, a, tt.inA)
			inflight(t, tr, b, tt.inB)
			tab := loadTable(t, reports)
			p := NewPowerOfTwo(nil, tab, rngPicking(t, 3, 2, 0))
			got, err := p.Pick(ws, pickReq(tt.stage))
			if err != nil {
				t.Fatal(err)
			}
			want := b
			if tt.wantFirst {
				want = a
			}
			if got.Worker != want || got.Reason != tt.wantReason {
				t.Fatalf("got %v (%s), want %v (%s)", got.Worker, got.Reason, want, tt.wantReason)
			}
		})
	}
}

func TestPowerOfTwoStaleReportIsUnknown(t *testing.T) {
	ws := testWorkers(t, "llama", StagePrefill, "w", 2)
	// w1 looks idle by its report but the report is stale at pick time: in-flight decides.
	tab := loadTable(t, map[*Worker]load.RankReport{ws[0]: native(50, 50, 5000, 0), ws[1]: native(0, 0, 0, 0)})
	tr := load.NewTracker()
	inflight(t, tr, ws[1], 5)
	req := pickReq(StagePrefill)
	req.Now = t0.Add(6 * 1e9)
	got, err := NewPowerOfTwo(nil, tab, rngPicking(t, 2, 0, 0)).Pick(ws, req)
	if err != nil {
		t.Fatal(err)
	}
	if got.Worker != ws[0] || got.Reason != ReasonInFlight {
		t.Fatalf("got %v (%s), want w0 by in-flight", got.Worker, got.Reason)
	}
}

func TestPowerOfTwoRejectionDoesNotResample(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 3)
	tab := loadTable(t, map[*Worker]load.RankReport{ws[0]: native(0, 0, 0, 0), ws[1]: native(0, 9, 0, 0), ws[2]: native(0, 0, 0, 0)})
	// Samples w0 then w1; w0 has less pressure, is chosen, and is rejected.
	adm := &countingAdmission{reject: map[string]bool{ws[0].ID: true}}
	_, err := NewPowerOfTwo(adm, tab, rngPicking(t, 3, 0, 0)).Pick(ws, pickReq(StagePlain))
	var pe *PickError
	if !errors.As(err, &pe) || pe.Outcome != OutcomeAdmissionRejected || adm.calls != 1 || pe.Rejections[0].WorkerID != ws[0].ID {
		t.Fatalf("err = %v, admission calls = %d", err, adm.calls)
	}
}

func TestPowerOfTwoSingleCandidateStillAdmits(t *testing.T) {
	ws := testWorkers(t, "llama", StageDecode, "w", 1)
	tab := loadTable(t, map[*Worker]load.RankReport{ws[0]: native(64, 0, 0, 0)})
	p := NewPowerOfTwo(AdmissionLimits{MaxRunning: 64}, tab, testRNG())
	_, err := p.Pick(ws, pickReq(StageDecode))
	if !errors.Is(err, ErrAdmissionRejected) {
		t.Fatalf("single candidate over its running cap: err = %v", err)
	}
	p = NewPowerOfTwo(AdmissionLimits{MaxRunning: 65}, tab, testRNG())
	got, err := p.Pick(ws, pickReq(StageDecode))
	if err != nil || got.Worker != ws[0] || got.Reason != ReasonSingle {
		t.Fatalf("got %v %v", got, err)
	}
}

func TestPowerOfTwoAdmissionUsesSelectionObservation(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 2)
	tab := loadTable(t, map[*Worker]load.RankReport{ws[0]: native(3, 0, 0, 0), ws[1]: native(7, 0, 0, 0)})
	// w0 wins on running (3 < 7) and is checked against its own observation: cap 4 admits.
	got, err := NewPowerOfTwo(AdmissionLimits{MaxRunning: 4}, tab, rngPicking(t, 2, 1, 0)).Pick(ws, pickReq(StagePlain))
	if err != nil || got.Worker != ws[0] {
		t.Fatalf("got %v err %v", got.Worker, err)
	}
	// Cap 3 rejects w0 (3 >= 3), and the other sample is not tried.
	_, err = NewPowerOfTwo(AdmissionLimits{MaxRunning: 3}, tab, rngPicking(t, 2, 1, 0)).Pick(ws, pickReq(StagePlain))
	if !errors.Is(err, ErrAdmissionRejected) {
		t.Fatalf("err = %v", err)
	}
}

func TestPowerOfTwoCorrectsForDispatchesSinceReport(t *testing.T) {
	tests := []struct {
		name      string
		stage     Stage
		input     int64           // the request's input tokens
		idle      load.RankReport // first sample: looked idle when captured
		since     int             // dispatches to it since its report
		busy      load.RankReport // second sample: slightly busier, no dispatch since
		wantFirst bool
	}{
		{"plain: stale idle report with a burst since loses", StagePlain, 500, native(0, 0, 0, 0), 8, native(4, 1, 200, 0), false},
		{"prefill: stale idle report with a burst since loses", StagePrefill, 500, native(0, 0, 0, 0), 8, native(4, 1, 200, 0), false},
		{"decode: stale idle report with a burst since loses", StageDecode, 500, native(0, 0, 0, 0), 8, native(4, 1, 200, 0), false},
		{"decode, no token estimate: waiting requests decide", StageDecode, 0, native(0, 0, 0, 0), 8, native(4, 1, 200, 0), false},
		{"one dispatch since does not outweigh a long queue", StagePrefill, 500, native(0, 0, 0, 0), 1, native(4, 6, 5000, 0), true},
		{"no dispatch since: reported pressure as is", StagePlain, 500, native(0, 0, 0, 0), 0, native(4, 1, 200, 0), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := testWorkers(t, "llama", tt.stage, "w", 2)
			tr := load.NewTracker()
			a, b := ws[0], ws[1]
			tab := loadTable(t, map[*Worker]load.RankReport{a: tt.idle, b: tt.busy})
			// Dispatches since the reports, still waiting for their first token: the
			// router's own pending prefill on plain and prefill, waiting requests on decode.
			for range tt.since {
				if tt.stage == StageDecode {
					tr.Acquire(a.Counters, t0)
				} else {
					tr.AcquirePrefill(a.Counters, t0, tt.input)
				}
			}
			req := pickReq(tt.stage)
			req.InputTokens = tt.input
			got, err := NewPowerOfTwo(nil, tab, rngPicking(t, 2, 0, 0)).Pick(ws, req)
			if err != nil {
				t.Fatal(err)
			}
			want := b
			if tt.wantFirst {
				want = a
			}
			if got.Worker != want || got.Reason != ReasonPressure {
				t.Fatalf("got %v (%s), want %v (%s)", got.Worker, got.Reason, want, ReasonPressure)
			}
		})
	}
}
