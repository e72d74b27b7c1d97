package httpfront

import (
	"errors"
	"strconv"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"switchyard/engine"
	"switchyard/httpfront/jsontext"
)

// Error codes of the OpenAI-shaped error body {"error": {"message", "type", "param", "code"}}.
// Each code has one HTTP status (see errorTable); README lists them.
const (
	CodeInvalidJSON         = "invalid_json"
	CodeMissingModel        = "missing_model"
	CodeInvalidMessages     = "invalid_messages"
	CodeMissingPrompt       = "missing_prompt"
	CodeInvalidParameter    = "invalid_parameter"
	CodeNoMatchingBucket    = "no_matching_bucket"
	CodeMissingAPIKey       = "missing_api_key"
	CodeInvalidAPIKey       = "invalid_api_key"
	CodeModelNotFound       = "model_not_found"
	CodeNotFound            = "not_found"
	CodeMethodNotAllowed    = "method_not_allowed"
	CodeRequestTooLarge     = "request_too_large"
	CodeUnsupportedEncoding = "unsupported_content_encoding"
	CodeInvalidEncoding     = "invalid_content_encoding"
	CodeOverloaded          = "overloaded"
	CodeNoAvailableEngine   = "no_available_engine"
	CodeShuttingDown        = "shutting_down"
	CodeInvalidSignal       = "invalid_signal"
	CodeInvalidConfig       = "invalid_configuration"
	CodeOutsideCandidates   = "outside_candidates"
	CodeInternal            = "internal_error"
	CodeUpstream            = "upstream_error"
	CodePrefillFailed       = "prefill_failed"
	CodeUpstreamTimeout     = "upstream_timeout"
	CodeSelectionTimeout    = "selection_timeout"
	CodeStreamIdleTimeout   = "stream_idle_timeout"
	CodeWorkerNotFound      = "worker_not_found"
	CodeWorkerExists        = "worker_exists"
	CodeInvalidWorker       = "invalid_worker"
	CodeIntrospection       = "introspection_failed"
	CodeRateLimited         = "rate_limited"
	CodeQueueFull           = "queue_full"
	CodeQueueTimeout        = "queue_timeout"
	CodeClientClosed        = "client_closed_request"
	CodeConnectionLimit     = "upstream_connection_limit"
	CodeRouterResources     = "router_out_of_resources"
	CodeChatTemplate        = "chat_template_error"
	CodeTokenizer           = "tokenizer_error"
	CodeTooManyConnections  = "too_many_connections"
	CodeBodyBudget          = "body_budget_exhausted"
	CodeHeaderTooLarge      = "request_header_too_large"
	CodeRequestTimeout      = "request_timeout"
	CodeMalformedRequest    = "malformed_request"
	CodeAdminDisabled       = "admin_disabled"
	CodeAdapterLoad         = "adapter_load_failed"
)

// errorClass is the status and OpenAI error type of a code.
type errorClass struct {
	status int
	typ    string
}

var errorTable = map[string]errorClass{
	CodeInvalidJSON:         {fasthttp.StatusBadRequest, "invalid_request_error"},
	CodeMissingModel:        {fasthttp.StatusBadRequest, "invalid_request_error"},
	CodeInvalidMessages:     {fasthttp.StatusBadRequest, "invalid_request_error"},
	CodeMissingPrompt:       {fasthttp.StatusBadRequest, "invalid_request_error"},
	CodeInvalidParameter:    {fasthttp.StatusBadRequest, "invalid_request_error"},
	CodeNoMatchingBucket:    {fasthttp.StatusBadRequest, "invalid_request_error"},
	CodeInvalidWorker:       {fasthttp.StatusBadRequest, "invalid_request_error"},
	CodeInvalidEncoding:     {fasthttp.StatusBadRequest, "invalid_request_error"},
	CodeChatTemplate:        {fasthttp.StatusBadRequest, "invalid_request_error"},
	CodeMissingAPIKey:       {fasthttp.StatusUnauthorized, "authentication_error"},
	CodeInvalidAPIKey:       {fasthttp.StatusForbidden, "permission_error"},
	CodeModelNotFound:       {fasthttp.StatusNotFound, "invalid_request_error"},
	CodeNotFound:            {fasthttp.StatusNotFound, "invalid_request_error"},
	CodeWorkerNotFound:      {fasthttp.StatusNotFound, "invalid_request_error"},
	CodeMethodNotAllowed:    {fasthttp.StatusMethodNotAllowed, "invalid_request_error"},
	CodeWorkerExists:        {fasthttp.StatusConflict, "invalid_request_error"},
	CodeRequestTooLarge:     {fasthttp.StatusRequestEntityTooLarge, "invalid_request_error"},
	CodeUnsupportedEncoding: {fasthttp.StatusUnsupportedMediaType, "invalid_request_error"},
	CodeOverloaded:          {fasthttp.StatusTooManyRequests, "overloaded_error"},
	CodeRateLimited:         {fasthttp.StatusTooManyRequests, "rate_limit_error"},
	CodeQueueFull:           {fasthttp.StatusTooManyRequests, "overloaded_error"},
	CodeQueueTimeout:        {fasthttp.StatusRequestTimeout, "timeout_error"},
	CodeClientClosed:        {499, "invalid_request_error"},
	CodeInvalidSignal:       {fasthttp.StatusInternalServerError, "internal_error"},
	CodeInvalidConfig:       {fasthttp.StatusInternalServerError, "internal_error"},
	CodeOutsideCandidates:   {fasthttp.StatusInternalServerError, "internal_error"},
	CodeInternal:            {fasthttp.StatusInternalServerError, "internal_error"},
	CodeTokenizer:           {fasthttp.StatusInternalServerError, "internal_error"},
	CodeUpstream:            {fasthttp.StatusBadGateway, "upstream_error"},
	CodePrefillFailed:       {fasthttp.StatusBadGateway, "upstream_error"},
	CodeIntrospection:       {fasthttp.StatusBadGateway, "upstream_error"},
	CodeAdapterLoad:         {fasthttp.StatusBadGateway, "upstream_error"},
	CodeNoAvailableEngine:   {fasthttp.StatusServiceUnavailable, "service_unavailable_error"},
	CodeShuttingDown:        {fasthttp.StatusServiceUnavailable, "service_unavailable_error"},
	CodeConnectionLimit:     {fasthttp.StatusServiceUnavailable, "service_unavailable_error"},
	CodeRouterResources:     {fasthttp.StatusServiceUnavailable, "service_unavailable_error"},
	CodeTooManyConnections:  {fasthttp.StatusServiceUnavailable, "service_unavailable_error"},
	CodeBodyBudget:          {fasthttp.StatusServiceUnavailable, "service_unavailable_error"},
	CodeHeaderTooLarge:      {fasthttp.StatusRequestHeaderFieldsTooLarge, "invalid_request_error"},
	CodeRequestTimeout:      {fasthttp.StatusRequestTimeout, "invalid_request_error"},
	CodeMalformedRequest:    {fasthttp.StatusBadRequest, "invalid_request_error"},
	CodeAdminDisabled:       {fasthttp.StatusForbidden, "permission_error"},
	CodeUpstreamTimeout:     {fasthttp.StatusGatewayTimeout, "timeout_error"},
	CodeSelectionTimeout:    {fasthttp.StatusServiceUnavailable, "service_unavailable_error"},
	CodeStreamIdleTimeout:   {fasthttp.StatusGatewayTimeout, "timeout_error"},
}

// apiError is one error answer. Message may be built per request (the slow path); the
// common errors are package-level immutable values.
type apiError struct {
	code    string
	message string
	param   string
	// stage and rejections describe a selection failure (503).
	stage      string
	rejections []engine.Rejection
	// retryAfter, when positive, is sent as the Retry-After header, in seconds.
	retryAfter int
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

func (e *apiError) class() errorClass {
	c, ok := errorTable[e.code]
	if !ok {
		panic("BUG: httpfront: error code without a class: " + e.code)
	}
	return c
}

// status is the HTTP status of the error.
func (e *apiError) status() int { return e.class().status }

func newAPIError(code, message string) *apiError { return &apiError{code: code, message: message} }

func paramError(code, param, message string) *apiError {
	return &apiError{code: code, param: param, message: message}
}

// Immutable errors shared by every request.
var (
	errNotFound         = newAPIError(CodeNotFound, "no such route")
	errMethodNotAllowed = newAPIError(CodeMethodNotAllowed, "method not allowed on this route")
	errTooLarge         = newAPIError(CodeRequestTooLarge, "request body exceeds the size limit")
	errHeaderTooLarge   = newAPIError(CodeHeaderTooLarge, "the request line and headers exceed the size limit (server.max_header_bytes)")
	errMissingKey       = newAPIError(CodeMissingAPIKey, "missing bearer API key (Authorization: Bearer <key>)")
	errWrongKey         = newAPIError(CodeInvalidAPIKey, "the API key is not valid for this endpoint")
	errShuttingDown     = newAPIError(CodeShuttingDown, "the router is shutting down")
	errNotObject        = newAPIError(CodeInvalidJSON, "the request body must be a JSON object")
	errBadJSON          = newAPIError(CodeInvalidJSON, "the request body is not valid JSON")
	errDeepJSON         = newAPIError(CodeInvalidJSON, "the request body nests JSON deeper than "+strconv.Itoa(maxJSONDepth)+" levels")
)

// maxQuoted bounds the client input an error message quotes, in bytes.
const maxQuoted = 128

// maxErrorMessage bounds an error message, in bytes: whatever a message was built from, an
// error answer stays small.
const maxErrorMessage = 1024

// quoteClient quotes client input for an error message, in backquotes, bounded to maxQuoted
// bytes (cut on a character boundary) with its full length when cut.
func quoteClient[T string | []byte](v T) string {
	if len(v) <= maxQuoted {
		return "`" + string(v) + "`"
	}
	return "`" + string(truncateUTF8(v[:maxQuoted])) + "...` (" + strconv.Itoa(len(v)) + " bytes)"
}

// truncateUTF8 drops a partial UTF-8 sequence at the end of v.
func truncateUTF8[T string | []byte](v T) T {
	for i := 0; i < utf8.UTFMax && i < len(v); i++ {
		r, size := utf8.DecodeLastRuneInString(string(v[len(v)-i-1:]))
		if r != utf8.RuneError || size > 1 {
			return v[:len(v)-i]
		}
	}
	return v
}

// appendErrorJSON appends the OpenAI-shaped body of e.
func appendErrorJSON(dst []byte, e *apiError) []byte {
	c := e.class()
	msg := e.message
	if len(msg) > maxErrorMessage {
		msg = truncateUTF8(msg[:maxErrorMessage]) + "... (truncated)"
	}
	dst = append(dst, `{"error":{"message":`...)
	dst = jsontext.AppendString(dst, msg)
	dst = append(dst, `,"type":`...)
	dst = jsontext.AppendString(dst, c.typ)
	dst = append(dst, `,"param":`...)
	if e.param == "" {
		dst = append(dst, "null"...)
	} else {
		dst = jsontext.AppendString(dst, e.param)
	}
	dst = append(dst, `,"code":`...)
	dst = jsontext.AppendString(dst, e.code)
	if e.stage != "" {
		dst = append(dst, `,"stage":`...)
		dst = jsontext.AppendString(dst, e.stage)
	}
	if len(e.rejections) > 0 {
		dst = append(dst, `,"rejections":[`...)
		for i, r := range e.rejections {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"bucket":`...)
			dst = jsontext.AppendString(dst, r.BucketID)
			dst = append(dst, `,"stage":`...)
			dst = jsontext.AppendString(dst, r.Stage.String())
			dst = append(dst, `,"worker":`...)
			dst = jsontext.AppendString(dst, r.WorkerID)
			dst = append(dst, `,"limit":`...)
			dst = jsontext.AppendString(dst, r.Limit)
			dst = append(dst, '}')
		}
		dst = append(dst, ']')
	}
	return append(dst, "}}"...)
}

// writeError answers ctx with e.
func writeError(ctx *fasthttp.RequestCtx, e *apiError) {
	ctx.Response.Reset()
	ctx.SetStatusCode(e.status())
	ctx.SetContentType("application/json")
	if e.retryAfter > 0 {
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, strconv.Itoa(e.retryAfter))
	}
	buf := getBuf()
	*buf = appendErrorJSON((*buf)[:0], e)
	ctx.SetBody(*buf)
	putBuf(buf)
}

// selectionError maps a failed selection to its HTTP error (POLICY_DESIGN section 3).
func selectionError(err error) *apiError {
	var pe *engine.PickError
	if !errors.As(err, &pe) {
		return newAPIError(CodeInternal, "engine selection failed: "+err.Error())
	}
	switch pe.Outcome {
	case engine.OutcomeNoMatchingBucket:
		return newAPIError(CodeNoMatchingBucket, "no bucket of this model supports the request's length")
	case engine.OutcomeNoCandidates, engine.OutcomeNoAdmissibleEngine, engine.OutcomeAdmissionRejected, engine.OutcomePDIncompatible:
		msg := "no engine is available"
		if pe.Outcome != engine.OutcomeNoCandidates {
			msg = "every compatible engine rejected the request"
		}
		msg += " (stage " + pe.Stage.String()
		if pe.BucketID != "" {
			msg += ", bucket " + pe.BucketID
		}
		msg += ")"
		return &apiError{code: CodeNoAvailableEngine, message: msg, stage: pe.Stage.String(), rejections: pe.Rejections}
	case engine.OutcomeOverloaded:
		return newAPIError(CodeOverloaded, "the router is overloaded: "+pe.Error())
	case engine.OutcomeTimeout:
		// The pick missed actors.pick_timeout: the router's actors, or its host, were too
		// busy to answer in time. Like a full mailbox that is load, not a fault: 503, and the
		// request was sent nowhere, so the client may retry it.
		return &apiError{code: CodeSelectionTimeout, message: "engine selection timed out: " + pe.Error(), retryAfter: 1}
	case engine.OutcomeInvalidSignal:
		return newAPIError(CodeInvalidSignal, pe.Error())
	case engine.OutcomeInvalidConfiguration:
		return newAPIError(CodeInvalidConfig, pe.Error())
	case engine.OutcomeOutsideCandidates:
		return newAPIError(CodeOutsideCandidates, pe.Error())
	}
	return newAPIError(CodeInternal, pe.Error())
}

var statusLabels = func() map[int]string {
	m := make(map[int]string)
	for _, c := range []int{200, 400, 401, 403, 404, 405, 408, 409, 413, 415, 429, 499, 500, 502, 503, 504} {
		m[c] = strconv.Itoa(c)
	}
	return m
}()

// statusLabel is the metric label of a status code; the set is fixed so handles are bounded.
func statusLabel(code int) string {
	if l, ok := statusLabels[code]; ok {
		return l
	}
	switch {
	case code < 300:
		return "2xx"
	case code < 400:
		return "3xx"
	case code < 500:
		return "4xx"
	}
	return "5xx"
}
