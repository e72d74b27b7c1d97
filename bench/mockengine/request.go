package mockengine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"switchyard/tokenizer"
)

// apiKind is the inference route a request came in on.
type apiKind uint8

const (
	apiChat apiKind = iota
	apiCompletions
	apiGenerate
)

// maxN bounds the samples per prompt (n) and maxBatch the prompts per request.
const (
	maxN     = 64
	maxBatch = 1024
)

// badRequest is a client error: it becomes a 400 with an OpenAI-style body.
type badRequest struct{ msg string }

func (e *badRequest) Error() string { return e.msg }

func badf(format string, args ...any) error { return &badRequest{msg: fmt.Sprintf(format, args...)} }

// inferRequest is an inference request after parsing and validation.
type inferRequest struct {
	api          apiKind
	model        string
	prompts      [][]uint32
	batch        bool // the request used the batch form (a list of prompts)
	n            int
	maxTokens    int // -1: not given
	defaultMax   int // the route's default when not given (clamped to the context); 0: derived from the prompt
	stream       bool
	includeUsage bool
	logprobs     bool
	topLogprobs  int
	rids         []string // /generate rid, one per item when given
	boot         []bootstrapInfo
	dpRank       int // -1: any
}

// bootstrapInfo is one item's PD bootstrap fields.
type bootstrapInfo struct {
	host    string
	port    int
	hasPort bool
	room    uint64
}

// sampling holds the sampling parameters every route validates the same way.
type sampling struct {
	Temperature       *float64        `json:"temperature"`
	TopP              *float64        `json:"top_p"`
	TopK              *int            `json:"top_k"`
	MinP              *float64        `json:"min_p"`
	FrequencyPenalty  *float64        `json:"frequency_penalty"`
	PresencePenalty   *float64        `json:"presence_penalty"`
	RepetitionPenalty *float64        `json:"repetition_penalty"`
	N                 *int            `json:"n"`
	MinTokens         *int            `json:"min_tokens"`
	Seed              *int64          `json:"seed"`
	Stop              json.RawMessage `json:"stop"`
	IgnoreEOS         bool            `json:"ignore_eos"`
}

func (s *sampling) validate(maxTokens *int) error {
	rng := func(name string, v *float64, lo, hi float64, loOpen bool) error {
		if v == nil {
			return nil
		}
		if math.IsNaN(*v) || *v > hi || *v < lo || (loOpen && *v == lo) {
			op := "["
			if loOpen {
				op = "("
			}
			return badf("%s must be in %s%g, %g], got %g", name, op, lo, hi, *v)
		}
		return nil
	}
	if err := errors.Join(
		rng("temperature", s.Temperature, 0, 2, false),
		rng("top_p", s.TopP, 0, 1, true),
		rng("min_p", s.MinP, 0, 1, false),
		rng("frequency_penalty", s.FrequencyPenalty, -2, 2, false),
		rng("presence_penalty", s.PresencePenalty, -2, 2, false),
		rng("repetition_penalty", s.RepetitionPenalty, 0, 2, true),
	); err != nil {
		return badf("%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	if s.TopK != nil && (*s.TopK == 0 || *s.TopK < -1) {
		return badf("top_k must be -1 (disabled) or at least 1, got %d", *s.TopK)
	}
	if s.N != nil && (*s.N < 1 || *s.N > maxN) {
		return badf("n must be in [1, %d], got %d", maxN, *s.N)
	}
	if maxTokens != nil && *maxTokens < 0 {
		return badf("max_tokens must be at least 0, got %d", *maxTokens)
	}
	if s.MinTokens != nil && (*s.MinTokens < 0 || (maxTokens != nil && *s.MinTokens > *maxTokens)) {
		return badf("min_tokens must be in [0, max_tokens], got %d", *s.MinTokens)
	}
	if len(s.Stop) > 0 && !bytes.Equal(s.Stop, []byte("null")) {
		var one string
		var many []string
		if json.Unmarshal(s.Stop, &one) != nil && json.Unmarshal(s.Stop, &many) != nil {
			return badf("stop must be a string or a list of strings")
		}
	}
	return nil
}

func (s *sampling) samples() int {
	if s.N == nil {
		return 1
	}
	return *s.N
}

// bootstrapFields are the PD fields a router injects into the request JSON.
type bootstrapFields struct {
	BootstrapHost json.RawMessage `json:"bootstrap_host"`
	BootstrapPort json.RawMessage `json:"bootstrap_port"`
	BootstrapRoom json.RawMessage `json:"bootstrap_room"`
}

type streamOptions struct {
	IncludeUsage         bool `json:"include_usage"`
	ContinuousUsageStats bool `json:"continuous_usage_stats"`
}

type chatBody struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Logprobs            bool            `json:"logprobs"`
	TopLogprobs         *int            `json:"top_logprobs"`
	DataParallelRank    *int            `json:"data_parallel_rank"`
	Rid                 json.RawMessage `json:"rid"`
	sampling
	bootstrapFields
}

type chatMessage struct {
	Role    string         `json:"role"`
	Content messageContent `json:"content"`
}

// messageContent is a message's content: a string, a list of parts (text parts are
// concatenated) or null.
type messageContent string

func (c *messageContent) UnmarshalJSON(b []byte) error {
	switch {
	case bytes.Equal(b, []byte("null")):
		*c = ""
		return nil
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*c = messageContent(s)
		return nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(b, &parts); err != nil {
		return errors.New("content must be a string, a list of parts or null")
	}
	var sb strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			sb.WriteString(p.Text)
		}
	}
	*c = messageContent(sb.String())
	return nil
}

type completionBody struct {
	Model            string          `json:"model"`
	Prompt           json.RawMessage `json:"prompt"`
	Stream           bool            `json:"stream"`
	StreamOptions    *streamOptions  `json:"stream_options"`
	MaxTokens        *int            `json:"max_tokens"`
	Logprobs         *int            `json:"logprobs"`
	Echo             bool            `json:"echo"`
	DataParallelRank *int            `json:"data_parallel_rank"`
	Rid              json.RawMessage `json:"rid"`
	sampling
	bootstrapFields
}

type generateBody struct {
	Text             json.RawMessage `json:"text"`
	InputIDs         json.RawMessage `json:"input_ids"`
	SamplingParams   *generateParams `json:"sampling_params"`
	Stream           bool            `json:"stream"`
	ReturnLogprob    bool            `json:"return_logprob"`
	Rid              json.RawMessage `json:"rid"`
	DataParallelRank *int            `json:"data_parallel_rank"`
	bootstrapFields
}

type generateParams struct {
	MaxNewTokens *int `json:"max_new_tokens"`
	MinNewTokens *int `json:"min_new_tokens"`
	sampling
}

// decodeJSON decodes body into v, turning syntax and type errors into client errors.
func decodeJSON(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return badf("request body is empty")
	}
	if err := json.Unmarshal(body, v); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return badf("malformed JSON at offset %d: %v", se.Offset, err)
		case errors.As(err, &te):
			return badf("invalid type for %q: got JSON %s, want %s", te.Field, te.Value, te.Type)
		}
		return badf("invalid request body: %v", err)
	}
	return nil
}

// parseRequest parses and validates an inference request body.
func (e *Engine) parseRequest(api apiKind, body []byte) (*inferRequest, error) {
	switch api {
	case apiChat:
		return e.parseChat(body)
	case apiCompletions:
		return e.parseCompletions(body)
	}
	return e.parseGenerate(body)
}

func (e *Engine) parseChat(body []byte) (*inferRequest, error) {
	var b chatBody
	if err := decodeJSON(body, &b); err != nil {
		return nil, err
	}
	if len(b.Messages) == 0 {
		return nil, badf("messages must not be empty")
	}
	msgs := make([]tokenizer.Message, len(b.Messages))
	for i, m := range b.Messages {
		if !tokenizer.ValidRole(m.Role) {
			return nil, badf("messages[%d].role %q is not one of system, developer, user, assistant, tool", i, m.Role)
		}
		msgs[i] = tokenizer.Message{Role: m.Role, Content: string(m.Content)}
	}
	var prompt []uint32
	if ct, ok := e.tok.(chatJSONTokenizer); ok && ct.HasChatTemplate() {
		p, err := encodeChatJSON(ct, body)
		if err != nil {
			return nil, err
		}
		prompt = p
	} else {
		text, err := e.tok.ApplyChatTemplate(msgs)
		if err != nil {
			return nil, badf("%v", err)
		}
		prompt = e.tok.Encode(text)
	}
	maxTokens := b.MaxTokens
	if b.MaxCompletionTokens != nil {
		maxTokens = b.MaxCompletionTokens
	}
	if err := b.validate(maxTokens); err != nil {
		return nil, err
	}
	if b.TopLogprobs != nil && (*b.TopLogprobs < 0 || *b.TopLogprobs > 20) {
		return nil, badf("top_logprobs must be in [0, 20], got %d", *b.TopLogprobs)
	}
	req := &inferRequest{
		api: apiChat, model: b.Model, prompts: [][]uint32{prompt}, n: b.samples(),
		maxTokens: optInt(maxTokens), stream: b.Stream, logprobs: b.Logprobs, dpRank: optRank(b.DataParallelRank),
	}
	if b.TopLogprobs != nil {
		req.topLogprobs = *b.TopLogprobs
	}
	if b.StreamOptions != nil {
		req.includeUsage = b.StreamOptions.IncludeUsage || b.StreamOptions.ContinuousUsageStats
	}
	return e.finishParse(req, b.Rid, &b.bootstrapFields)
}

func (e *Engine) parseCompletions(body []byte) (*inferRequest, error) {
	var b completionBody
	if err := decodeJSON(body, &b); err != nil {
		return nil, err
	}
	if err := b.validate(b.MaxTokens); err != nil {
		return nil, err
	}
	if b.Logprobs != nil && (*b.Logprobs < 0 || *b.Logprobs > 5) {
		return nil, badf("logprobs must be in [0, 5], got %d", *b.Logprobs)
	}
	prompts, batch, err := e.parsePrompts("prompt", b.Prompt, true)
	if err != nil {
		return nil, err
	}
	req := &inferRequest{
		api: apiCompletions, model: b.Model, prompts: prompts, batch: batch, n: b.samples(),
		maxTokens: optInt(b.MaxTokens), stream: b.Stream, dpRank: optRank(b.DataParallelRank),
	}
	req.defaultMax = 16 // the OpenAI completions default
	if b.Logprobs != nil {
		req.logprobs, req.topLogprobs = true, *b.Logprobs
	}
	if b.StreamOptions != nil {
		req.includeUsage = b.StreamOptions.IncludeUsage || b.StreamOptions.ContinuousUsageStats
	}
	return e.finishParse(req, b.Rid, &b.bootstrapFields)
}

func (e *Engine) parseGenerate(body []byte) (*inferRequest, error) {
	var b generateBody
	if err := decodeJSON(body, &b); err != nil {
		return nil, err
	}
	hasText, hasIDs := present(b.Text), present(b.InputIDs)
	if hasText == hasIDs {
		return nil, badf("exactly one of text and input_ids is required")
	}
	var prompts [][]uint32
	var batch bool
	var err error
	if hasText {
		prompts, batch, err = e.parsePrompts("text", b.Text, false)
	} else {
		prompts, batch, err = e.parsePrompts("input_ids", b.InputIDs, true)
	}
	if err != nil {
		return nil, err
	}
	p := b.SamplingParams
	if p == nil {
		p = &generateParams{}
	}
	if p.MinNewTokens != nil && p.MinTokens == nil {
		p.MinTokens = p.MinNewTokens
	}
	if err := p.validate(p.MaxNewTokens); err != nil {
		return nil, err
	}
	req := &inferRequest{
		api: apiGenerate, prompts: prompts, batch: batch, n: p.samples(), maxTokens: optInt(p.MaxNewTokens),
		stream: b.Stream, logprobs: b.ReturnLogprob, dpRank: optRank(b.DataParallelRank),
	}
	req.defaultMax = 128 // SGLang's max_new_tokens default
	return e.finishParse(req, b.Rid, &b.bootstrapFields)
}

// finishParse applies the checks every route shares: limits, rid and bootstrap fields.
func (e *Engine) finishParse(req *inferRequest, rid json.RawMessage, bf *bootstrapFields) (*inferRequest, error) {
	if req.batch && req.stream {
		return nil, badf("streaming is not supported for a batch of prompts")
	}
	if len(req.prompts)*req.n > maxBatch {
		return nil, badf("%d sequences exceed the limit of %d", len(req.prompts)*req.n, maxBatch)
	}
	for i, p := range req.prompts {
		if len(p) == 0 {
			return nil, badf("prompt %d is empty", i)
		}
		out := req.maxTokens
		if out < 0 {
			out = 0
		}
		if len(p)+out > e.cfg.ContextLength {
			return nil, badf("the input (%d tokens) plus max_tokens (%d) is longer than the model's context length (%d tokens)", len(p), out, e.cfg.ContextLength)
		}
		if len(p)+out > e.cfg.CacheTokens {
			return nil, badf("the input (%d tokens) plus max_tokens (%d) exceeds the KV cache (%d tokens)", len(p), out, e.cfg.CacheTokens)
		}
	}
	if req.dpRank >= e.cfg.DPSize {
		return nil, badf("data_parallel_rank %d is out of range (dp_size %d)", req.dpRank, e.cfg.DPSize)
	}
	if present(rid) {
		var one string
		var many []string
		switch {
		case json.Unmarshal(rid, &one) == nil:
			req.rids = []string{one}
		case json.Unmarshal(rid, &many) == nil && len(many) == len(req.prompts):
			req.rids = many
		default:
			return nil, badf("rid must be a string, or a list of strings with one per prompt")
		}
	}
	boot, err := parseBootstrap(bf, len(req.prompts))
	if err != nil {
		return nil, err
	}
	req.boot = boot
	return req, nil
}

func optInt(p *int) int {
	if p == nil {
		return -1
	}
	return *p
}

func optRank(p *int) int {
	if p == nil || *p < 0 {
		return -1
	}
	return *p
}

func present(raw json.RawMessage) bool {
	return len(raw) > 0 && !bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// parsePrompts reads a prompt field: a string, a list of strings, a list of token IDs or
// a list of token-ID lists. It reports whether the batch form (a list of prompts) was used.
func (e *Engine) parsePrompts(field string, raw json.RawMessage, allowIDs bool) ([][]uint32, bool, error) {
	if !present(raw) {
		return nil, false, badf("%s is required", field)
	}
	raw = bytes.TrimSpace(raw)
	invalid := func() error {
		if allowIDs {
			return badf("%s must be a string, a list of strings, a list of token IDs or a list of token-ID lists", field)
		}
		return badf("%s must be a string or a list of strings", field)
	}
	if raw[0] == '"' {
		var one string
		if err := json.Unmarshal(raw, &one); err != nil {
			return nil, false, invalid()
		}
		return [][]uint32{e.tok.Encode(one)}, false, nil
	}
	if raw[0] != '[' {
		return nil, false, invalid()
	}
	// The first element decides the form.
	var first byte
	if rest := bytes.TrimSpace(raw[1:]); len(rest) > 0 {
		first = rest[0]
	}
	switch {
	case first == ']':
		return nil, false, badf("%s must not be empty", field)
	case first == '"':
		var many []string
		if err := json.Unmarshal(raw, &many); err != nil {
			return nil, false, invalid()
		}
		out := make([][]uint32, len(many))
		for i, s := range many {
			out[i] = e.tok.Encode(s)
		}
		return out, len(many) > 1 || field == "text", nil
	case !allowIDs:
		return nil, false, invalid()
	case first == '[':
		var lists [][]int64
		if err := json.Unmarshal(raw, &lists); err != nil {
			return nil, false, invalid()
		}
		out := make([][]uint32, len(lists))
		for i, l := range lists {
			p, err := tokenIDs(fmt.Sprintf("%s[%d]", field, i), l)
			if err != nil {
				return nil, false, err
			}
			out[i] = p
		}
		return out, true, nil
	}
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err != nil {
		return nil, false, invalid()
	}
	p, err := tokenIDs(field, ids)
	return [][]uint32{p}, false, err
}

func tokenIDs(field string, ids []int64) ([]uint32, error) {
	out := make([]uint32, len(ids))
	for i, id := range ids {
		if id < 0 || id > math.MaxUint32 {
			return nil, badf("%s[%d]: token ID %d is not an unsigned 32-bit value", field, i, id)
		}
		out[i] = uint32(id)
	}
	return out, nil
}

// parseBootstrap reads the PD bootstrap fields: each a value or a list with one per item.
// It returns nil when no field is present.
func parseBootstrap(bf *bootstrapFields, items int) ([]bootstrapInfo, error) {
	if !present(bf.BootstrapHost) && !present(bf.BootstrapRoom) && !present(bf.BootstrapPort) {
		return nil, nil
	}
	hosts, err := listOf[string]("bootstrap_host", bf.BootstrapHost, items)
	if err != nil {
		return nil, err
	}
	ports, err := listOf[*int]("bootstrap_port", bf.BootstrapPort, items)
	if err != nil {
		return nil, err
	}
	rooms, err := listOf[json.Number]("bootstrap_room", bf.BootstrapRoom, items)
	if err != nil {
		return nil, err
	}
	out := make([]bootstrapInfo, items)
	for i := range out {
		if hosts == nil || hosts[i] == "" {
			return nil, badf("bootstrap_host is required with the other bootstrap fields")
		}
		if rooms == nil || rooms[i] == "" {
			return nil, badf("bootstrap_room is required with the other bootstrap fields")
		}
		room, err := strconv.ParseUint(string(rooms[i]), 10, 63)
		if err != nil {
			return nil, badf("bootstrap_room %s is not an integer in [0, 2^63-1]", rooms[i])
		}
		out[i] = bootstrapInfo{host: hosts[i], room: room}
		if ports != nil && ports[i] != nil {
			p := *ports[i]
			if p < 1 || p > 65535 {
				return nil, badf("bootstrap_port %d is out of range", p)
			}
			out[i].port, out[i].hasPort = p, true
		}
	}
	return out, nil
}

// listOf reads a field that is one value (for a single item) or a list of one per item.
// An absent field is nil.
func listOf[T any](field string, raw json.RawMessage, items int) ([]T, error) {
	if !present(raw) {
		return nil, nil
	}
	dec := func(b []byte, v any) error {
		d := json.NewDecoder(bytes.NewReader(b))
		d.UseNumber()
		return d.Decode(v)
	}
	var one T
	if items == 1 && dec(raw, &one) == nil {
		return []T{one}, nil
	}
	var many []T
	if err := dec(raw, &many); err != nil || len(many) != items {
		return nil, badf("%s must be a value or a list with one value per prompt (%d)", field, items)
	}
	return many, nil
}
