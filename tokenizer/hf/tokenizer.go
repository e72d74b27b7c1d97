package hf

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"switchyard/tokenizer"
)

// Tokenizer is a Hugging Face tokenizer (tokenizer.json with its tokenizer_config.json)
// with its chat template. It is immutable after Load, apart from its caches, and safe for
// concurrent use.
type Tokenizer struct {
	added     *addedMatcher // tokens matched in raw text
	addedNorm *addedMatcher // tokens matched after normalization, or nil
	norm      normalizer    // or nil
	pre       preTokenizer  // or nil: the segment is one piece
	fast      scanner       // pre when it is a bare scanner, for the hot loop
	byteLevel bool          // a byte-level BPE: raw text is chunked (see chunkEnd)
	model     wordModel
	bpe       *bpe        // model when it is a byte-level BPE, for the hot loop
	chunks    *chunkCache // or nil
	chunkCut  bool        // chunks may end inside a segment (see chunkEnd)
	slashLine bool        // chunkEnd does not cut before a line that starts with '/'
	prefix    []uint32    // post-processor IDs before the text
	suffix    []uint32    // post-processor IDs after the text

	decoder   decoderKind
	steps     []decodeStep // decodeChain's steps
	pieces    []byte       // decoding bytes of every ID, back to back
	pieceEnd  []uint32     // pieces[pieceEnd[id-1]:pieceEnd[id]] decodes id; see piece
	present   []bool       // the ID exists
	special   []bool       // the ID is a special added token
	tokenIDs  map[string]uint32
	tokenText []string // token strings as tokenizer.json spells them, by ID

	chat *chatTemplate // or nil

	scratch *sync.Pool // *[]string, pieces of one chunk
	log     *slog.Logger
}

var (
	_ tokenizer.Tokenizer     = (*Tokenizer)(nil)
	_ tokenizer.ChatTemplater = (*Tokenizer)(nil)
)

// Options configures Load and New. The zero value is ready to use.
type Options struct {
	// CacheBytes bounds the chunk cache that spares re-encoding text seen before (a
	// conversation's history), in bytes of text plus IDs. Default (0): 64 MiB. Negative:
	// no chunk cache.
	CacheBytes int64
	// Logger receives one line per load. Default: no logging.
	Logger *slog.Logger
	// Now is the clock of the chat template's strftime_now. Default: time.Now.
	Now func() time.Time
}

// DefaultCacheBytes is the chunk cache bound when Options.CacheBytes is 0.
const DefaultCacheBytes = 64 << 20

// File names Load looks for in a directory.
const (
	TokenizerFile    = "tokenizer.json"
	ConfigFile       = "tokenizer_config.json"
	ChatTemplateFile = "chat_template.jinja"
)

// Load reads a tokenizer from path: a directory holding tokenizer.json (required),
// tokenizer_config.json and chat_template.jinja (optional), or the tokenizer.json file itself,
// in which case the optional files are looked for beside it.
func Load(path string, opts Options) (*Tokenizer, error) {
	tokPath, dir := path, filepath.Dir(path)
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("cannot load tokenizer %s: %w", path, err)
	}
	if st.IsDir() {
		tokPath, dir = filepath.Join(path, TokenizerFile), path
	}
	tokJSON, err := os.ReadFile(tokPath)
	if err != nil {
		return nil, fmt.Errorf("cannot load tokenizer %s: %w", path, err)
	}
	cfgJSON, err := readOptional(filepath.Join(dir, ConfigFile))
	if err != nil {
		return nil, fmt.Errorf("cannot load tokenizer %s: %w", path, err)
	}
	tmpl, err := readOptional(filepath.Join(dir, ChatTemplateFile))
	if err != nil {
		return nil, fmt.Errorf("cannot load tokenizer %s: %w", path, err)
	}
	start := time.Now()
	t, err := newTokenizer(tokJSON, cfgJSON, string(tmpl), opts)
	if err != nil {
		return nil, fmt.Errorf("cannot load tokenizer %s: %w", path, err)
	}
	t.log.Info("tokenizer loaded", slog.String("path", path), slog.Int("vocab", t.VocabSize()),
		slog.Bool("chat_template", t.chat != nil), slog.Duration("took", time.Since(start)))
	return t, nil
}

func readOptional(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return b, err
}

// New builds a tokenizer from the contents of tokenizer.json and, optionally (nil),
// tokenizer_config.json.
func New(tokenizerJSON, configJSON []byte, opts Options) (*Tokenizer, error) {
	t, err := newTokenizer(tokenizerJSON, configJSON, "", opts)
	if err != nil {
		return nil, fmt.Errorf("cannot build tokenizer: %w", err)
	}
	return t, nil
}

func newTokenizer(tokJSON, cfgJSON []byte, chatTemplateFile string, opts Options) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(tokJSON, &f); err != nil {
		return nil, fmt.Errorf("%s: %w: %v", TokenizerFile, ErrInvalid, err)
	}
	t := &Tokenizer{log: opts.Logger}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	cls := newClassifier()
	var err error
	if t.norm, err = buildNormalizer(f.Normalizer, "normalizer"); err != nil {
		return nil, err
	}
	spec, err := buildPreTokenizer(f.PreTokenizer, "pre_tokenizer", cls)
	if err != nil {
		return nil, err
	}
	t.pre = spec.pre
	t.fast, _ = spec.pre.(scanner)
	_, toByte := byteLevelAlphabet()
	if t.decoder, t.steps, err = buildDecoder(f.Decoder, "decoder", toByte); err != nil {
		return nil, err
	}
	if t.prefix, t.suffix, err = buildPostProcessor(f.PostProcessor, "post_processor"); err != nil {
		return nil, err
	}
	isBPE := f.Model.Type == "" || f.Model.Type == "BPE"
	bm, err := buildModel(&f.Model, isBPE && spec.byteLevel, toByte)
	if err != nil {
		return nil, err
	}
	t.model = bm.model
	if isBPE && spec.byteLevel {
		t.byteLevel, t.bpe = true, bm.bpe
	} else if spec.byteLevel {
		return nil, fmt.Errorf("pre_tokenizer: %w: a ByteLevel pre-tokenizer with a %s model", ErrUnsupported, f.Model.Type)
	}

	// Added tokens take the ID of the same token in the model's vocabulary, else the next
	// free ID after the vocabulary, whatever ID the file gives: the tokenizers library's rule.
	nextID := uint32(bm.size)
	var raw, normed []addedToken
	seen := make(map[string]bool, len(f.AddedTokens))
	for i := range f.AddedTokens {
		a := &f.AddedTokens[i]
		if !validToken(a.Content) {
			return nil, fmt.Errorf("added_tokens[%d]: %w: empty or not UTF-8", i, ErrInvalid)
		}
		if seen[a.Content] {
			a.Content = "" // the tokenizers library keeps the first; dropped below
			continue
		}
		seen[a.Content] = true
		id, inVocab := bm.vocab[a.Content]
		if !inVocab {
			id = nextID
			nextID++
		}
		if id != a.ID {
			t.log.Warn("added token takes another ID than its file says", slog.String("token", a.Content),
				slog.Uint64("file_id", uint64(a.ID)), slog.Uint64("id", uint64(id)))
			a.ID = id
		}
		tok := addedToken{id: a.ID, content: a.Content, special: a.Special, singleWord: a.SingleWord,
			lstrip: a.Lstrip, rstrip: a.Rstrip, normalized: a.Normalized}
		if a.Normalized && !a.Special {
			normed = append(normed, tok)
		} else {
			raw = append(raw, tok)
		}
	}
	f.AddedTokens = slices.DeleteFunc(f.AddedTokens, func(a addedTokenJSON) bool { return a.Content == "" })
	t.added = newAddedMatcher(raw)
	if len(normed) > 0 {
		t.addedNorm = newAddedMatcher(normed)
	}
	t.buildDecoding(&f, bm, toByte)

	if opts.CacheBytes >= 0 {
		limit := opts.CacheBytes
		if limit == 0 {
			limit = DefaultCacheBytes
		}
		t.chunks = newChunkCache(limit)
		t.chunkCut = t.byteLevel && spec.chunkSafe && chunkSafe(t.norm) && t.addedNorm == nil
		t.slashLine = spec.slashLine
	}
	t.scratch = &sync.Pool{New: func() any { s := make([]string, 0, 256); return &s }}

	src, vars, err := chatConfig(cfgJSON)
	if err != nil {
		return nil, err
	}
	if src == "" {
		src = chatTemplateFile
	}
	if src != "" {
		now := opts.Now
		if now == nil {
			now = time.Now
		}
		if t.chat, err = newChatTemplate(src, vars, now); err != nil {
			return nil, fmt.Errorf("chat_template: %w", err)
		}
	}
	return t, nil
}

// buildDecoding lays out the decoding bytes of every ID. Added tokens take precedence over
// the model's vocabulary, as in the tokenizers library.
func (t *Tokenizer) buildDecoding(f *fileJSON, bm *builtModel, toByte map[rune]byte) {
	maxID := uint32(0)
	for _, id := range bm.vocab {
		maxID = max(maxID, id)
	}
	if len(bm.text) > 0 {
		maxID = max(maxID, uint32(len(bm.text)-1))
	}
	for _, a := range f.AddedTokens {
		maxID = max(maxID, a.ID)
	}
	n := int(maxID) + 1
	t.tokenText = make([]string, n)
	t.present = make([]bool, n)
	t.special = make([]bool, n)
	t.tokenIDs = make(map[string]uint32, len(bm.vocab)+len(f.AddedTokens))
	for tok, id := range bm.vocab {
		t.tokenText[id], t.present[id] = tok, true
		t.tokenIDs[tok] = id
	}
	for id, tok := range bm.text { // a list vocabulary: every ID, duplicates included
		t.tokenText[id], t.present[id] = tok, true
	}
	specials := map[string]bool{}
	for _, a := range f.AddedTokens {
		t.tokenText[a.ID], t.present[a.ID] = a.Content, true
		t.tokenIDs[a.Content] = a.ID
		if a.Special {
			specials[a.Content] = true
		}
	}
	// A token is special when its text is a special added token's, whatever its ID.
	for id, tok := range t.tokenText {
		t.special[id] = t.present[id] && specials[tok]
	}
	if t.decoder != decodeByteLevel {
		return
	}
	t.pieceEnd = make([]uint32, n)
	for id, tok := range t.tokenText {
		if raw, ok := fromByteLevel(tok, toByte); ok {
			tok = raw // a character outside the alphabet leaves the token as it is
		}
		t.pieces = append(t.pieces, tok...)
		t.pieceEnd[id] = uint32(len(t.pieces))
	}
}

// piece returns the decoding bytes of id.
func (t *Tokenizer) piece(id uint32) []byte {
	start := uint32(0)
	if id > 0 {
		start = t.pieceEnd[id-1]
	}
	return t.pieces[start:t.pieceEnd[id]]
}

// VocabSize returns the number of IDs, added tokens included (the largest ID plus one).
func (t *Tokenizer) VocabSize() int { return len(t.present) }

// TokenID returns the ID of a token as tokenizer.json spells it (byte-level characters for
// vocabulary tokens, the content for added tokens).
func (t *Tokenizer) TokenID(token string) (uint32, bool) {
	id, ok := t.tokenIDs[token]
	return id, ok
}

// Token returns the token of id as tokenizer.json spells it.
func (t *Tokenizer) Token(id uint32) (string, bool) {
	if int(id) >= len(t.present) || !t.present[id] {
		return "", false
	}
	return t.tokenText[id], true
}

// IsSpecial reports whether id is a special added token.
func (t *Tokenizer) IsSpecial(id uint32) bool { return int(id) < len(t.special) && t.special[id] }

// Encode returns the token IDs of text with the special tokens of the post-processor, as
// transformers' tokenizer(text)["input_ids"] does. Added tokens in text (such as
// "<|im_start|>") are recognized. Ill-formed UTF-8 is first replaced as tokenizer.ValidUTF8 describes.
func (t *Tokenizer) Encode(text string) []uint32 {
	return t.AppendEncode(make([]uint32, 0, len(text)/3+len(t.prefix)+len(t.suffix)+1), text)
}

// AppendEncode appends the IDs of Encode(text) to dst.
func (t *Tokenizer) AppendEncode(dst []uint32, text string) []uint32 {
	dst = append(dst, t.prefix...)
	dst = t.AppendEncodePlain(dst, text)
	return append(dst, t.suffix...)
}

// EncodePlain returns the token IDs of text without the post-processor's special tokens
// (add_special_tokens=False), the encoding of a rendered chat template.
func (t *Tokenizer) EncodePlain(text string) []uint32 {
	return t.AppendEncodePlain(make([]uint32, 0, len(text)/3+1), text)
}

// Count returns len(t.Encode(text)).
func (t *Tokenizer) Count(text string) int {
	buf := make([]uint32, 0, 256)
	return len(t.AppendEncode(buf, text))
}

// AppendEncodePlain appends the IDs of EncodePlain(text) to dst.
func (t *Tokenizer) AppendEncodePlain(dst []uint32, text string) []uint32 {
	text = tokenizer.ValidUTF8(text)
	var buf [32]addedSplit
	for _, sp := range t.added.appendSplits(buf[:0], text) {
		if sp.token >= 0 {
			dst = append(dst, t.added.tokens[sp.token].id)
			continue
		}
		if t.byteLevel {
			dst = t.appendSegment(dst, text[sp.start:sp.end])
		} else {
			dst = t.appendNormalized(dst, text[sp.start:sp.end], sp.start == 0)
		}
	}
	return dst
}

// Chunking: a segment (text between two added tokens) is encoded chunk by chunk through the
// chunk cache. A chunk ends where the segment ends or, when chunkCut, at the first cut point
// at least minChunk bytes into it: the start of a line that starts with an ASCII character
// other than whitespace, or a space between two ASCII letters. The pre-tokenizer patterns
// Switchyard implements by hand never match across such a point and the Unicode normalizers
// never compose across it, so a chunk's IDs do not depend on its neighbours, and because
// cut points depend only on the text before them, a text that extends another shares all
// its chunks but the last.
const (
	minChunk       = 512 // bytes before the earliest cut point of a chunk
	minCachedChunk = 64  // shorter chunks are encoded directly: the lookup would cost as much
)

func (t *Tokenizer) appendSegment(dst []uint32, seg string) []uint32 {
	if t.chunks == nil {
		return t.appendChunk(dst, seg)
	}
	for len(seg) > 0 {
		end := len(seg)
		if t.chunkCut {
			end = chunkEnd(seg, t.slashLine)
		}
		chunk := seg[:end]
		seg = seg[end:]
		if len(chunk) < minCachedChunk {
			dst = t.appendChunk(dst, chunk)
			continue
		}
		if ids, ok := t.chunks.get(chunk); ok { // fast path: a chunk seen before
			dst = append(dst, ids...)
			continue
		}
		start := len(dst)
		dst = t.appendChunk(dst, chunk)
		t.chunks.put(chunk, dst[start:])
	}
	return dst
}

// chunkEnd returns the end of the first chunk of seg; with slashLine, a line that starts with
// '/' is no cut point.
func chunkEnd(seg string, slashLine bool) int {
	for p := minChunk; p < len(seg)-1; p++ {
		c := seg[p]
		switch {
		case seg[p-1] == '\n' && c > ' ' && c < utf8.RuneSelf && !(slashLine && c == '/'):
			return p
		case c == ' ' && asciiLetter(seg[p-1]) && asciiLetter(seg[p+1]):
			return p
		}
	}
	return len(seg)
}

func asciiLetter(c byte) bool { return (c|0x20) >= 'a' && (c|0x20) <= 'z' }

// appendChunk encodes one chunk of a byte-level BPE's segment: normalization, normalized
// added tokens, pre-tokenization and the model.
func (t *Tokenizer) appendChunk(dst []uint32, s string) []uint32 {
	if t.norm != nil {
		s = t.norm.normalize(s)
	}
	if t.addedNorm == nil {
		return t.appendPieces(dst, s)
	}
	var buf [16]addedSplit
	for _, sp := range t.addedNorm.appendSplits(buf[:0], s) {
		if sp.token >= 0 {
			dst = append(dst, t.addedNorm.tokens[sp.token].id)
			continue
		}
		dst = t.appendPieces(dst, s[sp.start:sp.end])
	}
	return dst
}

func (t *Tokenizer) appendPieces(dst []uint32, s string) []uint32 {
	if f := t.fast; f != nil { // fast path: no piece list
		for i := 0; i < len(s); {
			end := f.next(s, i)
			dst = t.bpe.appendWord(dst, s[i:end])
			i = end
		}
		return dst
	}
	bufp := t.scratch.Get().(*[]string)
	pieces := t.pre.appendPieces((*bufp)[:0], s, false)
	for _, p := range pieces {
		dst = t.model.appendWord(dst, p)
	}
	clear(pieces)
	*bufp = pieces[:0]
	t.scratch.Put(bufp)
	return dst
}

// appendNormalized encodes a segment of any tokenizer but a byte-level BPE: the whole segment
// is normalized, cut at normalized added tokens and pre-tokenized, then each piece is encoded
// chunk by chunk (see wordModel.cutEnd) through the chunk cache, keyed by normalized text.
// first reports that the segment starts the text.
func (t *Tokenizer) appendNormalized(dst []uint32, seg string, first bool) []uint32 {
	s := seg
	if t.norm != nil {
		s = t.norm.normalize(s)
	}
	if t.addedNorm == nil {
		return t.appendPiecesOf(dst, s, first)
	}
	var buf [16]addedSplit
	for _, sp := range t.addedNorm.appendSplits(buf[:0], s) {
		if sp.token >= 0 {
			dst = append(dst, t.addedNorm.tokens[sp.token].id)
			continue
		}
		dst = t.appendPiecesOf(dst, s[sp.start:sp.end], first && sp.start == 0)
	}
	return dst
}

func (t *Tokenizer) appendPiecesOf(dst []uint32, s string, first bool) []uint32 {
	if t.pre == nil {
		return t.appendPiece(dst, s)
	}
	bufp := t.scratch.Get().(*[]string)
	pieces := t.pre.appendPieces((*bufp)[:0], s, first)
	for _, p := range pieces {
		dst = t.appendPiece(dst, p)
	}
	clear(pieces)
	*bufp = pieces[:0]
	t.scratch.Put(bufp)
	return dst
}

// appendPiece encodes one piece, chunk by chunk.
func (t *Tokenizer) appendPiece(dst []uint32, w string) []uint32 {
	if t.chunks == nil || len(w) < minCachedChunk {
		return t.model.appendWord(dst, w)
	}
	for len(w) > 0 {
		chunk := w[:t.model.cutEnd(w)]
		w = w[len(chunk):]
		if len(chunk) < minCachedChunk {
			dst = t.model.appendWord(dst, chunk)
			continue
		}
		if ids, ok := t.chunks.get(chunk); ok { // fast path: a chunk seen before
			dst = append(dst, ids...)
			continue
		}
		start := len(dst)
		dst = t.model.appendWord(dst, chunk)
		t.chunks.put(chunk, dst[start:])
	}
	return dst
}

// Decode returns the text of ids, special tokens included; unknown IDs are skipped and byte
// sequences that are not UTF-8 become U+FFFD, as in the tokenizers library.
func (t *Tokenizer) Decode(ids []uint32) string {
	return string(t.AppendDecode(make([]byte, 0, 4*len(ids)), ids, false))
}

// AppendDecode appends the text of ids to dst, leaving out special tokens when skipSpecial.
func (t *Tokenizer) AppendDecode(dst []byte, ids []uint32, skipSpecial bool) []byte {
	start := len(dst)
	if t.decoder == decodeChain {
		tokens := make([]string, 0, len(ids))
		for _, id := range ids {
			if int(id) < len(t.present) && t.present[id] && !(skipSpecial && t.special[id]) {
				tokens = append(tokens, t.tokenText[id])
			}
		}
		for _, st := range t.steps {
			tokens = st.apply(tokens)
		}
		for _, tok := range tokens {
			dst = append(dst, tok...)
		}
	} else {
		first := true
		for _, id := range ids {
			if int(id) >= len(t.present) || !t.present[id] || (skipSpecial && t.special[id]) {
				continue
			}
			if t.decoder == decodeJoinSpace {
				if !first {
					dst = append(dst, ' ')
				}
				dst = append(dst, t.tokenText[id]...)
			} else {
				dst = append(dst, t.piece(id)...)
			}
			first = false
		}
	}
	if utf8.Valid(dst[start:]) {
		return dst
	}
	fixed := tokenizer.AppendValidUTF8Bytes(nil, dst[start:])
	return append(dst[:start], fixed...)
}

// CacheStats reports the chunk cache's hits, misses and the bytes it holds.
func (t *Tokenizer) CacheStats() (hits, misses uint64, bytes int64) {
	if t.chunks == nil {
		return 0, 0, 0
	}
	return t.chunks.stats()
}

// chatConfig reads the chat template source and the special-token variables transformers
// passes to it from tokenizer_config.json.
func chatConfig(cfgJSON []byte) (string, map[string]any, error) {
	vars := map[string]any{}
	if len(cfgJSON) == 0 {
		return "", vars, nil
	}
	var c configJSON
	if err := json.Unmarshal(cfgJSON, &c); err != nil {
		return "", nil, fmt.Errorf("%s: %w: %v", ConfigFile, ErrInvalid, err)
	}
	src, err := chatTemplateSource(c.ChatTemplate)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", ConfigFile, err)
	}
	for name, raw := range map[string]json.RawMessage{
		"bos_token": c.BosToken, "eos_token": c.EosToken, "unk_token": c.UnkToken,
		"sep_token": c.SepToken, "pad_token": c.PadToken, "cls_token": c.ClsToken, "mask_token": c.MaskToken,
	} {
		if s, ok := tokenString(raw); ok {
			vars[name] = s
		}
	}
	if len(c.AdditionalSpecialTokens) > 0 {
		list := make([]any, 0, len(c.AdditionalSpecialTokens))
		for _, raw := range c.AdditionalSpecialTokens {
			if s, ok := tokenString(raw); ok {
				list = append(list, s)
			}
		}
		vars["additional_special_tokens"] = list
	}
	return src, vars, nil
}
