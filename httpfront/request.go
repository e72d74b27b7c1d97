package httpfront

import (
	"errors"
	"math"
	"strconv"

	"github.com/valyala/fasthttp"
)

// routeKind is one inference route.
type routeKind uint8

const (
	routeChat routeKind = iota
	routeCompletions
	routeGenerate
	routeResponses
	routeEmbeddings
	routeRerank
	routeTokenize
	routeDetokenize
	numRoutes
)

// routePaths are the engine routes the requests of each kind are sent to (the router's
// /rerank goes to the engine's /v1/rerank too).
var routePaths = [numRoutes]string{"/v1/chat/completions", "/v1/completions", "/generate", "/v1/responses",
	"/v1/embeddings", "/v1/rerank", "/tokenize", "/detokenize"}

func (k routeKind) String() string { return routePaths[k] }

// routeURIs are routePaths parsed once, read-only: a request to an engine copies its route's
// (fasthttp.Request.SetURI) instead of parsing its target again.
var routeURIs = newRouteURIs()

func newRouteURIs() *[numRoutes]fasthttp.URI {
	var u [numRoutes]fasthttp.URI
	for k, p := range routePaths {
		u[k].SetPath(p)
	}
	return &u
}

// generates reports whether the route generates tokens: a prefill/decode pair serves it
// (with its bootstrap fields) and cache_aware looks its prompt up. The others go to one
// engine, the prefill one of a pd bucket.
func (k routeKind) generates() bool { return k <= routeResponses }

// needsModel reports whether the body must name its model; without one, the others go to
// the only model.
func (k routeKind) needsModel() bool {
	return k == routeChat || k == routeCompletions || k == routeResponses || k == routeEmbeddings
}

// maxBatch bounds the items of one batch request (each gets its own bootstrap room).
const maxBatch = 4096

// requestFacts are what request preparation reads from a body. Every slice aliases the body
// (or the facts' own scratch); a requestFacts is reused across requests via its exchange.
type requestFacts struct {
	kind routeKind
	// model is the requested model, unescaped; empty when absent (allowed on /generate).
	model []byte
	// stream is the body's "stream" flag.
	stream bool
	// maxTokens is the requested output budget: max_completion_tokens or max_tokens, or
	// sampling_params.max_new_tokens; -1 when absent.
	maxTokens int64
	// returnLogprob is /generate's return_logprob.
	returnLogprob bool
	// batch is the number of items of a batch request (a list of prompts or texts); 0 for a
	// single request.
	batch int
	// messages holds the chat messages (objects); prompts holds the text prompts (raw JSON
	// strings) of completions and /generate.
	messages []jsonValue
	prompts  []jsonValue
	// tokenCount is the longest item's length when the body is already tokenized (input_ids
	// or a token-array prompt); -1 otherwise.
	tokenCount int64
	// tokenIDs are the IDs of a single tokenized prompt.
	tokenIDs []uint32
	// chat holds what a chat template reads of a chat request besides the messages.
	chat chatFields
	// rid is the body's "rid" (SGLang's request ID), zero when absent.
	rid jsonValue
	// priority is the body's "priority" when hasPriority (forwarded to engines as is).
	priority    int64
	hasPriority bool

	scratch []byte
}

func (f *requestFacts) reset(kind routeKind) {
	*f = requestFacts{
		kind:       kind,
		maxTokens:  -1,
		tokenCount: -1,
		messages:   f.messages[:0],
		prompts:    f.prompts[:0],
		tokenIDs:   f.tokenIDs[:0],
		scratch:    f.scratch[:0],
	}
}

// parseRequest validates body as a request of kind and fills f. It returns an OpenAI-style
// 400 error for anything a client must fix.
func parseRequest(kind routeKind, body []byte, f *requestFacts) *apiError {
	f.reset(kind)
	if kind > routeGenerate {
		return parseAuxRequest(kind, body, f)
	}
	i, perr := objectStart(body)
	if perr != nil {
		return perr
	}
	var (
		haveMessages   bool
		havePrompt     bool
		haveText       bool
		haveIDs        bool
		maxTokens      int64 = -1
		maxCompletion  int64 = -1
		samplingMaxNew int64 = -1
		modelRaw       jsonValue
	)
	end, err := scanObject(body, i, 1, func(key []byte, v jsonValue) error {
		if perr != nil {
			return nil
		}
		switch {
		case keyIs(key, "model"):
			perr = modelParam(v, &modelRaw)
		case keyIs(key, "stream"):
			perr = boolParam(v, "stream", &f.stream)
		case keyIs(key, "priority"):
			f.hasPriority = v.kind != kindNull
			perr = intParam(v, "priority", math.MinInt64, &f.priority)
		case keyIs(key, "max_tokens") && kind != routeGenerate:
			perr = intParam(v, "max_tokens", 1, &maxTokens)
		case keyIs(key, "max_completion_tokens") && kind == routeChat:
			perr = intParam(v, "max_completion_tokens", 1, &maxCompletion)
		case keyIs(key, "temperature") && kind != routeGenerate:
			perr = floatParam(v, "temperature", 0, 2, false)
		case keyIs(key, "top_p") && kind != routeGenerate:
			perr = floatParam(v, "top_p", 0, 1, true)
		case keyIs(key, "n") && kind != routeGenerate:
			var n int64
			perr = intParam(v, "n", 1, &n)
		case keyIs(key, "messages") && kind == routeChat:
			haveMessages = true
			f.chat.messages = v
			perr = f.parseMessages(v)
		case kind == routeChat && (keyIs(key, "tools") || keyIs(key, "tool_choice") || keyIs(key, "chat_template_kwargs")):
			f.chat.set(key, v)
		case keyIs(key, "prompt") && kind == routeCompletions:
			havePrompt = true
			perr = f.parsePrompt(v, "prompt")
		case keyIs(key, "text") && kind == routeGenerate:
			if v.kind == kindNull {
				return nil
			}
			haveText = true
			perr = f.parseText(v)
		case keyIs(key, "input_ids") && kind == routeGenerate:
			if v.kind == kindNull {
				return nil
			}
			haveIDs = true
			perr = f.parseTokenInput(v, "input_ids")
		case keyIs(key, "sampling_params") && kind == routeGenerate:
			perr = parseSamplingParams(v, &samplingMaxNew)
		case keyIs(key, "return_logprob") && kind == routeGenerate:
			perr = boolParam(v, "return_logprob", &f.returnLogprob)
		case keyIs(key, "rid"):
			f.rid = v
		}
		return nil
	})
	if err != nil {
		return jsonError(err)
	}
	if skipWS(body, end) != len(body) {
		return errBadJSON
	}
	if perr != nil {
		return perr
	}
	if modelRaw.kind == kindString {
		f.scratch = appendUnquoted(f.scratch[:0], modelRaw.raw)
		f.model = f.scratch
		if len(f.model) == 0 {
			return paramError(CodeMissingModel, "model", "model must not be empty")
		}
	}
	switch kind {
	case routeChat:
		if len(f.model) == 0 {
			return paramError(CodeMissingModel, "model", "you must provide a model parameter")
		}
		if !haveMessages {
			return paramError(CodeInvalidMessages, "messages", "you must provide a messages parameter")
		}
		f.maxTokens = maxTokens
		if maxCompletion >= 0 {
			f.maxTokens = maxCompletion
		}
	case routeCompletions:
		if len(f.model) == 0 {
			return paramError(CodeMissingModel, "model", "you must provide a model parameter")
		}
		if !havePrompt {
			return paramError(CodeMissingPrompt, "prompt", "you must provide a prompt parameter")
		}
		f.maxTokens = maxTokens
	case routeGenerate:
		switch {
		case haveText && haveIDs:
			return paramError(CodeInvalidParameter, "input_ids", "provide either text or input_ids, not both")
		case !haveText && !haveIDs:
			return paramError(CodeMissingPrompt, "text", "you must provide text or input_ids")
		}
		f.maxTokens = samplingMaxNew
	}
	return nil
}

// modelParam reads "model" into dst: a string, or null for none.
func modelParam(v jsonValue, dst *jsonValue) *apiError {
	switch v.kind {
	case kindNull:
	case kindString:
		*dst = v
	default:
		return paramError(CodeInvalidParameter, "model", "model must be a string")
	}
	return nil
}

func boolParam(v jsonValue, name string, dst *bool) *apiError {
	switch v.kind {
	case kindNull:
	case kindTrue:
		*dst = true
	case kindFalse:
		*dst = false
	default:
		return paramError(CodeInvalidParameter, name, name+" must be a boolean")
	}
	return nil
}

func intParam(v jsonValue, name string, minimum int64, dst *int64) *apiError {
	if v.kind == kindNull {
		return nil
	}
	n, ok := v.asInt()
	if !ok {
		return paramError(CodeInvalidParameter, name, name+" must be an integer")
	}
	if n < minimum {
		return paramError(CodeInvalidParameter, name, name+" must be at least "+strconv.FormatInt(minimum, 10))
	}
	*dst = n
	return nil
}

// floatParam checks lo <= x <= hi (lo < x when openLow).
func floatParam(v jsonValue, name string, lo, hi float64, openLow bool) *apiError {
	if v.kind == kindNull {
		return nil
	}
	x, ok := v.asFloat()
	if !ok {
		return paramError(CodeInvalidParameter, name, name+" must be a number")
	}
	if x < lo || x > hi || (openLow && x == lo) {
		lb := "["
		if openLow {
			lb = "("
		}
		return paramError(CodeInvalidParameter, name, name+" must be in "+lb+
			strconv.FormatFloat(lo, 'g', -1, 64)+", "+strconv.FormatFloat(hi, 'g', -1, 64)+"]")
	}
	return nil
}

var chatRoles = [...]string{"system", "developer", "user", "assistant", "tool", "function"}

func (f *requestFacts) parseMessages(v jsonValue) *apiError {
	if v.kind != kindArray {
		return paramError(CodeInvalidMessages, "messages", "messages must be an array")
	}
	var perr *apiError
	_ = v.elems(func(i int, m jsonValue) error {
		if perr != nil {
			return nil
		}
		if m.kind != kindObject {
			perr = paramError(CodeInvalidMessages, "messages", "messages["+strconv.Itoa(i)+"] must be an object")
			return nil
		}
		var role, content jsonValue
		hasTools := false
		_ = m.members(func(key []byte, mv jsonValue) error {
			if mv.kind == kindNull {
				f.chat.prepare = true
			}
			switch {
			case keyIs(key, "role"):
				role = mv
			case keyIs(key, "content"):
				content = mv
			case keyIs(key, "tool_calls"), keyIs(key, "function_call"):
				hasTools = mv.kind != kindNull
				f.chat.prepare = f.chat.prepare || mv.kind == kindArray
			}
			return nil
		})
		if role.kind != kindString || !knownRole(role.raw) {
			perr = paramError(CodeInvalidMessages, "messages", "messages["+strconv.Itoa(i)+"].role must be one of system, developer, user, assistant, tool")
			return nil
		}
		switch content.kind {
		case kindString:
		case kindArray:
			f.chat.prepare = true
			if e := checkContentParts(content, i); e != nil {
				perr = e
				return nil
			}
		case 0, kindNull:
			f.chat.prepare = true
			if string(role.raw) != `"assistant"` || !hasTools {
				perr = paramError(CodeInvalidMessages, "messages", "messages["+strconv.Itoa(i)+"].content is required")
				return nil
			}
		default:
			perr = paramError(CodeInvalidMessages, "messages", "messages["+strconv.Itoa(i)+"].content must be a string or an array of content parts")
			return nil
		}
		f.messages = append(f.messages, m)
		return nil
	})
	if perr != nil {
		return perr
	}
	if len(f.messages) == 0 {
		return paramError(CodeInvalidMessages, "messages", "messages must not be empty")
	}
	return nil
}

func knownRole(raw []byte) bool {
	for _, r := range chatRoles {
		if len(raw) == len(r)+2 && string(raw[1:len(raw)-1]) == r {
			return true
		}
	}
	return false
}

func checkContentParts(content jsonValue, i int) *apiError {
	var perr *apiError
	_ = content.elems(func(j int, p jsonValue) error {
		if perr != nil {
			return nil
		}
		typ := jsonValue{}
		if p.kind == kindObject {
			_ = p.members(func(key []byte, pv jsonValue) error {
				if keyIs(key, "type") {
					typ = pv
				}
				return nil
			})
		}
		if typ.kind != kindString {
			perr = paramError(CodeInvalidMessages, "messages",
				"messages["+strconv.Itoa(i)+"].content["+strconv.Itoa(j)+"] must be an object with a string type")
		}
		return nil
	})
	return perr
}

// parsePrompt reads a completions prompt: a string, a list of strings, a token list, or a
// list of token lists.
func (f *requestFacts) parsePrompt(v jsonValue, name string) *apiError {
	switch v.kind {
	case kindString:
		f.prompts = append(f.prompts, v)
		return nil
	case kindArray:
	default:
		return paramError(CodeMissingPrompt, name, name+" must be a string, a list of strings or a list of token IDs")
	}
	var first jsonValue
	n := 0
	_ = v.elems(func(i int, e jsonValue) error {
		if i == 0 {
			first = e
		}
		n++
		return nil
	})
	if n == 0 {
		return paramError(CodeMissingPrompt, name, name+" must not be empty")
	}
	switch first.kind {
	case kindString:
		return f.parseText(v)
	case kindNumber, kindArray:
		return f.parseTokenInput(v, name)
	}
	return paramError(CodeMissingPrompt, name, name+" must be a string, a list of strings or a list of token IDs")
}

// parseText reads a string or a non-empty list of strings (a batch).
func (f *requestFacts) parseText(v jsonValue) *apiError {
	name := "text"
	switch f.kind {
	case routeCompletions, routeTokenize:
		name = "prompt"
	case routeEmbeddings, routeResponses:
		name = "input"
	}
	if v.kind == kindString {
		f.prompts = append(f.prompts, v)
		return nil
	}
	if v.kind != kindArray {
		return paramError(CodeMissingPrompt, name, name+" must be a string or a list of strings")
	}
	var perr *apiError
	_ = v.elems(func(i int, e jsonValue) error {
		if perr == nil && e.kind != kindString {
			perr = paramError(CodeMissingPrompt, name, name+"["+strconv.Itoa(i)+"] must be a string")
		}
		f.prompts = append(f.prompts, e)
		return nil
	})
	if perr != nil {
		return perr
	}
	if len(f.prompts) == 0 {
		return paramError(CodeMissingPrompt, name, name+" must not be empty")
	}
	if len(f.prompts) > maxBatch {
		return paramError(CodeInvalidParameter, name, "a batch holds at most "+strconv.Itoa(maxBatch)+" items")
	}
	f.batch = len(f.prompts)
	return nil
}

// parseTokenInput reads a non-empty list of token IDs, or a non-empty list of such lists (a
// batch). IDs are unsigned 32-bit integers.
func (f *requestFacts) parseTokenInput(v jsonValue, name string) *apiError {
	if v.kind != kindArray {
		return paramError(CodeInvalidParameter, name, name+" must be a list of token IDs or a list of such lists")
	}
	var (
		perr   *apiError
		nested = -1 // unknown until the first element
		items  int
		single []uint32
	)
	single = f.tokenIDs[:0]
	longest := int64(0)
	_ = v.elems(func(i int, e jsonValue) error {
		if perr != nil {
			return nil
		}
		if nested < 0 {
			nested = 0
			if e.kind == kindArray {
				nested = 1
			}
		}
		if nested == 0 {
			id, ok := tokenID(e)
			if !ok {
				perr = paramError(CodeInvalidParameter, name, name+"["+strconv.Itoa(i)+"] must be a token ID (0..4294967295)")
				return nil
			}
			single = append(single, id)
			return nil
		}
		if e.kind != kindArray {
			perr = paramError(CodeInvalidParameter, name, name+"["+strconv.Itoa(i)+"] must be a list of token IDs")
			return nil
		}
		items++
		cnt := int64(0)
		_ = e.elems(func(j int, t jsonValue) error {
			if perr != nil {
				return nil
			}
			if _, ok := tokenID(t); !ok {
				perr = paramError(CodeInvalidParameter, name, name+"["+strconv.Itoa(i)+"]["+strconv.Itoa(j)+"] must be a token ID (0..4294967295)")
			}
			cnt++
			return nil
		})
		if perr == nil && cnt == 0 {
			perr = paramError(CodeInvalidParameter, name, name+"["+strconv.Itoa(i)+"] must not be empty")
		}
		longest = max(longest, cnt)
		return nil
	})
	if perr != nil {
		return perr
	}
	if nested <= 0 {
		if len(single) == 0 {
			return paramError(CodeInvalidParameter, name, name+" must not be empty")
		}
		f.tokenIDs = single
		f.tokenCount = int64(len(single))
		return nil
	}
	if items > maxBatch {
		return paramError(CodeInvalidParameter, name, "a batch holds at most "+strconv.Itoa(maxBatch)+" items")
	}
	f.batch = items
	f.tokenCount = longest
	return nil
}

func tokenID(v jsonValue) (uint32, bool) {
	n, ok := v.asInt()
	if !ok || n < 0 || n > math.MaxUint32 {
		return 0, false
	}
	return uint32(n), true
}

// parseSamplingParams validates /generate's sampling_params (an object, or a list of objects
// for a batch) and returns the largest max_new_tokens.
func parseSamplingParams(v jsonValue, maxNew *int64) *apiError {
	one := func(sp jsonValue) *apiError {
		if sp.kind == kindNull {
			return nil
		}
		if sp.kind != kindObject {
			return paramError(CodeInvalidParameter, "sampling_params", "sampling_params must be an object")
		}
		var perr *apiError
		_ = sp.members(func(key []byte, pv jsonValue) error {
			if perr != nil {
				return nil
			}
			switch {
			case keyIs(key, "max_new_tokens"):
				n := int64(-1)
				perr = intParam(pv, "sampling_params.max_new_tokens", 0, &n)
				*maxNew = max(*maxNew, n)
			case keyIs(key, "temperature"):
				perr = floatParam(pv, "sampling_params.temperature", 0, math.MaxFloat64, false)
			case keyIs(key, "top_p"):
				perr = floatParam(pv, "sampling_params.top_p", 0, 1, true)
			case keyIs(key, "n"):
				var n int64
				perr = intParam(pv, "sampling_params.n", 1, &n)
			}
			return nil
		})
		return perr
	}
	if v.kind != kindArray {
		return one(v)
	}
	var perr *apiError
	_ = v.elems(func(_ int, e jsonValue) error {
		if perr == nil {
			perr = one(e)
		}
		return nil
	})
	return perr
}

// jsonError is the client's error for a body the scanner refused with err.
func jsonError(err error) *apiError {
	if errors.Is(err, errJSONDepth) {
		return errDeepJSON
	}
	return errBadJSON
}

// objectStart returns the index of the '{' opening body, or the error for a body that is
// not a JSON object: invalid_json when it is not JSON at all, else not an object.
func objectStart(body []byte) (int, *apiError) {
	i := skipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		if _, _, err := scanValue(body, 0, 0); err != nil {
			return 0, jsonError(err)
		}
		return 0, errNotObject
	}
	return i, nil
}

// parseAuxRequest validates the body of a route beside chat, completions and /generate:
// /v1/responses (model, input, stream, max_output_tokens), /v1/embeddings (model, input),
// /v1/rerank (query, documents), /tokenize (prompt) and /detokenize (tokens). Its input is
// counted by the body-size estimate, or the tokenizer for the text inputs of responses and
// embeddings.
func parseAuxRequest(kind routeKind, body []byte, f *requestFacts) *apiError {
	i, perr := objectStart(body)
	if perr != nil {
		return perr
	}
	var (
		modelRaw            jsonValue
		haveInput           bool
		haveQuery, haveDocs bool
		maxOutput           int64 = -1
	)
	end, err := scanObject(body, i, 1, func(key []byte, v jsonValue) error {
		if perr != nil {
			return nil
		}
		switch {
		case keyIs(key, "model"):
			perr = modelParam(v, &modelRaw)
		case keyIs(key, "stream") && kind == routeResponses:
			perr = boolParam(v, "stream", &f.stream)
		case keyIs(key, "max_output_tokens") && kind == routeResponses:
			perr = intParam(v, "max_output_tokens", 1, &maxOutput)
		case keyIs(key, "input") && kind == routeResponses:
			if v.kind == kindNull {
				return nil
			}
			haveInput = true
			switch v.kind {
			case kindString:
				f.prompts = append(f.prompts, v)
			case kindArray:
				// A list of input items (messages, tool outputs): counted by size.
			default:
				perr = paramError(CodeMissingPrompt, "input", "input must be a string or a list of input items")
			}
		case keyIs(key, "input") && kind == routeEmbeddings:
			if v.kind == kindNull {
				return nil
			}
			haveInput = true
			perr = f.parsePrompt(v, "input")
		case keyIs(key, "prompt") && kind == routeTokenize:
			if v.kind == kindNull {
				return nil
			}
			haveInput = true
			if v.kind != kindString && v.kind != kindArray {
				perr = paramError(CodeMissingPrompt, "prompt", "prompt must be a string or a list of strings")
			}
		case keyIs(key, "tokens") && kind == routeDetokenize:
			if v.kind == kindNull {
				return nil
			}
			haveInput = true
			perr = f.parseTokenInput(v, "tokens")
		case keyIs(key, "query") && kind == routeRerank:
			if v.kind != kindString {
				perr = paramError(CodeMissingPrompt, "query", "query must be a string")
				return nil
			}
			haveQuery = true
		case keyIs(key, "documents") && kind == routeRerank:
			n := 0
			if v.kind == kindArray {
				_ = v.elems(func(int, jsonValue) error { n++; return nil })
			}
			if v.kind != kindArray || n == 0 {
				perr = paramError(CodeMissingPrompt, "documents", "documents must be a non-empty list")
				return nil
			}
			haveDocs = true
		}
		return nil
	})
	if err != nil {
		return jsonError(err)
	}
	if skipWS(body, end) != len(body) {
		return errBadJSON
	}
	if perr != nil {
		return perr
	}
	if modelRaw.kind == kindString {
		f.scratch = appendUnquoted(f.scratch[:0], modelRaw.raw)
		f.model = f.scratch
		if len(f.model) == 0 {
			return paramError(CodeMissingModel, "model", "model must not be empty")
		}
	}
	if kind.needsModel() && len(f.model) == 0 {
		return paramError(CodeMissingModel, "model", "you must provide a model parameter")
	}
	switch kind {
	case routeResponses, routeEmbeddings:
		if !haveInput {
			return paramError(CodeMissingPrompt, "input", "you must provide an input parameter")
		}
	case routeTokenize:
		if !haveInput {
			return paramError(CodeMissingPrompt, "prompt", "you must provide a prompt parameter")
		}
		f.tokenCount = -1 // counted by size: tokenizing it twice would be for nothing
	case routeDetokenize:
		if !haveInput {
			return paramError(CodeMissingPrompt, "tokens", "you must provide a tokens parameter")
		}
		f.tokenIDs, f.tokenCount, f.batch = f.tokenIDs[:0], -1, 0 // token IDs to decode, not a prompt
	case routeRerank:
		if !haveQuery {
			return paramError(CodeMissingPrompt, "query", "you must provide a query parameter")
		}
		if !haveDocs {
			return paramError(CodeMissingPrompt, "documents", "you must provide a documents parameter")
		}
	}
	f.maxTokens = maxOutput
	return nil
}
