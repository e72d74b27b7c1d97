package tokenizer

import "testing"

func TestValidUTF8(t *testing.T) {
	tests := []struct{ in, want string }{
		{"abc", "abc"},
		{"a\xffb", "a\uFFFDb"},
		{"\xe2\x82", "\uFFFD"},                 // truncated sequence: one replacement
		{"\xe2\x82x", "\uFFFDx"},               // maximal subpart
		{"\xc0\x80", "\uFFFD\uFFFD"},           // overlong: each byte
		{"\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"}, // surrogate
		{"\xf0\x9f\x98", "\uFFFD"},
		{"\xf4\x90\x80\x80", "\uFFFD\uFFFD\uFFFD\uFFFD"},
	}
	for _, tt := range tests {
		if got := ValidUTF8(tt.in); got != tt.want {
			t.Errorf("ValidUTF8(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if got := string(AppendValidUTF8Bytes(nil, []byte(tt.in))); got != tt.want {
			t.Errorf("AppendValidUTF8Bytes(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
