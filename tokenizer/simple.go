package tokenizer

import (
	"fmt"
	"unicode/utf8"
)

// Simple's vocabulary: IDs below 256 are single bytes, the rest hashed pieces.
const (
	// ByteTokens is the number of single-byte IDs (0..255).
	ByteTokens = 256
	// HashedTokens is the number of IDs hashed pieces map to.
	HashedTokens = 50000
	// VocabSize bounds every ID Simple emits.
	VocabSize = ByteTokens + HashedTokens
	// MaxPieceBytes is the longest piece other than a special token.
	MaxPieceBytes = 4
	// maxSpecialName bounds the name of a special token "<|name|>".
	maxSpecialName = 32
)

// Simple is the built-in tokenizer; see the package documentation for its rules.
type Simple struct {
	// known maps the IDs of the built-in pieces back to their text, for Decode.
	known map[uint32]string
}

var (
	_ Tokenizer     = (*Simple)(nil)
	_ ChatTemplater = (*Simple)(nil)
)

// commonWords seeds Decode's table: short English words that are one piece with and
// without a leading space, plus a few longer ones that are one piece without it.
var commonWords = [...]string{
	"a", "I", "an", "as", "at", "be", "by", "do", "go", "he", "if", "in", "is", "it", "me",
	"my", "no", "of", "on", "or", "so", "to", "up", "us", "we", "all", "and", "any", "are",
	"but", "can", "day", "did", "for", "get", "had", "has", "her", "him", "his", "how", "its",
	"let", "may", "new", "not", "now", "old", "one", "our", "out", "own", "say", "see", "she",
	"the", "too", "two", "use", "was", "way", "who", "why", "yes", "yet", "you", "big", "end",
	"few", "far", "run", "set", "sun", "sea", "sky", "red", "low", "top", "key", "map", "log",
	"net", "bit", "add", "job", "age", "air", "art", "car", "cat", "dog", "eye", "law", "man",
	"war", "box", "cup", "hi", "ok", "ran", "saw", "got", "put", "off", "via", "fit", "hot", "ice", "joy", "kit", "lot", "mix", "pay", "raw", "tea",
	"also", "back", "been", "best", "both", "came", "come", "each", "even", "find", "from",
	"give", "good", "have", "here", "into", "just", "know", "last", "like", "long", "look",
	"made", "make", "many", "more", "most", "much", "must", "next", "only", "over", "part",
	"same", "some", "such", "take", "than", "that", "them", "then", "they", "this", "time",
	"very", "want", "well", "went", "were", "what", "when", "will", "with", "word", "work",
	"year", "your", "The", "It", "In", "We", "You", "This", "That",
}

// specialTokens are the special tokens Decode knows by name.
var specialTokens = [...]string{
	"<|system|>", "<|developer|>", "<|user|>", "<|assistant|>", "<|tool|>",
	"<|endoftext|>", "<|eot|>",
}

// NewSimple returns the built-in tokenizer.
func NewSimple() *Simple {
	s := &Simple{known: make(map[uint32]string, 3*len(commonWords)+len(specialTokens)+8)}
	add := func(piece string) {
		if len(piece) <= 1 {
			return // single bytes decode without the table
		}
		id := pieceID(piece)
		if _, dup := s.known[id]; !dup {
			s.known[id] = piece
		}
	}
	for _, w := range specialTokens {
		add(w)
	}
	for _, w := range commonWords {
		if len(w) <= MaxPieceBytes {
			add(w)
		}
		if len(w)+1 <= MaxPieceBytes {
			add(" " + w)
		}
	}
	for _, ws := range [...]string{"\n\n", "  ", "   ", "    ", "\n\n\n", " .", " ,", "...", ".\n", ".\n\n"} {
		add(ws)
	}
	return s
}

// Encode returns the token IDs of text.
func (s *Simple) Encode(text string) []uint32 {
	return s.AppendEncode(make([]uint32, 0, len(text)/3+1), text)
}

// AppendEncode appends the token IDs of text to dst.
func (s *Simple) AppendEncode(dst []uint32, text string) []uint32 {
	for i := 0; i < len(text); {
		end, special := nextPiece(text, i)
		if special {
			dst = append(dst, pieceID(text[i:end]))
			i = end
			continue
		}
		for j := i; j < end; j += MaxPieceBytes {
			dst = append(dst, pieceID(text[j:min(j+MaxPieceBytes, end)]))
		}
		i = end
	}
	return dst
}

// Count returns len(s.Encode(text)) without allocating.
func (s *Simple) Count(text string) int {
	n := 0
	for i := 0; i < len(text); {
		end, special := nextPiece(text, i)
		if special {
			n++
		} else {
			n += (end - i + MaxPieceBytes - 1) / MaxPieceBytes
		}
		i = end
	}
	return n
}

// Decode returns the text of ids, best effort: an ID Simple cannot invert becomes U+FFFD.
func (s *Simple) Decode(ids []uint32) string {
	return string(s.AppendDecode(make([]byte, 0, 4*len(ids)), ids))
}

// AppendDecode appends the text of ids to dst; see Decode.
func (s *Simple) AppendDecode(dst []byte, ids []uint32) []byte {
	for _, id := range ids {
		switch p, ok := s.Piece(id); {
		case ok:
			dst = append(dst, p...)
		default:
			dst = utf8.AppendRune(dst, utf8.RuneError)
		}
	}
	return dst
}

// Piece returns the text of one ID when Simple knows it: a single byte, a special token
// or a built-in common piece.
func (s *Simple) Piece(id uint32) (string, bool) {
	if id < ByteTokens {
		return allBytes[id : id+1], true
	}
	p, ok := s.known[id]
	return p, ok
}

// ID returns the ID of one piece of text. It does not check that piece is a single piece
// under Simple's rules; use Encode for arbitrary text.
func (s *Simple) ID(piece string) uint32 { return pieceID(piece) }

// ApplyChatTemplate renders messages as "<|role|>\ncontent\n" each, followed by the
// generation prompt "<|assistant|>\n".
func (s *Simple) ApplyChatTemplate(messages []Message) (string, error) {
	n := len("<|assistant|>\n")
	for i := range messages {
		n += len(messages[i].Role) + len(messages[i].Content) + 6
	}
	b, err := s.AppendChatTemplate(make([]byte, 0, n), messages)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// AppendChatTemplate appends the rendering of ApplyChatTemplate to dst.
func (s *Simple) AppendChatTemplate(dst []byte, messages []Message) ([]byte, error) {
	if len(messages) == 0 {
		return dst, fmt.Errorf("cannot apply chat template: %w", ErrNoMessages)
	}
	for i := range messages {
		m := &messages[i]
		if !ValidRole(m.Role) {
			return dst, fmt.Errorf("cannot apply chat template: messages[%d]: %w %q", i, ErrInvalidRole, m.Role)
		}
		dst = append(dst, "<|"...)
		dst = append(dst, m.Role...)
		dst = append(dst, "|>\n"...)
		dst = append(dst, m.Content...)
		dst = append(dst, '\n')
	}
	return append(dst, "<|assistant|>\n"...), nil
}

// allBytes holds every byte value once, so a single-byte piece is a substring of it.
var allBytes = func() string {
	b := make([]byte, ByteTokens)
	for i := range b {
		b[i] = byte(i)
	}
	return string(b)
}()

// Byte classes of the pre-tokenizer.
const (
	clsSpace = iota // ' '
	clsWS           // other whitespace
	clsWord         // letters, digits, non-ASCII bytes
	clsPunct        // everything else
)

var byteClass = func() (t [256]uint8) {
	for c := range 256 {
		switch {
		case c == ' ':
			t[c] = clsSpace
		case c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f':
			t[c] = clsWS
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c >= 0x80:
			t[c] = clsWord
		default:
			t[c] = clsPunct
		}
	}
	return t
}()

// nextPiece returns the end of the piece starting at i (i < len(s)) and whether it is a
// special token.
func nextPiece(s string, i int) (end int, special bool) {
	if s[i] == '<' {
		if e := specialEnd(s, i); e > 0 {
			return e, true
		}
	}
	n := len(s)
	c := byteClass[s[i]]
	if c == clsSpace && i+1 < n {
		if c2 := byteClass[s[i+1]]; (c2 == clsWord || c2 == clsPunct) && !(s[i+1] == '<' && specialEnd(s, i+1) > 0) {
			return runEnd(s, i+1, c2), false
		}
	}
	if c == clsSpace || c == clsWS {
		j := i
		for j < n && (byteClass[s[j]] == clsSpace || byteClass[s[j]] == clsWS) {
			j++
		}
		// Leave a final single space to the word or punctuation that follows.
		if j < n && j-i >= 2 && s[j-1] == ' ' {
			if c2 := byteClass[s[j]]; (c2 == clsWord || c2 == clsPunct) && !(s[j] == '<' && specialEnd(s, j) > 0) {
				j--
			}
		}
		return j, false
	}
	return runEnd(s, i, c), false
}

// runEnd returns the end of the run of class c starting at i; a punctuation run stops
// before a special token.
func runEnd(s string, i int, c uint8) int {
	j := i + 1
	for j < len(s) && byteClass[s[j]] == c {
		if c == clsPunct && s[j] == '<' && specialEnd(s, j) > 0 {
			break
		}
		j++
	}
	return j
}

// specialEnd returns the end of the special token "<|name|>" at i, or 0.
func specialEnd(s string, i int) int {
	if i+1 >= len(s) || s[i] != '<' || s[i+1] != '|' {
		return 0
	}
	j := i + 2
	for j < len(s) && j-(i+2) <= maxSpecialName {
		c := s[j]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_':
			j++
			continue
		case c == '|':
			if j > i+2 && j+1 < len(s) && s[j+1] == '>' {
				return j + 2
			}
		}
		return 0
	}
	return 0
}

// pieceID is the ID of one piece.
func pieceID(p string) uint32 {
	if len(p) == 1 {
		return uint32(p[0])
	}
	// FNV-1a, 32 bit.
	h := uint32(2166136261)
	for i := 0; i < len(p); i++ {
		h ^= uint32(p[i])
		h *= 16777619
	}
	return ByteTokens + h%HashedTokens
}
