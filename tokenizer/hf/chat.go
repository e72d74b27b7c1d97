package hf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"switchyard/tokenizer"
	"switchyard/tokenizer/jinja"
)

// chatTemplate is a compiled chat template with the variables transformers passes to it
// besides the conversation: the special tokens of tokenizer_config.json.
type chatTemplate struct {
	tmpl *jinja.Template
	vars map[string]any
}

func newChatTemplate(src string, vars map[string]any, now func() time.Time) (*chatTemplate, error) {
	tmpl, err := jinja.Compile(src, jinja.Options{Now: now})
	if err != nil {
		return nil, err
	}
	c := &chatTemplate{tmpl: tmpl, vars: make(map[string]any, len(vars))}
	for k, v := range vars {
		c.vars[k] = jinja.FromGo(v)
	}
	return c, nil
}

// render renders the template as transformers' apply_chat_template does: the special
// tokens, messages, tools and documents (None when absent), add_generation_prompt, then
// extra, each overriding the ones before.
func (c *chatTemplate) render(messages any, tools any, addGenerationPrompt bool, extra *jinja.Dict, sizeHint int) (string, error) {
	n := len(c.vars) + 4
	if extra != nil {
		n += extra.Len()
	}
	vars := jinja.NewDict(n)
	for k, v := range c.vars {
		vars.Set(k, v)
	}
	vars.Set("messages", messages)
	vars.Set("tools", tools)
	vars.Set("documents", nil)
	vars.Set("add_generation_prompt", addGenerationPrompt)
	if extra != nil {
		for _, k := range extra.Keys() {
			v, _ := extra.Get(k)
			vars.Set(k, v)
		}
	}
	return c.tmpl.Render(vars, sizeHint)
}

// ChatOptions adjusts a chat rendering. The zero value renders with the generation prompt,
// as the router needs.
type ChatOptions struct {
	// NoGenerationPrompt renders add_generation_prompt=False.
	NoGenerationPrompt bool
	// Tools is the JSON array of tool definitions passed to the template as tools, or nil.
	Tools json.RawMessage
	// Extra is a JSON object of further template variables (e.g. {"enable_thinking": false}),
	// or nil.
	Extra json.RawMessage
}

// ApplyChatTemplate renders messages with the model's chat template and the generation prompt,
// as transformers' apply_chat_template(messages, add_generation_prompt=True, tokenize=False).
func (t *Tokenizer) ApplyChatTemplate(messages []tokenizer.Message) (string, error) {
	if t.chat == nil {
		return "", fmt.Errorf("cannot apply chat template: %w", ErrNoChatTemplate)
	}
	if len(messages) == 0 {
		return "", fmt.Errorf("cannot apply chat template: %w", tokenizer.ErrNoMessages)
	}
	list := make([]any, len(messages))
	for i, m := range messages {
		d := jinja.NewDict(2)
		d.Set("role", m.Role)
		d.Set("content", m.Content)
		list[i] = d
	}
	n := 256
	for _, m := range messages {
		n += len(m.Content) + 32
	}
	s, err := t.chat.render(list, nil, true, nil, n)
	if err != nil {
		return "", fmt.Errorf("cannot apply chat template: %w", err)
	}
	return s, nil
}

// EncodeChat returns the token IDs of the rendered conversation, encoded as the engine encodes
// apply_chat_template's output: special tokens in the text are recognized and the
// post-processor adds none (the template writes them).
func (t *Tokenizer) EncodeChat(messages []tokenizer.Message) ([]uint32, error) {
	s, err := t.ApplyChatTemplate(messages)
	if err != nil {
		return nil, err
	}
	return t.EncodePlain(s), nil
}

// ChatValues is a conversation already decoded into template values (jinja.DecodeJSON's):
// the router builds them from the request it has parsed, without a second JSON parse.
type ChatValues struct {
	// Messages are the OpenAI chat messages, each a *jinja.Dict, passed to the template as
	// they are.
	Messages []any
	// Tools is the list of tool definitions passed to the template as tools, or nil.
	Tools any
	// Extra holds further template variables (e.g. enable_thinking), or nil.
	Extra *jinja.Dict
	// NoGenerationPrompt renders add_generation_prompt=False.
	NoGenerationPrompt bool
	// SizeHint is the expected length of the rendering in bytes, 0 for none.
	SizeHint int
}

// RenderChatValues renders a conversation given as template values with the model's chat
// template.
func (t *Tokenizer) RenderChatValues(v ChatValues) (string, error) {
	if t.chat == nil {
		return "", fmt.Errorf("cannot apply chat template: %w", ErrNoChatTemplate)
	}
	if len(v.Messages) == 0 {
		return "", fmt.Errorf("cannot apply chat template: %w", tokenizer.ErrNoMessages)
	}
	s, err := t.chat.render(v.Messages, v.Tools, !v.NoGenerationPrompt, v.Extra, max(v.SizeHint, 256))
	if err != nil {
		return "", fmt.Errorf("cannot apply chat template: %w", err)
	}
	return s, nil
}

// RenderChatJSON renders a JSON array of OpenAI chat messages, passed to the template as they
// are (every field, in order: tool_calls, reasoning_content, content parts...).
func (t *Tokenizer) RenderChatJSON(messages []byte, opts ChatOptions) (string, error) {
	if t.chat == nil {
		return "", fmt.Errorf("cannot apply chat template: %w", ErrNoChatTemplate)
	}
	list, err := decodeJSONValue(messages)
	if err != nil {
		return "", fmt.Errorf("cannot apply chat template: messages: %w", err)
	}
	items, ok := list.([]any)
	if !ok {
		return "", fmt.Errorf("cannot apply chat template: messages: %w: want a JSON array", ErrInvalidMessages)
	}
	v := ChatValues{Messages: items, NoGenerationPrompt: opts.NoGenerationPrompt, SizeHint: len(messages) + len(opts.Tools) + 256}
	if len(bytes.TrimSpace(opts.Tools)) > 0 {
		if v.Tools, err = decodeJSONValue(opts.Tools); err != nil {
			return "", fmt.Errorf("cannot apply chat template: tools: %w", err)
		}
	}
	if len(bytes.TrimSpace(opts.Extra)) > 0 {
		e, err := decodeJSONValue(opts.Extra)
		if err != nil {
			return "", fmt.Errorf("cannot apply chat template: extra: %w", err)
		}
		if v.Extra, ok = e.(*jinja.Dict); !ok {
			return "", fmt.Errorf("cannot apply chat template: extra: %w: want a JSON object", ErrInvalidMessages)
		}
	}
	return t.RenderChatValues(v)
}

// EncodeChatJSON returns the token IDs of RenderChatJSON's rendering (see EncodeChat).
func (t *Tokenizer) EncodeChatJSON(messages []byte, opts ChatOptions) ([]uint32, error) {
	s, err := t.RenderChatJSON(messages, opts)
	if err != nil {
		return nil, err
	}
	return t.EncodePlain(s), nil
}

// HasChatTemplate reports whether the tokenizer has a chat template.
func (t *Tokenizer) HasChatTemplate() bool { return t.chat != nil }

// ErrInvalidMessages is wrapped when the JSON given to RenderChatJSON is malformed.
var ErrInvalidMessages = errors.New("invalid chat messages")

// decodeJSONValue decodes JSON into template values; its errors wrap ErrInvalidMessages.
func decodeJSONValue(data []byte) (any, error) {
	v, err := jinja.DecodeJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidMessages, err)
	}
	return v, nil
}
