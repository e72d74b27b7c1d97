package tokenizer

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// pieces cuts text the way Encode does, for inspection.
func pieces(text string) []string {
	var out []string
	for i := 0; i < len(text); {
		end, special := nextPiece(text, i)
		if special {
			out = append(out, text[i:end])
			i = end
			continue
		}
		for j := i; j < end; j += MaxPieceBytes {
			out = append(out, text[j:min(j+MaxPieceBytes, end)])
		}
		i = end
	}
	return out
}

func TestSimplePieces(t *testing.T) {
	tests := []struct {
		name string
		text string
		want []string
	}{
		{"empty", "", nil},
		{"word", "hi", []string{"hi"}},
		{"space joins word", "hi there", []string{"hi", " the", "re"}},
		{"long word splits", "assistant", []string{"assi", "stan", "t"}},
		{"punctuation run", "wait...!", []string{"wait", "...!"}},
		{"space joins punctuation", "a (b)", []string{"a", " (", "b", ")"}},
		{"newline alone", "a\nb", []string{"a", "\n", "b"}},
		{"last space goes to word", "a  b", []string{"a", " ", " b"}},
		{"newline then space", "\n the", []string{"\n", " the"}},
		{"trailing spaces", "a   ", []string{"a", "   "}},
		{"special token", "<|user|>\nhi", []string{"<|user|>", "\n", "hi"}},
		{"space before special", "x <|user|>", []string{"x", " ", "<|user|>"}},
		{"punct before special", "!<|eot|>", []string{"!", "<|eot|>"}},
		{"not special", "<|no space|>", []string{"<|", "no", " spa", "ce", "|>"}},
		{"empty special name", "<||>", []string{"<||>"}},
		{"utf8 is word", "héllo", []string{"h\xc3\xa9l", "lo"}},
		{"digits", "x=12345", []string{"x", "=", "1234", "5"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := pieces(tt.text)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("pieces(%q) = %q, want %q", tt.text, got, tt.want)
			}
			s := NewSimple()
			ids := s.Encode(tt.text)
			if len(ids) != len(tt.want) {
				t.Fatalf("Encode(%q) has %d IDs, want %d", tt.text, len(ids), len(tt.want))
			}
			for i, p := range tt.want {
				if ids[i] != s.ID(p) {
					t.Errorf("ID %d = %d, want ID(%q) = %d", i, ids[i], p, s.ID(p))
				}
			}
			if n := s.Count(tt.text); n != len(ids) {
				t.Errorf("Count = %d, want %d", n, len(ids))
			}
		})
	}
}

func TestSimpleIDs(t *testing.T) {
	s := NewSimple()
	if got := s.Encode("a"); !slices.Equal(got, []uint32{'a'}) {
		t.Errorf("Encode(a) = %v, want [97]", got)
	}
	// Fixed values: changing the hash changes every engine's block hashes.
	if got := s.ID(" the"); got < ByteTokens || got >= VocabSize {
		t.Errorf("ID(\" the\") = %d, want a hashed ID", got)
	}
	a := s.Encode("The quick brown fox jumps over the lazy dog.")
	b := NewSimple().Encode("The quick brown fox jumps over the lazy dog.")
	if !slices.Equal(a, b) {
		t.Fatalf("Encode is not deterministic: %v vs %v", a, b)
	}
	for _, id := range a {
		if id >= VocabSize {
			t.Fatalf("ID %d >= VocabSize", id)
		}
	}
}

func TestSimpleRatio(t *testing.T) {
	text := strings.Repeat("Switchyard routes each request to the engine that already holds most of its "+
		"prompt in cache, while keeping the load on every engine within its admission caps. ", 20)
	n := NewSimple().Count(text)
	bytesPerToken := float64(len(text)) / float64(n)
	if bytesPerToken < 3 || bytesPerToken > 4.5 {
		t.Fatalf("%.2f bytes per token, want roughly 4", bytesPerToken)
	}
}

func TestSimpleDecode(t *testing.T) {
	s := NewSimple()
	tests := []struct {
		name string
		text string
	}{
		{"common words", "the cat and the dog ran"},
		{"capital", "The end."},
		{"special tokens", "<|user|>\nhi\n<|assistant|>\n"},
		{"bytes", "a,b;c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := s.Decode(s.Encode(tt.text)); got != tt.text {
				t.Fatalf("Decode(Encode(%q)) = %q", tt.text, got)
			}
		})
	}
	if got := s.Decode([]uint32{s.ID("zzqx")}); got != "\uFFFD" {
		t.Errorf("Decode(unknown) = %q, want U+FFFD", got)
	}
}

func TestSimpleChatTemplate(t *testing.T) {
	s := NewSimple()
	turn1 := []Message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Name a color."}}
	got, err := s.ApplyChatTemplate(turn1)
	if err != nil {
		t.Fatal(err)
	}
	want := "<|system|>\nYou are terse.\n<|user|>\nName a color.\n<|assistant|>\n"
	if got != want {
		t.Fatalf("template = %q, want %q", got, want)
	}
	turn2 := append(slices.Clone(turn1), Message{Role: "assistant", Content: "Red."}, Message{Role: "user", Content: "Another."})
	got2, err := s.ApplyChatTemplate(turn2)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got2, got) {
		t.Fatalf("turn 1 prompt is not a text prefix of turn 2's")
	}
	ids1, ids2 := s.Encode(got), s.Encode(got2)
	if len(ids2) <= len(ids1) || !slices.Equal(ids2[:len(ids1)], ids1) {
		t.Fatalf("turn 1 tokens are not a prefix of turn 2 tokens")
	}

	errTests := []struct {
		name    string
		msgs    []Message
		wantErr error
	}{
		{"empty", nil, ErrNoMessages},
		{"bad role", []Message{{Role: "robot", Content: "x"}}, ErrInvalidRole},
	}
	for _, tt := range errTests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := s.ApplyChatTemplate(tt.msgs); !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

func FuzzSimpleEncode(f *testing.F) {
	for _, seed := range []string{"", "hello world", "<|user|>\nhi\n<|assistant|>\n", "a  b\n\n c", "<|x", "é€😀", " <|a|> <|"} {
		f.Add(seed)
	}
	s := NewSimple()
	f.Fuzz(func(t *testing.T, text string) {
		ps := pieces(text)
		if strings.Join(ps, "") != text {
			t.Fatalf("pieces do not cover the text: %q", ps)
		}
		for _, p := range ps {
			if len(p) == 0 || (len(p) > MaxPieceBytes && !strings.HasPrefix(p, "<|")) {
				t.Fatalf("bad piece %q", p)
			}
		}
		ids := s.Encode(text)
		if len(ids) != len(ps) || s.Count(text) != len(ids) {
			t.Fatalf("%d IDs, %d pieces, Count %d", len(ids), len(ps), s.Count(text))
		}
		for _, id := range ids {
			if id >= VocabSize {
				t.Fatalf("ID %d out of range", id)
			}
		}
		_ = s.Decode(ids)
	})
}
