package jsontext

import (
	"encoding/json"
	"testing"
	"unicode/utf8"
)

func TestAppendString(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"plain", "hello", `"hello"`},
		{"empty", "", `""`},
		{"quote and backslash", `a"b\c`, `"a\"b\\c"`},
		{"controls", "\n\r\t\x00\x1f", `"\n\r\t\u0000\u001f"`},
		{"html", "<a&b>", `"\u003ca\u0026b\u003e"`},
		{"multibyte kept", "héllo 世界", `"héllo 世界"`},
		{"invalid byte", "a\xffb", `"a\ufffdb"`},
		{"cut sequence", "\xe4\xb8", `"\ufffd\ufffd"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(AppendString([]byte("x"), tt.in)); got != "x"+tt.want {
				t.Fatalf("AppendString(%q) = %s, want x%s", tt.in, got, tt.want)
			}
		})
	}
}

// FuzzAppendString: the output is one valid JSON string that decodes to the input with each
// invalid byte replaced by U+FFFD.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "hello", "a\"b\\c\n", "<&>", "\xff\xfe", "世界\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := AppendString(nil, s)
		var got string
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("AppendString(%q) = %s is not a JSON string: %v", s, out, err)
		}
		want := make([]rune, 0, len(s))
		for i := 0; i < len(s); {
			r, n := utf8.DecodeRuneInString(s[i:])
			want = append(want, r)
			i += n
		}
		if got != string(want) {
			t.Fatalf("AppendString(%q) decodes to %q, want %q", s, got, string(want))
		}
	})
}
