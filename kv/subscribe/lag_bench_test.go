package subscribe

import (
	"testing"
	"time"

	"switchyard/kv/events"
	"switchyard/kv/hashing"
	"switchyard/kv/internal/kvtest"
)

// BenchmarkIngestEventLag measures what observing switchyard_kv_event_lag_seconds adds to
// ingesting a batch (one store of 4 blocks, one remove of 2): "untimed" batches carry no
// timestamp and skip the observation, the baseline beside "timed".
func BenchmarkIngestEventLag(b *testing.B) {
	x := kvtest.NewIndex(b, 4, 1<<20)
	kvtest.Register(b, x, "a", 1, 16)
	prompt := kvtest.SeqTokens(0, 64)
	hashes := hashing.AppendBlockHashes(nil, prompt, 16)
	for _, bc := range []struct {
		name string
		ts   float64
	}{{"untimed", 0}, {"timed", float64(time.Now().UnixNano()) / 1e9}} {
		b.Run(bc.name, func(b *testing.B) {
			payload, err := events.NewEncoder().Encode(&events.EventBatch{TS: bc.ts, Events: []events.Event{
				{Kind: events.EventBlockStored, BlockHashes: hashes[:4], TokenIDs: prompt, BlockSize: 16, Medium: events.MediumGPU},
				{Kind: events.EventBlockRemoved, BlockHashes: hashes[2:4], Medium: events.MediumGPU},
			}}, events.ShapeArray)
			if err != nil {
				b.Fatal(err)
			}
			payload = append([]byte(nil), payload...)
			ing := NewIngestor(x, "a", false, nil)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ing.Apply(payload, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
