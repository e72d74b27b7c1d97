package load

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// ErrMalformed is wrapped by every decoding error: the input is not a load report of the
// expected shape.
var ErrMalformed = errors.New("malformed load report")

// MaxRanks bounds the number of DP ranks a single report body may carry.
const MaxRanks = 1024

// LoadsBody is the JSON body of an engine's native GET /v1/loads. The mock engine encodes
// it; DecodeLoads reads it (and tolerates every other shape listed in INTEROP.md).
type LoadsBody struct {
	// Timestamp is the capture time in unix seconds. DecodeLoads also accepts an ISO 8601
	// string here.
	Timestamp float64 `json:"timestamp"`
	// Version is the engine's version string; ignored by the router.
	Version string      `json:"version"`
	Loads   []LoadsRank `json:"loads"`
}

// LoadsRank is one DP rank of a /v1/loads body.
type LoadsRank struct {
	DPRank                   int     `json:"dp_rank"`
	NumRunningReqs           int64   `json:"num_running_reqs"`
	NumWaitingReqs           int64   `json:"num_waiting_reqs"`
	NumWaitingUncachedTokens int64   `json:"num_waiting_uncached_tokens"`
	NumUsedTokens            int64   `json:"num_used_tokens"`
	NumTotalTokens           int64   `json:"num_total_tokens"`
	MaxTotalNumTokens        int64   `json:"max_total_num_tokens"`
	MaxRunningRequests       int64   `json:"max_running_requests"`
	TokenUsage               float64 `json:"token_usage"`
	GenThroughput            float64 `json:"gen_throughput"`
	CacheHitRate             float64 `json:"cache_hit_rate"`
	Utilization              float64 `json:"utilization"`
	// Cumulative prefill counters of newer engines; omitted when nil.
	TotalPrefillUncachedTokens *int64 `json:"total_prefill_uncached_tokens,omitempty"`
	TotalPrefillBusyUs         *int64 `json:"total_prefill_busy_us,omitempty"`
	// Optional sections, passed through untouched and ignored by the decoder.
	Memory         json.RawMessage `json:"memory,omitempty"`
	Speculative    json.RawMessage `json:"speculative,omitempty"`
	Lora           json.RawMessage `json:"lora,omitempty"`
	Disaggregation json.RawMessage `json:"disaggregation,omitempty"`
	Queues         json.RawMessage `json:"queues,omitempty"`
}

// GetLoadRank is one DP rank of a legacy GET /get_load body (a JSON array of these).
type GetLoadRank struct {
	DPRank int `json:"dp_rank"`
	// NumReqs is running plus waiting requests.
	NumReqs        int64 `json:"num_reqs"`
	NumWaitingReqs int64 `json:"num_waiting_reqs"`
	NumTokens      int64 `json:"num_tokens"`
}

// NewLoadsBody builds the /v1/loads body for reps captured at at. Fields a report lacks are
// encoded as zero; the counters are encoded only when r.HasCounters.
func NewLoadsBody(at time.Time, version string, reps []RankReport) LoadsBody {
	b := LoadsBody{
		Timestamp: float64(at.UnixNano()) / 1e9,
		Version:   version,
		Loads:     make([]LoadsRank, len(reps)),
	}
	for i := range reps {
		b.Loads[i] = NewLoadsRank(&reps[i])
	}
	return b
}

// NewLoadsRank encodes one rank report in the /v1/loads shape.
func NewLoadsRank(r *RankReport) LoadsRank {
	lr := LoadsRank{
		DPRank:                   r.DPRank,
		NumRunningReqs:           r.Running,
		NumWaitingReqs:           r.Waiting,
		NumWaitingUncachedTokens: r.WaitingUncachedTokens,
		NumUsedTokens:            r.UsedTokens,
		NumTotalTokens:           r.TotalTokens,
		MaxTotalNumTokens:        r.MaxTotalTokens,
		MaxRunningRequests:       r.MaxRunningRequests,
	}
	if r.MaxTotalTokens > 0 {
		lr.TokenUsage = float64(r.UsedTokens) / float64(r.MaxTotalTokens)
	}
	if r.HasCounters {
		u, b := r.TotalPrefillUncached, r.TotalPrefillBusyUs
		lr.TotalPrefillUncachedTokens, lr.TotalPrefillBusyUs = &u, &b
	}
	return lr
}

// NewGetLoadRank encodes one rank report in the legacy /get_load shape.
func NewGetLoadRank(r *RankReport) GetLoadRank {
	return GetLoadRank{
		DPRank:         r.DPRank,
		NumReqs:        r.Running + r.Waiting,
		NumWaitingReqs: r.Waiting,
		NumTokens:      r.UsedTokens,
	}
}

// optInt is a non-negative JSON integer whose presence is recorded. It accepts any JSON
// number (an integral float such as 12.0 included; a fraction is truncated toward zero);
// null counts as absent.
type optInt struct {
	v   int64
	set bool
}

func (o *optInt) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*o = optInt{}
		return nil
	}
	v, err := parseCount(b)
	if err != nil {
		return err
	}
	*o = optInt{v: v, set: true}
	return nil
}

// parseCount parses a JSON number as a non-negative count.
func parseCount(b []byte) (int64, error) {
	if v, err := strconv.ParseInt(string(b), 10, 64); err == nil {
		if v < 0 {
			return 0, fmt.Errorf("negative count %d", v)
		}
		return v, nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return 0, fmt.Errorf("not a number: %.32q", b)
	}
	return floatCount(f)
}

// floatCount converts a float to a non-negative count.
func floatCount(f float64) (int64, error) {
	switch {
	case math.IsNaN(f) || math.IsInf(f, 0):
		return 0, fmt.Errorf("not a finite number: %v", f)
	case f < 0:
		return 0, fmt.Errorf("negative count %v", f)
	case f >= math.MaxInt64:
		return 0, fmt.Errorf("count %v out of range", f)
	}
	return int64(f), nil
}

// wireLoadsRank is the decoding form of LoadsRank: presence-aware, unknown keys ignored.
type wireLoadsRank struct {
	DPRank                     optInt `json:"dp_rank"`
	NumRunningReqs             optInt `json:"num_running_reqs"`
	NumWaitingReqs             optInt `json:"num_waiting_reqs"`
	NumWaitingUncachedTokens   optInt `json:"num_waiting_uncached_tokens"`
	NumUsedTokens              optInt `json:"num_used_tokens"`
	NumTotalTokens             optInt `json:"num_total_tokens"`
	MaxTotalNumTokens          optInt `json:"max_total_num_tokens"`
	MaxRunningRequests         optInt `json:"max_running_requests"`
	TotalPrefillUncachedTokens optInt `json:"total_prefill_uncached_tokens"`
	TotalPrefillBusyUs         optInt `json:"total_prefill_busy_us"`
}

type wireLoadsBody struct {
	Timestamp json.RawMessage  `json:"timestamp"`
	Loads     *[]wireLoadsRank `json:"loads"`
}

type wireGetLoadRank struct {
	DPRank         optInt `json:"dp_rank"`
	NumReqs        optInt `json:"num_reqs"`
	NumWaitingReqs optInt `json:"num_waiting_reqs"`
	NumTokens      optInt `json:"num_tokens"`
}

// DecodeLoads decodes a native /v1/loads body. Every rank gets HasNative; each other field
// flag is set when its key is present (HasCapacity when max_total_num_tokens > 0), and the
// prefill counters when both are present. The capture time is the body's timestamp (unix
// seconds as a number, or an ISO 8601 string), clamped to receivedAt when it lies in the
// future; a missing or unreadable timestamp means receivedAt.
func DecodeLoads(body []byte, receivedAt time.Time) ([]RankReport, error) {
	var w wireLoadsBody
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, decodeErr("/v1/loads body", err)
	}
	if w.Loads == nil {
		return nil, decodeErr("/v1/loads body", errors.New(`missing "loads"`))
	}
	ranks := *w.Loads
	if err := checkRankCount(len(ranks)); err != nil {
		return nil, decodeErr("/v1/loads body", err)
	}
	at := captureTime(w.Timestamp, receivedAt)
	out := make([]RankReport, len(ranks))
	for i := range ranks {
		wr := &ranks[i]
		r := &out[i]
		rank, err := rankOf(wr.DPRank, i, len(ranks))
		if err != nil {
			return nil, decodeErr("/v1/loads body", err)
		}
		r.DPRank = rank
		r.At = at
		r.Fields = HasNative
		setField(&r.Running, &r.Fields, HasRunning, wr.NumRunningReqs)
		setField(&r.Waiting, &r.Fields, HasWaiting, wr.NumWaitingReqs)
		setField(&r.UsedTokens, &r.Fields, HasUsedTokens, wr.NumUsedTokens)
		setField(&r.WaitingUncachedTokens, &r.Fields, HasWaitingUncached, wr.NumWaitingUncachedTokens)
		r.MaxTotalTokens = wr.MaxTotalNumTokens.v
		if r.MaxTotalTokens > 0 {
			r.Fields |= HasCapacity
		}
		r.TotalTokens = wr.NumTotalTokens.v
		r.MaxRunningRequests = wr.MaxRunningRequests.v
		if wr.TotalPrefillUncachedTokens.set && wr.TotalPrefillBusyUs.set {
			r.HasCounters = true
			r.TotalPrefillUncached = wr.TotalPrefillUncachedTokens.v
			r.TotalPrefillBusyUs = wr.TotalPrefillBusyUs.v
		}
	}
	if err := checkDistinctRanks(out); err != nil {
		return nil, decodeErr("/v1/loads body", err)
	}
	return out, nil
}

// DecodeGetLoad decodes a legacy /get_load body, a JSON array with one object per DP rank.
// num_reqs counts running plus waiting requests, so Running is num_reqs − num_waiting_reqs,
// clamped at 0. num_tokens is reported as UsedTokens. Legacy reports are never native and
// carry neither capacity nor waiting-uncached tokens. The capture time is receivedAt.
func DecodeGetLoad(body []byte, receivedAt time.Time) ([]RankReport, error) {
	var ranks []wireGetLoadRank
	if err := json.Unmarshal(body, &ranks); err != nil {
		return nil, decodeErr("/get_load body", err)
	}
	if err := checkRankCount(len(ranks)); err != nil {
		return nil, decodeErr("/get_load body", err)
	}
	out := make([]RankReport, len(ranks))
	for i := range ranks {
		wr := &ranks[i]
		r := &out[i]
		rank, err := rankOf(wr.DPRank, i, len(ranks))
		if err != nil {
			return nil, decodeErr("/get_load body", err)
		}
		r.DPRank = rank
		r.At = receivedAt
		setField(&r.Waiting, &r.Fields, HasWaiting, wr.NumWaitingReqs)
		if wr.NumReqs.set {
			r.Running = max(wr.NumReqs.v-wr.NumWaitingReqs.v, 0)
			r.Fields |= HasRunning
		}
		setField(&r.UsedTokens, &r.Fields, HasUsedTokens, wr.NumTokens)
	}
	if err := checkDistinctRanks(out); err != nil {
		return nil, decodeErr("/get_load body", err)
	}
	return out, nil
}

func decodeErr(what string, err error) error {
	return fmt.Errorf("cannot decode %s: %w: %w", what, ErrMalformed, err)
}

func setField(dst *int64, fields *Field, f Field, v optInt) {
	if v.set {
		*dst = v.v
		*fields |= f
	}
}

func checkRankCount(n int) error {
	switch {
	case n == 0:
		return errors.New("no DP ranks")
	case n > MaxRanks:
		return fmt.Errorf("%d DP ranks, more than %d", n, MaxRanks)
	}
	return nil
}

// rankOf is the DP rank of element i of n: dp_rank when present; a lone element without
// one is rank 0.
func rankOf(v optInt, i, n int) (int, error) {
	if !v.set {
		if n == 1 {
			return 0, nil
		}
		return 0, fmt.Errorf("element %d: missing dp_rank", i)
	}
	if v.v >= MaxRanks {
		return 0, fmt.Errorf("element %d: dp_rank %d out of range", i, v.v)
	}
	return int(v.v), nil
}

func checkDistinctRanks(reps []RankReport) error {
	// Quadratic on purpose: n is a handful of DP ranks and this allocates nothing.
	for i := 1; i < len(reps); i++ {
		for j := range i {
			if reps[i].DPRank == reps[j].DPRank {
				return fmt.Errorf("duplicate dp_rank %d", reps[i].DPRank)
			}
		}
	}
	return nil
}

// captureTime reads a /v1/loads timestamp, falling back to receivedAt.
func captureTime(raw json.RawMessage, receivedAt time.Time) time.Time {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return receivedAt
	}
	var at time.Time
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return receivedAt
		}
		// ISO 8601 forms; one without a zone is UTC.
		layouts := [...]string{
			time.RFC3339Nano,
			"2006-01-02T15:04:05.999999999",
			"2006-01-02 15:04:05.999999999Z07:00",
			"2006-01-02 15:04:05.999999999",
		}
		for _, layout := range layouts {
			if t, err := time.Parse(layout, s); err == nil {
				at = t
				break
			}
		}
	default:
		f, err := strconv.ParseFloat(string(raw), 64)
		// Accept 1970 .. 2262 (the int64 nanosecond range).
		if err != nil || !(f > 0 && f < math.MaxInt64/1e9) {
			return receivedAt
		}
		sec, frac := math.Modf(f)
		at = time.Unix(int64(sec), int64(frac*1e9))
	}
	if at.IsZero() || at.After(receivedAt) || at.Year() < 1970 {
		return receivedAt
	}
	return at
}
