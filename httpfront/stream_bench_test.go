package httpfront

import (
	"bytes"
	"strconv"
	"testing"
	"time"
)

// benchEvents is a stream of n events as an engine sends them (an OpenAI chat chunk each,
// the shape SGLang and vLLM send), then [DONE].
func benchEvents(n int) [][]byte {
	evs := make([][]byte, 0, n+1)
	for i := range n {
		evs = append(evs, []byte(`data: {"id":"chatcmpl-0123456789abcdef","object":"chat.completion.chunk","created":1796191549,"model":"bench","choices":[{"index":0,"delta":{"content":" tok`+strconv.Itoa(i)+`"},"logprobs":null,"finish_reason":null}]}`+"\n\n"))
	}
	return append(evs, []byte("data: [DONE]\n\n"))
}

// BenchmarkRelayFrame frames a 64-event stream, one event per engine read, as the relay does
// for each read (event boundaries, the [DONE] event, the SLO's token count). Baseline: one
// scan of the same bytes for a newline (bytes.IndexByte), the floor of finding boundaries.
func BenchmarkRelayFrame(b *testing.B) {
	evs := benchEvents(64)
	size := 0
	for _, e := range evs {
		size += len(e)
	}
	b.Run("relay", func(b *testing.B) {
		b.SetBytes(int64(size))
		b.ReportAllocs()
		for b.Loop() {
			r := relay{}
			r.slo.firstAt = time.Unix(1, 0) // the first token was recorded
			for _, e := range evs {
				ev := r.sse.dataLines
				if len(r.frame(e)) != len(e) {
					b.Fatal("an event was held back")
				}
				r.slo.chunk(r.sse.dataLines-ev, r.slo.firstAt)
			}
			if !r.done || r.slo.events != len(evs) {
				b.Fatalf("done %v, %d data lines, want true, %d", r.done, r.slo.events, len(evs))
			}
		}
	})
	b.Run("baseline_indexbyte", func(b *testing.B) {
		b.SetBytes(int64(size))
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			for _, e := range evs {
				for rest := e; ; {
					i := bytes.IndexByte(rest, '\n')
					if i < 0 {
						break
					}
					n++
					rest = rest[i+1:]
				}
			}
		}
		if n == 0 {
			b.Fatal("no newline found")
		}
	})
}
