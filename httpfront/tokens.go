package httpfront

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/config"
	"switchyard/tokenizer"
	"switchyard/tokenizer/hf"
	"switchyard/tokenizer/jinja"
)

// estimateTokens is the body-size estimate of a prompt's length used when no tokenizer is
// configured: about four bytes per token, rounded up.
func estimateTokens(bodyLen int) int64 { return (int64(bodyLen) + 3) / 4 }

// appendEncoder is the allocation-free form of Encode (hf.Tokenizer, tokenizer.Simple).
type appendEncoder interface {
	AppendEncode(dst []uint32, text string) []uint32
}

// chatEncoder renders OpenAI messages, decoded into template values, with the model's chat
// template and encodes the rendering as the engine does (hf.Tokenizer).
type chatEncoder interface {
	RenderChatValues(v hf.ChatValues) (string, error)
	AppendEncodePlain(dst []uint32, text string) []uint32
	HasChatTemplate() bool
}

var (
	_ appendEncoder = (*hf.Tokenizer)(nil)
	_ appendEncoder = (*tokenizer.Simple)(nil)
	_ chatEncoder   = (*hf.Tokenizer)(nil)
)

// promptTokenizer is one model's tokenizer as request preparation uses it, with its optional
// forms resolved once at start-up rather than per request. A nil *promptTokenizer means the
// body-size estimate.
type promptTokenizer struct {
	tk   tokenizer.Tokenizer
	app  appendEncoder // tk's Append form, or nil
	chat chatEncoder   // tk's chat-values form when it has a chat template, or nil
	// hfNoChat: tk is a Hugging Face tokenizer without a chat template, which cannot count a
	// chat request.
	hfNoChat bool
	// forward: /generate requests carrying text are forwarded with input_ids instead.
	forward bool
	// failures counts, logs and decides the answer to the requests the tokenizer cannot
	// count exactly; set by New once the model's metrics exist (nil in unit tests: estimate).
	failures *tokenizerFailures
}

// tokenizerStage is where a tokenizer failed, the stage label of
// switchyard_tokenizer_errors_total.
type tokenizerStage uint8

const (
	stageChatTemplate   tokenizerStage = iota // the chat template refused or failed to render
	stageNoChatTemplate                       // a chat request for a tokenizer without one
	numTokenizerStages
)

func (s tokenizerStage) String() string {
	switch s {
	case stageChatTemplate:
		return "chat_template"
	case stageNoChatTemplate:
		return "no_chat_template"
	}
	return "unknown"
}

// maxLoggedCauses bounds the distinct causes of tokenizer failures logged per model; the
// counter goes on counting every failure.
const maxLoggedCauses = 64

// tokenizerFailures handles the requests a model's tokenizer cannot count exactly: each is
// counted, its cause (stage and error text) is logged the first time it occurs, and the
// request is rejected or routed by the body-size estimate, as tokenizer.on_error says.
type tokenizerFailures struct {
	model    string
	reject   bool
	counters [numTokenizerStages]*metrics.Counter
	logger   *slog.Logger

	mu     sync.Mutex // error path only
	causes map[string]struct{}
}

func newTokenizerFailures(model string, reject bool, counters [numTokenizerStages]*metrics.Counter, logger *slog.Logger) *tokenizerFailures {
	return &tokenizerFailures{model: model, reject: reject, counters: counters, logger: logger, causes: map[string]struct{}{}}
}

// fail records a failure and returns the error to answer, or nil to use the estimate.
// Slow path: only failing requests come here.
func (tf *tokenizerFailures) fail(stage tokenizerStage, err error) *apiError {
	if tf == nil {
		return nil
	}
	tf.counters[stage].Inc()
	msg := err.Error()
	cause := stage.String() + ": " + msg[:min(len(msg), 256)]
	tf.mu.Lock()
	_, seen := tf.causes[cause]
	logIt, last := !seen && len(tf.causes) < maxLoggedCauses, false
	if logIt {
		tf.causes[cause] = struct{}{}
		last = len(tf.causes) == maxLoggedCauses
	}
	tf.mu.Unlock()
	if logIt {
		answer := "estimate"
		if tf.reject {
			answer = "reject"
		}
		tf.logger.Warn("tokenizer cannot count a request exactly (logged once per cause; see switchyard_tokenizer_errors_total)",
			slog.String("model", tf.model), slog.String("stage", stage.String()), slog.String("answer", answer),
			slog.String("error", msg))
		if last {
			tf.logger.Warn("tokenizer failures: further causes are counted but not logged",
				slog.String("model", tf.model), slog.Int("causes", maxLoggedCauses))
		}
	}
	if !tf.reject {
		return nil
	}
	switch {
	case stage == stageNoChatTemplate:
		return newAPIError(CodeTokenizer, "the tokenizer of model `"+tf.model+"` has no chat template, so the router cannot count this chat request")
	case errors.Is(err, hf.ErrRaised):
		return paramError(CodeChatTemplate, "messages", "the chat template of model `"+tf.model+"` refuses these messages: "+templateMessage(msg))
	}
	return newAPIError(CodeTokenizer, "the router cannot render the chat template of model `"+tf.model+"` for this request: "+msg)
}

// templateMessage returns the message a template raised, without the error's prefixes.
func templateMessage(msg string) string {
	if _, after, ok := strings.Cut(msg, hf.ErrRaised.Error()+": "); ok {
		return after
	}
	return msg
}

// newPromptTokenizer wraps tk; it returns nil for a nil tk.
func newPromptTokenizer(tk tokenizer.Tokenizer, forward bool) *promptTokenizer {
	if tk == nil {
		return nil
	}
	pt := &promptTokenizer{tk: tk, forward: forward}
	pt.app, _ = tk.(appendEncoder)
	if c, ok := tk.(chatEncoder); ok {
		if c.HasChatTemplate() {
			pt.chat = c
		} else {
			pt.hfNoChat = true
		}
	}
	return pt
}

// appendEncode appends the IDs of text (with the post-processor's special tokens, as the
// engine encodes a text prompt) to dst.
func (pt *promptTokenizer) appendEncode(dst []uint32, text string) []uint32 {
	if pt.app != nil {
		return pt.app.AppendEncode(dst, text)
	}
	return append(dst, pt.tk.Encode(text)...)
}

// forwards reports whether the request is forwarded with the IDs computed here in place of
// its text: a /generate request carrying text, for a model with forward_input_ids.
func (pt *promptTokenizer) forwards(f *requestFacts) bool {
	return pt != nil && pt.forward && f.kind == routeGenerate && f.tokenCount < 0 && len(f.prompts) > 0
}

// loadTokenizers returns every configured model's tokenizer: the one Options.Tokenizer gives,
// else the Hugging Face tokenizer models.<name>.tokenizer.path names (loaded once per path
// and cache size), else nil (the body-size estimate). A tokenizer that cannot be loaded is an
// error naming its configuration key.
func loadTokenizers(cfg *config.Config, opts Options) (map[string]*promptTokenizer, error) {
	type key struct {
		path  string
		cache int64
	}
	loaded := map[key]*hf.Tokenizer{}
	out := make(map[string]*promptTokenizer, len(cfg.Models))
	names := make([]string, 0, len(cfg.Models))
	for name := range cfg.Models {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		tc := cfg.Models[name].Tokenizer
		var tk tokenizer.Tokenizer
		if opts.Tokenizer != nil {
			tk = opts.Tokenizer(name)
		}
		path := "(Options.Tokenizer)"
		if tk == nil && tc.Path != "" {
			path = tc.Path
			k := key{path: tc.Path, cache: hf.DefaultCacheBytes}
			if tc.CacheBytes != nil {
				k.cache = *tc.CacheBytes
				if k.cache == 0 {
					k.cache = -1 // hf: negative disables the cache
				}
			}
			h := loaded[k]
			if h == nil {
				var err error
				h, err = hf.Load(tc.Path, hf.Options{CacheBytes: k.cache, Logger: opts.Logger, Now: opts.Now})
				if err != nil {
					return nil, fmt.Errorf("%s.tokenizer.path: %w", config.ModelPath(name), err)
				}
				loaded[k] = h
			}
			tk = h
		}
		pt := newPromptTokenizer(tk, tc.ForwardInputIDs)
		out[name] = pt
		if pt == nil {
			continue
		}
		opts.Logger.Info("model tokenizer ready", slog.String("model", name), slog.String("path", path),
			slog.Bool("chat_template", pt.chat != nil), slog.Bool("forward_input_ids", pt.forward))
		if _, isHF := tk.(*hf.Tokenizer); isHF && pt.chat == nil {
			opts.Logger.Warn("tokenizer has no chat template: chat requests are counted as failures and answered as tokenizer.on_error says",
				slog.String("model", name), slog.String("path", path))
		}
	}
	return out, nil
}

// inputTokens returns the request's input length in tokens and, for a single tokenized
// prompt, its token IDs (in f.tokenIDs, reused across requests). A body that is already
// tokenized (input_ids, a token-array prompt) is counted as is; otherwise pt encodes the
// prompt: a chat request through the model's chat template applied to the messages as sent,
// a text prompt with the post-processor's special tokens, as the engine does. Without pt the
// body-size estimate applies. When the chat template refuses or fails to render the
// conversation, or a Hugging Face tokenizer has no chat template, the failure is counted and
// logged and the answer is the estimate or, with tokenizer.on_error reject, the returned
// error. For a batch, the longest item counts. text is scratch for unescaping a prompt.
func (f *requestFacts) inputTokens(pt *promptTokenizer, body []byte, text *[]byte) (int64, []uint32, *apiError) {
	if f.tokenCount >= 0 {
		if f.batch == 0 {
			return f.tokenCount, f.tokenIDs, nil
		}
		return f.tokenCount, nil, nil
	}
	if pt == nil || len(f.prompts) == 0 && f.kind != routeChat {
		return estimateTokens(len(body)), nil, nil
	}
	switch {
	case f.kind == routeChat && pt.chat != nil:
		ids, err := f.encodeChat(pt.chat, text)
		if err != nil {
			if e := pt.failures.fail(stageChatTemplate, err); e != nil {
				return 0, nil, e
			}
			return estimateTokens(len(body)), nil, nil
		}
		return int64(len(ids)), ids, nil
	case f.kind == routeChat && pt.hfNoChat:
		if e := pt.failures.fail(stageNoChatTemplate, hf.ErrNoChatTemplate); e != nil {
			return 0, nil, e
		}
		return estimateTokens(len(body)), nil, nil
	case f.kind == routeChat:
		// A tokenizer without a chat-JSON form (tokenizer.Simple): role and text content.
		msgs := make([]tokenizer.Message, 0, len(f.messages))
		for _, m := range f.messages {
			msgs = append(msgs, chatMessage(m))
		}
		var prompt string
		if ct, ok := pt.tk.(tokenizer.ChatTemplater); ok {
			if t, err := ct.ApplyChatTemplate(msgs); err == nil {
				prompt = t
			}
		}
		if prompt == "" {
			var b strings.Builder
			for _, m := range msgs {
				b.WriteString(m.Role)
				b.WriteByte('\n')
				b.WriteString(m.Content)
				b.WriteByte('\n')
			}
			prompt = b.String()
		}
		f.tokenIDs = pt.appendEncode(f.tokenIDs[:0], prompt)
		return int64(len(f.tokenIDs)), f.tokenIDs, nil
	case len(f.prompts) == 1 && f.batch == 0:
		f.tokenIDs = pt.appendEncode(f.tokenIDs[:0], promptText(f.prompts[0].raw, text))
		return int64(len(f.tokenIDs)), f.tokenIDs, nil
	}
	longest := int64(0)
	for _, p := range f.prompts {
		f.tokenIDs = pt.appendEncode(f.tokenIDs[:0], promptText(p.raw, text))
		longest = max(longest, int64(len(f.tokenIDs)))
	}
	return longest, nil, nil
}

// chatFields are the members of a chat request that its chat template reads, aliasing the
// body; parseRequest fills them.
type chatFields struct {
	messages, tools, toolChoice, kwargs jsonValue
	// prepare: some message may need preparing (a null member, a content that is absent or
	// a list of parts, or tool calls whose arguments may be a JSON string).
	prepare bool
}

func (c *chatFields) set(key []byte, v jsonValue) {
	switch {
	case keyIs(key, "tools"):
		c.tools = v
	case keyIs(key, "tool_choice"):
		c.toolChoice = v
	case keyIs(key, "chat_template_kwargs"):
		c.kwargs = v
	}
}

// encodeChat encodes a chat request as the engine does: its messages prepared for a text
// chat template as SGLang prepares them (see chatValues), with the generation prompt, its
// tools unless tool_choice is "none", and its chat_template_kwargs as further template
// variables. scratch is reused for joining and unescaping strings.
func (f *requestFacts) encodeChat(chat chatEncoder, scratch *[]byte) ([]uint32, error) {
	prompt, err := f.renderChat(chat, scratch)
	if err != nil {
		return nil, err
	}
	f.tokenIDs = chat.AppendEncodePlain(f.tokenIDs[:0], prompt)
	return f.tokenIDs, nil
}

// renderChat renders the chat request's prompt text as encodeChat encodes it. The members
// parseRequest located (and validated) are decoded into template values once: the messages
// are not written out as JSON again to be parsed a second time.
func (f *requestFacts) renderChat(chat chatEncoder, scratch *[]byte) (string, error) {
	c := &f.chat
	v := hf.ChatValues{SizeHint: len(c.messages.raw) + len(c.tools.raw) + 256}
	var err error
	if v.Messages, err = chatValues(c.messages, f.messages, c.prepare, scratch); err != nil {
		return "", fmt.Errorf("messages: %w", err)
	}
	if c.tools.kind == kindArray && !(c.toolChoice.kind == kindString && string(c.toolChoice.raw) == `"none"`) {
		if v.Tools, err = jinja.DecodeJSON(c.tools.raw); err != nil {
			return "", fmt.Errorf("tools: %w", err)
		}
	}
	if c.kwargs.kind == kindObject {
		extra, err := jinja.DecodeJSON(c.kwargs.raw)
		if err != nil {
			return "", fmt.Errorf("chat_template_kwargs: %w", err)
		}
		v.Extra, _ = extra.(*jinja.Dict)
	}
	return chat.RenderChatValues(v)
}

// RenderChat renders a /v1/chat/completions request body exactly as the router does to
// count and hash it: messages prepared as SGLang prepares them for a text chat template,
// the generation prompt, tools unless tool_choice is "none", and chat_template_kwargs. It
// returns the prompt text and its token IDs; switchyard tokenize --chat uses it so that it
// prints what the router computes.
func RenderChat(chat *hf.Tokenizer, body []byte) (string, []uint32, error) {
	var f requestFacts
	if e := parseRequest(routeChat, body, &f); e != nil {
		return "", nil, e
	}
	var scratch []byte
	prompt, err := f.renderChat(chat, &scratch)
	if err != nil {
		return "", nil, err
	}
	return prompt, chat.AppendEncodePlain(nil, prompt), nil
}

// chatValues decodes a chat request's messages (all, a validated JSON array; msgs, its
// elements) into template values. When prepare is set they are prepared for a text chat
// template the way SGLang prepares a chat request before applying the template: a null or
// absent content becomes "", a list of content parts becomes its text parts joined by a
// space, members whose value is null are dropped, and tool-call arguments given as a JSON
// string holding an object are passed as that object (which the template then renders with
// tojson). Every member is decoded once, from the request's bytes.
func chatValues(all jsonValue, msgs []jsonValue, prepare bool, scratch *[]byte) ([]any, error) {
	if !prepare {
		v, err := jinja.DecodeJSON(all.raw)
		list, _ := v.([]any)
		return list, err
	}
	list := make([]any, len(msgs))
	for i, m := range msgs {
		d := jinja.NewDict(4)
		hasContent := false
		err := m.members(func(key []byte, v jsonValue) error {
			isContent := keyIs(key, "content")
			if v.kind == kindNull && !isContent {
				return nil
			}
			name, err := jinja.DecodeJSONString(key)
			if err != nil {
				return err
			}
			var val any
			switch {
			case isContent:
				hasContent = true
				val, err = contentText(v, scratch)
			case keyIs(key, "tool_calls") && v.kind == kindArray:
				val, err = toolCallValues(v, scratch)
			default:
				val, err = jinja.DecodeJSON(v.raw)
			}
			d.Set(name, val)
			return err
		})
		if err != nil {
			return nil, err
		}
		if !hasContent {
			d.Set("content", "")
		}
		list[i] = d
	}
	return list, nil
}

// contentText returns a message content as a string: a string as is, a list of parts as the
// texts of its "text" parts joined by a space, anything else as "". The joined parts are
// decoded as one JSON string (escapes kept: the joined raw strings stay valid JSON).
func contentText(v jsonValue, scratch *[]byte) (string, error) {
	switch v.kind {
	case kindString:
		return jinja.DecodeJSONString(v.raw)
	case kindArray:
	default:
		return "", nil
	}
	dst := append((*scratch)[:0], '"')
	first := true
	_ = v.elems(func(_ int, part jsonValue) error {
		if part.kind != kindObject {
			return nil
		}
		var typ, text jsonValue
		_ = part.members(func(k []byte, pv jsonValue) error {
			switch {
			case keyIs(k, "type"):
				typ = pv
			case keyIs(k, "text"):
				text = pv
			}
			return nil
		})
		if typ.kind != kindString || string(typ.raw) != `"text"` || text.kind != kindString {
			return nil
		}
		if !first {
			dst = append(dst, ' ')
		}
		first = false
		dst = append(dst, text.raw[1:len(text.raw)-1]...)
		return nil
	})
	*scratch = append(dst, '"')
	return jinja.DecodeJSONString(*scratch)
}

// toolCallArguments returns a tool call's function object and its arguments member (zero
// values when absent).
func toolCallArguments(call jsonValue) (fn, args jsonValue) {
	if call.kind != kindObject {
		return
	}
	_ = call.members(func(k []byte, v jsonValue) error {
		if keyIs(k, "function") && v.kind == kindObject {
			fn = v
		}
		return nil
	})
	if fn.kind != kindObject {
		return
	}
	_ = fn.members(func(k []byte, v jsonValue) error {
		if keyIs(k, "arguments") {
			args = v
		}
		return nil
	})
	return fn, args
}

// toolCallValues decodes a tool_calls list with every function.arguments string that holds
// a JSON object replaced by that object.
func toolCallValues(calls jsonValue, scratch *[]byte) ([]any, error) {
	list := []any{}
	err := calls.elems(func(_ int, call jsonValue) error {
		if _, args := toolCallArguments(call); args.kind != kindString {
			v, err := jinja.DecodeJSON(call.raw)
			list = append(list, v)
			return err
		}
		d := jinja.NewDict(3)
		err := call.members(func(k []byte, v jsonValue) error {
			name, err := jinja.DecodeJSONString(k)
			if err != nil {
				return err
			}
			if !keyIs(k, "function") || v.kind != kindObject {
				val, err := jinja.DecodeJSON(v.raw)
				d.Set(name, val)
				return err
			}
			fd := jinja.NewDict(2)
			err = v.members(func(fk []byte, fv jsonValue) error {
				fname, err := jinja.DecodeJSONString(fk)
				if err != nil {
					return err
				}
				var val any
				if keyIs(fk, "arguments") && fv.kind == kindString {
					val, err = parsedArguments(fv, scratch)
				} else {
					val, err = jinja.DecodeJSON(fv.raw)
				}
				fd.Set(fname, val)
				return err
			})
			d.Set(name, fd)
			return err
		})
		list = append(list, d)
		return err
	})
	return list, err
}

// parsedArguments returns the JSON object that the string s holds, or s itself when it holds
// anything else (the engine refuses such a request).
func parsedArguments(s jsonValue, scratch *[]byte) (any, error) {
	obj := appendUnquoted((*scratch)[:0], s.raw)
	*scratch = obj
	i := skipWS(obj, 0)
	if i < len(obj) && obj[i] == '{' {
		if v, end, err := scanValue(obj, i, 0); err == nil && v.kind == kindObject && skipWS(obj, end) == len(obj) {
			return jinja.DecodeJSON(obj)
		}
	}
	return jinja.DecodeJSONString(s.raw)
}

// promptText returns the text of the raw JSON string s without copying when it holds no
// escape, else unescaped into *scratch. The result aliases s or *scratch: it is only passed
// to a tokenizer, which keeps no reference to it.
func promptText(s []byte, scratch *[]byte) string {
	inner := s[1 : len(s)-1]
	if bytes.IndexByte(inner, '\\') < 0 {
		return bytesString(inner)
	}
	*scratch = appendUnquoted((*scratch)[:0], s)
	return bytesString(*scratch)
}

// forwardInputIDs counts a /generate request's text as inputTokens does and appends to dst
// the body to forward in its place: every member but text (and a null input_ids), then
// input_ids with the computed IDs (a list of lists for a batch). The engine then runs
// exactly the tokens the router counted and hashed.
func (f *requestFacts) forwardInputIDs(pt *promptTokenizer, body, dst []byte, text *[]byte) (out []byte, input int64, ids []uint32) {
	dst = append(dst, '{')
	_, _ = scanObject(body, skipWS(body, 0), 1, func(key []byte, v jsonValue) error {
		if keyIs(key, "text") || keyIs(key, "input_ids") {
			return nil
		}
		dst = append(dst, key...)
		dst = append(dst, ':')
		dst = append(dst, v.raw...)
		dst = append(dst, ',')
		return nil
	})
	dst = append(dst, `"input_ids":`...)
	if f.batch == 0 {
		f.tokenIDs = pt.appendEncode(f.tokenIDs[:0], promptText(f.prompts[0].raw, text))
		dst = appendIDs(dst, f.tokenIDs)
		return append(dst, '}'), int64(len(f.tokenIDs)), f.tokenIDs
	}
	dst = append(dst, '[')
	for i, p := range f.prompts {
		if i > 0 {
			dst = append(dst, ',')
		}
		f.tokenIDs = pt.appendEncode(f.tokenIDs[:0], promptText(p.raw, text))
		input = max(input, int64(len(f.tokenIDs)))
		dst = appendIDs(dst, f.tokenIDs)
	}
	return append(dst, "]}"...), input, nil
}

// appendIDs appends ids as a JSON array.
func appendIDs(dst []byte, ids []uint32) []byte {
	dst = append(dst, '[')
	for i, id := range ids {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(id), 10)
	}
	return append(dst, ']')
}

// chatMessage extracts a message's role and text content (text parts joined).
func chatMessage(m jsonValue) tokenizer.Message {
	var msg tokenizer.Message
	_ = m.members(func(key []byte, v jsonValue) error {
		switch {
		case keyIs(key, "role") && v.kind == kindString:
			msg.Role = string(appendUnquoted(nil, v.raw))
		case keyIs(key, "content") && v.kind == kindString:
			msg.Content = string(appendUnquoted(nil, v.raw))
		case keyIs(key, "content") && v.kind == kindArray:
			var b []byte
			_ = v.elems(func(_ int, part jsonValue) error {
				if part.kind != kindObject {
					return nil
				}
				_ = part.members(func(k []byte, pv jsonValue) error {
					if keyIs(k, "text") && pv.kind == kindString {
						b = appendUnquoted(b, pv.raw)
					}
					return nil
				})
				return nil
			})
			msg.Content = string(b)
		}
		return nil
	})
	return msg
}

// expectedPeak is input plus the requested output, -1 when the output budget is unknown, or
// an error when the sum overflows.
func expectedPeak(input, maxTokens int64) (int64, *apiError) {
	if maxTokens < 0 {
		return -1, nil
	}
	if input > math.MaxInt64-maxTokens {
		return 0, paramError(CodeInvalidParameter, "max_tokens", "max_tokens plus the input length overflows")
	}
	return input + maxTokens, nil
}
