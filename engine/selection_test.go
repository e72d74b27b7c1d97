package engine

import (
	"errors"
	"slices"
	"switchyard/load"
	"testing"
)

// rejectAll is an admission that rejects every engine with the given limit.
type rejectAll string

func (r rejectAll) Check(*Worker, load.Observation) string { return string(r) }

// rejectIDs rejects the listed worker IDs with max_inflight_requests.
type rejectIDs map[string]bool

func (r rejectIDs) Check(w *Worker, _ load.Observation) string {
	if r[w.ID] {
		return LimitInFlight
	}
	return ""
}

type pdFixture struct {
	set                          *WorkerSet
	shortP, shortD, longP, longD []*Worker
	short, long                  *Bucket
	resolver                     *BucketResolver
}

func newPDFixture(t *testing.T, shortDecodeAdm EngineAdmission) *pdFixture {
	t.Helper()
	f := &pdFixture{
		shortP: testWorkers(t, "llama", StagePrefill, "sp", 2),
		shortD: testWorkers(t, "llama", StageDecode, "sd", 2),
		longP:  testWorkers(t, "llama", StagePrefill, "lp", 2),
		longD:  testWorkers(t, "llama", StageDecode, "ld", 2),
	}
	f.set = mustSet(t, f.shortP, f.shortD, f.longP, f.longD)
	idsOf := func(ws []*Worker) []string {
		var out []string
		for _, w := range ws {
			out = append(out, w.ID)
		}
		return out
	}
	f.short = bucket("short-context", 10, 0, 4096, 8192)
	f.short.Prefill = NewEngineGroup("llama", StagePrefill, idsOf(f.shortP), NewRoundRobin(nil, nil))
	f.short.Decode = NewEngineGroup("llama", StageDecode, idsOf(f.shortD), NewRoundRobin(shortDecodeAdm, nil))
	f.long = bucket("long-context", 20, 0, 131072, 131072)
	f.long.Prefill = NewEngineGroup("llama", StagePrefill, idsOf(f.longP), NewRoundRobin(nil, nil))
	f.long.Decode = NewEngineGroup("llama", StageDecode, idsOf(f.longD), NewRoundRobin(nil, nil))
	f.resolver = NewBucketResolver("llama", []*Bucket{f.long, f.short})
	return f
}

func (f *pdFixture) selectFor(t *testing.T, input, peak int64) (BucketPick, []string, error) {
	t.Helper()
	bs, err := f.resolver.Resolve(nil, input, peak)
	if err != nil {
		return BucketPick{}, nil, err
	}
	var tried []string
	req := breq("llama", input, peak)
	p, err := selectEngines(bs, req, func(b *Bucket) (BucketPick, error) {
		tried = append(tried, b.ID)
		return pickEngines(b, f.set.Load(), req)
	})
	return p, tried, err
}

func in(w *Worker, ws []*Worker) bool { return slices.Contains(ws, w) }

func TestPDSelectionSection7(t *testing.T) {
	f := newPDFixture(t, nil)
	p, tried, err := f.selectFor(t, 4096, 16384)
	if err != nil {
		t.Fatal(err)
	}
	if p.BucketID != "long-context" || !in(p.Prefill.Worker, f.longP) || !in(p.Decode.Worker, f.longD) {
		t.Fatalf("4k/16k: got bucket %s P=%v D=%v (tried %v)", p.BucketID, p.Prefill.Worker, p.Decode.Worker, tried)
	}
	p, _, err = f.selectFor(t, 4096, 8192)
	if err != nil {
		t.Fatal(err)
	}
	if p.BucketID != "short-context" || !in(p.Prefill.Worker, f.shortP) || !in(p.Decode.Worker, f.shortD) {
		t.Fatalf("4k/8k: got bucket %s P=%v D=%v", p.BucketID, p.Prefill.Worker, p.Decode.Worker)
	}
	if !p.IsPD() {
		t.Fatal("IsPD = false for a PD pick")
	}
}

func TestPDDecodeRejectionMovesBothPicksToNextBucket(t *testing.T) {
	f := newPDFixture(t, rejectAll(LimitRunning))
	p, tried, err := f.selectFor(t, 100, 200)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tried, []string{"short-context", "long-context"}) {
		t.Fatalf("tried %v", tried)
	}
	// Same-bucket rule: the short bucket's tentative prefill pick is discarded.
	if p.BucketID != "long-context" || !in(p.Prefill.Worker, f.longP) || !in(p.Decode.Worker, f.longD) {
		t.Fatalf("got %s P=%v D=%v", p.BucketID, p.Prefill.Worker, p.Decode.Worker)
	}
}

func TestPDDecodeEmptyKeepsStage(t *testing.T) {
	f := newPDFixture(t, nil)
	for _, w := range f.shortD {
		f.set.SetHealthy(w.ID, false)
	}
	_, err := pickEngines(f.short, f.set.Load(), breq("llama", 1, -1))
	var pe *PickError
	if !errors.As(err, &pe) || pe.Outcome != OutcomeNoCandidates || pe.Stage != StageDecode || pe.BucketID != "short-context" {
		t.Fatalf("err = %v", err)
	}
}

func TestBucketLoop(t *testing.T) {
	b1, b2, b3 := bucket("b1", 0, 0, 10, 10), bucket("b2", 0, 0, 100, 100), bucket("b3", 0, 0, 1000, 1000)
	all := []*Bucket{b1, b2, b3}
	rej := func(b, w, limit string) *PickError {
		return &PickError{Outcome: OutcomeAdmissionRejected, BucketID: b, Stage: StagePlain,
			Rejections: []Rejection{{BucketID: b, Stage: StagePlain, WorkerID: w, Limit: limit}}}
	}
	none := func(b string, s Stage) *PickError {
		return &PickError{Outcome: OutcomeNoCandidates, BucketID: b, Stage: s}
	}
	tests := []struct {
		name        string
		buckets     []*Bucket
		results     map[string]error
		wantTried   []string
		wantBucket  string
		wantOutcome Outcome
		wantStage   Stage
		wantRejects int
	}{
		{"empty list", nil, nil, nil, "", OutcomeNoMatchingBucket, 0, 0},
		{"first wins", all, map[string]error{}, []string{"b1"}, "b1", 0, 0, 0},
		{"no candidates advances", all, map[string]error{"b1": none("b1", StagePlain)}, []string{"b1", "b2"}, "b2", 0, 0, 0},
		{"rejection advances", all, map[string]error{"b1": rej("b1", "w", LimitRunning)}, []string{"b1", "b2"}, "b2", 0, 0, 0},
		{"invalid signal stops", all, map[string]error{"b1": &PickError{Outcome: OutcomeInvalidSignal}}, []string{"b1"}, "", OutcomeInvalidSignal, 0, 0},
		{"invalid configuration stops", all, map[string]error{"b1": none("b1", 0), "b2": &PickError{Outcome: OutcomeInvalidConfiguration}}, []string{"b1", "b2"}, "", OutcomeInvalidConfiguration, 0, 0},
		{"outside candidates stops", all, map[string]error{"b1": &PickError{Outcome: OutcomeOutsideCandidates}}, []string{"b1"}, "", OutcomeOutsideCandidates, 0, 0},
		{"overloaded stops", all, map[string]error{"b1": &PickError{Outcome: OutcomeOverloaded}}, []string{"b1"}, "", OutcomeOverloaded, 0, 0},
		{"plain error is internal", all, map[string]error{"b1": errors.New("boom")}, []string{"b1"}, "", OutcomeInternal, 0, 0},
		{
			"exhaustion accumulates admission reasons", all,
			map[string]error{"b1": rej("b1", "w1", LimitRunning), "b2": none("b2", StageDecode), "b3": rej("b3", "w3", LimitKVTokens)},
			[]string{"b1", "b2", "b3"}, "", OutcomeNoAdmissibleEngine, StagePlain, 2,
		},
		{
			"exhaustion without rejections returns the last stage", all,
			map[string]error{"b1": none("b1", StagePrefill), "b2": none("b2", StagePrefill), "b3": none("b3", StageDecode)},
			[]string{"b1", "b2", "b3"}, "", OutcomeNoCandidates, StageDecode, 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tried []string
			p, err := selectEngines(tt.buckets, nil, func(b *Bucket) (BucketPick, error) {
				tried = append(tried, b.ID)
				if e := tt.results[b.ID]; e != nil {
					return BucketPick{}, e
				}
				return BucketPick{BucketID: b.ID}, nil
			})
			if !slices.Equal(tried, tt.wantTried) {
				t.Fatalf("tried %v, want %v", tried, tt.wantTried)
			}
			if tt.wantOutcome == 0 {
				if err != nil || p.BucketID != tt.wantBucket {
					t.Fatalf("pick %v err %v, want bucket %s", p.BucketID, err, tt.wantBucket)
				}
				return
			}
			var pe *PickError
			if !errors.As(err, &pe) || pe.Outcome != tt.wantOutcome {
				t.Fatalf("err = %v, want %v", err, tt.wantOutcome)
			}
			if pe.Stage != tt.wantStage || len(pe.Rejections) != tt.wantRejects {
				t.Fatalf("stage %v rejections %v", pe.Stage, pe.Rejections)
			}
		})
	}
}

// attemptLog records the bucket attempts a selection reports (AttemptObserver).
type attemptLog []string

func (l *attemptLog) BucketAttempted(b *Bucket, pick BucketPick, err error) {
	if err != nil {
		*l = append(*l, b.ID+":"+OutcomeOf(err).String())
		return
	}
	*l = append(*l, b.ID+":selected:"+pick.BucketID)
}

// TestBucketLoopObserved: a request's observer is told of every bucket attempt, in
// order, with its selection or its failure, the one that ends the loop included.
func TestBucketLoopObserved(t *testing.T) {
	b1, b2, b3 := bucket("b1", 0, 0, 10, 10), bucket("b2", 0, 0, 100, 100), bucket("b3", 0, 0, 1000, 1000)
	results := map[string]error{
		"b1": &PickError{Outcome: OutcomeNoCandidates, BucketID: "b1"},
		"b2": &PickError{Outcome: OutcomeAdmissionRejected, BucketID: "b2",
			Rejections: []Rejection{{BucketID: "b2", WorkerID: "w", Limit: LimitRunning}}},
	}
	attempt := func(b *Bucket) (BucketPick, error) {
		if e := results[b.ID]; e != nil {
			return BucketPick{}, e
		}
		return BucketPick{BucketID: b.ID}, nil
	}
	var log attemptLog
	if _, err := selectEngines([]*Bucket{b1, b2, b3}, &BucketRequest{Observer: &log}, attempt); err != nil {
		t.Fatal(err)
	}
	if want := []string{"b1:no_candidates", "b2:admission_rejected", "b3:selected:b3"}; !slices.Equal(log, want) {
		t.Errorf("observed %v, want %v", log, want)
	}
	log = nil
	results["b1"] = &PickError{Outcome: OutcomeInvalidSignal}
	if _, err := selectEngines([]*Bucket{b1, b2, b3}, &BucketRequest{Observer: &log}, attempt); err == nil {
		t.Fatal("an invalid signal selected")
	}
	if want := []string{"b1:invalid_signal"}; !slices.Equal(log, want) {
		t.Errorf("observed %v, want %v", log, want)
	}
}

// TestBucketLoopAdapterSlotsInUse: when some bucket failed because every adapter slot was in
// use, the loop's error after every bucket failed unwraps to ErrAdapterSlotsInUse, whatever
// the last bucket's failure; otherwise it does not.
func TestBucketLoopAdapterSlotsInUse(t *testing.T) {
	b1, b2 := bucket("b1", 0, 0, 10, 10), bucket("b2", 0, 0, 100, 100)
	inUse := func(b string) *PickError {
		return &PickError{Outcome: OutcomeNoCandidates, BucketID: b, Stage: StagePlain, Err: ErrAdapterSlotsInUse}
	}
	none := func(b string) *PickError {
		return &PickError{Outcome: OutcomeNoCandidates, BucketID: b, Stage: StagePlain}
	}
	rej := &PickError{Outcome: OutcomeAdmissionRejected, BucketID: "b2", Stage: StagePlain,
		Rejections: []Rejection{{BucketID: "b2", Stage: StagePlain, WorkerID: "w", Limit: LimitRunning}}}
	tests := []struct {
		name        string
		results     map[string]error
		wantOutcome Outcome
		want        bool
	}{
		{"the last bucket's slots", map[string]error{"b1": none("b1"), "b2": inUse("b2")}, OutcomeNoCandidates, true},
		{"an earlier bucket's slots", map[string]error{"b1": inUse("b1"), "b2": none("b2")}, OutcomeNoCandidates, true},
		{"then a rejection", map[string]error{"b1": inUse("b1"), "b2": rej}, OutcomeNoAdmissibleEngine, true},
		{"no slots in use", map[string]error{"b1": none("b1"), "b2": rej}, OutcomeNoAdmissibleEngine, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := selectEngines([]*Bucket{b1, b2}, nil, func(b *Bucket) (BucketPick, error) {
				return BucketPick{}, tt.results[b.ID]
			})
			if OutcomeOf(err) != tt.wantOutcome || errors.Is(err, ErrAdapterSlotsInUse) != tt.want {
				t.Fatalf("err = %v: outcome %v, want %v; slots in use %v, want %v", err, OutcomeOf(err), tt.wantOutcome,
					errors.Is(err, ErrAdapterSlotsInUse), tt.want)
			}
		})
	}
	// The last bucket's own error is not changed.
	last := none("b2")
	if _, err := selectEngines([]*Bucket{b1, b2}, nil, func(b *Bucket) (BucketPick, error) {
		if b == b1 {
			return BucketPick{}, inUse("b1")
		}
		return BucketPick{}, last
	}); err == last || last.Err != nil {
		t.Fatalf("the loop changed the last bucket's error: %v, %v", err, last.Err)
	}
}
