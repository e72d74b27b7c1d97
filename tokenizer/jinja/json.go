package jinja

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"switchyard/tokenizer"
)

// ErrInvalidJSON is wrapped by DecodeJSON's errors.
var ErrInvalidJSON = errors.New("invalid JSON")

// DecodeJSON decodes JSON into template values, keeping the order of object keys (*Dict) and
// telling integers (int64) from other numbers (float64), as Python's json module does. It is
// a hand-written parser: encoding/json's token API costs several times more on the request
// path. Ill-formed UTF-8 in strings is replaced as tokenizer.ValidUTF8 describes.
func DecodeJSON(data []byte) (any, error) {
	p := jsonParser{data: data}
	v, err := p.value(0)
	if err == nil {
		p.space()
		if p.i != len(p.data) {
			err = p.errorf("trailing data")
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidJSON, err)
	}
	return v, nil
}

// DecodeJSONString decodes one JSON string, quotes included, as DecodeJSON decodes strings
// (an object key, a member already located by a caller's own scan).
func DecodeJSONString(data []byte) (string, error) {
	p := jsonParser{data: data}
	if len(data) == 0 || data[0] != '"' {
		return "", fmt.Errorf("%w: %v", ErrInvalidJSON, p.errorf("want a string"))
	}
	s, err := p.str()
	if err == nil && p.i != len(p.data) {
		err = p.errorf("trailing data")
	}
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidJSON, err)
	}
	return s, nil
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
		d := NewDict(4)
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
			return tokenizer.ValidUTF8(string(raw)), nil
		}
	}
	var b []byte
	b = append(b, p.data[start:p.i]...)
	for p.i < len(p.data) {
		c := p.data[p.i]
		switch {
		case c == '"':
			p.i++
			return tokenizer.ValidUTF8(string(b)), nil
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

// FromGo converts Go values (strings, ints and lists of them) to template values.
func FromGo(v any) any {
	switch v := v.(type) {
	case []any:
		out := make([]any, len(v))
		for i, it := range v {
			out[i] = FromGo(it)
		}
		return out
	case int:
		return int64(v)
	}
	return v
}
