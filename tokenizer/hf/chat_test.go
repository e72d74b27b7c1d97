package hf

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"switchyard/tokenizer"
)

// goldenChat is one line of chat.jsonl.gz: a conversation rendered by Jinja2 configured as
// transformers configures it (testdata/gen_chat.py), and its token IDs from the reference
// tokenizer (testdata/gen_golden.mjs).
type goldenChat struct {
	Model               string          `json:"model"`
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	Extra               json.RawMessage `json:"extra"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	Rendered            *string         `json:"rendered"`
	Error               string          `json:"error"`
	IDs                 []uint32        `json:"ids"`
}

func TestChatTemplateParity(t *testing.T) {
	golden := readGolden[goldenChat](t, "chat.jsonl.gz")
	count := map[string]int{}
	for i, g := range golden {
		tk := loadModel(t, g.Model)
		name := fmt.Sprintf("%s conversation %d", g.Model, i)
		opts := ChatOptions{NoGenerationPrompt: !g.AddGenerationPrompt, Tools: g.Tools, Extra: g.Extra}
		got, err := tk.RenderChatJSON(g.Messages, opts)
		if g.Rendered == nil {
			if err == nil {
				t.Errorf("%s: rendered %q, want the error %s", name, got, g.Error)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if got != *g.Rendered {
			t.Errorf("%s: rendering differs:\ngot  %q\nwant %q", name, got, *g.Rendered)
			continue
		}
		ids, err := tk.EncodeChatJSON(g.Messages, opts)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids, g.IDs) {
			t.Errorf("%s: IDs differ from the reference", name)
			continue
		}
		// Conversations of plain string contents also go through ApplyChatTemplate.
		var plain []tokenizer.Message
		if g.AddGenerationPrompt && g.Tools == nil && g.Extra == nil && json.Unmarshal(g.Messages, &plain) == nil && plainOnly(g.Messages) {
			s, err := tk.ApplyChatTemplate(plain)
			if err != nil || s != *g.Rendered {
				t.Errorf("%s: ApplyChatTemplate = %q, %v; want %q", name, s, err, *g.Rendered)
			}
			ids, err := tk.EncodeChat(plain)
			if err != nil || !slices.Equal(ids, g.IDs) {
				t.Errorf("%s: EncodeChat IDs differ from the reference (%v)", name, err)
			}
		}
		count[g.Model]++
	}
	for _, m := range []string{"qwen3", "llama3"} {
		if count[m] < 100 {
			t.Errorf("%s: %d conversations identical to the reference, want at least 100", m, count[m])
		}
	}
	t.Logf("conversations identical to the reference (text and IDs): %v", count)
}

// plainOnly reports whether every message has only a role and a string content.
func plainOnly(messages json.RawMessage) bool {
	var list []map[string]any
	if json.Unmarshal(messages, &list) != nil {
		return false
	}
	for _, m := range list {
		if _, ok := m["content"].(string); !ok || len(m) != 2 {
			return false
		}
	}
	return true
}
