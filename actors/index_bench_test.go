package actors

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"switchyard/config"
	"switchyard/kv"
	"switchyard/kv/events"
	"switchyard/kv/hashing"
	"switchyard/kv/index"
	"switchyard/kv/subscribe"
)

// The prefix-index benchmarks of issue 7, run on both shard hosts: "locked" (index.LockedShards,
// shards behind mutexes on the caller's goroutine: the baseline) and "actors" (index shard
// actors, as the router runs them: one per core by default; "actors-8shards" for comparison).
// These hash every lookup's prompt from scratch; "actors+hashcache" has the router's default
// hash cache (kv.hash_cache_chunks), so a prompt looked up again is not hashed again;
// "actors+routerkey" keys blocks by the router's own keys (kv.block_key router), which every
// lookup computes from scratch (there is no hash cache with them); "actors+routerkey+split"
// also splits long lookups across two goroutines (kv.lookup_split_blocks 1024);
// "actors+hashcache+rekey" is the default host with engines whose hashes are not the
// router's (vLLM's): their blocks are re-keyed from their token IDs to the SHA-256 chain.

type benchHost struct {
	name   string
	shards int
	host   func([]*index.Shard) (index.ShardHost, error)
	// hashCache is kv.hash_cache_chunks (0: off).
	hashCache int
	// blockKey is kv.block_key ("": engine).
	blockKey string
	// splitBlocks is kv.lookup_split_blocks (0: off).
	splitBlocks int
	// rekey: the engines' hashes are not the router's, and their blocks are re-keyed from
	// their token IDs (subscribe.NewIngestor's rekey).
	rekey bool
}

func benchHosts() []benchHost {
	locked := func(s []*index.Shard) (index.ShardHost, error) { return index.NewLockedShards(s), nil }
	return []benchHost{
		{"locked", 8, locked, 0, "", 0, false},
		{"actors", 0, IndexHost(IndexOptions{}), 0, "", 0, false}, // the default: one shard per core
		{"actors-8shards", 8, IndexHost(IndexOptions{}), 0, "", 0, false},
	}
}

// routerHost is the actor host with the router's default hash cache.
func routerHost() benchHost {
	return benchHost{"actors+hashcache", 0, IndexHost(IndexOptions{}), config.Default().KV.HashCacheChunks, "", 0, false}
}

// routerKeyHost is the actor host keyed by the router's own block keys (kv.block_key router).
func routerKeyHost() benchHost {
	return benchHost{"actors+routerkey", 0, IndexHost(IndexOptions{}), 0, index.BlockKeyRouter, 0, false}
}

// routerKeySplitHost is routerKeyHost with long lookups split across two goroutines
// (kv.lookup_split_blocks at its least, 1024 blocks).
func routerKeySplitHost() benchHost {
	return benchHost{"actors+routerkey+split", 0, IndexHost(IndexOptions{}), 0, index.BlockKeyRouter, config.MinLookupSplitBlocks, false}
}

// engineRekeyHost is routerHost with engines whose blocks are re-keyed to the SHA-256 chain
// (index.BlockKeyEngine, a vLLM engine's events).
func engineRekeyHost() benchHost {
	h := routerHost()
	h.name, h.rekey = "actors+hashcache+rekey", true
	return h
}

// coldCacheHost is the actor host with a hash cache of one chunk: each chunk a lookup hashes
// evicts the one before, so every lookup of a long prompt misses every chunk and pays for
// the cache (a chunk's key, the probe, the entry) on top of the hashing, as a prompt the
// router sees for the first time does.
func coldCacheHost() benchHost {
	return benchHost{"actors+coldcache", 0, IndexHost(IndexOptions{}), 1, "", 0, false}
}

func newBenchIndex(b *testing.B, h benchHost, maxBlocks int) *index.Index {
	b.Helper()
	x, err := index.New(index.Config{Shards: h.shards, MaxBlocks: maxBlocks, Host: h.host, HashCacheChunks: h.hashCache, BlockKey: h.blockKey,
		SplitBlocks: h.splitBlocks})
	if err != nil {
		b.Fatal(err)
	}
	if h.splitBlocks > 0 && runtime.GOMAXPROCS(0) > 1 && x.SplitBlocks() != h.splitBlocks {
		b.Fatalf("%s: the index splits lookups of %d blocks, want %d", h.name, x.SplitBlocks(), h.splitBlocks)
	}
	b.Cleanup(func() { _ = x.Close() })
	return x
}

// registerEngines registers n one-rank engines e000… of model "m" with block size bs.
func registerEngines(b testing.TB, x *index.Index, n, bs int) []index.OwnerID {
	b.Helper()
	ids := make([]index.OwnerID, n)
	for i := range ids {
		got, err := x.SetWorker(fmt.Sprintf("e%03d", i), "m", 1, bs)
		if err != nil {
			b.Fatal(err)
		}
		ids[i] = got[0]
	}
	return ids
}

// fillResident stores n random blocks, spread round-robin over owners, and waits until the
// shards applied them.
func fillResident(b testing.TB, x *index.Index, owners []index.OwnerID, n, bs int) {
	b.Helper()
	rng := rand.New(rand.NewPCG(1, uint64(n)))
	w := x.NewWriter()
	for i := range n {
		o := owners[i%len(owners)]
		w.Store(o, x.Owners().Epoch(o), int64(rng.Uint64()), index.TierGPU)
		if w.Pending() >= 1<<14 {
			if d := w.Flush(); d != 0 {
				b.Fatalf("fill dropped %d operations", d)
			}
		}
	}
	if d := w.Flush(); d != 0 {
		b.Fatalf("fill dropped %d operations", d)
	}
	drain(b, x, bs)
}

// drain waits until every shard applied what was sent before.
func drain(b testing.TB, x *index.Index, _ int) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := x.Sync(ctx); err != nil {
		b.Fatal(err)
	}
}

func holdTokens(b testing.TB, x *index.Index, o index.OwnerID, tokens []uint32, bs int) {
	b.Helper()
	w := x.NewWriter()
	for _, h := range x.AppendBlockKeys(nil, tokens, bs) {
		w.Store(o, x.Owners().Epoch(o), h, index.TierGPU)
	}
	if d := w.Flush(); d != 0 {
		b.Fatalf("dropped %d", d)
	}
}

func randomTokens(rng *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = rng.Uint32()
	}
	return out
}

func reportPercentiles(b *testing.B, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	at := func(q float64) float64 { return float64(d[min(len(d)-1, int(q*float64(len(d))))].Nanoseconds()) / 1e3 }
	// The fastest: on a busy machine, the nearest to the lookup's own path.
	b.ReportMetric(at(0), "min-µs")
	b.ReportMetric(at(0.50), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
}

// BenchmarkLookup100kTokens: one lookup of a 100,000-token prompt over 100 engines, with
// 1,000,000 other blocks resident. Every engine holds the first 2,048 tokens (a shared
// system prompt), four hold all of it, ten hold 10%…100% of it. "full" hashes the prompt
// and matches (a full hit: the worst case); "miss" looks up a prompt nobody holds; "match"
// matches precomputed hashes; "hash" only hashes (the floor of full). On "actors+hashcache"
// the repeated prompt's hashes come from the hash cache after the first lookup; on
// "actors+coldcache" every lookup misses the cache (the router's first lookup of a prompt);
// "actors+routerkey+split" is "actors+routerkey" with kv.lookup_split_blocks on (its twin
// idle but for these lookups).
func BenchmarkLookup100kTokens(b *testing.B) {
	const engines, resident, promptLen = 100, 1_000_000, 100_000
	for _, h := range append(benchHosts(), routerHost(), coldCacheHost(), routerKeyHost(), routerKeySplitHost()) {
		for _, bs := range []int{16, 64} {
			var x *index.Index
			var prompt []uint32
			parent := b
			setup := func(*testing.B) {
				if x != nil {
					return
				}
				b := parent // the index lives as long as the parent benchmark
				x = newBenchIndex(b, h, 4_000_000)
				ids := registerEngines(b, x, engines, bs)
				fillResident(b, x, ids, resident, bs)
				prompt = randomTokens(rand.New(rand.NewPCG(7, 7)), promptLen)
				for i, o := range ids {
					n := 2048
					switch {
					case i < 4:
						n = promptLen
					case i < 14:
						n = (i - 3) * promptLen / 10
					}
					holdTokens(b, x, o, prompt[:n], bs)
				}
				drain(b, x, bs)
			}
			check := func(b *testing.B, l *kv.Lookup) {
				if l.Tokens("e000") != promptLen || l.Tokens("e099") != 2048 || len(l.Matches) != engines {
					b.Fatalf("wrong lookup: e000 %d, e099 %d, %d matches", l.Tokens("e000"), l.Tokens("e099"), len(l.Matches))
				}
			}
			b.Run(fmt.Sprintf("%s/bs=%d/full", h.name, bs), func(b *testing.B) {
				setup(b)
				var l kv.Lookup
				var d []time.Duration
				ctx := context.Background()
				b.ReportAllocs()
				for b.Loop() {
					t := time.Now()
					if err := x.Lookup(ctx, "m", prompt, &l); err != nil {
						b.Fatal(err)
					}
					d = append(d, time.Since(t))
				}
				check(b, &l)
				reportPercentiles(b, d)
			})
			b.Run(fmt.Sprintf("%s/bs=%d/miss", h.name, bs), func(b *testing.B) {
				// A prompt nobody holds: hashing and matching stop after the first wave.
				setup(b)
				cold := randomTokens(rand.New(rand.NewPCG(8, 8)), promptLen)
				var l kv.Lookup
				var d []time.Duration
				ctx := context.Background()
				b.ReportAllocs()
				for b.Loop() {
					t := time.Now()
					if err := x.Lookup(ctx, "m", cold, &l); err != nil {
						b.Fatal(err)
					}
					d = append(d, time.Since(t))
				}
				if len(l.Matches) != 0 {
					b.Fatalf("a cold prompt matched %d engines", len(l.Matches))
				}
				reportPercentiles(b, d)
			})
			b.Run(fmt.Sprintf("%s/bs=%d/match", h.name, bs), func(b *testing.B) {
				setup(b)
				hashes := x.AppendBlockKeys(nil, prompt, bs)
				var l kv.Lookup
				var d []time.Duration
				ctx := context.Background()
				b.ReportAllocs()
				for b.Loop() {
					t := time.Now()
					if err := x.MatchHashes(ctx, "m", bs, hashes, promptLen, &l); err != nil {
						b.Fatal(err)
					}
					d = append(d, time.Since(t))
				}
				check(b, &l)
				reportPercentiles(b, d)
			})
			if h.name == "locked" {
				b.Run(fmt.Sprintf("hash-only/bs=%d", bs), func(b *testing.B) {
					setup(b)
					dst := make([]int64, 0, promptLen)
					var d []time.Duration
					b.ReportAllocs()
					for b.Loop() {
						t := time.Now()
						dst = hashing.AppendBlockHashes(dst[:0], prompt, bs)
						d = append(d, time.Since(t))
					}
					reportPercentiles(b, d)
				})
				b.Run(fmt.Sprintf("routerkey-only/bs=%d", bs), func(b *testing.B) {
					setup(b)
					keys := index.NewRouterKeys()
					dst := make([]int64, 0, promptLen)
					var d []time.Duration
					b.ReportAllocs()
					for b.Loop() {
						t := time.Now()
						dst, _ = keys.AppendChain(dst[:0], 0, prompt, bs)
						d = append(d, time.Since(t))
					}
					reportPercentiles(b, d)
				})
			}
		}
	}
}

// ingestWorkload is one engine's pre-encoded event batches: each stores eventsPerBatch/2
// new two-block chains (real router hashes of random tokens, as an SGLang engine publishes)
// and removes the chains stored window batches earlier, so the resident size stays flat.
type ingestWorkload struct {
	worker   string
	payloads [][]byte
}

const (
	eventsPerBatch = 16 // 8 BlockStored + 8 BlockRemoved
	blocksPerEvent = 2
	batchesPerEng  = 512
	removeWindow   = 64
)

func newIngestWorkload(b *testing.B, worker string, seed uint64) *ingestWorkload {
	b.Helper()
	rng := rand.New(rand.NewPCG(seed, 99))
	enc := events.NewEncoder()
	chains := make([][]int64, 0, batchesPerEng*eventsPerBatch/2)
	w := &ingestWorkload{worker: worker}
	for i := range batchesPerEng {
		batch := &events.EventBatch{TS: float64(i)}
		for range eventsPerBatch / 2 {
			tokens := randomTokens(rng, 16*blocksPerEvent)
			hs := hashing.AppendBlockHashes(nil, tokens, 16)
			chains = append(chains, hs)
			batch.Events = append(batch.Events, events.Event{Kind: events.EventBlockStored, BlockHashes: hs, TokenIDs: tokens, BlockSize: 16, Medium: events.MediumGPU})
		}
		for k := range eventsPerBatch / 2 {
			j := (i-removeWindow)*eventsPerBatch/2 + k
			if j < 0 {
				j += batchesPerEng * eventsPerBatch / 2 // wraps onto the last round's chains
				if j >= len(chains) {
					continue
				}
			}
			batch.Events = append(batch.Events, events.Event{Kind: events.EventBlockRemoved, BlockHashes: chains[j], Medium: events.MediumGPU})
		}
		p, err := enc.Encode(batch, events.ShapeArray)
		if err != nil {
			b.Fatal(err)
		}
		w.payloads = append(w.payloads, append([]byte(nil), p...))
	}
	return w
}

// BenchmarkIngestAndLookup runs event ingest (decode, key, write, shard apply) and lookups
// concurrently over an index holding `resident` blocks: 4 goroutines on the machine's cores,
// each applying one engine's batches and, every 4th iteration, looking up a 2,048-token
// prompt whose first half two engines hold.
//
// An iteration (b.N, ns/op) is one event batch (16 events) or one lookup, not an op. The ops
// of ops/s are what issue 7 counts as ingest + lookup operations: KV events (each a
// BlockStored of 2 blocks with their 32 token IDs, or a BlockRemoved of 2 blocks) and lookups
// (each a 2,048-token prompt of 128 blocks whose first 64 two engines hold, its hashes from
// the hash cache when there is one). Also reported: events/s, lookups/s, block-ops/s (the
// stores and removes the shards applied), block-ops+lookups/s, and the process's CPU over the
// measured phase, as cpu-cores (CPU seconds a second: 2 is both cores busy) and cpu-ns/op
// (CPU per event or lookup), which a shared machine disturbs less than the rates.
// idle-procs is how many of the Go scheduler's processors (GOMAXPROCS) had no goroutine to
// run, on average: work that could not keep both cores busy, whatever else the machine runs.
// gc-cycles (collections the runtime started itself), gc-cpu-share (the collector's share of
// the process's CPU, the forced collection that ends the measured phase included),
// page-faults (minor faults: first touches of memory, as after a table grows) and
// preempted/s (involuntary context switches: the kernel gave a core to another thread) tell
// what else a slow run spent its time on.
//
// The index is filled once per sub-benchmark and kept across its runs (the testing package
// runs a benchmark with b.N = 1 before the measured run, even with -benchtime Nx): the runs
// after the first find it as the previous run left it, with the same number of blocks
// resident.
func BenchmarkIngestAndLookup(b *testing.B) {
	for _, resident := range []int{100_000, 1_000_000, 10_000_000} {
		for _, h := range append(benchHosts(), routerHost(), routerKeyHost(), engineRekeyHost()) {
			var st *ingestBench
			b.Run(fmt.Sprintf("%s/resident=%d", h.name, resident), func(b *testing.B) {
				if st == nil {
					st = newIngestBench(b, h, resident)
				}
				st.run(b)
			})
			if st != nil {
				_ = st.x.Close()
			}
		}
	}
}

const ingestEngines, ingestHot, ingestLookupEvery, ingestParallelism = 16, 64, 4, 2

// ingestBench is BenchmarkIngestAndLookup's index, filled, with its hot prompts, the
// engines' event batches and their ingestors (one per engine, kept across runs with their
// re-key maps).
type ingestBench struct {
	x         *index.Index
	prompts   [][]uint32
	workloads []*ingestWorkload
	ingestors []*subscribe.Ingestor
}

func newIngestBench(b *testing.B, h benchHost, resident int) *ingestBench {
	b.Helper()
	x, err := index.New(index.Config{Shards: h.shards, Host: h.host, HashCacheChunks: h.hashCache, BlockKey: h.blockKey, SplitBlocks: h.splitBlocks,
		MaxBlocks: resident + resident/2 + ingestEngines*removeWindow*eventsPerBatch*blocksPerEvent})
	if err != nil {
		b.Fatal(err)
	}
	if (h.blockKey == index.BlockKeyRouter) != (x.RouterKeys() != nil) {
		b.Fatalf("%s: the index is not keyed by %q", h.name, h.blockKey)
	}
	ids := registerEngines(b, x, ingestEngines, 16)
	ingestors := make([]*subscribe.Ingestor, ingestEngines)
	for i := range ingestors {
		ingestors[i] = subscribe.NewIngestor(x, fmt.Sprintf("e%03d", i), h.rekey, nil)
	}
	if x.RouterKeys() != nil || h.rekey {
		fillIngested(b, x, ingestors, resident)
	} else {
		fillResident(b, x, ids, resident, 16)
	}
	rng := rand.New(rand.NewPCG(3, 3))
	prompts := make([][]uint32, ingestHot)
	for i := range prompts {
		prompts[i] = randomTokens(rng, 2048)
		holdTokens(b, x, ids[i%ingestEngines], prompts[i][:1024], 16)
		holdTokens(b, x, ids[(i+1)%ingestEngines], prompts[i][:1024], 16)
	}
	workloads := make([]*ingestWorkload, 2*ingestParallelism*2)
	for i := range workloads {
		workloads[i] = newIngestWorkload(b, fmt.Sprintf("e%03d", i%ingestEngines), uint64(i))
	}
	drain(b, x, 16)
	return &ingestBench{x: x, prompts: prompts, workloads: workloads, ingestors: ingestors}
}

// fillIngested stores n blocks of random tokens through the engines' ingestors, spread
// round-robin over them, in chains of 32 blocks under random engine hashes: on an index keyed
// by the router's keys, or with engines re-keyed to the SHA-256 chain, each engine's re-key
// map then holds its resident blocks, as it would have after their BlockStored events.
func fillIngested(b *testing.B, x *index.Index, ingestors []*subscribe.Ingestor, n int) {
	b.Helper()
	const chain = 32
	rng := rand.New(rand.NewPCG(1, uint64(n)))
	enc := events.NewEncoder()
	tokens := make([]uint32, chain*16)
	for done, i := 0, 0; done < n; i++ {
		k := min(chain, n-done)
		for j := range tokens[:k*16] {
			tokens[j] = rng.Uint32()
		}
		hs := make([]int64, k)
		for j := range hs {
			hs[j] = int64(rng.Uint64())
		}
		batch := &events.EventBatch{Events: []events.Event{{Kind: events.EventBlockStored, BlockHashes: hs, TokenIDs: tokens[:k*16], BlockSize: 16, Medium: events.MediumGPU}}}
		p, err := enc.Encode(batch, events.ShapeArray)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ingestors[i%len(ingestors)].Apply(p, 0); err != nil {
			b.Fatal(err)
		}
		done += k
	}
	if dropped := x.Metrics().Ingest().OpsDroppedBusy; dropped != 0 {
		b.Fatalf("fill dropped %d operations", dropped)
	}
	drain(b, x, 16)
}

func (st *ingestBench) run(b *testing.B) {
	const hot, lookupEvery, parallelism = ingestHot, ingestLookupEvery, ingestParallelism
	x, prompts, workloads := st.x, st.prompts, st.workloads
	before := x.Metrics().Ingest()
	fallbacks0 := x.Stats().Fallbacks
	var events, lookups, hits, lookupErrs atomic.Int64
	var next atomic.Int64
	var mu sync.Mutex
	var firstErr error
	b.SetParallelism(parallelism)
	b.ReportAllocs()
	proc0 := sampleProc(b)
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		g := int(next.Add(1) - 1)
		if g >= len(workloads) || g >= len(st.ingestors) {
			panic("BUG: more goroutines than workloads: two would share an ingestor")
		}
		wl := workloads[g]
		ing := st.ingestors[g%ingestEngines] // wl.worker's
		var l kv.Lookup
		ctx := context.Background()
		var ev, lk, lkErr, hit int64
		for i := 0; pb.Next(); i++ {
			if i%lookupEvery == lookupEvery-1 {
				lk++
				if err := x.Lookup(ctx, "m", prompts[(i/lookupEvery+g)%hot], &l); err != nil {
					// A lookup behind a full shard queue may time out (the router then
					// routes without it): counted, not fatal.
					lkErr++
					continue
				}
				if len(l.Matches) > 0 {
					hit++
				}
				continue
			}
			n, err := ing.Apply(wl.payloads[i%len(wl.payloads)], 0)
			if err != nil {
				mu.Lock()
				firstErr = err
				mu.Unlock()
			}
			ev += int64(n)
		}
		events.Add(ev)
		lookups.Add(lk)
		hits.Add(hit)
		lookupErrs.Add(lkErr)
	})
	drain(b, x, 16)
	elapsed := time.Since(start).Seconds()
	proc := sampleProc(b).since(proc0)
	cpu, idle := proc.cpu.Seconds(), proc.idle
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	after := x.Metrics().Ingest()
	ops := float64(after.OpsApplied - before.OpsApplied)
	b.ReportMetric(float64(events.Load())/elapsed, "events/s")
	b.ReportMetric(ops/elapsed, "block-ops/s")
	b.ReportMetric(float64(lookups.Load())/elapsed, "lookups/s")
	b.ReportMetric(float64(events.Load()+lookups.Load())/elapsed, "ops/s")
	b.ReportMetric((ops+float64(lookups.Load()))/elapsed, "block-ops+lookups/s")
	b.ReportMetric(cpu/elapsed, "cpu-cores")
	b.ReportMetric(idle/elapsed, "idle-procs")
	if n := events.Load() + lookups.Load(); n > 0 {
		b.ReportMetric(cpu*1e9/float64(n), "cpu-ns/op")
	}
	// What else the process did meanwhile, to tell a slow run's cause: collections the
	// runtime started on its own and their CPU, page faults (first touches of new memory,
	// as after a table grows), and how often the kernel took a core from the process.
	b.ReportMetric(float64(proc.gcs), "gc-cycles")
	b.ReportMetric(proc.gcCPU/cpu, "gc-cpu-share")
	b.ReportMetric(float64(proc.faults), "page-faults")
	b.ReportMetric(float64(proc.preempted)/elapsed, "preempted/s")
	if dropped := after.OpsDroppedBusy - before.OpsDroppedBusy; dropped > 0 {
		b.ReportMetric(float64(dropped), "dropped-ops")
	}
	if n := lookupErrs.Load(); n > 0 {
		b.ReportMetric(float64(n), "lookup-errors")
	}
	if n := x.Stats().Fallbacks - fallbacks0; n > 0 {
		b.ReportMetric(float64(n), "read-fallbacks")
	}
	if ok := lookups.Load() - lookupErrs.Load(); ok > 0 && hits.Load() < ok/2 {
		b.Fatalf("only %d of %d lookups hit the hot prompts", hits.Load(), lookups.Load())
	}
}

// procSample is what the process had used at a moment: its CPU (user and system), the
// runtime's estimates of the processor time no goroutine used (idle) and of the garbage
// collector's CPU, in seconds, the collections the runtime started on its own, minor page
// faults, and involuntary context switches (the kernel gave the core to another thread).
type procSample struct {
	cpu                    time.Duration
	idle, gcCPU            float64
	gcs, faults, preempted int64
}

// sampleProc samples the process after a garbage collection it runs (the runtime updates
// its CPU classes at each one; forced collections are not counted in gcs).
func sampleProc(b *testing.B) procSample {
	b.Helper()
	runtime.GC()
	m := []metrics.Sample{{Name: "/cpu/classes/idle:cpu-seconds"}, {Name: "/cpu/classes/gc/total:cpu-seconds"},
		{Name: "/gc/cycles/automatic:gc-cycles"}}
	metrics.Read(m)
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return procSample{
		cpu:  time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
		idle: m[0].Value.Float64(), gcCPU: m[1].Value.Float64(), gcs: int64(m[2].Value.Uint64()),
		faults: int64(ru.Minflt), preempted: int64(ru.Nivcsw),
	}
}

// since is what the process used from p0 to p.
func (p procSample) since(p0 procSample) procSample {
	return procSample{
		cpu: p.cpu - p0.cpu, idle: p.idle - p0.idle, gcCPU: p.gcCPU - p0.gcCPU,
		gcs: p.gcs - p0.gcs, faults: p.faults - p0.faults, preempted: p.preempted - p0.preempted,
	}
}
