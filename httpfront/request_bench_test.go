package httpfront

import (
	"encoding/json"
	"strings"
	"testing"
)

func BenchmarkParseRequest(b *testing.B) {
	body := []byte(`{"model":"llama","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi there"}],"max_tokens":64,"temperature":0.7,"stream":true}`)
	var f requestFacts
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if e := parseRequest(routeChat, body, &f); e != nil {
			b.Fatal(e)
		}
	}
}

// BenchmarkValidJSONBaseline is encoding/json's validation of the same body: the baseline.
func BenchmarkValidJSONBaseline(b *testing.B) {
	body := []byte(`{"model":"llama","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi there"}],"max_tokens":64,"temperature":0.7,"stream":true}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if !json.Valid(body) {
			b.Fatal("invalid")
		}
	}
}

func BenchmarkInjectBootstrap(b *testing.B) {
	body := []byte(`{"model":"llama","messages":[{"role":"user","content":"hi"}],"max_tokens":64}`)
	dst := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		dst = injectBootstrap(dst[:0], body, "10.0.0.1", 8998, 0)
	}
}

// BenchmarkParseRequestLongChat parses a chat request of four messages holding 64 KiB of
// prompt text (plain ASCII with a few escapes): the scan of the body, then the walk of its
// messages.
func BenchmarkParseRequestLongChat(b *testing.B) {
	text := strings.Repeat(`The quick brown fox jumps over the lazy dog. \"Quoted\" words\n`, 64<<10/64)
	var body []byte
	body = append(body, `{"model":"llama","messages":[`...)
	for i, role := range []string{"system", "user", "assistant", "user"} {
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, `{"role":"`+role+`","content":"`+text[:len(text)/4]+`"}`...)
	}
	body = append(body, `],"max_tokens":64}`...)
	var f requestFacts
	if e := parseRequest(routeChat, body, &f); e != nil {
		b.Fatal(e)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if e := parseRequest(routeChat, body, &f); e != nil {
			b.Fatal(e)
		}
	}
}

// BenchmarkMessagesWalk reads the role and content of every message of a validated messages
// array (four messages, 64 KiB of text): through members and elems, which only locate the
// values (walk), and through the validating scanner, as they did before (scan, the baseline).
func BenchmarkMessagesWalk(b *testing.B) {
	text := strings.Repeat(`The quick brown fox jumps over the lazy dog. \"Quoted\" words\n`, 16<<10/64)
	msgs := []byte(`[`)
	for i, role := range []string{"system", "user", "assistant", "user"} {
		if i > 0 {
			msgs = append(msgs, ',')
		}
		msgs = append(msgs, `{"role":"`+role+`","content":"`+text+`"}`...)
	}
	msgs = append(msgs, ']')
	v, _, err := scanValue(msgs, 0, 0)
	if err != nil {
		b.Fatal(err)
	}
	var n int
	member := func(key []byte, mv jsonValue) error {
		if keyIs(key, "content") {
			n += len(mv.raw)
		}
		return nil
	}
	for _, walk := range []bool{true, false} {
		name := "scan"
		if walk {
			name = "walk"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(msgs)))
			for b.Loop() {
				n = 0
				if walk {
					_ = v.elems(func(_ int, m jsonValue) error { return m.members(member) })
				} else {
					_, _ = scanArray(v.raw, 0, 1, func(_ int, m jsonValue) error {
						_, err := scanObject(m.raw, 0, 1, member)
						return err
					})
				}
				if n != 4*(len(text)+2) {
					b.Fatalf("content bytes %d, want %d", n, 4*(len(text)+2))
				}
			}
		})
	}
}
