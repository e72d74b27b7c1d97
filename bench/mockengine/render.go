package mockengine

import (
	"strconv"

	"switchyard/httpfront/jsontext"
)

func appendFloat(dst []byte, f float64) []byte { return strconv.AppendFloat(dst, f, 'f', -1, 64) }

// usage sums the job's token counts: prompts once per prompt, cached tokens of the first
// sample of each prompt (or the prefill partner's, on a decode engine).
func (j *job) usage() (prompt, completion, cached int) {
	for _, s := range j.seqs {
		completion += int(s.produced.Load())
		if s.index%j.req.n != 0 {
			continue
		}
		prompt += len(s.prompt)
		if it := j.items[s.item]; it.fromPrefill {
			cached += it.prefillCached
		} else {
			cached += int(s.cached.Load())
		}
	}
	return prompt, completion, cached
}

func (j *job) seqCached(s *seq) int {
	if it := j.items[s.item]; it.fromPrefill {
		return it.prefillCached
	}
	return int(s.cached.Load())
}

func appendUsage(dst []byte, prompt, completion, cached int) []byte {
	dst = append(dst, `{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt+completion), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(completion), 10)
	dst = append(dst, `,"prompt_tokens_details":{"cached_tokens":`...)
	dst = strconv.AppendInt(dst, int64(cached), 10)
	return append(dst, "}}"...)
}

// appendText appends the text of the sequence's first n output tokens.
func (j *job) appendText(dst []byte, s *seq, n int) []byte {
	for i := range n {
		dst = append(dst, j.e.words.token(s.seed, i).text...)
	}
	return dst
}

func (j *job) appendHeader(dst []byte, object string) []byte {
	prefix := "chatcmpl-"
	if j.req.api == apiCompletions {
		prefix = "cmpl-"
	}
	dst = append(dst, `{"id":"`...)
	dst = append(dst, prefix...)
	dst = append(dst, j.rid...)
	dst = append(dst, `","object":"`...)
	dst = append(dst, object...)
	dst = append(dst, `","created":`...)
	dst = strconv.AppendInt(dst, j.created.Unix(), 10)
	dst = append(dst, `,"model":`...)
	model := j.req.model
	if model == "" {
		model = j.e.cfg.Model
	}
	return jsontext.AppendString(dst, model)
}

// appendResponse appends the non-streaming response body.
func (j *job) appendResponse(dst []byte) []byte {
	switch j.req.api {
	case apiGenerate:
		many := j.req.batch || len(j.seqs) > 1
		if many {
			dst = append(dst, '[')
		}
		for i, s := range j.seqs {
			if i > 0 {
				dst = append(dst, ',')
			}
			n := int(s.produced.Load())
			dst = j.appendGenerateObject(dst, s, n, finishReason(s), j.appendText(nil, s, n), -1)
		}
		if many {
			dst = append(dst, ']')
		}
		return dst
	case apiChat:
		dst = j.appendHeader(dst, "chat.completion")
	default:
		dst = j.appendHeader(dst, "text_completion")
	}
	dst = append(dst, `,"choices":[`...)
	for i, s := range j.seqs {
		if i > 0 {
			dst = append(dst, ',')
		}
		n := int(s.produced.Load())
		dst = append(dst, `{"index":`...)
		dst = strconv.AppendInt(dst, int64(s.index), 10)
		text := j.appendText(nil, s, n)
		if j.req.api == apiChat {
			dst = append(dst, `,"message":{"role":"assistant","content":`...)
			dst = jsontext.AppendString(dst, string(text))
			dst = append(dst, `,"reasoning_content":null,"tool_calls":null}`...)
		} else {
			dst = append(dst, `,"text":`...)
			dst = jsontext.AppendString(dst, string(text))
		}
		dst = append(dst, `,"logprobs":`...)
		dst = j.appendLogprobs(dst, s, 0, n)
		dst = append(dst, `,"finish_reason":"`...)
		dst = append(dst, finishReason(s)...)
		dst = append(dst, `","matched_stop":null}`...)
	}
	dst = append(dst, `],"usage":`...)
	p, c, k := j.usage()
	dst = appendUsage(dst, p, c, k)
	return append(dst, '}')
}

// appendLogprobs appends the logprobs of output tokens [from, to) of s, or null.
func (j *job) appendLogprobs(dst []byte, s *seq, from, to int) []byte {
	if !j.req.logprobs {
		return append(dst, "null"...)
	}
	if j.req.api == apiChat {
		dst = append(dst, `{"content":[`...)
		for i := from; i < to; i++ {
			if i > from {
				dst = append(dst, ',')
			}
			t := j.e.words.token(s.seed, i)
			lp := logprob(s.seed, i)
			dst = append(dst, `{"token":`...)
			dst = jsontext.AppendString(dst, t.text)
			dst = append(dst, `,"logprob":`...)
			dst = appendFloat(dst, lp)
			dst = append(dst, `,"bytes":null,"top_logprobs":[`...)
			for k := range j.req.topLogprobs {
				if k > 0 {
					dst = append(dst, ',')
				}
				alt := j.e.words.token(s.seed+uint64(k), i)
				if k == 0 {
					alt = t
				}
				dst = append(dst, `{"token":`...)
				dst = jsontext.AppendString(dst, alt.text)
				dst = append(dst, `,"logprob":`...)
				dst = appendFloat(dst, lp-float64(k))
				dst = append(dst, `,"bytes":null}`...)
			}
			dst = append(dst, "]}"...)
		}
		return append(dst, "]}"...)
	}
	// Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}.
	dst = append(dst, `{"tokens":[`...)
	for i := from; i < to; i++ {
		if i > from {
			dst = append(dst, ',')
		}
		dst = jsontext.AppendString(dst, j.e.words.token(s.seed, i).text)
	}
	dst = append(dst, `],"token_logprobs":[`...)
	for i := from; i < to; i++ {
		if i > from {
			dst = append(dst, ',')
		}
		dst = appendFloat(dst, logprob(s.seed, i))
	}
	dst = append(dst, `],"top_logprobs":null,"text_offset":null}`...)
	return dst
}

// appendGenerateObject appends one /generate output object for the first n tokens of s;
// finish is "" while the sequence runs. index >= 0 adds the stream's "index" field.
func (j *job) appendGenerateObject(dst []byte, s *seq, n int, finish string, text []byte, index int) []byte {
	dst = append(dst, `{"text":`...)
	dst = jsontext.AppendString(dst, string(text))
	dst = append(dst, `,"output_ids":[`...)
	for i := range n {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(j.e.words.token(s.seed, i).id), 10)
	}
	dst = append(dst, `],"meta_info":{"id":`...)
	rid := j.rid
	if s.item < len(j.req.rids) {
		rid = j.req.rids[s.item]
	}
	if len(j.seqs) > 1 {
		rid += "-" + itoa(s.index)
	}
	dst = jsontext.AppendString(dst, rid)
	dst = append(dst, `,"finish_reason":`...)
	switch finish {
	case "":
		dst = append(dst, "null"...)
	case "length":
		dst = append(dst, `{"type":"length","length":`...)
		dst = strconv.AppendInt(dst, int64(n), 10)
		dst = append(dst, '}')
	case "stop":
		dst = append(dst, `{"type":"stop","matched":null}`...)
	default:
		dst = append(dst, `{"type":"abort","message":"the request was aborted"}`...)
	}
	dst = append(dst, `,"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(len(s.prompt)), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(n), 10)
	dst = append(dst, `,"cached_tokens":`...)
	dst = strconv.AppendInt(dst, int64(j.seqCached(s)), 10)
	queue, ttft, e2e := s.timing()
	dst = append(dst, `,"queue_time":`...)
	dst = appendFloat(dst, queue)
	dst = append(dst, `,"first_token_latency":`...)
	dst = appendFloat(dst, ttft)
	if finish != "" {
		dst = append(dst, `,"e2e_latency":`...)
		dst = appendFloat(dst, e2e)
	}
	dst = append(dst, `,"dp_rank":`...)
	dst = strconv.AppendInt(dst, int64(j.rank.id), 10)
	dst = append(dst, `,"worker_id":`...)
	dst = jsontext.AppendString(dst, j.e.workerID)
	if j.req.logprobs {
		dst = append(dst, `,"input_token_logprobs":[`...)
		if !j.awaitsKV() { // the prefill engine's are prepended by the router
			for i, id := range s.prompt {
				if i > 0 {
					dst = append(dst, ',')
				}
				dst = append(dst, '[')
				if i == 0 {
					dst = append(dst, "null"...)
				} else {
					dst = appendFloat(dst, logprob(uint64(id), i))
				}
				dst = append(dst, ',')
				dst = strconv.AppendUint(dst, uint64(id), 10)
				dst = append(dst, ",null]"...)
			}
		}
		dst = append(dst, `],"output_token_logprobs":[`...)
		for i := range n {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, '[')
			dst = appendFloat(dst, logprob(s.seed, i))
			dst = append(dst, ',')
			dst = strconv.AppendUint(dst, uint64(j.e.words.token(s.seed, i).id), 10)
			dst = append(dst, ",null]"...)
		}
		dst = append(dst, ']')
	}
	dst = append(dst, "}"...)
	if index >= 0 {
		dst = append(dst, `,"index":`...)
		dst = strconv.AppendInt(dst, int64(index), 10)
	}
	return append(dst, '}')
}

// appendChunk appends one SSE event for sequence i: output token tok (tok >= 0), or the
// sequence's final chunk with its finish reason (tok < 0).
func (j *job) appendChunk(dst []byte, st *sseStream, i, tok int, finish string) []byte {
	s := j.seqs[i]
	dst = append(dst, "data: "...)
	if j.req.api == apiGenerate {
		n := len(st.ids[i])
		if tok >= 0 {
			t := j.e.words.token(s.seed, tok)
			st.texts[i] = append(st.texts[i], t.text...)
			st.ids[i] = append(st.ids[i], t.id)
			n++
		}
		dst = j.appendGenerateObject(dst, s, n, finish, st.texts[i], s.index)
		return append(dst, "\n\n"...)
	}
	object := "text_completion"
	if j.req.api == apiChat {
		object = "chat.completion.chunk"
	}
	dst = j.appendHeader(dst, object)
	dst = append(dst, `,"choices":[{"index":`...)
	dst = strconv.AppendInt(dst, int64(s.index), 10)
	if j.req.api == apiChat {
		dst = append(dst, `,"delta":{`...)
		if tok >= 0 {
			if tok == 0 {
				dst = append(dst, `"role":"assistant",`...)
			}
			dst = append(dst, `"content":`...)
			dst = jsontext.AppendString(dst, j.e.words.token(s.seed, tok).text)
		}
		dst = append(dst, '}')
	} else {
		dst = append(dst, `,"text":`...)
		if tok >= 0 {
			dst = jsontext.AppendString(dst, j.e.words.token(s.seed, tok).text)
		} else {
			dst = append(dst, `""`...)
		}
	}
	dst = append(dst, `,"logprobs":`...)
	if tok >= 0 {
		dst = j.appendLogprobs(dst, s, tok, tok+1)
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"finish_reason":`...)
	if finish == "" {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, '"')
		dst = append(dst, finish...)
		dst = append(dst, `","matched_stop":null`...)
	}
	return append(dst, "}]}\n\n"...)
}

// appendUsageChunk appends the final usage chunk of an OpenAI stream.
func (j *job) appendUsageChunk(dst []byte) []byte {
	object := "text_completion"
	if j.req.api == apiChat {
		object = "chat.completion.chunk"
	}
	dst = append(dst, "data: "...)
	dst = j.appendHeader(dst, object)
	dst = append(dst, `,"choices":[],"usage":`...)
	p, c, k := j.usage()
	dst = appendUsage(dst, p, c, k)
	return append(dst, "}\n\n"...)
}
