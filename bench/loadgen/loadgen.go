package loadgen

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"switchyard/bench/workload"
)

// Default values of Config.
const (
	DefaultPath          = "/v1/chat/completions"
	DefaultTimeout       = 2 * time.Minute
	DefaultProgressEvery = time.Second
	// DefaultMaxOutstanding bounds open-loop requests in flight; past it arrivals wait.
	DefaultMaxOutstanding = 4096
)

// ErrInvalidConfig is wrapped by every configuration error.
var ErrInvalidConfig = errors.New("invalid load generator configuration")

// Config configures one measured run.
type Config struct {
	// URLs are the base URLs requests go to ("http://127.0.0.1:8080"), in rotation: one
	// router, or the engines themselves for a direct run. Required.
	URLs []string
	// Route, when set, chooses the base URL of request i (its index in the run) instead of
	// the rotation over URLs: a load balancer in front of several routers. It is called
	// from the clients' goroutines, once per request sent, and must return one of URLs.
	Route func(i int) string
	// Path is the route. Default "/v1/chat/completions". The body follows the route:
	// chat messages (a trace request's prompt as one user message of its text), or, for a
	// trace request's token IDs, SGLang's native "/generate" (input_ids, sampling_params)
	// or "/v1/completions" (a token-ID prompt).
	Path string
	// Model is the "model" field of every request without its own (Request.Model). Required.
	Model string
	// Stream asks for Server-Sent Events; time to first token and inter-token latency are
	// measured only on streams. Default false.
	Stream bool
	// Concurrency is the number of closed-loop clients. Used when Rate is 0. Default 1.
	Concurrency int
	// Rate, when positive, sends open-loop Poisson arrivals at this mean rate, in requests
	// per second of wall time.
	Rate float64
	// Replay, when positive, sends every request open-loop at its own arrival time
	// (workload.Request.At) divided by Replay: 1 replays a trace in real time, 4 four
	// times faster. It excludes Rate and Repeat.
	Replay float64
	// MaxRequests bounds the requests sent. Default 0: every request of the workload (no
	// bound with Repeat).
	MaxRequests int
	// Repeat cycles over the requests (request i is reqs[i mod len(reqs)]) until MaxRequests
	// or Duration: a throughput run over a small set of requests. Dependencies (After) are
	// ignored. Bodies are rendered once. Default false.
	Repeat bool
	// Duration bounds the time during which requests are sent. Default 0: no bound.
	Duration time.Duration
	// Seed seeds the open-loop arrival times. Default 1.
	Seed uint64
	// SessionHeader carries Request.SessionID. Default "x-session-id".
	SessionHeader string
	// RoutingKeyHeader carries Request.RoutingKey. Default "x-sgl-routing-key".
	RoutingKeyHeader string
	// TenantHeader carries Request.Tenant. Default "x-tenant".
	TenantHeader string
	// Timeout bounds one request end to end. Default 2 minutes.
	Timeout time.Duration
	// MaxOutstanding bounds open-loop requests in flight. Default 4096.
	MaxOutstanding int
	// Progress, when set, is called every ProgressEvery and once at the end.
	Progress func(Progress)
	// ProgressEvery is the progress period. Default 1s.
	ProgressEvery time.Duration
	// Now is the clock of every measurement. Default time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.Path == "" {
		c.Path = DefaultPath
	}
	if c.Concurrency == 0 {
		c.Concurrency = 1
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.SessionHeader == "" {
		c.SessionHeader = "x-session-id"
	}
	if c.RoutingKeyHeader == "" {
		c.RoutingKeyHeader = "x-sgl-routing-key"
	}
	if c.TenantHeader == "" {
		c.TenantHeader = "x-tenant"
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxOutstanding == 0 {
		c.MaxOutstanding = DefaultMaxOutstanding
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = DefaultProgressEvery
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate reports every problem of c (after defaults) at once.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...)))
	}
	if len(c.URLs) == 0 {
		bad("urls", "at least one URL is required")
	}
	if c.Model == "" {
		bad("model", "required")
	}
	if c.Concurrency < 1 {
		bad("concurrency", "%d must be at least 1", c.Concurrency)
	}
	if c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) {
		bad("rate", "%v must be a finite non-negative number", c.Rate)
	}
	if c.Replay < 0 || math.IsNaN(c.Replay) || math.IsInf(c.Replay, 0) {
		bad("replay", "%v must be a finite non-negative number", c.Replay)
	}
	if c.Replay > 0 && (c.Rate > 0 || c.Repeat) {
		bad("replay", "excludes rate and repeat")
	}
	if c.MaxRequests < 0 {
		bad("max_requests", "%d is negative", c.MaxRequests)
	}
	if c.Duration < 0 {
		bad("duration", "%v is negative", c.Duration)
	}
	if c.Repeat && c.MaxRequests == 0 && c.Duration == 0 {
		bad("repeat", "needs max_requests or duration as a bound")
	}
	if c.Timeout < 0 {
		bad("timeout", "%v is negative", c.Timeout)
	}
	if c.MaxOutstanding < 1 {
		bad("max_outstanding", "%d must be at least 1", c.MaxOutstanding)
	}
	return errors.Join(errs...)
}

// Result is the measurement of one request. Durations are wall time.
type Result struct {
	// Index is the request's sequence number in the run (its workload index unless the run
	// repeats the workload); Class the request's class.
	Index int    `json:"index"`
	Class string `json:"class"`
	// Start is when the request was sent, from the start of the run.
	Start time.Duration `json:"start_ns"`
	// Late is, in an open loop, how long after its arrival the request was sent (after its
	// dependency's completion, when that came later): the load generator's own delay, which
	// a loaded machine makes tens of milliseconds. 0 in a closed loop.
	Late time.Duration `json:"late_ns,omitempty"`
	// TTFT is the time to the first output token of a stream, or to the whole response
	// otherwise; 0 when the request failed before it.
	TTFT time.Duration `json:"ttft_ns"`
	// ITL is the mean gap between output tokens after the first; 0 with fewer than two.
	ITL time.Duration `json:"itl_ns"`
	// E2E is the time to the end of the response (or the failure).
	E2E time.Duration `json:"e2e_ns"`
	// Status is the HTTP status; 0 when no response arrived.
	Status int `json:"status"`
	// Error names a failure: the error code of an error body, "transport", "timeout",
	// "truncated" (a stream without its end) or "stream_error"; empty on success.
	Error string `json:"error,omitempty"`
	// Worker is the engine that served the request: the router's X-Switchyard-Worker, or
	// the engine's X-Worker-Id (the decode engine of a PD pair).
	Worker string `json:"worker,omitempty"`
	// PrefillWorker is the prefill engine of a PD pair (X-Switchyard-Prefill-Worker).
	PrefillWorker string `json:"prefill_worker,omitempty"`
	// Bucket is the bucket the router chose (X-Switchyard-Bucket).
	Bucket string `json:"bucket,omitempty"`
	// EstimatedTTFT is the router's estimate of the time to first token made at dispatch
	// (X-Switchyard-Estimated-Ttft-Ms, sent for a request with an SLO target); 0 when none.
	EstimatedTTFT time.Duration `json:"estimated_ttft_ns,omitempty"`
	// PromptTokens, CachedTokens and CompletionTokens come from the response's usage.
	PromptTokens     int `json:"prompt_tokens"`
	CachedTokens     int `json:"cached_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// OK reports whether the request succeeded.
func (r *Result) OK() bool { return r.Status == 200 && r.Error == "" }

// Progress is a snapshot of a run in progress.
type Progress struct {
	Issued, Done, Errors int
	Elapsed              time.Duration
}

// Measurement is the outcome of one run.
type Measurement struct {
	// Results holds one entry per request sent, ordered by Index.
	Results []Result
	// Elapsed runs from the first send to the last completion.
	Elapsed time.Duration
	// Truncated is set when the duration bound (or a cancellation) stopped the run before
	// every request allowed by MaxRequests was sent.
	Truncated bool
}

// Measure sends reqs (at most MaxRequests of them, for at most Duration) and measures them.
// It returns what it measured, with ctx's error when ctx ended the run early.
func Measure(ctx context.Context, cfg Config, reqs []workload.Request) (*Measurement, error) {
	return measure(ctx, cfg, reqs, nil)
}

// measure is Measure through send, or, when send is nil, through the sender cfg asks for.
func measure(ctx context.Context, cfg Config, reqs []workload.Request, send sender) (*Measurement, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("cannot measure: %w: no requests", ErrInvalidConfig)
	}
	cfg = cfg.withDefaults()
	api, err := apiOf(cfg.Path, reqs)
	if err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, reqs: reqs, bodies: &bodies{model: cfg.Model, stream: cfg.Stream, api: api}}
	switch {
	case !cfg.Repeat:
		r.limit = len(reqs)
		if cfg.MaxRequests > 0 {
			r.limit = min(r.limit, cfg.MaxRequests)
		}
		r.done = make([]chan struct{}, r.limit)
		for i := range r.limit {
			if a := reqs[i].After; a >= 0 && a < r.limit && r.done[a] == nil {
				r.done[a] = make(chan struct{})
			}
		}
	case cfg.MaxRequests > 0:
		r.limit = cfg.MaxRequests
	default:
		r.limit = math.MaxInt
	}
	if cfg.Repeat {
		r.rendered = make([][]byte, len(reqs))
		for i := range reqs {
			r.rendered[i] = r.bodies.of(&reqs[i])
		}
	}
	switch {
	case send != nil:
		r.send = send
	case cfg.Stream:
		r.send = newStreamSender(cfg)
	default:
		r.send = newFastSender(cfg)
	}
	defer r.send.close()
	return r.run(ctx)
}

type sender interface {
	// do sends one request and fills res (all but Index, Class, Start and Late). It calls
	// sent, when not nil, exactly once: as soon as the request is on its way (see the
	// senders), or when do returns.
	do(ctx context.Context, url string, body []byte, req *workload.Request, res *Result, start time.Time, sent func())
	close()
}

type runner struct {
	cfg      Config
	reqs     []workload.Request
	limit    int             // requests that may be sent
	done     []chan struct{} // closed when request i completes, for its dependants
	rendered [][]byte        // bodies of a repeated run, rendered once
	bodies   *bodies
	send     sender

	issued, completed, failed atomic.Int64
	start                     time.Time
	last                      atomic.Int64 // ns since start of the last completion

	mu      sync.Mutex
	results []Result // merged from the clients
}

func (r *runner) run(ctx context.Context) (*Measurement, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r.start = r.cfg.Now()
	var deadline time.Time
	if r.cfg.Duration > 0 {
		deadline = r.start.Add(r.cfg.Duration)
	}
	stopProgress := r.progress()
	var taken int
	if r.cfg.Rate > 0 || r.cfg.Replay > 0 {
		taken = r.openLoop(ctx, deadline)
	} else {
		taken = r.closedLoop(ctx, deadline)
	}
	stopProgress()
	slices.SortFunc(r.results, func(a, b Result) int { return a.Index - b.Index })
	m := &Measurement{
		Results:   r.results,
		Elapsed:   time.Duration(r.last.Load()),
		Truncated: r.limit != math.MaxInt && taken < r.limit,
	}
	return m, context.Cause(ctx)
}

// stopping reports whether no further request may be sent.
func (r *runner) stopping(ctx context.Context, deadline time.Time) bool {
	return ctx.Err() != nil || (!deadline.IsZero() && !r.cfg.Now().Before(deadline))
}

func (r *runner) merge(res []Result) {
	r.mu.Lock()
	r.results = append(r.results, res...)
	r.mu.Unlock()
}

// closedLoop runs Concurrency clients over the requests in order and returns how many
// requests they took.
func (r *runner) closedLoop(ctx context.Context, deadline time.Time) int {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(r.cfg.Concurrency, r.limit) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []Result
			defer func() { r.merge(mine) }()
			for {
				if r.stopping(ctx, deadline) {
					return
				}
				i := next.Add(1) - 1
				if i >= int64(r.limit) {
					return
				}
				mine = append(mine, Result{})
				r.issue(ctx, int(i), &mine[len(mine)-1], nil, time.Time{}, nil)
			}
		}()
	}
	wg.Wait()
	return int(min(next.Load(), int64(r.limit)))
}

// openLoop sends request i at the i-th arrival of a Poisson process of rate Rate, or at
// its own arrival time scaled by Replay, and returns how many requests it sent.
//
// Requests leave in order: this goroutine is the scheduler. It renders request i's body,
// waits for its arrival, hands it to an idle sender of a pool (started as needed, at most
// MaxOutstanding), and hands over request i+1 only once request i is on its way (written,
// for a stream; see the senders) or waits for its dependency. A goroutine per
// request would not keep the order: on a loaded machine goroutines start tens of
// milliseconds late and in any order, and a conversation's next turn could reach the router
// before the turn it extends.
func (r *runner) openLoop(ctx context.Context, deadline time.Time) int {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 0xa77))
	jobs := make(chan openJob)
	sending := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(jobs)
	senders := 0
	sender := func() {
		defer wg.Done()
		for j := range jobs {
			var res Result
			r.issue(ctx, j.i, &res, j.body, j.due, func() { sending <- struct{}{} })
			r.merge([]Result{res})
		}
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	at := time.Duration(0)
	for i := 0; i < r.limit; i++ {
		if r.cfg.Replay > 0 {
			at = time.Duration(float64(r.reqs[i].At) / r.cfg.Replay)
		} else {
			at += time.Duration(rng.ExpFloat64() / r.cfg.Rate * float64(time.Second))
		}
		due := r.start.Add(at)
		if !deadline.IsZero() && due.After(deadline) {
			return i
		}
		j := openJob{i: i, due: due, body: r.body(i)} // rendered while waiting for the arrival
		if wait := due.Sub(r.cfg.Now()); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return i
			}
		}
		if ctx.Err() != nil {
			return i
		}
		select {
		case jobs <- j: // fast path: an idle sender
		default:
			if senders < r.cfg.MaxOutstanding {
				senders++
				wg.Add(1)
				go sender()
			}
			select { // past MaxOutstanding in flight, the arrival waits for a sender
			case jobs <- j:
			case <-ctx.Done():
				return i
			}
		}
		<-sending
	}
	return r.limit
}

// openJob is an open-loop request handed to a sender: its index, arrival and body.
type openJob struct {
	i    int
	due  time.Time
	body []byte
}

// body is request i's body: rendered once for a repeated run, else rendered now.
func (r *runner) body(i int) []byte {
	if r.rendered != nil {
		return r.rendered[i%len(r.reqs)]
	}
	return r.bodies.of(&r.reqs[i%len(r.reqs)])
}

// issue waits for request i's dependency, sends it and records its result in res. body is
// its rendered body, or nil to render it here. In an open loop due is the request's arrival,
// from which its lateness is measured, and sending is called exactly once: when the request
// is on its way (sender.do's sent), or when it starts waiting for its dependency.
func (r *runner) issue(ctx context.Context, i int, res *Result, body []byte, due time.Time, sending func()) {
	req := &r.reqs[i%len(r.reqs)]
	res.Index, res.Class = i, req.Class
	if r.done != nil {
		defer func() {
			if ch := r.done[i]; ch != nil {
				close(ch)
			}
		}()
		if a := req.After; a >= 0 && a < len(r.done) {
			if sending != nil {
				sending()
				sending = nil
			}
			select {
			case <-r.done[a]:
			case <-ctx.Done():
				res.Error = "cancelled"
				r.failed.Add(1)
				return
			}
			// A dependent request is due when its arrival and its dependency have both come.
			if !due.IsZero() {
				if now := r.cfg.Now(); now.After(due) {
					due = now
				}
			}
		}
	}
	r.issued.Add(1)
	base := ""
	if r.cfg.Route != nil {
		base = r.cfg.Route(i)
	} else {
		base = r.cfg.URLs[i%len(r.cfg.URLs)]
	}
	url := base + r.cfg.Path
	if body == nil {
		body = r.body(i)
	}
	start := r.cfg.Now()
	res.Start = start.Sub(r.start)
	if !due.IsZero() {
		res.Late = max(start.Sub(due), 0)
	}
	r.send.do(ctx, url, body, req, res, start, sending)
	end := res.Start + res.E2E
	for {
		old := r.last.Load()
		if int64(end) <= old || r.last.CompareAndSwap(old, int64(end)) {
			break
		}
	}
	r.completed.Add(1)
	if !res.OK() {
		r.failed.Add(1)
	}
}

// progress starts the progress ticker and returns its stop function, which reports once more.
func (r *runner) progress() (stop func()) {
	if r.cfg.Progress == nil {
		return func() {}
	}
	report := func() {
		r.cfg.Progress(Progress{Issued: int(r.issued.Load()), Done: int(r.completed.Load()),
			Errors: int(r.failed.Load()), Elapsed: r.cfg.Now().Sub(r.start)})
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(r.cfg.ProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				report()
			}
		}
	}()
	return func() {
		close(quit)
		wg.Wait()
		report()
	}
}

// api is the body format of a route.
type api uint8

const (
	apiChat        api = iota // /v1/chat/completions: messages
	apiGenerate               // SGLang's /generate: input_ids and sampling_params
	apiCompletions            // /v1/completions: a token-ID prompt
)

// apiOf returns the body format of path for reqs: /generate and /v1/completions carry a
// trace request's token IDs and so need every request to have them; any other route gets
// chat messages.
func apiOf(path string, reqs []workload.Request) (api, error) {
	a := apiChat
	switch path {
	case "/generate":
		a = apiGenerate
	case "/v1/completions":
		a = apiCompletions
	default:
		return a, nil
	}
	for i := range reqs {
		if reqs[i].Tokens == nil {
			return a, fmt.Errorf("cannot measure: %w: path %s needs token prompts, request %d has chat messages", ErrInvalidConfig, path, i)
		}
	}
	return a, nil
}

// bodies renders request bodies; each request is sent once per run, so nothing is kept.
type bodies struct {
	model  string
	stream bool
	api    api
}

type chatBody struct {
	Model         string         `json:"model"`
	Messages      any            `json:"messages"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream,omitempty"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// generateBody is a /generate body but for its input_ids.
type generateBody struct {
	Model          string         `json:"model,omitempty"`
	SamplingParams samplingParams `json:"sampling_params"`
	Stream         bool           `json:"stream,omitempty"`
}

type samplingParams struct {
	MaxNewTokens int  `json:"max_new_tokens"`
	IgnoreEOS    bool `json:"ignore_eos"`
}

type completionBody struct {
	Model         string         `json:"model"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream,omitempty"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
}

func (b *bodies) of(req *workload.Request) []byte {
	model := cmp.Or(req.Model, b.model)
	switch {
	case b.api == apiGenerate:
		return tokenBody(&generateBody{Model: model, SamplingParams: samplingParams{MaxNewTokens: req.MaxTokens, IgnoreEOS: true},
			Stream: b.stream}, "input_ids", req.Tokens)
	case b.api == apiCompletions:
		cb := completionBody{Model: model, MaxTokens: req.MaxTokens, Stream: b.stream}
		if b.stream {
			cb.StreamOptions = &streamOptions{IncludeUsage: true}
		}
		return tokenBody(&cb, "prompt", req.Tokens)
	}
	msgs := any(req.Messages)
	if req.Tokens != nil {
		msgs = req.Tokens.Messages()
	}
	cb := chatBody{Model: model, Messages: msgs, MaxTokens: req.MaxTokens, Stream: b.stream}
	if b.stream {
		cb.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	out, err := json.Marshal(&cb)
	if err != nil {
		panic("BUG: cannot encode a chat body: " + err.Error())
	}
	return out
}

// tokenBody encodes head and appends the member key holding p's token IDs.
func tokenBody(head any, key string, p *workload.TokenPrompt) []byte {
	out, err := json.Marshal(head)
	if err != nil {
		panic("BUG: cannot encode a request body: " + err.Error())
	}
	out = append(out[:len(out)-1], `,"`...)
	out = append(out, key...)
	out = append(out, `":`...)
	out = p.AppendJSONIDs(out)
	return append(out, '}')
}
