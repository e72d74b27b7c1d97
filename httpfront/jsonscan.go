package httpfront

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
	"strconv"
	"unicode/utf8"
	"unsafe"
)

// A small strict JSON scanner (RFC 8259) over a byte slice. It validates and locates values
// without building a tree and without allocating; request preparation reads only the handful
// of members it needs and forwards the body bytes untouched.

// maxJSONDepth bounds nesting so that hostile input cannot exhaust the stack.
const maxJSONDepth = 128

// JSON value kinds, named by their first byte.
const (
	kindObject byte = '{'
	kindArray  byte = '['
	kindString byte = '"'
	kindNumber byte = '0'
	kindTrue   byte = 't'
	kindFalse  byte = 'f'
	kindNull   byte = 'n'
)

var (
	errJSONSyntax = errors.New("invalid JSON")
	errJSONDepth  = errors.New("JSON nested too deeply")
)

// jsonValue is one located value: its kind and its bytes in the scanned document.
type jsonValue struct {
	kind byte
	raw  []byte
}

func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// scanValue validates the value starting at b[i] (after whitespace) and returns it and the
// index just past it.
func scanValue(b []byte, i, depth int) (jsonValue, int, error) {
	i = skipWS(b, i)
	if i >= len(b) {
		return jsonValue{}, i, errJSONSyntax
	}
	start := i
	var err error
	c := b[i]
	kind := c
	switch {
	case c == '{':
		i, err = scanObject(b, i, depth+1, nil)
	case c == '[':
		i, err = scanArray(b, i, depth+1, nil)
	case c == '"':
		i, _, err = scanString(b, i)
	case c == 't':
		i, err = scanLiteral(b, i, "true")
	case c == 'f':
		i, err = scanLiteral(b, i, "false")
	case c == 'n':
		i, err = scanLiteral(b, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		kind = kindNumber
		i, err = scanNumber(b, i)
	default:
		return jsonValue{}, i, errJSONSyntax
	}
	if err != nil {
		return jsonValue{}, i, err
	}
	return jsonValue{kind: kind, raw: b[start:i]}, i, nil
}

func scanLiteral(b []byte, i int, lit string) (int, error) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return i, errJSONSyntax
	}
	return i + len(lit), nil
}

func scanNumber(b []byte, i int) (int, error) {
	if b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return i, errJSONSyntax
	}
	switch {
	case b[i] == '0':
		i++
	case b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		return i, errJSONSyntax
	}
	if i < len(b) && b[i] == '.' {
		i++
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			return i, errJSONSyntax
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			return i, errJSONSyntax
		}
	}
	return i, nil
}

// scanString validates the string starting at the quote b[i]; it returns the index past the
// closing quote and whether the string holds escapes. Runs of plain bytes (printable ASCII
// other than the quote and the backslash: most of a prompt) are skipped eight at a time
// (plainRun); the bytes that end a run are checked one by one.
func scanString(b []byte, i int) (end int, escaped bool, err error) {
	i++
	for {
		i = plainRun(b, i)
		if i >= len(b) {
			return i, escaped, errJSONSyntax
		}
		c := b[i]
		switch {
		case c == '"':
			return i + 1, escaped, nil
		case c == '\\':
			escaped = true
			i++
			if i >= len(b) {
				return i, escaped, errJSONSyntax
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if len(b)-i < 5 || !isHex4(b[i+1:i+5]) {
					return i, escaped, errJSONSyntax
				}
				i += 5
			default:
				return i, escaped, errJSONSyntax
			}
		case c < 0x20:
			return i, escaped, errJSONSyntax
		default:
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				return i, escaped, errJSONSyntax
			}
			i += n
		}
	}
}

// Masks of plainRun's word-at-a-time test: a byte of every lane set to 0x01, 0x80, '"', '\\'
// and 0x20.
const (
	lanes01    = 0x0101010101010101
	lanes80    = 0x8080808080808080
	lanesQuote = lanes01 * '"'
	lanesBack  = lanes01 * '\\'
	lanes20    = lanes01 * 0x20
)

// plainRun returns the index of the first byte at or after i that is not plain string
// content (a quote, a backslash, a control byte or a byte of a multi-byte UTF-8 sequence),
// or len(b). Eight bytes are tested at once: for a word x, (x - lanes01) &^ x & lanes80 is
// non-zero exactly when a byte of x is zero, and (w - lanes20) &^ w & lanes80 when a byte of w
// is below 0x20; w & lanes80 marks the bytes at or above 0x80. A borrow can only set bits
// above a lane that matched, so the lowest set bit is the first byte that ends the run.
func plainRun(b []byte, i int) int {
	for ; len(b)-i >= 8; i += 8 {
		w := binary.LittleEndian.Uint64(b[i:])
		q := w ^ lanesQuote
		k := w ^ lanesBack
		m := ((q - lanes01) &^ q) | ((k - lanes01) &^ k) | ((w - lanes20) &^ w) | w
		if m &= lanes80; m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
	}
	for ; i < len(b); i++ {
		if c := b[i]; c == '"' || c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			return i
		}
	}
	return i
}

func isHex4(b []byte) bool {
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// memberFunc receives one object member: its raw key (with quotes) and its value.
type memberFunc func(key []byte, v jsonValue) error

// elemFunc receives one array element and its index.
type elemFunc func(i int, v jsonValue) error

// scanObject validates the object at b[i] and calls fn (when non-nil) for each member.
func scanObject(b []byte, i, depth int, fn memberFunc) (int, error) {
	if depth > maxJSONDepth {
		return i, errJSONDepth
	}
	i++ // '{'
	i = skipWS(b, i)
	if i < len(b) && b[i] == '}' {
		return i + 1, nil
	}
	for {
		i = skipWS(b, i)
		if i >= len(b) || b[i] != '"' {
			return i, errJSONSyntax
		}
		ks := i
		var err error
		i, _, err = scanString(b, i)
		if err != nil {
			return i, err
		}
		key := b[ks:i]
		i = skipWS(b, i)
		if i >= len(b) || b[i] != ':' {
			return i, errJSONSyntax
		}
		var v jsonValue
		v, i, err = scanValue(b, i+1, depth)
		if err != nil {
			return i, err
		}
		if fn != nil {
			if err := fn(key, v); err != nil {
				return i, err
			}
		}
		i = skipWS(b, i)
		if i >= len(b) {
			return i, errJSONSyntax
		}
		switch b[i] {
		case ',':
			i++
		case '}':
			return i + 1, nil
		default:
			return i, errJSONSyntax
		}
	}
}

// scanArray validates the array at b[i] and calls fn (when non-nil) for each element.
func scanArray(b []byte, i, depth int, fn elemFunc) (int, error) {
	if depth > maxJSONDepth {
		return i, errJSONDepth
	}
	i++ // '['
	i = skipWS(b, i)
	if i < len(b) && b[i] == ']' {
		return i + 1, nil
	}
	for n := 0; ; n++ {
		v, j, err := scanValue(b, i, depth)
		if err != nil {
			return j, err
		}
		i = j
		if fn != nil {
			if err := fn(n, v); err != nil {
				return i, err
			}
		}
		i = skipWS(b, i)
		if i >= len(b) {
			return i, errJSONSyntax
		}
		switch b[i] {
		case ',':
			i++
		case ']':
			return i + 1, nil
		default:
			return i, errJSONSyntax
		}
	}
}

// members iterates the members of an already validated object value. Only the scanner makes
// jsonValues, so v's bytes passed its checks: they are walked again without them (a string's
// end found with bytes.IndexByte, a nested value's by counting brackets), not validated a
// second time.
func (v jsonValue) members(fn memberFunc) error {
	if v.kind != kindObject {
		return errJSONSyntax
	}
	b := v.raw
	i := skipWS(b, 1)
	if i >= len(b) || b[i] == '}' {
		return nil
	}
	for i < len(b) {
		ks := i
		i = skipString(b, i)
		key := b[ks:min(i, len(b))]
		i = skipWS(b, i)
		i = skipWS(b, i+1) // ':'
		val, j := walkValue(b, i)
		if err := fn(key, val); err != nil {
			return err
		}
		i = skipWS(b, j)
		if i >= len(b) || b[i] != ',' {
			return nil
		}
		i = skipWS(b, i+1)
	}
	return nil
}

// elems iterates the elements of an already validated array value, walked as members walks.
func (v jsonValue) elems(fn elemFunc) error {
	if v.kind != kindArray {
		return errJSONSyntax
	}
	b := v.raw
	i := skipWS(b, 1)
	if i >= len(b) || b[i] == ']' {
		return nil
	}
	for n := 0; i < len(b); n++ {
		val, j := walkValue(b, i)
		if err := fn(n, val); err != nil {
			return err
		}
		i = skipWS(b, j)
		if i >= len(b) || b[i] != ',' {
			return nil
		}
		i = skipWS(b, i+1)
	}
	return nil
}

// walkValue locates the validated value starting at b[i] and returns it and the index just
// past it.
func walkValue(b []byte, i int) (jsonValue, int) {
	if i >= len(b) {
		return jsonValue{}, len(b)
	}
	start, kind := i, b[i]
	switch kind {
	case '"':
		i = skipString(b, i)
	case '{', '[':
		for depth := 0; i < len(b); {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			i++
			if depth == 0 {
				break
			}
		}
	default: // a number or a literal: up to the next delimiter
		if kind == '-' || kind >= '0' && kind <= '9' {
			kind = kindNumber
		}
		for i < len(b) && !jsonDelimiter[b[i]] {
			i++
		}
	}
	i = min(i, len(b))
	return jsonValue{kind: kind, raw: b[start:i]}, i
}

// skipString returns the index past the closing quote of the validated string at b[i]: the
// first quote not escaped by an odd run of backslashes.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return len(b)
		}
		i += j
		k := i - 1
		for k > 0 && b[k] == '\\' {
			k--
		}
		if (i-1-k)%2 == 0 {
			return i + 1
		}
	}
	return len(b)
}

// jsonDelimiter marks the bytes that end a number or a literal in valid JSON.
var jsonDelimiter = func() (t [256]bool) {
	for _, c := range []byte(" \t\r\n,]}") {
		t[c] = true
	}
	return t
}()

// keyIs reports whether the raw key (with quotes) equals name. Keys with escapes never match:
// clients do not escape the plain ASCII parameter names this package looks up.
func keyIs(key []byte, name string) bool {
	return len(key) == len(name)+2 && string(key[1:len(key)-1]) == name
}

// appendUnquoted appends the decoded content of the raw string s (with quotes) to dst.
func appendUnquoted(dst, s []byte) []byte {
	s = s[1 : len(s)-1]
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			j := i + 1
			for j < len(s) && s[j] != '\\' {
				j++
			}
			dst = append(dst, s[i:j]...)
			i = j
			continue
		}
		i++
		switch s[i] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := rune(hex4(s[i+1 : i+5]))
			i += 4
			if utf16IsSurrogate(r) {
				r2 := rune(-1)
				if i+6 < len(s) && s[i+1] == '\\' && s[i+2] == 'u' {
					r2 = rune(hex4(s[i+3 : i+7]))
				}
				if dec := utf16Decode(r, r2); dec != utf8.RuneError {
					i += 6
					r = dec
				} else {
					r = utf8.RuneError
				}
			}
			dst = utf8.AppendRune(dst, r)
		default: // '"', '\\', '/'
			dst = append(dst, s[i])
		}
		i++
	}
	return dst
}

func hex4(b []byte) int {
	n := 0
	for _, c := range b {
		n <<= 4
		switch {
		case c >= '0' && c <= '9':
			n |= int(c - '0')
		case c >= 'a' && c <= 'f':
			n |= int(c - 'a' + 10)
		default:
			n |= int(c - 'A' + 10)
		}
	}
	return n
}

func utf16IsSurrogate(r rune) bool { return r >= 0xd800 && r < 0xe000 }

func utf16Decode(r1, r2 rune) rune {
	if r1 >= 0xd800 && r1 < 0xdc00 && r2 >= 0xdc00 && r2 < 0xe000 {
		return (r1-0xd800)<<10 | (r2 - 0xdc00) + 0x10000
	}
	return utf8.RuneError
}

// bytesString views b as a string without copying; the string must not outlive b.
func bytesString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// asFloat parses a number value.
func (v jsonValue) asFloat() (float64, bool) {
	if v.kind != kindNumber {
		return 0, false
	}
	f, err := strconv.ParseFloat(bytesString(v.raw), 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, false
	}
	return f, true
}

// asInt parses an integral number value (no fraction, no exponent) that fits an int64.
func (v jsonValue) asInt() (int64, bool) {
	if v.kind != kindNumber {
		return 0, false
	}
	n, err := strconv.ParseInt(bytesString(v.raw), 10, 64)
	if err != nil {
		return 0, false
	}
	return n, true
}
