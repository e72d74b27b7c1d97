package jinja

import (
	"errors"
	"strings"
	"testing"
)

func TestDecodeJSONValue(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    string // Python repr of the decoded value
		wantErr bool
	}{
		{"object order kept", `{"b": 1, "a": [true, false, null]}`, `{'b': 1, 'a': [True, False, None]}`, false},
		{"numbers", `[0, -12, 1.5, 1e3, -0.0, 12345678901234567890]`, `[0, -12, 1.5, 1000.0, -0.0, 1.2345678901234567e+19]`, false},
		{"escapes", `"a\"b\\c\/d\n\t\u00e9\ud83d\ude00"`, `'a"b\\c/d\n\té😀'`, false},
		{"lone surrogate", `"\ud800x"`, `'\ufffdx'`, false},
		{"invalid UTF-8", "\"a\xffb\"", `'a\ufffdb'`, false},
		{"empty containers", ` { "a" : [ ] , "b" : { } } `, `{'a': [], 'b': {}}`, false},
		{"trailing data", `[1] 2`, "", true},
		{"leading zero", `01`, "", true},
		{"bad literal", `[tru]`, "", true},
		{"unterminated", `["abc`, "", true},
		{"control character", "\"a\nb\"", "", true},
		{"missing colon", `{"a" 1}`, "", true},
		{"too deep", strings.Repeat("[", maxJSONDepth+2), "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := DecodeJSON([]byte(tt.in))
			if tt.wantErr {
				if !errors.Is(err, ErrInvalidJSON) {
					t.Fatalf("decode(%q) = %v, %v; want an ErrInvalidJSON", tt.in, v, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			writeRepr(&b, v)
			if b.String() != tt.want {
				t.Fatalf("decode(%q) = %s, want %s", tt.in, b.String(), tt.want)
			}
		})
	}
}

// TestDecodeJSONString: a lone string decodes as DecodeJSON decodes it; anything else, or a
// string followed by more, is an ErrInvalidJSON.
func TestDecodeJSONString(t *testing.T) {
	for _, in := range []string{`"plain"`, `"a\"b\\c\/d\n\t\u00e9\ud83d\ude00"`, `"\ud800x"`, "\"a\xffb\"", `""`} {
		want, err := DecodeJSON([]byte(in))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := DecodeJSONString([]byte(in)); err != nil || got != want {
			t.Errorf("DecodeJSONString(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{``, `1`, `"a" `, `"a"b"`, `"abc`, "\"a\nb\"", `["a"]`} {
		if got, err := DecodeJSONString([]byte(in)); !errors.Is(err, ErrInvalidJSON) {
			t.Errorf("DecodeJSONString(%q) = %q, %v; want an ErrInvalidJSON", in, got, err)
		}
	}
}
