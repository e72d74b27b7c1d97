package hf

import (
	"encoding/json"
	"unicode/utf8"
)

// Fast paths for the two large members of tokenizer.json, the BPE vocabulary (an object of
// token → ID) and its merges (an array of "left right" strings or [left, right] pairs):
// encoding/json's reflection costs most of a load (seconds for a 262k-token vocabulary).
// They read the plain forms (a string with escapes is handed to encoding/json alone); anything
// else (a float ID, bad syntax) makes them report false, and the caller decodes the member
// with encoding/json, so the result is always the same.

// jsonScan reads JSON tokens from data.
type jsonScan struct {
	data []byte
	i    int
}

func (s *jsonScan) space() {
	for s.i < len(s.data) {
		switch s.data[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// byteIs skips whitespace and consumes c when it is next.
func (s *jsonScan) byteIs(c byte) bool {
	s.space()
	if s.i < len(s.data) && s.data[s.i] == c {
		s.i++
		return true
	}
	return false
}

// str reads a string. Fast path: no escape and valid UTF-8; otherwise encoding/json decodes
// that one string.
func (s *jsonScan) str() (string, bool) {
	if !s.byteIs('"') {
		return "", false
	}
	start := s.i
	plain := true
	for s.i < len(s.data) {
		c := s.data[s.i]
		switch {
		case c == '"':
			raw := s.data[start:s.i]
			s.i++
			if plain && utf8.Valid(raw) {
				return string(raw), true
			}
			var str string
			if json.Unmarshal(s.data[start-1:s.i], &str) != nil {
				return "", false
			}
			return str, true
		case c == '\\':
			plain = false
			s.i++ // the escaped character, which may be a quote
		case c < 0x20:
			return "", false
		}
		s.i++
	}
	return "", false
}

// uint32 reads a non-negative integer below 2^32.
func (s *jsonScan) uint32() (uint32, bool) {
	s.space()
	start := s.i
	var v uint64
	for s.i < len(s.data) && s.data[s.i] >= '0' && s.data[s.i] <= '9' {
		v = v*10 + uint64(s.data[s.i]-'0')
		if v > 0xFFFFFFFF {
			return 0, false
		}
		s.i++
	}
	if s.i == start || (s.data[start] == '0' && s.i-start > 1) {
		return 0, false
	}
	return uint32(v), true
}

// end reports whether only whitespace is left.
func (s *jsonScan) end() bool {
	s.space()
	return s.i == len(s.data)
}

// scanVocab reads a vocabulary object, or reports false.
func scanVocab(raw []byte) (map[string]uint32, bool) {
	s := jsonScan{data: raw}
	if !s.byteIs('{') {
		return nil, false
	}
	v := make(map[string]uint32, len(raw)/16)
	if s.byteIs('}') {
		return v, s.end()
	}
	for {
		k, ok := s.str()
		if !ok || !s.byteIs(':') {
			return nil, false
		}
		id, ok := s.uint32()
		if !ok {
			return nil, false
		}
		v[k] = id // a repeated key keeps the last, as encoding/json does
		if s.byteIs(',') {
			continue
		}
		if s.byteIs('}') {
			return v, s.end()
		}
		return nil, false
	}
}

// scanMerges reads a merges array in either form, or reports false.
func scanMerges(raw []byte) ([][2]string, bool) {
	s := jsonScan{data: raw}
	if !s.byteIs('[') {
		return nil, false
	}
	out := make([][2]string, 0, len(raw)/12)
	if s.byteIs(']') {
		return out, s.end()
	}
	for {
		var m [2]string
		if s.byteIs('[') {
			var ok1, ok2 bool
			m[0], ok1 = s.str()
			if !ok1 || !s.byteIs(',') {
				return nil, false
			}
			m[1], ok2 = s.str()
			if !ok2 || !s.byteIs(']') {
				return nil, false
			}
		} else {
			str, ok := s.str()
			if !ok {
				return nil, false
			}
			l, r, found := cutSpace(str)
			if !found {
				return nil, false // the slow path reports the error
			}
			m = [2]string{l, r}
		}
		out = append(out, m)
		if s.byteIs(',') {
			continue
		}
		if s.byteIs(']') {
			return out, s.end()
		}
		return nil, false
	}
}

func cutSpace(s string) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' {
			return s[:i], s[i+1:], true
		}
	}
	return "", "", false
}
