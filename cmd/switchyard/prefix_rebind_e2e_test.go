package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"switchyard/bench/mockengine"
	"switchyard/config"
)

// postSession sends one chat turn of session through base and returns the engine that
// served it.
func postSession(t *testing.T, base, session string, msgs []cacheMessage) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": cacheModel, "messages": msgs, "max_tokens": 1})
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-session-id", session)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("session %s: status %d: %s", session, resp.StatusCode, raw)
	}
	return resp.Header.Get("X-Switchyard-Worker")
}

// selectionsBy sums switchyard_selections_total over every series with reason.
func selectionsBy(t *testing.T, base, reason string) float64 {
	t.Helper()
	_, body, err := httpGet(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "switchyard_selections_total{") || !strings.Contains(line, `reason="`+reason+`"`) {
			continue
		}
		f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		sum += f
	}
	return sum
}

// TestAffinityLostBindingReturnsToPrefixHolder: with affinity.prefix_rebind, a session whose
// binding is gone (here evicted: affinity.max_bindings is 1, so each new session evicts the
// previous one's binding, as a crashed replica loses its partitions' bindings) is bound
// again to the engine that still caches its conversation, which the router's KV-event index
// knows, instead of wherever the power_of_two fallback would send it.
func TestAffinityLostBindingReturnsToPrefixHolder(t *testing.T) {
	engines := make([]*mockengine.Engine, 4)
	for i := range engines {
		engines[i] = kvEngine(t, cacheModel, "E"+strconv.Itoa(i))
	}
	cfg := cacheRouterConfig(engines)
	cfg.Models[cacheModel].Buckets[0].Groups.Plain.Policy = &config.Policy{Type: config.PolicySessionAware}
	cfg.Affinity.PrefixRebind = true
	cfg.Affinity.MaxBindings = 1
	r := startCacheRouter(t, cfg)
	env := &cacheEnv{routers: []*cacheRouter{r}, kvMetrics: r.base + "/metrics", engines: byID(engines)}
	for _, e := range engines {
		warmSubscription(t, env, e, e.WorkerID())
	}

	const sessions = 8
	home := map[string]string{}
	history := map[string][]cacheMessage{}
	for k := range sessions {
		s := fmt.Sprintf("s%d", k)
		history[s] = cacheMessages(cachePrefix(s), "first question of "+s)
		home[s] = postSession(t, r.base, s, history[s])
		if home[s] == "" {
			t.Fatalf("session %s: no X-Switchyard-Worker", s)
		}
	}
	// Every session's first prompt is in the index under its engine before the next turns.
	for k := range sessions {
		s := fmt.Sprintf("s%d", k)
		env.waitHeld(t, home[s], promptIDs(t, history[s]), "session "+s+"'s prompt indexed", func(n int64) bool { return n >= cacheMinMatched })
	}
	before := selectionsBy(t, r.base, "prefix_holder")
	for k := range sessions {
		s := fmt.Sprintf("s%d", k)
		history[s] = append(history[s], cacheMessage{Role: "assistant", Content: "ok"}, cacheMessage{Role: "user", Content: "second question of " + s})
		if got := postSession(t, r.base, s, history[s]); got != home[s] {
			t.Errorf("session %s lost its binding and went to %s, its conversation is cached on %s", s, got, home[s])
		}
	}
	if got := selectionsBy(t, r.base, "prefix_holder") - before; got != sessions {
		t.Fatalf("%v picks with reason prefix_holder, want %d (one per session whose binding was evicted)", got, sessions)
	}
}
