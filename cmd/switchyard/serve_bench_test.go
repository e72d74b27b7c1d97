package main

import (
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/bench/mockengine"
	"switchyard/config"
)

// loadResult is one measured phase.
type loadResult struct {
	requests int
	errors   int64
	elapsed  time.Duration
	p50, p99 time.Duration
}

func (r loadResult) rps() float64 { return float64(r.requests) / r.elapsed.Seconds() }

// runLoad sends small non-streaming chat requests from conc goroutines for d, rotating over
// urls, and measures throughput and latency.
func runLoad(tb testing.TB, urls []string, conc int, d time.Duration) loadResult {
	tb.Helper()
	client := &fasthttp.Client{MaxConnsPerHost: conc, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	body := []byte(`{"model":"bench","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		all    []time.Duration
		errs   atomic.Int64
		stop   atomic.Bool
		cursor atomic.Uint64
	)
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := fasthttp.AcquireRequest()
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			lat := make([]time.Duration, 0, 1<<14)
			for !stop.Load() {
				req.Reset()
				req.SetRequestURI(urls[cursor.Add(1)%uint64(len(urls))] + "/v1/chat/completions")
				req.Header.SetMethod(fasthttp.MethodPost)
				req.Header.SetContentType("application/json")
				req.SetBody(body)
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
	elapsed := time.Since(start)
	slices.Sort(all)
	r := loadResult{requests: len(all), errors: errs.Load(), elapsed: elapsed}
	if len(all) > 0 {
		r.p50 = all[len(all)/2]
		r.p99 = all[len(all)*99/100]
	}
	return r
}

// BenchmarkRouterVsDirect measures, in one run, small non-streaming requests sent to two
// zero-cost mock engines directly and through the router (round_robin over the same engines):
// requests/s and p50/p99 latency of both, the router's share of the direct throughput and the
// latency it adds at p50, under load (32 concurrent clients) and one request at a time. Run it once: go test -run '^$' -bench RouterVsDirect -benchtime 1x.
// SWITCHYARD_BENCH_SECONDS sets each phase's length (default 3).
func BenchmarkRouterVsDirect(b *testing.B) {
	d := 3 * time.Second
	if s := os.Getenv("SWITCHYARD_BENCH_SECONDS"); s != "" {
		if v, err := time.ParseDuration(s + "s"); err == nil {
			d = v
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

	b.ResetTimer()
	for range b.N {
		runLoad(b, []string{e1.URL(), e2.URL()}, conc, d/5) // warm-up
		direct := runLoad(b, []string{e1.URL(), e2.URL()}, conc, d)
		router := runLoad(b, []string{routerURL}, conc, d)
		// Latency without queueing: one request at a time.
		directSerial := runLoad(b, []string{e1.URL(), e2.URL()}, 1, d/2)
		routerSerial := runLoad(b, []string{routerURL}, 1, d/2)
		if direct.errors+router.errors+directSerial.errors+routerSerial.errors > 0 {
			b.Fatalf("errors: direct %d, router %d", direct.errors+directSerial.errors, router.errors+routerSerial.errors)
		}
		b.ReportMetric(float64(directSerial.p50.Microseconds()), "serial_direct_p50_µs")
		b.ReportMetric(float64(routerSerial.p50.Microseconds()), "serial_router_p50_µs")
		b.ReportMetric(float64(directSerial.p99.Microseconds()), "serial_direct_p99_µs")
		b.ReportMetric(float64(routerSerial.p99.Microseconds()), "serial_router_p99_µs")
		b.ReportMetric(float64((routerSerial.p50 - directSerial.p50).Microseconds()), "serial_added_p50_µs")
		b.ReportMetric(direct.rps(), "direct_req/s")
		b.ReportMetric(router.rps(), "router_req/s")
		b.ReportMetric(router.rps()/direct.rps()*100, "router_%_of_direct")
		b.ReportMetric(float64(direct.p50.Microseconds()), "direct_p50_µs")
		b.ReportMetric(float64(direct.p99.Microseconds()), "direct_p99_µs")
		b.ReportMetric(float64(router.p50.Microseconds()), "router_p50_µs")
		b.ReportMetric(float64(router.p99.Microseconds()), "router_p99_µs")
		b.ReportMetric(float64((router.p50 - direct.p50).Microseconds()), "added_p50_µs")
	}
}
