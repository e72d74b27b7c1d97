package loadgen

import (
	"strings"
	"testing"
)

// FuzzReadStream feeds arbitrary bytes to the Server-Sent Events reader: it must not panic
// and must keep its figures consistent.
func FuzzReadStream(f *testing.F) {
	f.Add([]byte(sseBody))
	f.Add([]byte(strings.ReplaceAll(sseBody, "\n", "\r\n")))
	f.Add([]byte("data: [DONE]\n\n"))
	f.Add([]byte("data: {\"error\":{\"code\":7}}\n\n"))
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":{\"prompt_tokens\":-5}}\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		clk := &stepClock{}
		start := clk.t
		var r Result
		readStream(strings.NewReader(string(body)), &r, start, clk.now)
		if r.E2E <= 0 || r.TTFT < 0 || r.TTFT > r.E2E || r.ITL < 0 || r.ITL > r.E2E {
			t.Fatalf("inconsistent timing %+v", r)
		}
		if r.TTFT == 0 && r.ITL != 0 {
			t.Fatalf("ITL without a first token: %+v", r)
		}
		if r.Error == "" && !strings.Contains(string(body), "[DONE]") {
			t.Fatalf("no end marker but no error: %+v", r)
		}
	})
}

// FuzzErrorCode feeds arbitrary error bodies to errorCode: it must name something.
func FuzzErrorCode(f *testing.F) {
	f.Add(429, []byte(`{"error":{"code":"overloaded","type":"overloaded_error"}}`))
	f.Add(500, []byte(`{"error":{"code":500}}`))
	f.Add(502, []byte(`<html>`))
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		if errorCode(status, body) == "" {
			t.Fatal("empty error code")
		}
	})
}
