package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"switchyard/bench/workload"
	"switchyard/tokenizer"
)

// stepClock advances by one millisecond on every reading.
type stepClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *stepClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Millisecond)
	return c.t
}

const sseBody = `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"one"}}]}

: keep-alive

data: {"choices":[{"index":0,"delta":{"content":" two"}}]}

data: {"choices":[{"index":0,"delta":{"content":" three"}}]}

data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}

data: {"choices":[],"usage":{"prompt_tokens":40,"total_tokens":43,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":32}}}

data: [DONE]

`

func TestReadStream(t *testing.T) {
	tests := []struct {
		name string
		body string
		want Result
	}{
		{"complete stream", sseBody, Result{TTFT: time.Millisecond, ITL: time.Millisecond, E2E: 4 * time.Millisecond,
			PromptTokens: 40, CachedTokens: 32, CompletionTokens: 3}},
		{"CRLF lines", strings.ReplaceAll(sseBody, "\n", "\r\n"), Result{TTFT: time.Millisecond, ITL: time.Millisecond,
			E2E: 4 * time.Millisecond, PromptTokens: 40, CachedTokens: 32, CompletionTokens: 3}},
		{"no end marker", strings.TrimSuffix(sseBody, "data: [DONE]\n\n"), Result{TTFT: time.Millisecond, ITL: time.Millisecond,
			E2E: 4 * time.Millisecond, PromptTokens: 40, CachedTokens: 32, CompletionTokens: 3, Error: "truncated"}},
		{"error event", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"error\":{\"message\":\"x\",\"code\":\"upstream_error\"}}\n\ndata: [DONE]\n\n",
			Result{TTFT: time.Millisecond, E2E: 2 * time.Millisecond, CompletionTokens: 1, Error: "upstream_error"}},
		{"no usage counts chunks", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"\"}}]}\n\ndata: [DONE]\n\n",
			Result{TTFT: time.Millisecond, E2E: 2 * time.Millisecond, CompletionTokens: 1}},
		{"completions text", "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
			Result{TTFT: time.Millisecond, ITL: time.Millisecond, E2E: 3 * time.Millisecond, CompletionTokens: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := &stepClock{}
			start := clk.t
			var got Result
			readStream(strings.NewReader(tt.body), &got, start, clk.now)
			if got != tt.want {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestReadStreamLongLine(t *testing.T) {
	long := strings.Repeat("x", 100<<10)
	body := `data: {"choices":[{"delta":{"content":"` + long + `"}}]}` + "\n\ndata: [DONE]\n\n"
	var got Result
	readStream(strings.NewReader(body), &got, time.Now(), time.Now)
	if got.CompletionTokens != 1 || got.Error != "" {
		t.Errorf("got %+v", got)
	}
}

func TestErrorCode(t *testing.T) {
	tests := []struct {
		status int
		body   string
		want   string
	}{
		{429, `{"error":{"message":"full","type":"overloaded_error","code":"overloaded"}}`, "overloaded"},
		{503, `{"error":{"message":"x","type":"service_unavailable"}}`, "service_unavailable"},
		{500, `{"error":{"code":500}}`, "http_500"},
		{502, `not json`, "http_502"},
	}
	for _, tt := range tests {
		if got := errorCode(tt.status, []byte(tt.body)); got != tt.want {
			t.Errorf("errorCode(%d, %s) = %q, want %q", tt.status, tt.body, got, tt.want)
		}
	}
}

func requests(n int) []workload.Request {
	out := make([]workload.Request, n)
	for i := range out {
		out[i] = workload.Request{Index: i, Class: fmt.Sprint("c", i%3), MaxTokens: 3, After: -1,
			Messages: []tokenizer.Message{{Role: "user", Content: fmt.Sprint("request ", i)}}}
	}
	return out
}

// chatBody decodes the request body the server received.
func decodeBody(t testing.TB, r *http.Request) chatBody {
	var b struct {
		chatBody
		Messages []tokenizer.Message `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil {
		t.Errorf("bad request body: %v", err)
	}
	b.chatBody.Messages = b.Messages
	return b.chatBody
}

func TestMeasureStreaming(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := decodeBody(t, r)
		if r.URL.Path != DefaultPath || !b.Stream || b.StreamOptions == nil || !b.StreamOptions.IncludeUsage || b.MaxTokens != 3 {
			t.Errorf("unexpected request %s %+v", r.URL.Path, b)
		}
		// Request 1 names its own model (an adapter); the others the run's.
		want := "m"
		if msgs, _ := b.Messages.([]tokenizer.Message); len(msgs) == 1 && msgs[0].Content == "request 1" {
			want = "m-adapter"
		}
		if b.Model != want {
			t.Errorf("unexpected request %s %+v", r.URL.Path, b)
		}
		if got := r.Header.Get("x-session-id"); got != "s1" {
			t.Errorf("session header %q", got)
		}
		if got := r.Header.Get("x-tenant"); got != "t1" {
			t.Errorf("tenant header %q", got)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Worker-Id", "engine-7")
		w.Header().Set("X-Switchyard-Bucket", "short")
		w.Header().Set("X-Switchyard-Estimated-Ttft-Ms", "12.5")
		io.WriteString(w, sseBody)
	}))
	defer srv.Close()
	reqs := requests(5)
	for i := range reqs {
		reqs[i].SessionID, reqs[i].Tenant = "s1", "t1"
	}
	reqs[1].Model = "m-adapter"
	m, err := Measure(context.Background(), Config{URLs: []string{srv.URL}, Model: "m", Stream: true, Concurrency: 2}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Results) != 5 || m.Truncated || m.Elapsed <= 0 {
		t.Fatalf("%d results, truncated %v, elapsed %v", len(m.Results), m.Truncated, m.Elapsed)
	}
	for i, r := range m.Results {
		if !r.OK() || r.Index != i || r.Class != reqs[i].Class || r.Worker != "engine-7" || r.Bucket != "short" ||
			r.PromptTokens != 40 || r.CachedTokens != 32 || r.CompletionTokens != 3 || r.TTFT <= 0 || r.E2E < r.TTFT ||
			r.EstimatedTTFT != 12500*time.Microsecond {
			t.Errorf("result %d: %+v", i, r)
		}
	}
}

func TestMeasureNonStreaming(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := decodeBody(t, r)
		if b.Stream || b.StreamOptions != nil {
			t.Errorf("streaming body for a non-streaming run: %+v", b)
		}
		if r.Header.Get("x-sgl-routing-key") != "k" {
			t.Errorf("routing key %q", r.Header.Get("x-sgl-routing-key"))
		}
		if got := r.Header.Get("x-bench-tenant"); got != "t2" {
			t.Errorf("tenant header %q", got)
		}
		w.Header().Set("X-Switchyard-Worker", "w1")
		w.Header().Set("X-Switchyard-Prefill-Worker", "p1")
		w.Header().Set("X-Switchyard-Estimated-Ttft-Ms", "not a number")
		if n.Add(1)%2 == 0 {
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"error":{"message":"full","type":"overloaded_error","code":"overloaded"}}`)
			return
		}
		io.WriteString(w, `{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}`)
	}))
	defer srv.Close()
	reqs := requests(4)
	for i := range reqs {
		reqs[i].RoutingKey, reqs[i].Tenant = "k", "t2"
	}
	m, err := Measure(context.Background(), Config{URLs: []string{srv.URL}, Model: "m", Concurrency: 1, TenantHeader: "x-bench-tenant"}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	okN, rejected := 0, 0
	for _, r := range m.Results {
		switch {
		case r.OK():
			okN++
			if r.Worker != "w1" || r.PrefillWorker != "p1" || r.PromptTokens != 9 || r.CachedTokens != 4 || r.CompletionTokens != 2 || r.TTFT != r.E2E ||
				r.EstimatedTTFT != 0 {
				t.Errorf("ok result %+v", r)
			}
		case r.Status == 429 && r.Error == "overloaded":
			rejected++
		default:
			t.Errorf("result %+v", r)
		}
	}
	if okN != 2 || rejected != 2 {
		t.Errorf("%d ok, %d rejected", okN, rejected)
	}
}

func TestMeasureTransportError(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens any more
	for _, stream := range []bool{false, true} {
		m, err := Measure(context.Background(), Config{URLs: []string{url}, Model: "m", Stream: stream}, requests(1))
		if err != nil {
			t.Fatal(err)
		}
		if r := m.Results[0]; r.OK() || r.Status != 0 || r.Error != "transport" {
			t.Errorf("stream %v: %+v", stream, r)
		}
	}
}

func TestClosedLoopBoundsConcurrency(t *testing.T) {
	const clients = 3
	var inflight, peak atomic.Int64
	reached := make(chan struct{})
	var once sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		if n == clients {
			once.Do(func() { close(reached) })
		}
		// Hold the first requests until all clients are in flight, so the peak is reached.
		select {
		case <-reached:
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
			t.Error("the clients never had 3 requests in flight")
		}
		io.WriteString(w, `{"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
	defer srv.Close()
	m, err := Measure(context.Background(), Config{URLs: []string{srv.URL}, Model: "m", Concurrency: clients}, requests(30))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Results) != 30 || peak.Load() != clients {
		t.Errorf("%d results, peak %d in flight, want 30 and %d", len(m.Results), peak.Load(), clients)
	}
}

func TestDependenciesWait(t *testing.T) {
	// Request 1 is the next turn of request 0. Request 0's handler waits a little for
	// request 1: it must not come before request 0 has completed.
	second := make(chan struct{})
	var events []string
	var mu sync.Mutex
	log := func(s string) {
		mu.Lock()
		events = append(events, s)
		mu.Unlock()
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := decodeBody(t, r)
		content := b.Messages.([]tokenizer.Message)[0].Content
		log(content + " start")
		if content == "request 0" {
			select {
			case <-second:
				t.Error("the dependent request arrived before its dependency completed")
			case <-time.After(100 * time.Millisecond):
			}
			log(content + " end")
		} else {
			close(second)
		}
		io.WriteString(w, `{"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
	defer srv.Close()
	reqs := requests(2)
	reqs[1].After = 0
	m, err := Measure(context.Background(), Config{URLs: []string{srv.URL}, Model: "m", Concurrency: 2}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Results) != 2 || strings.Join(events, ",") != "request 0 start,request 0 end,request 1 start" {
		t.Errorf("results %d, events %v", len(m.Results), events)
	}
}

func okServer() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
}

func TestOpenLoop(t *testing.T) {
	srv := okServer()
	defer srv.Close()
	m, err := Measure(context.Background(), Config{URLs: []string{srv.URL}, Model: "m", Rate: 2000, Seed: 3}, requests(40))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Results) != 40 || m.Truncated {
		t.Fatalf("%d results, truncated %v", len(m.Results), m.Truncated)
	}
	for i, r := range m.Results {
		if r.Index != i || !r.OK() {
			t.Errorf("result %d: %+v", i, r)
		}
	}
	// At 2 requests per second, a 300 ms bound admits the arrivals before it only.
	m, err = Measure(context.Background(), Config{URLs: []string{srv.URL}, Model: "m", Rate: 2, Seed: 3, Duration: 300 * time.Millisecond}, requests(40))
	if err != nil {
		t.Fatal(err)
	}
	if !m.Truncated || len(m.Results) >= 40 {
		t.Errorf("duration bound: %d results, truncated %v", len(m.Results), m.Truncated)
	}
}

func TestRepeatAndBounds(t *testing.T) {
	srv := okServer()
	defer srv.Close()
	m, err := Measure(context.Background(), Config{URLs: []string{srv.URL, srv.URL}, Model: "m", Concurrency: 2, Repeat: true, MaxRequests: 10}, requests(3))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Results) != 10 || m.Truncated {
		t.Fatalf("%d results, truncated %v", len(m.Results), m.Truncated)
	}
	for i, r := range m.Results {
		if r.Index != i || r.Class != fmt.Sprint("c", i%3) {
			t.Errorf("result %d: index %d class %s", i, r.Index, r.Class)
		}
	}
	m, err = Measure(context.Background(), Config{URLs: []string{srv.URL}, Model: "m", MaxRequests: 2}, requests(3))
	if err != nil || len(m.Results) != 2 || m.Truncated {
		t.Errorf("max requests: %v, %d results, truncated %v", err, len(m.Results), m.Truncated)
	}
}

func TestMeasureCancelled(t *testing.T) {
	srv := okServer()
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	m, err := Measure(ctx, Config{URLs: []string{srv.URL}, Model: "m"}, requests(5))
	if !errors.Is(err, context.Canceled) || len(m.Results) != 0 || !m.Truncated {
		t.Errorf("err %v, %d results, truncated %v", err, len(m.Results), m.Truncated)
	}
}

func TestConfigValidate(t *testing.T) {
	err := Config{Concurrency: -1, Rate: -1, MaxRequests: -1, Duration: -1, Repeat: true}.Validate()
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{"urls", "model", "concurrency", "rate", "max_requests", "duration"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
	if err := (Config{URLs: []string{"http://127.0.0.1:1"}, Model: "m", Repeat: true}).Validate(); err == nil || !strings.Contains(err.Error(), "repeat") {
		t.Errorf("unbounded repeat: %v", err)
	}
	if _, err := Measure(context.Background(), Config{URLs: []string{"http://127.0.0.1:1"}, Model: "m"}, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("no requests: %v", err)
	}
}

// TestRouteChoosesTheURL: with Route, each request goes to the URL Route returns for its
// index, not to the rotation.
func TestRouteChoosesTheURL(t *testing.T) {
	var hits [2]atomic.Int64
	var srvs [2]*httptest.Server
	for k := range srvs {
		srvs[k] = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits[k].Add(1)
			io.WriteString(w, `{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
		}))
		defer srvs[k].Close()
	}
	urls := []string{srvs[0].URL, srvs[1].URL}
	var mu sync.Mutex
	routed := map[int]bool{}
	route := func(i int) string {
		mu.Lock()
		routed[i] = true
		mu.Unlock()
		if i < 5 {
			return urls[1] // the first five to the second server, then the first only
		}
		return urls[0]
	}
	m, err := Measure(context.Background(), Config{URLs: urls, Route: route, Model: "m", Concurrency: 2}, requests(8))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range m.Results {
		if !r.OK() {
			t.Fatalf("result %+v", r)
		}
	}
	if hits[0].Load() != 3 || hits[1].Load() != 5 || len(routed) != 8 {
		t.Fatalf("hits %d and %d, %d requests routed; want 3 and 5 of 8", hits[0].Load(), hits[1].Load(), len(routed))
	}
}

// TestReadStreamSplitReads feeds a stream in two reads split at every offset, and one byte
// a read: an event split across reads counts as it does whole.
func TestReadStreamSplitReads(t *testing.T) {
	want := Result{TTFT: time.Millisecond, ITL: time.Millisecond, E2E: 4 * time.Millisecond,
		PromptTokens: 40, CachedTokens: 32, CompletionTokens: 3}
	check := func(name string, body io.Reader) {
		t.Helper()
		clk := &stepClock{}
		var got Result
		readStream(body, &got, clk.t, clk.now)
		if got != want {
			t.Errorf("%s: got %+v\nwant %+v", name, got, want)
		}
	}
	for i := range len(sseBody) + 1 {
		check(fmt.Sprintf("split at %d", i), io.MultiReader(strings.NewReader(sseBody[:i]), strings.NewReader(sseBody[i:])))
	}
	check("one byte a read", iotest.OneByteReader(strings.NewReader(sseBody)))
}
