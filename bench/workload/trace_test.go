package workload

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"switchyard/tokenizer"
)

// smallTrace has three conversations' worth of prefix sharing in 4-token blocks: line 3
// extends line 1's two blocks, line 4 repeats line 2 exactly, and the lines are out of
// timestamp order.
const smallTrace = `{"timestamp": 0, "input_length": 7, "output_length": 3, "hash_ids": [10, 11]}
{"timestamp": 250, "input_length": 4, "output_length": 900, "hash_ids": [20]}

{"timestamp": 100.5, "input_length": 10, "output_length": 2, "hash_ids": [10, 11, 12], "extra": "ignored"}
{"timestamp": 400, "input_length": 4, "output_length": 1, "hash_ids": [20]}
`

func TestReadTrace(t *testing.T) {
	w, err := ReadTrace(strings.NewReader(smallTrace), TraceConfig{Name: "small", BlockSize: 4, MaxOutput: 500}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if w.Name != "small" || !w.Replay || len(w.Requests) != 4 {
		t.Fatalf("workload %q replay %v, %d requests", w.Name, w.Replay, len(w.Requests))
	}
	// Sorted by timestamp: lines 1, 4 (100.5 ms), 2, 5.
	wantAt := []time.Duration{0, 100500 * time.Microsecond, 250 * time.Millisecond, 400 * time.Millisecond}
	wantClass := []string{"l1", "l4", "l2", "l5"}
	wantOut := []int{3, 2, 500, 1}
	wantLen := []int{7, 10, 4, 4}
	for i, r := range w.Requests {
		if r.Index != i || r.At != wantAt[i] || r.Class != wantClass[i] || r.MaxTokens != wantOut[i] || r.After != -1 ||
			r.Tokens == nil || r.Tokens.Len != wantLen[i] || len(r.Messages) != 0 {
			t.Errorf("request %d: %+v", i, r)
		}
	}
	if w.Span() != 400*time.Millisecond {
		t.Errorf("span %v", w.Span())
	}
	tok := tokenizer.NewSimple()
	prompt := func(i int) []uint32 {
		p, err := w.Requests[i].Prompt(tok)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	a, b, c, d := prompt(0), prompt(1), prompt(2), prompt(3)
	if len(a) != 7 || len(b) != 10 || len(c) != 4 {
		t.Fatalf("prompt lengths %d %d %d", len(a), len(b), len(c))
	}
	// Shared hash IDs are shared tokens, a partial last block is the block's first tokens,
	// and different hash IDs differ.
	if !slices.Equal(a, b[:7]) || !slices.Equal(c, d) || slices.Equal(a[:4], c) || slices.Equal(b[8:], a[4:6]) {
		t.Errorf("prefix sharing broken: %v %v %v %v", a, b, c, d)
	}
	for _, id := range b {
		if id < tokenizer.ByteTokens || id >= tokenizer.VocabSize {
			t.Errorf("token %d outside the built-in tokenizer's hashed pieces", id)
		}
	}
	var ids []uint32
	if err := json.Unmarshal(w.Requests[1].Tokens.AppendJSONIDs(nil), &ids); err != nil || !slices.Equal(ids, b) {
		t.Errorf("JSON IDs %v, %v; want %v", ids, err, b)
	}
	// Another seed, other tokens.
	w2, _ := ReadTrace(strings.NewReader(smallTrace), TraceConfig{BlockSize: 4}, 2)
	if p, _ := w2.Requests[0].Prompt(tok); slices.Equal(p, a) || w2.Name != NameTrace || w2.Requests[2].MaxTokens != 900 {
		t.Errorf("seed 2: %v; name %q", p, w2.Name)
	}
}

// TestReadTraceChat: chat text has exactly the trace's token count under the built-in
// tokenizer and keeps the prefix sharing after the chat template.
func TestReadTraceChat(t *testing.T) {
	w, err := ReadTrace(strings.NewReader(smallTrace), TraceConfig{BlockSize: 4, Chat: true}, 1)
	if err != nil {
		t.Fatal(err)
	}
	tok := tokenizer.NewSimple()
	for _, r := range w.Requests {
		if got := tok.Count(r.Tokens.Messages()[0].Content); got != r.Tokens.Len {
			t.Errorf("request %d: %d tokens of text, want %d", r.Index, got, r.Tokens.Len)
		}
	}
	a, _ := w.Requests[0].Prompt(tok)
	b, _ := w.Requests[1].Prompt(tok)
	// The template's prefix, then the 7 tokens of the shared blocks.
	head := tok.Count("<|user|>\n")
	if len(a) < head+7 || !slices.Equal(a[:head+7], b[:head+7]) {
		t.Errorf("chat prompts do not share their prefix: %v / %v", a, b)
	}
}

func TestReadTraceMaxRequests(t *testing.T) {
	w, err := ReadTrace(strings.NewReader(smallTrace), TraceConfig{BlockSize: 4, MaxRequests: 2}, 1)
	if err != nil {
		t.Fatal(err)
	}
	// The first two lines, then ordered.
	if len(w.Requests) != 2 || w.Requests[0].Class != "l1" || w.Requests[1].Class != "l2" {
		t.Fatalf("requests %+v", w.Requests)
	}
}

func TestReadTraceRejects(t *testing.T) {
	long := `{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [` + strings.Repeat("1,", MaxTraceLine/2) + `1]}`
	tests := []struct {
		name, trace string
		cfg         TraceConfig
		want        string
	}{
		{name: "empty", trace: "\n\n", want: "no requests"},
		{name: "not JSON", trace: "{\"timestamp\": 0}\nnope\n", want: "line 1: invalid trace: input_length is missing"},
		{name: "syntax", trace: `{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}` + "\n{\n", want: "line 2"},
		{name: "negative timestamp", trace: `{"timestamp": -1, "input_length": 4, "output_length": 1, "hash_ids": [1]}`, want: "timestamp -1"},
		{name: "zero input", trace: `{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}`, want: "input_length 0"},
		{name: "huge output", trace: `{"timestamp": 0, "input_length": 4, "output_length": 99999999999, "hash_ids": [1]}`, want: "output_length 99999999999"},
		{name: "missing output", trace: `{"timestamp": 0, "input_length": 4, "hash_ids": [1]}`, want: "output_length is missing"},
		{name: "too few hash IDs", trace: `{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}`, want: "1 hash_ids for input_length 5: 4-token blocks need 2"},
		{name: "too many hash IDs", trace: `{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1, 2]}`, want: "need 1"},
		{name: "string hash ID", trace: `{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": ["a"]}`, want: "line 1"},
		{name: "line too long", trace: long, want: "longer than"},
		{name: "bad block size", trace: smallTrace, cfg: TraceConfig{BlockSize: -1}, want: "block_size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.cfg.BlockSize == 0 {
				tt.cfg.BlockSize = 4
			}
			_, err := ReadTrace(strings.NewReader(tt.trace), tt.cfg, 1)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			if !errors.Is(err, ErrInvalidTrace) && !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("error %v wraps neither ErrInvalidTrace nor ErrInvalidConfig", err)
			}
		})
	}
}

// TestOracleOfTrace: the oracle sees the trace's prefix sharing: line 4 hits line 1's two
// whole blocks, line 5 all but the last token of line 2.
func TestOracleOfTrace(t *testing.T) {
	w, err := ReadTrace(strings.NewReader(smallTrace), TraceConfig{BlockSize: 4}, 1)
	if err != nil {
		t.Fatal(err)
	}
	o, err := Oracle(w.Requests, tokenizer.NewSimple(), 4, 1024)
	if err != nil {
		t.Fatal(err)
	}
	// Line 1 stored one whole page (its second block is partial): line 4 hits 4 tokens.
	// Line 5 repeats line 2 but must compute its last token: no whole page.
	if o.PromptTokens != 25 || o.CachedTokens != 4 {
		t.Fatalf("oracle %+v", o)
	}
}

// FuzzReadTrace feeds arbitrary bytes to the trace reader: it must not panic, and what it
// accepts must be consistent.
func FuzzReadTrace(f *testing.F) {
	f.Add([]byte(smallTrace), 4)
	f.Add([]byte(`{"timestamp": 1e300, "input_length": 4, "output_length": 1, "hash_ids": [1]}`), 4)
	f.Add([]byte(`{"timestamp": 0, "input_length": 16777216, "output_length": 1, "hash_ids": [1]}`), 1<<24)
	f.Add([]byte("{}\n[]\nnull\n"), 512)
	f.Fuzz(func(t *testing.T, data []byte, blockSize int) {
		w, err := ReadTrace(strings.NewReader(string(data)), TraceConfig{BlockSize: blockSize, MaxOutput: 64}, 1)
		if err != nil {
			return
		}
		for i, r := range w.Requests {
			p := r.Tokens
			if p == nil || p.Len < 1 || len(p.Blocks) != (p.Len+p.BlockSize-1)/p.BlockSize || r.MaxTokens < 1 || r.MaxTokens > 64 || r.At < 0 {
				t.Fatalf("request %d inconsistent: %+v", i, r)
			}
			if i > 0 && r.At < w.Requests[i-1].At {
				t.Fatalf("request %d arrives before %d", i, i-1)
			}
		}
	})
}
