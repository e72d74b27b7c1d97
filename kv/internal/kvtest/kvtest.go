// Package kvtest holds the test helpers that the tests of several kv sub-packages share: an
// index on locked shards, a registered worker, held blocks, a lookup as a map and the heap a
// structure keeps (HeapGrowth). Only tests import it. The index package's own tests keep
// their copies: they live inside that package, which this one imports (its external tests,
// package index_test, use this one).
package kvtest

import (
	"cmp"
	"context"
	"runtime"
	"slices"
	"testing"

	"switchyard/kv"
	"switchyard/kv/index"
)

// SeqTokens returns the n tokens base, base+1, ...
func SeqTokens(base, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(base + i)
	}
	return out
}

// NewIndex returns an index of shards shards and maxBlocks blocks on locked shards, closed
// when the test ends.
func NewIndex(t testing.TB, shards, maxBlocks int) *index.Index {
	t.Helper()
	return NewKeyedIndex(t, shards, maxBlocks, index.BlockKeyEngine)
}

// NewKeyedIndex is NewIndex keyed by key (index.Config.BlockKey).
func NewKeyedIndex(t testing.TB, shards, maxBlocks int, key string) *index.Index {
	t.Helper()
	x, err := index.New(index.Config{Shards: shards, MaxBlocks: maxBlocks, BlockKey: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Close() })
	return x
}

// Register registers worker with dp ranks and block size bs for model "m".
func Register(t testing.TB, x *index.Index, worker string, dp, bs int) []index.OwnerID {
	t.Helper()
	ids, err := x.SetWorker(worker, "m", dp, bs)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// Hold stores the blocks of tokens for owner id in tiers and returns their keys (the index's:
// SGLang's hashes, or the router's own keys).
func Hold(t testing.TB, x *index.Index, id index.OwnerID, tokens []uint32, bs int, tiers index.Tiers) []int64 {
	t.Helper()
	hs := x.AppendBlockKeys(nil, tokens, bs)
	w := x.NewWriter()
	for _, h := range hs {
		w.Store(id, x.Owners().Epoch(id), h, tiers)
	}
	if d := w.Flush(); d != 0 {
		t.Fatalf("%d ops dropped", d)
	}
	return hs
}

// Lookup returns each worker's matched tokens for tokens of model, failing the test when the
// matches are not sorted by worker or name a worker twice.
func Lookup(t testing.TB, x *index.Index, model string, tokens []uint32) map[string]int64 {
	t.Helper()
	var l kv.Lookup
	if err := x.Lookup(context.Background(), model, tokens, &l); err != nil {
		t.Fatal(err)
	}
	if !slices.IsSortedFunc(l.Matches, func(a, b kv.Match) int { return cmp.Compare(a.Worker, b.Worker) }) {
		t.Fatalf("matches not sorted: %v", l.Matches)
	}
	out := map[string]int64{}
	for _, m := range l.Matches {
		if _, dup := out[m.Worker]; dup {
			t.Fatalf("worker %s twice in %v", m.Worker, l.Matches)
		}
		out[m.Worker] = m.Tokens
	}
	return out
}

// HeapGrowth returns the live heap, in bytes, that build leaves allocated: the heap after a
// collection before build runs and after it, with build's result kept alive until the second
// reading. The heap is the process's: what another goroutine allocates or frees in between
// counts too.
func HeapGrowth(build func() any) int64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	kept := build()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(kept)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc)
}
