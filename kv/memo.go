package kv

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// PrefixResult is one source's answer to one request's prefix lookup. It satisfies the
// engine's PrefixMatcher (MatchedTokens and Status) and RankMatcher (MatchedRanks).
type PrefixResult struct {
	// Lookup is the answer; empty unless Err is nil.
	Lookup Lookup
	// Err is nil for an answered lookup, or wraps ErrUnavailable (a miss that stays
	// distinguishable) or ErrRejected (an invalid query).
	Err error
	// Elapsed is how long the lookup took.
	Elapsed time.Duration
}

// MatchedTokens returns the number of leading prompt tokens worker holds (0 unless the lookup
// was answered).
func (r *PrefixResult) MatchedTokens(worker string) int64 {
	if r.Err != nil {
		return 0
	}
	return r.Lookup.Tokens(worker)
}

// MatchedRanks returns the DP ranks of worker holding its MatchedTokens (0 unless the lookup
// was answered and its source knows ranks).
func (r *PrefixResult) MatchedRanks(worker string) uint64 {
	if r.Err != nil {
		return 0
	}
	return r.Lookup.Ranks(worker)
}

// QueryTokens returns the length of the prompt looked up (0 unless the lookup was answered).
func (r *PrefixResult) QueryTokens() int {
	if r.Err != nil {
		return 0
	}
	return r.Lookup.QueryTokens
}

// Status reports whether the lookup was answered (ok), and otherwise whether the source was
// unavailable or the query was rejected (err).
func (r *PrefixResult) Status() (ok, unavailable bool, err error) {
	switch {
	case r.Err == nil:
		return true, false, nil
	case errors.Is(r.Err, ErrRejected):
		return false, false, r.Err
	}
	return false, true, nil
}

// maxMemoSources is how many distinct sources one memo remembers; a process normally has one.
const maxMemoSources = 4

// errNotResolved is the status of a memo asked before any lookup was made.
var errNotResolved = fmt.Errorf("prefix lookup not made before the pick: %w", ErrUnavailable)

// PrefixMemo is one request's prefix lookups, at most one per CacheSource: the request's
// handler resolves it once (the only place a remote lookup's I/O happens) and every bucket
// attempt and group policy reads it, each restricting the matches to its own candidates.
// Entries are keyed by source, so different index namespaces never mix.
//
// A PrefixMemo is request-scoped and not safe for concurrent use: it is written and read by
// the request's goroutine and, in sequence, by the actors its picks are sent to (each send
// orders the accesses). It retains tokens until Reset. Its own methods MatchedTokens and
// Status answer from the first source resolved.
type PrefixMemo struct {
	model  string
	tokens []uint32
	n      int
	srcs   [maxMemoSources]CacheSource
	res    [maxMemoSources]PrefixResult
}

// NewPrefixMemo returns the memo of a request for model with the prompt tokens.
func NewPrefixMemo(model string, tokens []uint32) *PrefixMemo {
	m := &PrefixMemo{}
	m.Reset(model, tokens)
	return m
}

// Reset empties the memo for another request, keeping its buffers.
func (m *PrefixMemo) Reset(model string, tokens []uint32) {
	for i := range m.n {
		m.srcs[i] = nil
		m.res[i].Lookup.Reset()
		m.res[i].Err, m.res[i].Elapsed = nil, 0
	}
	m.model, m.tokens, m.n = model, tokens, 0
}

// Model returns the request's model.
func (m *PrefixMemo) Model() string { return m.model }

// Tokens returns the request's prompt tokens.
func (m *PrefixMemo) Tokens() []uint32 { return m.tokens }

// Resolved returns src's result when it was already looked up.
func (m *PrefixMemo) Resolved(src CacheSource) (*PrefixResult, bool) {
	if m == nil {
		return nil, false
	}
	for i := range m.n {
		if m.srcs[i] == src {
			return &m.res[i], true
		}
	}
	return nil, false
}

// Resolve returns src's result, making the lookup on first use. ctx bounds the lookup (a
// remote source also applies its own query timeout). Without tokens the result is an empty,
// answered lookup.
func (m *PrefixMemo) Resolve(ctx context.Context, src CacheSource) *PrefixResult {
	if r, ok := m.Resolved(src); ok {
		return r
	}
	var r *PrefixResult
	if m.n < maxMemoSources {
		m.srcs[m.n] = src
		r = &m.res[m.n]
		m.n++
	} else {
		r = &PrefixResult{} // more sources than remembered: answer without memoizing
	}
	if src == nil {
		r.Err = fmt.Errorf("cannot look up prefix: no source: %w", ErrUnavailable)
		return r
	}
	start := time.Now()
	r.Err = src.Lookup(ctx, m.model, m.tokens, &r.Lookup)
	r.Elapsed = time.Since(start)
	if r.Err != nil {
		r.Lookup.Reset()
	}
	return r
}

// MatchedTokens answers from the first source resolved (0 before any lookup).
func (m *PrefixMemo) MatchedTokens(worker string) int64 {
	if m == nil || m.n == 0 {
		return 0
	}
	return m.res[0].MatchedTokens(worker)
}

// MatchedRanks answers from the first source resolved (0 before any lookup).
func (m *PrefixMemo) MatchedRanks(worker string) uint64 {
	if m == nil || m.n == 0 {
		return 0
	}
	return m.res[0].MatchedRanks(worker)
}

// QueryTokens answers from the first source resolved (0 before any lookup).
func (m *PrefixMemo) QueryTokens() int {
	if m == nil || m.n == 0 {
		return 0
	}
	return m.res[0].QueryTokens()
}

// Status answers from the first source resolved; before any lookup (or on a nil memo) the
// memo counts as unavailable.
func (m *PrefixMemo) Status() (ok, unavailable bool, err error) {
	if m == nil || m.n == 0 {
		return false, true, nil
	}
	return m.res[0].Status()
}

// NotResolved is the error of a pick that found no lookup of its source in the memo and
// could not make one (a remote source is only asked by the request's handler).
func NotResolved() error { return errNotResolved }
