package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

const tinyTokenizer = "../../tokenizer/hf/testdata/tiny"

func TestTokenize(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		stdin   string
		want    string
		wantErr string
	}{
		{"text", []string{"--tokenizer", tinyTokenizer}, "hello world", "[257,108,108,111,272]\n", ""},
		{"tokenizer.json path", []string{"--tokenizer", tinyTokenizer + "/tokenizer.json", "--no-special"}, "<|im_end|>", "[279]\n", ""},
		{"empty", []string{"--tokenizer", tinyTokenizer}, "", "[]\n", ""},
		{"chat", []string{"--tokenizer", tinyTokenizer, "--chat"}, `[{"role":"user","content":"hi"}]`,
			"[278,117,115,260,10,104,105,279,10,278,97,115,115,105,115,116,264,116,10]\n", ""},
		{"chat render", []string{"--tokenizer", tinyTokenizer, "--chat", "--render"}, `[{"role":"user","content":"hi"}]`,
			"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", ""},
		{"chat not an array", []string{"--tokenizer", tinyTokenizer, "--chat"}, `{"role":"user"}`, "", "messages must be an array"},
		// Prepared as the router prepares chats: the text parts of a content list join.
		{"chat content parts", []string{"--tokenizer", tinyTokenizer, "--chat", "--render"},
			`[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"text","text":"there"}]}]`,
			"<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n", ""},
		{"missing tokenizer flag", nil, "x", "", "--tokenizer is required"},
		{"missing tokenizer", []string{"--tokenizer", t.TempDir() + "/none"}, "x", "", "no such file"},
		{"render without chat", []string{"--tokenizer", tinyTokenizer, "--render"}, "x", "", "--render needs --chat"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := tokenize(context.Background(), tt.args, strings.NewReader(tt.stdin), &stdout, &stderr)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if stdout.String() != tt.want {
				t.Fatalf("stdout = %q, want %q", stdout.String(), tt.want)
			}
		})
	}
}
