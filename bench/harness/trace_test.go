package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"switchyard/bench/report"
	"switchyard/config"
)

// writeTrace writes a small Mooncake-format trace of 256-token blocks: users conversations
// of turns turns, the first of 6 blocks, each next one extending the previous one by two
// blocks (so a conversation's turns share their prefix), arriving every gap, interleaved.
func writeTrace(t *testing.T, users, turns int, gap time.Duration) string {
	t.Helper()
	var b bytes.Buffer
	next := 0
	hist := make([][]int, users)
	at := time.Duration(0)
	for turn := range turns {
		for u := range users {
			blocks := 2 // each turn adds two blocks to the conversation
			if turn == 0 {
				blocks = 6
			}
			for range blocks {
				hist[u] = append(hist[u], next)
				next++
			}
			ids := jsonInts(hist[u])
			in := 256*len(hist[u]) - 10 // a partial last block
			fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": %s}`+"\n", at.Milliseconds(), in, 4+u%5, ids)
			at += gap
		}
	}
	path := filepath.Join(t.TempDir(), "conversations.jsonl")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func jsonInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// TestTraceEndToEnd replays a small conversation trace under three policies on fresh
// engines and routers: every request is served with the trace's input length on the native
// /generate route, the oracle sees the conversations' reuse, cache_aware reaches most of
// it while round_robin cannot, and the table and chart come out.
func TestTraceEndToEnd(t *testing.T) {
	path := writeTrace(t, 5, 4, 100*time.Millisecond) // 5 users: round robin moves them
	var progress bytes.Buffer
	opts := Options{
		Scenarios: []string{report.ScenarioTrace}, Trace: path, TraceBlockSize: 256, TimeScale: 0.5,
		Policies: mustPolicies("round_robin,load_based,cache_aware"), TraceOracleRow: true,
		Engines: 3, Speedup: 5, Seed: 1, Progress: &progress,
	}
	rep, err := Run(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Scenarios) != 1 {
		t.Fatalf("%d scenarios", len(rep.Scenarios))
	}
	sc := rep.Scenarios[0]
	if sc.Name != report.ScenarioTrace || sc.Workload != "conversations" || sc.TimeBase != report.TimeSimulated ||
		!strings.Contains(sc.Description, "20 requests over 1.9 s") || !strings.Contains(sc.Description, "÷ 0.5") ||
		!strings.Contains(sc.Description, "offered prefill load") || !strings.Contains(sc.Deployment, "/generate") {
		t.Errorf("scenario %q %q: %q / %q", sc.Name, sc.Workload, sc.Description, sc.Deployment)
	}
	if sc.Oracle == nil || sc.Oracle.Requests != 20 || !(sc.Oracle.HitRate > 0.4) {
		t.Fatalf("oracle %+v", sc.Oracle)
	}
	// The oracle on the simulated engines, with the fleet oracle without queues and the
	// pooled bound beside it: the engines' caches hold the whole trace, so the last two agree,
	// and a turn's hit on engines that queue is at most its hit without a queue.
	nq, p := sc.Oracle.NoQueue, sc.Oracle.Pooled
	if nq == nil || p == nil || nq.Requests != 20 || p.Requests != 20 || p.CachedTokens != nq.CachedTokens ||
		sc.Oracle.CachedTokens > nq.CachedTokens || nq.NoQueue != nil || nq.Pooled != nil {
		t.Errorf("no-queue oracle %+v, pooled bound %+v against the oracle %+v", nq, p, sc.Oracle)
	}
	rows := map[string]*report.Row{}
	for i := range sc.Rows {
		r := &sc.Rows[i]
		rows[r.Name] = r
		checkRow(t, r, 20, 3, true)
		// Prompt tokens are the trace's input lengths exactly: 5 users × 4 turns of 6, 8, 10
		// and 12 blocks less 10 tokens.
		if r.Summary.PromptTokens != 5*(256*(6+8+10+12)-4*10) {
			t.Errorf("%s: %d prompt tokens", r.Name, r.Summary.PromptTokens)
		}
		// The replay reports how late it sent the requests.
		if l := r.Summary.SendLate; l == nil || !(l.Max > 0) || l.Max < l.P99 || l.P99 < l.P50 {
			t.Errorf("%s: send lateness %+v", r.Name, l)
		}
	}
	// cache_aware keeps most conversations on their engine, round_robin moves them. What
	// the placement lost is judged by the simulated engines, which follow the placement
	// alone; what a slow host costs on the engines themselves (a turn admitted in one prefill
	// batch with its previous one, or the engine lagging) counts as on holder, not placement.
	rr, ca, op := rows[config.PolicyRoundRobin], rows[config.PolicyCacheAware], rows["oracle placement"]
	if rr.Loss == nil || ca.Loss == nil || op == nil || op.Loss == nil {
		t.Fatalf("rows without their hit loss: %+v", rows)
	}
	moved := func(l *report.HitLoss) int64 { return l.Gone.Tokens + l.Elsewhere.Tokens + l.Queued.Tokens }
	if l := ca.Loss; moved(l) > l.OracleCached*2/5 || moved(rr.Loss) <= moved(l) {
		t.Errorf("cache_aware's placement lost %d of the oracle's %d cached tokens, round_robin's %d",
			moved(l), l.OracleCached, moved(rr.Loss))
	}
	// The router's decisions explain every request cache_aware lost elsewhere or queued;
	// round_robin makes none.
	if l := ca.Loss.Left; l == nil || l.Unrecorded.Requests != 0 ||
		l.Unseen.Requests+l.Slower.Requests+l.Tie.Requests != ca.Loss.Elsewhere.Requests+ca.Loss.Queued.Requests {
		t.Errorf("cache_aware's decisions: %+v against %+v", l, ca.Loss)
	}
	if rr.Loss.Left != nil {
		t.Errorf("round_robin has decision records: %+v", rr.Loss.Left)
	}
	// The oracle placement row sends each request where the oracle's simulation placed it.
	if l := op.Loss; moved(l) != 0 || l.Simulated != sc.Oracle.HitRate {
		t.Errorf("oracle placement: %+v against the oracle %+v", l, sc.Oracle)
	}
	if !strings.Contains(progress.String(), "trace conversations cache_aware") {
		t.Errorf("progress lacks the trace rows:\n%s", progress.String())
	}
	checkRendered(t, rep)
}

// TestTraceChatAndVLLM replays the trace as chat text, and on vLLM-flavoured engines through
// the completions route with token-ID prompts.
func TestTraceChatAndVLLM(t *testing.T) {
	path := writeTrace(t, 3, 2, 400*time.Millisecond) // turns 1.2 s apart: their KV events are in
	for _, tt := range []struct {
		name   string
		chat   bool
		flavor string
		route  string
	}{
		{name: "chat", chat: true, flavor: "sglang", route: "/v1/chat/completions"},
		{name: "vllm", flavor: "vllm", route: "/v1/completions"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rep, err := Run(t.Context(), Options{
				Scenarios: []string{report.ScenarioTrace}, Trace: path, TraceBlockSize: 256, TraceChat: tt.chat,
				TraceMaxOutput: 3, Flavors: []string{tt.flavor}, Policies: mustPolicies("cache_aware"),
				Engines: 2, Speedup: 5, Seed: 1,
			})
			if err != nil {
				t.Fatal(err)
			}
			sc := rep.Scenarios[0]
			if !strings.Contains(sc.Deployment, tt.route) || !strings.Contains(sc.Description, "output capped at 3") {
				t.Errorf("deployment %q description %q", sc.Deployment, sc.Description)
			}
			checkRow(t, &sc.Rows[0], 6, 2, true)
			if m := sc.Rows[0].Summary; m.HitRate <= 0 || m.OutputTokensPerS <= 0 {
				t.Errorf("summary %+v", m)
			}
		})
	}
}

// TestTraceTarget measures a router the test runs itself, as --target does: one row, wall
// time, the oracle from the stated engine count.
func TestTraceTarget(t *testing.T) {
	path := writeTrace(t, 3, 2, 20*time.Millisecond)
	o := Options{Engines: 2, Speedup: 10, Seed: 1}.withDefaults()
	c, err := o.startCluster(t.Context(), clusterSpec{plain: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	cfg := o.routerConfig(c)
	cfg.Models = map[string]config.Model{o.Model: {Buckets: []config.Bucket{plainBucket("all", ids(c.plain), config.Policy{Type: config.PolicyCacheAware})}}}
	r, err := o.startRouter(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	rep, err := Run(t.Context(), Options{Scenarios: []string{report.ScenarioTrace}, Target: r.url, Trace: path,
		TraceBlockSize: 256, TimeScale: 5, Engines: 2, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	sc := rep.Scenarios[0]
	if sc.TimeBase != report.TimeWall || len(sc.Rows) != 1 || sc.Rows[0].Name != "target" || sc.Oracle == nil ||
		!strings.Contains(sc.Deployment, "router at "+r.url) {
		t.Fatalf("scenario %+v", sc)
	}
	// The row names the engines that served (the deployment behind a target is unknown):
	// engines of the cluster, one or both. Which depends on how the requests overlap at the
	// router: three cold conversations that reach it one after another all go to the first
	// engine (cache_aware's tie order), as they do when a loaded host delays them.
	m := sc.Rows[0].Summary
	if m == nil || len(m.Workers) == 0 {
		t.Fatalf("target row names no serving engine: %+v", sc.Rows[0])
	}
	for _, w := range m.Workers {
		if !slices.Contains(ids(c.plain), w.Worker) {
			t.Errorf("serving engine %q is not one of the cluster's %v", w.Worker, ids(c.plain))
		}
	}
	checkRow(t, &sc.Rows[0], 6, len(m.Workers), true)
}

// TestTraceRejects: a missing file and a request larger than the engines' cache are clear
// errors that name what to change.
func TestTraceRejects(t *testing.T) {
	_, err := Run(context.Background(), Options{Scenarios: []string{report.ScenarioTrace}, Trace: filepath.Join(t.TempDir(), "none.jsonl")})
	if err == nil || !strings.Contains(err.Error(), "--trace") {
		t.Errorf("missing trace: %v", err)
	}
	path := writeTrace(t, 2, 2, time.Millisecond)
	_, err = Run(context.Background(), Options{Scenarios: []string{report.ScenarioTrace}, Trace: path, TraceBlockSize: 256, EngineCache: 2048})
	if err == nil || !strings.Contains(err.Error(), "--engine-cache") || !strings.Contains(err.Error(), "trace request 3 needs") {
		t.Errorf("trace larger than the cache: %v", err)
	}
}
