//go:build !race

package kv

import (
	"context"
	"testing"
)

// TestHotPathAllocations locks in the allocation budget of the request and ingest paths on
// the locked host: a lookup, a batch of writes, and an ingested payload allocate nothing
// once their pooled buffers are warm.
func TestHotPathAllocations(t *testing.T) {
	x := newTestIndex(t, 4, 1<<20)
	ids := register(t, x, "a", 1, 16)
	prompt := seqTokens(0, 4096)
	hold(t, x, ids[0], prompt, 16, TierGPU)
	ctx := context.Background()
	var l Lookup
	if n := testing.AllocsPerRun(50, func() { _ = x.Lookup(ctx, "m", prompt, &l) }); n != 0 {
		t.Errorf("lookup: %v allocations, want 0", n)
	}
	hashes := AppendBlockHashes(nil, prompt, 16)
	w := x.NewWriter()
	if n := testing.AllocsPerRun(50, func() {
		for _, h := range hashes[:64] {
			w.Store(ids[0], x.Owners().Epoch(ids[0]), h, TierGPU)
		}
		w.Flush()
	}); n != 0 {
		t.Errorf("writes: %v allocations, want 0", n)
	}
	payload, err := NewEncoder().Encode(&EventBatch{Events: []Event{
		{Kind: EventBlockStored, BlockHashes: hashes[:4], TokenIDs: prompt[:64], BlockSize: 16, Medium: MediumGPU},
		{Kind: EventBlockRemoved, BlockHashes: hashes[2:4], Medium: MediumGPU},
	}}, ShapeArray)
	if err != nil {
		t.Fatal(err)
	}
	payload = append([]byte(nil), payload...)
	ing := x.NewIngestor("a", false, nil)
	if _, err := ing.Apply(payload, 0); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(50, func() { _, _ = ing.Apply(payload, 0) }); n != 0 {
		t.Errorf("ingest: %v allocations, want 0", n)
	}
}
