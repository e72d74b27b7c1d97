package loadgen

import (
	"bufio"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkReadStream measures parsing one streamed response of n tokens, the load
// generator's per-request cost on the streaming path.
func BenchmarkReadStream(b *testing.B) {
	chunk := `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"bench","choices":[{"index":0,"delta":{"content":" abc"},"logprobs":null,"finish_reason":null}]}` + "\n\n"
	tail := `data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}` + "\n\n" +
		`data: {"choices":[],"usage":{"prompt_tokens":2200,"total_tokens":2232,"completion_tokens":32,"prompt_tokens_details":{"cached_tokens":2048}}}` + "\n\ndata: [DONE]\n\n"
	for _, n := range []int{1, 32, 256} {
		body := strings.Repeat(chunk, n) + tail
		b.Run(strconv.Itoa(n)+"_tokens", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			now := time.Now()
			clock := func() time.Time { return now }
			br := bufio.NewReaderSize(nil, streamBuffer)
			sr := strings.NewReader(body)
			for b.Loop() {
				var r Result
				sr.Reset(body)
				br.Reset(sr)
				readStream(br, &r, now, clock)
				if r.CompletionTokens != 32 {
					b.Fatal(r)
				}
			}
		})
	}
}

// BenchmarkErrorCode is the baseline cost of decoding an error body.
func BenchmarkErrorCode(b *testing.B) {
	body := []byte(`{"error":{"message":"the router is overloaded","type":"overloaded_error","code":"overloaded"}}`)
	b.ReportAllocs()
	for b.Loop() {
		_ = errorCode(429, body)
	}
}
