package httpfront

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

var fuzzSeeds = []string{
	`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"temperature":0.5,"top_p":1,"n":2}`,
	`{"model":"m","prompt":[[1,2],[3]],"max_tokens":1}`,
	`{"text":["a","b"],"sampling_params":[{"max_new_tokens":1},{"top_p":0.5}],"return_logprob":true}`,
	`{"input_ids":[1,2,3],"stream":false}`,
	`{"model":"\u00e9\ud83d\ude00","messages":[]}`,
	`{"a":[{"b":[{"c":[1e10,-0.5e-3,true,false,null]}]}]}`,
	`{"model":"m"`,
	`[`,
	`{"model":"m","input":["a","b"]}`,
	`{"model":"m","input":[{"role":"user","content":"hi"}],"stream":true,"max_output_tokens":4}`,
	`{"query":"q","documents":["a","b"],"top_n":1}`,
	`{"prompt":"hello"}`,
	`{"tokens":[1,2,3]}`,
}

// FuzzParseRequest checks that request parsing never panics, accepts only valid JSON objects,
// and that every accepted request can be prepared (tokens, peak, PD body).
func FuzzParseRequest(f *testing.F) {
	for _, s := range fuzzSeeds {
		for k := range numRoutes {
			f.Add(uint8(k), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		k := routeKind(kind % uint8(numRoutes))
		var facts requestFacts
		e := parseRequest(k, body, &facts)
		if e != nil {
			if e.status() != 400 {
				t.Fatalf("status %d for a client error", e.status())
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(body, &obj); err != nil {
			t.Fatalf("accepted a non-object %q: %v", body, err)
		}
		if k.needsModel() && len(facts.model) == 0 {
			t.Fatal("accepted a request without a model")
		}
		n, _, _ := facts.inputTokens(nil, body, nil)
		if n < 0 {
			t.Fatalf("negative input %d", n)
		}
		if _, e := expectedPeak(n, facts.maxTokens); e == nil && facts.maxTokens >= 0 && n+facts.maxTokens < n {
			t.Fatal("overflow not caught")
		}
		out := injectBootstrap(nil, body, "127.0.0.1", 8998, facts.batch)
		if !json.Valid(out) {
			t.Fatalf("PD body is not JSON: %q", out)
		}
	})
}

// FuzzScanValue compares the scanner with encoding/json on validity.
func FuzzScanValue(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte(`"\ud800"`))
	f.Add([]byte(`-01`))
	f.Add([]byte(` 1.5e+3 `))
	f.Add([]byte(`{"a\"b\\":["x\\",{"c":[1,-2.5e3,true,null,"]}\"",[]]}],"d" : {} , "e":[ ] , "f":"\\\"\\"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, end, err := scanValue(b, 0, 0)
		ok := err == nil && skipWS(b, end) == len(b)
		want := json.Valid(b)
		if ok && !want {
			t.Fatalf("scanner accepts what encoding/json rejects: %q", b)
		}
		if !ok && want && utf8.Valid(b) && err != errJSONDepth {
			t.Fatalf("scanner rejects valid JSON %q: %v", b, err)
		}
		if ok {
			v, _, _ := scanValue(b, 0, 0)
			if walked, scanned := jsonTree(v, false), jsonTree(v, true); walked != scanned {
				t.Fatalf("members/elems walk %q as\n%s\nthe scanner as\n%s", b, walked, scanned)
			}
		}
		if ok {
			var v any
			if json.Unmarshal(b, &v) == nil {
				if s, isStr := v.(string); isStr && utf8.Valid(b) {
					if got := string(appendUnquoted(nil, b[skipWS(b, 0):skipWS2(b)])); got != s {
						t.Fatalf("unquote %q = %q, want %q", b, got, s)
					}
				}
			}
		}
	})
}

// jsonTree lists v's values depth first, one a line (kind and raw bytes, members with their
// keys): through members and elems, or (scan) through the validating scanner.
func jsonTree(v jsonValue, scan bool) string {
	var sb strings.Builder
	var walk func(prefix string, v jsonValue)
	walk = func(prefix string, v jsonValue) {
		fmt.Fprintf(&sb, "%s%c %q\n", prefix, v.kind, v.raw)
		switch v.kind {
		case kindObject:
			fn := func(key []byte, mv jsonValue) error { walk(prefix+string(key)+" ", mv); return nil }
			if scan {
				_, _ = scanObject(v.raw, 0, 1, fn)
			} else {
				_ = v.members(fn)
			}
		case kindArray:
			fn := func(i int, ev jsonValue) error { walk(prefix+strconv.Itoa(i)+" ", ev); return nil }
			if scan {
				_, _ = scanArray(v.raw, 0, 1, fn)
			} else {
				_ = v.elems(fn)
			}
		}
	}
	walk("", v)
	return sb.String()
}

// skipWS2 returns the index after the last non-space byte.
func skipWS2(b []byte) int {
	i := len(b)
	for i > 0 && (b[i-1] == ' ' || b[i-1] == '\t' || b[i-1] == '\n' || b[i-1] == '\r') {
		i--
	}
	return i
}
