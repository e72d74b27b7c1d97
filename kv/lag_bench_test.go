package kv

import (
	"testing"
	"time"
)

// BenchmarkIngestEventLag measures what observing switchyard_kv_event_lag_seconds adds to
// ingesting a batch (one store of 4 blocks, one remove of 2): "untimed" batches carry no
// timestamp and skip the observation, the baseline beside "timed".
func BenchmarkIngestEventLag(b *testing.B) {
	x := newTestIndex(b, 4, 1<<20)
	register(b, x, "a", 1, 16)
	prompt := seqTokens(0, 64)
	hashes := AppendBlockHashes(nil, prompt, 16)
	for _, bc := range []struct {
		name string
		ts   float64
	}{{"untimed", 0}, {"timed", float64(time.Now().UnixNano()) / 1e9}} {
		b.Run(bc.name, func(b *testing.B) {
			payload, err := NewEncoder().Encode(&EventBatch{TS: bc.ts, Events: []Event{
				{Kind: EventBlockStored, BlockHashes: hashes[:4], TokenIDs: prompt, BlockSize: 16, Medium: MediumGPU},
				{Kind: EventBlockRemoved, BlockHashes: hashes[2:4], Medium: MediumGPU},
			}}, ShapeArray)
			if err != nil {
				b.Fatal(err)
			}
			payload = append([]byte(nil), payload...)
			ing := x.NewIngestor("a", false, nil)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ing.Apply(payload, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
