package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"switchyard/httpfront/heldtest"
)

// processRSS is the resident set of process pid, in bytes (Linux /proc).
func processRSS(b *testing.B, pid int) float64 {
	b.Helper()
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(st), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			if err != nil {
				b.Fatal(line, err)
			}
			return kb * 1024
		}
	}
	b.Fatal("no VmRSS in /proc/pid/status")
	return 0
}

// scrape reads one series of the router's /metrics.
func scrape(b *testing.B, url, series string) float64 {
	b.Helper()
	status, body, err := httpGet(url + "/metrics")
	if err != nil || status != http.StatusOK {
		b.Fatalf("GET /metrics: %d %v", status, err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				b.Fatal(line, err)
			}
			return f
		}
	}
	b.Fatalf("no %s in /metrics", series)
	return 0
}

// heldStreams is the number of streams BenchmarkHeldStreams holds: SWITCHYARD_BENCH_HELD
// (default 10,000), fewer when the open-file limit does not allow two descriptors per
// stream in this process (client and engine side) and in the router's.
func heldStreams(b *testing.B) (n, nofile int) {
	n = 10_000
	if s := os.Getenv("SWITCHYARD_BENCH_HELD"); s != "" {
		if v, err := strconv.Atoi(s); err == nil && v > 0 {
			n = v
		}
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		b.Fatal(err)
	}
	nofile = int(min(rl.Cur, 1<<20))
	if most := (nofile - 256) / 2; n > most {
		b.Logf("holding %d streams, not %d: the open-file limit (%d) allows two descriptors per stream in each process", most, n, nofile)
		n = most
	}
	return n, nofile
}

// BenchmarkHeldStreams measures what held idle streams cost the router: `switchyard serve`
// runs as its own process in front of an engine that answers each stream's headers and one
// event, then holds it; the benchmark opens SWITCHYARD_BENCH_HELD streams (default 10,000,
// bounded by the open-file limit), one after the other, each read up to its first event and
// then left unread. Reported: held_streams, the router's resident set with them all held
// (rss_MB), and per held stream (the growth from one held stream to all) its resident set
// (rss_KB/stream), Go heap allocated (heap_KB/stream: live objects plus garbage not yet
// collected), goroutine stacks (stack_KB/stream) and goroutines (goroutines/stream), from
// /proc and the router's /metrics. With
// SWITCHYARD_BENCH_BASELINE set to another build of switchyard, that binary is measured the
// same way right after (baseline_*): a before/after pair on one machine at one time.
//
//	SWITCHYARD_BENCH_HELD=10000 go test -run '^$' -bench HeldStreams -benchtime 1x ./cmd/switchyard
func BenchmarkHeldStreams(b *testing.B) {
	n, nofile := heldStreams(b)
	bins := []struct{ name, path string }{{"", switchyardBinary(b)}}
	if base := os.Getenv("SWITCHYARD_BENCH_BASELINE"); base != "" {
		bins = append(bins, struct{ name, path string }{"baseline_", base})
	}
	cfgPath := filepath.Join(b.TempDir(), "held.yaml")
	cfg := fmt.Sprintf("server:\n  stream_idle_timeout: 1h\n  request_timeout: 1h\n  max_connections: %d\nupstream:\n  max_conns_per_worker: %d\n", n+64, n+64)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		for _, bin := range bins {
			m := measureHeld(b, bin.path, cfgPath, n, nofile)
			b.ReportMetric(float64(n), "held_streams")
			b.ReportMetric(m.rss/1e6, bin.name+"rss_MB")
			b.ReportMetric(m.perStream[0]/1024, bin.name+"rss_KB/stream")
			b.ReportMetric(m.perStream[1]/1024, bin.name+"heap_KB/stream")
			b.ReportMetric(m.perStream[2]/1024, bin.name+"stack_KB/stream")
			b.ReportMetric(m.perStream[3], bin.name+"goroutines/stream")
		}
	}
}

// heldCost is what n held streams cost a router process: its resident set with all of
// them held, and per stream (the growth from one held stream to n) its resident set, Go heap
// allocated (live objects and garbage not yet collected), goroutine stacks and goroutines.
type heldCost struct {
	rss       float64
	perStream [4]float64
}

// heldGauges are the router's series heldCost reads besides the resident set.
var heldGauges = [...]string{"go_memstats_heap_alloc_bytes", "go_memstats_stack_inuse_bytes", "go_goroutines"}

// measureHeld holds n streams through the router binary bin.
func measureHeld(b *testing.B, bin, cfgPath string, n, nofile int) heldCost {
	b.Helper()
	e := heldtest.NewEngine(b)
	c := startChildBin(b, bin, nofile, "serve", "--host", "127.0.0.1", "--port", "0", "--log-level", "warn",
		"--config", cfgPath, "--worker-urls", e.URL(), "--model", "bench", "--policy", "round_robin")
	url := c.waitLine(b, servingLine)[1]
	waitReady(b, url)
	addr := strings.TrimPrefix(url, "http://")
	pid := c.cmd.Process.Pid
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, cc := range conns {
			_ = cc.Close()
		}
		e.Release()
		c.stop(b)
	}()
	body := `{"model":"bench","messages":[{"role":"user","content":"hold"}],"stream":true}`
	conns = append(conns, heldtest.Open(b, addr, body))
	sample := func() (v [4]float64) {
		v[0] = processRSS(b, pid)
		for i, g := range heldGauges {
			v[i+1] = scrape(b, url, g)
		}
		return v
	}
	one := sample()
	for len(conns) < n {
		conns = append(conns, heldtest.Open(b, addr, body))
	}
	all := sample()
	cost := heldCost{rss: all[0]}
	for i := range all {
		cost.perStream[i] = (all[i] - one[i]) / float64(n-1)
	}
	return cost
}
