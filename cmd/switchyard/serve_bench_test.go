package main

import (
	"errors"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/bench/mockengine"
	"switchyard/bench/reference"
	"switchyard/config"
)

// loadResult is one target's measurement: requests, errors and latencies over one or more
// phases.
type loadResult struct {
	requests int
	errors   int64
	elapsed  time.Duration
	lat      []time.Duration
}

func (r *loadResult) add(o loadResult) {
	r.requests += o.requests
	r.errors += o.errors
	r.elapsed += o.elapsed
	r.lat = append(r.lat, o.lat...)
}

func (r *loadResult) rps() float64 { return float64(r.requests) / r.elapsed.Seconds() }

// quantile is the nearest-rank q-quantile of the latencies (sorted by the caller).
func (r *loadResult) quantile(q float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(r.lat)))) - 1
	return r.lat[max(i, 0)]
}

// benchBody is the small non-streaming chat request of the benchmark.
var benchBody = []byte(`{"model":"bench","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`)

// streamBody is its streaming request: 64 tokens, each its own event and chunk.
var streamBody = []byte(`{"model":"bench","messages":[{"role":"user","content":"hi"}],"max_tokens":64,"stream":true}`)

// runLoad sends body (a chat request) from conc goroutines for d, each goroutine rotating
// over urls from its own offset, and measures throughput and latency (of the whole answer).
// Every target is loaded by this same closed-loop client, in the same process as the
// engines (and router).
func runLoad(tb testing.TB, urls []string, body []byte, conc int, d time.Duration) loadResult {
	tb.Helper()
	client := &fasthttp.Client{MaxConnsPerHost: conc, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		all  []time.Duration
		errs atomic.Int64
		stop atomic.Bool
	)
	start := time.Now()
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := fasthttp.AcquireRequest()
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			lat := make([]time.Duration, 0, 1<<14)
			for i := g; !stop.Load(); i++ {
				req.Reset()
				req.SetRequestURI(urls[i%len(urls)] + "/v1/chat/completions")
				req.Header.SetMethod(fasthttp.MethodPost)
				req.Header.SetContentType("application/json")
				req.SetBodyRaw(body)
				t0 := time.Now()
				err := client.Do(req, resp)
				if err != nil || resp.StatusCode() != 200 {
					errs.Add(1)
					continue
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		}()
	}
	time.Sleep(d) // the measurement window itself, not a wait for a condition
	stop.Store(true)
	wg.Wait()
	return loadResult{requests: len(all), errors: errs.Load(), elapsed: time.Since(start), lat: all}
}

// benchTarget is one way of reaching the engines.
type benchTarget struct {
	name string
	urls []string
	// ext is the CPU time the target's own processes (nginx, a router process) have used so
	// far; nil: it runs in this process.
	ext  func() time.Duration
	load loadResult // under concurrent load
	one  loadResult // one request at a time
	// cpu is the CPU time of the phases under load: this process's and the proxy's own.
	cpu time.Duration
}

// measure runs one phase under load and adds it, with its CPU time, to t's figures.
func (t *benchTarget) measure(tb testing.TB, body []byte, conc int, d time.Duration) {
	cpu0, _ := reference.ProcessCPU()
	ext0 := t.externalCPU()
	t.load.add(runLoad(tb, t.urls, body, conc, d))
	cpu1, _ := reference.ProcessCPU()
	t.cpu += cpu1 - cpu0 + t.externalCPU() - ext0
}

func (t *benchTarget) externalCPU() time.Duration {
	if t.ext == nil {
		return 0
	}
	return t.ext()
}

// proxyCPU is the ext of a reference proxy.
func proxyCPU(p *reference.Proxy) func() time.Duration {
	return func() time.Duration {
		cpu, _ := p.ExternalCPU()
		return cpu
	}
}

// startRouterProcess runs the router as its own process (`switchyard serve`, one plain
// bucket over engines, round_robin), as nginx runs: it gets its own share of the machine
// beside the client and engines, as nginx does. It returns its URL and its CPU time so far.
func startRouterProcess(b *testing.B, engines []string) (string, func() time.Duration) {
	b.Helper()
	c, url := startRouterChild(b, 0, "--worker-urls", strings.Join(engines, ","), "--model", "bench",
		"--policy", "round_robin")
	pid := c.cmd.Process.Pid
	return url, func() time.Duration {
		cpu, _ := reference.ProcessTreeCPU(pid)
		return cpu
	}
}

// cpuPer1K is the target's CPU milliseconds per 1,000 requests under load.
func (t *benchTarget) cpuPer1K() float64 {
	if t.load.requests == 0 {
		return 0
	}
	return float64(t.cpu.Microseconds()) / float64(t.load.requests)
}

// startBareProcess runs the bare fasthttp proxy as its own process (switchyard
// bare-proxy), as the router process and nginx run, closed at the end of the benchmark.
func startBareProcess(b *testing.B, engines []string) *reference.Proxy {
	b.Helper()
	p, err := reference.StartBareProcess([]string{switchyardBinary(b), "bare-proxy"}, engines, reference.ProcessOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := p.Close(); err != nil {
			b.Error(err)
		}
	})
	return p
}

// startReferences starts the bare fasthttp proxy and nginx in front of engines. Without an
// nginx binary the benchmark says so and measures without it (fails under CI=true).
func startReferences(b *testing.B, engines []string, conc int) (bare, nginx *reference.Proxy) {
	b.Helper()
	bare, err := reference.StartBare(engines)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = bare.Close() })
	nginx, err = reference.StartNginx(engines, reference.NginxOptions{Keepalive: 2 * conc})
	switch {
	case errors.Is(err, reference.ErrNoNginx):
		if os.Getenv("CI") == "true" {
			b.Fatal("nginx not found: the benchmark measures the router against it (make testdeps)")
		}
		b.Log("SKIPPED: nginx not found, the router is not measured against nginx (make testdeps; Debian: apt-get install nginx)")
		return bare, nil
	case err != nil:
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := nginx.Close(); err != nil {
			b.Error(err)
		}
	})
	return bare, nginx
}

// BenchmarkRouterVsDirect measures, in one run, small non-streaming requests sent to two
// zero-cost mock engines directly, through the router (round_robin over the same engines),
// through a bare fasthttp proxy and through nginx (the references; nginx when installed):
// requests/s and p50/p99 latency of each under load (32 concurrent clients), the share of
// the direct throughput each keeps, the router's throughput against each reference
// (router_x_nginx, router_x_bare), CPU milliseconds per 1,000 requests of each (this
// process's plus the proxy's own processes'; a proxy's own cost is its figure minus
// direct's), the router process against the bare proxy as its own process too
// (router_proc_x_bare_proc: both have a process of their own, as nginx has), and the
// latency the router adds at p50 one request at a time. The same are then measured with streamed answers of 64 events, each its own chunk (stream_*). A
// fifth target, "limits", is the router with every admission limit (concurrency limits,
// queues, rate limits) configured but never reached: limits_%_of_router is what the idle
// machinery costs. A sixth, "noretry", is the router with retries off (the router target
// has them on, the default): router_%_of_noretry is what the retry machinery costs when
// nothing fails.
//
// Client, engines and in-process proxies share the process and its cores (nginx runs its
// one worker process beside it), and every target is measured the same way: the same
// client and request, a warm-up per target, then several short phases per target
// interleaved round by round in rotating order (so that a change in the machine's load
// mid-run hits every target alike); each target's figures pool its phases.
//
// Run it once: go test -run '^$' -bench RouterVsDirect -benchtime 1x ./cmd/switchyard.
// SWITCHYARD_BENCH_SECONDS sets the measured time per target under load (default 3; the
// one-at-a-time phases take half as long) and SWITCHYARD_BENCH_ROUNDS the number of rounds
// (default 3).
func BenchmarkRouterVsDirect(b *testing.B) {
	d, rounds := benchTimes(3)
	const conc = 32
	e1 := startMock(b, mockengine.Config{WorkerID: "e1", Model: "bench", ZeroCost: true, EventPerWrite: true})
	e2 := startMock(b, mockengine.Config{WorkerID: "e2", Model: "bench", ZeroCost: true, EventPerWrite: true})
	cfg := config.Default()
	cfg.Server.Port = 0
	cfg.Workers = []config.Worker{
		{ID: "e1", URL: e1.URL(), Model: "bench", Role: config.RolePlain, DPSize: 1},
		{ID: "e2", URL: e2.URL(), Model: "bench", Role: config.RolePlain, DPSize: 1},
	}
	cfg.Models = map[string]config.Model{"bench": {Buckets: []config.Bucket{{ID: "all", Groups: config.Groups{Plain: &config.Group{}}}}}}
	_, routerURL := startRouter(b, cfg)
	// The same router with every admission limit configured but never reached: the
	// router-wide and per-model concurrency limits with their queues, and the router-wide
	// and per-key rate limits.
	limited := *cfg
	limited.Server.MaxConcurrentRequests = 4096
	limited.Server.RateLimit = config.RateLimit{RequestsPerSecond: 1e9, Burst: 1 << 30,
		PerKey: config.KeyRateLimit{RequestsPerSecond: 1e9, Burst: 1 << 30, MaxKeys: 10_000}}
	limited.Models = map[string]config.Model{"bench": {MaxConcurrentRequests: 4096,
		Buckets: cfg.Models["bench"].Buckets}}
	_, limitsURL := startRouter(b, &limited)
	// The same router with retries off.
	noRetry := *cfg
	noRetry.Retry.Enabled = false
	_, noRetryURL := startRouter(b, &noRetry)
	engines := []string{e1.URL(), e2.URL()}
	bare, nginx := startReferences(b, engines, conc)
	procURL, procCPU := startRouterProcess(b, engines)
	bareProc := startBareProcess(b, engines)

	b.ResetTimer()
	for range b.N {
		direct := &benchTarget{name: "direct", urls: engines}
		router := &benchTarget{name: "router", urls: []string{routerURL}}
		limits := &benchTarget{name: "limits", urls: []string{limitsURL}}
		noretry := &benchTarget{name: "noretry", urls: []string{noRetryURL}}
		targets := []*benchTarget{direct, router, limits, noretry,
			{name: "bare", urls: []string{bare.URL()}, ext: proxyCPU(bare)},
			{name: "router_proc", urls: []string{procURL}, ext: procCPU},
			{name: "bare_proc", urls: []string{bareProc.URL()}, ext: proxyCPU(bareProc)}}
		streams := []*benchTarget{
			{name: "stream_direct", urls: engines},
			{name: "stream_router", urls: []string{routerURL}},
			{name: "stream_bare", urls: []string{bare.URL()}, ext: proxyCPU(bare)},
			{name: "stream_router_proc", urls: []string{procURL}, ext: procCPU},
			{name: "stream_bare_proc", urls: []string{bareProc.URL()}, ext: proxyCPU(bareProc)},
		}
		if nginx != nil {
			targets = append(targets, &benchTarget{name: "nginx", urls: []string{nginx.URL()}, ext: proxyCPU(nginx)})
			streams = append(streams, &benchTarget{name: "stream_nginx", urls: []string{nginx.URL()}, ext: proxyCPU(nginx)})
		}
		serial := []*benchTarget{direct, router, limits, noretry}
		for _, t := range targets {
			runLoad(b, t.urls, benchBody, conc, d/5) // warm-up: connections, pools, heap
		}
		for _, t := range streams {
			runLoad(b, t.urls, streamBody, conc, d/5)
		}
		for r := range rounds {
			for i := range targets {
				targets[(r+i)%len(targets)].measure(b, benchBody, conc, d/time.Duration(rounds))
			}
			for i := range streams {
				streams[(r+i)%len(streams)].measure(b, streamBody, conc, d/time.Duration(rounds))
			}
			// Latency without queueing: one request at a time.
			for i := range serial {
				t := serial[(r+i)%len(serial)]
				t.one.add(runLoad(b, t.urls, benchBody, 1, d/time.Duration(2*rounds)))
			}
		}
		for _, t := range append(targets, streams...) {
			if t.load.errors+t.one.errors > 0 {
				b.Fatalf("%s: %d errors", t.name, t.load.errors+t.one.errors)
			}
			slices.Sort(t.load.lat)
			slices.Sort(t.one.lat)
		}
		µs := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
		// Throughput, latency and CPU of each way in, and the routers against each
		// reference: the router in this process against the bare proxy (in this process
		// too), the router process against nginx (each in its own process).
		report := func(prefix string, ts []*benchTarget) {
			byName := map[string]*benchTarget{}
			for _, t := range ts {
				byName[strings.TrimPrefix(t.name, prefix)] = t
			}
			direct := byName["direct"]
			for _, t := range ts {
				b.ReportMetric(t.load.rps(), t.name+"_req/s")
				b.ReportMetric(µs(t.load.quantile(0.5)), t.name+"_p50_µs")
				b.ReportMetric(µs(t.load.quantile(0.99)), t.name+"_p99_µs")
				if t == direct {
					b.ReportMetric(t.cpuPer1K(), t.name+"_cpu_ms/1k")
					continue
				}
				// A proxy's own CPU: its target's minus direct's (client and engines alike).
				b.ReportMetric(t.cpuPer1K()-direct.cpuPer1K(), t.name+"_cpu_ms/1k")
				b.ReportMetric(t.load.rps()/direct.load.rps()*100, t.name+"_%_of_direct")
			}
			for _, pair := range [][2]string{{"router", "bare"}, {"router_proc", "nginx"}, {"router_proc", "bare"}, {"router_proc", "bare_proc"}} {
				r, ref := byName[pair[0]], byName[pair[1]]
				if r == nil || ref == nil {
					continue
				}
				b.ReportMetric(r.load.rps()/ref.load.rps(), prefix+pair[0]+"_x_"+pair[1])
				if own := ref.cpuPer1K() - direct.cpuPer1K(); own > 0 {
					b.ReportMetric((r.cpuPer1K()-direct.cpuPer1K())/own, prefix+pair[0]+"_cpu_x_"+pair[1])
				}
			}
		}
		report("", append([]*benchTarget{direct, router}, targets[4:]...)) // and bare, router_proc, nginx
		report("stream_", streams)
		b.ReportMetric(µs(router.load.quantile(0.5)-direct.load.quantile(0.5)), "added_p50_µs")
		b.ReportMetric(µs(direct.one.quantile(0.5)), "serial_direct_p50_µs")
		b.ReportMetric(µs(direct.one.quantile(0.99)), "serial_direct_p99_µs")
		b.ReportMetric(µs(router.one.quantile(0.5)), "serial_router_p50_µs")
		b.ReportMetric(µs(router.one.quantile(0.99)), "serial_router_p99_µs")
		b.ReportMetric(µs(router.one.quantile(0.5)-direct.one.quantile(0.5)), "serial_added_p50_µs")
		b.ReportMetric(limits.load.rps(), "limits_req/s")
		b.ReportMetric(limits.load.rps()/router.load.rps()*100, "limits_%_of_router")
		b.ReportMetric(µs(limits.load.quantile(0.5)), "limits_p50_µs")
		b.ReportMetric(µs(limits.one.quantile(0.5)), "serial_limits_p50_µs")
		b.ReportMetric(µs(limits.one.quantile(0.5)-router.one.quantile(0.5)), "serial_limits_added_p50_µs")
		b.ReportMetric(noretry.load.rps(), "noretry_req/s")
		b.ReportMetric(router.load.rps()/noretry.load.rps()*100, "router_%_of_noretry")
		b.ReportMetric(µs(noretry.load.quantile(0.5)), "noretry_p50_µs")
		b.ReportMetric(µs(noretry.one.quantile(0.5)), "serial_noretry_p50_µs")
		b.ReportMetric(µs(router.one.quantile(0.5)-noretry.one.quantile(0.5)), "serial_retry_added_p50_µs")
	}
}

// BenchmarkOneAtATime measures the latency a proxy adds when requests come one at a time
// (no queueing anywhere): small non-streaming requests sent by one client to two zero-cost
// mock engines directly, through the router in this process, through the router as its own
// process (`switchyard serve`), through the bare fasthttp proxy and through nginx (when
// installed). Targets take turns in rotating order, round by round; each reports its p50
// and p99 and the p50 and p99 it adds over direct's (*_added_p50_µs), and the router
// process's added p50 against nginx's and the bare proxy's (router_proc_added_x_nginx).
//
// Run it: go test -run '^$' -bench OneAtATime -benchtime 1x ./cmd/switchyard.
// SWITCHYARD_BENCH_SECONDS sets the measured time per target (default 3) and
// SWITCHYARD_BENCH_ROUNDS the number of rounds (default 5).
func BenchmarkOneAtATime(b *testing.B) {
	d, rounds := benchTimes(5)
	e1 := startMock(b, mockengine.Config{WorkerID: "e1", Model: "bench", ZeroCost: true})
	e2 := startMock(b, mockengine.Config{WorkerID: "e2", Model: "bench", ZeroCost: true})
	engines := []string{e1.URL(), e2.URL()}
	cfg := config.Default()
	cfg.Server.Port = 0
	cfg.Workers = []config.Worker{
		{ID: "e1", URL: e1.URL(), Model: "bench", Role: config.RolePlain, DPSize: 1},
		{ID: "e2", URL: e2.URL(), Model: "bench", Role: config.RolePlain, DPSize: 1},
	}
	cfg.Models = map[string]config.Model{"bench": {Buckets: []config.Bucket{{ID: "all", Groups: config.Groups{Plain: &config.Group{}}}}}}
	_, routerURL := startRouter(b, cfg)
	bare, nginx := startReferences(b, engines, 1)
	procURL, _ := startRouterProcess(b, engines)

	b.ResetTimer()
	for range b.N {
		direct := &benchTarget{name: "direct", urls: engines}
		targets := []*benchTarget{direct,
			{name: "router", urls: []string{routerURL}},
			{name: "router_proc", urls: []string{procURL}},
			{name: "bare", urls: []string{bare.URL()}}}
		if nginx != nil {
			targets = append(targets, &benchTarget{name: "nginx", urls: []string{nginx.URL()}})
		}
		for _, t := range targets {
			runLoad(b, t.urls, benchBody, 1, d/10) // warm-up
		}
		for r := range rounds {
			for i := range targets {
				t := targets[(r+i)%len(targets)]
				t.one.add(runLoad(b, t.urls, benchBody, 1, d/time.Duration(rounds)))
			}
		}
		µs := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
		byName := map[string]*benchTarget{}
		for _, t := range targets {
			if t.one.errors > 0 {
				b.Fatalf("%s: %d errors", t.name, t.one.errors)
			}
			slices.Sort(t.one.lat)
			byName[t.name] = t
			b.ReportMetric(µs(t.one.quantile(0.5)), t.name+"_p50_µs")
			b.ReportMetric(µs(t.one.quantile(0.99)), t.name+"_p99_µs")
			if t != direct {
				b.ReportMetric(µs(t.one.quantile(0.5)-direct.one.quantile(0.5)), t.name+"_added_p50_µs")
				b.ReportMetric(µs(t.one.quantile(0.99)-direct.one.quantile(0.99)), t.name+"_added_p99_µs")
			}
		}
		added := func(t *benchTarget) time.Duration { return t.one.quantile(0.5) - direct.one.quantile(0.5) }
		for _, ref := range []string{"nginx", "bare"} {
			if t := byName[ref]; t != nil && added(t) > 0 {
				b.ReportMetric(float64(added(byName["router_proc"]))/float64(added(t)), "router_proc_added_x_"+ref)
				b.ReportMetric(float64(added(byName["router"]))/float64(added(t)), "router_added_x_"+ref)
			}
		}
	}
}

// benchTimes is the measured time per target (SWITCHYARD_BENCH_SECONDS, default 3 s) and
// the number of rounds (SWITCHYARD_BENCH_ROUNDS, default rounds) of the interleaved
// benchmarks.
func benchTimes(rounds int) (time.Duration, int) {
	d := 3 * time.Second
	if s := os.Getenv("SWITCHYARD_BENCH_SECONDS"); s != "" {
		if v, err := time.ParseDuration(s + "s"); err == nil && v > 0 {
			d = v
		}
	}
	if s := os.Getenv("SWITCHYARD_BENCH_ROUNDS"); s != "" {
		if v, err := strconv.Atoi(s); err == nil && v > 0 {
			rounds = v
		}
	}
	return d, rounds
}
