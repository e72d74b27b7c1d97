//go:build !race

package subscribe

import (
	"context"
	"slices"
	"testing"

	"switchyard/kv"
	"switchyard/kv/events"
	"switchyard/kv/hashing"
	"switchyard/kv/index"
	"switchyard/kv/internal/kvtest"
)

// TestHotPathAllocations locks in the allocation budget of the request and ingest paths on
// the locked host: a lookup, a batch of writes, and an ingested payload allocate nothing
// once their pooled buffers are warm.
func TestHotPathAllocations(t *testing.T) {
	x := kvtest.NewIndex(t, 4, 1<<20)
	ids := kvtest.Register(t, x, "a", 1, 16)
	prompt := kvtest.SeqTokens(0, 4096)
	kvtest.Hold(t, x, ids[0], prompt, 16, index.TierGPU)
	ctx := context.Background()
	var l kv.Lookup
	if n := testing.AllocsPerRun(50, func() { _ = x.Lookup(ctx, "m", prompt, &l) }); n != 0 {
		t.Errorf("lookup: %v allocations, want 0", n)
	}
	hashes := hashing.AppendBlockHashes(nil, prompt, 16)
	w := x.NewWriter()
	if n := testing.AllocsPerRun(50, func() {
		for _, h := range hashes[:64] {
			w.Store(ids[0], x.Owners().Epoch(ids[0]), h, index.TierGPU)
		}
		w.Flush()
	}); n != 0 {
		t.Errorf("writes: %v allocations, want 0", n)
	}
	payload, err := events.NewEncoder().Encode(&events.EventBatch{Events: []events.Event{
		{Kind: events.EventBlockStored, BlockHashes: hashes[:4], TokenIDs: prompt[:64], BlockSize: 16, Medium: events.MediumGPU},
		{Kind: events.EventBlockRemoved, BlockHashes: hashes[2:4], Medium: events.MediumGPU},
	}}, events.ShapeArray)
	if err != nil {
		t.Fatal(err)
	}
	payload = append([]byte(nil), payload...)
	ing := NewIngestor(x, "a", false, nil)
	if _, err := ing.Apply(payload, 0); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(50, func() { _, _ = ing.Apply(payload, 0) }); n != 0 {
		t.Errorf("ingest: %v allocations, want 0", n)
	}

	// A re-keyed engine (hashes of its own, as vLLM's): its blocks are hashed from their
	// token IDs along the chain, a parent's digest read back from the re-key table.
	vllm := []int64{1001, 1002, 1003, 1004, 1005, 1006}
	payload, err = events.NewEncoder().Encode(&events.EventBatch{Events: []events.Event{
		{Kind: events.EventBlockStored, BlockHashes: vllm[:3], TokenIDs: prompt[:48], BlockSize: 16, Medium: events.MediumGPU},
		{Kind: events.EventBlockStored, BlockHashes: vllm[3:], HasParent: true, ParentHash: vllm[2], TokenIDs: prompt[48:96], BlockSize: 16, Medium: events.MediumGPU},
		{Kind: events.EventBlockRemoved, BlockHashes: vllm[4:], Medium: events.MediumGPU},
	}}, events.ShapeArray)
	if err != nil {
		t.Fatal(err)
	}
	payload = append([]byte(nil), payload...)
	kvtest.Register(t, x, "v", 1, 16)
	rekeyed := NewIngestor(x, "v", true, nil)
	if _, err := rekeyed.Apply(payload, 0); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(50, func() { _, _ = rekeyed.Apply(payload, 0) }); n != 0 {
		t.Errorf("re-keyed ingest: %v allocations, want 0", n)
	}
	// The blocks were keyed along the chain: the engine holds the prompt's first four.
	if err := x.Lookup(ctx, "m", prompt[:96], &l); err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(l.Matches, func(m kv.Match) bool { return m.Worker == "v" }); i < 0 || l.Matches[i].Tokens != 64 {
		t.Errorf("re-keyed engine's match in %+v, want 64 tokens", l.Matches)
	}
}
