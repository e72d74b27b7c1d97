package indexer

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"switchyard/kv"
	"switchyard/kv/events"
	"switchyard/kv/index"
)

// The indexer protocol (`switchyard indexer`, POST /v1/prefix/match). A query is a model and
// the prompt's token IDs; the answer lists the workers holding a prefix with the number of
// leading tokens each holds. Two encodings, chosen by the request's Content-Type (the answer
// uses the same one):
//
// Binary, Content-Type application/x-switchyard-prefix (what RemoteSource sends):
//
//	query:  "SYQ1" uvarint(len(model)) model uvarint(n) n × uint32 little-endian token IDs
//	answer: "SYR1" uvarint(query_tokens) uvarint(count)
//	        count × ( uvarint(len(worker)) worker uvarint(tokens) )
//
// A query sent with the header X-Switchyard-Prefix-Ranks: 1 (HeaderRanks) asks for the
// data-parallel ranks too; an indexer that knows the header answers version 2, each match
// followed by the ranks holding its tokens (bit r for rank r, ranks below 64), and one that
// does not answers version 1, which a client reads as ranks unknown:
//
//	answer: "SYR2" uvarint(query_tokens) uvarint(count)
//	        count × ( uvarint(len(worker)) worker uvarint(tokens) uvarint(ranks) )
//
// JSON, Content-Type application/json:
//
//	query:  {"model": "llama", "token_ids": [1, 2, 3]}
//	answer: {"query_tokens": 3, "matches": [{"worker": "w1", "tokens": 2, "ranks": [0]}]}
//
// ("ranks" is left out when unknown.)
//
// Errors: 400 for a malformed query (the client reports ErrRejected), 413 for more than
// MaxQueryTokens tokens, 503 when the index cannot answer in time; the client reports both
// as ErrUnavailable.
const (
	ContentTypeBinary = "application/x-switchyard-prefix"
	ContentTypeJSON   = "application/json"
	// PathMatch is the indexer's lookup route.
	PathMatch = "/v1/prefix/match"
)

// Protocol limits.
const (
	// MaxQueryTokens bounds a query's prompt.
	MaxQueryTokens = 1 << 20
	// MaxModelName bounds a model name, in bytes.
	MaxModelName = 1024
	// maxAnswerMatches bounds the matches of an answer a client accepts.
	maxAnswerMatches = index.MaxOwners
	// MaxQueryBytes bounds a query body in either encoding.
	MaxQueryBytes = 16 << 20
)

var (
	queryMagic    = [4]byte{'S', 'Y', 'Q', '1'}
	answerMagic   = [4]byte{'S', 'Y', 'R', '1'}
	answerMagicV2 = [4]byte{'S', 'Y', 'R', '2'}
)

// HeaderRanks is the query header asking for the ranks of each match (answer version 2).
const HeaderRanks = "X-Switchyard-Prefix-Ranks"

// Protocol errors. A malformed query or answer wraps ErrMalformed; an over-long query also
// wraps ErrQueryTooLarge.
var ErrQueryTooLarge = errors.New("prefix query too large")

// AppendQuery appends the binary query for model and tokens to dst.
func AppendQuery(dst []byte, model string, tokens []uint32) []byte {
	dst = append(dst, queryMagic[:]...)
	dst = binary.AppendUvarint(dst, uint64(len(model)))
	dst = append(dst, model...)
	dst = binary.AppendUvarint(dst, uint64(len(tokens)))
	for _, t := range tokens {
		dst = binary.LittleEndian.AppendUint32(dst, t)
	}
	return dst
}

// DecodeQuery decodes a binary query, appending the tokens to tokens[:0]. The model aliases
// body.
func DecodeQuery(body []byte, tokens []uint32) (model []byte, _ []uint32, err error) {
	r := wireReader{b: body}
	if !r.magic(queryMagic) {
		return nil, tokens, fmt.Errorf("cannot decode prefix query: %w: bad magic", events.ErrMalformed)
	}
	n, err := r.uvarint(MaxModelName)
	if err != nil {
		return nil, tokens, fmt.Errorf("cannot decode prefix query model: %w", err)
	}
	model, err = r.bytes(int(n))
	if err != nil {
		return nil, tokens, fmt.Errorf("cannot decode prefix query model: %w", err)
	}
	cnt, err := r.uvarint(^uint64(0))
	if err != nil {
		return nil, tokens, fmt.Errorf("cannot decode prefix query length: %w", err)
	}
	if cnt > MaxQueryTokens {
		return nil, tokens, fmt.Errorf("cannot decode prefix query: %w: %w: %d tokens, at most %d", events.ErrMalformed, ErrQueryTooLarge, cnt, MaxQueryTokens)
	}
	raw, err := r.bytes(int(cnt) * 4)
	if err != nil {
		return nil, tokens, fmt.Errorf("cannot decode prefix query tokens: %w", err)
	}
	if r.off != len(body) {
		return nil, tokens, fmt.Errorf("cannot decode prefix query: %w: %d trailing bytes", events.ErrMalformed, len(body)-r.off)
	}
	tokens = tokens[:0]
	for i := 0; i < len(raw); i += 4 {
		tokens = append(tokens, binary.LittleEndian.Uint32(raw[i:]))
	}
	return model, tokens, nil
}

// AppendAnswer appends the binary answer l to dst: version 2, with each match's ranks, when
// ranks, else version 1.
func AppendAnswer(dst []byte, l *kv.Lookup, ranks bool) []byte {
	if ranks {
		dst = append(dst, answerMagicV2[:]...)
	} else {
		dst = append(dst, answerMagic[:]...)
	}
	dst = binary.AppendUvarint(dst, uint64(l.QueryTokens))
	dst = binary.AppendUvarint(dst, uint64(len(l.Matches)))
	for _, m := range l.Matches {
		dst = binary.AppendUvarint(dst, uint64(len(m.Worker)))
		dst = append(dst, m.Worker...)
		dst = binary.AppendUvarint(dst, uint64(m.Tokens))
		if ranks {
			dst = binary.AppendUvarint(dst, m.Ranks)
		}
	}
	return dst
}

// DecodeAnswer decodes a binary answer into dst (reusing its slices). intern turns a worker
// ID's bytes into a string (nil: a plain copy).
func DecodeAnswer(body []byte, dst *kv.Lookup, intern func([]byte) string) error {
	dst.Reset()
	r := wireReader{b: body}
	v2 := r.magic(answerMagicV2)
	if !v2 && !r.magic(answerMagic) {
		return fmt.Errorf("cannot decode prefix answer: %w: bad magic", events.ErrMalformed)
	}
	qt, err := r.uvarint(MaxQueryTokens)
	if err != nil {
		return fmt.Errorf("cannot decode prefix answer: %w", err)
	}
	n, err := r.uvarint(maxAnswerMatches)
	if err != nil {
		return fmt.Errorf("cannot decode prefix answer: %w", err)
	}
	dst.QueryTokens = int(qt)
	for range n {
		ln, err := r.uvarint(MaxModelName)
		if err != nil {
			return fmt.Errorf("cannot decode prefix answer worker: %w", err)
		}
		id, err := r.bytes(int(ln))
		if err != nil {
			return fmt.Errorf("cannot decode prefix answer worker: %w", err)
		}
		tok, err := r.uvarint(MaxQueryTokens)
		if err != nil {
			return fmt.Errorf("cannot decode prefix answer tokens: %w", err)
		}
		var ranks uint64
		if v2 {
			if ranks, err = r.uvarint(^uint64(0)); err != nil {
				return fmt.Errorf("cannot decode prefix answer ranks: %w", err)
			}
		}
		w := string(id)
		if intern != nil {
			w = intern(id)
		}
		dst.Matches = append(dst.Matches, kv.Match{Worker: w, Tokens: int64(tok), Ranks: ranks})
	}
	if r.off != len(body) {
		return fmt.Errorf("cannot decode prefix answer: %w: %d trailing bytes", events.ErrMalformed, len(body)-r.off)
	}
	dst.Normalize()
	return nil
}

// jsonQuery and jsonAnswer are the JSON encoding.
type jsonQuery struct {
	Model    string   `json:"model"`
	TokenIDs []uint32 `json:"token_ids"`
}

type jsonAnswer struct {
	QueryTokens int         `json:"query_tokens"`
	Matches     []jsonMatch `json:"matches"`
}

type jsonMatch struct {
	Worker string `json:"worker"`
	Tokens int64  `json:"tokens"`
	Ranks  []int  `json:"ranks,omitempty"`
}

// DecodeJSONQuery decodes a JSON query.
func DecodeJSONQuery(body []byte) (string, []uint32, error) {
	var q jsonQuery
	if err := json.Unmarshal(body, &q); err != nil {
		return "", nil, fmt.Errorf("cannot decode prefix query: %w: %w", events.ErrMalformed, err)
	}
	switch {
	case len(q.Model) > MaxModelName:
		return "", nil, fmt.Errorf("cannot decode prefix query: %w: model name of %d bytes", events.ErrMalformed, len(q.Model))
	case len(q.TokenIDs) > MaxQueryTokens:
		return "", nil, fmt.Errorf("cannot decode prefix query: %w: %w: %d tokens", events.ErrMalformed, ErrQueryTooLarge, len(q.TokenIDs))
	}
	return q.Model, q.TokenIDs, nil
}

// AppendJSONAnswer appends the JSON answer l to dst.
func AppendJSONAnswer(dst []byte, l *kv.Lookup) []byte {
	a := jsonAnswer{QueryTokens: l.QueryTokens, Matches: make([]jsonMatch, 0, len(l.Matches))}
	for _, m := range l.Matches {
		jm := jsonMatch{Worker: m.Worker, Tokens: m.Tokens}
		for r := range 64 {
			if m.Ranks&kv.RankBit(r) != 0 {
				jm.Ranks = append(jm.Ranks, r)
			}
		}
		a.Matches = append(a.Matches, jm)
	}
	b, _ := json.Marshal(a) // plain strings and integers: cannot fail
	return append(dst, b...)
}

// isJSON reports whether a Content-Type names JSON.
func isJSON(contentType []byte) bool {
	ct := strings.ToLower(strings.TrimSpace(string(contentType)))
	return strings.HasPrefix(ct, ContentTypeJSON)
}

// wireReader reads the binary protocol.
type wireReader struct {
	b   []byte
	off int
}

func (r *wireReader) magic(m [4]byte) bool {
	if len(r.b) < 4 || [4]byte(r.b[:4]) != m {
		return false
	}
	r.off = 4
	return true
}

func (r *wireReader) uvarint(limit uint64) (uint64, error) {
	v, n := binary.Uvarint(r.b[r.off:])
	if n <= 0 || (n > 1 && r.b[r.off+n-1] == 0) { // overflow, truncation, or not minimal
		return 0, fmt.Errorf("%w: bad varint at byte %d", events.ErrMalformed, r.off)
	}
	if v > limit {
		return 0, fmt.Errorf("%w: value %d above %d", events.ErrMalformed, v, limit)
	}
	r.off += n
	return v, nil
}

func (r *wireReader) bytes(n int) ([]byte, error) {
	if n < 0 || n > len(r.b)-r.off {
		return nil, fmt.Errorf("%w: %d bytes needed at byte %d, %d left", events.ErrMalformed, n, r.off, len(r.b)-r.off)
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p, nil
}
