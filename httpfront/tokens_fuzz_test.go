package httpfront

import (
	"encoding/json"
	"reflect"
	"testing"

	"switchyard/tokenizer"
	"switchyard/tokenizer/jinja"
)

// FuzzPrepareTokens checks, for every accepted chat or /generate request, that the messages
// prepared for a chat template are as many dicts, each with a string content and no null
// member, that messages parseRequest did not flag for preparing are decoded as sent, and
// that a forwarded /generate body is a valid JSON object carrying input_ids and no text.
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
			var scratch []byte
			prepared, err := chatValues(facts.chat.messages, facts.messages, true, &scratch)
			if err != nil {
				t.Fatalf("preparing %s: %v", facts.chat.messages.raw, err)
			}
			if len(prepared) != len(facts.messages) {
				t.Fatalf("%d prepared messages, want %d", len(prepared), len(facts.messages))
			}
			for _, m := range prepared {
				d, ok := m.(*jinja.Dict)
				if !ok {
					t.Fatalf("prepared message %#v is not a dict", m)
				}
				if c, _ := d.Get("content"); reflect.TypeOf(c) != reflect.TypeFor[string]() {
					t.Fatalf("prepared content %#v is not a string", c)
				}
				for _, k := range d.Keys() {
					if v, _ := d.Get(k); v == nil {
						t.Fatalf("prepared message keeps the null member %q", k)
					}
				}
			}
			asSent, err := jinja.DecodeJSON(facts.chat.messages.raw)
			if err != nil {
				t.Fatalf("decoding %s: %v", facts.chat.messages.raw, err)
			}
			if !facts.chat.prepare && !reflect.DeepEqual(prepared, asSent) {
				t.Fatalf("messages not flagged for preparing changed\n  %#v\ninto\n  %#v", asSent, prepared)
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
