package mockengine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"switchyard/tokenizer"
	"switchyard/tokenizer/hf"
)

// chatJSONTokenizer is a tokenizer that renders the OpenAI messages of a request as sent,
// with the tools and template variables, as a Jinja chat template engine does (hf.Tokenizer).
type chatJSONTokenizer interface {
	EncodeChatJSON(messages []byte, opts hf.ChatOptions) ([]uint32, error)
	HasChatTemplate() bool
}

// plainEncoder encodes text without the post-processor's special tokens (hf.Tokenizer).
type plainEncoder interface {
	EncodePlain(text string) []uint32
}

var (
	_ Tokenizer         = (*hf.Tokenizer)(nil)
	_ chatJSONTokenizer = (*hf.Tokenizer)(nil)
	_ plainEncoder      = (*hf.Tokenizer)(nil)
)

// loadTokenizer loads TokenizerPath into Tokenizer when Tokenizer is unset. The chunk cache
// is left at its default: the engine re-encodes resent histories like the router.
func (c *Config) loadTokenizer() error {
	if c.Tokenizer != nil || c.TokenizerPath == "" {
		return nil
	}
	tk, err := hf.Load(c.TokenizerPath, hf.Options{Logger: c.Logger})
	if err != nil {
		return err
	}
	c.Tokenizer = tk
	return nil
}

// chatTemplateFields are the members of a chat request a Jinja chat template reads besides
// the sampling parameters: the messages as sent, the tools, and further template variables.
type chatTemplateFields struct {
	Messages           json.RawMessage `json:"messages"`
	Tools              json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs"`
}

// encodeChatJSON encodes a chat request with tk's chat template as SGLang does for a text
// model: the messages prepared by prepareMessages, the generation prompt, the tools unless
// tool_choice is "none", and chat_template_kwargs as template variables. The Switchyard
// router counts the same way.
func encodeChatJSON(tk chatJSONTokenizer, body []byte) ([]uint32, error) {
	var f chatTemplateFields
	if err := json.Unmarshal(body, &f); err != nil {
		return nil, badf("invalid request body: %v", err)
	}
	msgs, err := prepareMessages(f.Messages)
	if err != nil {
		return nil, err
	}
	f.Messages = msgs
	var opts hf.ChatOptions
	if t := bytes.TrimSpace(f.Tools); len(t) > 0 && t[0] == '[' && !bytes.Equal(bytes.TrimSpace(f.ToolChoice), []byte(`"none"`)) {
		opts.Tools = t
	}
	if k := bytes.TrimSpace(f.ChatTemplateKwargs); len(k) > 0 && k[0] == '{' {
		opts.Extra = k
	}
	ids, err := tk.EncodeChatJSON(f.Messages, opts)
	if err != nil {
		return nil, badf("%v", err)
	}
	return ids, nil
}

// encodeWord encodes one output word: without the post-processor's tokens when tok can.
func encodeWord(tok tokenizer.Tokenizer, text string) []uint32 {
	if p, ok := tok.(plainEncoder); ok {
		return p.EncodePlain(text)
	}
	return tok.Encode(text)
}

// prepareMessages prepares chat messages for a text chat template as SGLang does before
// applying it: members whose value is null are dropped, a null or absent content becomes "",
// a list of content parts becomes the texts of its "text" parts joined by a space, and a
// tool call's function.arguments string is parsed into the JSON object it must hold.
func prepareMessages(raw json.RawMessage) (json.RawMessage, error) {
	var msgs []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, badf("messages: %v", err)
	}
	for i, m := range msgs {
		for k, v := range m {
			if isNull(v) {
				delete(m, k)
			}
		}
		content, err := contentText(m["content"])
		if err != nil {
			return nil, badf("messages[%d].content: %v", i, err)
		}
		m["content"] = content
		if calls, ok := m["tool_calls"]; ok {
			prepared, err := parseToolArguments(calls)
			if err != nil {
				return nil, badf("messages[%d].tool_calls: %v", i, err)
			}
			m["tool_calls"] = prepared
		}
	}
	return json.Marshal(msgs)
}

func isNull(v json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(v), []byte("null")) }

// contentText returns a message content as a JSON string (see prepareMessages).
func contentText(v json.RawMessage) (json.RawMessage, error) {
	v = bytes.TrimSpace(v)
	switch {
	case len(v) == 0:
		return json.RawMessage(`""`), nil
	case v[0] == '"':
		return v, nil
	case v[0] != '[':
		return nil, errors.New("must be a string, a list of parts or null")
	}
	var parts []map[string]json.RawMessage
	if err := json.Unmarshal(v, &parts); err != nil {
		return nil, err
	}
	var texts []string
	for _, p := range parts {
		var typ, text string
		if json.Unmarshal(p["type"], &typ) != nil || typ != "text" || json.Unmarshal(p["text"], &text) != nil {
			continue
		}
		texts = append(texts, text)
	}
	return json.Marshal(strings.Join(texts, " "))
}

// parseToolArguments replaces every function.arguments string of a tool_calls list with the
// JSON object it holds.
func parseToolArguments(v json.RawMessage) (json.RawMessage, error) {
	var calls []map[string]json.RawMessage
	if err := json.Unmarshal(v, &calls); err != nil {
		return v, nil // not a list of objects: passed as sent
	}
	for i, c := range calls {
		var fn map[string]json.RawMessage
		if json.Unmarshal(c["function"], &fn) != nil || fn == nil {
			continue
		}
		var args string
		if json.Unmarshal(fn["arguments"], &args) != nil {
			continue
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(args), &obj); err != nil || obj == nil {
			return nil, fmt.Errorf("[%d].function.arguments must be a JSON object", i)
		}
		fn["arguments"] = json.RawMessage(args)
		b, err := json.Marshal(fn)
		if err != nil {
			return nil, err
		}
		c["function"] = b
	}
	return json.Marshal(calls)
}
