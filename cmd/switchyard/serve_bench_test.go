package main

import (
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/bench/mockengine"
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

// runLoad sends small non-streaming chat requests from conc goroutines for d, each goroutine
// rotating over urls from its own offset, and measures throughput and latency. Every target is
// loaded by this same closed-loop client, in the same process as the engines (and router).
func runLoad(tb testing.TB, urls []string, conc int, d time.Duration) loadResult {
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
				req.SetBodyRaw(benchBody)
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

// startBareProxy runs the reference the router is compared with: a bare fasthttp reverse
// proxy (round robin, request and response copied through, no parsing, selection, metrics
// or deadlines) in front of the engines.
func startBareProxy(tb testing.TB, engineURLs []string) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	clients := make([]*fasthttp.HostClient, len(engineURLs))
	for i, u := range engineURLs {
		clients[i] = &fasthttp.HostClient{Addr: u[len("http://"):], MaxConns: 8192}
	}
	var next atomic.Uint64
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		c := clients[next.Add(1)%uint64(len(clients))]
		req := fasthttp.AcquireRequest()
		resp := fasthttp.AcquireResponse()
		ctx.Request.CopyTo(req)
		req.SetHost(c.Addr)
		if err := c.Do(req, resp); err != nil {
			ctx.Error(err.Error(), fasthttp.StatusBadGateway)
		} else {
			resp.CopyTo(&ctx.Response)
		}
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
	}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	tb.Cleanup(func() {
		_ = srv.Shutdown()
		<-done
		for _, c := range clients {
			c.CloseIdleConnections()
		}
	})
	return "http://" + ln.Addr().String()
}

// benchTarget is one way of reaching the engines.
type benchTarget struct {
	name string
	urls []string
	load loadResult // under concurrent load
	one  loadResult // one request at a time
}

// BenchmarkRouterVsDirect measures, in one run, small non-streaming requests sent to two
// zero-cost mock engines directly, through the router (round_robin over the same engines)
// and through a bare fasthttp proxy (the reference): requests/s and p50/p99 latency of each
// under load (32 concurrent clients), the share of the direct throughput the router and
// the bare proxy keep, and the latency the router adds at p50 one request at a time. A
// fourth target, "limits", is the router with every admission limit (concurrency limits,
// queues, rate limits) configured but never reached: limits_%_of_router is what the idle
// machinery costs. A fifth, "noretry", is the router with retries off (the router target
// has them on, the default): router_%_of_noretry is what the retry machinery costs when
// nothing fails.
//
// Client, engines and proxies share the process and its cores, and every target is measured
// the same way: the same client and request, a warm-up per target, then several short phases
// per target interleaved round by round in rotating order (so that a change in the machine's
// load mid-run hits every target alike); each target's figures pool its phases.
//
// Run it once: go test -run '^$' -bench RouterVsDirect -benchtime 1x ./cmd/switchyard.
// SWITCHYARD_BENCH_SECONDS sets the measured time per target under load (default 3; the
// one-at-a-time phases take half as long) and SWITCHYARD_BENCH_ROUNDS the number of rounds
// (default 3).
func BenchmarkRouterVsDirect(b *testing.B) {
	d := 3 * time.Second
	if s := os.Getenv("SWITCHYARD_BENCH_SECONDS"); s != "" {
		if v, err := time.ParseDuration(s + "s"); err == nil && v > 0 {
			d = v
		}
	}
	rounds := 3
	if s := os.Getenv("SWITCHYARD_BENCH_ROUNDS"); s != "" {
		if v, err := strconv.Atoi(s); err == nil && v > 0 {
			rounds = v
		}
	}
	const conc = 32
	e1 := startMock(b, mockengine.Config{WorkerID: "e1", Model: "bench", ZeroCost: true})
	e2 := startMock(b, mockengine.Config{WorkerID: "e2", Model: "bench", ZeroCost: true})
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
	bareURL := startBareProxy(b, engines)

	b.ResetTimer()
	for range b.N {
		targets := []*benchTarget{
			{name: "direct", urls: engines},
			{name: "router", urls: []string{routerURL}},
			{name: "bare", urls: []string{bareURL}},
			{name: "limits", urls: []string{limitsURL}},
			{name: "noretry", urls: []string{noRetryURL}},
		}
		serial := []*benchTarget{targets[0], targets[1], targets[3], targets[4]}
		for _, t := range targets {
			runLoad(b, t.urls, conc, d/5) // warm-up: connections, pools, heap
		}
		for r := range rounds {
			for i := range targets {
				t := targets[(r+i)%len(targets)]
				t.load.add(runLoad(b, t.urls, conc, d/time.Duration(rounds)))
			}
			// Latency without queueing: one request at a time.
			for i := range serial {
				t := serial[(r+i)%len(serial)]
				t.one.add(runLoad(b, t.urls, 1, d/time.Duration(2*rounds)))
			}
		}
		for _, t := range targets {
			if t.load.errors+t.one.errors > 0 {
				b.Fatalf("%s: %d errors", t.name, t.load.errors+t.one.errors)
			}
			slices.Sort(t.load.lat)
			slices.Sort(t.one.lat)
		}
		direct, router, bare, limits, noretry := targets[0], targets[1], targets[2], targets[3], targets[4]
		µs := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
		b.ReportMetric(direct.load.rps(), "direct_req/s")
		b.ReportMetric(router.load.rps(), "router_req/s")
		b.ReportMetric(bare.load.rps(), "bare_req/s")
		b.ReportMetric(router.load.rps()/direct.load.rps()*100, "router_%_of_direct")
		b.ReportMetric(bare.load.rps()/direct.load.rps()*100, "bare_%_of_direct")
		b.ReportMetric(µs(direct.load.quantile(0.5)), "direct_p50_µs")
		b.ReportMetric(µs(direct.load.quantile(0.99)), "direct_p99_µs")
		b.ReportMetric(µs(router.load.quantile(0.5)), "router_p50_µs")
		b.ReportMetric(µs(router.load.quantile(0.99)), "router_p99_µs")
		b.ReportMetric(µs(bare.load.quantile(0.5)), "bare_p50_µs")
		b.ReportMetric(µs(bare.load.quantile(0.99)), "bare_p99_µs")
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
