package jinja

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// jinjaCases is testdata/jinja.json: small templates rendered by Jinja2 as transformers
// configures it (tokenizer/hf/testdata/gen_chat.py), with the context they render in.
type jinjaCases struct {
	Context json.RawMessage `json:"context"`
	Cases   []struct {
		Template string  `json:"template"`
		Output   *string `json:"output"`
		Error    string  `json:"error"`
	} `json:"cases"`
}

// fixedNow is the instant gen_chat.py gives strftime_now.
var fixedNow = func() time.Time { return time.Date(2025, 7, 26, 14, 30, 5, 0, time.UTC) }

func TestJinjaParity(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "jinja.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases jinjaCases
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases.Cases {
		t.Run(c.Template, func(t *testing.T) {
			ctx, err := DecodeJSON(cases.Context)
			if err != nil {
				t.Fatal(err)
			}
			got, err := renderString(c.Template, ctx.(*Dict))
			switch {
			case c.Output == nil && err == nil:
				t.Fatalf("rendered %q, want the error %s", got, c.Error)
			case c.Output == nil:
				if !errors.Is(err, ErrTemplate) {
					t.Fatalf("error %v does not wrap ErrTemplate", err)
				}
				if raised := strings.Contains(c.Template, "raise_exception"); errors.Is(err, ErrRaised) != raised {
					t.Fatalf("error %v: wraps ErrRaised %v, want %v", err, errors.Is(err, ErrRaised), raised)
				}
			case err != nil:
				t.Fatal(err)
			case got != *c.Output:
				t.Fatalf("got  %q\nwant %q", got, *c.Output)
			}
		})
	}
}

// renderString compiles and renders one template with ctx as its variables.
func renderString(src string, ctx *Dict) (string, error) {
	tmpl, err := Compile(src, Options{Now: fixedNow})
	if err != nil {
		return "", err
	}
	return tmpl.Render(ctx, 0)
}

func TestJinjaCompileErrors(t *testing.T) {
	tests := []struct {
		name, src string
	}{
		{"unclosed tag", "{{ x "},
		{"unclosed block", "{% if x %}y"},
		{"unknown statement", "{% include 'x' %}"},
		{"stray end", "{% endif %}"},
		{"bad expression", "{{ 1 + }}"},
		{"unterminated string", "{{ 'abc }}"},
		{"unclosed comment", "{# x"},
		{"recursive loop", "{% for x in y recursive %}{% endfor %}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := parseTemplate(tt.src); !errors.Is(err, ErrTemplate) {
				t.Fatalf("parseTemplate(%q) = %v, want an ErrTemplate", tt.src, err)
			}
		})
	}
}
