package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"switchyard/tokenizer"

	"switchyard/internal/mix"
)

// NameTrace is the workload name of a replayed request trace.
const NameTrace = "trace"

// Bounds of a trace, so that a file decides nothing about our memory.
const (
	// MaxTraceLine is the longest line read, in bytes.
	MaxTraceLine = 1 << 20
	// MaxTraceTokens bounds one request's input and output lengths.
	MaxTraceTokens = 1 << 24
	// maxTraceMs bounds a timestamp (about 31 years).
	maxTraceMs = 1e12
)

// ErrInvalidTrace is wrapped by every error about a trace's content.
var ErrInvalidTrace = errors.New("invalid trace")

// TraceConfig shapes a trace replay. Zero fields take the defaults.
type TraceConfig struct {
	// Name labels the workload (the file's base name). Default "trace".
	Name string
	// BlockSize is the number of tokens one hash ID stands for. Default 512.
	BlockSize int
	// MaxRequests reads the first MaxRequests requests only. Default 0: every line.
	MaxRequests int
	// MaxOutput caps each request's output length, in tokens. Default 0: as recorded.
	MaxOutput int
	// Chat renders each prompt as chat text of the built-in tokenizer (one user message)
	// instead of token IDs.
	Chat bool
}

func (c TraceConfig) withDefaults() TraceConfig {
	if c.Name == "" {
		c.Name = NameTrace
	}
	def(&c.BlockSize, 512)
	return c
}

// traceLine is one line of a Mooncake-format trace.
type traceLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int64   `json:"input_length"`
	OutputLength *int64   `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

// ReadTrace reads a request trace in the Mooncake format: JSON Lines, one request per line,
// {"timestamp": ms since the first request, "input_length": tokens, "output_length": tokens,
// "hash_ids": [ints]}, each hash ID standing for one block of BlockSize prompt tokens (the
// last block may be partial), requests that share a leading run of hash IDs sharing that
// prompt prefix. Blank lines are skipped and unknown keys ignored.
//
// Each hash ID maps deterministically (from seed) to BlockSize token IDs, so equal hash IDs
// are equal tokens wherever they occur. Requests are ordered by timestamp (stably) and carry
// it as their arrival time (At); Workload.Replay is set. Every line is checked against the
// format; an error names the line.
func ReadTrace(r io.Reader, c TraceConfig, seed uint64) (*Workload, error) {
	c = c.withDefaults()
	var p problems
	p.atLeast("trace.block_size", c.BlockSize, 1)
	if c.BlockSize > MaxTraceTokens {
		p = append(p, fmt.Errorf("%w: trace.block_size: %d exceeds %d", ErrInvalidConfig, c.BlockSize, MaxTraceTokens))
	}
	p.atLeast("trace.max_requests", c.MaxRequests, 0)
	p.atLeast("trace.max_output", c.MaxOutput, 0)
	if err := p.err(); err != nil {
		return nil, fmt.Errorf("cannot read trace: %w", err)
	}
	limit := maxRequests
	if c.MaxRequests > 0 {
		limit = min(limit, c.MaxRequests)
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), MaxTraceLine)
	var reqs []Request
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		if len(reqs) == limit {
			if c.MaxRequests == 0 {
				return nil, fmt.Errorf("cannot read trace: %w: more than %d requests", ErrInvalidTrace, maxRequests)
			}
			break
		}
		req, err := parseTraceLine(b, c, seed)
		if err != nil {
			return nil, fmt.Errorf("cannot read trace: line %d: %w", line, err)
		}
		req.Class = "l" + strconv.Itoa(line)
		reqs = append(reqs, req)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("cannot read trace: line %d: %w: longer than %d bytes", line+1, ErrInvalidTrace, MaxTraceLine)
		}
		return nil, fmt.Errorf("cannot read trace: %w", err)
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("cannot read trace: %w: no requests", ErrInvalidTrace)
	}
	slices.SortStableFunc(reqs, func(a, b Request) int { return int(a.At - b.At) })
	first := reqs[0].At
	var in, out int64
	for i := range reqs {
		reqs[i].Index = i
		reqs[i].At -= first
		in += int64(reqs[i].Tokens.Len)
		out += int64(reqs[i].MaxTokens)
	}
	n := int64(len(reqs))
	span := reqs[len(reqs)-1].At
	desc := fmt.Sprintf("%d requests over %.1f s, mean input %d tokens, mean output %d tokens, %d-token blocks",
		n, span.Seconds(), in/n, out/n, c.BlockSize)
	if c.MaxOutput > 0 {
		desc += fmt.Sprintf(", output capped at %d", c.MaxOutput)
	}
	return &Workload{Name: c.Name, Description: desc, Requests: reqs, Replay: true}, nil
}

// parseTraceLine decodes and checks one line.
func parseTraceLine(b []byte, c TraceConfig, seed uint64) (Request, error) {
	var l traceLine
	if err := json.Unmarshal(b, &l); err != nil {
		return Request{}, fmt.Errorf("%w: %v", ErrInvalidTrace, err)
	}
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvalidTrace, fmt.Sprintf(format, args...)))
	}
	switch {
	case l.Timestamp == nil:
		bad("timestamp is missing")
	case !(*l.Timestamp >= 0 && *l.Timestamp <= maxTraceMs):
		bad("timestamp %v is outside 0..%g ms", *l.Timestamp, maxTraceMs)
	}
	switch {
	case l.InputLength == nil:
		bad("input_length is missing")
	case *l.InputLength < 1 || *l.InputLength > MaxTraceTokens:
		bad("input_length %d is outside 1..%d", *l.InputLength, MaxTraceTokens)
	}
	switch {
	case l.OutputLength == nil:
		bad("output_length is missing")
	case *l.OutputLength < 1 || *l.OutputLength > MaxTraceTokens:
		bad("output_length %d is outside 1..%d", *l.OutputLength, MaxTraceTokens)
	}
	if len(errs) == 0 {
		// input_length tokens fill len(hash_ids) blocks, the last one at least partly.
		n, bs := *l.InputLength, int64(c.BlockSize)
		if want := (n + bs - 1) / bs; int64(len(l.HashIDs)) != want {
			bad("%d hash_ids for input_length %d: %d-token blocks need %d (is --trace-block-size right?)", len(l.HashIDs), n, bs, want)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Request{}, err
	}
	out := int(*l.OutputLength)
	if c.MaxOutput > 0 {
		out = min(out, c.MaxOutput)
	}
	return Request{
		Tokens: &TokenPrompt{Blocks: l.HashIDs, Len: int(*l.InputLength), BlockSize: c.BlockSize,
			Chat: c.Chat, seed: seed},
		MaxTokens: out,
		At:        time.Duration(*l.Timestamp * float64(time.Millisecond)),
		After:     -1,
	}, nil
}

// TokenPrompt is a prompt made of blocks of generated tokens, one block per hash ID of a
// trace: token j of block h is a function of (seed, h, j) only, so that prompts sharing a
// leading run of hash IDs share that token prefix. Len tokens are used: the last block may
// be partial. It is immutable.
type TokenPrompt struct {
	// Blocks are the hash IDs.
	Blocks []int64
	// Len is the prompt length in tokens.
	Len int
	// BlockSize is the tokens per hash ID.
	BlockSize int
	// Chat says the prompt is sent as chat text (one user message of generated words)
	// rather than as token IDs.
	Chat bool
	seed uint64
}

// each calls f with the generator state of every token, in order.
func (p *TokenPrompt) each(f func(x uint64)) {
	for i, h := 0, 0; i < p.Len; h++ {
		base := mix.Mix64(p.seed ^ mix.Mix64(uint64(p.Blocks[h])+0x7f4a7c15))
		for j := 0; j < p.BlockSize && i < p.Len; j, i = j+1, i+1 {
			f(mix.Mix64(base + uint64(j)))
		}
	}
}

// tokenID maps generator state to a token ID among the built-in tokenizer's hashed pieces.
func tokenID(x uint64) uint32 {
	return uint32(tokenizer.ByteTokens + x%tokenizer.HashedTokens)
}

// AppendIDs appends the prompt's token IDs to dst.
func (p *TokenPrompt) AppendIDs(dst []uint32) []uint32 {
	dst = slices.Grow(dst, p.Len)
	p.each(func(x uint64) { dst = append(dst, tokenID(x)) })
	return dst
}

// AppendJSONIDs appends the prompt's token IDs to dst as a JSON array.
func (p *TokenPrompt) AppendJSONIDs(dst []byte) []byte {
	dst = slices.Grow(dst, 6*p.Len+2)
	dst = append(dst, '[')
	first := true
	p.each(func(x uint64) {
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = strconv.AppendUint(dst, uint64(tokenID(x)), 10)
	})
	return append(dst, ']')
}

// AppendText appends the prompt as text: one three-letter word per token, separated by
// spaces, which the built-in tokenizer encodes as exactly Len tokens.
func (p *TokenPrompt) AppendText(dst []byte) []byte {
	dst = slices.Grow(dst, 4*p.Len)
	first := true
	p.each(func(x uint64) {
		if !first {
			dst = append(dst, ' ')
		}
		first = false
		dst = append(dst, byte('a'+x%26), byte('a'+x/26%26), byte('a'+x/676%26))
	})
	return dst
}

// Messages returns the chat messages of a Chat prompt: one user message holding its text.
func (p *TokenPrompt) Messages() []tokenizer.Message {
	return []tokenizer.Message{{Role: tokenizer.RoleUser, Content: string(p.AppendText(nil))}}
}

// Span is the arrival time of the last request of a replayed workload (0 otherwise).
func (w *Workload) Span() time.Duration {
	if !w.Replay || len(w.Requests) == 0 {
		return 0
	}
	return w.Requests[len(w.Requests)-1].At
}

// PromptLen is the request's prompt length before any chat template: a trace request's
// input length, or 0 for a chat request (whose length depends on the template).
func (r *Request) PromptLen() int {
	if r.Tokens != nil {
		return r.Tokens.Len
	}
	return 0
}
