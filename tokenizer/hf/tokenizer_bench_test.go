package hf

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"
)

// The benchmarks run the reference (the Hugging Face tokenizers library, through
// testdata/bench_ref.mjs, one thread) beside Switchyard's tokenizer on the same input and
// report both as ns/op and MB/s. make bench-tokenizer runs them with GOMAXPROCS=1.

// mixedText returns about size bytes of the parity corpus (English, CJK, emoji, code,
// numbers, whitespace runs, special-token strings), one text per line.
func mixedText(b testing.TB, size int) string {
	b.Helper()
	texts := readCorpus(b)
	var sb strings.Builder
	for sb.Len() < size {
		for _, s := range texts {
			if utf8.ValidString(s) {
				sb.WriteString(s)
				sb.WriteByte('\n')
			}
			if sb.Len() >= size {
				break
			}
		}
	}
	return sb.String()
}

// conversation returns the JSON of a chat of about tokens tokens: alternating user and
// assistant turns of corpus text, and the conversation without its last message.
func conversation(b testing.TB, tk *Tokenizer, tokens int) (full []byte, text string) {
	b.Helper()
	corpus := mixedText(b, 4<<20)
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", "You are a helpful assistant."}}
	n, off := 0, 0
	for i := 0; n < tokens; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		end := off + 3000
		for end < len(corpus) && !utf8.RuneStart(corpus[end]) {
			end++
		}
		content := corpus[off:end]
		off = end
		msgs = append(msgs, msg{role, content})
		n += tk.Count(content) + 5
	}
	msgs = append(msgs, msg{"user", "Summarize the conversation."})
	full, err := json.Marshal(msgs)
	if err != nil {
		b.Fatal(err)
	}
	s, err := tk.RenderChatJSON(full, ChatOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return full, s
}

// reference is a running bench_ref.mjs.
type reference struct {
	cmd *exec.Cmd
	in  *os.File
	out *bufio.Reader
}

// startReference starts the reference on text with the model's tokenizer.json; it skips the
// benchmark when node or the npm packages are missing.
func startReference(b *testing.B, model, text string) *reference {
	b.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		b.Skip("node not found: no reference figures")
	}
	npm := npmDir(b)
	textFile := filepath.Join(b.TempDir(), "text")
	if err := os.WriteFile(textFile, []byte(text), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(node, filepath.Join("testdata", "bench_ref.mjs"), npm, filepath.Join(modelDir(b, model), TokenizerFile), textFile)
	cmd.Env = append(os.Environ(), "RAYON_NUM_THREADS=1", "TOKENIZERS_PARALLELISM=false", "UV_THREADPOOL_SIZE=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	r := &reference{cmd: cmd, in: stdin.(*os.File), out: bufio.NewReader(stdout)}
	b.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	if line, err := r.out.ReadString('\n'); err != nil || line != "ready\n" {
		b.Fatalf("reference did not start: %q, %v", line, err)
	}
	return r
}

// run encodes the text n times in the reference and returns the elapsed nanoseconds, the
// token count and the CPU nanoseconds the reference's process spent.
func (r *reference) run(b *testing.B, n int) (float64, int, float64) {
	if _, err := fmt.Fprintf(r.in, "%d\n", n); err != nil {
		b.Fatal(err)
	}
	line, err := r.out.ReadString('\n')
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(line)
	if len(f) != 3 {
		b.Fatalf("reference said %q", line)
	}
	ns, err1 := strconv.ParseFloat(f[0], 64)
	ids, err2 := strconv.Atoi(f[1])
	cpu, err3 := strconv.ParseFloat(f[2], 64)
	if err1 != nil || err2 != nil || err3 != nil {
		b.Fatalf("reference said %q", line)
	}
	return ns, ids, cpu
}

// benchReference reports the reference's time per encoding of text as ns/op and MB/s, and
// its CPU time as cpu-ns/op.
func benchReference(b *testing.B, model, text string) {
	r := startReference(b, model, text)
	b.ResetTimer()
	ns, ids, cpu := r.run(b, b.N)
	b.StopTimer()
	perOp := ns / float64(b.N)
	b.ReportMetric(perOp, "ns/op")
	b.ReportMetric(float64(len(text))/perOp*1e3, "MB/s")
	b.ReportMetric(cpu/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(ids), "tokens")
}

// cpuTime returns the CPU time the process has spent, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the CPU time per operation since start as cpu-ns/op: on a shared
// machine, the figure to compare with the reference's (GOMAXPROCS=1, as make
// bench-tokenizer runs).
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
}

func benchModel(b *testing.B, model string, cacheBytes int64) *Tokenizer {
	b.Helper()
	dir := modelDir(b, model)
	tk, err := Load(dir, Options{CacheBytes: cacheBytes, Now: fixedNow})
	if err != nil {
		b.Fatal(err)
	}
	return tk
}

// BenchmarkEncode1MB encodes 1 MB of mixed text without the chunk cache (the word cache is
// on, as the reference's BPE cache is).
func BenchmarkEncode1MB(b *testing.B) {
	text := mixedText(b, 1<<20)
	for _, model := range append(slices.Clone(realModels), derivedModels...) {
		b.Run(model+"/switchyard", func(b *testing.B) {
			tk := benchModel(b, model, -1)
			dst := tk.AppendEncodePlain(nil, text)
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cpuTime(b)
			for range b.N {
				dst = tk.AppendEncodePlain(dst[:0], text)
			}
			reportCPU(b, cpu)
			b.ReportMetric(float64(len(dst)), "tokens")
		})
		b.Run(model+"/reference", func(b *testing.B) { benchReference(b, model, text) })
	}
}

// BenchmarkChat100k encodes a conversation of about 100k tokens: rendering its chat template
// and encoding the result. cold has no chunk cache; warm has seen the conversation up to its
// last message, which differs at every iteration, as a multi-turn chat resends its history.
// The reference encodes the rendered text only.
func BenchmarkChat100k(b *testing.B) {
	for _, model := range []string{"qwen3", "llama3"} {
		tk := benchModel(b, model, 0)
		msgs, rendered := conversation(b, tk, 104_000)
		b.Run(model+"/switchyard-cold", func(b *testing.B) {
			cold := benchModel(b, model, -1)
			b.SetBytes(int64(len(rendered)))
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cpuTime(b)
			var n int
			for range b.N {
				ids, err := cold.EncodeChatJSON(msgs, ChatOptions{})
				if err != nil {
					b.Fatal(err)
				}
				n = len(ids)
			}
			reportCPU(b, cpu)
			b.ReportMetric(float64(n), "tokens")
		})
		b.Run(model+"/switchyard-warm", func(b *testing.B) {
			warm := benchModel(b, model, 0)
			if _, err := warm.EncodeChatJSON(msgs, ChatOptions{}); err != nil {
				b.Fatal(err)
			}
			variants := make([][]byte, b.N)
			for i := range variants {
				variants[i] = []byte(strings.Replace(string(msgs), "Summarize the conversation.", fmt.Sprintf("Summarize the conversation (%d).", i), 1))
			}
			b.SetBytes(int64(len(rendered)))
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cpuTime(b)
			var n int
			for i := range b.N {
				ids, err := warm.EncodeChatJSON(variants[i], ChatOptions{})
				if err != nil {
					b.Fatal(err)
				}
				n = len(ids)
			}
			reportCPU(b, cpu)
			b.ReportMetric(float64(n), "tokens")
		})
		b.Run(model+"/reference", func(b *testing.B) { benchReference(b, model, rendered) })
	}
}

// BenchmarkEncodeParallel encodes short prompts from every core at once: the caches are the
// shared state.
func BenchmarkEncodeParallel(b *testing.B) {
	text := mixedText(b, 64<<10)
	prompts := strings.SplitAfter(text, "\n")
	tk := benchModel(b, "qwen3", 0)
	b.SetBytes(int64(len(text) / len(prompts)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		dst := make([]uint32, 0, 4096)
		i := 0
		for pb.Next() {
			dst = tk.AppendEncode(dst[:0], prompts[i%len(prompts)])
			i++
		}
	})
}
