package mockengine

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/httpfront/hangup"
	"switchyard/kv/hashing"
	"switchyard/load"
)

// job is one inference request in flight: its sequences (prompts × samples) on one rank.
type job struct {
	e       *Engine
	req     *inferRequest
	rank    *rank
	rid     string
	seqs    []*seq
	notify  chan struct{}
	created time.Time
	faults  *Faults
	items   []itemInfo // per prompt: cached tokens reported by the prefill partner (decode)

	mu        sync.Mutex
	submitted bool
	closed    bool
	abortCh   chan struct{}
	abortOnce sync.Once
}

type itemInfo struct {
	prefillCached int
	fromPrefill   bool
}

// newJob builds the sequences of req and registers the job for /abort_request.
func (e *Engine) newJob(req *inferRequest) *job {
	j := &job{
		e: e, req: req, rank: e.pickRank(req.dpRank), notify: make(chan struct{}, 1), created: e.clock.Now(),
		faults: e.faults.Load(), abortCh: make(chan struct{}), items: make([]itemInfo, len(req.prompts)),
	}
	if len(req.rids) > 0 {
		j.rid = req.rids[0]
	} else {
		j.rid = e.newRID()
	}
	ps := e.cfg.PageSize
	j.seqs = make([]*seq, 0, len(req.prompts)*req.n)
	for i, p := range req.prompts {
		var hashes []int64
		var last hashing.Digest
		if !j.awaitsKV() {
			full := len(p) / ps
			hashes, last = hashing.AppendChainHashes(make([]int64, 0, full), nil, p[:full*ps], ps)
		}
		seed := hashTokens(p)
		maxTokens := req.maxTokens
		if maxTokens < 0 {
			maxTokens = req.defaultMax
			if maxTokens == 0 {
				maxTokens = e.cfg.DefaultMaxTokens
			}
			if maxTokens == 0 {
				maxTokens = 16 + int(seed%113)
			}
			maxTokens = max(0, min(maxTokens, e.cfg.ContextLength-len(p), e.cfg.CacheTokens-len(p)))
		}
		if e.cfg.Role == RolePrefill {
			maxTokens = min(maxTokens, 1) // the prefill engine computes the first token only
		}
		for k := range req.n {
			s := &seq{job: j, index: i*req.n + k, item: i, prompt: p, hashes: hashes, last: last, maxTokens: maxTokens, seed: seed + uint64(k)}
			if e.cfg.Role == RolePrefill && req.boot != nil && k == 0 {
				s.room, s.hasRoom = req.boot[i].room, true
			}
			j.seqs = append(j.seqs, s)
		}
	}
	e.jobsMu.Lock()
	for k := range j.rids() {
		e.jobs[k] = j
	}
	e.jobsMu.Unlock()
	return j
}

// rids yields the request IDs the job answers to: its own and any per-item ones.
func (j *job) rids() func(func(string) bool) {
	return func(yield func(string) bool) {
		if !yield(j.rid) {
			return
		}
		for _, r := range j.req.rids[min(1, len(j.req.rids)):] {
			if !yield(r) {
				return
			}
		}
	}
}

func (e *Engine) newRID() string {
	b := make([]byte, 0, 32)
	b = appendHex(b, e.ridBase)
	return string(appendHex(b, e.ridSeq.Add(1)))
}

func appendHex(b []byte, v uint64) []byte {
	const digits = "0123456789abcdef"
	for i := 60; i >= 0; i -= 4 {
		b = append(b, digits[(v>>uint(i))&0xf])
	}
	return b
}

func (e *Engine) pickRank(hint int) *rank {
	if hint >= 0 && hint < len(e.ranks) {
		return e.ranks[hint]
	}
	if len(e.ranks) == 1 {
		return e.ranks[0]
	}
	return e.ranks[(e.rr.Add(1)-1)%uint64(len(e.ranks))]
}

// abort aborts the job with rid, or every job; it returns how many it aborted.
func (e *Engine) abort(rid string, all bool) int {
	e.jobsMu.Lock()
	var js []*job
	if all {
		for _, j := range e.jobs {
			js = append(js, j)
		}
	} else if j := e.jobs[rid]; j != nil {
		js = append(js, j)
	}
	e.jobsMu.Unlock()
	seen := map[*job]bool{}
	for _, j := range js {
		if !seen[j] {
			seen[j] = true
			j.abort()
		}
	}
	return len(seen)
}

// abort marks the job's sequences for the scheduler, which finishes them at its next step
// boundary, and counts the abort last: whoever sees the count (WaitAborts) finds the abort
// in effect, so the step in progress is the last one the request takes part in.
func (j *job) abort() {
	j.abortOnce.Do(func() {
		for _, s := range j.seqs {
			s.aborted.Store(true)
		}
		close(j.abortCh)
		select {
		case j.rank.wake <- struct{}{}:
		default:
		}
		j.e.counted()
	})
}

// submit hands the sequences to the rank.
func (j *job) submit() {
	j.mu.Lock()
	if j.submitted || j.closed {
		j.mu.Unlock()
		return
	}
	j.submitted = true
	j.mu.Unlock()
	if j.e.cfg.ZeroCost {
		j.rank.zeroRunning.Add(int64(len(j.seqs)))
	}
	j.rank.submit(j.seqs)
}

// close releases the job: unfinished sequences are aborted and it leaves the registry.
func (j *job) close() {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return
	}
	j.closed = true
	submitted := j.submitted
	j.mu.Unlock()
	if submitted && j.e.cfg.ZeroCost {
		j.rank.zeroRunning.Add(-int64(len(j.seqs)))
	}
	for _, s := range j.seqs {
		if !s.finished.Load() {
			j.abort()
			break
		}
	}
	j.e.jobsMu.Lock()
	for k := range j.rids() {
		if j.e.jobs[k] == j {
			delete(j.e.jobs, k)
		}
	}
	j.e.jobsMu.Unlock()
}

// waitHang holds the job while the Hang fault is on. A held request counts as running in
// the load reports, as a request stuck on a real engine would.
func (j *job) waitHang() error {
	if j.e.faults.Load().Hang {
		j.rank.held.Add(int64(len(j.seqs)))
		defer j.rank.held.Add(-int64(len(j.seqs)))
	}
	for {
		ch := j.e.changed()
		if !j.e.faults.Load().Hang {
			return nil
		}
		select {
		case <-ch:
		case <-j.abortCh:
			return errAborted
		case <-j.e.ctx.Done():
			return errClosed
		}
	}
}

// done reports whether every sequence finished, and the first error.
func (j *job) done() (bool, error) {
	var first error
	for _, s := range j.seqs {
		if !s.finished.Load() {
			return false, nil
		}
		if s.err != nil && first == nil {
			first = s.err
		}
	}
	return true, first
}

func (j *job) produced() int {
	n := 0
	for _, s := range j.seqs {
		n += int(s.produced.Load())
	}
	return n
}

// wait blocks until every sequence finished and returns the first error.
func (j *job) wait() error {
	for {
		if ok, err := j.done(); ok {
			return err
		}
		select {
		case <-j.notify:
		case <-j.e.ctx.Done():
			return errClosed
		}
	}
}

// injectedStatus applies the failure faults to one inference request.
func (e *Engine) injectedStatus(f *Faults) int {
	if f.Status != 0 {
		return f.Status
	}
	if f.FailFirst > 0 && e.failCount.Add(1) <= int64(f.FailFirst) {
		return f.FailStatus
	}
	if f.FailRate > 0 {
		e.rngMu.Lock()
		x := e.rng.Float64()
		e.rngMu.Unlock()
		if x < f.FailRate {
			return f.FailStatus
		}
	}
	return 0
}

// awaitsKV reports whether the job's prompts arrive as KV from a prefill engine: a decode
// engine's request with bootstrap fields. A decode engine that can prefill serves a request
// without them like a plain engine.
func (j *job) awaitsKV() bool { return j.e.cfg.Role == RoleDecode && j.req.boot != nil }

// checkRole applies the PD rules: both roles need bootstrap fields for every prompt, and n
// must be 1.
func (e *Engine) checkRole(req *inferRequest) error {
	if e.cfg.Role == RolePlain {
		return nil
	}
	if req.boot == nil && !(e.cfg.Role == RoleDecode && e.cfg.DecodeCanPrefill) {
		return badf("bootstrap_host and bootstrap_room are required on a %s engine (disaggregation mode)", e.cfg.Role)
	}
	if req.n != 1 {
		return badf("n must be 1 on a %s engine", e.cfg.Role)
	}
	return nil
}

// serveInference runs one inference request.
func (e *Engine) serveInference(ctx *fasthttp.RequestCtx, api apiKind) {
	if !e.method(ctx, "POST") {
		return
	}
	f := e.faults.Load()
	if status := e.injectedStatus(f); status != 0 {
		e.writeError(ctx, status, "injected failure (mock engine fault)")
		return
	}
	if f.Latency > 0 && !e.sleep(e.ctx, f.Latency) {
		e.writeError(ctx, fasthttp.StatusServiceUnavailable, "the engine is shutting down")
		return
	}
	req, err := e.parseRequest(api, ctx.PostBody())
	if err == nil && e.unknownModel(req) {
		e.writeError(ctx, fasthttp.StatusNotFound, "The model `"+req.model+"` does not exist.")
		return
	}
	if err == nil {
		err = e.checkRole(req)
	}
	if err != nil {
		e.writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	j := e.newJob(req)
	stopWatch := e.watchCaller(ctx, j)
	if j.awaitsKV() {
		if err := j.awaitPrefills(); err != nil {
			stopWatch()
			j.close()
			switch {
			case errors.Is(err, errClosed):
				e.writeError(ctx, fasthttp.StatusServiceUnavailable, "the engine is shutting down")
			default:
				e.writeError(ctx, fasthttp.StatusInternalServerError, err.Error())
			}
			return
		}
	}
	if req.stream {
		ctx.SetContentType("text/event-stream")
		ctx.Response.Header.Set("Cache-Control", "no-cache")
		ctx.Response.ImmediateHeaderFlush = true
		st := newSSEStream(j)
		st.stopWatch = stopWatch
		ctx.SetBodyStream(st, -1)
		return
	}
	defer j.close()
	defer stopWatch()
	if err := j.waitHang(); err != nil {
		e.failBlocking(ctx, err)
		return
	}
	j.submit()
	for {
		ok, err := j.done()
		if j.faults.Drop && j.produced() > j.faults.DropAfterTokens {
			j.abort()
			dropConnection(ctx)
			return
		}
		if ok {
			if err != nil && !errors.Is(err, errAborted) {
				e.failBlocking(ctx, err)
				return
			}
			break
		}
		select {
		case <-j.notify:
		case <-e.ctx.Done():
			e.failBlocking(ctx, errClosed)
			return
		}
	}
	out := make([]byte, 0, 512)
	out = j.appendResponse(out)
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("application/json")
	ctx.Response.SetBodyRaw(out)
}

// watchCaller aborts j as soon as its caller hangs up, as vLLM does (its server cancels a
// request whose client disconnected); the returned func ends the watch, and must run
// before the connection is read again. An SGLang engine keeps generating until
// /abort_request names the request (or a stream's next write fails).
func (e *Engine) watchCaller(ctx *fasthttp.RequestCtx, j *job) (stop func()) {
	if e.cfg.Flavor != FlavorVLLM {
		return func() {}
	}
	w, ok := hangup.Start(ctx.Conn(), nil, j.abort)
	if !ok {
		return func() {}
	}
	return sync.OnceFunc(w.Stop)
}

// failBlocking answers a non-streaming request whose sequences failed.
func (e *Engine) failBlocking(ctx *fasthttp.RequestCtx, err error) {
	switch {
	case errors.Is(err, errRestarted):
		dropConnection(ctx) // a crashed engine answers nothing
	case errors.Is(err, errAborted):
		e.writeError(ctx, fasthttp.StatusBadRequest, "the request was aborted")
	default:
		e.writeError(ctx, fasthttp.StatusServiceUnavailable, "the engine is shutting down")
	}
}

// dropConnection closes the client connection without a response.
func dropConnection(ctx *fasthttp.RequestCtx) {
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(net.Conn) {})
}

// awaitPrefills waits for the prefill partner of every prompt, counting the request as
// waiting (in transfer) meanwhile.
func (j *job) awaitPrefills() error {
	j.rank.transfers.Add(1)
	defer j.rank.transfers.Add(-1)
	for i, p := range j.req.prompts {
		info, err := j.e.awaitPrefill(j.req.boot[i], len(p))
		if err != nil {
			return err
		}
		j.items[i] = itemInfo{prefillCached: info.CachedTokens, fromPrefill: true}
	}
	return nil
}

// sseStream is the body of a streaming response: fasthttp reads it on the connection's
// goroutine, and each Read returns the chunks of the tokens produced since the last one.
// A non-EOF error aborts the response and closes the connection.
type sseStream struct {
	j        *job
	buf      []byte
	off      int
	started  bool
	sent     []int  // tokens sent per sequence
	ended    []bool // final chunk sent per sequence
	texts    [][]byte
	ids      [][]uint32
	total    int
	finished bool
	fail     error
	// stopWatch ends the watch of the caller's connection (vLLM flavour).
	stopWatch func()
}

var errDropped = errors.New("connection dropped by fault injection")

var _ io.ReadCloser = (*sseStream)(nil)

func newSSEStream(j *job) *sseStream {
	n := len(j.seqs)
	s := &sseStream{j: j, sent: make([]int, n), ended: make([]bool, n)}
	if j.req.api == apiGenerate {
		s.texts, s.ids = make([][]byte, n), make([][]uint32, n)
	}
	return s
}

func (s *sseStream) Read(p []byte) (int, error) {
	for s.off == len(s.buf) {
		if s.fail != nil {
			return 0, s.fail
		}
		if s.finished {
			return 0, io.EOF
		}
		s.buf, s.off = s.buf[:0], 0
		if err := s.fill(); err != nil {
			s.fail = err
		}
	}
	b := s.buf[s.off:]
	if s.j.e.cfg.EventPerWrite {
		if i := bytes.Index(b, eventEnd); i >= 0 {
			b = b[:i+len(eventEnd)]
		}
	}
	n := copy(p, b)
	s.off += n
	return n, nil
}

// eventEnd ends every SSE event the engine writes.
var eventEnd = []byte("\n\n")

// Close releases the job; fasthttp calls it when the response ends or the client goes.
func (s *sseStream) Close() error {
	if s.stopWatch != nil {
		s.stopWatch()
	}
	s.j.close()
	return nil
}

// fill appends the chunks now available, blocking until there is at least one.
func (s *sseStream) fill() error {
	j := s.j
	e := j.e
	if !s.started {
		s.started = true
		if err := j.waitHang(); err != nil {
			return err
		}
		j.submit()
	}
	for {
		drop := j.faults.Drop
		for i, sq := range j.seqs {
			// finished before produced: the rank stores a sequence's last count before it
			// marks it finished, so a finished sequence read in this order has all its
			// tokens counted. Read the other way, a sequence that ran to its end between
			// the two loads would end its stream without the tokens it produced meanwhile.
			fin := sq.finished.Load()
			p := int(sq.produced.Load())
			if fin && (errors.Is(sq.err, errRestarted) || errors.Is(sq.err, errClosed)) {
				return sq.err // a crashed engine cuts the stream
			}
			for s.sent[i] < p {
				if drop && s.total >= j.faults.DropAfterTokens {
					j.abort()
					if len(s.buf) > 0 {
						s.fail = errDropped // deliver what is buffered first
						return nil
					}
					return errDropped
				}
				finish := ""
				if fin && s.sent[i] == p-1 && j.req.api == apiGenerate {
					// /generate carries the finish reason on the last token's chunk.
					finish = finishReason(sq)
					s.ended[i] = true
				}
				s.buf = j.appendChunk(s.buf, s, i, s.sent[i], finish)
				s.sent[i]++
				s.total++
			}
			if fin && !s.ended[i] {
				s.ended[i] = true
				s.buf = j.appendChunk(s.buf, s, i, -1, finishReason(sq))
			}
		}
		if s.allEnded() {
			if j.req.includeUsage && j.req.api != apiGenerate {
				s.buf = j.appendUsageChunk(s.buf)
			}
			s.buf = append(s.buf, "data: [DONE]\n\n"...)
			s.finished = true
			return nil
		}
		if len(s.buf) > 0 {
			return nil
		}
		select {
		case <-j.notify:
		case <-e.ctx.Done():
			return errClosed
		}
	}
}

func (s *sseStream) allEnded() bool {
	for _, x := range s.ended {
		if !x {
			return false
		}
	}
	return true
}

// finishReason is the OpenAI finish reason of a finished sequence.
func finishReason(s *seq) string {
	switch {
	case errors.Is(s.err, errAborted):
		return "abort"
	case s.job.req.maxTokens < 0 && s.job.req.defaultMax == 0:
		return "stop"
	}
	return "length"
}

// loadGauge encodes a rank report as a load-gauge payload.
func loadGauge(rep load.RankReport, extended bool) []byte {
	return load.AppendGauge(make([]byte, 0, 64), rep, extended)
}

// timing returns the sequence's simulated latencies in seconds.
func (s *seq) timing() (queue, ttft, e2e float64) {
	arrived := s.job.created.UnixNano()
	sec := func(ns int64) float64 {
		if ns == 0 || arrived == 0 {
			return 0
		}
		return float64(ns-arrived) / 1e9
	}
	return sec(s.admitted.Load()), sec(s.firstAt.Load()), sec(s.doneAt.Load())
}

func itoa(n int) string { return strconv.Itoa(n) }
