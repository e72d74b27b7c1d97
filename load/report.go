package load

import "time"

// RankReport is one DP rank's load report, decoded from any wire shape (/v1/loads,
// /get_load or the ZMQ load gauge). Fields a shape does not carry are left unset in Fields.
type RankReport struct {
	DPRank                int
	Fields                Field
	Running               int64
	Waiting               int64
	UsedTokens            int64
	MaxTotalTokens        int64
	WaitingUncachedTokens int64
	TotalTokens           int64 // num_total_tokens, when reported
	MaxRunningRequests    int64 // max_running_requests, when reported
	// Cumulative prefill counters (newer engines); HasCounters says whether they are set.
	HasCounters          bool
	TotalPrefillUncached int64 // total_prefill_uncached_tokens
	TotalPrefillBusyUs   int64 // total_prefill_busy_us
	// At is when the report was captured (the engine's timestamp when given, else receipt).
	At time.Time
}

// Has reports whether every field in f was reported.
func (r *RankReport) Has(f Field) bool { return r.Fields&f == f }
