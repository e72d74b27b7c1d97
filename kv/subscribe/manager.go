package subscribe

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"switchyard/kv"
	"switchyard/kv/events"
	"switchyard/kv/index"
	"switchyard/load"
	"switchyard/load/zmtp"
)

// Manager defaults.
const (
	DefaultBlockSize     = 16
	DefaultMinBackoff    = 500 * time.Millisecond
	DefaultMaxBackoff    = 30 * time.Second
	DefaultDialTimeout   = 2 * time.Second
	DefaultReplayTimeout = 2 * time.Second
)

// maxDPRanks bounds the DP ranks a worker's events may name: a batch of a rank past the
// worker's known ones registers the ranks up to it (vLLM engines whose DP size the router
// was not told), up to this many.
const maxDPRanks = 256

// ManagerConfig configures a Manager.
type ManagerConfig struct {
	// Index receives the events. Required.
	Index *index.Index
	// BindEndpoint, when set, is a SUB endpoint the manager binds for engines that dial the
	// router (vLLM-style publishers), identified by topic. Default: none.
	BindEndpoint string
	// DefaultBlockSize is a worker's block size until it advertises or publishes one.
	// Default DefaultBlockSize (16).
	DefaultBlockSize int
	// MinBackoff and MaxBackoff bound the doubling wait between reconnects and discovery
	// retries. Defaults DefaultMinBackoff (500 ms) and DefaultMaxBackoff (30 s).
	MinBackoff, MaxBackoff time.Duration
	// DialTimeout bounds one TCP connect. Default DefaultDialTimeout (2 s).
	DialTimeout time.Duration
	// ReplayTimeout bounds one replay. Default DefaultReplayTimeout (2 s).
	ReplayTimeout time.Duration
	// Discover finds the publishers of a worker added with neither Publishers nor KVEvents
	// (retried with backoff while it fails). Default: none; such a worker is fed only by the
	// bound SUB until AddWorker names its publishers (the router's worker lifecycle does
	// once it has introspected the engine).
	Discover Discoverer
	// Logger receives connection and malformed-input logs (on change). Default: discard.
	Logger *slog.Logger
	// OnApplied, when set, is called on the subscription's goroutine after each batch is
	// applied (live or replayed) with its worker, DP rank and sequence number. For tests
	// and tracing; it must not block.
	OnApplied func(worker string, rank int, seq uint64)
	// Limits bound what a publisher may send: a peer past them is disconnected and counted
	// (switchyard_zmq_peer_drops_total{component="kv_events"}). Default: zmtp's (16 MiB a
	// message, 64 frames).
	Limits zmtp.Limits
	// MaxBoundPeers bounds the connections of the bound SUB. Default zmtp.DefaultMaxPeers.
	MaxBoundPeers int
	// MalformedLogEvery is the least time between two logs of one publisher's malformed
	// messages. Default load.MalformedLogInterval (10 s).
	MalformedLogEvery time.Duration
	// Now is the clock of those logs. Default time.Now.
	Now func() time.Time
}

// Hash schemes of a worker's block hashes (WorkerSpec.HashScheme).
const (
	// HashSchemeAuto: the engine's hashes are used once a first block without a parent
	// proves them to be the router's; re-keying from token IDs starts at a mismatch.
	// Blocks with a parent seen before that proof are not indexed.
	HashSchemeAuto = "auto"
	// HashSchemeSGLang: the engine hashes as the router does (SGLang); used as they are.
	HashSchemeSGLang = "sglang"
	// HashSchemeRekey: the engine's hashes are not reproducible (vLLM); blocks are keyed
	// by router hashes recomputed from their token IDs.
	HashSchemeRekey = "rekey"
)

// WorkerSpec describes one engine whose KV events the manager follows.
type WorkerSpec struct {
	// ID is the worker ID. Required.
	ID string
	// URL is the engine's base URL: the Discoverer asks it, and the bound SUB maps a topic's
	// host:port to it.
	URL string
	// Model is the served model. Required.
	Model string
	// DPSize is the number of DP ranks; discovery may raise it. Default 1.
	DPSize int
	// BlockSize is the engine's tokens per block; 0 takes the advertised one, else the
	// manager's default. Events carrying a block size override it.
	BlockSize int
	// KVEvents is the configured rank-0 publisher endpoint ("tcp://host:port"; rank r on
	// port+r). Empty: the Publishers, else the Discoverer's.
	KVEvents string
	// Replay is the configured rank-0 replay endpoint. Default: none (or discovered).
	Replay string
	// Topic is the subscription topic. Default "" (all).
	Topic string
	// Publishers, when set, are used as they are (no discovery).
	Publishers []Publisher
	// NoDiscovery skips the Discoverer: the engine only dials the bound SUB.
	NoDiscovery bool
	// Rekey forces keying blocks by router hashes recomputed from token IDs (the same as
	// HashScheme HashSchemeRekey).
	Rekey bool
	// HashScheme is HashSchemeAuto (default, also ""), HashSchemeSGLang or HashSchemeRekey.
	HashScheme string
}

// scheme is the spec's effective hash scheme.
func (spec *WorkerSpec) scheme() string {
	if spec.Rekey {
		return HashSchemeRekey
	}
	if spec.HashScheme == "" {
		return HashSchemeAuto
	}
	return spec.HashScheme
}

// Manager subscribes to the KV events of a changing set of workers in both topologies of
// INTEROP and applies them to an Index. Methods are safe for concurrent use.
type Manager struct {
	cfg ManagerConfig
	x   *index.Index
	log *slog.Logger

	mu      sync.Mutex
	workers map[string]*workerSub
	ctx     context.Context // set by Run; nil before it, cancelled after
	stopped bool
	wg      sync.WaitGroup
	routes  atomic.Pointer[map[string]route] // bound SUB: topic key → worker and rank

	boundAddr atomic.Pointer[string]
	bound     chan struct{} // closed once the bound SUB listens
	boundOnce sync.Once
	// The bound SUB's log of malformed messages of no known worker (under boundState.mu).
	boundLogOnce sync.Once
	boundLog     load.LogThrottle
}

// workerSub is one worker's subscriptions.
type workerSub struct {
	spec   WorkerSpec
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	subs   []*rankSub
	state  atomic.Pointer[string] // discovery state for status
}

// NewManager validates cfg and returns a Manager. Nothing runs until Run.
func NewManager(cfg ManagerConfig) (*Manager, error) {
	if cfg.Index == nil {
		return nil, errors.New("cannot create KV subscription manager: nil index")
	}
	if cfg.BindEndpoint != "" && !strings.HasPrefix(cfg.BindEndpoint, "tcp://") && !strings.HasPrefix(cfg.BindEndpoint, "ipc://") {
		return nil, fmt.Errorf("cannot create KV subscription manager: bind endpoint %q is not tcp:// or ipc://", cfg.BindEndpoint)
	}
	if cfg.DefaultBlockSize <= 0 {
		cfg.DefaultBlockSize = DefaultBlockSize
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = DefaultMinBackoff
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(DefaultMaxBackoff, cfg.MinBackoff)
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.ReplayTimeout <= 0 {
		cfg.ReplayTimeout = DefaultReplayTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m := &Manager{cfg: cfg, x: cfg.Index, log: cfg.Logger, workers: map[string]*workerSub{}, bound: make(chan struct{})}
	m.routes.Store(&map[string]route{})
	return m, nil
}

// backoff is the reconnect and retry backoff of every subscription.
func (m *Manager) backoff() zmtp.Backoff {
	return zmtp.Backoff{Min: m.cfg.MinBackoff, Max: m.cfg.MaxBackoff}
}

// malformedLog is the throttled log of one publisher's malformed messages.
func (m *Manager) malformedLog(log *slog.Logger) load.LogThrottle {
	t := m.throttledLog(log)
	t.Msg = "malformed KV-event messages"
	return t
}

// throttledLog is a log of one publisher's repeating problems, at most one line per
// MalformedLogEvery; its message is the caller's.
func (m *Manager) throttledLog(log *slog.Logger) load.LogThrottle {
	return load.LogThrottle{Logger: log, Every: m.cfg.MalformedLogEvery, Now: m.cfg.Now}
}

// Index returns the index the manager feeds.
func (m *Manager) Index() *index.Index { return m.x }

// BoundAddr returns the bound SUB's endpoint ("tcp://host:port") once bound ("" before, or
// without one).
func (m *Manager) BoundAddr() string {
	if p := m.boundAddr.Load(); p != nil {
		return *p
	}
	return ""
}

// BoundReady is closed once the bound SUB listens (never without a bind endpoint).
func (m *Manager) BoundReady() <-chan struct{} { return m.bound }

// AddWorker registers the worker's owners in the index and starts following its events (at
// once when running, else when Run starts). Adding a known ID replaces its subscriptions
// (adding it unchanged keeps them running); its entries are kept when model, DP size and
// block size are unchanged.
func (m *Manager) AddWorker(spec WorkerSpec) error {
	if spec.ID == "" || spec.Model == "" {
		return errors.New("cannot add KV worker: ID and model are required")
	}
	switch spec.scheme() {
	case HashSchemeAuto, HashSchemeSGLang, HashSchemeRekey:
	default:
		return fmt.Errorf("cannot add KV worker %s: unknown hash scheme %q (auto, sglang or rekey)", spec.ID, spec.HashScheme)
	}
	spec.DPSize = max(spec.DPSize, 1)
	if spec.BlockSize <= 0 {
		spec.BlockSize = m.cfg.DefaultBlockSize
		if bs, ok := m.currentBlockSize(spec.ID); ok {
			spec.BlockSize = bs
		}
	}
	if m.running(spec) {
		return nil // unchanged: renewing would reconnect and could miss events meanwhile
	}
	if _, err := m.x.SetWorker(spec.ID, spec.Model, spec.DPSize, spec.BlockSize); err != nil {
		return fmt.Errorf("cannot add KV worker %s: %w", spec.ID, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return fmt.Errorf("cannot add KV worker %s: manager stopped", spec.ID)
	}
	if old := m.workers[spec.ID]; old != nil {
		m.stopLocked(old)
	}
	ws := &workerSub{spec: spec}
	m.workers[spec.ID] = ws
	m.publishRoutesLocked()
	if m.ctx != nil {
		m.startLocked(ws)
	}
	return nil
}

// running reports whether spec is already followed as it is.
func (m *Manager) running(spec WorkerSpec) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.workers[spec.ID]
	return old != nil && !m.stopped && reflect.DeepEqual(old.spec, spec)
}

func (m *Manager) currentBlockSize(worker string) (int, bool) {
	id, ok := m.x.Owners().Lookup(worker, 0)
	if !ok {
		return 0, false
	}
	return m.x.Owners().Info(id).BlockSize, true
}

// RemoveWorker stops following worker and removes its entries from the index. It reports
// whether the worker was known.
func (m *Manager) RemoveWorker(id string) bool {
	m.mu.Lock()
	ws := m.workers[id]
	if ws != nil {
		delete(m.workers, id)
		m.publishRoutesLocked()
		m.stopLocked(ws)
	}
	m.mu.Unlock()
	if ws == nil {
		return false
	}
	if ws.done != nil {
		<-ws.done
	}
	m.x.RemoveWorker(id)
	return true
}

// stopLocked cancels ws; its goroutines end promptly (sockets close on cancel).
func (m *Manager) stopLocked(ws *workerSub) {
	if ws.cancel != nil {
		ws.cancel()
	}
}

func (m *Manager) startLocked(ws *workerSub) {
	ctx, cancel := context.WithCancel(m.ctx)
	ws.cancel = cancel
	ws.done = make(chan struct{})
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer close(ws.done)
		m.runWorker(ctx, ws)
	}()
}

// Run follows every added worker, and the bound SUB when configured, until ctx is done; it
// then stops every subscription, closes every socket and returns nil. Run may be called once.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	if m.ctx != nil || m.stopped {
		m.mu.Unlock()
		return errors.New("cannot run KV subscription manager twice")
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	m.ctx = runCtx
	for _, ws := range m.workers {
		m.startLocked(ws)
	}
	if m.cfg.BindEndpoint != "" {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.runBound(runCtx)
		}()
	}
	m.mu.Unlock()
	<-runCtx.Done()
	m.mu.Lock()
	m.stopped = true
	m.mu.Unlock()
	m.wg.Wait()
	return nil
}

// runWorker finds the worker's publishers and subscribes to each DP rank until ctx is done.
func (m *Manager) runWorker(ctx context.Context, ws *workerSub) {
	pubs, ok := m.publishers(ctx, ws)
	if !ok {
		return
	}
	var wg sync.WaitGroup
	ws.mu.Lock()
	for _, p := range pubs {
		s := newRankSub(m, ws.spec.ID, p, ws.spec.scheme())
		ws.subs = append(ws.subs, s)
		wg.Go(func() { s.run(ctx) })
	}
	ws.mu.Unlock()
	wg.Wait()
}

// publishers returns the worker's publishers: given, configured, or found by the
// Discoverer (retrying transient failures with backoff). false: there are none to dial (the engine may dial the
// bound SUB instead) or ctx ended.
func (m *Manager) publishers(ctx context.Context, ws *workerSub) ([]Publisher, bool) {
	spec := ws.spec
	setState := func(s string) { ws.state.Store(&s) }
	switch {
	case len(spec.Publishers) > 0:
		setState("configured")
		return withReplay(spec.Publishers, spec.Replay, spec.URL), true
	case spec.KVEvents != "":
		pubs, err := PublishersFor(spec.KVEvents, spec.Replay, spec.Topic, spec.URL, spec.DPSize)
		if err != nil {
			setState("invalid endpoint")
			m.log.Error("cannot subscribe to KV events", slog.String("worker", spec.ID), slog.Any("error", err))
			return nil, false
		}
		setState("configured")
		return pubs, true
	case spec.NoDiscovery || spec.URL == "":
		setState("bound")
		return nil, false
	case m.cfg.Discover == nil:
		setState("awaiting discovery")
		return nil, false
	}
	var pubs []Publisher
	var ok bool
	var lastErr string
	zmtp.Retry(ctx, m.backoff(), func(ctx context.Context, _ int) (bool, error) {
		setState("discovering")
		d, err := m.cfg.Discover.DiscoverKV(ctx, spec.URL)
		switch {
		case errors.Is(err, ErrNoKVEvents):
			setState("no publisher")
			m.log.Info("worker advertises no KV-event publisher; only the bound SUB can feed it", slog.String("worker", spec.ID), slog.Any("error", err))
			return false, nil
		case err != nil:
			return false, err
		}
		if d.DPSize > spec.DPSize || d.BlockSize > 0 {
			bs := d.BlockSize
			if bs <= 0 {
				bs, _ = m.currentBlockSize(spec.ID)
			}
			if _, err := m.x.SetWorker(spec.ID, spec.Model, max(d.DPSize, spec.DPSize), bs); err != nil {
				m.log.Error("cannot register discovered KV owners", slog.String("worker", spec.ID), slog.Any("error", err))
				return false, nil
			}
		}
		d.Publishers = withReplay(d.Publishers, spec.Replay, spec.URL)
		for i := range d.Publishers {
			if spec.Topic != "" {
				d.Publishers[i].Topic = spec.Topic
			}
		}
		setState("discovered")
		pubs, ok = d.Publishers, true
		return true, nil
	}, func(err error) {
		if msg := err.Error(); msg != lastErr {
			lastErr = msg
			m.log.Warn("KV-event discovery failing", slog.String("worker", spec.ID), slog.Any("error", err))
		}
	})
	return pubs, ok
}

// withReplay gives the publishers that have no replay socket the configured one, replay
// (rank-0 endpoint; rank r on port+r). The result is a copy when it changes anything.
func withReplay(pubs []Publisher, replay, workerURL string) []Publisher {
	if replay == "" || len(pubs) == 0 {
		return pubs
	}
	cfg, err := PublishersFor(pubs[0].Endpoint, replay, "", workerURL, len(pubs))
	if err != nil {
		return pubs
	}
	out := slices.Clone(pubs)
	for i := range out {
		if r := out[i].Rank; out[i].Replay == "" && r >= 0 && r < len(cfg) {
			out[i].Replay = cfg[r].Replay
		}
	}
	return out
}

// WorkerStatus is one worker's subscription state.
type WorkerStatus struct {
	ID         string            `json:"id"`
	State      string            `json:"state"`
	Publishers []PublisherStatus `json:"publishers"`
}

// Status returns every worker's subscription state, sorted by ID.
func (m *Manager) Status() []WorkerStatus {
	m.mu.Lock()
	ws := slices.Collect(maps.Values(m.workers))
	m.mu.Unlock()
	out := make([]WorkerStatus, 0, len(ws))
	for _, w := range ws {
		st := WorkerStatus{ID: w.spec.ID, State: "pending", Publishers: []PublisherStatus{}}
		if p := w.state.Load(); p != nil {
			st.State = *p
		}
		w.mu.Lock()
		for _, s := range w.subs {
			st.Publishers = append(st.Publishers, s.status())
		}
		w.mu.Unlock()
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b WorkerStatus) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// route is where a bound-SUB topic leads: a worker, and the DP rank its topic names (-1:
// none; the batch's own rank, else 0).
type route struct {
	worker string
	rank   int
}

// publishRoutesLocked rebuilds the bound SUB's topic routes: a worker's ID names it, its
// URL's host:port names it (the rank the batch names), and host:port+r names its rank r
// for r below its DP size (vLLM: rank r serves on HTTP port P+r and its topic says so).
// An exact host:port of one worker wins over another's rank offset.
func (m *Manager) publishRoutesLocked() {
	r := make(map[string]route, 2*len(m.workers))
	for id, ws := range m.workers {
		h, p, ok := splitHostPort(hostPortOf(ws.spec.URL))
		if !ok {
			continue
		}
		for rank := 1; rank < ws.spec.DPSize && p+rank <= 65535; rank++ {
			r[h+":"+strconv.Itoa(p+rank)] = route{worker: id, rank: rank}
		}
	}
	for id, ws := range m.workers {
		if hp := hostPortOf(ws.spec.URL); hp != "" {
			r[hp] = route{worker: id, rank: -1}
		}
	}
	for id := range m.workers {
		r[id] = route{worker: id, rank: -1}
	}
	m.routes.Store(&r)
}

// splitHostPort splits "host:port" (host without a colon: routes are IPv4 or names).
func splitHostPort(hp string) (string, int, bool) {
	i := strings.LastIndexByte(hp, ':')
	if i < 0 {
		return "", 0, false
	}
	p, err := strconv.Atoi(hp[i+1:])
	return hp[:i], p, err == nil && p > 0 && p <= 65535
}

// routeTopic maps a bound-SUB topic to a worker and rank: the topic itself as a worker ID,
// or the host:port of "kv@host:port@model". ok is false when no worker matches.
func (m *Manager) routeTopic(topic string) (route, bool) {
	routes := *m.routes.Load()
	if rt, ok := routes[topic]; ok {
		return rt, true
	}
	parts := strings.Split(topic, "@")
	if len(parts) < 2 {
		return route{}, false
	}
	hp := parts[1]
	if h, p, ok := strings.Cut(hp, ":"); ok && !strings.Contains(p, ":") {
		hp = normalizeHost(h) + ":" + p
	}
	rt, ok := routes[hp]
	return rt, ok
}

// boundStream is one (topic, DP rank) of the bound SUB.
type boundStream struct {
	seq seqTracker
}

type streamKey struct {
	topic string
	rank  int
}

// runBound binds the SUB socket engines dial and applies what they publish until ctx is
// done, retrying the bind with backoff when it fails. Every peer runs on its own goroutine
// (zmtp.Listener, at most ManagerConfig.MaxBoundPeers); their messages are applied one at
// a time to one boundState, which lives as long as the manager runs, so that the engines'
// sequence trackers and re-key maps stay consistent with the index whatever the peers do.
func (m *Manager) runBound(ctx context.Context) {
	b := &boundState{m: m, streams: map[streamKey]*boundStream{}, appliers: map[string]*boundWorker{}}
	var lastErr string
	zmtp.Retry(ctx, m.backoff(), func(ctx context.Context, _ int) (bool, error) {
		l, err := zmtp.Listen(m.cfg.BindEndpoint, zmtp.ListenerConfig{SocketType: "SUB", Limits: m.cfg.Limits,
			MaxPeers: m.cfg.MaxBoundPeers, Metrics: m.x.Metrics().PeerDrops, Logger: m.log}, func(c *zmtp.Conn) error {
			return b.serve(ctx, c)
		})
		if err != nil {
			return false, fmt.Errorf("cannot bind %s: %w", m.cfg.BindEndpoint, err)
		}
		addr := l.Endpoint()
		m.boundAddr.Store(&addr)
		m.boundOnce.Do(func() { close(m.bound) })
		<-ctx.Done()
		return true, l.Close()
	}, func(err error) {
		if msg := err.Error(); msg != lastErr {
			lastErr = msg
			m.log.Warn("bound KV-event SUB failing", slog.String("endpoint", m.cfg.BindEndpoint), slog.Any("error", err))
		}
	})
}

// boundState is the bound SUB's per-engine state, shared by its peers under mu.
type boundState struct {
	m        *Manager
	mu       sync.Mutex
	streams  map[streamKey]*boundStream
	appliers map[string]*boundWorker // by worker ID
	dec      events.Decoder
	batch    events.EventBatch
}

// boundWorker is one worker's state on the bound SUB.
type boundWorker struct {
	ap     *applier
	badLog load.LogThrottle
}

// serve reads one peer's messages until it fails; a peer past the limits is dropped (and
// counted by the Listener).
func (b *boundState) serve(ctx context.Context, c *zmtp.Conn) (err error) {
	defer func() {
		if v := recover(); v != nil {
			b.m.log.Error("bound KV-event handling panicked", slog.Any("panic", v))
			err = fmt.Errorf("panic: %v", v)
		}
	}()
	if err := c.Subscribe(nil); err != nil {
		return err
	}
	for {
		msg, err := c.ReadMessage()
		if err != nil {
			return err
		}
		if msg.Command != "" {
			continue
		}
		b.mu.Lock()
		b.handle(ctx, msg.Frames)
		b.mu.Unlock()
	}
}

func (b *boundState) worker(id string) *boundWorker {
	w := b.appliers[id]
	if w == nil {
		log := b.m.log.With(slog.String("worker", id))
		w = &boundWorker{ap: newApplier(b.m.x, id, b.m.schemeOf(id), log, b.m.throttledLog(log)), badLog: b.m.malformedLog(log)}
		b.appliers[id] = w
	}
	return w
}

func (b *boundState) handle(ctx context.Context, frames [][]byte) {
	mt := b.m.x.Metrics()
	if len(frames) != 3 || len(frames[1]) != 8 {
		mt.BatchesMalformed.Inc()
		b.m.boundBadLog(fmt.Errorf("message of %d frames is not (topic, 8-byte seq, payload)", len(frames)))
		return
	}
	topic := string(frames[0])
	rt, ok := b.m.routeTopic(topic)
	if !ok {
		mt.BatchesUnknown.Inc()
		return
	}
	w := b.worker(rt.worker)
	seq := binary.BigEndian.Uint64(frames[1])
	if err := b.dec.Decode(frames[2], &b.batch); err != nil {
		mt.BatchesMalformed.Inc()
		w.badLog.Note(err)
		b.m.x.Owners().ClearWorker(rt.worker) // a lost batch: nothing says which rank
		mt.Clears[kv.ClearGap].Inc()
		return
	}
	rank := rt.rank
	if rank < 0 {
		rank = 0
		if b.batch.HasDPRank {
			rank = b.batch.DPRank
		}
	}
	if rank >= maxDPRanks {
		// Slow path: a rank past the bound keeps no sequence state (one per rank would grow
		// without end, and a gap on it would ask the replay socket at port+rank) unless
		// the worker has it (a configured dp_size past the bound).
		if _, ok := b.m.x.Owners().Lookup(rt.worker, rank); !ok {
			mt.BatchesMalformed.Inc()
			w.badLog.Note(fmt.Errorf("cannot apply KV events of %s: unknown DP rank %d", rt.worker, rank))
			return
		}
	}
	key := streamKey{topic: topic, rank: rank}
	st := b.streams[key]
	if st == nil {
		st = &boundStream{}
		b.streams[key] = st
	}
	switch st.seq.observe(seq) {
	case seqGap:
		mt.Gaps.Inc()
		if !b.repair(ctx, rt.worker, w, rank, st, seq) {
			b.clearRank(rt.worker, rank, kv.ClearGap)
		}
		if st.seq.observe(seq) == seqDuplicate {
			return
		}
	case seqRestart:
		b.clearRank(rt.worker, rank, kv.ClearRestart)
	case seqDuplicate:
		return
	}
	st.seq.advance(seq)
	b.apply(w, rank, seq, &b.batch)
}

func (b *boundState) apply(w *boundWorker, rank int, seq uint64, batch *events.EventBatch) {
	if err := w.ap.apply(batch, rank); err != nil {
		b.m.x.Metrics().BatchesMalformed.Inc()
		w.badLog.Note(err)
		return
	}
	b.m.x.Metrics().BatchesOK.Inc()
	if f := b.m.cfg.OnApplied; f != nil {
		f(w.ap.worker, rank, seq)
	}
}

// repair fills a gap of a bound stream from the worker's configured replay socket (rank r
// on its port+r). It reports whether the stream now stands past the gap.
func (b *boundState) repair(ctx context.Context, worker string, w *boundWorker, rank int, st *boundStream, live uint64) bool {
	ep := b.m.replayOf(worker, rank)
	if ep == "" {
		return false
	}
	from := st.seq.last + 1
	var dec events.Decoder
	var batch events.EventBatch
	err := b.m.replay(ctx, ep, from, func(seq uint64, payload []byte) {
		st.seq.advance(seq)
		if err := dec.Decode(payload, &batch); err != nil {
			b.m.x.Metrics().BatchesMalformed.Inc()
			w.badLog.Note(err)
			b.clearRank(worker, rank, kv.ClearGap)
			return
		}
		b.apply(w, rank, seq, &batch)
	})
	if err != nil {
		b.m.x.Metrics().ReplayFailures.Inc()
		b.m.log.Warn("KV-event replay failed", slog.String("worker", worker), slog.String("endpoint", ep), slog.Uint64("from", from), slog.Any("error", err))
		return false
	}
	b.m.x.Metrics().Replays.Inc()
	st.seq.replayed(live)
	return true
}

func (b *boundState) clearRank(worker string, rank int, reason kv.ClearReason) {
	if id, ok := b.m.x.Owners().Lookup(worker, rank); ok {
		b.m.x.ClearOwner(id, reason)
	}
}

// boundBadLog logs a malformed message of no known worker, throttled.
func (m *Manager) boundBadLog(err error) {
	m.boundLogOnce.Do(func() { m.boundLog = m.malformedLog(m.log) })
	m.boundLog.Note(err)
}

// replayOf is the replay endpoint of worker's rank: its configured one (rank 0), port+rank.
func (m *Manager) replayOf(worker string, rank int) string {
	m.mu.Lock()
	ws := m.workers[worker]
	m.mu.Unlock()
	if ws == nil || ws.spec.Replay == "" {
		return ""
	}
	ps, err := PublishersFor(ws.spec.Replay, ws.spec.Replay, "", ws.spec.URL, rank+1)
	if err != nil {
		return ""
	}
	return ps[rank].Replay
}

func (m *Manager) schemeOf(worker string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ws := m.workers[worker]; ws != nil {
		return ws.spec.scheme()
	}
	return HashSchemeAuto
}
