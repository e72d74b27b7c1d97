package httpfront

import (
	"encoding/json"
	"testing"

	"switchyard/tokenizer"
)

// FuzzPrepareTokens checks, for every accepted chat or /generate request, that the messages
// prepared for a chat template are a valid JSON array of as many objects, each with a string
// content, that preparing them again changes nothing, and that a forwarded /generate body is
// a valid JSON object carrying input_ids and no text.
func FuzzPrepareTokens(f *testing.F) {
	seeds := []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a\"b"},{"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":"\u00e9"}],"name":null}]}`,
		`{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"a\": [1, {\"b\": null}]}"}},{"function":{"arguments":"not json"}},7]},{"role":"tool","content":"ok"}]}`,
		`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"arguments":" {} "}}]}],"tools":[{"type":"function"}],"tool_choice":"none","chat_template_kwargs":{"x":1}}`,
		`{"text":"hello","sampling_params":{"max_new_tokens":1},"input_ids":null}`,
		`{"text":["a","b\n"],"rid":["x","y"]}`,
		`{ "text" : "dup", "text" : "last" }`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	pt := newPromptTokenizer(tokenizer.NewSimple(), true)
	f.Fuzz(func(t *testing.T, body []byte) {
		var facts requestFacts
		if parseRequest(routeChat, body, &facts) == nil {
			prepared := appendChatMessages(nil, facts.messages)
			var msgs []map[string]json.RawMessage
			if err := json.Unmarshal(prepared, &msgs); err != nil {
				t.Fatalf("prepared messages %s: %v", prepared, err)
			}
			if len(msgs) != len(facts.messages) {
				t.Fatalf("%d prepared messages, want %d", len(msgs), len(facts.messages))
			}
			for _, m := range msgs {
				var s string
				if err := json.Unmarshal(m["content"], &s); err != nil {
					t.Fatalf("prepared content %s is not a string", m["content"])
				}
			}
			var again []jsonValue
			_ = jsonValue{kind: kindArray, raw: prepared}.elems(func(_ int, v jsonValue) error {
				again = append(again, v)
				return nil
			})
			if twice := appendChatMessages(nil, again); string(twice) != string(prepared) {
				t.Fatalf("preparing twice changed\n  %s\ninto\n  %s", prepared, twice)
			}
		}
		if parseRequest(routeGenerate, body, &facts) == nil && pt.forwards(&facts) {
			var text []byte
			out, n, _ := facts.forwardInputIDs(pt, body, nil, &text)
			var m map[string]json.RawMessage
			if err := json.Unmarshal(out, &m); err != nil {
				t.Fatalf("forwarded body %s: %v", out, err)
			}
			if _, ok := m["text"]; ok || len(m["input_ids"]) == 0 || n < 0 {
				t.Fatalf("forwarded body %s counted %d", out, n)
			}
		}
	})
}
