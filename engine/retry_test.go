package engine

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestExclusions(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", MaxExcluded+1)
	var e Exclusions
	if e.Len() != 0 || e.Has(ws[0]) {
		t.Fatal("zero value is not empty")
	}
	if e.Add(nil) || e.Len() != 0 {
		t.Fatal("nil was excluded")
	}
	for i, w := range ws[:MaxExcluded] {
		if !e.Add(w) {
			t.Fatalf("Add #%d refused below capacity", i)
		}
	}
	if !e.Add(ws[3]) || e.Len() != MaxExcluded {
		t.Fatalf("adding an excluded engine again: len %d", e.Len())
	}
	if e.Add(ws[MaxExcluded]) || e.Has(ws[MaxExcluded]) {
		t.Fatal("a full set accepted another engine")
	}
	for _, w := range ws[:MaxExcluded] {
		if !e.Has(w) {
			t.Fatalf("%s not excluded", w.ID)
		}
	}
	// Identity, not ID: a worker re-added under the same ID is a new engine.
	again := NewWorker(ws[0].ID, ws[0].URL, "llama", StagePlain, nil)
	if e.Has(again) {
		t.Fatal("a new worker with an excluded worker's ID is excluded")
	}
}

func TestRetryAfter(t *testing.T) {
	plain := testWorkers(t, "llama", StagePlain, "w", 1)[0]
	p := testWorkers(t, "llama", StagePrefill, "p", 1)[0]
	d := testWorkers(t, "llama", StageDecode, "d", 1)[0]
	plainPick := BucketPick{BucketID: "b1", Plain: Pick{Worker: plain}}
	pdPick := BucketPick{BucketID: "b2", Prefill: Pick{Worker: p}, Decode: Pick{Worker: d}}
	tests := []struct {
		name     string
		pick     BucketPick
		stage    Stage
		excluded *Worker
		kept     *Worker
	}{
		{"plain pick excludes its engine whatever the stage", plainPick, StageDecode, plain, nil},
		{"PD prefill failure excludes the prefill engine", pdPick, StagePrefill, p, d},
		{"PD decode failure excludes the decode engine", pdPick, StageDecode, d, p},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := breq("llama", 10, -1)
			if !req.RetryAfter(&tt.pick, tt.stage) {
				t.Fatal("RetryAfter refused")
			}
			if req.Retry.Bucket != tt.pick.BucketID || !req.Retry.Excluded.Has(tt.excluded) || req.Retry.Excluded.Len() != 1 {
				t.Fatalf("retry = bucket %q, %d excluded", req.Retry.Bucket, req.Retry.Excluded.Len())
			}
			if tt.kept != nil && req.Retry.Excluded.Has(tt.kept) {
				t.Fatalf("%s excluded too", tt.kept.ID)
			}
		})
	}
	t.Run("a PD pick and the plain stage names no engine", func(t *testing.T) {
		req := breq("llama", 10, -1)
		if req.RetryAfter(&pdPick, StagePlain) || req.Retry.Bucket != "" {
			t.Fatal("RetryAfter accepted a failure it cannot exclude")
		}
	})
	t.Run("a full set refuses and keeps the previous bucket", func(t *testing.T) {
		req := breq("llama", 10, -1)
		ws := testWorkers(t, "llama", StagePlain, "x", MaxExcluded)
		for _, w := range ws {
			req.RetryAfter(&BucketPick{BucketID: "b1", Plain: Pick{Worker: w}}, StagePlain)
		}
		if req.RetryAfter(&plainPick, StagePlain) {
			t.Fatal("RetryAfter accepted a 17th engine")
		}
		if req.Retry.Bucket != "b1" {
			t.Fatalf("bucket = %q", req.Retry.Bucket)
		}
	})
}

func TestGroupLeavesOutExcludedEngines(t *testing.T) {
	ws := testWorkers(t, "llama", StagePlain, "w", 3)
	set := mustSet(t, ws)
	t.Run("the policy never sees an excluded engine", func(t *testing.T) {
		var seen []*Worker
		pol := &fixedPolicy{fn: func(c []*Worker, _ *PickRequest) (Pick, error) {
			seen = slices.Clone(c)
			return Pick{Worker: c[0], Reason: "fixed"}, nil
		}}
		g := NewEngineGroup("llama", StagePlain, nil, pol)
		req := breq("llama", 10, -1)
		req.Retry.Excluded.Add(ws[0])
		p, err := g.Pick(set.Load(), "b", req)
		if err != nil || p.Worker != ws[1] {
			t.Fatalf("pick %v err %v", p.Worker, err)
		}
		if len(seen) != 2 || seen[0] != ws[1] || seen[1] != ws[2] {
			t.Fatalf("candidates %v, want [w1 w2] in ID order", seen)
		}
		// The next request of the group is a first attempt again: every candidate.
		if _, err := g.Pick(set.Load(), "b", breq("llama", 10, -1)); err != nil || len(seen) != 3 {
			t.Fatalf("first attempt saw %v, err %v", seen, err)
		}
	})
	t.Run("every candidate excluded is NoCandidates without calling the policy", func(t *testing.T) {
		pol := &fixedPolicy{fn: func(c []*Worker, _ *PickRequest) (Pick, error) { return Pick{Worker: c[0]}, nil }}
		g := NewEngineGroup("llama", StagePlain, nil, pol)
		req := breq("llama", 10, -1)
		for _, w := range ws {
			req.Retry.Excluded.Add(w)
		}
		_, err := g.Pick(set.Load(), "b", req)
		var pe *PickError
		if !errors.As(err, &pe) || pe.Outcome != OutcomeNoCandidates || !pe.Advances() || pol.calls != 0 {
			t.Fatalf("err %v, policy calls %d", err, pol.calls)
		}
	})
	t.Run("a policy returning an excluded engine is OutsideCandidates", func(t *testing.T) {
		pol := &fixedPolicy{fn: func([]*Worker, *PickRequest) (Pick, error) { return Pick{Worker: ws[0], Reason: "bad"}, nil }}
		g := NewEngineGroup("llama", StagePlain, nil, pol)
		req := breq("llama", 10, -1)
		req.Retry.Excluded.Add(ws[0])
		if _, err := g.Pick(set.Load(), "b", req); !errors.Is(err, ErrOutsideCandidates) {
			t.Fatalf("err = %v, want OutsideCandidates", err)
		}
	})
}

// TestPolicyContractExclusions extends the contract suite to retried requests: through its
// group, no policy ever returns an engine that failed for the request, in any stage.
func TestPolicyContractExclusions(t *testing.T) {
	for name, mk := range policyFactories() {
		t.Run(name, func(t *testing.T) {
			for _, stage := range []Stage{StagePlain, StagePrefill, StageDecode} {
				if stage == StageDecode && strings.HasPrefix(name, PolicyCacheAware) {
					continue
				}
				t.Run(stage.String(), func(t *testing.T) {
					ws := testWorkers(t, "llama", stage, "w", 8)
					set := mustSet(t, ws)
					g := NewEngineGroup("llama", stage, nil, mk(nil, nil))
					rng := rand.New(rand.NewPCG(3, 4))
					for i := range 300 {
						req := breq("llama", 10, -1)
						req.Now = t0
						for _, w := range ws {
							if rng.IntN(3) == 0 {
								req.Retry.Excluded.Add(w)
							}
						}
						p, err := g.Pick(set.Load(), "b", req)
						if req.Retry.Excluded.Len() == len(ws) {
							if !errors.Is(err, ErrNoCandidates) {
								t.Fatalf("pick %d with every engine excluded: err %v", i, err)
							}
							continue
						}
						if err != nil {
							t.Fatalf("pick %d: %v", i, err)
						}
						if req.Retry.Excluded.Has(p.Worker) {
							t.Fatalf("pick %d returned %s, which failed for the request", i, p.Worker.ID)
						}
					}
				})
			}
		})
	}
}

// TestAffinityRebindsAwayFromFailedEngine: a session or routing key bound to the engine that
// failed for this request is rebound by the policy's own rule for an engine that is not a
// candidate (session_rebound, remap), and the next request of the key follows the new binding.
func TestAffinityRebindsAwayFromFailedEngine(t *testing.T) {
	for _, kind := range affinityKinds() {
		t.Run(kind.name, func(t *testing.T) {
			ws := testWorkers(t, "llama", StagePlain, "w", 3)
			set := mustSet(t, ws)
			store := newMemAffinity()
			g := NewEngineGroup("llama", StagePlain, nil, kind.mk(nil, nil, store))
			scope := AffinityScope{Model: "llama", BucketID: "b", Stage: StagePlain}
			store.set(scope, "k", ws[1].ID)

			req := breq("llama", 10, -1)
			req.Now = t0
			kind.withKey(req, "k")
			first, err := g.Pick(set.Load(), "b", req)
			if err != nil || first.Worker != ws[1] || first.Reason != kind.reuse {
				t.Fatalf("first attempt %v/%s err %v, want the bound engine", first.Worker, first.Reason, err)
			}
			if !req.RetryAfter(&BucketPick{BucketID: "b", Plain: first}, StagePlain) {
				t.Fatal("RetryAfter refused")
			}
			retry, err := g.Pick(set.Load(), "b", req)
			if err != nil || retry.Worker == ws[1] || retry.Reason != kind.rebound {
				t.Fatalf("retry %v/%s err %v, want a rebinding (%s) away from %s", retry.Worker, retry.Reason, err, kind.rebound, ws[1].ID)
			}
			if got := store.bound(scope, "k"); got != retry.Worker.ID {
				t.Fatalf("binding %q, want %q", got, retry.Worker.ID)
			}
			next := breq("llama", 10, -1)
			next.Now = t0
			kind.withKey(next, "k")
			if p, err := g.Pick(set.Load(), "b", next); err != nil || p.Worker != retry.Worker || p.Reason != kind.reuse {
				t.Fatalf("next request %v/%s err %v, want the new binding", p.Worker, p.Reason, err)
			}
		})
	}
}

func TestBucketLoopResumesAtFailedBucket(t *testing.T) {
	b1, b2, b3 := bucket("b1", 0, 0, 100, 100), bucket("b2", 0, 0, 200, 200), bucket("b3", 0, 0, 300, 300)
	buckets := []*Bucket{b1, b2, b3}
	noCand := func(id string) error { return &PickError{Outcome: OutcomeNoCandidates, BucketID: id} }
	tests := []struct {
		name      string
		resume    string
		fail      map[string]bool
		wantTried []string
		want      string
		wantErr   error
	}{
		{"first attempt starts at the first bucket", "", nil, []string{"b1"}, "b1", nil},
		{"retry asks the failed bucket first", "b2", nil, []string{"b2"}, "b2", nil},
		{"retry moves to later buckets only", "b2", map[string]bool{"b2": true}, []string{"b2", "b3"}, "b3", nil},
		{"retry never goes back to an earlier bucket", "b3", map[string]bool{"b3": true}, []string{"b3"}, "", ErrNoCandidates},
		{"retry at a bucket the request cannot use", "b9", nil, nil, "", ErrInvalidSignal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := breq("llama", 10, -1)
			req.Retry.Bucket = tt.resume
			// The first attempt, in this order, asked the buckets before the one it picked.
			for _, b := range buckets {
				if b.ID == tt.resume {
					break
				}
				req.Retry.asked.add(b.ID)
			}
			var tried []string
			p, err := selectEngines(buckets, req, func(b *Bucket) (BucketPick, error) {
				tried = append(tried, b.ID)
				if tt.fail[b.ID] {
					return BucketPick{}, noCand(b.ID)
				}
				return BucketPick{BucketID: b.ID}, nil
			})
			if !slices.Equal(tried, tt.wantTried) {
				t.Fatalf("tried %v, want %v", tried, tt.wantTried)
			}
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil || p.BucketID != tt.want {
				t.Fatalf("pick %q err %v, want %q", p.BucketID, err, tt.want)
			}
		})
	}
}

// TestPDRetriesNeverMixBuckets runs many requests whose dispatches fail on random sides and
// retries each under the retry rule until selection gives up: every attempt is a complete
// pair from one bucket, the same bucket is asked again while it has engines that did not fail,
// the loop never returns to an earlier bucket, and no failed engine is picked again.
func TestPDRetriesNeverMixBuckets(t *testing.T) {
	type side struct{ p, d []*Worker }
	sides := map[string]side{}
	var all [][]*Worker
	var buckets []*Bucket
	for i, id := range []string{"short", "mid", "long"} {
		p := testWorkers(t, "llama", StagePrefill, id+"P", 2+i%2)
		d := testWorkers(t, "llama", StageDecode, id+"D", 2)
		sides[id] = side{p, d}
		all = append(all, p, d)
		b := bucket(id, i, 0, int64(1000*(i+1)), int64(1000*(i+1)))
		b.Prefill = NewEngineGroup("llama", StagePrefill, workerIDs(p), NewRoundRobin(nil, nil))
		b.Decode = NewEngineGroup("llama", StageDecode, workerIDs(d), NewPowerOfTwo(nil, nil, testRNG()))
		buckets = append(buckets, b)
	}
	set := mustSet(t, all...)
	res := NewBucketResolver("llama", buckets)
	order := map[string]int{"short": 0, "mid": 1, "long": 2}
	rng := rand.New(rand.NewPCG(7, 8))
	attempts := 0
	for r := range 500 {
		req := breq("llama", int64(rng.IntN(900)), -1)
		bs, err := res.Resolve(nil, req.InputTokens, req.ExpectedPeak)
		if err != nil {
			t.Fatal(err)
		}
		last := -1
		for try := 0; ; try++ {
			pick, err := selectEngines(bs, req, func(b *Bucket) (BucketPick, error) { return pickEngines(b, set.Load(), req) })
			if err != nil {
				if !errors.Is(err, ErrNoCandidates) {
					t.Fatalf("request %d attempt %d: %v", r, try, err)
				}
				if req.Retry.Bucket != "long" {
					t.Fatalf("request %d gave up in bucket %s before the last bucket", r, req.Retry.Bucket)
				}
				break
			}
			attempts++
			s := sides[pick.BucketID]
			if !slices.Contains(s.p, pick.Prefill.Worker) || !slices.Contains(s.d, pick.Decode.Worker) {
				t.Fatalf("request %d attempt %d: pair %s+%s is not from bucket %s", r, try, pick.Prefill.Worker, pick.Decode.Worker, pick.BucketID)
			}
			if req.Retry.Excluded.Has(pick.Prefill.Worker) || req.Retry.Excluded.Has(pick.Decode.Worker) {
				t.Fatalf("request %d attempt %d picked a failed engine", r, try)
			}
			if o := order[pick.BucketID]; o < last {
				t.Fatalf("request %d went back from bucket %d to %d", r, last, o)
			} else {
				last = o
			}
			failed := StagePrefill
			if rng.IntN(2) == 0 {
				failed = StageDecode
			}
			if !req.RetryAfter(&pick, failed) {
				t.Fatalf("request %d: exclusion set full after %d attempts", r, try+1)
			}
		}
	}
	if attempts < 500*4 {
		t.Fatalf("only %d attempts: the scenario did not exercise retries", attempts)
	}
}

func ExampleBucketRequest_RetryAfter() {
	p := NewWorker("P1", "http://p1", "llama", StagePrefill, nil)
	d := NewWorker("D1", "http://d1", "llama", StageDecode, nil)
	req := &BucketRequest{Model: "llama", InputTokens: 100, ExpectedPeak: -1}
	failed := BucketPick{BucketID: "short", Prefill: Pick{Worker: p}, Decode: Pick{Worker: d}}
	ok := req.RetryAfter(&failed, StagePrefill)
	fmt.Println(ok, req.Retry.Bucket, req.Retry.Excluded.Has(p), req.Retry.Excluded.Has(d))
	// Output: true short true false
}

func workerIDs(ws []*Worker) []string {
	out := make([]string, len(ws))
	for i, w := range ws {
		out[i] = w.ID
	}
	return out
}

// TestRetryKeepsTheFirstAttemptsBuckets: a retry asks the failed bucket first, then every
// compatible bucket its earlier attempts did not ask, in the order of this selection, and
// never one they asked: with an order that changes between attempts (bucket_order slo), no
// bucket is skipped and none is asked twice.
func TestRetryKeepsTheFirstAttemptsBuckets(t *testing.T) {
	b1, b2, b3 := bucket("b1", 0, 0, 100, 100), bucket("b2", 0, 0, 200, 200), bucket("b3", 0, 0, 300, 300)
	req := breq("llama", 10, -1)
	attempt := func(fail map[string]bool, tried *[]string) func(*Bucket) (BucketPick, error) {
		return func(b *Bucket) (BucketPick, error) {
			*tried = append(*tried, b.ID)
			if fail[b.ID] {
				return BucketPick{}, &PickError{Outcome: OutcomeNoCandidates, BucketID: b.ID}
			}
			w := &Worker{ID: "w-" + b.ID}
			return BucketPick{BucketID: b.ID, Plain: Pick{Worker: w}}, nil
		}
	}
	// First attempt, order b3, b1, b2: b3 has no candidate, b1 is picked.
	var tried []string
	p, err := selectEngines([]*Bucket{b3, b1, b2}, req, attempt(map[string]bool{"b3": true}, &tried))
	if err != nil || p.BucketID != "b1" {
		t.Fatalf("first attempt: %q %v (tried %v)", p.BucketID, err, tried)
	}
	// Its dispatch fails; b1 has nothing else. The retry's order is now b1, b2, b3.
	if !req.RetryAfter(&p, StagePlain) {
		t.Fatal("RetryAfter refused")
	}
	tried = nil
	p, err = selectEngines([]*Bucket{b1, b2, b3}, req, attempt(map[string]bool{"b1": true}, &tried))
	if err != nil || p.BucketID != "b2" || !slices.Equal(tried, []string{"b1", "b2"}) {
		t.Fatalf("retry: %q %v, tried %v, want b2 after [b1 b2]", p.BucketID, err, tried)
	}
	// The retry in order b2, b3, b1 after b2 failed too: b3 was asked by the first attempt,
	// b1 by the second; only b2 again.
	if !req.RetryAfter(&p, StagePlain) {
		t.Fatal("RetryAfter refused")
	}
	tried = nil
	_, err = selectEngines([]*Bucket{b2, b3, b1}, req, attempt(map[string]bool{"b2": true}, &tried))
	if !errors.Is(err, ErrNoCandidates) || !slices.Equal(tried, []string{"b2"}) {
		t.Fatalf("third attempt: %v, tried %v, want only b2", err, tried)
	}
}

// TestRetryAsksBucketsOrderedBeforeTheFailedOne: when the retry's order puts buckets the first
// attempt never asked before the failed bucket, they are still asked after it.
func TestRetryAsksBucketsOrderedBeforeTheFailedOne(t *testing.T) {
	b1, b2, b3 := bucket("b1", 0, 0, 100, 100), bucket("b2", 0, 0, 200, 200), bucket("b3", 0, 0, 300, 300)
	req := breq("llama", 10, -1)
	var tried []string
	pickIn := func(fail string) func(*Bucket) (BucketPick, error) {
		return func(b *Bucket) (BucketPick, error) {
			tried = append(tried, b.ID)
			if b.ID == fail {
				return BucketPick{}, &PickError{Outcome: OutcomeNoCandidates, BucketID: b.ID}
			}
			return BucketPick{BucketID: b.ID, Plain: Pick{Worker: &Worker{ID: "w-" + b.ID}}}, nil
		}
	}
	p, err := selectEngines([]*Bucket{b1, b2, b3}, req, pickIn(""))
	if err != nil || p.BucketID != "b1" || !req.RetryAfter(&p, StagePlain) {
		t.Fatalf("first attempt: %q %v", p.BucketID, err)
	}
	tried = nil
	p, err = selectEngines([]*Bucket{b3, b2, b1}, req, pickIn("b1"))
	if err != nil || p.BucketID != "b3" || !slices.Equal(tried, []string{"b1", "b3"}) {
		t.Fatalf("retry: %q %v, tried %v, want b3 after [b1 b3]", p.BucketID, err, tried)
	}
}
