package actors

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/valyala/fasthttp"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/load"
)

var telT0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// newTestTelemetry returns a Telemetry driven by clk whose publish ticker never ticks; it
// is closed when the test ends.
func newTestTelemetry(t *testing.T, clk *fakeClock, opts TelemetryOptions) (*Telemetry, *load.Table) {
	t.Helper()
	table := load.NewTable()
	opts.Now = clk.Now
	opts.Ticks = make(chan time.Time)
	tel, err := NewTelemetry(table, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tel.Close)
	return tel, table
}

// publish asks the actor for an unforced publish (what a tick does) and waits for it.
func publish(t *testing.T, tel *Telemetry) *load.Snapshot {
	t.Helper()
	c := newCall[*PublishLoadsResult]()
	r, err := ask(tel, c, &PublishLoads{call: c})
	if err == nil {
		err = r.Err
	}
	if err != nil {
		t.Fatal(err)
	}
	return r.Snapshot
}

func report(running int64, at time.Time) load.RankReport {
	return load.RankReport{
		Fields:         load.HasNative | load.HasRunning | load.HasWaiting | load.HasCapacity,
		Running:        running,
		Waiting:        1,
		MaxTotalTokens: 1000,
		At:             at,
	}
}

// loadsServer is a loopback engine answering GET /v1/loads with a fixed report; every
// request is signalled on hits.
type loadsServer struct {
	*httptest.Server
	hits  chan struct{}
	count atomic.Int64
}

func newLoadsServer(t *testing.T, reps []load.RankReport) *loadsServer {
	t.Helper()
	body, err := json.Marshal(load.NewLoadsBody(telT0, "test", reps))
	if err != nil {
		t.Fatal(err)
	}
	s := &loadsServer{hits: make(chan struct{}, 1024)}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != load.PathLoads {
			http.NotFound(w, r)
			return
		}
		s.count.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
		select {
		case s.hits <- struct{}{}:
		default:
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *loadsServer) awaitHits(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for range n {
		select {
		case <-s.hits:
		case <-deadline:
			t.Fatalf("engine was not polled %d times", n)
		}
	}
}

func TestTelemetryPollsHTTPAndPublishes(t *testing.T) {
	clk := &fakeClock{t: telT0.Add(time.Second)}
	srv := newLoadsServer(t, []load.RankReport{report(3, telT0), {DPRank: 1, Fields: load.HasNative | load.HasRunning | load.HasWaiting | load.HasCapacity, Running: 4, Waiting: 2, MaxTotalTokens: 500, At: telT0}})
	tel, table := newTestTelemetry(t, clk, TelemetryOptions{
		Load: config.LoadSettings{Source: config.LoadSourceHTTP, PollInterval: 5 * time.Millisecond, Freshness: 5 * time.Second},
	})

	counters := new(load.Counters)
	if err := tel.AddWorker(WorkerSource{ID: "W1", URL: srv.URL, DPSize: 2, Counters: counters}); err != nil {
		t.Fatal(err)
	}
	if err := tel.AddWorker(WorkerSource{ID: "W1", URL: srv.URL}); !errors.Is(err, ErrWorkerTracked) {
		t.Fatalf("second AddWorker error = %v, want ErrWorkerTracked", err)
	}
	// The poller delivers a round before it starts the next: after a request the previous
	// round's result is queued ahead of Flush. A round can still fail (each request has the
	// 5 ms interval as its timeout, which a loaded machine misses): wait for the next
	// request until one has delivered reports, for at most 100 rounds.
	srv.awaitHits(t, 1)
	var snap *load.Snapshot
	var err error
	for round := 0; ; round++ {
		srv.awaitHits(t, 1)
		if snap, err = tel.Flush(); err != nil {
			t.Fatal(err)
		}
		if o := snap.Observe("W1", clk.Now()); o.Known() || round == 100 {
			break
		}
	}
	if table.Load() != snap {
		t.Error("Flush did not publish its snapshot into the table")
	}
	obs := snap.Observe("W1", clk.Now())
	if !obs.Native() || obs.Running != 7 || obs.Waiting != 3 || obs.MaxTotalTokens != 1500 || !obs.CapturedAt.Equal(telT0) {
		t.Fatalf("observation = %+v, want the sum of both ranks (running 7, waiting 3, capacity 1500) captured at %v", obs, telT0)
	}
	if st := tel.Stats(); st.Reports == 0 { // a round may have timed out (see above)
		t.Errorf("stats = %+v, want reports", st)
	}
	// Freshness is judged at read time: past the window the worker is unknown.
	if o := snap.Observe("W1", telT0.Add(6*time.Second)); o.Known() {
		t.Errorf("observation past freshness = %+v, want unknown", o)
	}

	if err := tel.RemoveWorker("W1"); err != nil {
		t.Fatal(err)
	}
	// RemoveWorker returned after the poller goroutine ended: no request can follow.
	polled := srv.count.Load()
	if ids := tel.Workers(); len(ids) != 0 {
		t.Errorf("workers after removal = %v, want none", ids)
	}
	snap, err = tel.Flush()
	if err != nil {
		t.Fatal(err)
	}
	if o := snap.Observe("W1", clk.Now()); snap.Len() != 0 || o.Known() {
		t.Errorf("snapshot after removal covers %d workers, want none", snap.Len())
	}
	srv.Close() // waits for any handler still running
	if got := srv.count.Load(); got != polled {
		t.Errorf("engine polled %d times after RemoveWorker returned", got-polled)
	}
	if err := tel.RemoveWorker("W1"); err != nil {
		t.Errorf("removing an unknown worker: %v", err)
	}
}

func TestTelemetryCoalescesPublishes(t *testing.T) {
	clk := &fakeClock{t: telT0}
	tel, table := newTestTelemetry(t, clk, TelemetryOptions{RefreshInterval: time.Second})
	send := func(msg any) { tel.sys.root.Send(tel.pid, msg) }
	publishes := func() uint64 { return tel.Stats().Publishes }

	publish(t, tel) // first build (the clock is past the zero lastBuild)
	base := publishes()
	publish(t, tel)
	if publishes() != base {
		t.Fatal("a clean table was rebuilt within the refresh interval")
	}

	// Worker changes and reports mark the table dirty; one tick publishes them all.
	c := newCall[*AddWorkerResult]()
	if r, err := ask(tel, c, &AddWorker{WorkerID: "W1", DPSize: 1, call: c}); err != nil || r.Err != nil {
		t.Fatal(err, r)
	}
	send(&LoadReported{WorkerID: "W1", Reports: []load.RankReport{report(1, telT0)}})
	send(&LoadReported{WorkerID: "W1", Reports: []load.RankReport{report(2, telT0)}})
	snap := publish(t, tel)
	if publishes() != base+1 {
		t.Fatalf("publishes = %d, want %d (one coalesced rebuild)", publishes(), base+1)
	}
	if o := snap.Observe("W1", telT0); o.Running != 2 || table.Load() != snap {
		t.Fatalf("observation = %+v, want the latest report (running 2) in the table", o)
	}
	publish(t, tel)
	if publishes() != base+1 {
		t.Fatal("the table was rebuilt again without a change")
	}

	// A failed poll is counted and changes nothing.
	send(&LoadReported{WorkerID: "W1", Err: errors.New("connection refused")})
	publish(t, tel)
	if st := tel.Stats(); st.Failures != 1 || st.Publishes != base+1 {
		t.Fatalf("stats = %+v, want 1 failure and no rebuild", st)
	}

	// Past the refresh interval a clean table is rebuilt at the new time.
	clk.Advance(time.Second)
	snap = publish(t, tel)
	if publishes() != base+2 || !snap.At().Equal(telT0.Add(time.Second)) {
		t.Fatalf("publishes = %d at %v, want %d at %v", publishes(), snap.At(), base+2, telT0.Add(time.Second))
	}
}

func TestTelemetryAddWorkerErrors(t *testing.T) {
	clk := &fakeClock{t: telT0}
	tests := []struct {
		name    string
		source  string
		src     WorkerSource
		wantErr error
	}{
		{name: "zmq without a gauge endpoint", source: config.LoadSourceZMQ, src: WorkerSource{ID: "W1", URL: "http://127.0.0.1:1"}, wantErr: ErrNoGaugeEndpoint},
		{name: "http with a bad URL", source: config.LoadSourceHTTP, src: WorkerSource{ID: "W1", URL: "ftp://x"}, wantErr: load.ErrInvalidConfig},
		{name: "auto with a bad gauge endpoint", source: config.LoadSourceAuto, src: WorkerSource{ID: "W1", GaugeEndpoint: "udp://x"}, wantErr: load.ErrInvalidConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tel, _ := newTestTelemetry(t, clk, TelemetryOptions{Load: config.LoadSettings{Source: tt.source}})
			if err := tel.AddWorker(tt.src); !errors.Is(err, tt.wantErr) {
				t.Fatalf("AddWorker error = %v, want %v", err, tt.wantErr)
			}
			if ids := tel.Workers(); len(ids) != 0 {
				t.Errorf("workers = %v after a failed add", ids)
			}
		})
	}
	if _, err := NewTelemetry(load.NewTable(), TelemetryOptions{Load: config.LoadSettings{Source: "carrier-pigeon"}}); err == nil {
		t.Error("NewTelemetry accepted an unknown load source")
	}
}

func TestTelemetryClose(t *testing.T) {
	clk := &fakeClock{t: telT0.Add(time.Second)}
	srv := newLoadsServer(t, []load.RankReport{report(3, telT0)})
	table := load.NewTable()
	tel, err := NewTelemetry(table, TelemetryOptions{
		Load: config.LoadSettings{Source: config.LoadSourceHTTP, PollInterval: 5 * time.Millisecond},
		Now:  clk.Now,
		// The real publish ticker: Close must stop it too.
		PublishInterval: time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Polls are counted as the poller sends them: the engine's own count can still move after
	// Close returned, for a poll sent before it that Close cancelled in flight.
	client := &countingDoer{d: &fasthttp.Client{}}
	t.Cleanup(client.d.CloseIdleConnections)
	if err := tel.AddWorker(WorkerSource{ID: "W1", URL: srv.URL, Client: client}); err != nil {
		t.Fatal(err)
	}
	srv.awaitHits(t, 1)
	tel.Close()
	tel.Close() // idempotent
	polled := client.n.Load()
	srv.Close()
	if got := client.n.Load(); got != polled {
		t.Errorf("engine polled after Close returned: %d polls sent, %d when it returned", got, polled)
	}
	if err := tel.AddWorker(WorkerSource{ID: "W2", URL: srv.URL}); !errors.Is(err, ErrTelemetryClosed) {
		t.Errorf("AddWorker after Close = %v, want ErrTelemetryClosed", err)
	}
	if _, err := tel.Flush(); !errors.Is(err, ErrStopped) || !errors.Is(err, engine.ErrInternal) {
		t.Errorf("Flush after Close = %v, want Internal wrapping ErrStopped", err)
	}
}

// gaugePub is a real ZMQ PUB socket on 127.0.0.1 publishing load gauges.
type gaugePub struct {
	t    *testing.T
	sock zmq4.Socket
	seq  uint64
}

func newGaugePub(t *testing.T) *gaugePub {
	t.Helper()
	sock := zmq4.NewPub(t.Context())
	if err := sock.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatalf("cannot bind PUB: %v", err)
	}
	t.Cleanup(func() { _ = sock.Close() })
	return &gaugePub{t: t, sock: sock}
}

func (p *gaugePub) endpoint() string { return "tcp://" + p.sock.Addr().String() }

func (p *gaugePub) publish(r load.RankReport) {
	p.t.Helper()
	seq := binary.BigEndian.AppendUint64(nil, p.seq)
	p.seq++
	if err := p.sock.Send(zmq4.NewMsgFrom([]byte(load.GaugeTopic), seq, load.AppendGauge(nil, r, true))); err != nil {
		p.t.Fatalf("cannot publish: %v", err)
	}
}

func TestTelemetrySubscribesToEveryGaugeEndpoint(t *testing.T) {
	clk := &fakeClock{t: telT0}
	sys, _ := newObservedSystem(t, nil)
	tel, _ := newTestTelemetry(t, clk, TelemetryOptions{Load: config.LoadSettings{Source: config.LoadSourceAuto}, System: sys})
	if tel.Counters() != sys.Counters() {
		t.Fatal("System option not used")
	}
	pubs := []*gaugePub{newGaugePub(t), newGaugePub(t)} // one publisher per DP rank
	err := tel.AddWorker(WorkerSource{ID: "W1", URL: "http://127.0.0.1:1", DPSize: 2,
		GaugeEndpoint: pubs[0].endpoint(), GaugeEndpoints: []string{pubs[0].endpoint(), pubs[1].endpoint()}})
	if err != nil {
		t.Fatal(err)
	}
	// A subscriber misses what is published before its subscription reaches the publisher
	// (ZMQ's slow joiner): republish until the table shows both ranks, within a deadline.
	deadline := time.After(10 * time.Second)
	pace := time.NewTicker(5 * time.Millisecond)
	defer pace.Stop()
	for {
		for rank, p := range pubs {
			r := report(int64(10*(rank+1)), telT0)
			r.DPRank = rank
			p.publish(r)
		}
		snap, err := tel.Flush()
		if err != nil {
			t.Fatal(err)
		}
		if o := snap.Observe("W1", clk.Now()); o.Known() {
			if o.Running != 30 || !o.Native() {
				t.Fatalf("observation = %+v, want both ranks summed (running 30), native", o)
			}
			break
		}
		select {
		case <-pace.C:
		case <-deadline:
			t.Fatal("no complete report from both gauge endpoints within 10 s")
		}
	}
	if err := tel.RemoveWorker("W1"); err != nil {
		t.Fatal(err)
	}
}

// vllmServer is a loopback engine that speaks only what vLLM serves for load: a Prometheus
// page at /metrics (two DP engines), 404 elsewhere; every /metrics request is signalled on
// hits, every other request counted in others (those to /get_load also in getLoad).
type vllmServer struct {
	*httptest.Server
	hits    chan struct{}
	others  atomic.Int64
	getLoad atomic.Int64
}

func newVLLMServer(t *testing.T) *vllmServer {
	t.Helper()
	page := "# HELP vllm:num_requests_running Number of requests in model execution batches.\n" +
		"# TYPE vllm:num_requests_running gauge\n" +
		`vllm:num_requests_running{model_name="m",engine="0"} 3.0` + "\n" +
		`vllm:num_requests_running{model_name="m",engine="1"} 1.0` + "\n" +
		`vllm:num_requests_waiting{model_name="m",engine="0"} 2.0` + "\n" +
		`vllm:num_requests_waiting{model_name="m",engine="1"} 0.0` + "\n" +
		`vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.5` + "\n" +
		`vllm:kv_cache_usage_perc{model_name="m",engine="1"} 0.25` + "\n" +
		`vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0` + "\n" +
		`vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="100"} 1.0` + "\n"
	s := &vllmServer{hits: make(chan struct{}, 1024)}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			if r.URL.Path == "/get_load" {
				s.getLoad.Add(1)
			}
			s.others.Add(1)
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write([]byte(page))
		select {
		case s.hits <- struct{}{}:
		default:
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// TestTelemetryScrapesVLLM: a worker whose engine has only a Prometheus page gets its load
// from it, in auto mode once both native routes answered 404 (a probe that outlasts the
// poll's timeout, the 25ms interval here, is asked again: it failed, it did not answer
// 404), with flavor vllm at once; once the page is read no native route is asked again.
func TestTelemetryScrapesVLLM(t *testing.T) {
	for _, flavor := range []string{"", config.FlavorVLLM} {
		t.Run("flavor "+flavor, func(t *testing.T) {
			clk := &fakeClock{t: telT0}
			srv := newVLLMServer(t)
			tel, _ := newTestTelemetry(t, clk, TelemetryOptions{
				Load: config.LoadSettings{Source: config.LoadSourceAuto, PollInterval: 25 * time.Millisecond, Freshness: 5 * time.Second},
			})
			if err := tel.AddWorker(WorkerSource{ID: "V1", URL: srv.URL, DPSize: 2, Flavor: flavor, Model: "m"}); err != nil {
				t.Fatal(err)
			}
			var obs load.Observation
			detected := int64(-1) // native probes before the page was first read
			for round := 0; round < 100 && !obs.Known(); round++ {
				select {
				case <-srv.hits:
				case <-time.After(10 * time.Second):
					t.Fatal("the metrics page was not scraped")
				}
				if detected < 0 {
					detected = srv.others.Load()
				}
				snap, err := tel.Flush()
				if err != nil {
					t.Fatal(err)
				}
				obs = snap.Observe("V1", clk.Now())
			}
			if !obs.Native() || obs.Running != 4 || obs.Waiting != 2 || obs.MaxTotalTokens != 3200 || obs.UsedTokens != 1200 {
				t.Fatalf("observation %+v, want both engines summed (running 4, waiting 2, capacity 3200, used 1200)", obs)
			}
			st, ok := tel.Status("V1")
			if !ok || st.Source != load.SourcePrometheus || st.Flavor != load.FlavorVLLM {
				t.Fatalf("status %+v %v", st, ok)
			}
			if err := tel.RemoveWorker("V1"); err != nil {
				t.Fatal(err)
			}
			getLoad, loads := srv.getLoad.Load(), detected-srv.getLoad.Load()
			if flavor == config.FlavorVLLM && detected != 0 {
				t.Fatalf("flavor vllm: %d requests to native load routes, want none", detected)
			}
			if flavor != config.FlavorVLLM && (loads < 1 || getLoad < 1) {
				t.Fatalf("auto: /v1/loads asked %d times and /get_load %d before the page, want both", loads, getLoad)
			}
			if got := srv.others.Load(); got != detected {
				t.Fatalf("%d requests to native load routes after the page was read", got-detected)
			}
		})
	}
}

// countingDoer counts the requests sent through d.
type countingDoer struct {
	d *fasthttp.Client
	n atomic.Int64
}

func (c *countingDoer) DoDeadline(req *fasthttp.Request, resp *fasthttp.Response, deadline time.Time) error {
	c.n.Add(1)
	return c.d.DoDeadline(req, resp, deadline)
}

// TestTelemetryPacesPublishes runs the default publish schedule (no Ticks) on a fake clock:
// a change is published at once when the last publish tick is older than the publish
// interval, changes within the interval wait for its end and are published together, and
// with nothing reported the table is rebuilt once a refresh interval.
func TestTelemetryPacesPublishes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		table := load.NewTable()
		tel, err := NewTelemetry(table, TelemetryOptions{PublishInterval: 20 * time.Millisecond, RefreshInterval: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer tel.Close()
		send := func(msg any) { tel.sys.root.Send(tel.pid, msg) }
		c := newCall[*AddWorkerResult]()
		if r, err := ask(tel, c, &AddWorker{WorkerID: "W1", DPSize: 1, call: c}); err != nil || r.Err != nil {
			t.Fatal(err, r)
		}
		running := func() int64 {
			t.Helper()
			snap := table.Load()
			if snap == nil {
				return -1
			}
			return snap.Observe("W1", time.Now()).Running
		}

		// Idle: the table is rebuilt once a refresh interval (the worker's addition first).
		time.Sleep(10*time.Second + 5*time.Millisecond)
		synctest.Wait()
		if got := tel.Stats().Publishes; got < 10 || got > 11 {
			t.Fatalf("publishes in 10 idle seconds = %d, want 10 or 11 (one per refresh interval)", got)
		}

		// A report long after the last tick is published at once, not at a tick's phase.
		base := tel.Stats().Publishes
		send(&LoadReported{WorkerID: "W1", Reports: []load.RankReport{report(1, time.Now())}})
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := running(); got != 1 {
			t.Fatalf("running = %d 1 ms after the report, want 1 (published at once)", got)
		}
		// Reports within the publish interval wait for its end and are published together.
		send(&LoadReported{WorkerID: "W1", Reports: []load.RankReport{report(2, time.Now())}})
		send(&LoadReported{WorkerID: "W1", Reports: []load.RankReport{report(3, time.Now())}})
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		if got := running(); got != 1 {
			t.Fatalf("running = %d within the publish interval, want 1 (not published yet)", got)
		}
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		if got := running(); got != 3 {
			t.Fatalf("running = %d at the publish interval's end, want 3", got)
		}
		if got := tel.Stats().Publishes - base; got != 2 {
			t.Fatalf("publishes for three reports = %d, want 2 (the first at once, two coalesced)", got)
		}
	})
}
