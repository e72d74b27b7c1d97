package kv

import (
	"cmp"
	"context"
	"errors"
	"slices"
)

// CacheSource answers prefix lookups: which workers hold how many leading tokens of a prompt
// in their KV cache. Implementations are the local Index and the RemoteSource client of a
// `switchyard indexer`.
//
// Lookup fills dst (reusing its slices) with the workers of model holding a prefix of tokens.
// An error wrapping ErrUnavailable means the source could not answer (timeout, overload,
// unreachable): callers treat it as a miss but keep it distinguishable. An error wrapping
// ErrRejected means the query itself was refused (an invalid signal). Lookup is safe for
// concurrent use and does not retain tokens.
type CacheSource interface {
	Lookup(ctx context.Context, model string, tokens []uint32, dst *Lookup) error
}

// Lookup errors.
var (
	// ErrUnavailable: the source could not answer; the request proceeds as a miss.
	ErrUnavailable = errors.New("prefix source unavailable")
	// ErrRejected: the source refused the query as invalid.
	ErrRejected = errors.New("prefix query rejected")
)

// Match is one worker's prefix hit.
type Match struct {
	// Worker is the worker ID.
	Worker string
	// Tokens is the number of leading prompt tokens the worker holds (in any tier), > 0.
	Tokens int64
}

// Lookup is the answer to one prefix query.
type Lookup struct {
	// Matches lists the workers holding at least one leading block, sorted by worker ID,
	// one entry per worker (the best of its DP ranks).
	Matches []Match
	// QueryTokens is the prompt length the lookup was made for.
	QueryTokens int
}

// Reset empties l, keeping its capacity.
func (l *Lookup) Reset() {
	l.Matches = l.Matches[:0]
	l.QueryTokens = 0
}

// Tokens returns the number of leading tokens worker holds, 0 when none.
func (l *Lookup) Tokens(worker string) int64 {
	i, ok := slices.BinarySearchFunc(l.Matches, worker, func(m Match, w string) int { return cmp.Compare(m.Worker, w) })
	if !ok {
		return 0
	}
	return l.Matches[i].Tokens
}

// Normalize sorts the matches by worker and keeps the best entry of each worker.
func (l *Lookup) Normalize() {
	m := l.Matches
	slices.SortFunc(m, func(a, b Match) int {
		if c := cmp.Compare(a.Worker, b.Worker); c != 0 {
			return c
		}
		return cmp.Compare(b.Tokens, a.Tokens) // best first
	})
	out := m[:0]
	for i := range m {
		if m[i].Tokens <= 0 || (len(out) > 0 && out[len(out)-1].Worker == m[i].Worker) {
			continue
		}
		out = append(out, m[i])
	}
	l.Matches = out
}
