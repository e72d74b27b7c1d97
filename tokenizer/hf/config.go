package hf

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"

	"switchyard/tokenizer/jinja"
)

// Errors of Load and New.
var (
	// ErrUnsupported is wrapped when tokenizer.json uses a component Switchyard does not
	// implement; the message names the component.
	ErrUnsupported = errors.New("unsupported tokenizer component")
	// ErrInvalid is wrapped when tokenizer.json or tokenizer_config.json is malformed.
	ErrInvalid = errors.New("invalid tokenizer file")
	// ErrNoChatTemplate is returned by the chat methods of a tokenizer without a chat template.
	ErrNoChatTemplate = errors.New("tokenizer has no chat template")
	// ErrTemplate is wrapped when a chat template cannot be compiled or refuses to render a
	// conversation (it is jinja.ErrTemplate).
	ErrTemplate = jinja.ErrTemplate
	// ErrRaised is wrapped, beside ErrTemplate, when the chat template itself refuses the
	// conversation (raise_exception); it is jinja.ErrRaised.
	ErrRaised = jinja.ErrRaised
)

// fileJSON is the part of tokenizer.json Switchyard reads.
type fileJSON struct {
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	Model         modelJSON        `json:"model"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
}

type addedTokenJSON struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	Lstrip     bool   `json:"lstrip"`
	Rstrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type modelJSON struct {
	Type                    string          `json:"type"`
	Dropout                 *float64        `json:"dropout"`
	UnkToken                *string         `json:"unk_token"`
	UnkID                   *int            `json:"unk_id"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	MaxInputCharsPerWord    *int            `json:"max_input_chars_per_word"`
	ByteFallback            bool            `json:"byte_fallback"`
	FuseUnk                 bool            `json:"fuse_unk"`
	IgnoreMerges            bool            `json:"ignore_merges"`
	Vocab                   json.RawMessage `json:"vocab"`
	Merges                  json.RawMessage `json:"merges"`
}

// componentJSON holds the fields of every normalizer, pre-tokenizer, post-processor and
// decoder Switchyard knows; Type says which apply.
type componentJSON struct {
	Type string `json:"type"`

	Normalizers   []json.RawMessage `json:"normalizers"`
	Pretokenizers []json.RawMessage `json:"pretokenizers"`
	Processors    []json.RawMessage `json:"processors"`
	Decoders      []json.RawMessage `json:"decoders"`

	StripLeft  *bool        `json:"strip_left"`
	StripRight *bool        `json:"strip_right"`
	Pattern    *patternJSON `json:"pattern"`
	Content    string       `json:"content"`
	Prepend    string       `json:"prepend"`

	Behavior       string `json:"behavior"`
	Invert         bool   `json:"invert"`
	AddPrefixSpace *bool  `json:"add_prefix_space"`
	UseRegex       *bool  `json:"use_regex"`

	Replacement      *string `json:"replacement"`
	PrependScheme    string  `json:"prepend_scheme"`
	Split            *bool   `json:"split"`
	Start            int     `json:"start"`
	Stop             int     `json:"stop"`
	Prefix           *string `json:"prefix"`
	Cleanup          *bool   `json:"cleanup"`
	IndividualDigits bool    `json:"individual_digits"`

	CleanText          *bool `json:"clean_text"`
	HandleChineseChars *bool `json:"handle_chinese_chars"`
	StripAccents       *bool `json:"strip_accents"`
	Lowercase          *bool `json:"lowercase"`

	Single        []templatePieceJSON            `json:"single"`
	SpecialTokens map[string]templateSpecialJSON `json:"special_tokens"`
	Sep           []json.RawMessage              `json:"sep"`
	Cls           []json.RawMessage              `json:"cls"`
}

type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

type templatePieceJSON struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

type templateSpecialJSON struct {
	IDs []uint32 `json:"ids"`
}

func parseComponent(raw json.RawMessage, what string) (*componentJSON, error) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return nil, nil
	}
	var c componentJSON
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("%s: %w: %v", what, ErrInvalid, err)
	}
	return &c, nil
}

func buildMatcher(p *patternJSON, what string) (matcher, error) {
	switch {
	case p == nil:
		return nil, fmt.Errorf("%s: %w: no pattern", what, ErrInvalid)
	case p.String != nil:
		return &literalMatcher{lit: *p.String}, nil
	case p.Regex != nil:
		m, err := newRegexMatcher(*p.Regex)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		return m, nil
	}
	return nil, fmt.Errorf("%s: %w: empty pattern", what, ErrInvalid)
}

func buildNormalizer(raw json.RawMessage, what string) (normalizer, error) {
	c, err := parseComponent(raw, what)
	if err != nil || c == nil {
		return nil, err
	}
	switch c.Type {
	case "NFC":
		return unicodeForm{norm.NFC}, nil
	case "NFD":
		return unicodeForm{norm.NFD}, nil
	case "NFKC":
		return unicodeForm{norm.NFKC}, nil
	case "NFKD":
		return unicodeForm{norm.NFKD}, nil
	case "Lowercase":
		return lowercase{}, nil
	case "BertNormalizer":
		on := func(b *bool) bool { return b == nil || *b }
		lower := on(c.Lowercase)
		strip := lower
		if c.StripAccents != nil {
			strip = *c.StripAccents
		}
		return &bertNormalizer{clean: on(c.CleanText), chinese: on(c.HandleChineseChars), stripAccents: strip, lower: lower}, nil
	case "StripAccents":
		return stripAccents{}, nil
	case "Strip":
		return &stripNormalizer{left: c.StripLeft == nil || *c.StripLeft, right: c.StripRight == nil || *c.StripRight}, nil
	case "Prepend":
		return &prependNormalizer{prefix: c.Prepend}, nil
	case "Replace":
		m, err := buildMatcher(c.Pattern, what+".pattern")
		if err != nil {
			return nil, err
		}
		return &replaceNormalizer{m: m, content: c.Content}, nil
	case "Sequence":
		seq := &sequenceNormalizer{}
		for i, r := range c.Normalizers {
			n, err := buildNormalizer(r, fmt.Sprintf("%s.normalizers[%d]", what, i))
			if err != nil {
				return nil, err
			}
			if n != nil {
				seq.steps = append(seq.steps, n)
			}
		}
		return seq, nil
	}
	return nil, fmt.Errorf("%s: normalizer %q: %w", what, c.Type, ErrUnsupported)
}

// preTokenizerSpec is a built pre-tokenizer and what the encoder needs to know about it.
type preTokenizerSpec struct {
	pre       preTokenizer
	byteLevel bool // a ByteLevel step maps every byte to the model's alphabet
	chunkSafe bool // chunking at line and word starts is exact (see chunkEnd)
	slashLine bool // but not at a line that starts with '/': a match may end there (o200k)
}

func buildPreTokenizer(raw json.RawMessage, what string, cls classifier) (preTokenizerSpec, error) {
	c, err := parseComponent(raw, what)
	if err != nil || c == nil {
		return preTokenizerSpec{}, err
	}
	switch c.Type {
	case "Split":
		if c.Pattern != nil && c.Pattern.Regex != nil && !c.Invert && (c.Behavior == "Isolated" || c.Behavior == "") {
			switch *c.Pattern.Regex {
			case patternQwen2:
				return preTokenizerSpec{pre: &fastSplit{cls: cls, maxDigits: 1}, chunkSafe: true}, nil
			case patternLlama3:
				return preTokenizerSpec{pre: &fastSplit{cls: cls, maxDigits: 3}, chunkSafe: true}, nil
			case patternO200k:
				return preTokenizerSpec{pre: &o200kSplit{k: newKinds()}, chunkSafe: true, slashLine: true}, nil
			case patternDigits3:
				return preTokenizerSpec{pre: &runSplit{k: newKinds(), in: isNumberKind, max: 3}, chunkSafe: true}, nil
			case patternCJKKana:
				return preTokenizerSpec{pre: &runSplit{k: newKinds(), in: isCJKOrKana}, chunkSafe: true}, nil
			case patternDeepSeek:
				return preTokenizerSpec{pre: &deepSeekSplit{k: newKinds()}, chunkSafe: true}, nil
			}
		}
		m, err := buildMatcher(c.Pattern, what+".pattern")
		if err != nil {
			return preTokenizerSpec{}, err
		}
		b, err := parseSplitBehavior(c.Behavior)
		if err != nil {
			return preTokenizerSpec{}, fmt.Errorf("%s: %w", what, err)
		}
		return preTokenizerSpec{pre: &regexSplit{m: m, behavior: b, invert: c.Invert}}, nil
	case "Metaspace":
		ms, err := metaspaceOptions(c, what)
		if err != nil {
			return preTokenizerSpec{}, err
		}
		return preTokenizerSpec{pre: ms}, nil
	case "BertPreTokenizer":
		return preTokenizerSpec{pre: bertSplit{}}, nil
	case "Whitespace":
		return preTokenizerSpec{pre: wordSplit{}}, nil
	case "WhitespaceSplit":
		return preTokenizerSpec{pre: &charSplit{match: isRustWhitespace, behavior: splitRemoved}}, nil
	case "Punctuation":
		b, err := parseSplitBehavior(cmp.Or(c.Behavior, "Isolated"))
		if err != nil {
			return preTokenizerSpec{}, fmt.Errorf("%s: %w", what, err)
		}
		return preTokenizerSpec{pre: &charSplit{match: isBertPunct, behavior: b}}, nil
	case "Digits":
		b := splitContiguous
		if c.IndividualDigits {
			b = splitIsolated
		}
		return preTokenizerSpec{pre: &charSplit{match: unicode.IsNumber, behavior: b}}, nil
	case "ByteLevel":
		p := &byteLevelSplit{addPrefixSpace: c.AddPrefixSpace == nil || *c.AddPrefixSpace}
		if c.UseRegex == nil || *c.UseRegex {
			m, err := newRegexMatcher(patternGPT2)
			if err != nil {
				return preTokenizerSpec{}, err
			}
			p.split = &regexSplit{m: m, behavior: splitIsolated}
		}
		return preTokenizerSpec{pre: p, byteLevel: true}, nil
	case "Sequence":
		seq := &sequenceSplit{}
		spec := preTokenizerSpec{chunkSafe: true}
		for i, r := range c.Pretokenizers {
			s, err := buildPreTokenizer(r, fmt.Sprintf("%s.pretokenizers[%d]", what, i), cls)
			if err != nil {
				return preTokenizerSpec{}, err
			}
			if s.pre == nil {
				continue
			}
			if bl, ok := s.pre.(*byteLevelSplit); ok && !bl.addPrefixSpace && bl.split == nil {
				s.chunkSafe = true // a plain byte mapping
			}
			spec.chunkSafe = spec.chunkSafe && s.chunkSafe
			spec.slashLine = spec.slashLine || s.slashLine
			spec.byteLevel = spec.byteLevel || s.byteLevel
			seq.steps = append(seq.steps, s.pre)
		}
		// Fast path: a scanner followed by a plain byte mapping is the scanner alone.
		if len(seq.steps) == 2 {
			if bl, ok := seq.steps[1].(*byteLevelSplit); ok && !bl.addPrefixSpace && bl.split == nil {
				if sc, ok := seq.steps[0].(scanner); ok {
					spec.pre = sc
					return spec, nil
				}
			}
		}
		if len(seq.steps) == 1 {
			spec.pre = seq.steps[0]
		} else {
			spec.pre = seq
		}
		return spec, nil
	}
	return preTokenizerSpec{}, fmt.Errorf("%s: pre-tokenizer %q: %w", what, c.Type, ErrUnsupported)
}

// buildPostProcessor returns the IDs added before and after a single sequence when special
// tokens are added.
func buildPostProcessor(raw json.RawMessage, what string) (prefix, suffix []uint32, err error) {
	c, err := parseComponent(raw, what)
	if err != nil || c == nil {
		return nil, nil, err
	}
	switch c.Type {
	case "ByteLevel":
		return nil, nil, nil
	case "TemplateProcessing":
		seen := false
		for i, p := range c.Single {
			switch {
			case p.Sequence != nil:
				if seen || p.Sequence.ID != "A" {
					return nil, nil, fmt.Errorf("%s.single[%d]: %w: sequence %q", what, i, ErrInvalid, p.Sequence.ID)
				}
				seen = true
			case p.SpecialToken != nil:
				st, ok := c.SpecialTokens[p.SpecialToken.ID]
				if !ok {
					return nil, nil, fmt.Errorf("%s.single[%d]: %w: special token %q is not in special_tokens", what, i, ErrInvalid, p.SpecialToken.ID)
				}
				if seen {
					suffix = append(suffix, st.IDs...)
				} else {
					prefix = append(prefix, st.IDs...)
				}
			default:
				return nil, nil, fmt.Errorf("%s.single[%d]: %w: empty piece", what, i, ErrInvalid)
			}
		}
		if !seen {
			return nil, nil, fmt.Errorf("%s.single: %w: no sequence", what, ErrInvalid)
		}
		return prefix, suffix, nil
	case "RobertaProcessing", "BertProcessing":
		cls, err1 := pairID(c.Cls)
		sep, err2 := pairID(c.Sep)
		if err := errors.Join(err1, err2); err != nil {
			return nil, nil, fmt.Errorf("%s: %w: %v", what, ErrInvalid, err)
		}
		return []uint32{cls}, []uint32{sep}, nil
	case "Sequence":
		for i, r := range c.Processors {
			p, s, err := buildPostProcessor(r, fmt.Sprintf("%s.processors[%d]", what, i))
			if err != nil {
				return nil, nil, err
			}
			prefix = append(slices.Clone(p), prefix...)
			suffix = append(suffix, s...)
		}
		return prefix, suffix, nil
	}
	return nil, nil, fmt.Errorf("%s: post-processor %q: %w", what, c.Type, ErrUnsupported)
}

// pairID reads the ID of a ["token", id] pair.
func pairID(raw []json.RawMessage) (uint32, error) {
	if len(raw) != 2 {
		return 0, errors.New("want [token, id]")
	}
	var id uint32
	if err := json.Unmarshal(raw[1], &id); err != nil {
		return 0, err
	}
	return id, nil
}

// decoderKind is how IDs become text.
type decoderKind uint8

const (
	decodeJoinSpace decoderKind = iota // no decoder: tokens joined with spaces
	decodeByteLevel                    // byte-level characters back to bytes (fast path)
	decodeChain                        // the decoder steps, in order
)

// buildDecoder returns how the decoder turns tokens into text: ByteLevel alone is the fast
// path; any other supported decoder or sequence of them is a chain of steps.
func buildDecoder(raw json.RawMessage, what string, toByte map[rune]byte) (decoderKind, []decodeStep, error) {
	c, err := parseComponent(raw, what)
	if err != nil || c == nil {
		return decodeJoinSpace, nil, err
	}
	if c.Type == "ByteLevel" {
		return decodeByteLevel, nil, nil
	}
	if c.Type == "Sequence" && len(c.Decoders) == 1 {
		return buildDecoder(c.Decoders[0], what+".decoders[0]", toByte)
	}
	steps, err := appendDecodeSteps(nil, c, what, toByte)
	if err != nil {
		return 0, nil, err
	}
	return decodeChain, steps, nil
}

func appendDecodeSteps(steps []decodeStep, c *componentJSON, what string, toByte map[rune]byte) ([]decodeStep, error) {
	switch c.Type {
	case "ByteLevel":
		return append(steps, &byteLevelDecoder{toByte: toByte}), nil
	case "Replace":
		m, err := buildMatcher(c.Pattern, what+".pattern")
		if err != nil {
			return nil, err
		}
		return append(steps, &replaceDecoder{r: replaceNormalizer{m: m, content: c.Content}}), nil
	case "ByteFallback":
		return append(steps, byteFallbackDecoder{}), nil
	case "Fuse":
		return append(steps, fuseDecoder{}), nil
	case "Strip":
		r, n := utf8.DecodeRuneInString(c.Content)
		if n == 0 || n != len(c.Content) || c.Start < 0 || c.Stop < 0 {
			return nil, fmt.Errorf("%s: %w: strip content must be one character", what, ErrInvalid)
		}
		return append(steps, &stripDecoder{content: r, start: c.Start, stop: c.Stop}), nil
	case "Metaspace":
		ms, err := metaspaceOptions(c, what)
		if err != nil {
			return nil, err
		}
		return append(steps, &metaspaceDecoder{rep: ms.rep, dropFirst: ms.prepend != prependNever}), nil
	case "WordPiece":
		prefix := "##"
		if c.Prefix != nil {
			prefix = *c.Prefix
		}
		return append(steps, &wordPieceDecoder{prefix: prefix, cleanup: c.Cleanup == nil || *c.Cleanup}), nil
	case "Sequence":
		for i, r := range c.Decoders {
			sub, err := parseComponent(r, fmt.Sprintf("%s.decoders[%d]", what, i))
			if err != nil {
				return nil, err
			}
			if sub == nil {
				continue
			}
			if steps, err = appendDecodeSteps(steps, sub, fmt.Sprintf("%s.decoders[%d]", what, i), toByte); err != nil {
				return nil, err
			}
		}
		return steps, nil
	}
	return nil, fmt.Errorf("%s: decoder %q: %w", what, c.Type, ErrUnsupported)
}

// metaspaceOptions reads the options of a Metaspace pre-tokenizer or decoder: replacement,
// prepend_scheme (or the older add_prefix_space) and split.
func metaspaceOptions(c *componentJSON, what string) (*metaspaceSplit, error) {
	ms := &metaspaceSplit{rep: string(metaspaceRune), prepend: prependAlways, split: c.Split == nil || *c.Split}
	if c.Replacement != nil {
		r, n := utf8.DecodeRuneInString(*c.Replacement)
		if n == 0 || n != len(*c.Replacement) || r == utf8.RuneError {
			return nil, fmt.Errorf("%s.replacement: %w: want one character", what, ErrInvalid)
		}
		ms.rep = *c.Replacement
	}
	switch c.PrependScheme {
	case "", "always":
	case "first":
		ms.prepend = prependFirst
	case "never":
		ms.prepend = prependNever
	default:
		return nil, fmt.Errorf("%s.prepend_scheme %q: %w", what, c.PrependScheme, ErrUnsupported)
	}
	if c.AddPrefixSpace != nil && !*c.AddPrefixSpace {
		if c.PrependScheme != "" && ms.prepend != prependNever {
			return nil, fmt.Errorf("%s: %w: add_prefix_space false contradicts prepend_scheme %q", what, ErrInvalid, c.PrependScheme)
		}
		ms.prepend = prependNever
	}
	return ms, nil
}

// byteLevelAlphabet returns the byte-level mapping of the tokenizers library (GPT-2's): the
// printable Latin-1 bytes stand for themselves, the others for U+0100 onwards.
func byteLevelAlphabet() (toRune [256]rune, toByte map[rune]byte) {
	toByte = make(map[rune]byte, 256)
	n := rune(0)
	for b := range 256 {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			toRune[b] = rune(b)
		} else {
			toRune[b] = 256 + n
			n++
		}
		toByte[toRune[b]] = byte(b)
	}
	return toRune, toByte
}

// fromByteLevel maps a token of the byte-level alphabet to raw bytes; ok is false when the
// token has a character outside the alphabet.
func fromByteLevel(tok string, toByte map[rune]byte) (raw string, ok bool) {
	var b strings.Builder
	b.Grow(len(tok))
	for _, r := range tok {
		c, ok := toByte[r]
		if !ok {
			return "", false
		}
		b.WriteByte(c)
	}
	return b.String(), true
}

// parseMerges reads the merges of tokenizer.json in either format: "left right" strings or
// [left, right] pairs.
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if m, ok := scanMerges(raw); ok { // fast path: plain strings
		return m, nil
	}
	var asStrings []string
	if err := json.Unmarshal(raw, &asStrings); err == nil {
		out := make([][2]string, len(asStrings))
		for i, m := range asStrings {
			l, r, ok := strings.Cut(m, " ")
			if !ok {
				return nil, fmt.Errorf("merges[%d] %q: %w: want two tokens", i, m, ErrInvalid)
			}
			out[i] = [2]string{l, r}
		}
		return out, nil
	}
	var asPairs [][2]string
	if err := json.Unmarshal(raw, &asPairs); err != nil {
		return nil, fmt.Errorf("merges: %w: %v", ErrInvalid, err)
	}
	return asPairs, nil
}

// builtModel is the model of tokenizer.json with what the rest of the tokenizer needs of it.
type builtModel struct {
	model wordModel
	bpe   *bpe              // the model when it is BPE
	vocab map[string]uint32 // token text → ID, as tokenizer.json writes it
	text  []string          // token text by ID where the vocabulary is a list (Unigram)
	size  int               // the vocabulary size the tokenizers library reports
}

// buildModel builds the model of tokenizer.json: BPE (byte-level when the pre-tokenizer maps
// bytes, else SentencePiece style), WordPiece or Unigram.
func buildModel(m *modelJSON, byteLevel bool, toByte map[rune]byte) (*builtModel, error) {
	if m.Dropout != nil && *m.Dropout != 0 {
		return nil, fmt.Errorf("model.dropout: %w (dropout makes encoding random)", ErrUnsupported)
	}
	switch m.Type {
	case "", "BPE":
		vocab, err := vocabMap(m.Vocab)
		if err != nil {
			return nil, err
		}
		b, err := buildBPE(m, vocab, byteLevel, toByte)
		if err != nil {
			return nil, err
		}
		return &builtModel{model: b, bpe: b, vocab: vocab, size: len(vocab)}, nil
	case "WordPiece":
		vocab, err := vocabMap(m.Vocab)
		if err != nil {
			return nil, err
		}
		w, err := buildWordPiece(m, vocab)
		if err != nil {
			return nil, err
		}
		return &builtModel{model: w, vocab: vocab, size: len(vocab)}, nil
	case "Unigram":
		u, text, err := buildUnigram(m)
		if err != nil {
			return nil, err
		}
		return &builtModel{model: u, vocab: u.ids, text: text, size: len(text)}, nil
	}
	return nil, fmt.Errorf("model %q: %w (BPE, WordPiece and Unigram are)", m.Type, ErrUnsupported)
}

func vocabMap(raw json.RawMessage) (map[string]uint32, error) {
	v, ok := scanVocab(raw) // fast path: plain strings and IDs
	if !ok {
		v = nil
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("model.vocab: %w: %v", ErrInvalid, err)
		}
	}
	if len(v) == 0 {
		return nil, fmt.Errorf("model.vocab: %w: empty", ErrInvalid)
	}
	return v, nil
}

// buildBPE builds a BPE model: byte-level (the vocabulary kept in raw bytes) or character
// level.
func buildBPE(m *modelJSON, vocab map[string]uint32, byteLevel bool, toByte map[rune]byte) (*bpe, error) {
	switch {
	case m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "":
		return nil, fmt.Errorf("model.continuing_subword_prefix: %w", ErrUnsupported)
	case m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "":
		return nil, fmt.Errorf("model.end_of_word_suffix: %w", ErrUnsupported)
	case byteLevel && m.ByteFallback:
		return nil, fmt.Errorf("model.byte_fallback: %w with a byte-level pre-tokenizer", ErrUnsupported)
	}
	merges, err := parseMerges(m.Merges)
	if err != nil {
		return nil, fmt.Errorf("model.%w", err)
	}
	b := &bpe{vocab: make(map[string]uint32, len(vocab)), byteLevel: byteLevel, ignoreMerges: m.IgnoreMerges,
		byteFallback: m.ByteFallback, fuseUnk: m.FuseUnk, unk: -1, cache: newWordCache(1 << 15)}
	for i := range b.byteID {
		b.byteID[i] = -1
	}
	if byteLevel {
		for tok, id := range vocab {
			raw, ok := fromByteLevel(tok, toByte)
			if !ok {
				continue // never produced by byte-level merges; still decodable
			}
			b.vocab[raw] = id
			if len(raw) == 1 {
				b.byteID[raw[0]] = int64(id)
			}
		}
	} else {
		b.charID = make([]int32, 0x10000)
		for i := range b.charID {
			b.charID[i] = -1
		}
		b.astralID = map[rune]uint32{}
		b.cutMeta = true
		for tok, id := range vocab {
			b.vocab[tok] = id
			if r, n := utf8.DecodeRuneInString(tok); n == len(tok) && (r != utf8.RuneError || n == 3) {
				if r < 0x10000 {
					b.charID[r] = int32(id)
				} else {
					b.astralID[r] = id
				}
			}
			if by, ok := byteToken(tok); ok && strings.ToUpper(tok[3:5]) == tok[3:5] {
				b.byteID[by] = int64(id)
			}
			// A token that holds a ▁ after an ASCII letter or digit forbids cutting there: no
			// merge can otherwise join the two sides (see bpe.cutEnd).
			for k := strings.Index(tok, string(metaspaceRune)); k > 0; {
				if asciiAlnum(tok[k-1]) {
					b.cutMeta = false
				}
				next := strings.Index(tok[k+1:], string(metaspaceRune))
				if next < 0 {
					break
				}
				k += 1 + next
			}
		}
		if m.UnkToken != nil {
			if id, ok := vocab[*m.UnkToken]; ok {
				b.unk = int64(id)
			}
		}
		// Cutting before a ▁ that follows an ASCII letter or digit also needs both sides to
		// be tokens of their own (no unknown run, no byte fallback, can span the place).
		for _, c := range "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" + string(metaspaceRune) {
			if _, ok := b.charToken(c); !ok {
				b.cutMeta = false
			}
		}
	}
	b.merges = newMergeTable(len(merges))
	for rank, mg := range merges {
		l, okL := vocab[mg[0]]
		r, okR := vocab[mg[1]]
		id, okID := vocab[mg[0]+mg[1]]
		if !okL || !okR || !okID {
			return nil, fmt.Errorf("model.merges[%d] %q: %w: token not in the vocabulary", rank, mg[0]+" "+mg[1], ErrInvalid)
		}
		if rank >= math.MaxUint32-1 {
			return nil, fmt.Errorf("model.merges: %w: too many", ErrInvalid)
		}
		b.merges.set(l, r, uint32(rank), id)
	}
	return b, nil
}

// buildWordPiece builds a WordPiece model.
func buildWordPiece(m *modelJSON, vocab map[string]uint32) (*wordPiece, error) {
	prefix := "##"
	if m.ContinuingSubwordPrefix != nil {
		prefix = *m.ContinuingSubwordPrefix
	}
	unkTok := "[UNK]"
	if m.UnkToken != nil {
		unkTok = *m.UnkToken
	}
	unk, ok := vocab[unkTok]
	if !ok {
		return nil, fmt.Errorf("model.unk_token %q: %w: not in the vocabulary", unkTok, ErrInvalid)
	}
	w := &wordPiece{start: make(map[string]uint32, len(vocab)), cont: map[string]uint32{}, unk: unk,
		maxChars: 100, cache: newWordCache(1 << 15)}
	if m.MaxInputCharsPerWord != nil {
		w.maxChars = *m.MaxInputCharsPerWord
	}
	for tok, id := range vocab {
		w.start[tok] = id
		w.maxLen = max(w.maxLen, len(tok))
		if rest, ok := strings.CutPrefix(tok, prefix); ok && prefix != "" {
			w.cont[rest] = id
		} else if prefix == "" {
			w.cont[tok] = id
		}
	}
	return w, nil
}

// buildUnigram builds a Unigram model from its [token, score] list; it also returns the
// token text of every ID.
func buildUnigram(m *modelJSON) (*unigram, []string, error) {
	var list []struct {
		tok   string
		score float64
	}
	var rawList [][2]json.RawMessage
	if err := json.Unmarshal(m.Vocab, &rawList); err != nil {
		return nil, nil, fmt.Errorf("model.vocab: %w: want [token, score] pairs: %v", ErrInvalid, err)
	}
	if len(rawList) == 0 {
		return nil, nil, fmt.Errorf("model.vocab: %w: empty", ErrInvalid)
	}
	list = make([]struct {
		tok   string
		score float64
	}, len(rawList))
	for i, p := range rawList {
		if err := json.Unmarshal(p[0], &list[i].tok); err != nil {
			return nil, nil, fmt.Errorf("model.vocab[%d]: %w: %v", i, ErrInvalid, err)
		}
		if err := json.Unmarshal(p[1], &list[i].score); err != nil {
			return nil, nil, fmt.Errorf("model.vocab[%d]: %w: %v", i, ErrInvalid, err)
		}
	}
	u := &unigram{ids: make(map[string]uint32, len(list)), scores: make([]float64, len(list)), unk: -1,
		byteFallback: m.ByteFallback, cache: newWordCache(1 << 15)}
	text := make([]string, len(list))
	for i := range u.byteID {
		u.byteID[i] = -1
	}
	for i, e := range list {
		u.ids[e.tok] = uint32(i) // a later duplicate wins, as in the tokenizers library
		u.scores[i] = e.score
		text[i] = e.tok
	}
	for tok, id := range u.ids {
		if by, ok := byteToken(tok); ok && strings.ToUpper(tok[3:5]) == tok[3:5] {
			u.byteID[by] = int64(id)
		}
	}
	if m.UnkID != nil {
		if *m.UnkID < 0 || *m.UnkID >= len(list) {
			return nil, nil, fmt.Errorf("model.unk_id %d: %w: outside the vocabulary", *m.UnkID, ErrInvalid)
		}
		u.unk = int64(*m.UnkID)
	}
	u.unkScore = minScore(u.scores) - unkPenalty
	u.trie = newByteTrie(u.ids)
	return u, text, nil
}

// configJSON is the part of tokenizer_config.json Switchyard reads.
type configJSON struct {
	ChatTemplate            json.RawMessage            `json:"chat_template"`
	BosToken                json.RawMessage            `json:"bos_token"`
	EosToken                json.RawMessage            `json:"eos_token"`
	UnkToken                json.RawMessage            `json:"unk_token"`
	SepToken                json.RawMessage            `json:"sep_token"`
	PadToken                json.RawMessage            `json:"pad_token"`
	ClsToken                json.RawMessage            `json:"cls_token"`
	MaskToken               json.RawMessage            `json:"mask_token"`
	AdditionalSpecialTokens []json.RawMessage          `json:"additional_special_tokens"`
	AddedTokensDecoder      map[string]json.RawMessage `json:"added_tokens_decoder"`
}

// tokenString reads a special token of tokenizer_config.json: a string, an AddedToken object
// with a content field, or null.
func tokenString(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Content != nil {
		return *obj.Content, true
	}
	return "", false
}

// chatTemplateSource picks the chat template of tokenizer_config.json: a string, or a list of
// named templates of which "default" is used.
func chatTemplateSource(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", fmt.Errorf("chat_template: %w: %v", ErrInvalid, err)
	}
	names := make([]string, 0, len(named))
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
		names = append(names, n.Name)
	}
	sort.Strings(names)
	return "", fmt.Errorf("chat_template: %w: no template named \"default\" among %v", ErrInvalid, names)
}

// validToken reports whether a token string can be matched in text.
func validToken(s string) bool { return s != "" && utf8.ValidString(s) }
