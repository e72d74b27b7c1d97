package engine

import (
	"errors"
	"strings"
)

// Outcome classifies a failed selection (POLICY_DESIGN section 4).
type Outcome uint8

// Selection outcomes other than a successful Pick.
const (
	// OutcomeNoMatchingBucket: no bucket supports the requested length.
	OutcomeNoMatchingBucket Outcome = iota + 1
	// OutcomeNoCandidates: no eligible member, or a policy selection miss.
	OutcomeNoCandidates
	// OutcomeNoAdmissibleEngine: a policy (or the bucket loop) exhausted its candidates;
	// Rejections says why.
	OutcomeNoAdmissibleEngine
	// OutcomeAdmissionRejected: the chosen engine failed after-selection admission.
	OutcomeAdmissionRejected
	// OutcomeInvalidSignal: invalid policy input (for example a peak below the input length).
	OutcomeInvalidSignal
	// OutcomeInvalidConfiguration: the policy or group is misconfigured.
	OutcomeInvalidConfiguration
	// OutcomeOutsideCandidates: a policy returned an engine outside its exact candidate set.
	OutcomeOutsideCandidates
	// OutcomeOverloaded: an actor's bounded mailbox was full; the pick was never attempted.
	OutcomeOverloaded
	// OutcomeTimeout: the reply did not arrive before the deadline.
	OutcomeTimeout
	// OutcomeInternal: the actor serving the pick failed (panicked) on this request.
	OutcomeInternal
	// OutcomePDIncompatible: no decode engine of the bucket shares the compatibility labels
	// of the chosen prefill engine (groups.pd.compatibility); the tentative prefill pick is
	// discarded and the bucket loop moves on. Rejections names the prefill engine with the
	// limit "pd_incompatible".
	OutcomePDIncompatible
)

var outcomeNames = [...]string{
	OutcomeNoMatchingBucket:     "no_matching_bucket",
	OutcomeNoCandidates:         "no_candidates",
	OutcomeNoAdmissibleEngine:   "no_admissible_engine",
	OutcomeAdmissionRejected:    "admission_rejected",
	OutcomeInvalidSignal:        "invalid_signal",
	OutcomeInvalidConfiguration: "invalid_configuration",
	OutcomeOutsideCandidates:    "outside_candidates",
	OutcomeOverloaded:           "overloaded",
	OutcomeTimeout:              "timeout",
	OutcomeInternal:             "internal",
	OutcomePDIncompatible:       "pd_incompatible",
}

// String returns the outcome's snake_case name, used in metrics and error codes.
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && outcomeNames[o] != "" {
		return outcomeNames[o]
	}
	return "unknown"
}

// Sentinel errors, one per outcome; a *PickError unwraps to its outcome's sentinel so callers
// can write errors.Is(err, engine.ErrAdmissionRejected).
var (
	ErrNoMatchingBucket     = errors.New("no matching bucket")
	ErrNoCandidates         = errors.New("no candidates")
	ErrNoAdmissibleEngine   = errors.New("no admissible engine")
	ErrAdmissionRejected    = errors.New("admission rejected")
	ErrInvalidSignal        = errors.New("invalid signal")
	ErrInvalidConfiguration = errors.New("invalid configuration")
	ErrOutsideCandidates    = errors.New("pick outside candidates")
	ErrOverloaded           = errors.New("overloaded")
	ErrTimeout              = errors.New("selection timed out")
	ErrInternal             = errors.New("internal selection failure")
	ErrPDIncompatible       = errors.New("no compatible decode engine")

	// ErrAdapterSlotsInUse is the cause (PickError.Err) of a LoRA adapter request's failed
	// selection when the group would evict to make room (EngineGroup.SetAdapterLoading) but
	// every adapter slot of its candidates is taken by an adapter a request uses, or by a
	// load under way: the end of such a request, or of the load, may make room.
	ErrAdapterSlotsInUse = errors.New("every adapter slot is taken by an adapter in use")

	// ErrDuplicateWorker is returned when a worker ID is added twice.
	ErrDuplicateWorker = errors.New("duplicate worker ID")
	errNilWorker       = errors.New("nil worker")
)

var outcomeErrs = [...]error{
	OutcomeNoMatchingBucket:     ErrNoMatchingBucket,
	OutcomeNoCandidates:         ErrNoCandidates,
	OutcomeNoAdmissibleEngine:   ErrNoAdmissibleEngine,
	OutcomeAdmissionRejected:    ErrAdmissionRejected,
	OutcomeInvalidSignal:        ErrInvalidSignal,
	OutcomeInvalidConfiguration: ErrInvalidConfiguration,
	OutcomeOutsideCandidates:    ErrOutsideCandidates,
	OutcomeOverloaded:           ErrOverloaded,
	OutcomeTimeout:              ErrTimeout,
	OutcomeInternal:             ErrInternal,
	OutcomePDIncompatible:       ErrPDIncompatible,
}

// Rejection records one admission rejection: which engine, in which bucket and stage, and the
// limit that rejected it.
type Rejection struct {
	BucketID string
	Stage    Stage
	WorkerID string
	Limit    string
}

func (r Rejection) String() string {
	return r.BucketID + "/" + r.Stage.String() + "/" + r.WorkerID + ": " + r.Limit
}

// PickError is a failed selection. It keeps the stage and bucket it failed in.
type PickError struct {
	Outcome  Outcome
	Stage    Stage
	BucketID string
	// Rejections lists admission rejections (AdmissionRejected has one; NoAdmissibleEngine
	// has every rejection accumulated).
	Rejections []Rejection
	// Detail is a human-readable explanation.
	Detail string
	// Err is an underlying cause, if any.
	Err error
}

// Error describes the failure.
func (e *PickError) Error() string {
	var b strings.Builder
	b.WriteString(e.Outcome.String())
	if e.BucketID != "" {
		b.WriteString(" in bucket ")
		b.WriteString(e.BucketID)
	}
	if e.Outcome != OutcomeNoMatchingBucket && e.Outcome != OutcomeOverloaded {
		b.WriteString(" (stage ")
		b.WriteString(e.Stage.String())
		b.WriteByte(')')
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	for i, r := range e.Rejections {
		if i == 0 {
			b.WriteString("; rejected: ")
		} else {
			b.WriteString(", ")
		}
		b.WriteString(r.String())
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns the outcome's sentinel and the underlying cause.
func (e *PickError) Unwrap() []error {
	var errs []error
	if int(e.Outcome) < len(outcomeErrs) && outcomeErrs[e.Outcome] != nil {
		errs = append(errs, outcomeErrs[e.Outcome])
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// Advances reports whether the bucket loop moves on to the next bucket after this failure
// (missing candidates, admission rejection, no compatible decode engine) rather than
// stopping.
func (e *PickError) Advances() bool {
	switch e.Outcome {
	case OutcomeNoCandidates, OutcomeAdmissionRejected, OutcomeNoAdmissibleEngine, OutcomePDIncompatible:
		return true
	}
	return false
}

// OutcomeOf returns the outcome of err when it is a *PickError, else OutcomeInternal.
func OutcomeOf(err error) Outcome {
	var pe *PickError
	if errors.As(err, &pe) {
		return pe.Outcome
	}
	return OutcomeInternal
}

func pickErr(o Outcome, stage Stage, bucket, detail string) *PickError {
	return &PickError{Outcome: o, Stage: stage, BucketID: bucket, Detail: detail}
}
