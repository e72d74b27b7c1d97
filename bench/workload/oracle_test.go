package workload

import (
	"errors"
	"math"
	"testing"

	"switchyard/tokenizer"
)

// ids is a fake Templater whose prompt is the message content's bytes, one token each, so
// tests control prompt tokens exactly.
type ids struct{}

func (ids) Encode(text string) []uint32 {
	out := make([]uint32, len(text))
	for i := range text {
		out[i] = uint32(text[i])
	}
	return out
}

func (ids) Decode([]uint32) string { return "" }

func (ids) ApplyChatTemplate(m []tokenizer.Message) (string, error) {
	s := ""
	for _, x := range m {
		s += x.Content
	}
	return s, nil
}

func req(content string) Request {
	return Request{Messages: []tokenizer.Message{{Role: "user", Content: content}}, After: -1}
}

func rep(c byte, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = c
	}
	return string(b)
}

func TestCachedTokens(t *testing.T) {
	tests := []struct {
		name                     string
		matched, promptLen, page int
		want                     int
	}{
		{"no match", 0, 40, 16, 0},
		{"all pages of a longer prompt", 2, 40, 16, 32},
		{"the last token is always computed", 2, 32, 16, 16},
		{"one token more makes the page usable", 2, 33, 16, 32},
		{"match limited by the prompt", 5, 40, 16, 32},
		{"empty prompt", 3, 0, 16, 0},
		{"bad page size", 3, 40, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CachedTokens(tt.matched, tt.promptLen, tt.page); got != tt.want {
				t.Errorf("CachedTokens(%d, %d, %d) = %d, want %d", tt.matched, tt.promptLen, tt.page, got, tt.want)
			}
		})
	}
}

func TestOracleKnownInputs(t *testing.T) {
	a33, b33 := rep('a', 32)+"x", rep('a', 32)+"y" // share two pages of 16
	tests := []struct {
		name       string
		reqs       []Request
		page, capa int
		wantCached int64
		wantPrompt int64
	}{
		{"first request misses", []Request{req(a33)}, 16, 1024, 0, 33},
		{"repeat hits whole pages but the last token", []Request{req(a33), req(a33)}, 16, 1024, 32, 66},
		{"shared prefix of two pages", []Request{req(a33), req(b33)}, 16, 1024, 32, 66},
		{"a 32-token repeat hits one page", []Request{req(rep('a', 32)), req(rep('a', 32))}, 16, 1024, 16, 64},
		{"unrelated prompts share nothing", []Request{req(rep('a', 40)), req(rep('b', 40))}, 16, 1024, 0, 80},
		// Capacity of two pages: c's pages evict a's, so the second a misses.
		{"eviction beyond capacity", []Request{req(rep('a', 33)), req(rep('c', 33)), req(rep('a', 33))}, 16, 32, 0, 99},
		// Capacity of four pages keeps both.
		{"enough capacity keeps both", []Request{req(rep('a', 33)), req(rep('c', 33)), req(rep('a', 33))}, 16, 64, 32, 99},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Oracle(tt.reqs, ids{}, tt.page, tt.capa)
			if err != nil {
				t.Fatal(err)
			}
			if got.CachedTokens != tt.wantCached || got.PromptTokens != tt.wantPrompt || got.Requests != len(tt.reqs) {
				t.Fatalf("got %+v, want cached %d of %d", got, tt.wantCached, tt.wantPrompt)
			}
			if want := float64(tt.wantCached) / float64(tt.wantPrompt); math.Abs(got.HitRate-want) > 1e-12 {
				t.Errorf("hit rate %v, want %v", got.HitRate, want)
			}
		})
	}
}

func TestOracleEvictsLeavesFirst(t *testing.T) {
	// a is 3 pages; x shares a's first page and adds one. With 3 pages of capacity, storing
	// x evicts a's least recently used leaf (its third page), never the shared first page,
	// which x has just used and which is older than a's other pages.
	a := rep('a', 48) + "!"
	x := rep('a', 16) + rep('x', 16) + "!"
	got, err := Oracle([]Request{req(a), req(x), req(a)}, ids{}, 16, 48)
	if err != nil {
		t.Fatal(err)
	}
	// x hits a's first page (16); the second a hits pages one and two (32) but not the
	// evicted third.
	if got.CachedTokens != 48 {
		t.Errorf("cached %d tokens, want 48", got.CachedTokens)
	}
}

func TestOracleSharedPrefixBound(t *testing.T) {
	// G groups × P prompts, everything fits: every prompt but each group's first hits the
	// system prompt's whole pages.
	tok := tokenizer.NewSimple()
	w, err := SharedPrefix(SharedPrefixConfig{Groups: 3, PromptsPerGroup: 4, SystemPromptLen: 200, QuestionLen: 20, OutputLen: 4}, 9)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Oracle(w.Requests, tok, 16, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	// "<|system|>" "\n" + 200 + "\n" "<|user|>" "\n": the system part is 203 tokens, the
	// question's first token follows; every hit covers the 12 whole pages of the 203 shared
	// tokens (192 tokens).
	want := int64(3*3) * 192
	if got.CachedTokens != want {
		t.Errorf("cached %d, want %d", got.CachedTokens, want)
	}
	if got.PromptTokens != 12*int64(len(tok.Encode(mustRender(t, tok, w.Requests[0])))) {
		t.Errorf("prompt tokens %d", got.PromptTokens)
	}
}

func mustRender(t *testing.T, tok Templater, r Request) string {
	t.Helper()
	s, err := tok.ApplyChatTemplate(r.Messages)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestOracleRejectsBadSizes(t *testing.T) {
	if _, err := Oracle(nil, ids{}, 0, 100); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("page 0: %v", err)
	}
	if _, err := Oracle(nil, ids{}, 16, 8); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("capacity below a page: %v", err)
	}
	got, err := Oracle(nil, ids{}, 16, 16)
	if err != nil || got.HitRate != 0 || got.Requests != 0 {
		t.Errorf("empty: %+v %v", got, err)
	}
}
