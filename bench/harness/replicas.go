package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"switchyard/bench/loadgen"
	"switchyard/bench/report"
	"switchyard/bench/workload"
)

// The replicas scenario: router processes (the switchyard binary, Options.ReplicaCommand)
// in front of one fleet of in-process mock engines, session_aware with
// affinity.prefix_rebind, the multi_turn workload with every turn sent to a replica chosen
// at random (an L4 balancer). Rows: one router (the baseline); Replicas routers as one
// cluster; the same with one replica stopped gracefully (SIGTERM) a third of the way through
// and another killed (SIGKILL) two thirds of the way through. The balancer stops sending to
// a replica the moment it is stopped or killed, as a balancer that follows readiness would
// shortly after.

// Bounds of the replicas scenario's waits.
const (
	replicaStartTimeout = 60 * time.Second
	replicaStopTimeout  = 30 * time.Second
	// replicaStderrTail is how much of a replica's stderr is kept for error messages.
	replicaStderrTail = 8 << 10
)

// replicas runs the replicas scenario.
func (h *harness) replicas(ctx context.Context) ([]*report.Scenario, error) {
	o := &h.opts
	wl, err := workload.Build(workload.NameMultiTurn, o.Workload, o.Seed)
	if err != nil {
		return nil, err
	}
	sc := &report.Scenario{
		Name: report.ScenarioReplicas, Workload: wl.Name, Description: wl.Description,
		TimeBase: report.TimeSimulated, Speedup: o.Speedup,
		Deployment: h.plainDeployment(o.Engines) + "; routers: switchyard processes, session_aware with affinity.prefix_rebind, " +
			"each turn sent to a router chosen at random; " + h.arrivals(),
	}
	n := o.Replicas
	rows := []struct {
		name        string
		replicas    int
		stop, crash bool
	}{
		{name: "1 router", replicas: 1},
		{name: fmt.Sprintf("%d replicas", n), replicas: n},
		{name: fmt.Sprintf("%d, stop + crash", n), replicas: n, stop: n >= 3, crash: true},
	}
	for _, rs := range rows {
		row, err := h.replicaRow(ctx, wl, rs.name, rs.replicas, rs.stop, rs.crash)
		if err != nil {
			return []*report.Scenario{sc}, err
		}
		sc.Rows = append(sc.Rows, row)
	}
	if base := sc.Rows[0].Summary; base != nil && base.HitRate > 0 {
		for i := range sc.Rows {
			if r := &sc.Rows[i]; r.Summary != nil && r.Replicas != nil {
				r.Replicas.HitRateVsSingle = r.Summary.HitRate / base.HitRate
			}
		}
	}
	sc.Notes = append(sc.Notes,
		"AGREE is the share of turns (after a session's first) served by the engine of the session's previous turn; after crash counts the turns sent after the kill",
		"ERR excludes the requests in flight on the crashed router when it was killed (on crashed); CPU is each router process's user+system time from the start of the run to its exit (start-up and warm-up excluded, drain included) per 1,000 requests it was sent; engines and load generator run in the bench process and are excluded",
		"on a machine with fewer cores than routers + engines the routers share CPUs: compare CPU per request, not throughput")
	return []*report.Scenario{sc}, nil
}

// replicaRow measures one row on fresh engines and fresh router processes.
func (h *harness) replicaRow(ctx context.Context, wl *workload.Workload, name string, n int, stop, crash bool) (row report.Row, err error) {
	o := &h.opts
	row.Name = name
	c, err := o.startCluster(ctx, clusterSpec{plain: o.Engines})
	if err != nil {
		return row, err
	}
	defer func() { err = errors.Join(err, c.close()) }()
	procs, err := h.startReplicaProcs(ctx, c, n)
	defer func() { err = errors.Join(err, stopReplicaProcs(procs)) }()
	if err != nil {
		return row, err
	}
	if err := warmReplicas(ctx, c, procs, o.Model); err != nil {
		return row, err
	}

	limit := len(wl.Requests)
	if o.Requests > 0 {
		limit = min(limit, o.Requests)
	}
	b := newBalancer(procs, limit, o.Seed)
	var events []string
	var evMu sync.Mutex
	logEvent := func(s string) {
		evMu.Lock()
		events = append(events, s)
		evMu.Unlock()
	}
	crashAt := -1
	if stop {
		b.at(limit/3, func(i int) {
			p := procs[n-1]
			b.remove(n - 1)
			logEvent(fmt.Sprintf("stopped %s (SIGTERM) at request %d", p.name, i))
			go func() { _ = p.cmd.Process.Signal(syscall.SIGTERM) }()
		})
	}
	if crash && n >= 2 {
		crashAt = 2 * limit / 3
		b.at(crashAt, func(i int) {
			p := procs[1]
			b.remove(1)
			logEvent(fmt.Sprintf("killed %s (SIGKILL) at request %d", p.name, i))
			go func() { _ = p.cmd.Process.Kill() }()
		})
	}
	urls := make([]string, len(procs))
	cpu0 := make([]time.Duration, len(procs)) // CPU before the run: start-up and warm-up excluded
	for i, p := range procs {
		urls[i] = p.url
		cpu0[i], _ = childCPU(p.cmd.Process.Pid)
	}
	m, err := h.measure(ctx, load{
		label: o.flavorPrefix() + "replicas " + name, urls: urls, route: b.route, reqs: wl.Requests,
		stream: !o.NoStream, simulated: true, concurrency: h.concurrency(DefaultConcurrency),
		maxRequests: o.Requests, duration: o.Duration,
	})
	if err != nil {
		return row, err
	}
	if err := stopReplicaProcs(procs); err != nil {
		return row, err
	}
	row.Summary = report.Summarize(m.Results, report.SummaryOptions{Workers: ids(c.plain), TimeScale: o.Speedup, Elapsed: m.Elapsed})
	row.Truncated = m.Truncated
	f := &report.ReplicaFigures{Replicas: n, AgreementAfterCrash: -1, Events: events}
	f.Agreement, f.AgreementAfterCrash = agreement(wl.Requests, m.Results, crashAt)
	sent := make([]int, n)
	for i := range m.Results {
		r := &m.Results[i]
		k := b.chosen(r.Index)
		if k >= 0 {
			sent[k]++
		}
		if !r.OK() {
			// Nothing is sent to the crashed replica after the kill: its failures are the
			// requests in flight on it.
			if crashAt >= 0 && k == 1 {
				f.CrashErrors++
			} else {
				f.OtherErrors++
			}
		}
	}
	for k, p := range procs {
		cpu := -1.0
		if p.state != nil && sent[k] > 0 {
			used := p.state.UserTime() + p.state.SystemTime() - cpu0[k]
			cpu = used.Seconds() / float64(sent[k]) * 1000
		}
		f.CPUSecondsPer1K = append(f.CPUSecondsPer1K, cpu)
	}
	row.Replicas = f
	return row, nil
}

// agreement is the share of turns after each session's first that landed on the engine of
// the session's previous successful turn, over every turn and over those sent at or after
// index from (-1 when from < 0).
func agreement(reqs []workload.Request, results []loadgen.Result, from int) (all, after float64) {
	prev := map[string]string{}
	var n, same, nAfter, sameAfter int
	for i := range results { // ordered by index: a session's turns in order
		r := &results[i]
		if r.Index >= len(reqs) || !r.OK() || r.Worker == "" {
			continue
		}
		s := reqs[r.Index].SessionID
		if p, ok := prev[s]; ok {
			n++
			if p == r.Worker {
				same++
			}
			if from >= 0 && r.Index >= from {
				nAfter++
				if p == r.Worker {
					sameAfter++
				}
			}
		}
		prev[s] = r.Worker
	}
	all, after = 1, -1
	if n > 0 {
		all = float64(same) / float64(n)
	}
	if from >= 0 {
		after = 1
		if nAfter > 0 {
			after = float64(sameAfter) / float64(nAfter)
		}
	}
	return all, after
}

// balancer spreads requests over the live replicas at random (a seeded hash of the request
// index), records each request's replica, and fires the row's mid-run events when their
// request is sent.
type balancer struct {
	urls   []string
	live   atomic.Pointer[[]int]
	picks  []atomic.Int32 // replica of each request index, -1 until sent
	seed   uint64
	mu     sync.Mutex // guards events
	events []balancerEvent
}

type balancerEvent struct {
	at   int
	fire func(i int)
	done bool
}

func newBalancer(procs []*replicaProc, limit int, seed uint64) *balancer {
	b := &balancer{urls: make([]string, len(procs)), picks: make([]atomic.Int32, limit), seed: seed}
	live := make([]int, len(procs))
	for i, p := range procs {
		b.urls[i] = p.url
		live[i] = i
	}
	b.live.Store(&live)
	for i := range b.picks {
		b.picks[i].Store(-1)
	}
	return b
}

// at makes fire run when request i is sent (before it is routed).
func (b *balancer) at(i int, fire func(i int)) {
	b.events = append(b.events, balancerEvent{at: i, fire: fire})
}

// remove takes replica k out of the rotation.
func (b *balancer) remove(k int) {
	cur := *b.live.Load()
	next := slices.DeleteFunc(slices.Clone(cur), func(v int) bool { return v == k })
	if len(next) > 0 {
		b.live.Store(&next)
	}
}

// route implements loadgen.Config.Route.
func (b *balancer) route(i int) string {
	b.mu.Lock()
	for k := range b.events {
		if e := &b.events[k]; !e.done && i >= e.at {
			e.done = true
			e.fire(i)
		}
	}
	b.mu.Unlock()
	live := *b.live.Load()
	k := live[mix(b.seed, uint64(i))%uint64(len(live))]
	if i >= 0 && i < len(b.picks) {
		b.picks[i].Store(int32(k))
	}
	return b.urls[k]
}

// chosen is the replica request i was sent to, or -1.
func (b *balancer) chosen(i int) int {
	if i < 0 || i >= len(b.picks) {
		return -1
	}
	return int(b.picks[i].Load())
}

// mix is SplitMix64 of seed and i: a fixed pseudo-random choice per request.
func mix(seed, i uint64) uint64 {
	z := seed + (i+1)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// replicaProc is one router process.
type replicaProc struct {
	name   string
	url    string
	cmd    *exec.Cmd
	stderr *tailWriter
	done   chan struct{} // closed once the process has exited
	state  *os.ProcessState
}

// replicaStartAttempts bounds startReplicaProcs's tries with fresh ports.
const replicaStartAttempts = 3

// startReplicaProcs starts n router processes in front of c (as one automanaged cluster
// when n > 1) and waits until each is ready and, in a cluster, sees every member. It
// returns the processes started so far with any error. A port freePorts chose can be taken
// by another process (any socket bound to port 0) before the router binds it: the router
// then exits, and the start is tried again with fresh ports (bounded).
func (h *harness) startReplicaProcs(ctx context.Context, c *cluster, n int) ([]*replicaProc, error) {
	for attempt := 1; ; attempt++ {
		procs, err := h.startReplicaProcsOnce(ctx, c, n)
		if err == nil || attempt == replicaStartAttempts || !slices.ContainsFunc(procs, portTaken) {
			return procs, err
		}
		if err := stopReplicaProcs(procs); err != nil {
			return nil, err
		}
	}
}

// portTaken reports whether p exited because its port was taken.
func portTaken(p *replicaProc) bool {
	select {
	case <-p.done:
		return strings.Contains(p.stderr.String(), "address already in use")
	default:
		return false
	}
}

// waitProcReady is WaitReady for p polling every period for at most timeout, ending early
// (with p's exit) when p exits.
func waitProcReady(ctx context.Context, p *replicaProc, period, timeout time.Duration) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-p.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := waitReady(ctx, p.url, timeout, period)
	select {
	case <-p.done:
		return fmt.Errorf("router at %s exited before it was ready: %v", p.url, p.state)
	default:
		return err
	}
}

// startReplicaProcsOnce is one try of startReplicaProcs.
func (h *harness) startReplicaProcsOnce(ctx context.Context, c *cluster, n int) ([]*replicaProc, error) {
	o := &h.opts
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "switchyard-replicas-")
	if err != nil {
		return nil, fmt.Errorf("cannot start replicas: %w", err)
	}
	defer os.RemoveAll(dir)
	var procs []*replicaProc
	for i := range n {
		p, err := o.startRouterProc(dir, "r"+strconv.Itoa(i), ports[i], o.replicaConfig(c, ports, n, i))
		if err != nil {
			return procs, err
		}
		procs = append(procs, p)
	}
	for _, p := range procs {
		if err := waitProcReady(ctx, p, readyPoll, replicaStartTimeout); err != nil {
			return procs, fmt.Errorf("replica %s: %w; stderr: %s", p.name, err, p.stderr.String())
		}
	}
	if n > 1 {
		for _, p := range procs {
			if err := waitMetric(ctx, p.url, "switchyard_cluster_members", func(v float64) bool { return v == float64(n) }); err != nil {
				return procs, fmt.Errorf("replica %s never saw %d members: %w; stderr: %s", p.name, n, err, p.stderr.String())
			}
		}
	}
	return procs, nil
}

// startRouterProc starts one router process (Options.ReplicaCommand) serving on port with
// the configuration conf (YAML, written into dir); the caller waits for it to be ready and
// stops it (stopReplicaProcs).
func (o *Options) startRouterProc(dir, name string, port int, conf string) (*replicaProc, error) {
	return o.startWrappedRouterProc(nil, dir, name, port, conf)
}

// startWrappedRouterProc is startRouterProc with the router run by wrap (a program and its
// arguments, such as valgrind's) when wrap is not empty.
func (o *Options) startWrappedRouterProc(wrap []string, dir, name string, port int, conf string) (*replicaProc, error) {
	path := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		return nil, fmt.Errorf("cannot start router %s: %w", name, err)
	}
	command := append(slices.Clone(wrap), o.ReplicaCommand...)
	args := append(command[1:], "--config", path)
	p := &replicaProc{name: name, url: fmt.Sprintf("http://127.0.0.1:%d", port),
		stderr: &tailWriter{max: replicaStderrTail}, done: make(chan struct{})}
	p.cmd = exec.Command(command[0], args...)
	p.cmd.Stdout = io.Discard
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("cannot start router %s: %w", name, err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.state = p.cmd.ProcessState
		close(p.done)
	}()
	return p, nil
}

// routerProcConfig is the start of a router process's configuration (YAML): the server on
// port, warnings only, the load poll and block size of the in-process router
// (Options.routerConfig; a quiet cluster's polls and health checks quietInterval apart),
// and c's workers. The caller adds the models.
func (o *Options) routerProcConfig(c *cluster, port int) *strings.Builder {
	var b strings.Builder
	fmt.Fprintf(&b, "server: {host: 127.0.0.1, port: %d, drain_timeout: 10s, request_timeout: %s}\n", port, o.RequestTimeout)
	b.WriteString("log: {level: warn}\n")
	if c.quiet {
		fmt.Fprintf(&b, "load: {poll_interval: %s, freshness: %s}\n", quietInterval, 2*quietInterval)
		fmt.Fprintf(&b, "health: {interval: %s}\n", quietInterval)
	} else {
		fmt.Fprintf(&b, "load: {poll_interval: %s}\n", gaugeInterval)
	}
	fmt.Fprintf(&b, "kv: {block_size: %d}\n", o.PageSize)
	b.WriteString("workers:\n")
	for _, w := range c.workers(o.Model) {
		wj, _ := json.Marshal(map[string]any{"id": w.ID, "url": w.URL, "model": w.Model, "role": string(w.Role), "dp_size": 1,
			"flavor": string(w.Flavor), "kv_events": w.KVEvents})
		fmt.Fprintf(&b, "  - %s\n", cleanJSONFlow(wj))
	}
	return &b
}

// plainModelYAML adds the models section: o.Model on one plain bucket over c's plain
// engines under policy.
func (o *Options) plainModelYAML(b *strings.Builder, c *cluster, policy string) {
	idList, _ := json.Marshal(ids(c.plain))
	fmt.Fprintf(b, "models:\n  %q:\n    buckets:\n      - {id: all, groups: {plain: {worker_ids: %s, policy: {type: %s}}}}\n", o.Model, idList, policy)
}

// replicaConfig is replica i's configuration file (YAML).
func (o *Options) replicaConfig(c *cluster, ports []int, n, i int) string {
	b := o.routerProcConfig(c, ports[i])
	b.WriteString("affinity: {prefix_rebind: true}\n")
	// A session's conversation is a prefix of a few blocks at least.
	fmt.Fprintf(b, "cache_aware: {min_matched_tokens: %d}\n", 4*o.PageSize)
	o.plainModelYAML(b, c, "session_aware")
	if n > 1 {
		members := make([]string, n)
		for k := range n {
			members[k] = fmt.Sprintf("127.0.0.1:%d", ports[n+k])
		}
		// The cluster's intervals and timeouts are the defaults: their CPU cost is part of
		// what the scenario measures.
		fmt.Fprintf(b, "cluster: {enabled: true, name: bench-%d, listen: \"127.0.0.1:0\", provider: automanaged, provider_port: %d, members: [%s]}\n",
			ports[0], ports[n+i], strings.Join(members, ", "))
	}
	return b.String()
}

// cleanJSONFlow drops the empty fields of a worker's JSON object (YAML reads JSON as a flow
// mapping).
func cleanJSONFlow(j []byte) string {
	var m map[string]any
	_ = json.Unmarshal(j, &m)
	for k, v := range m {
		if s, ok := v.(string); ok && s == "" {
			delete(m, k)
		}
	}
	out, _ := json.Marshal(m)
	return string(out)
}

// warmReplicas sends requests straight to the engines until every replica's prefix index
// has every engine: a KV-event subscriber misses what is published before it joins.
func warmReplicas(ctx context.Context, c *cluster, procs []*replicaProc, model string) error {
	ctx, cancel := context.WithTimeout(ctx, replicaStartTimeout)
	defer cancel()
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	want := float64(len(c.plain))
	for k := 0; ; k++ {
		all := true
		for _, p := range procs {
			v, ok := metricOf(ctx, client, p.url, "switchyard_kv_index_owners")
			all = all && ok && v >= want
		}
		if all {
			return nil
		}
		for _, e := range c.plain {
			body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"warm-up %d of %s"}],"max_tokens":1}`, model, k, e.WorkerID())
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/v1/chat/completions", strings.NewReader(body))
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			if resp, err := client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the routers' prefix indexes never saw every engine's KV events: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stopReplicaProcs stops every process still running: SIGTERM to all at once, then SIGKILL
// to any still running replicaStopTimeout later. It waits for each.
func stopReplicaProcs(procs []*replicaProc) error {
	var running []*replicaProc
	for _, p := range procs {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			running = append(running, p)
		}
	}
	var errs []error
	deadline := time.NewTimer(replicaStopTimeout)
	defer deadline.Stop()
	for _, p := range running {
		select {
		case <-p.done:
		case <-deadline.C:
			deadline.Reset(0) // the others get no more time either
			_ = p.cmd.Process.Kill()
			<-p.done
			errs = append(errs, fmt.Errorf("replica %s did not stop within %v; stderr: %s", p.name, replicaStopTimeout, p.stderr.String()))
		}
	}
	return errors.Join(errs...)
}

// waitMetric polls series on base's /metrics until ok holds, for at most
// replicaStartTimeout.
func waitMetric(ctx context.Context, base, series string, ok func(float64) bool) error {
	ctx, cancel := context.WithTimeout(ctx, replicaStartTimeout)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	for {
		if v, found := metricOf(ctx, client, base, series); found && ok(v) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// metricOf reads one series of base's /metrics (at most 4 MiB).
func metricOf(ctx context.Context, client *http.Client, base, series string) (float64, bool) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return 0, false
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return 0, false
	}
	for _, line := range bytes.Split(raw, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte(series+" ")); ok {
			f, err := strconv.ParseFloat(string(bytes.TrimSpace(v)), 64)
			return f, err == nil
		}
	}
	return 0, false
}

// freePorts returns n loopback ports the OS chose (the automanaged membership provider
// needs every replica's port before any starts).
func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	out := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("cannot reserve a port: %w", err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// tailWriter keeps the last max bytes written to it.
type tailWriter struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if len(w.buf) > w.max {
		w.buf = append(w.buf[:0], w.buf[len(w.buf)-w.max:]...)
	}
	return len(p), nil
}

func (w *tailWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.buf)
}
