package mockengine

import (
	"encoding/json"
	"strconv"

	"github.com/valyala/fasthttp"
)

// serveTokenize answers POST /tokenize as vLLM does: {"model", "prompt"} or
// {"model", "messages"} (rendered with the chat template) gives
// {"count", "max_model_len", "tokens"}.
func (e *Engine) serveTokenize(ctx *fasthttp.RequestCtx) {
	var probe struct {
		Messages json.RawMessage `json:"messages"`
		Prompt   json.RawMessage `json:"prompt"`
	}
	if err := json.Unmarshal(ctx.PostBody(), &probe); err != nil {
		e.writeError(ctx, fasthttp.StatusBadRequest, "cannot decode request: "+err.Error())
		return
	}
	var tokens []uint32
	switch {
	case present(probe.Messages):
		req, err := e.parseChat(ctx.PostBody())
		if err != nil {
			e.writeError(ctx, fasthttp.StatusBadRequest, err.Error())
			return
		}
		tokens = req.prompts[0]
	case present(probe.Prompt):
		var text string
		if err := json.Unmarshal(probe.Prompt, &text); err != nil {
			e.writeError(ctx, fasthttp.StatusBadRequest, "prompt must be a string")
			return
		}
		tokens = e.tok.Encode(text)
	default:
		e.writeError(ctx, fasthttp.StatusBadRequest, "prompt or messages is required")
		return
	}
	b := make([]byte, 0, 64+len(tokens)*8)
	b = append(b, `{"count":`...)
	b = strconv.AppendInt(b, int64(len(tokens)), 10)
	b = append(b, `,"max_model_len":`...)
	b = strconv.AppendInt(b, int64(e.cfg.ContextLength), 10)
	b = append(b, `,"tokens":[`...)
	for i, t := range tokens {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(t), 10)
	}
	b = append(b, `],"token_strs":null}`...)
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("application/json")
	ctx.Response.SetBodyRaw(b)
}

// serveDetokenize answers POST /detokenize {"model", "tokens"} with {"prompt"}.
func (e *Engine) serveDetokenize(ctx *fasthttp.RequestCtx) {
	var body struct {
		Tokens []int64 `json:"tokens"`
	}
	if err := json.Unmarshal(ctx.PostBody(), &body); err != nil {
		e.writeError(ctx, fasthttp.StatusBadRequest, "cannot decode request: "+err.Error())
		return
	}
	ids, err := tokenIDs("tokens", body.Tokens)
	if err != nil {
		e.writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	e.writeJSON(ctx, fasthttp.StatusOK, map[string]string{"prompt": e.tok.Decode(ids)})
}
