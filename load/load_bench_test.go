package load

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
)

// benchAggregator registers n workers of dpSize ranks, each with a fresh report.
func benchAggregator(n, dpSize int, now time.Time) (*Aggregator, []string) {
	a := NewAggregator(time.Minute)
	tr := NewTracker()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "worker-" + strconv.Itoa(i)
		a.SetWorker(ids[i], dpSize, tr.Counters(ids[i]))
		for r := range dpSize {
			a.Ingest(ids[i], nativeRep(r, now, int64(i), 1, 100, 1000, 10))
		}
	}
	return a, ids
}

func BenchmarkObserve(b *testing.B) {
	now := time.Now()
	a, ids := benchAggregator(512, 2, now)
	s := a.Snapshot(now)
	b.Run("known", func(b *testing.B) {
		b.ReportAllocs()
		var sink int64
		i := 0
		for b.Loop() {
			o := s.Observe(ids[i&511], now)
			sink += o.Running
			i++
		}
		_ = sink
	})
	b.Run("stale", func(b *testing.B) {
		b.ReportAllocs()
		later := now.Add(time.Hour)
		for b.Loop() {
			_ = s.Observe(ids[7], later)
		}
	})
	b.Run("absent", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = s.Observe("nobody", now)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		tab := NewTable()
		tab.Store(s)
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				_ = tab.Load().Observe(ids[i&511], now)
				i++
			}
		})
	})
}

func BenchmarkAcquireRelease(b *testing.B) {
	now := time.Now()
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		tr := NewTracker()
		c := tr.Counters("w")
		for b.Loop() {
			tr.Acquire(c, now).Release()
		}
	})
	b.Run("parallel/one-worker", func(b *testing.B) {
		b.ReportAllocs()
		tr := NewTracker()
		c := tr.Counters("w")
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				tr.Acquire(c, now).Release()
			}
		})
	})
	b.Run("parallel/many-workers", func(b *testing.B) {
		b.ReportAllocs()
		tr := NewTracker()
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			c := tr.Counters(fmt.Sprint("w", next.Add(1)))
			for pb.Next() {
				tr.Acquire(c, now).Release()
			}
		})
	})
	// Baseline: the bare atomic counter updates with no guard.
	b.Run("baseline-atomics", func(b *testing.B) {
		b.ReportAllocs()
		var c Counters
		ns := now.UnixNano()
		for b.Loop() {
			c.inflight.Add(1)
			c.dispatched.Add(1)
			c.lastDispatch.Store(ns)
			c.inflight.Add(-1)
		}
	})
}

// BenchmarkBufferedGuard is a non-streamed request's guard on its engine, as the router
// holds it: acquired at dispatch, with its expected first token registered when the
// engine has an estimate (estimate) or not (none), FirstToken and Release at the answer;
// inflight other requests of the engine wait for their answers meanwhile, each expecting its
// first token (inflight=32 fills the engine's table of expected first tokens). The guard is
// allocated (AcquirePrefill, the baseline) or in the caller's storage, reused
// (AcquirePrefillInto, /own: as the router holds a buffered answer's).
func BenchmarkBufferedGuard(b *testing.B) {
	now := time.Now()
	for _, inflight := range []int{0, 32} {
		for _, est := range []bool{false, true} {
			for _, own := range []bool{false, true} {
				name := fmt.Sprintf("inflight=%d/none", inflight)
				if est {
					name = fmt.Sprintf("inflight=%d/estimate", inflight)
				}
				if own {
					name += "/own"
				}
				b.Run(name, func(b *testing.B) {
					b.ReportAllocs()
					tr := NewTracker()
					c := tr.Counters("w")
					for i := range inflight {
						g := tr.AcquirePrefill(c, now, 16)
						g.FirstTokenAt(now.Add(time.Hour + time.Duration(i)))
						defer g.Release()
					}
					var storage Guard
					for b.Loop() {
						var g *Guard
						if own {
							g = tr.AcquirePrefillInto(&storage, c, now, 16)
						} else {
							g = tr.AcquirePrefill(c, now, 16)
						}
						if est {
							g.FirstTokenAt(now.Add(time.Millisecond))
						}
						g.FirstToken(now)
						g.Release()
					}
				})
			}
		}
	}
}

func BenchmarkSnapshot(b *testing.B) {
	now := time.Now()
	for _, n := range []int{8, 64, 512} {
		b.Run(fmt.Sprintf("workers=%d/unchanged", n), func(b *testing.B) {
			b.ReportAllocs()
			a, _ := benchAggregator(n, 1, now)
			for b.Loop() {
				_ = a.Snapshot(now)
			}
		})
		b.Run(fmt.Sprintf("workers=%d/all-changed", n), func(b *testing.B) {
			b.ReportAllocs()
			a, ids := benchAggregator(n, 1, now)
			r := nativeRep(0, now, 1, 1, 100, 1000, 10)
			for b.Loop() {
				for _, id := range ids {
					a.Ingest(id, r)
				}
				_ = a.Snapshot(now)
			}
		})
	}
}

func BenchmarkIngest(b *testing.B) {
	b.ReportAllocs()
	now := time.Now()
	a, _ := benchAggregator(1, 1, now)
	r := nativeRep(0, now, 1, 1, 100, 1000, 10)
	r.HasCounters = true
	for b.Loop() {
		r.TotalPrefillUncached += 100
		r.TotalPrefillBusyUs += 10
		a.Ingest("worker-0", r)
	}
}

func BenchmarkDecode(b *testing.B) {
	now := time.Now()
	loads := []byte(`{"timestamp":1772366409.5,"version":"0.5","loads":[` + nativeRank0 + `]}`)
	getLoad := []byte(`[{"dp_rank":0,"num_reqs":5,"num_waiting_reqs":2,"num_tokens":900}]`)
	gauge := AppendGauge(nil, nativeRep(0, now, 3, 2, 1500, 100000, 64), true)
	b.Run("loads", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeLoads(loads, now); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("get_load", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeGetLoad(getLoad, now); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("gauge", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeGauge(gauge, now); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("append-gauge", func(b *testing.B) {
		b.ReportAllocs()
		r := nativeRep(0, now, 3, 2, 1500, 100000, 64)
		buf := make([]byte, 0, 64)
		for b.Loop() {
			buf = AppendGauge(buf[:0], r, true)
		}
	})
}

// BenchmarkDecodePrometheus reads a vLLM /metrics page of 343 series (process, HTTP and
// vLLM metrics, one engine). Baselines beside it: the native /v1/loads body of one rank
// (DecodeLoads, what an SGLang poll costs) and the same page fully parsed by expfmt with no
// line filter (what the decoder saves by dropping the lines it does not read).
func BenchmarkDecodePrometheus(b *testing.B) {
	page := readTestdata(b, "vllm_metrics.txt")
	b.Run("vllm_page", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(page)))
		for b.Loop() {
			if _, _, err := DecodePrometheus(page, "", recvAt); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("baseline_expfmt_whole_page", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(page)))
		for b.Loop() {
			var p expfmt.TextParser
			if _, err := p.TextToMetricFamilies(bytes.NewReader(page)); err != nil {
				b.Fatal(err)
			}
		}
	})
	body := []byte(`{"timestamp":1772366409.5,"version":"0.5","loads":[` + nativeRank0 + `]}`)
	b.Run("baseline_v1_loads", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeLoads(body, recvAt); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkPollPrometheus is one whole scrape over loopback HTTP (request, a 36 KB vLLM
// page, decode), beside a /v1/loads poll of one rank as the baseline. The engine side runs
// in the same process, so the figure is an upper bound of the router's share.
func BenchmarkPollPrometheus(b *testing.B) {
	page := readTestdata(b, "vllm_metrics.txt")
	loads := []byte(`{"timestamp":null,"version":"0.5","loads":[` + nativeRank0 + `]}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == DefaultMetricsPath {
			_, _ = w.Write(page)
			return
		}
		_, _ = w.Write(loads)
	}))
	b.Cleanup(srv.Close)
	for _, bc := range []struct {
		name string
		mode PollMode
	}{{"prometheus", PollPrometheus}, {"baseline_v1_loads", PollNative}} {
		b.Run(bc.name, func(b *testing.B) {
			p, err := NewPoller(PollerConfig{WorkerID: "w", URL: srv.URL, Mode: bc.mode, Timeout: 5 * time.Second,
				Deliver: func(string, []RankReport, error) {}})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(p.own.CloseIdleConnections)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.Poll(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEstimate is the SLO estimate of one engine, as a bucket ordering makes it for
// every candidate, beside its baseline: the snapshot read every pick already makes.
func BenchmarkEstimate(b *testing.B) {
	now := time.Now()
	a := NewAggregator(time.Minute)
	tr := NewTracker()
	c := tr.Counters("w")
	a.SetWorker("w", 1, c)
	a.Ingest("w", nativeRep(0, now, 8, 3, 5000, 100000, 4000))
	tab := NewTable()
	tab.Store(a.Snapshot(now))
	c.Rates().Prefill.Observe(5000, 0.25)
	c.Rates().Decode.Observe(9, 0.009)
	b.Run("baseline-observe", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = tab.Load().Observe("w", now)
		}
	})
	b.Run("observe+estimate", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			o := tab.Load().Observe("w", now)
			_, _ = EstimateTTFT(&o, c, 1000, now)
			_, _ = EstimateTPOT(&o, c)
		}
	})
	// A dispatch's estimates as the router makes them (httpfront's sloStart): the prefill
	// work and decode load, kept for what a stream learns, and the estimates at them. The
	// baseline computes the work and load again inside EstimateTTFT and EstimateTPOT.
	b.Run("dispatch/baseline-twice", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			o := tab.Load().Observe("w", now)
			_ = PrefillWork(&o, c, 1000, now)
			_, _ = EstimateTTFT(&o, c, 1000, now)
			_ = DecodeLoad(&o, c)
			_, _ = EstimateTPOT(&o, c)
		}
	})
	b.Run("dispatch/once", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			o := tab.Load().Observe("w", now)
			work := PrefillWork(&o, c, 1000, now)
			_, _ = EstimateTTFTAtWork(&o, c, work)
			_, _ = EstimateTPOTAtLoad(c, DecodeLoad(&o, c))
		}
	})
	b.Run("learn", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c.Rates().Prefill.Observe(5000, 0.25)
			c.Rates().Decode.Observe(9, 0.009)
		}
	})
	b.Run("acquire-prefill", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			g := tr.AcquirePrefill(c, now, 1000)
			g.FirstToken(now)
			g.Release()
		}
	})
}
