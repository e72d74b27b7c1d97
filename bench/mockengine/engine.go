package mockengine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/kv/events"
)

// Engine is one running mock engine. Its methods are safe for concurrent use.
type Engine struct {
	cfg      Config
	log      *slog.Logger
	clock    Clock
	tok      Tokenizer
	words    *wordTable
	workerID string
	url      string
	port     int
	zmqHost  string // the host ZMQ endpoints are advertised with
	started  time.Time

	ln  net.Listener
	srv *fasthttp.Server

	ranks []*rank
	rr    atomic.Uint64

	boot      *bootstrapServer // prefill engines
	rooms     *roomRegistry    // prefill engines
	lora      *loras
	transport *http.Transport // decode engines
	httpc     *http.Client

	faults             atomic.Pointer[Faults]
	failCount          atomic.Int64
	rngMu              sync.Mutex
	rng                *rand.Rand
	unhealthyTriggered atomic.Bool
	stopTriggered      atomic.Bool
	downUntil          atomic.Int64 // unix ns

	sigMu     sync.Mutex
	sig       chan struct{} // closed and replaced when faults change or the engine restarts
	faultStop context.CancelFunc
	closed    bool

	jobsMu sync.Mutex
	jobs   map[string]*job
	// aborts counts the requests aborted (by /abort_request, a vLLM caller hanging up, or a
	// stream whose client left); abortSig is closed and replaced at each.
	aborts   uint64
	abortSig chan struct{}

	ridBase uint64
	ridSeq  atomic.Uint64

	// traceparents are the traceparent headers of the latest inference requests (at most
	// maxTraceparents, oldest first), for tests of trace forwarding.
	tpMu         sync.Mutex
	traceparents []string

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
	stopWatch func() bool
}

// Start starts an engine and returns once every listener is bound. The engine runs until
// Close is called or ctx is done.
func Start(ctx context.Context, cfg Config) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.loadTokenizer(); err != nil {
		return nil, fmt.Errorf("cannot start mock engine: %w", err)
	}
	cfg = cfg.withDefaults()
	e := &Engine{
		cfg:      cfg,
		log:      cfg.Logger,
		clock:    cfg.Clock,
		tok:      cfg.Tokenizer,
		words:    newWordTable(cfg.Tokenizer),
		rng:      rand.New(rand.NewPCG(cfg.Seed, 0x5eed)),
		sig:      make(chan struct{}),
		jobs:     make(map[string]*job),
		abortSig: make(chan struct{}),
		lora:     newLoras(cfg.LoRA),
		ridBase:  splitmix64(cfg.Seed ^ uint64(time.Now().UnixNano())),
	}
	e.started = e.clock.Now()
	e.ctx, e.cancel = context.WithCancel(context.Background())
	f := cfg.Faults
	e.faults.Store(&f)
	if err := e.listen(); err != nil {
		e.cancel()
		e.closeListeners()
		return nil, fmt.Errorf("cannot start mock engine: %w", err)
	}
	e.log = e.log.With(slog.String("worker_id", e.workerID))

	e.srv = &fasthttp.Server{
		Handler:            e.handle,
		Name:               "switchyard-mockengine",
		IdleTimeout:        90 * time.Second,
		MaxRequestBodySize: 64 << 20,
		CloseOnShutdown:    true,
		Logger:             fasthttpLogger{e.log},
		ErrorHandler:       e.handleServerError,
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		if err := e.srv.Serve(e.ln); err != nil && e.ctx.Err() == nil {
			e.log.Error("mock engine HTTP server stopped", slog.Any("err", err))
		}
	}()
	now := e.clock.Now()
	for _, r := range e.ranks {
		// A fresh engine announces an empty cache.
		r.mu.Lock()
		r.pending = append(r.pending, events.Event{Kind: events.EventAllBlocksCleared})
		r.flushEvents(now)
		r.mu.Unlock()
		if !cfg.ZeroCost {
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer e.recoverLoop("scheduler")
				r.run(e.ctx)
			}()
		}
		if r.loadpub != nil {
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer e.recoverLoop("load publisher")
				e.publishLoad(e.ctx, r)
			}()
		}
	}
	e.armFaults(f)
	e.stopWatch = context.AfterFunc(ctx, func() { _ = e.Close() })
	e.log.Info("mock engine started", slog.String("url", e.url), slog.String("role", string(cfg.Role)),
		slog.Int("dp_size", cfg.DPSize), slog.Bool("zero_cost", cfg.ZeroCost))
	return e, nil
}

// listen binds the HTTP listener and every per-rank socket.
func (e *Engine) listen() error {
	cfg := &e.cfg
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
	if err != nil {
		return err
	}
	e.ln = ln
	e.port = ln.Addr().(*net.TCPAddr).Port
	urlHost := cfg.Host
	switch cfg.Host {
	case "0.0.0.0", "::", "":
		urlHost, e.zmqHost = "127.0.0.1", "*"
	default:
		e.zmqHost = cfg.Host
	}
	e.url = "http://" + net.JoinHostPort(urlHost, strconv.Itoa(e.port))
	e.workerID = cfg.WorkerID
	if e.workerID == "" {
		e.workerID = net.JoinHostPort(urlHost, strconv.Itoa(e.port))
	}
	e.ranks = make([]*rank, cfg.DPSize)
	for i := range e.ranks {
		e.ranks[i] = newRank(e, i)
	}
	zlog := e.log.With(slog.String("component", "zmtp"))
	if !cfg.KVEvents.Disabled && cfg.KVEvents.Connect != "" {
		for i, r := range e.ranks {
			ep, err := offsetPort(cfg.KVEvents.Connect, i)
			if err != nil {
				return fmt.Errorf("cannot dial KV-event endpoint: %w", err)
			}
			r.kvpub = e.newEventPublisher(dialPub(ep, cfg.KVEvents.HWM), i)
		}
	}
	if !cfg.KVEvents.Disabled && cfg.KVEvents.Connect == "" {
		pubs, err := listenConsecutive(cfg.Host, cfg.KVEvents.PortBase, cfg.DPSize, func(addr string) (*zmtpPub, error) {
			return listenPub(addr, cfg.KVEvents.HWM, zlog)
		})
		if err != nil {
			return fmt.Errorf("cannot bind KV-event publishers: %w", err)
		}
		for i, r := range e.ranks {
			r.kvpub = e.newEventPublisher(pubs[i], i)
		}
	}
	if !cfg.KVEvents.Disabled {
		if cfg.KVEvents.Replay {
			routers, err := listenConsecutive(cfg.Host, cfg.KVEvents.ReplayPortBase, cfg.DPSize, func(addr string) (*zmtpRouter, error) {
				return listenRouter(addr, zlog, func(*routerPeer, [][]byte) {})
			})
			if err != nil {
				return fmt.Errorf("cannot bind KV-event replay sockets: %w", err)
			}
			for i, r := range e.ranks {
				p := r.kvpub
				p.replay = routers[i]
				p.ring = make([]replayEntry, cfg.KVEvents.BufferSteps)
				routers[i].handler = p.serveReplay
			}
		}
	} else {
		for i, r := range e.ranks {
			r.kvpub = e.newEventPublisher(nil, i)
		}
	}
	if !cfg.LoadPublish.Disabled {
		pubs, err := listenConsecutive(cfg.Host, cfg.LoadPublish.PortBase, cfg.DPSize, func(addr string) (*zmtpPub, error) {
			return listenPub(addr, 16, zlog)
		})
		if err != nil {
			return fmt.Errorf("cannot bind load publishers: %w", err)
		}
		for i, r := range e.ranks {
			r.loadpub = pubs[i]
		}
	}
	switch cfg.Role {
	case RolePrefill:
		e.rooms = newRoomRegistry()
		b, err := e.startBootstrap(net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.BootstrapPort)))
		if err != nil {
			return fmt.Errorf("cannot start bootstrap server: %w", err)
		}
		e.boot = b
	case RoleDecode:
		e.transport = &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}
		e.httpc = &http.Client{Transport: e.transport}
	}
	return nil
}

func (e *Engine) newEventPublisher(sock *zmtpPub, rank int) *eventPublisher {
	p := &eventPublisher{
		sock: sock, topic: []byte(e.cfg.KVEvents.Topic), shape: e.cfg.KVEvents.Shape, enc: events.NewEncoder(),
		stopped: e.eventsStopped, log: e.log, vllm: e.cfg.KVEvents.Format == KVFormatVLLM,
	}
	if p.vllm {
		p.enc.TrailingNils = 2 // lora_name and the extra keys of vLLM's BlockStored
		if e.cfg.KVEvents.Topic == "" {
			host, _, _ := net.SplitHostPort(strings.TrimPrefix(e.url, "http://"))
			p.topic = []byte("kv@" + host + ":" + strconv.Itoa(e.port+rank) + "@" + e.cfg.Model)
		}
	}
	return p
}

// offsetPort is endpoint "tcp://host:port" with port+n, as vLLM offsets a DP rank's.
func offsetPort(endpoint string, n int) (string, error) {
	hp := strings.TrimPrefix(endpoint, "tcp://")
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return "", err
	}
	p, err := strconv.Atoi(port)
	if err != nil || p+n > 65535 {
		return "", fmt.Errorf("bad port in %q", endpoint)
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+n)), nil
}

// listenConsecutive binds n sockets on base+i, or on OS-chosen consecutive ports when base
// is 0 (retrying when a neighbour port is taken).
func listenConsecutive[T interface {
	Close() error
	Port() int
}](host string, base, n int, listen func(addr string) (T, error)) ([]T, error) {
	addr := func(p int) string { return net.JoinHostPort(host, strconv.Itoa(p)) }
	closeAll := func(socks []T) {
		for _, s := range socks {
			_ = s.Close()
		}
	}
	if base != 0 {
		out := make([]T, 0, n)
		for i := range n {
			s, err := listen(addr(base + i))
			if err != nil {
				closeAll(out)
				return nil, err
			}
			out = append(out, s)
		}
		return out, nil
	}
	var lastErr error
	for range 20 {
		first, err := listen(addr(0))
		if err != nil {
			return nil, err
		}
		out := []T{first}
		for i := 1; i < n; i++ {
			s, err := listen(addr(first.Port() + i))
			if err != nil {
				lastErr = err
				break
			}
			out = append(out, s)
		}
		if len(out) == n {
			return out, nil
		}
		closeAll(out)
	}
	return nil, fmt.Errorf("cannot find %d consecutive free ports: %w", n, lastErr)
}

// StartMany starts n engines from cfg. When cfg's ports are set, engine i uses Port+i,
// BootstrapPort+i and the ZMQ port bases plus i×DPSize; ports left at 0 are chosen by the
// OS. A set WorkerID gets the suffix "-i". On error every engine started is closed.
func StartMany(ctx context.Context, cfg Config, n int) ([]*Engine, error) {
	if n < 1 {
		return nil, fmt.Errorf("cannot start %d mock engines: %w: count must be at least 1", n, ErrInvalidConfig)
	}
	if err := cfg.loadTokenizer(); err != nil { // once for every engine
		return nil, fmt.Errorf("cannot start %d mock engines: %w", n, err)
	}
	dp := max(cfg.DPSize, 1)
	offset := func(base, i, stride int) int {
		if base == 0 {
			return 0
		}
		return base + i*stride
	}
	engines := make([]*Engine, 0, n)
	for i := range n {
		c := cfg
		c.Port = offset(cfg.Port, i, 1)
		c.BootstrapPort = offset(cfg.BootstrapPort, i, 1)
		c.KVEvents.PortBase = offset(cfg.KVEvents.PortBase, i, dp)
		c.KVEvents.ReplayPortBase = offset(cfg.KVEvents.ReplayPortBase, i, dp)
		c.LoadPublish.PortBase = offset(cfg.LoadPublish.PortBase, i, dp)
		if cfg.WorkerID != "" && n > 1 {
			c.WorkerID = cfg.WorkerID + "-" + strconv.Itoa(i)
		}
		c.Seed = max(cfg.Seed, 1) + uint64(i)
		e, err := Start(ctx, c)
		if err != nil {
			for _, s := range engines {
				_ = s.Close()
			}
			return nil, fmt.Errorf("cannot start engine %d of %d: %w", i+1, n, err)
		}
		engines = append(engines, e)
	}
	return engines, nil
}

// URL returns the engine's base URL, e.g. "http://127.0.0.1:30000".
func (e *Engine) URL() string { return e.url }

// WorkerID returns the value of the engine's X-Worker-Id header.
func (e *Engine) WorkerID() string { return e.workerID }

// Port returns the HTTP port.
func (e *Engine) Port() int { return e.port }

// Config returns the engine's configuration with defaults applied.
func (e *Engine) Config() Config {
	c := e.cfg
	costs := *c.Costs
	c.Costs = &costs
	return c
}

// BootstrapPort returns a prefill engine's bootstrap port, or 0.
func (e *Engine) BootstrapPort() int {
	if e.boot == nil {
		return 0
	}
	return e.boot.port
}

// KVEventsEndpoint returns the KV-event publisher of a DP rank ("tcp://host:port"), or "".
func (e *Engine) KVEventsEndpoint(rank int) string {
	if rank < 0 || rank >= len(e.ranks) || e.ranks[rank].kvpub.sock == nil || e.ranks[rank].kvpub.sock.Port() == 0 {
		return "" // none, or a PUB that dials
	}
	return e.zmqEndpoint(e.ranks[rank].kvpub.sock.Port())
}

// ReplayEndpoint returns the KV-event replay socket of a DP rank, or "".
func (e *Engine) ReplayEndpoint(rank int) string {
	if rank < 0 || rank >= len(e.ranks) || e.ranks[rank].kvpub.replay == nil {
		return ""
	}
	return e.zmqEndpoint(e.ranks[rank].kvpub.replay.Port())
}

// LoadEndpoint returns the load-gauge publisher of a DP rank, or "".
func (e *Engine) LoadEndpoint(rank int) string {
	if rank < 0 || rank >= len(e.ranks) || e.ranks[rank].loadpub == nil {
		return ""
	}
	return e.zmqEndpoint(e.ranks[rank].loadpub.Port())
}

func (e *Engine) zmqEndpoint(port int) string {
	host := e.cfg.Host
	if e.zmqHost == "*" {
		host = "127.0.0.1"
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port))
}

// RankPromptTokens returns the prompt tokens each DP rank has admitted since the engine
// started or last restarted.
func (e *Engine) RankPromptTokens() []int64 {
	out := make([]int64, len(e.ranks))
	for i, r := range e.ranks {
		r.mu.Lock()
		out[i] = r.stats.promptTokens
		r.mu.Unlock()
	}
	return out
}

// Faults returns the current fault switches.
func (e *Engine) Faults() Faults { return *e.faults.Load() }

// SetFaults replaces the fault switches. Counting for FailFirst and the delays of
// UnhealthyAfter, StopEventsAfter and RestartEvery start again from now.
func (e *Engine) SetFaults(f Faults) error {
	if f.FailStatus == 0 {
		f.FailStatus = 500
	}
	if err := f.validate(); err != nil {
		return err
	}
	e.faults.Store(&f)
	e.failCount.Store(0)
	e.unhealthyTriggered.Store(false)
	e.stopTriggered.Store(false)
	e.armFaults(f)
	e.log.Info("mock engine faults set", slog.Any("faults", f))
	return nil
}

// armFaults starts the timers of the delayed faults and wakes every waiter.
func (e *Engine) armFaults(f Faults) {
	e.sigMu.Lock()
	defer e.sigMu.Unlock()
	if e.faultStop != nil {
		e.faultStop()
		e.faultStop = nil
	}
	if !e.closed && (f.UnhealthyAfter > 0 || f.StopEventsAfter > 0 || f.RestartEvery > 0) {
		ctx, cancel := context.WithCancel(e.ctx)
		e.faultStop = cancel
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			defer e.recoverLoop("fault timers")
			e.runTimedFaults(ctx, f)
		}()
	}
	e.broadcastLocked()
}

func (e *Engine) runTimedFaults(ctx context.Context, f Faults) {
	timer := func(d time.Duration) Timer {
		if d <= 0 {
			return nil
		}
		return e.clock.NewTimer(d)
	}
	c := func(t Timer) <-chan time.Time {
		if t == nil {
			return nil
		}
		return t.C()
	}
	tu, ts, tr := timer(f.UnhealthyAfter), timer(f.StopEventsAfter), timer(f.RestartEvery)
	defer func() {
		for _, t := range []Timer{tu, ts, tr} {
			if t != nil {
				t.Stop()
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c(tu):
			tu = nil
			e.unhealthyTriggered.Store(true)
			e.log.Info("mock engine turned unhealthy")
		case <-c(ts):
			ts = nil
			e.stopTriggered.Store(true)
			e.log.Info("mock engine stopped publishing events")
		case <-c(tr):
			e.Restart()
			tr = timer(f.RestartEvery)
		}
	}
}

// Restart simulates an engine restart: every queued and running request fails (streams
// are cut), every peer connection of the KV-event PUB, replay ROUTER and load-gauge PUB
// sockets is closed (the sockets keep listening, so subscribers reconnect as they would to
// a restarted process), the cache is emptied, the counters and event sequence numbers start
// again from zero, and AllBlocksCleared is published as sequence 0. The connections are
// dropped before the new run publishes anything, so no connection carries batches of both
// runs; what is published before a subscriber is back is only in the replay buffer. With
// Faults.RestartDowntime the engine answers 503 for that long.
func (e *Engine) Restart() {
	now := e.clock.Now()
	if d := e.faults.Load().RestartDowntime; d > 0 {
		e.downUntil.Store(now.Add(d).UnixNano())
	}
	for _, r := range e.ranks {
		r.restart(now)
	}
	if e.rooms != nil {
		e.rooms.reset()
	}
	e.sigMu.Lock()
	e.broadcastLocked()
	e.sigMu.Unlock()
	e.log.Info("mock engine restarted")
}

// FlushCache empties every rank's cache as POST /flush_cache does; it reports false when
// requests are queued or running.
func (e *Engine) FlushCache() bool {
	now := e.clock.Now()
	for _, r := range e.ranks {
		r.mu.Lock()
		busy := len(r.waiting)+len(r.running) > 0
		r.mu.Unlock()
		if busy {
			return false
		}
	}
	ok := true
	for _, r := range e.ranks {
		ok = r.flush(now) && ok
	}
	return ok
}

func (e *Engine) broadcastLocked() {
	close(e.sig)
	e.sig = make(chan struct{})
}

// Running is the requests running on every rank, as the load reports count them.
func (e *Engine) Running() int64 {
	reps, _ := e.reports()
	var n int64
	for _, r := range reps {
		n += r.Running
	}
	return n
}

// Waiting is the requests waiting on every rank (queued, or a decode waiting for its
// prefill), as the load reports count them.
func (e *Engine) Waiting() int64 {
	reps, _ := e.reports()
	var n int64
	for _, r := range reps {
		n += r.Waiting
	}
	return n
}

// Aborts is how many requests the engine has aborted: named by /abort_request, or stopped
// because their caller left.
func (e *Engine) Aborts() uint64 {
	e.jobsMu.Lock()
	defer e.jobsMu.Unlock()
	return e.aborts
}

// WaitAborts waits until the engine has aborted at least n requests, or ctx is done. An
// abort is counted once it is in effect: the request takes part in no step after the one in
// progress.
func (e *Engine) WaitAborts(ctx context.Context, n uint64) error {
	for {
		e.jobsMu.Lock()
		got, sig := e.aborts, e.abortSig
		e.jobsMu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-sig:
		case <-ctx.Done():
			return fmt.Errorf("mock engine %s: %d requests aborted, want %d: %w", e.workerID, got, n, ctx.Err())
		}
	}
}

// counted records one aborted request.
func (e *Engine) counted() {
	e.jobsMu.Lock()
	e.aborts++
	close(e.abortSig)
	e.abortSig = make(chan struct{})
	e.jobsMu.Unlock()
}

// changed returns a channel closed at the next fault change or restart.
func (e *Engine) changed() <-chan struct{} {
	e.sigMu.Lock()
	defer e.sigMu.Unlock()
	return e.sig
}

func (e *Engine) eventsStopped() bool {
	return e.faults.Load().StopEvents || e.stopTriggered.Load()
}

func (e *Engine) down() bool {
	u := e.downUntil.Load()
	return u != 0 && e.clock.Now().UnixNano() < u
}

func (e *Engine) unhealthy() bool {
	return e.faults.Load().Unhealthy || e.unhealthyTriggered.Load() || e.down()
}

// goTracked runs f on a goroutine Close waits for; it reports false once closing.
func (e *Engine) goTracked(f func()) bool {
	e.sigMu.Lock()
	defer e.sigMu.Unlock()
	if e.closed {
		return false
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		f()
	}()
	return true
}

// sleep waits d on the engine's clock; it reports false when the engine is closing.
func (e *Engine) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := e.clock.NewTimer(d)
	select {
	case <-t.C():
		return true
	case <-ctx.Done():
		t.Stop()
		return false
	}
}

func (e *Engine) recoverLoop(what string) {
	if v := recover(); v != nil {
		e.log.Error("mock engine goroutine panicked", slog.String("goroutine", what), slog.Any("panic", v))
	}
}

// publishLoad publishes a rank's load gauge every interval until ctx is done.
func (e *Engine) publishLoad(ctx context.Context, r *rank) {
	topic := []byte("load")
	var seq uint64
	epoch := uint64(0)
	for {
		if !e.eventsStopped() {
			rep, _ := r.report(e.clock.Now())
			r.mu.Lock()
			if r.epoch != epoch {
				epoch, seq = r.epoch, 0 // a restarted engine counts from zero again
			}
			r.mu.Unlock()
			r.loadpub.Send(topic, seqFrame(seq), loadGauge(rep, !e.cfg.LoadPublish.Basic))
			seq++
		}
		if !e.sleep(ctx, e.cfg.LoadPublish.Interval) {
			return
		}
	}
}

// Close stops the engine: every request in flight fails, every goroutine it started exits
// and every socket is closed. It is idempotent.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		if e.stopWatch != nil {
			e.stopWatch()
		}
		e.sigMu.Lock()
		e.closed = true
		if e.faultStop != nil {
			e.faultStop()
		}
		e.sigMu.Unlock()
		e.cancel()
		var errs []error
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.srv.ShutdownWithContext(ctx); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
		// Shutdown does nothing when Serve has not registered the listener yet (a Close
		// right after Start); closing it ourselves makes Serve return in every case.
		if err := e.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
		errs = append(errs, e.closeListeners())
		e.wg.Wait()
		e.closeErr = errors.Join(errs...)
		if e.closeErr != nil {
			e.closeErr = fmt.Errorf("cannot close mock engine: %w", e.closeErr)
		}
		e.log.Info("mock engine closed")
	})
	return e.closeErr
}

// closeListeners closes every socket but the HTTP server's.
func (e *Engine) closeListeners() error {
	var errs []error
	for _, r := range e.ranks {
		if r == nil {
			continue
		}
		if r.kvpub != nil && r.kvpub.sock != nil {
			errs = append(errs, r.kvpub.sock.Close())
		}
		if r.kvpub != nil && r.kvpub.replay != nil {
			errs = append(errs, r.kvpub.replay.Close())
		}
		if r.loadpub != nil {
			errs = append(errs, r.loadpub.Close())
		}
	}
	if e.boot != nil {
		errs = append(errs, e.boot.close())
	}
	if e.transport != nil {
		e.transport.CloseIdleConnections()
	}
	if e.srv == nil && e.ln != nil {
		errs = append(errs, e.ln.Close())
	}
	for i, err := range errs {
		if errors.Is(err, net.ErrClosed) {
			errs[i] = nil
		}
	}
	return errors.Join(errs...)
}

// fasthttpLogger adapts slog to fasthttp's logger.
type fasthttpLogger struct{ log *slog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.log.Warn("fasthttp", slog.String("msg", fmt.Sprintf(format, args...)))
}
