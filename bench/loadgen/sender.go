package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/bench/workload"
)

// Response headers read from every response.
const (
	headerRouterWorker  = "X-Switchyard-Worker"
	headerPrefillWorker = "X-Switchyard-Prefill-Worker"
	headerBucket        = "X-Switchyard-Bucket"
	headerEstimatedTTFT = "X-Switchyard-Estimated-Ttft-Ms"
	headerEngineWorker  = "X-Worker-Id"
)

// maxErrorBody bounds how much of an error body is read.
const maxErrorBody = 64 << 10

// usage is the OpenAI usage object.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	Details          *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (u *usage) fill(res *Result) {
	res.PromptTokens = u.PromptTokens
	res.CompletionTokens = u.CompletionTokens
	if u.Details != nil {
		res.CachedTokens = u.Details.CachedTokens
	}
}

// metaInfo is the part of SGLang's /generate meta_info the harness reads: that route's
// usage.
type metaInfo struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	CachedTokens     int `json:"cached_tokens"`
}

func (m *metaInfo) fill(res *Result) {
	res.PromptTokens, res.CompletionTokens, res.CachedTokens = m.PromptTokens, m.CompletionTokens, m.CachedTokens
}

// envelope is the part of a response body or stream chunk the harness reads.
type envelope struct {
	Usage    *usage    `json:"usage"`
	MetaInfo *metaInfo `json:"meta_info"`
	Error    *struct {
		Code any    `json:"code"`
		Type string `json:"type"`
	} `json:"error"`
}

// errorCode names the failure an error body describes: its code, else its type, else the
// status ("http_503").
// fill copies the usage the envelope carries (OpenAI usage, else /generate's meta_info).
func (e *envelope) fill(res *Result) {
	switch {
	case e.Usage != nil:
		e.Usage.fill(res)
	case e.MetaInfo != nil:
		e.MetaInfo.fill(res)
	}
}

func errorCode(status int, body []byte) string {
	var env envelope
	if json.Unmarshal(body, &env) == nil && env.Error != nil {
		switch c := env.Error.Code.(type) {
		case string:
			if c != "" {
				return c
			}
		case float64:
			return "http_" + strconv.Itoa(int(c))
		}
		if env.Error.Type != "" {
			return env.Error.Type
		}
	}
	return "http_" + strconv.Itoa(status)
}

var (
	_ sender = (*fastSender)(nil)
	_ sender = (*streamSender)(nil)
)

// conns is how many requests of a run can be in flight, so how many connections a sender
// keeps: the closed loop's clients, or an open loop's (Poisson or replay) bound.
func (c Config) conns() int {
	if c.Rate > 0 || c.Replay > 0 {
		return c.MaxOutstanding
	}
	return c.Concurrency
}

// fastSender sends non-streaming requests with a fasthttp client.
type fastSender struct {
	client  *fasthttp.Client
	cfg     Config
	timeout time.Duration
}

func newFastSender(cfg Config) *fastSender {
	conns := cfg.conns()
	return &fastSender{
		cfg:     cfg,
		timeout: cfg.Timeout,
		client: &fasthttp.Client{
			MaxConnsPerHost:               conns,
			MaxConnWaitTimeout:            cfg.Timeout,
			ReadTimeout:                   cfg.Timeout,
			WriteTimeout:                  cfg.Timeout,
			NoDefaultUserAgentHeader:      true,
			DisableHeaderNamesNormalizing: false,
		},
	}
}

func (s *fastSender) close() { s.client.CloseIdleConnections() }

// do calls sent just before the client sends the request: fasthttp writes it in this
// goroutine, with no hook after the write.
func (s *fastSender) do(_ context.Context, url string, body []byte, r *workload.Request, res *Result, start time.Time, sent func()) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	if r.SessionID != "" {
		req.Header.Set(s.cfg.SessionHeader, r.SessionID)
	}
	if r.RoutingKey != "" {
		req.Header.Set(s.cfg.RoutingKeyHeader, r.RoutingKey)
	}
	if r.Tenant != "" {
		req.Header.Set(s.cfg.TenantHeader, r.Tenant)
	}
	req.SetBodyRaw(body)
	if sent != nil {
		sent()
	}
	err := s.client.DoTimeout(req, resp, s.timeout)
	res.E2E = s.cfg.Now().Sub(start)
	if err != nil {
		res.Error = transportError(err)
		return
	}
	res.Status = resp.StatusCode()
	res.Worker = string(resp.Header.Peek(headerRouterWorker))
	if res.Worker == "" {
		res.Worker = string(resp.Header.Peek(headerEngineWorker))
	}
	res.PrefillWorker = string(resp.Header.Peek(headerPrefillWorker))
	res.Bucket = string(resp.Header.Peek(headerBucket))
	res.EstimatedTTFT = parseMs(resp.Header.Peek(headerEstimatedTTFT))
	if res.Status != fasthttp.StatusOK {
		res.Error = errorCode(res.Status, resp.Body())
		return
	}
	var env envelope
	if err := json.Unmarshal(resp.Body(), &env); err != nil {
		res.Error = "malformed_response"
		return
	}
	env.fill(res)
	res.TTFT = res.E2E
}

// parseMs reads a router header holding milliseconds; 0 when absent or unreadable.
func parseMs(v []byte) time.Duration {
	if len(v) == 0 {
		return 0
	}
	ms, err := strconv.ParseFloat(string(v), 64)
	if err != nil || !(ms > 0) || ms > 1e9 {
		return 0
	}
	return time.Duration(ms * float64(time.Millisecond))
}

func transportError(err error) string {
	var ne net.Error
	if errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return "timeout"
	}
	if errors.Is(err, context.Canceled) {
		return "cancelled"
	}
	return "transport"
}

// streamBuffer is the size of a stream reader's buffer.
const streamBuffer = 32 << 10

// streamSender sends streaming requests with net/http and reads their events as they come.
type streamSender struct {
	transport *http.Transport
	client    *http.Client
	cfg       Config
	readers   sync.Pool // *bufio.Reader of streamBuffer bytes
}

func newStreamSender(cfg Config) *streamSender {
	conns := cfg.conns()
	t := &http.Transport{
		Proxy:               nil,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
	}
	s := &streamSender{transport: t, client: &http.Client{Transport: t}, cfg: cfg}
	s.readers.New = func() any { return bufio.NewReaderSize(nil, streamBuffer) }
	return s
}

func (s *streamSender) close() { s.transport.CloseIdleConnections() }

// do calls sent once the request is written, headers and body, or once the response (or a
// transport error) comes if that is first: a request sent after it reaches the router after it.
func (s *streamSender) do(ctx context.Context, url string, body []byte, r *workload.Request, res *Result, start time.Time, sent func()) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	wrote := func() {}
	if sent != nil {
		var once sync.Once
		wrote = func() { once.Do(sent) }
		defer wrote()
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { wrote() }})
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		res.Error = "transport"
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if r.SessionID != "" {
		req.Header.Set(s.cfg.SessionHeader, r.SessionID)
	}
	if r.RoutingKey != "" {
		req.Header.Set(s.cfg.RoutingKeyHeader, r.RoutingKey)
	}
	if r.Tenant != "" {
		req.Header.Set(s.cfg.TenantHeader, r.Tenant)
	}
	resp, err := s.client.Do(req)
	wrote() // a response can come before the write ends: the request is on its way
	if err != nil {
		res.E2E = s.cfg.Now().Sub(start)
		res.Error = transportError(err)
		return
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	res.Worker = resp.Header.Get(headerRouterWorker)
	if res.Worker == "" {
		res.Worker = resp.Header.Get(headerEngineWorker)
	}
	res.PrefillWorker = resp.Header.Get(headerPrefillWorker)
	res.Bucket = resp.Header.Get(headerBucket)
	res.EstimatedTTFT = parseMs([]byte(resp.Header.Get(headerEstimatedTTFT)))
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		res.E2E = s.cfg.Now().Sub(start)
		res.Error = errorCode(res.Status, b)
		return
	}
	br := s.readers.Get().(*bufio.Reader)
	br.Reset(resp.Body)
	readStream(br, res, start, s.cfg.Now)
	br.Reset(nil)
	s.readers.Put(br)
	if res.Error != "" && ctx.Err() != nil {
		res.Error = transportError(ctx.Err())
	}
}

// readStream reads Server-Sent Events from body into res: the first and last token times,
// the token count, the usage chunk and the end marker. A *bufio.Reader of at least
// streamBuffer bytes is used as it is.
func readStream(body io.Reader, res *Result, start time.Time, now func() time.Time) {
	br := bufio.NewReaderSize(body, streamBuffer)
	var (
		line         []byte
		first, last  time.Time
		tokens       int
		done, failed bool
	)
	for !done {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil && len(line) == 0 {
			break
		}
		ev := bytes.TrimRight(line, "\r\n")
		line = line[:0]
		if p, ok := bytes.CutPrefix(ev, []byte("data:")); ok {
			p = bytes.TrimLeft(p, " ")
			switch {
			case bytes.Equal(p, []byte("[DONE]")):
				done = true
			case isTokenChunk(p):
				t := now()
				if tokens == 0 {
					first = t
				}
				last = t
				tokens++
				// Usage rides on a token chunk in some streams; /generate's is in the
				// meta_info of its last chunk, the one with a finish reason.
				if bytes.Contains(p, []byte(`"usage":{`)) || bytes.Contains(p, []byte(`"finish_reason":{`)) {
					readEnvelope(p, res, &failed)
				}
			case bytes.Contains(p, []byte(`"usage":{`)) || bytes.Contains(p, []byte(`"error":`)):
				readEnvelope(p, res, &failed)
			}
		}
		if err != nil {
			break
		}
	}
	end := now()
	res.E2E = end.Sub(start)
	if tokens > 0 {
		res.TTFT = first.Sub(start)
	}
	if tokens > 1 {
		res.ITL = last.Sub(first) / time.Duration(tokens-1)
	}
	if res.CompletionTokens == 0 {
		res.CompletionTokens = tokens
	}
	switch {
	case failed:
		if res.Error == "" {
			res.Error = "stream_error"
		}
	case !done:
		res.Error = "truncated"
	}
}

// isTokenChunk reports whether an event carries output text: a chat delta with content or a
// completion chunk with non-empty text.
func isTokenChunk(p []byte) bool {
	if bytes.Contains(p, []byte(`"content":`)) {
		return !bytes.Contains(p, []byte(`"content":""`)) && !bytes.Contains(p, []byte(`"content":null`))
	}
	return bytes.Contains(p, []byte(`"text":"`)) && !bytes.Contains(p, []byte(`"text":""`))
}

func readEnvelope(p []byte, res *Result, failed *bool) {
	var env envelope
	if err := json.Unmarshal(p, &env); err != nil {
		return
	}
	env.fill(res)
	if env.Error != nil {
		*failed = true
		res.Error = errorCode(res.Status, p)
	}
}
