package engine

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"switchyard/load"
)

// countingAdmission records how often it is called and rejects the listed IDs.
type countingAdmission struct {
	calls  int
	reject map[string]bool
}

func (a *countingAdmission) Check(w *Worker, _ load.Observation) string {
	a.calls++
	if a.reject[w.ID] {
		return LimitWaiting
	}
	return ""
}

// policyFactories builds every policy with a given admission and load table. Later policies
// join this list; each must pass the same contract.
func policyFactories() map[string]func(adm EngineAdmission, loads LoadReader) Policy {
	return map[string]func(adm EngineAdmission, loads LoadReader) Policy{
		PolicyRoundRobin: func(adm EngineAdmission, loads LoadReader) Policy { return NewRoundRobin(adm, loads) },
		PolicyRandom:     func(adm EngineAdmission, loads LoadReader) Policy { return NewRandom(adm, loads, testRNG()) },
		PolicyPowerOfTwo: func(adm EngineAdmission, loads LoadReader) Policy { return NewPowerOfTwo(adm, loads, testRNG()) },
		PolicyLoadBased:  func(adm EngineAdmission, loads LoadReader) Policy { return NewLoadBased(adm, loads) },
		PolicySessionAware: func(adm EngineAdmission, loads LoadReader) Policy {
			return NewSessionAware(adm, loads, newMemAffinity(), testRNG())
		},
		PolicySessionAware + "/keyed": func(adm EngineAdmission, loads LoadReader) Policy {
			return keyedPolicy{NewSessionAware(adm, loads, newMemAffinity(), testRNG()), "session-1"}
		},
		PolicySticky: func(adm EngineAdmission, loads LoadReader) Policy {
			return NewSticky(adm, loads, newMemAffinity(), NewRoundRobin(nil, loads))
		},
		PolicySticky + "/keyed": func(adm EngineAdmission, loads LoadReader) Policy {
			return keyedPolicy{NewSticky(adm, loads, newMemAffinity(), NewRoundRobin(nil, loads)), "key-1"}
		},
		PolicyConsistentHash: func(adm EngineAdmission, loads LoadReader) Policy {
			return NewConsistentHash(adm, loads, 160, 1.25)
		},
		PolicyConsistentHash + "/keyed": func(adm EngineAdmission, loads LoadReader) Policy {
			return hashKeyed{NewConsistentHash(adm, loads, 160, 1.25), "user-7"}
		},
		PolicyPrefixHash: func(adm EngineAdmission, loads LoadReader) Policy {
			return NewPrefixHash(adm, loads, 4, 160, 1.25)
		},
		PolicyPrefixHash + "/tokens": func(adm EngineAdmission, loads LoadReader) Policy {
			return tokensKeyed{NewPrefixHash(adm, loads, 4, 160, 1.25), []uint32{1, 2, 3, 4, 5, 6}}
		},
		PolicyCacheAware: func(adm EngineAdmission, loads LoadReader) Policy {
			return NewCacheAware(adm, loads, nil, testCacheSettings(), testRNG(), nil)
		},
		PolicyCacheAware + "/approximate": func(adm EngineAdmission, loads LoadReader) Policy {
			return NewCacheAware(adm, loads, nil, approxSettings(), testRNG(), nil)
		},
		PolicyCacheAware + "/threshold": func(adm EngineAdmission, loads LoadReader) Policy {
			s := testCacheSettings()
			s.Decision = DecisionThreshold
			return NewCacheAware(adm, loads, nil, s, testRNG(), nil)
		},
	}
}

func TestPolicyContract(t *testing.T) {
	for name, mk := range policyFactories() {
		t.Run(name, func(t *testing.T) {
			for _, stage := range []Stage{StagePlain, StagePrefill, StageDecode} {
				if stage == StageDecode && strings.HasPrefix(name, PolicyCacheAware) {
					continue // plain and prefill only; cache_aware_test checks the decode refusal
				}
				t.Run(stage.String(), func(t *testing.T) { policyContract(t, mk, stage) })
			}
		})
	}
}

func policyContract(t *testing.T, mk func(EngineAdmission, LoadReader) Policy, stage Stage) {
	if got := mk(nil, nil).Name(); got == "" {
		t.Fatal("empty policy name")
	}
	t.Run("empty candidates return NoCandidates without admission", func(t *testing.T) {
		adm := &countingAdmission{}
		_, err := mk(adm, nil).Pick([]*Worker{}, pickReq(stage))
		if !errors.Is(err, ErrNoCandidates) || adm.calls != 0 {
			t.Fatalf("err = %v, admission calls = %d", err, adm.calls)
		}
	})
	for _, n := range []int{1, 2, 3, 8, 33} {
		t.Run(fmt.Sprintf("never outside %d candidates", n), func(t *testing.T) {
			ws := testWorkers(t, "llama", stage, "w", n)
			reports := map[*Worker]load.RankReport{}
			for i, w := range ws {
				if i%3 != 2 { // a mix of known and unknown load
					reports[w] = native(int64(i%4), int64(i%5), int64(i*7%11), int64(i*100))
				}
			}
			tab := loadTable(t, reports)
			p := mk(nil, tab)
			set := map[*Worker]bool{}
			for _, w := range ws {
				set[w] = true
			}
			for i := range 200 {
				got, err := p.Pick(ws, pickReq(stage))
				if err != nil {
					t.Fatalf("pick %d: %v", i, err)
				}
				if !set[got.Worker] {
					t.Fatalf("pick %d returned %v outside the candidates", i, got.Worker)
				}
				if got.Reason == "" {
					t.Fatalf("pick %d has no reason", i)
				}
			}
		})
	}
	t.Run("admission checked once on the chosen engine", func(t *testing.T) {
		ws := testWorkers(t, "llama", stage, "w", 4)
		adm := &countingAdmission{}
		p := mk(adm, nil)
		got, err := p.Pick(ws, pickReq(stage))
		if err != nil || adm.calls != 1 || got.Worker == nil {
			t.Fatalf("pick %v err %v calls %d", got.Worker, err, adm.calls)
		}
	})
	t.Run("rejection is AdmissionRejected naming engine and limit", func(t *testing.T) {
		ws := testWorkers(t, "llama", stage, "w", 3)
		adm := &countingAdmission{reject: map[string]bool{ws[0].ID: true, ws[1].ID: true, ws[2].ID: true}}
		_, err := mk(adm, nil).Pick(ws, pickReq(stage))
		var pe *PickError
		if !errors.As(err, &pe) || pe.Outcome != OutcomeAdmissionRejected || adm.calls != 1 {
			t.Fatalf("err = %v, calls = %d", err, adm.calls)
		}
		if len(pe.Rejections) != 1 || pe.Rejections[0].Limit != LimitWaiting || pe.Rejections[0].BucketID != "b" || pe.Rejections[0].Stage != stage {
			t.Fatalf("rejections = %v", pe.Rejections)
		}
	})
	t.Run("unknown reported metrics fail open", func(t *testing.T) {
		ws := testWorkers(t, "llama", stage, "w", 2)
		adm := AdmissionLimits{MaxRunning: 1, MaxWaiting: 1, MaxKVTokens: 1, MaxPendingPrefill: 1}
		if _, err := mk(adm, load.NewTable()).Pick(ws, pickReq(stage)); err != nil {
			t.Fatalf("unknown load must admit: %v", err)
		}
	})
	t.Run("in-flight cap is always known", func(t *testing.T) {
		ws := testWorkers(t, "llama", stage, "w", 2)
		tr := load.NewTracker()
		for _, w := range ws {
			inflight(t, tr, w, 2)
		}
		_, err := mk(AdmissionLimits{MaxInFlight: 2}, nil).Pick(ws, pickReq(stage))
		if !errors.Is(err, ErrAdmissionRejected) {
			t.Fatalf("err = %v, want in-flight rejection", err)
		}
	})
}
