package fleet

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/httpfront/internal/loopbench"
)

// BenchmarkDispatchAccounting is a dispatch's lifecycle work on a closed breaker: the Member
// from the pick's worker, Admit, and Done with a success, from parallel goroutines on one
// engine (the contended case).
func BenchmarkDispatchAccounting(b *testing.B) {
	w := engine.NewWorker("A", "http://a", "m", engine.StagePlain, nil)
	m := &Member{f: &Fleet{clock: SystemClock{}}, breaker: NewBreaker(testSettings(), time.Now, w.Counters.Dispatched)}
	w.Handle = m
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			t, ok := MemberOf(w).Admit(t0)
			if !ok {
				b.Fatal("refused")
			}
			t.Done(OutcomeSuccess)
		}
	})
}

// mutexBreaker is the baseline: a breaker behind a mutex, reached by a map lookup by worker
// ID, as dispatch did it before the lifecycle moved to atomics.
type mutexBreaker struct {
	mu       sync.Mutex
	state    BreakerState
	failures int
}

func BenchmarkDispatchAccountingMutexBaseline(b *testing.B) {
	states := map[string]*mutexBreaker{"A": {}}
	w := engine.NewWorker("A", "http://a", "m", engine.StagePlain, nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			st := states[w.ID]
			st.mu.Lock()
			open := st.state == BreakerOpen
			st.mu.Unlock()
			if open {
				b.Fatal("open")
			}
			st.mu.Lock()
			st.failures = 0
			st.mu.Unlock()
		}
	})
}

// engineAnswer is what the loopback engine answers.
var engineAnswer = []byte(`{"id":"c1","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}`)

// benchRoundTrips sends a small chat request to addr through do from 4 goroutines per core.
func benchRoundTrips(b *testing.B, addr string, do func(req *fasthttp.Request, resp *fasthttp.Response, deadline time.Time) error) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	loopbench.RoundTrips(b, 4, func(req *fasthttp.Request) {
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetRequestURI("/v1/chat/completions")
		req.Header.SetHost(addr)
		req.SetBodyRaw(body)
	}, func(req *fasthttp.Request, resp *fasthttp.Response) error {
		return do(req, resp, time.Now().Add(10*time.Second))
	})
}

// BenchmarkUpstreamRoundTrip is one small request through a worker's Upstream (tracked
// connections, the header deadline, the stale-connection check) to a loopback engine.
func BenchmarkUpstreamRoundTrip(b *testing.B) {
	addr := loopbench.Engine(b, engineAnswer)
	set := config.Default().Upstream
	tr := &transport{set: set, dial: defaultDial}
	u := newUpstream(tr, addr, "", false, nil, metrics.NewSet().NewCounter(MetricStaleRetries))
	defer u.CloseIdle()
	benchRoundTrips(b, addr, u.Do)
}

// BenchmarkUpstreamRoundTripBareBaseline is the same request through a bare fasthttp
// HostClient: the baseline.
func BenchmarkUpstreamRoundTripBareBaseline(b *testing.B) {
	addr := loopbench.Engine(b, engineAnswer)
	hc := &fasthttp.HostClient{Addr: addr, MaxConns: 4096, ReadBufferSize: 16 << 10, WriteBufferSize: 16 << 10}
	defer hc.CloseIdleConnections()
	benchRoundTrips(b, addr, hc.DoDeadline)
}

// BenchmarkEngineDeadlines moves an engine connection's deadlines as one request does (the
// write deadline, the read deadline bounded by the response-header deadline, then the
// request's own read deadline once the headers begin) on a loopback TCP connection: on the
// socket itself (conn, the baseline) and through lazyConn (lazy).
func BenchmarkEngineDeadlines(b *testing.B) {
	for _, lazy := range []bool{false, true} {
		name := "conn"
		if lazy {
			name = "lazy"
		}
		b.Run(name, func(b *testing.B) {
			raw := loopbench.Conn(b)
			var c net.Conn = raw
			if lazy {
				c = &lazyConn{Conn: raw}
			}
			b.ReportAllocs()
			for b.Loop() {
				now := time.Now()
				_ = c.SetWriteDeadline(now.Add(time.Minute))
				_ = c.SetReadDeadline(now.Add(30 * time.Second))
				_ = c.SetReadDeadline(now.Add(time.Minute))
			}
		})
	}
}
