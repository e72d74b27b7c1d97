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
	// Ranks are the worker's data-parallel ranks holding those Tokens (bit r for rank r,
	// ranks below 64); 0 when the source does not know them.
	Ranks uint64
}

// RankBit is the Ranks bit of DP rank r, 0 for a rank Ranks cannot name.
func RankBit(r int) uint64 {
	if r < 0 || r >= 64 {
		return 0
	}
	return 1 << r
}

// Lookup is the answer to one prefix query.
type Lookup struct {
	// Matches lists the workers holding at least one leading block, sorted by worker ID,
	// one entry per worker (the best of its DP ranks, with the ranks holding it).
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

// Ranks returns the DP ranks of worker holding its Tokens (see Match.Ranks), 0 when none or
// unknown.
func (l *Lookup) Ranks(worker string) uint64 {
	i, ok := slices.BinarySearchFunc(l.Matches, worker, func(m Match, w string) int { return cmp.Compare(m.Worker, w) })
	if !ok {
		return 0
	}
	return l.Matches[i].Ranks
}

// Normalize sorts the matches by worker and keeps the best entry of each worker, with the
// ranks of every entry of that worker that holds as much.
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
		if m[i].Tokens <= 0 {
			continue
		}
		if last := len(out) - 1; last >= 0 && out[last].Worker == m[i].Worker {
			if out[last].Tokens == m[i].Tokens {
				out[last].Ranks |= m[i].Ranks // another rank holding as much
			}
			continue
		}
		out = append(out, m[i])
	}
	l.Matches = out
}
