package hf

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"switchyard/tokenizer"
)

// chatTemplate is a compiled chat template with the variables transformers passes to it
// besides the conversation: the special tokens of tokenizer_config.json.
type chatTemplate struct {
	body []stmt
	vars map[string]any
	now  func() time.Time
}

func newChatTemplate(src string, vars map[string]any, now func() time.Time) (*chatTemplate, error) {
	body, err := parseTemplate(src)
	if err != nil {
		return nil, err
	}
	c := &chatTemplate{body: body, vars: make(map[string]any, len(vars)), now: now}
	for k, v := range vars {
		c.vars[k] = fromGo(v)
	}
	return c, nil
}

// render renders the template as transformers' apply_chat_template does: messages, tools and
// documents (None when absent), add_generation_prompt, the special tokens, then extra.
func (c *chatTemplate) render(messages any, tools any, addGenerationPrompt bool, extra *dict, sizeHint int) (string, error) {
	root := newScope(nil)
	for k, v := range c.vars {
		root.vars[k] = v
	}
	root.vars["messages"] = messages
	root.vars["tools"] = tools
	root.vars["documents"] = nil
	root.vars["add_generation_prompt"] = addGenerationPrompt
	if extra != nil {
		for _, k := range extra.keys {
			root.vars[k] = extra.m[k]
		}
	}
	r := &renderer{now: c.now}
	r.out.Grow(sizeHint)
	err := r.execBody(c.body, newScope(root))
	switch {
	case errors.Is(err, errBreak), errors.Is(err, errContinue):
		return "", fmt.Errorf("%w: %v", ErrTemplate, err)
	case err != nil:
		return "", err
	}
	return r.out.String(), nil
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
		d := newDict(2)
		d.set("role", m.Role)
		d.set("content", m.Content)
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
	if len(items) == 0 {
		return "", fmt.Errorf("cannot apply chat template: %w", tokenizer.ErrNoMessages)
	}
	var tools any
	if len(bytes.TrimSpace(opts.Tools)) > 0 {
		if tools, err = decodeJSONValue(opts.Tools); err != nil {
			return "", fmt.Errorf("cannot apply chat template: tools: %w", err)
		}
	}
	var extra *dict
	if len(bytes.TrimSpace(opts.Extra)) > 0 {
		v, err := decodeJSONValue(opts.Extra)
		if err != nil {
			return "", fmt.Errorf("cannot apply chat template: extra: %w", err)
		}
		if extra, ok = v.(*dict); !ok {
			return "", fmt.Errorf("cannot apply chat template: extra: %w: want a JSON object", ErrInvalidMessages)
		}
	}
	s, err := t.chat.render(items, tools, !opts.NoGenerationPrompt, extra, len(messages)+len(opts.Tools)+256)
	if err != nil {
		return "", fmt.Errorf("cannot apply chat template: %w", err)
	}
	return s, nil
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

// decodeJSONValue decodes JSON into template values, keeping the order of object keys and
// telling integers (int64) from other numbers (float64), as Python's json module does. It is
// a hand-written parser: encoding/json's token API costs several times more on the request
// path. Ill-formed UTF-8 in strings is replaced as validUTF8 describes.
func decodeJSONValue(data []byte) (any, error) {
	p := jsonParser{data: data}
	v, err := p.value(0)
	if err == nil {
		p.space()
		if p.i != len(p.data) {
			err = p.errorf("trailing data")
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidMessages, err)
	}
	return v, nil
}

// maxJSONDepth bounds the nesting of decoded JSON.
const maxJSONDepth = 1000

type jsonParser struct {
	data []byte
	i    int
}

func (p *jsonParser) errorf(format string, args ...any) error {
	return fmt.Errorf("offset %d: %s", p.i, fmt.Sprintf(format, args...))
}

func (p *jsonParser) space() {
	for p.i < len(p.data) {
		switch p.data[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *jsonParser) value(depth int) (any, error) {
	if depth > maxJSONDepth {
		return nil, p.errorf("nested deeper than %d", maxJSONDepth)
	}
	p.space()
	if p.i >= len(p.data) {
		return nil, p.errorf("unexpected end of input")
	}
	switch c := p.data[p.i]; {
	case c == '{':
		p.i++
		d := newDict(4)
		p.space()
		if p.i < len(p.data) && p.data[p.i] == '}' {
			p.i++
			return d, nil
		}
		for {
			p.space()
			if p.i >= len(p.data) || p.data[p.i] != '"' {
				return nil, p.errorf("want an object key")
			}
			k, err := p.str()
			if err != nil {
				return nil, err
			}
			p.space()
			if p.i >= len(p.data) || p.data[p.i] != ':' {
				return nil, p.errorf("want ':'")
			}
			p.i++
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			d.set(k, v)
			p.space()
			if p.i < len(p.data) && p.data[p.i] == ',' {
				p.i++
				continue
			}
			if p.i < len(p.data) && p.data[p.i] == '}' {
				p.i++
				return d, nil
			}
			return nil, p.errorf("want ',' or '}'")
		}
	case c == '[':
		p.i++
		list := []any{}
		p.space()
		if p.i < len(p.data) && p.data[p.i] == ']' {
			p.i++
			return list, nil
		}
		for {
			v, err := p.value(depth + 1)
			if err != nil {
				return nil, err
			}
			list = append(list, v)
			p.space()
			if p.i < len(p.data) && p.data[p.i] == ',' {
				p.i++
				continue
			}
			if p.i < len(p.data) && p.data[p.i] == ']' {
				p.i++
				return list, nil
			}
			return nil, p.errorf("want ',' or ']'")
		}
	case c == '"':
		return p.str()
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	}
	for _, lit := range []struct {
		s string
		v any
	}{{"true", true}, {"false", false}, {"null", nil}} {
		if bytes.HasPrefix(p.data[p.i:], []byte(lit.s)) {
			p.i += len(lit.s)
			return lit.v, nil
		}
	}
	return nil, p.errorf("unexpected character %q", p.data[p.i])
}

func (p *jsonParser) str() (string, error) {
	p.i++ // opening quote
	start := p.i
	// Fast path: no escapes up to the closing quote.
	if k := bytes.IndexByte(p.data[start:], '"'); k >= 0 {
		raw := p.data[start : start+k]
		if bytes.IndexByte(raw, '\\') < 0 && !hasControl(raw) {
			p.i = start + k + 1
			return validUTF8(string(raw)), nil
		}
	}
	var b []byte
	b = append(b, p.data[start:p.i]...)
	for p.i < len(p.data) {
		c := p.data[p.i]
		switch {
		case c == '"':
			p.i++
			return validUTF8(string(b)), nil
		case c < 0x20:
			return "", p.errorf("control character in string")
		case c != '\\':
			b = append(b, c)
			p.i++
			continue
		}
		if p.i+1 >= len(p.data) {
			break
		}
		e := p.data[p.i+1]
		p.i += 2
		switch e {
		case '"', '\\', '/':
			b = append(b, e)
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r, ok := p.hex4()
			if !ok {
				return "", p.errorf("bad \\u escape")
			}
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if p.i+1 < len(p.data) && p.data[p.i] == '\\' && p.data[p.i+1] == 'u' {
					save := p.i
					p.i += 2
					if r2, ok = p.hex4(); !ok {
						return "", p.errorf("bad \\u escape")
					}
					if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
						b = utf8.AppendRune(b, dec)
						continue
					}
					p.i = save
				}
				r = utf8.RuneError
			}
			b = utf8.AppendRune(b, r)
		default:
			return "", p.errorf("bad escape \\%c", e)
		}
	}
	return "", p.errorf("unterminated string")
}

// hasControl reports whether b holds a byte below 0x20, eight bytes at a time.
func hasControl(b []byte) bool {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	i := 0
	for ; i+8 <= len(b); i += 8 {
		w := binary.LittleEndian.Uint64(b[i:])
		// A byte x < 0x20 makes (x - 0x20) borrow into its high bit, unless x >= 0x80.
		if (w-0x20*lo)&^w&hi != 0 {
			return true
		}
	}
	for ; i < len(b); i++ {
		if b[i] < 0x20 {
			return true
		}
	}
	return false
}

func (p *jsonParser) hex4() (rune, bool) {
	if p.i+4 > len(p.data) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(p.data[p.i:p.i+4]), 16, 32)
	if err != nil {
		return 0, false
	}
	p.i += 4
	return rune(v), true
}

func (p *jsonParser) number() (any, error) {
	start := p.i
	digits := func() int {
		n := 0
		for p.i < len(p.data) && p.data[p.i] >= '0' && p.data[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	if p.data[p.i] == '-' {
		p.i++
	}
	intStart := p.i
	if digits() == 0 || (p.data[intStart] == '0' && p.i-intStart > 1) {
		return nil, p.errorf("bad number")
	}
	isFloat := false
	if p.i < len(p.data) && p.data[p.i] == '.' {
		p.i++
		isFloat = true
		if digits() == 0 {
			return nil, p.errorf("bad number")
		}
	}
	if p.i < len(p.data) && (p.data[p.i] == 'e' || p.data[p.i] == 'E') {
		p.i++
		isFloat = true
		if p.i < len(p.data) && (p.data[p.i] == '+' || p.data[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return nil, p.errorf("bad number")
		}
	}
	s := string(p.data[start:p.i])
	if !isFloat {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return n, nil
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return nil, p.errorf("bad number %s", s)
	}
	return f, nil
}

// fromGo converts configuration values (strings and lists of them) to template values.
func fromGo(v any) any {
	switch v := v.(type) {
	case []any:
		out := make([]any, len(v))
		for i, it := range v {
			out[i] = fromGo(it)
		}
		return out
	case int:
		return int64(v)
	}
	return v
}

// strftime formats t with the directives of C's strftime that chat templates use.
func strftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 >= len(format) {
			b.WriteByte(c)
			continue
		}
		i++
		pad := true
		if format[i] == '-' && i+1 < len(format) { // glibc: no padding
			pad = false
			i++
		}
		num := func(n, width int) {
			s := strconv.Itoa(n)
			if pad {
				for len(s) < width {
					s = "0" + s
				}
			}
			b.WriteString(s)
		}
		switch format[i] {
		case 'Y':
			b.WriteString(strconv.Itoa(t.Year()))
		case 'y':
			num(t.Year()%100, 2)
		case 'm':
			num(int(t.Month()), 2)
		case 'd':
			num(t.Day(), 2)
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'H':
			num(t.Hour(), 2)
		case 'I':
			num((t.Hour()+11)%12+1, 2)
		case 'M':
			num(t.Minute(), 2)
		case 'S':
			num(t.Second(), 2)
		case 'f':
			num(t.Nanosecond()/1000, 6)
		case 'j':
			num(t.YearDay(), 3)
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'b', 'h':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'Z':
			name, _ := t.Zone()
			b.WriteString(name)
		case 'z':
			b.WriteString(t.Format("-0700"))
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(format[i])
		}
	}
	return b.String()
}
