package mockengine

import (
	"errors"
	"testing"
)

func FuzzParseRequest(f *testing.F) {
	seeds := []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"system","content":null},{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}]}],"n":2,"logprobs":true,"top_logprobs":1}`,
		`{"prompt":[[1,2,3],[4]],"max_tokens":1,"logprobs":2,"stop":["x"]}`,
		`{"prompt":"x","bootstrap_host":"127.0.0.1","bootstrap_port":null,"bootstrap_room":9223372036854775807}`,
		`{"text":["a","b"],"sampling_params":{"max_new_tokens":2,"temperature":0.5,"top_k":-1},"rid":["r1","r2"],"bootstrap_host":["h","h"],"bootstrap_port":[1,2],"bootstrap_room":[1,2]}`,
		`{"input_ids":[1,4294967295],"return_logprob":true,"data_parallel_rank":0}`,
		`{"messages":[`, `[]`, `null`, `{"prompt":{}}`, `{"temperature":"hot"}`,
	}
	for _, s := range seeds {
		for api := range 3 {
			f.Add(uint8(api), []byte(s))
		}
	}
	e := &Engine{cfg: Config{}.withDefaults()}
	e.tok = e.cfg.Tokenizer
	f.Fuzz(func(t *testing.T, api uint8, body []byte) {
		req, err := e.parseRequest(apiKind(api%3), body)
		if err != nil {
			var br *badRequest
			if !errors.As(err, &br) {
				t.Fatalf("error is not a client error: %v", err)
			}
			return
		}
		if len(req.prompts) == 0 || req.n < 1 || len(req.prompts)*req.n > maxBatch {
			t.Fatalf("accepted an invalid request: %+v", req)
		}
		for _, p := range req.prompts {
			if len(p) == 0 || len(p)+max(req.maxTokens, 0) > e.cfg.ContextLength {
				t.Fatalf("accepted a prompt of %d tokens with max_tokens %d", len(p), req.maxTokens)
			}
		}
		if req.boot != nil && len(req.boot) != len(req.prompts) {
			t.Fatalf("%d bootstrap items for %d prompts", len(req.boot), len(req.prompts))
		}
	})
}
