package engine

import (
	"switchyard/config"
	"switchyard/load"
)

// Admission limit names, as reported in rejections and metrics.
const (
	LimitRunning        = "max_running_requests"
	LimitWaiting        = "max_waiting_requests"
	LimitKVTokens       = "max_kv_tokens"
	LimitPendingPrefill = "max_pending_prefill_tokens"
	LimitInFlight       = "max_inflight_requests"
)

// EngineAdmission decides whether one engine accepts a request, given the load observation
// the policy already captured for it. It observes capacity; it never reserves it, ranks
// engines or chooses replacements.
type EngineAdmission interface {
	// Check returns "" when w is admitted, else the name of the limit that rejected it.
	Check(w *Worker, obs load.Observation) string
}

// AdmissionLimits are the five optional per-engine caps. A zero cap is unset and not
// checked, so the zero value admits everything. A cap admits while the engine's metric is
// below it. A reported metric that is unknown (no fresh, complete report) fails open; the
// router-local in-flight count is always known.
type AdmissionLimits struct {
	MaxRunning        int64
	MaxWaiting        int64
	MaxKVTokens       int64
	MaxPendingPrefill int64
	MaxInFlight       int64
}

var _ EngineAdmission = AdmissionLimits{}

// admissionOf returns l as an EngineAdmission, or nil when no cap is set, so policies skip
// reading observations they would not use.
func admissionOf(l AdmissionLimits) EngineAdmission {
	if l.IsZero() {
		return nil
	}
	return l
}

// LimitsFromConfig converts configured caps.
func LimitsFromConfig(a config.Admission) AdmissionLimits {
	v := func(p *int64) int64 {
		if p == nil {
			return 0
		}
		return *p
	}
	return AdmissionLimits{
		MaxRunning:        v(a.MaxRunningRequests),
		MaxWaiting:        v(a.MaxWaitingRequests),
		MaxKVTokens:       v(a.MaxKVTokens),
		MaxPendingPrefill: v(a.MaxPendingPrefillTokens),
		MaxInFlight:       v(a.MaxInflightRequests),
	}
}

// IsZero reports whether no cap is set.
func (l AdmissionLimits) IsZero() bool { return l == AdmissionLimits{} }

// Check implements EngineAdmission.
func (l AdmissionLimits) Check(w *Worker, obs load.Observation) string {
	if l.MaxInFlight > 0 && w.Counters.InFlight() >= l.MaxInFlight {
		return LimitInFlight
	}
	if l.MaxRunning > 0 && obs.Has(load.HasRunning) && obs.Running >= l.MaxRunning {
		return LimitRunning
	}
	if l.MaxWaiting > 0 && obs.Has(load.HasWaiting) && obs.Waiting >= l.MaxWaiting {
		return LimitWaiting
	}
	if l.MaxKVTokens > 0 && obs.Has(load.HasUsedTokens) && obs.UsedTokens >= l.MaxKVTokens {
		return LimitKVTokens
	}
	if l.MaxPendingPrefill > 0 && obs.Has(load.HasWaitingUncached) && obs.WaitingUncachedTokens >= l.MaxPendingPrefill {
		return LimitPendingPrefill
	}
	return ""
}

// admit runs adm on w and turns a rejection into an AdmissionRejected error.
func admit(adm EngineAdmission, w *Worker, obs load.Observation, req *PickRequest) error {
	if adm == nil {
		return nil
	}
	if limit := adm.Check(w, obs); limit != "" {
		return &PickError{
			Outcome:    OutcomeAdmissionRejected,
			Stage:      req.Stage,
			BucketID:   req.BucketID,
			Rejections: []Rejection{{BucketID: req.BucketID, Stage: req.Stage, WorkerID: w.ID, Limit: limit}},
		}
	}
	return nil
}
