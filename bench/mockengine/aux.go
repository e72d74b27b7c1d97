package mockengine

import (
	"encoding/json"
	"math"
	"strconv"

	"github.com/valyala/fasthttp"
)

// The engine's routes beside generation, as SGLang and vLLM serve them: model info,
// embeddings, rerank and the Responses API. Their answers are deterministic functions of the
// request (the router only needs to reach them), computed without the scheduler.

// embeddingDims is the length of a mock embedding.
const embeddingDims = 8

// serveModelInfo answers GET /get_model_info (SGLang).
func (e *Engine) serveModelInfo(ctx *fasthttp.RequestCtx) {
	e.writeJSON(ctx, fasthttp.StatusOK, map[string]any{"model_path": e.cfg.Model, "tokenizer_path": e.cfg.Model,
		"is_generation": true, "preferred_sampling_params": nil, "weight_version": "default"})
}

// textOrTokens reads an input that is a string, a list of strings, a list of token IDs or a
// list of such lists into token sequences.
func (e *Engine) textOrTokens(raw json.RawMessage) ([][]uint32, error) {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return [][]uint32{e.tok.Encode(one)}, nil
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		out := make([][]uint32, len(texts))
		for i, t := range texts {
			out[i] = e.tok.Encode(t)
		}
		return out, nil
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		t, err := tokenIDs("input", ids)
		return [][]uint32{t}, err
	}
	var lists [][]int64
	if err := json.Unmarshal(raw, &lists); err != nil {
		return nil, badf("input must be a string, a list of strings or token IDs")
	}
	out := make([][]uint32, len(lists))
	for i, l := range lists {
		t, err := tokenIDs("input", l)
		if err != nil {
			return nil, err
		}
		out[i] = t
	}
	return out, nil
}

// embed is a deterministic unit vector of a token sequence.
func embed(tokens []uint32) []float64 {
	v := make([]float64, embeddingDims)
	for i, t := range tokens {
		v[(int(t)+i)%embeddingDims] += float64(t%97) + 1
	}
	norm := 0.0
	for _, x := range v {
		norm += x * x
	}
	if norm > 0 {
		for i := range v {
			v[i] /= math.Sqrt(norm)
		}
	}
	return v
}

// serveEmbeddings answers POST /v1/embeddings {"model", "input"}.
func (e *Engine) serveEmbeddings(ctx *fasthttp.RequestCtx) {
	var body struct {
		Model string          `json:"model"`
		Input json.RawMessage `json:"input"`
	}
	if err := decodeJSON(ctx.PostBody(), &body); err != nil {
		e.writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	if !present(body.Input) {
		e.writeError(ctx, fasthttp.StatusBadRequest, "input is required")
		return
	}
	seqs, err := e.textOrTokens(body.Input)
	if err != nil {
		e.writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	type item struct {
		Object    string    `json:"object"`
		Index     int       `json:"index"`
		Embedding []float64 `json:"embedding"`
	}
	data := make([]item, len(seqs))
	n := 0
	for i, s := range seqs {
		data[i] = item{Object: "embedding", Index: i, Embedding: embed(s)}
		n += len(s)
	}
	e.writeJSON(ctx, fasthttp.StatusOK, map[string]any{"object": "list", "data": data, "model": e.cfg.Model,
		"usage": map[string]int{"prompt_tokens": n, "total_tokens": n}})
}

// serveRerank answers POST /v1/rerank {"query", "documents"}: each document scored by the
// share of its tokens found in the query, best first; SGLang answers a list, vLLM an object.
func (e *Engine) serveRerank(ctx *fasthttp.RequestCtx) {
	var body struct {
		Query     string   `json:"query"`
		Documents []string `json:"documents"`
	}
	if err := decodeJSON(ctx.PostBody(), &body); err != nil {
		e.writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	if body.Query == "" || len(body.Documents) == 0 {
		e.writeError(ctx, fasthttp.StatusBadRequest, "query and documents are required")
		return
	}
	q := map[uint32]bool{}
	for _, t := range e.tok.Encode(body.Query) {
		q[t] = true
	}
	type result struct {
		Index    int     `json:"index"`
		Score    float64 `json:"score"`
		Document string  `json:"document"`
	}
	results := make([]result, len(body.Documents))
	for i, d := range body.Documents {
		toks := e.tok.Encode(d)
		hit := 0
		for _, t := range toks {
			if q[t] {
				hit++
			}
		}
		score := 0.0
		if len(toks) > 0 {
			score = float64(hit) / float64(len(toks))
		}
		results[i] = result{Index: i, Score: score, Document: d}
	}
	for i := 1; i < len(results); i++ { // insertion sort: best first, stable
		for j := i; j > 0 && results[j].Score > results[j-1].Score; j-- {
			results[j], results[j-1] = results[j-1], results[j]
		}
	}
	if e.cfg.Flavor == FlavorVLLM {
		out := make([]map[string]any, len(results))
		for i, r := range results {
			out[i] = map[string]any{"index": r.Index, "relevance_score": r.Score, "document": map[string]string{"text": r.Document}}
		}
		e.writeJSON(ctx, fasthttp.StatusOK, map[string]any{"id": "rerank-" + e.workerID, "model": e.cfg.Model, "results": out})
		return
	}
	e.writeJSON(ctx, fasthttp.StatusOK, results)
}

// serveResponses answers POST /v1/responses {"model", "input", "stream"?} with one output
// message naming the engine; a stream sends the created, delta and completed events.
func (e *Engine) serveResponses(ctx *fasthttp.RequestCtx) {
	var body struct {
		Model  string          `json:"model"`
		Input  json.RawMessage `json:"input"`
		Stream bool            `json:"stream"`
	}
	if err := decodeJSON(ctx.PostBody(), &body); err != nil {
		e.writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	if !present(body.Input) {
		e.writeError(ctx, fasthttp.StatusBadRequest, "input is required")
		return
	}
	id := "resp_" + e.workerID + "_" + strconv.FormatInt(e.clock.Now().UnixNano(), 36)
	text := "a response from " + e.workerID
	resp := map[string]any{"id": id, "object": "response", "status": "completed", "model": e.cfg.Model,
		"output": []any{map[string]any{"type": "message", "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": text}}}}}
	if !body.Stream {
		e.writeJSON(ctx, fasthttp.StatusOK, resp)
		return
	}
	created, _ := json.Marshal(map[string]any{"type": "response.created", "response": map[string]any{"id": id, "status": "in_progress"}})
	delta, _ := json.Marshal(map[string]any{"type": "response.output_text.delta", "delta": text})
	done, _ := json.Marshal(map[string]any{"type": "response.completed", "response": resp})
	b := []byte("event: response.created\ndata: " + string(created) + "\n\n" +
		"event: response.output_text.delta\ndata: " + string(delta) + "\n\n" +
		"event: response.completed\ndata: " + string(done) + "\n\n")
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("text/event-stream")
	ctx.SetBody(b)
}
