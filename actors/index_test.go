package actors

import (
	"context"
	"errors"
	"testing"
	"time"

	"switchyard/kv"
	"switchyard/kv/hashing"
	"switchyard/kv/index"
)

// actorIndex returns an index.Index whose shards run on index shard actors, and those actors.
func actorIndex(t *testing.T, shards, mailbox int) (*index.Index, *IndexShards) {
	t.Helper()
	var hosted *IndexShards
	x, err := index.New(index.Config{Shards: shards, MaxBlocks: 1 << 20, Host: func(s []*index.Shard) (index.ShardHost, error) {
		sys, _ := newObservedSystem(t, nil)
		h, err := NewIndexShards(s, IndexOptions{Mailbox: mailbox, System: sys})
		hosted = h
		return h, err
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Close() })
	return x, hosted
}

func prompt(base, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(base + i)
	}
	return out
}

// holdPrompt stores tokens' blocks (block size 16) for worker and reports dropped ops.
func holdPrompt(t *testing.T, x *index.Index, worker string, tokens []uint32) int {
	t.Helper()
	ids, err := x.SetWorker(worker, "m", 1, 16)
	if err != nil {
		t.Fatal(err)
	}
	w := x.NewWriter()
	for _, h := range hashing.AppendBlockHashes(nil, tokens, 16) {
		w.Store(ids[0], x.Owners().Epoch(ids[0]), h, index.TierGPU)
	}
	return w.Flush()
}

// syncIndex waits until every shard actor applied the batches handed to it.
func syncIndex(t *testing.T, x *index.Index) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := x.Sync(ctx); err != nil {
		t.Fatal(err)
	}
}

// queries returns one empty query per shard, for IndexShards.Match.
func queries(n int) []*index.ShardQuery {
	qs := make([]*index.ShardQuery, n)
	for i := range qs {
		qs[i] = &index.ShardQuery{}
	}
	return qs
}

func matched(t *testing.T, x *index.Index, tokens []uint32) (map[string]int64, error) {
	t.Helper()
	var l kv.Lookup
	// A deadline of its own: without one the index bounds the lookup by its default 100 ms,
	// which a loaded machine can spend before the shard actors run.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := x.Lookup(ctx, "m", tokens, &l)
	out := map[string]int64{}
	for _, m := range l.Matches {
		out[m.Worker] = m.Tokens
	}
	return out, err
}

func TestIndexShardsServeTheIndex(t *testing.T) {
	x, _ := actorIndex(t, 4, 64)
	long := prompt(0, 20_000)
	if d := holdPrompt(t, x, "a", long); d != 0 {
		t.Fatalf("dropped %d", d)
	}
	if d := holdPrompt(t, x, "b", long[:3008]); d != 0 {
		t.Fatalf("dropped %d", d)
	}
	// Applies are asynchronous: once every shard has applied them, a lookup sees them.
	syncIndex(t, x)
	got, err := matched(t, x, long)
	if err != nil || got["a"] != 20_000 || got["b"] != 3008 {
		t.Fatalf("got %v, err %v", got, err)
	}
	x.RemoveWorker("b")
	if got, _ := matched(t, x, long); len(got) != 1 {
		t.Fatalf("after removal: %v", got)
	}
}

// blockShards makes every shard actor wait on release before handling a message; entered
// receives one value per message an actor started handling.
func blockShards(t testing.TB, h *IndexShards) (entered <-chan struct{}, release func()) {
	ch := make(chan struct{})
	in := make(chan struct{}, 64)
	obsOf(t, h.sys).set(func(any) {
		in <- struct{}{}
		<-ch
	})
	closed := false
	return in, func() {
		if !closed {
			closed = true
			close(ch)
		}
	}
}

func TestIndexShardsRejectFastWhenFull(t *testing.T) {
	x, h := actorIndex(t, 1, 1)
	ids, _ := x.SetWorker("a", "m", 1, 16)
	entered, release := blockShards(t, h)
	defer release()
	// The first batch occupies the actor; the next ones fill the mailbox until one is refused.
	write := func(hash int64) int {
		w := x.NewWriter()
		w.Store(ids[0], x.Owners().Epoch(ids[0]), hash, index.TierGPU)
		return w.Flush()
	}
	if write(1) != 0 {
		t.Fatal("the first batch was refused")
	}
	<-entered
	dropped := 0
	for i := int64(2); i < 100 && dropped == 0; i++ {
		dropped = write(i)
	}
	if dropped != 1 || h.Rejected() != 1 {
		t.Fatalf("dropped %d, rejected %d", dropped, h.Rejected())
	}
	if c := x.Metrics().Ingest(); c.ClearsDropped == 0 {
		t.Fatalf("the owner of a refused batch was not cleared: %+v", c)
	}
	// Lookups read the shards directly: they answer at once while the actor is blocked, with
	// what it applied (nothing yet).
	if got, err := matched(t, x, prompt(0, 32)); err != nil || len(got) != 0 {
		t.Fatalf("lookup beside a blocked shard actor: %v, %v", got, err)
	}
	// Queries through the actor (a lookup's fallback, Sync) queue in the mailbox behind it;
	// once it is full, the next one is refused at once, not after its deadline.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	results := make(chan error, 16)
	for range 16 {
		go func() { results <- h.Match(ctx, queries(1)) }()
	}
	select {
	case err := <-results:
		if !errors.Is(err, index.ErrShardBusy) {
			t.Fatalf("first answer: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no query was refused by the full mailbox")
	}
	release()
	for range 15 {
		if err := <-results; err != nil && !errors.Is(err, index.ErrShardBusy) {
			t.Fatalf("after release: %v", err)
		}
	}
}

func TestIndexShardsLookupDeadline(t *testing.T) {
	x, h := actorIndex(t, 2, 64)
	ids, err := x.SetWorker("a", "m", 1, 16)
	if err != nil {
		t.Fatal(err)
	}
	holdPrompt(t, x, "a", prompt(0, 64))
	syncIndex(t, x)
	_, release := blockShards(t, h)
	defer release()
	// A query through blocked actors ends with its context.
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the deadline has passed
	if err := h.Match(ctx, queries(2)); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	// A lookup does not wait for them: it reads what they applied.
	w := x.NewWriter()
	w.Remove(ids[0], x.Owners().Epoch(ids[0]), hashing.AppendBlockHashes(nil, prompt(0, 64), 16)[0], index.AllTiers)
	if d := w.Flush(); d != 0 {
		t.Fatalf("dropped %d", d)
	}
	if got, err := matched(t, x, prompt(0, 64)); err != nil || got["a"] != 64 {
		t.Fatalf("beside blocked actors: %v, %v", got, err)
	}
	release()
	syncIndex(t, x)
	if got, err := matched(t, x, prompt(0, 64)); err != nil || len(got) != 0 {
		t.Fatalf("after release: %v, %v", got, err)
	}
}

func TestIndexShardsRestartAfterPanic(t *testing.T) {
	x, h := actorIndex(t, 1, 64)
	tokens := prompt(0, 64)
	holdPrompt(t, x, "a", tokens)
	syncIndex(t, x)
	if got, _ := matched(t, x, tokens); got["a"] != 64 {
		t.Fatalf("before: %v", got)
	}
	panicked := make(chan struct{})
	obsOf(t, h.sys).set(func(msg any) {
		if _, ok := msg.(*MatchPrefix); ok {
			select {
			case <-panicked:
			default:
				close(panicked)
				panic("injected")
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := x.Sync(ctx); !errors.Is(err, ErrPanicked) {
		t.Fatalf("the query that hit the panic: %v", err)
	}
	syncIndex(t, x) // the restart (which empties the shard) is handled before this query
	got, err := matched(t, x, tokens)
	if err != nil || len(got) != 0 || h.Panics() != 1 {
		t.Fatalf("after restart: %v, %v, panics %d (the shard restarts empty)", got, err, h.Panics())
	}
	holdPrompt(t, x, "a", tokens)
	syncIndex(t, x)
	if got, _ := matched(t, x, tokens); got["a"] != 64 {
		t.Fatalf("refilled: %v", got)
	}
}

func TestIndexShardsClose(t *testing.T) {
	x, h := actorIndex(t, 2, 64)
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.Apply(0, &index.ShardBatch{}); !errors.Is(err, ErrIndexClosed) {
		t.Fatalf("apply after close: %v", err)
	}
	if _, err := matched(t, x, prompt(0, 16)); err != nil {
		t.Fatalf("a lookup with no owners needs no shard: %v", err)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
}
