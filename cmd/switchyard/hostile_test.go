package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
)

// The hostile-client suite: the router runs as its own process (the switchyard binary) and
// clients misbehave against it over loopback, with raw sockets and with the official OpenAI
// SDK (npm package openai, fetched by make testdata-openai). Every wait is bounded.
//
// Hostile peers on the router's other side, ZeroMQ publishers that greet and then claim a
// 2^40-byte frame, are TestHostileZMQPeersCannotCrashTheRouter (hostile_zmq_e2e_test.go).

// chatAnswer is a minimal non-streaming chat completion.
const chatAnswer = `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`

func quickChat(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, chatAnswer)
}

// TestHostileIdleConnectionFlood opens twice the router's open-file limit of connections that
// send nothing. The router must keep serving: it used to take "accept4: too many open files"
// for a permanent error, drain and exit.
func TestHostileIdleConnectionFlood(t *testing.T) {
	const nofile = 256
	up := fakeUpstream(t, quickChat)
	tests := []struct {
		name string
		args []string
		// must200: every request succeeds (the connection cap keeps descriptors for the
		// engine); otherwise the router must answer (any status) and live.
		must200 bool
	}{
		{"default connection cap", nil, true},
		{"cap above the open-file limit", []string{"--set", "server.max_connections=100000"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			router, url := startRouterChild(t, nofile, append([]string{"--worker-urls", up.URL, "--model", "m"}, tt.args...)...)
			addr := strings.TrimPrefix(url, "http://")
			conns := make([]net.Conn, 0, 2*nofile)
			defer func() {
				for _, c := range conns {
					c.Close()
				}
			}()
			for range 2 * nofile {
				c, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					t.Fatalf("dial %d: %v", len(conns), err)
				}
				conns = append(conns, c)
			}
			client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			for i := range 10 {
				resp, err := client.Post(url+"/v1/chat/completions", "application/json",
					strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
				if err != nil {
					if router.exited() {
						t.Fatalf("the router exited under the flood:\n%s", router.output())
					}
					t.Fatalf("request %d: %v", i, err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if tt.must200 && resp.StatusCode != 200 {
					t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, b)
				}
			}
			if router.exited() {
				t.Fatalf("the router exited:\n%s", router.output())
			}
		})
	}
}

// openAISDK locates the OpenAI SDK fetched by make testdata-openai. Without it (or without
// node) the test skips, loudly; under CI=true it fails.
func openAISDK(t *testing.T) (node, sdkDir, script string) {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root := wd
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(root)
		if parent == root {
			t.Fatal("no go.mod above the test's directory")
		}
		root = parent
	}
	sdkDir = filepath.Join(root, ".cache", "openai-npm")
	script = filepath.Join(wd, "testdata", "openai", "streams.mjs")
	node, nodeErr := exec.LookPath("node")
	_, sdkErr := os.Stat(filepath.Join(sdkDir, "node_modules", "openai", "package.json"))
	if nodeErr != nil || sdkErr != nil {
		msg := fmt.Sprintf("the OpenAI SDK stream tests need node and `make testdata-openai` (node: %v, SDK: %v)", nodeErr, sdkErr)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Log("!!!!!!!! SKIPPED: " + msg)
		t.Skip(msg)
	}
	return node, sdkDir, script
}

// sdkResult is how one OpenAI SDK stream ended (testdata/openai/streams.mjs).
type sdkResult struct {
	Stream       int     `json:"stream"`
	Outcome      string  `json:"outcome"`
	Chunks       int     `json:"chunks"`
	FinishReason *string `json:"finish_reason"`
	Status       *int    `json:"status"`
	Code         *string `json:"code"`
	Error        string  `json:"error"`
}

// sdkStreams runs n concurrent chat streams through the OpenAI SDK against url. When every
// stream has its first chunk it calls started (if not nil), then waits for all to end.
func sdkStreams(t *testing.T, url, model string, n, maxTokens int, started func()) []sdkResult {
	t.Helper()
	node, sdkDir, script := openAISDK(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script, sdkDir, url, model, strconv.Itoa(n), strconv.Itoa(maxTokens))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var results []sdkResult
	firsts := 0
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "first ") {
			if firsts++; firsts == n && started != nil {
				started()
			}
			continue
		}
		var r sdkResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("driver output %q: %v", line, err)
		}
		results = append(results, r)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the SDK driver failed: %v\n%s", err, stderr.String())
	}
	if len(results) != n {
		t.Fatalf("%d results for %d streams\n%s", len(results), n, stderr.String())
	}
	return results
}

// checkSDKResults: every stream ended with the API error wantCode (raised by the SDK from
// the router's error event), or, when completeOK, complete with a finish_reason. Nothing
// else is acceptable: a stream the SDK could not parse, a broken connection, or an answer
// that looks complete without its finish_reason (a truncated completion taken as finished).
func checkSDKResults(t *testing.T, results []sdkResult, wantCode string, completeOK bool) {
	t.Helper()
	errs := 0
	for _, r := range results {
		switch {
		case r.Outcome == "api_error" && r.Code != nil && *r.Code == wantCode:
			errs++
		case r.Outcome == "complete" && completeOK && r.FinishReason != nil:
		default:
			t.Errorf("stream %d: %+v (code %v, finish %v)", r.Stream, r, deref(r.Code), deref(r.FinishReason))
		}
	}
	if wantCode != "" && errs == 0 {
		t.Errorf("no stream ended with %s", wantCode)
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// sseChunk is one OpenAI chat stream chunk as an SSE event.
func sseChunk(i int, content string) string {
	return `data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":"` +
		content + strconv.Itoa(i) + `"},"finish_reason":null}]}` + "\n\n"
}

// TestHostileStreamsOpenAISDK: with the official OpenAI SDK's stream parser as the client,
// every stream ends with an error the SDK raises as an APIError, or with a complete answer,
// when the engine is killed, cuts its stream in the middle of an event or ends it without
// [DONE], when the request times out, and when the router drains.
func TestHostileStreamsOpenAISDK(t *testing.T) {
	openAISDK(t) // skip early without the SDK
	t.Run("complete answers", func(t *testing.T) {
		_, engine := startMockChild(t, "--model", "m", "--decode-step", "1ms")
		_, url := startRouterChild(t, 0, "--worker-urls", engine, "--model", "m")
		for _, r := range sdkStreams(t, url, "m", 8, 20, nil) {
			if r.Outcome != "complete" || r.FinishReason == nil || *r.FinishReason != "length" || r.Chunks < 20 {
				t.Errorf("stream %d: %+v", r.Stream, r)
			}
		}
	})
	t.Run("engine killed", func(t *testing.T) {
		engineProc, engine := startMockChild(t, "--model", "m", "--decode-step", "20ms")
		_, url := startRouterChild(t, 0, "--worker-urls", engine, "--model", "m")
		results := sdkStreams(t, url, "m", 8, 500, engineProc.kill)
		checkSDKResults(t, results, "upstream_error", false)
	})
	t.Run("engine cuts an event", func(t *testing.T) {
		up := fakeUpstream(t, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			half := sseChunk(1, "tr")
			_, _ = io.WriteString(w, sseChunk(0, "Hel")+half[:len(half)/2])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // the connection drops mid-event
		})
		_, url := startRouterChild(t, 0, "--worker-urls", up.URL, "--model", "m")
		checkSDKResults(t, sdkStreams(t, url, "m", 4, 16, nil), "upstream_error", false)
	})
	t.Run("engine ends without [DONE]", func(t *testing.T) {
		up := fakeUpstream(t, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, sseChunk(0, "Hel")+sseChunk(1, "lo"))
		})
		_, url := startRouterChild(t, 0, "--worker-urls", up.URL, "--model", "m")
		checkSDKResults(t, sdkStreams(t, url, "m", 4, 16, nil), "upstream_error", false)
	})
	t.Run("request timeout", func(t *testing.T) {
		_, engine := startMockChild(t, "--model", "m", "--decode-step", "20ms")
		_, url := startRouterChild(t, 0, "--worker-urls", engine, "--model", "m", "--request-timeout", "1500ms")
		checkSDKResults(t, sdkStreams(t, url, "m", 8, 500, nil), "upstream_timeout", false)
	})
	t.Run("drain", func(t *testing.T) {
		// As many streams as the drain test: all must end with the event.
		_, engine := startMockChild(t, "--model", "m", "--decode-step", "20ms", "--max-running", "256")
		router, url := startRouterChild(t, 0, "--worker-urls", engine, "--model", "m", "--set", "server.drain_timeout=500ms")
		results := sdkStreams(t, url, "m", 200, 300, func() { _ = router.cmd.Process.Signal(syscall.SIGTERM) })
		checkSDKResults(t, results, "shutting_down", false)
	})
}

// TestHostileNonReadingClient: a client reads the answer's headers and stops reading while
// the engine streams as fast as it can. The write timeout must release the stream: the
// engine sees its request cancelled and the router's in-flight count returns to zero, long
// before the request timeout.
func TestHostileNonReadingClient(t *testing.T) {
	cancelled := make(chan time.Time, 1)
	up := fakeUpstream(t, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		ev := []byte(sseChunk(0, strings.Repeat("x", 64<<10)))
		for {
			if _, err := w.Write(ev); err != nil {
				break
			}
			w.(http.Flusher).Flush()
		}
		cancelled <- time.Now()
	})
	_, url := startRouterChild(t, 0, "--worker-urls", up.URL, "--model", "m",
		"--set", "server.write_timeout=1s", "--request-timeout", "120s")
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`
	start := time.Now()
	if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: "+
		strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("answer: %v", err)
	}
	select {
	case at := <-cancelled:
		t.Logf("engine request cancelled %v after the request", at.Sub(start).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Fatal("the engine request still runs 30 s after the client stopped reading (write timeout 1 s)")
	}
	waitFor(t, "no request in flight after the stream ended", func() (bool, string) {
		n := metricValue(t, url+"/metrics", "switchyard_inflight_requests")
		return n == 0, fmt.Sprintf("%v in flight", n)
	})
}

// gzipBomb is a gzip body that expands to size bytes of zeros: members of 16 MiB repeated
// (a gzip body may hold several members; two make more than server.max_body_bytes' 32 MiB).
// Deflating zeros compresses about as well in a 16 MiB member as in a larger one (the body
// is 0.15% longer than with 256 MiB members), and deflating 256 MiB at BestCompression took
// 40-60 s of a -race run under load, 16 MiB 4 s.
func gzipBomb(t *testing.T, size int64) []byte {
	t.Helper()
	const memberMiB = 16
	var member bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&member, gzip.BestCompression)
	zeros := make([]byte, 1<<20)
	for range memberMiB {
		_, _ = zw.Write(zeros)
	}
	_ = zw.Close()
	return bytes.Repeat(member.Bytes(), int(size/(memberMiB<<20)))
}

// zstdBomb is a zstd body that expands to size bytes of zeros: frames of 256 MiB repeated.
func zstdBomb(t *testing.T, size int64) []byte {
	t.Helper()
	var frame bytes.Buffer
	zw, _ := zstd.NewWriter(&frame, zstd.WithEncoderLevel(zstd.SpeedBestCompression))
	zeros := make([]byte, 1<<20)
	for range 256 {
		_, _ = zw.Write(zeros)
	}
	_ = zw.Close()
	return bytes.Repeat(frame.Bytes(), int(size/(256<<20)))
}

// TestHostileCompressionBombs: 32 concurrent 10 GiB gzip bombs, then 16 zstd bombs, against
// the router with its default settings. Each is refused (413, or 503 while the body budget is
// spent), the router keeps serving, and its peak resident memory stays at most 300 MB
// (it reached 2.37 GB).
func TestHostileCompressionBombs(t *testing.T) {
	up := fakeUpstream(t, quickChat)
	router, url := startRouterChild(t, 0, "--worker-urls", up.URL, "--model", "m")
	baseline := router.peakRSS(t)
	for _, b := range []struct {
		enc   string
		count int
		body  []byte
	}{
		{"gzip", 32, gzipBomb(t, 10<<30)},
		{"zstd", 16, zstdBomb(t, 10<<30)},
	} {
		var wg sync.WaitGroup
		var mu sync.Mutex
		statuses := map[string]int{}
		for range b.count {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(b.body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Content-Encoding", b.enc)
				client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DisableCompression: true}}
				key := ""
				if resp, err := client.Do(req); err != nil {
					key = "error: " + err.Error()
				} else {
					var e struct {
						Error struct{ Code string } `json:"error"`
					}
					_ = json.NewDecoder(resp.Body).Decode(&e)
					resp.Body.Close()
					key = strconv.Itoa(resp.StatusCode) + " " + e.Error.Code
				}
				mu.Lock()
				statuses[key]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		t.Logf("%d %s bombs of %d MiB: %v", b.count, b.enc, len(b.body)>>20, statuses)
		for k := range statuses {
			if k != "413 request_too_large" && k != "503 body_budget_exhausted" {
				t.Errorf("%s bombs: answers %v", b.enc, statuses)
				break
			}
		}
	}
	if status, _, body := chatRequest(t, url, "m", false); status != 200 {
		t.Fatalf("after the bombs: %d %s", status, body)
	}
	peak := router.peakRSS(t)
	t.Logf("router peak RSS %d MB (%d MB at start)", peak>>20, baseline>>20)
	if peak > 300<<20 {
		t.Errorf("router peak RSS %d MB, want at most 300 MB", peak>>20)
	}
}

// TestHostileAdminWithOnlyDataKey: with only server.api_key set, the admin routes require
// it; they used to be open to anyone who reached the port.
func TestHostileAdminWithOnlyDataKey(t *testing.T) {
	up := fakeUpstream(t, quickChat)
	other := fakeUpstream(t, quickChat)
	_, url := startRouterChild(t, 0, "--worker-urls", up.URL, "--model", "m", "--api-key", "k")
	add := func(key string) int {
		req, _ := http.NewRequest(http.MethodPost, url+"/workers", strings.NewReader(`{"url":"`+other.URL+`","id":"evil","model":"m"}`))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		return statusOf(t, req)
	}
	del := func(key string) int {
		req, _ := http.NewRequest(http.MethodDelete, url+"/workers/w1", nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		return statusOf(t, req)
	}
	list, _ := http.NewRequest(http.MethodGet, url+"/workers", nil)
	if s := statusOf(t, list); s != 401 {
		t.Errorf("GET /workers without a key: %d", s)
	}
	if s := add(""); s != 401 {
		t.Errorf("POST /workers without a key: %d", s)
	}
	if s := add("wrong"); s != 403 {
		t.Errorf("POST /workers with a wrong key: %d", s)
	}
	if s := del(""); s != 401 {
		t.Errorf("DELETE /workers/w1 without a key: %d", s)
	}
	if s := add("k"); s != 201 {
		t.Errorf("POST /workers with the data-plane key: %d", s)
	}
}

func statusOf(t *testing.T, req *http.Request) int {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// rawExchange writes head and body on a new connection the way Python's requests does (the
// whole body first, reading the answer even when the write failed) and reads the answer. It
// returns the answer's status, body and the body write's error.
func rawExchange(t *testing.T, addr, head string, body []byte) (int, string, error) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	_, werr := io.WriteString(c, head)
	if werr == nil && len(body) > 0 {
		_, werr = c.Write(body)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer (body write: %v): %v", werr, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b), werr
}

// TestHostileEarlyAnswers: answers given before a request is read whole reach the client.
func TestHostileEarlyAnswers(t *testing.T) {
	up := fakeUpstream(t, quickChat)
	_, url := startRouterChild(t, 0, "--worker-urls", up.URL, "--model", "m", "--max-body-bytes", "1048576")
	addr := strings.TrimPrefix(url, "http://")
	big := bytes.Repeat([]byte("x"), 16<<20)
	const prefix, suffix = `{"model":"`, `","messages":[{"role":"user","content":"hi"}]}`
	tests := []struct {
		name     string
		head     string
		body     []byte
		status   int
		code     string
		fullSend bool // the client's whole body write must succeed (no reset)
	}{
		{"413 to a client that sends its whole body first",
			"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(big)) + "\r\n\r\n",
			big, 413, "request_too_large", true},
		{"413 to a chunked body over the cap",
			"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
			append([]byte(strconv.FormatInt(int64(len(big)), 16)+"\r\n"), append(big, "\r\n0\r\n\r\n"...)...), 413, "request_too_large", true},
		{"Expect: 100-continue over the cap",
			"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 104857600\r\nExpect: 100-continue\r\n\r\n",
			nil, 413, "request_too_large", false},
		{"headers over the cap",
			"GET /health HTTP/1.1\r\nHost: r\r\nX-Big: " + strings.Repeat("h", 64<<10) + "\r\n\r\n",
			nil, 431, "request_header_too_large", false},
		{"a 1 MiB model name",
			"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(1<<20-100) + "\r\n\r\n",
			[]byte(prefix + strings.Repeat("m", 1<<20-100-len(prefix)-len(suffix)) + suffix), 404, "model_not_found", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := range 5 {
				status, body, werr := rawExchange(t, addr, tt.head, tt.body)
				if tt.fullSend && werr != nil {
					t.Fatalf("try %d: the router reset the connection while the body was sent: %v", i, werr)
				}
				var e struct {
					Error struct{ Code string } `json:"error"`
				}
				_ = json.Unmarshal([]byte(body), &e)
				if status != tt.status || e.Error.Code != tt.code {
					t.Fatalf("try %d: %d %.300s", i, status, body)
				}
				if len(body) > 2048 {
					t.Fatalf("try %d: an error answer of %d bytes", i, len(body))
				}
			}
		})
	}
}
