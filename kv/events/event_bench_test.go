package events

import (
	"bytes"
	"strconv"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// benchBatch builds a batch of BlockStored events, each with blocks blocks of blockSize
// tokens.
func benchBatch(events, blocks, blockSize int) *EventBatch {
	b := &EventBatch{TS: 1795969854.43, HasDPRank: true}
	tok := uint32(1)
	for i := range events {
		ev := Event{Kind: EventBlockStored, BlockSize: blockSize, Medium: MediumGPU, ParentHash: int64(i), HasParent: i > 0}
		for j := range blocks {
			ev.BlockHashes = append(ev.BlockHashes, int64(i*blocks+j)*-7046029254386353131)
			for range blockSize {
				ev.TokenIDs = append(ev.TokenIDs, tok*2654435761)
				tok++
			}
		}
		b.Events = append(b.Events, ev)
	}
	return b
}

func BenchmarkDecodeEventBatch(b *testing.B) {
	for _, events := range []int{1, 32} {
		for _, shape := range []Shape{ShapeArray, ShapeMap} {
			payload, err := AppendEventBatch(nil, benchBatch(events, 4, 16), shape)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(strconv.Itoa(events)+"ev/"+shape.String(), func(b *testing.B) {
				var d Decoder
				var out EventBatch
				b.ReportAllocs()
				b.SetBytes(int64(len(payload)))
				for b.Loop() {
					if err := d.Decode(payload, &out); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(events)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
			})
		}
		// Baseline: msgpack's generic decoder into interface values.
		payload, _ := AppendEventBatch(nil, benchBatch(events, 4, 16), ShapeArray)
		b.Run(strconv.Itoa(events)+"ev/baseline-msgpack-generic", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			rd := bytes.NewReader(payload)
			dec := msgpack.NewDecoder(rd)
			for b.Loop() {
				rd.Reset(payload)
				dec.Reset(rd)
				var v any
				if err := dec.Decode(&v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkEncodeEventBatch(b *testing.B) {
	batch := benchBatch(32, 4, 16)
	for _, shape := range []Shape{ShapeArray, ShapeMap} {
		b.Run("32ev/"+shape.String(), func(b *testing.B) {
			e := NewEncoder()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.Encode(batch, shape); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
