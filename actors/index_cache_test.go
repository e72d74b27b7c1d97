package actors

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"reflect"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/go-zeromq/zmq4"
	"github.com/valyala/fasthttp"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/kv/events"
	"switchyard/kv/hashing"
	"switchyard/kv/index"
	"switchyard/kv/indexer"
	"switchyard/kv/subscribe"
	"switchyard/load"
)

// enginePub is the KV-event side of one engine on real zmq4 sockets on 127.0.0.1: a bound
// PUB and a replay ROUTER answering from the batches it retained.
type enginePub struct {
	t      *testing.T
	pub    zmq4.Socket
	router zmq4.Socket
	done   chan struct{}
	enc    *events.Encoder

	mu   sync.Mutex
	seq  uint64
	ring map[uint64][]byte
}

func startEnginePub(t *testing.T, pubEP, replayEP string) *enginePub {
	t.Helper()
	p := &enginePub{t: t, enc: events.NewEncoder(), ring: map[uint64][]byte{}, done: make(chan struct{})}
	p.pub = zmq4.NewPub(context.Background())
	if err := p.pub.Listen(pubEP); err != nil {
		t.Fatalf("cannot bind %s: %v", pubEP, err)
	}
	p.router = zmq4.NewRouter(context.Background())
	if err := p.router.Listen(replayEP); err != nil {
		t.Fatalf("cannot bind %s: %v", replayEP, err)
	}
	go p.serveReplay()
	t.Cleanup(p.stop)
	return p
}

func (p *enginePub) stop() {
	_ = p.pub.Close()
	_ = p.router.Close()
	<-p.done
}

func (p *enginePub) record(b *events.EventBatch) (uint64, []byte) {
	p.t.Helper()
	payload, err := p.enc.Encode(b, events.ShapeArray)
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	seq := p.seq
	p.seq++
	msg := append([]byte(nil), payload...)
	p.ring[seq] = msg
	return seq, msg
}

func (p *enginePub) send(b *events.EventBatch) uint64 {
	p.t.Helper()
	seq, msg := p.record(b)
	if err := p.pub.Send(zmq4.NewMsgFrom([]byte{}, binary.BigEndian.AppendUint64(nil, seq), msg)); err != nil {
		p.t.Fatal(err)
	}
	return seq
}

func (p *enginePub) lose(b *events.EventBatch) { p.record(b) }

func (p *enginePub) serveReplay() {
	defer close(p.done)
	for {
		msg, err := p.router.Recv()
		if err != nil {
			return
		}
		f := msg.Frames
		if len(f) != 3 || len(f[1]) != 0 || len(f[2]) != 8 {
			continue
		}
		id, start := f[0], binary.BigEndian.Uint64(f[2])
		p.mu.Lock()
		last := p.seq
		p.mu.Unlock()
		for s := start; s < last; s++ {
			p.mu.Lock()
			payload := p.ring[s]
			p.mu.Unlock()
			_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, binary.BigEndian.AppendUint64(nil, s), payload))
		}
		_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, binary.BigEndian.AppendUint64(nil, ^uint64(0)), nil))
	}
}

func stores(tokens []uint32) *events.EventBatch {
	return &events.EventBatch{Events: []events.Event{{Kind: events.EventBlockStored, BlockHashes: hashing.AppendBlockHashes(nil, tokens, 16),
		TokenIDs: tokens, BlockSize: 16, Medium: events.MediumGPU}}}
}

func removes(tokens []uint32) *events.EventBatch {
	return &events.EventBatch{Events: []events.Event{{Kind: events.EventBlockRemoved, BlockHashes: hashing.AppendBlockHashes(nil, tokens, 16)}}}
}

// cacheHarness is the selection path of a router with cache_aware over three engines whose
// KV events arrive over ZMQ: the cache state (index on shard actors, subscriptions), the
// selector (bucket and group actors) and a load table the test controls.
type cacheHarness struct {
	cs       *CacheState
	sel      *Selector
	resolver *engine.BucketResolver
	loads    *load.Table
	agg      *load.Aggregator
	workers  []*engine.Worker
	applied  chan string // "worker/seq"
}

var t0 = time.Unix(1_800_000_000, 0)

func startCacheHarness(t *testing.T, cfg *config.Config) *cacheHarness {
	t.Helper()
	h := &cacheHarness{loads: load.NewTable(), agg: load.NewAggregator(time.Hour), applied: make(chan string, 1024)}
	cs, err := NewCacheState(cfg, CacheOptions{OnApplied: func(w string, _ int, seq uint64) {
		select {
		case h.applied <- fmt.Sprintf("%s/%d", w, seq):
		default:
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	h.cs = cs
	h.workers, err = engine.WorkersFromConfig(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := engine.NewWorkerSet(h.workers)
	if err != nil {
		t.Fatal(err)
	}
	resolvers, err := engine.BuildResolvers(cfg, cs.Deps(engine.Deps{Loads: h.loads, Seed: 7}))
	if err != nil {
		t.Fatal(err)
	}
	h.resolver = resolvers["m"]
	h.sel, err = NewSelector(resolvers, ws, cfg.Actors, SelectorOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range h.workers {
		h.agg.SetWorker(w.ID, 1, w.Counters)
	}
	h.setWaiting(map[string]int64{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cs.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("cache state: %v", err)
		}
		h.sel.Close()
		_ = cs.Close()
	})
	return h
}

// setWaiting publishes fresh native load reports: waiting requests per worker (0 if absent).
func (h *cacheHarness) setWaiting(waiting map[string]int64) {
	for _, w := range h.workers {
		h.agg.Ingest(w.ID, load.RankReport{
			Fields:  load.HasRunning | load.HasWaiting | load.HasUsedTokens | load.HasWaitingUncached | load.HasCapacity | load.HasNative,
			Running: 1, Waiting: waiting[w.ID], MaxTotalTokens: 100_000, At: t0,
		})
	}
	h.loads.Store(h.agg.Snapshot(t0))
}

func (h *cacheHarness) waitApplied(t *testing.T, worker string, seq uint64) {
	t.Helper()
	want := fmt.Sprintf("%s/%d", worker, seq)
	deadline := time.After(10 * time.Second)
	for {
		select {
		case got := <-h.applied:
			if got == want {
				// Ingested: its block operations are queued for the shard actors, which
				// lookups do not wait for. Wait until the shards applied them.
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := h.cs.Index().Sync(ctx); err != nil {
					t.Fatal(err)
				}
				return
			}
		case <-deadline:
			t.Fatalf("batch %s never applied", want)
		}
	}
}

// warmUp publishes empty batches until the subscription delivers one.
func (h *cacheHarness) warmUp(t *testing.T, p *enginePub, worker string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		seq := p.send(&events.EventBatch{Events: []events.Event{}})
		tick := time.After(50 * time.Millisecond)
	wait:
		for {
			select {
			case got := <-h.applied:
				if got == fmt.Sprintf("%s/%d", worker, seq) {
					return
				}
			case <-tick:
				break wait
			case <-deadline:
				t.Fatalf("%s's events never arrived", worker)
			}
		}
	}
}

// pick routes one request for tokens and returns the engine and reason.
func (h *cacheHarness) pick(t *testing.T, tokens []uint32) (string, string) {
	t.Helper()
	req := &engine.BucketRequest{Model: "m", InputTokens: int64(len(tokens)), ExpectedPeak: -1, TokenIDs: tokens, Now: t0}
	if memo := h.cs.Prepare(context.Background(), "m", tokens); memo != nil {
		// A lookup that did not answer (cache_aware.query_timeout passed) routes as a miss:
		// say so, not which engine the miss went to.
		if r, _ := memo.Resolved(h.cs.Source()); r != nil && r.Err != nil {
			t.Fatalf("prefix lookup failed after %v: %v", r.Elapsed, r.Err)
		}
		req.Prefix = memo
	}
	p, err := h.sel.Select(h.resolver, req)
	if err != nil {
		t.Fatal(err)
	}
	return p.Plain.Worker.ID, p.Plain.Reason
}

func tokenRun(base, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(base + i)
	}
	return out
}

// TestCacheAwareSelectionOverZMQ: the end-to-end checks at the selection level
// (bucket and group actors, index shard actors, real ZMQ publishers): a warmed engine wins a
// long shared prefix; past the soft gate the request goes elsewhere; eviction returns it to
// the fallback; a restarted publisher leaves no stale ownership; a gap is repaired by
// replay. Engine A's publisher (with its replay socket) is named once the cache state runs,
// as the worker lifecycle does after introspecting the engine; B and C are configured by
// endpoint.
func TestCacheAwareSelectionOverZMQ(t *testing.T) {
	pubPort, replayPort := freeTCPPort(t), freeTCPPort(t)
	a := startEnginePub(t, "tcp://127.0.0.1:"+strconv.Itoa(pubPort), "tcp://127.0.0.1:"+strconv.Itoa(replayPort))
	b := startEnginePub(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
	c := startEnginePub(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")

	cfg := config.Default()
	cfg.KV.ReconnectBackoff = 10 * time.Millisecond
	cfg.CacheAware.MinLoadChoices = 3 // exact minimum over the three engines
	// A lookup on the shard actors can wait past the default 100 ms on a loaded machine and
	// then counts as a miss; these checks are of the decision, not of the lookup's deadline.
	cfg.CacheAware.QueryTimeout = 10 * time.Second
	// The checks below are the threshold rule's: the minimum hit, the soft gate, the pin.
	cfg.CacheAware.Decision = config.CacheDecisionThreshold
	cfg.Workers = []config.Worker{
		{ID: "A", URL: "http://127.0.0.1:3", Model: "m", Role: config.RolePlain, DPSize: 1},
		{ID: "B", URL: "http://127.0.0.1:1", Model: "m", Role: config.RolePlain, DPSize: 1, KVEvents: "tcp://" + b.pub.Addr().String()},
		{ID: "C", URL: "http://127.0.0.1:2", Model: "m", Role: config.RolePlain, DPSize: 1, KVEvents: "tcp://" + c.pub.Addr().String()},
	}
	policy := config.Policy{Type: config.PolicyCacheAware}
	cfg.Models = map[string]config.Model{"m": {Buckets: []config.Bucket{{ID: "all", Groups: config.Groups{Plain: &config.Group{Policy: &policy}}}}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	h := startCacheHarness(t, cfg)
	if err := h.cs.AddWorker(subscribe.WorkerSpec{ID: "A", URL: "http://127.0.0.1:3", Model: "m", DPSize: 1, BlockSize: 16,
		Publishers: []subscribe.Publisher{{Endpoint: "tcp://127.0.0.1:" + strconv.Itoa(pubPort), Replay: "tcp://127.0.0.1:" + strconv.Itoa(replayPort)}}}); err != nil {
		t.Fatal(err)
	}
	h.warmUp(t, a, "A")
	h.warmUp(t, b, "B")
	h.warmUp(t, c, "C")

	shared := tokenRun(1_000, 4096)
	request := append(append([]uint32(nil), shared...), tokenRun(90_000, 300)...)

	t.Run("a request sharing a long prefix goes to the warmed engine", func(t *testing.T) {
		h.waitApplied(t, "A", a.send(stores(shared)))
		h.waitApplied(t, "B", b.send(stores(shared[:512]))) // below the 1,024-token minimum
		for range 5 {
			if w, reason := h.pick(t, request); w != "A" || reason != engine.ReasonCacheCandidate {
				t.Fatalf("pick %s (%s), want A (cache_candidate)", w, reason)
			}
		}
	})
	t.Run("past the soft gate it goes elsewhere", func(t *testing.T) {
		h.setWaiting(map[string]int64{"A": 9, "B": 2, "C": 0})
		if w, reason := h.pick(t, request); w != "C" || reason != engine.ReasonCacheMissFallback {
			t.Fatalf("pick %s (%s), want C (cache_miss_fallback)", w, reason)
		}
		h.setWaiting(map[string]int64{"A": 9, "B": 9, "C": 9}) // every engine saturated: keep the prefix
		if w, reason := h.pick(t, request); w != "A" || reason != engine.ReasonSaturationPin {
			t.Fatalf("pick %s (%s), want A (saturation_pin)", w, reason)
		}
		h.setWaiting(map[string]int64{})
	})
	t.Run("eviction on the engine moves the request back to the fallback", func(t *testing.T) {
		h.waitApplied(t, "A", a.send(removes(shared[2048:])))
		if w, reason := h.pick(t, request); w != "A" || reason != engine.ReasonCacheCandidate {
			t.Fatalf("half evicted: pick %s (%s), want A (2,048 tokens still held)", w, reason)
		}
		h.waitApplied(t, "A", a.send(removes(shared)))
		if _, reason := h.pick(t, request); reason != engine.ReasonCacheMissFallback {
			t.Fatalf("fully evicted: reason %s, want cache_miss_fallback", reason)
		}
	})
	t.Run("a sequence gap is repaired by replay", func(t *testing.T) {
		a.lose(stores(shared)) // published while the subscriber was not listening
		h.waitApplied(t, "A", a.send(&events.EventBatch{Events: []events.Event{}}))
		if w, reason := h.pick(t, request); w != "A" || reason != engine.ReasonCacheCandidate {
			t.Fatalf("pick %s (%s), want A after the replay", w, reason)
		}
		// The replay may carry the live batch itself, whose apply the wait above can see
		// before the replay is counted; the next batch is handled after the repair is done.
		h.waitApplied(t, "A", a.send(&events.EventBatch{Events: []events.Event{}}))
		c := h.cs.Index().Metrics().Ingest()
		if c.Replays == 0 || c.ClearsGap != 0 {
			t.Fatalf("counts %+v", c)
		}
	})
	t.Run("a killed and restarted publisher leaves no stale ownership", func(t *testing.T) {
		a.stop()
		a2 := startEnginePub(t, "tcp://127.0.0.1:"+strconv.Itoa(pubPort), "tcp://127.0.0.1:"+strconv.Itoa(replayPort))
		h.warmUp(t, a2, "A")
		if _, reason := h.pick(t, request); reason != engine.ReasonCacheMissFallback {
			t.Fatalf("reason %s: A's ownership from before its restart survived", reason)
		}
		h.waitApplied(t, "A", a2.send(stores(shared)))
		if w, reason := h.pick(t, request); w != "A" || reason != engine.ReasonCacheCandidate {
			t.Fatalf("pick %s (%s), want A once it cached the prefix again", w, reason)
		}
	})
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func TestNeedsCache(t *testing.T) {
	cfg := config.Default()
	if NeedsCache(cfg) {
		t.Fatal("no models, no cache")
	}
	ca := config.Policy{Type: config.PolicyCacheAware}
	cfg.Models = map[string]config.Model{
		"plain": {Buckets: []config.Bucket{{ID: "b", Groups: config.Groups{Plain: &config.Group{}}}}},
		"pd": {Policies: config.StagePolicies{Prefill: &ca}, Buckets: []config.Bucket{{ID: "b",
			Groups: config.Groups{PD: &config.PDGroups{Prefill: &config.Group{}, Decode: &config.Group{}}}}}},
	}
	got := cacheModels(cfg)
	if !got["pd"] || got["plain"] || !NeedsCache(cfg) {
		t.Fatalf("cache models %v", got)
	}

	// With affinity.prefix_rebind, a session_aware or sticky group on plain or prefill
	// engines needs the index too; one on decode engines only does not.
	sa, st := config.Policy{Type: config.PolicySessionAware}, config.Policy{Type: config.PolicySticky}
	cfg.Models = map[string]config.Model{
		"session": {Buckets: []config.Bucket{{ID: "b", Groups: config.Groups{Plain: &config.Group{Policy: &sa}}}}},
		"sticky": {Policies: config.StagePolicies{Prefill: &st}, Buckets: []config.Bucket{{ID: "b",
			Groups: config.Groups{PD: &config.PDGroups{Prefill: &config.Group{}, Decode: &config.Group{}}}}}},
		"decode": {Policies: config.StagePolicies{Decode: &sa}, Buckets: []config.Bucket{{ID: "b",
			Groups: config.Groups{PD: &config.PDGroups{Prefill: &config.Group{}, Decode: &config.Group{}}}}}},
	}
	if NeedsCache(cfg) {
		t.Fatalf("affinity groups need no index without prefix_rebind: %v", cacheModels(cfg))
	}
	cfg.Affinity.PrefixRebind = true
	if got := cacheModels(cfg); !got["session"] || !got["sticky"] || got["decode"] {
		t.Fatalf("cache models with prefix_rebind %v", got)
	}
}

// TestTwoRoutersShareAnIndexer: an indexer (indexer.Handler over its own subscriptions)
// serves two routers whose cache_aware policies use the remote source; both send the shared
// prefix to the engine holding it, and each makes one lookup per request.
func TestTwoRoutersShareAnIndexer(t *testing.T) {
	a := startEnginePub(t, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
	idx, err := index.New(index.Config{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer idx.Close()
	applied := make(chan uint64, 1024)
	mgr, err := subscribe.NewManager(subscribe.ManagerConfig{Index: idx, MinBackoff: 10 * time.Millisecond,
		OnApplied: func(_ string, _ int, seq uint64) {
			select {
			case applied <- seq:
			default:
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := mgr.AddWorker(subscribe.WorkerSpec{ID: "A", Model: "m", KVEvents: "tcp://" + a.pub.Addr().String(),
		Replay: "tcp://" + a.router.Addr().String()}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"B", "C"} {
		if err := mgr.AddWorker(subscribe.WorkerSpec{ID: id, Model: "m", NoDiscovery: true}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	mgrDone := make(chan error, 1)
	go func() { mgrDone <- mgr.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-mgrDone; err != nil {
			t.Error(err)
		}
	}()
	h, err := indexer.NewHandler(indexer.Config{Index: idx, Manager: mgr})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttpServer{handler: h}
	srv.start(t, ln)

	waitSeq := func(seq uint64) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case got := <-applied:
				if got == seq {
					return
				}
			case <-deadline:
				t.Fatalf("batch %d never applied", seq)
			}
		}
	}
	for warm := false; !warm; {
		seq := a.send(&events.EventBatch{Events: []events.Event{}})
		select {
		case got := <-applied:
			warm = got == seq
		case <-time.After(50 * time.Millisecond):
		}
	}
	shared := tokenRun(7_000, 4096)
	waitSeq(a.send(stores(shared)))

	policy := config.Policy{Type: config.PolicyCacheAware}
	newRouter := func() *cacheHarness {
		cfg := config.Default()
		cfg.CacheAware.Source = config.CacheSourceRemote
		cfg.CacheAware.RemoteURL = "http://" + ln.Addr().String()
		cfg.CacheAware.QueryTimeout = 5 * time.Second
		cfg.Workers = []config.Worker{
			{ID: "A", URL: "http://127.0.0.1:1", Model: "m", Role: config.RolePlain, DPSize: 1},
			{ID: "B", URL: "http://127.0.0.1:2", Model: "m", Role: config.RolePlain, DPSize: 1},
			{ID: "C", URL: "http://127.0.0.1:3", Model: "m", Role: config.RolePlain, DPSize: 1},
		}
		cfg.Models = map[string]config.Model{"m": {Buckets: []config.Bucket{{ID: "all", Groups: config.Groups{Plain: &config.Group{Policy: &policy}}}}}}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		return startCacheHarness(t, cfg)
	}
	r1, r2 := newRouter(), newRouter()
	request := append(append([]uint32(nil), shared...), tokenRun(99_000, 100)...)
	for i, r := range []*cacheHarness{r1, r2, r1, r2} {
		if w, reason := r.pick(t, request); w != "A" || reason != engine.ReasonCacheCandidate {
			t.Fatalf("router %d: pick %s (%s), want A (cache_candidate)", i%2+1, w, reason)
		}
	}
	if got := idx.Metrics().LocalLookups().OK; got != 4 {
		t.Fatalf("the indexer answered %d lookups, want 4 (one per request)", got)
	}
}

// fasthttpServer serves an indexer.Handler until the test ends.
type fasthttpServer struct {
	handler *indexer.Handler
}

func (s *fasthttpServer) start(t *testing.T, ln net.Listener) {
	t.Helper()
	srv := &fasthttp.Server{Handler: s.handler.Serve}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Shutdown()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
}

// TestWorkerSpecFromDeclaredKVFacts: a worker's declared KV facts reach its subscription,
// and a vllm-flavoured worker is neither introspected nor trusted to hash as the router.
func TestWorkerSpecFromDeclaredKVFacts(t *testing.T) {
	tests := []struct {
		name string
		w    config.Worker
		want subscribe.WorkerSpec
	}{
		{"sglang, declared facts", config.Worker{ID: "a", URL: "http://h:1", Model: "m", DPSize: 2, KVEvents: "tcp://h:5557",
			KVReplay: "tcp://h:5558", KVBlockSize: 32, KVHashScheme: config.KVHashSGLang},
			subscribe.WorkerSpec{ID: "a", URL: "http://h:1", Model: "m", DPSize: 2, KVEvents: "tcp://h:5557", Replay: "tcp://h:5558",
				BlockSize: 32, HashScheme: subscribe.HashSchemeSGLang}},
		{"vllm flavour", config.Worker{ID: "v", URL: "http://h:2", Model: "m", DPSize: 1, Flavor: config.FlavorVLLM},
			subscribe.WorkerSpec{ID: "v", URL: "http://h:2", Model: "m", DPSize: 1, NoDiscovery: true, HashScheme: subscribe.HashSchemeRekey}},
		{"vllm flavour, scheme declared", config.Worker{ID: "v", URL: "http://h:2", Model: "m", DPSize: 1, Flavor: config.FlavorVLLM,
			KVHashScheme: config.KVHashAuto},
			subscribe.WorkerSpec{ID: "v", URL: "http://h:2", Model: "m", DPSize: 1, NoDiscovery: true, HashScheme: subscribe.HashSchemeAuto}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := WorkerSpecFrom(tc.w); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestCacheStateBlockKey: kv.block_key reaches the index, under the index's own names.
func TestCacheStateBlockKey(t *testing.T) {
	if config.BlockKeyEngine != index.BlockKeyEngine || config.BlockKeyRouter != index.BlockKeyRouter {
		t.Fatalf("kv.block_key values %q, %q; the index's %q, %q", config.BlockKeyEngine, config.BlockKeyRouter, index.BlockKeyEngine, index.BlockKeyRouter)
	}
	for _, key := range []string{config.BlockKeyEngine, config.BlockKeyRouter} {
		cfg := config.Default()
		cfg.KV.Shards, cfg.KV.BlockKey = 2, key
		cs, err := NewCacheState(cfg, CacheOptions{Metrics: metrics.NewSet()})
		if err != nil {
			t.Fatal(err)
		}
		if cs.Index() == nil || (cs.Index().RouterKeys() != nil) != (key == config.BlockKeyRouter) {
			t.Errorf("kv.block_key %s: index %v not keyed as configured", key, cs.Index())
		}
		cs.Close()
	}
}

// TestCacheStateLookupSplit: kv.lookup_split_blocks reaches an index keyed by the router's
// keys, with the index's own least value; off (the default) or with engine keys there is no
// split.
func TestCacheStateLookupSplit(t *testing.T) {
	if config.MinLookupSplitBlocks != index.MinSplitBlocks {
		t.Fatalf("kv.lookup_split_blocks least %d; the index's %d", config.MinLookupSplitBlocks, index.MinSplitBlocks)
	}
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("no split on one processor")
	}
	tests := []struct {
		key   string
		split int
		want  int
	}{
		{config.BlockKeyRouter, 0, 0},
		{config.BlockKeyRouter, 2048, 2048},
		{config.BlockKeyEngine, 2048, 0},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/%d", tc.key, tc.split), func(t *testing.T) {
			cfg := config.Default()
			cfg.KV.Shards, cfg.KV.BlockKey, cfg.KV.LookupSplitBlocks = 2, tc.key, tc.split
			cs, err := NewCacheState(cfg, CacheOptions{Metrics: metrics.NewSet()})
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			if got := cs.Index().SplitBlocks(); got != tc.want {
				t.Fatalf("index splits lookups of %d blocks, want %d", got, tc.want)
			}
		})
	}
}
