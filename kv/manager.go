package kv

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Manager defaults.
const (
	DefaultBlockSize     = 16
	DefaultMinBackoff    = 500 * time.Millisecond
	DefaultMaxBackoff    = 30 * time.Second
	DefaultDialTimeout   = 2 * time.Second
	DefaultReplayTimeout = 2 * time.Second
)

// maxBoundRecvErrors is how many receive errors in a row make the bound SUB socket reopen.
const maxBoundRecvErrors = 64

// ManagerConfig configures a Manager.
type ManagerConfig struct {
	// Index receives the events. Required.
	Index *Index
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
}

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
	// Rekey forces keying blocks by router hashes recomputed from token IDs. Default: the
	// engine's hashes are used once a first block proves them to be the router's, and
	// re-keying starts at the first mismatch.
	Rekey bool
}

// Manager subscribes to the KV events of a changing set of workers in both topologies of
// INTEROP and applies them to an Index. Methods are safe for concurrent use.
type Manager struct {
	cfg ManagerConfig
	x   *Index
	log *slog.Logger

	mu      sync.Mutex
	workers map[string]*workerSub
	ctx     context.Context // set by Run; nil before it, cancelled after
	stopped bool
	wg      sync.WaitGroup
	routes  atomic.Pointer[map[string]string] // bound SUB: topic key → worker ID

	boundAddr atomic.Pointer[string]
	bound     chan struct{} // closed once the bound SUB listens
	boundOnce sync.Once
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
	m := &Manager{cfg: cfg, x: cfg.Index, log: cfg.Logger, workers: map[string]*workerSub{}, bound: make(chan struct{})}
	m.routes.Store(&map[string]string{})
	return m, nil
}

// Index returns the index the manager feeds.
func (m *Manager) Index() *Index { return m.x }

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
// once when running, else when Run starts). Adding a known ID replaces its subscriptions;
// its entries are kept when model, DP size and block size are unchanged.
func (m *Manager) AddWorker(spec WorkerSpec) error {
	if spec.ID == "" || spec.Model == "" {
		return errors.New("cannot add KV worker: ID and model are required")
	}
	spec.DPSize = max(spec.DPSize, 1)
	bs := spec.BlockSize
	if bs <= 0 {
		bs = m.cfg.DefaultBlockSize
		if info, ok := m.currentBlockSize(spec.ID); ok {
			bs = info
		}
	}
	if _, err := m.x.SetWorker(spec.ID, spec.Model, spec.DPSize, bs); err != nil {
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

func (m *Manager) currentBlockSize(worker string) (int, bool) {
	id, ok := m.x.owners.Lookup(worker, 0)
	if !ok {
		return 0, false
	}
	return m.x.owners.Info(id).BlockSize, true
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
		s := newRankSub(m, ws.spec.ID, p, ws.spec.Rekey)
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
		return spec.Publishers, true
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
	backoff := m.cfg.MinBackoff
	var lastErr string
	for {
		setState("discovering")
		d, err := m.cfg.Discover.DiscoverKV(ctx, spec.URL)
		if err == nil {
			if d.DPSize > spec.DPSize || d.BlockSize > 0 {
				bs := d.BlockSize
				if bs <= 0 {
					bs, _ = m.currentBlockSize(spec.ID)
				}
				if _, err := m.x.SetWorker(spec.ID, spec.Model, max(d.DPSize, spec.DPSize), bs); err != nil {
					m.log.Error("cannot register discovered KV owners", slog.String("worker", spec.ID), slog.Any("error", err))
					return nil, false
				}
			}
			if spec.Topic != "" {
				for i := range d.Publishers {
					d.Publishers[i].Topic = spec.Topic
				}
			}
			setState("discovered")
			return d.Publishers, true
		}
		if errors.Is(err, ErrNoKVEvents) {
			setState("no publisher")
			m.log.Info("worker advertises no KV-event publisher; only the bound SUB can feed it", slog.String("worker", spec.ID), slog.Any("error", err))
			return nil, false
		}
		if msg := err.Error(); msg != lastErr {
			lastErr = msg
			m.log.Warn("KV-event discovery failing", slog.String("worker", spec.ID), slog.Any("error", err))
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, false
		case <-t.C:
		}
		backoff = min(2*backoff, m.cfg.MaxBackoff)
	}
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

// publishRoutesLocked rebuilds the bound SUB's topic routes: a worker's ID and its URL's
// host:port both name it.
func (m *Manager) publishRoutesLocked() {
	r := make(map[string]string, 2*len(m.workers))
	for id, ws := range m.workers {
		if hp := hostPortOf(ws.spec.URL); hp != "" {
			r[hp] = id
		}
	}
	for id := range m.workers {
		r[id] = id
	}
	m.routes.Store(&r)
}

// routeTopic maps a bound-SUB topic to a worker: the topic itself as a worker ID, or the
// host:port of "kv@host:port@model". "" when no worker matches.
func (m *Manager) routeTopic(topic string) string {
	routes := *m.routes.Load()
	if id, ok := routes[topic]; ok {
		return id
	}
	parts := strings.Split(topic, "@")
	if len(parts) < 2 {
		return ""
	}
	hp := parts[1]
	if h, p, ok := strings.Cut(hp, ":"); ok && !strings.Contains(p, ":") {
		hp = normalizeHost(h) + ":" + p
	}
	return routes[hp]
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
// done, reopening the socket with backoff when it fails.
func (m *Manager) runBound(ctx context.Context) {
	backoff := m.cfg.MinBackoff
	var lastErr string
	for {
		err := m.boundSession(ctx)
		if ctx.Err() != nil {
			return
		}
		if msg := err.Error(); msg != lastErr {
			lastErr = msg
			m.log.Warn("bound KV-event SUB failing", slog.String("endpoint", m.cfg.BindEndpoint), slog.Any("error", err))
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, m.cfg.MaxBackoff)
	}
}

func (m *Manager) boundSession(ctx context.Context) (err error) {
	defer func() {
		if v := recover(); v != nil {
			m.log.Error("bound KV-event handling panicked", slog.Any("panic", v))
			err = fmt.Errorf("panic: %v", v)
		}
	}()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sock := zmq4.NewSub(sctx, zmq4.WithLogger(slog.NewLogLogger(m.log.Handler(), slog.LevelWarn)))
	defer sock.Close()
	if err := sock.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return fmt.Errorf("cannot subscribe: %w", err)
	}
	if err := sock.Listen(m.cfg.BindEndpoint); err != nil {
		return fmt.Errorf("cannot bind %s: %w", m.cfg.BindEndpoint, err)
	}
	addr := m.cfg.BindEndpoint
	if a := sock.Addr(); a != nil && a.Network() == "tcp" {
		addr = "tcp://" + a.String()
	}
	m.boundAddr.Store(&addr)
	m.boundOnce.Do(func() { close(m.bound) })
	b := &boundState{m: m, streams: map[streamKey]*boundStream{}, appliers: map[string]*applier{}}
	errs := 0
	for {
		msg, err := sock.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// One peer leaving surfaces as an error; only a run of them means the socket broke.
			if errs++; errs >= maxBoundRecvErrors {
				return fmt.Errorf("cannot receive: %w", err)
			}
			continue
		}
		errs = 0
		b.handle(msg.Frames)
	}
}

// boundState is the bound SUB goroutine's per-engine state.
type boundState struct {
	m        *Manager
	streams  map[streamKey]*boundStream
	appliers map[string]*applier // by worker ID
	dec      Decoder
	batch    EventBatch
	lastBad  string
}

func (b *boundState) handle(frames [][]byte) {
	mt := b.m.x.metrics
	if len(frames) != 3 || len(frames[1]) != 8 {
		b.malformed(fmt.Errorf("message of %d frames is not (topic, 8-byte seq, payload)", len(frames)))
		return
	}
	topic := string(frames[0])
	worker := b.m.routeTopic(topic)
	if worker == "" {
		mt.batchesUnknown.Inc()
		return
	}
	ap := b.appliers[worker]
	if ap == nil {
		ap = newApplier(b.m.x, worker, b.m.rekeyOf(worker), b.m.log.With(slog.String("worker", worker)))
		b.appliers[worker] = ap
	}
	seq := binary.BigEndian.Uint64(frames[1])
	if err := b.dec.Decode(frames[2], &b.batch); err != nil {
		b.malformed(err)
		b.m.x.owners.ClearWorker(worker) // a lost batch: nothing says which rank
		mt.clears[clearGap].Inc()
		return
	}
	rank := 0
	if b.batch.HasDPRank {
		rank = b.batch.DPRank
	}
	key := streamKey{topic: topic, rank: rank}
	st := b.streams[key]
	if st == nil {
		st = &boundStream{}
		b.streams[key] = st
	}
	switch st.seq.observe(seq) {
	case seqGap:
		mt.gaps.Inc() // no replay socket is known in this topology
		b.clearRank(worker, rank, clearGap)
	case seqRestart, seqDuplicate:
		b.clearRank(worker, rank, clearRestart)
	}
	st.seq.advance(seq)
	if err := ap.apply(&b.batch, rank); err != nil {
		b.malformed(err)
		return
	}
	mt.batchesOK.Inc()
	if f := b.m.cfg.OnApplied; f != nil {
		f(worker, rank, seq)
	}
}

func (b *boundState) clearRank(worker string, rank int, reason clearReason) {
	if id, ok := b.m.x.owners.Lookup(worker, rank); ok {
		b.m.x.clearOwner(id, reason)
	}
}

func (b *boundState) malformed(err error) {
	b.m.x.metrics.batchesMalformed.Inc()
	if msg := err.Error(); msg != b.lastBad {
		b.lastBad = msg
		b.m.log.Warn("malformed KV-event message on the bound SUB", slog.Any("error", err))
	}
}

func (m *Manager) rekeyOf(worker string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ws := m.workers[worker]; ws != nil {
		return ws.spec.Rekey
	}
	return false
}
