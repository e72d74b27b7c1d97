package index

import (
	"context"
	"errors"
	"sync"
)

// ErrShardBusy is returned by a ShardHost whose shard cannot take a message now (its bounded
// mailbox is full, or it has stopped).
var ErrShardBusy = errors.New("index shard busy")

// ShardHost runs the shards of an Index: each shard is touched by one goroutine at a time.
// The router hosts them on index shard actors (package actors); LockedShards hosts them
// behind mutexes on the caller's goroutine.
type ShardHost interface {
	// Apply hands b to shard i without waiting for it to be applied (a host may make the
	// caller wait a bounded time while the shard falls behind). On success the host owns b
	// and calls b.Done after applying it; on error (ErrShardBusy) the caller still owns b
	// and the operations were not applied.
	Apply(i int, b *ShardBatch) error
	// Match runs qs[i] on shard i for every non-nil qs[i] and returns once all are answered,
	// or with an error when ctx ends first or a shard cannot take the query. After an error
	// a shard may still be writing to its query: the caller must not reuse qs.
	Match(ctx context.Context, qs []*ShardQuery) error
	// Prune asks shard i to reclaim the records of cleared owners now (best effort).
	Prune(i int) error
}

// LockedShards hosts shards behind one mutex each: every call runs on the caller's
// goroutine. It is the host of the standalone indexer and of tests, and the baseline the
// actor host is measured against. Safe for concurrent use.
type LockedShards struct {
	shards []lockedShard
}

type lockedShard struct {
	mu sync.Mutex
	s  *Shard
	_  [40]byte // keep neighbouring mutexes off one cache line
}

var _ ShardHost = (*LockedShards)(nil)

// NewLockedShards hosts shards.
func NewLockedShards(shards []*Shard) *LockedShards {
	h := &LockedShards{shards: make([]lockedShard, len(shards))}
	for i, s := range shards {
		h.shards[i].s = s
	}
	return h
}

// Apply implements ShardHost; it never refuses.
func (h *LockedShards) Apply(i int, b *ShardBatch) error {
	ls := &h.shards[i]
	ls.mu.Lock()
	ls.s.Apply(b)
	ls.mu.Unlock()
	b.Done()
	return nil
}

// Match implements ShardHost, shard after shard.
func (h *LockedShards) Match(ctx context.Context, qs []*ShardQuery) error {
	for i, q := range qs {
		if q == nil {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		ls := &h.shards[i]
		ls.mu.Lock()
		ls.s.Match(q)
		ls.mu.Unlock()
	}
	return nil
}

// Prune implements ShardHost.
func (h *LockedShards) Prune(i int) error {
	ls := &h.shards[i]
	ls.mu.Lock()
	ls.s.Prune()
	ls.mu.Unlock()
	return nil
}
