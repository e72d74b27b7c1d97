//go:build !race

package subscribe

import (
	"context"
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
}
