package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"

	"switchyard/bench/mockengine"
	"switchyard/config"
)

// hashConfig is one plain bucket over engines under policy, with hashing.key_headers x-user.
func hashConfig(engines []*mockengine.Engine, policy string) *config.Config {
	cfg := config.Default()
	cfg.Server.Port = 0
	cfg.Hashing.KeyHeaders = []string{"x-user", "x-session-id"}
	var ids []string
	for _, e := range engines {
		cfg.Workers = append(cfg.Workers, config.Worker{ID: e.WorkerID(), URL: e.URL(), Model: affModel, Role: config.RolePlain, DPSize: 1})
		ids = append(ids, e.WorkerID())
	}
	maxIn := int64(131072)
	cfg.Models = map[string]config.Model{affModel: {Buckets: []config.Bucket{{ID: "all", Limits: config.Limits{Max: &maxIn},
		Groups: config.Groups{Plain: &config.Group{WorkerIDs: &ids, Policy: &config.Policy{Type: policy}}}}}}}
	return cfg
}

// hashPost sends body to url with the given header pairs and returns the worker that served it.
func hashPost(t *testing.T, url, body string, headers ...string) string {
	t.Helper()
	h, _ := postOK(t, url, body, headers...)
	return h.Get("X-Switchyard-Worker")
}

// postOK sends body to url with the given header pairs, fails the test unless the answer is
// 200, and returns its headers and body.
func postOK(t *testing.T, url, body string, headers ...string) (http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, raw)
	}
	return resp.Header, raw
}

// TestConsistentHashReplicasAgreeEndToEnd: two router replicas over the same four mock
// engines send every user to the same engine, request after request, without sharing any
// state; a request without a key is served too.
func TestConsistentHashReplicasAgreeEndToEnd(t *testing.T) {
	engines := []*mockengine.Engine{affEngine(t, "E0"), affEngine(t, "E1"), affEngine(t, "E2"), affEngine(t, "E3")}
	_, a := startRouter(t, hashConfig(engines, config.PolicyConsistentHash))
	_, b := startRouter(t, hashConfig(engines, config.PolicyConsistentHash))
	body, _ := json.Marshal(map[string]any{"model": affModel, "messages": []affMessage{{Role: "user", Content: "hello"}}, "max_tokens": 2})
	used := map[string]int{}
	for u := range 40 {
		user := fmt.Sprintf("user-%d", u)
		first := hashPost(t, a+"/v1/chat/completions", string(body), "x-user", user)
		for i, base := range []string{b, a, b} {
			if got := hashPost(t, base+"/v1/chat/completions", string(body), "x-user", user); got != first {
				t.Fatalf("%s: request %d went to %s, the first to %s", user, i+2, got, first)
			}
		}
		// The second configured header counts when the first is absent.
		if got := hashPost(t, b+"/v1/chat/completions", string(body), "x-session-id", user); got != first {
			t.Fatalf("%s as x-session-id went to %s, as x-user to %s", user, got, first)
		}
		used[first]++
	}
	if len(used) != len(engines) {
		t.Fatalf("40 users reached %d of 4 engines: %v", len(used), used)
	}
	if hashPost(t, a+"/v1/chat/completions", string(body)) == "" {
		t.Fatal("a request without a key has no worker header")
	}
}

// TestPrefixHashEndToEnd: /generate requests sharing their first prefix_tokens token IDs reach
// one engine through either replica; other prefixes spread over the engines.
func TestPrefixHashEndToEnd(t *testing.T) {
	engines := []*mockengine.Engine{affEngine(t, "E0"), affEngine(t, "E1"), affEngine(t, "E2")}
	cfgA, cfgB := hashConfig(engines, config.PolicyPrefixHash), hashConfig(engines, config.PolicyPrefixHash)
	cfgA.Hashing.PrefixTokens, cfgB.Hashing.PrefixTokens = 8, 8
	_, a := startRouter(t, cfgA)
	_, b := startRouter(t, cfgB)
	gen := func(ids []int) string {
		body, _ := json.Marshal(map[string]any{"model": affModel, "input_ids": ids, "sampling_params": map[string]any{"max_new_tokens": 2}})
		return string(body)
	}
	used := map[string]bool{}
	for p := range 30 {
		prefix := []int{p, p + 1, p + 2, p + 3, p + 4, p + 5, p + 6, p + 7}
		first := hashPost(t, a+"/generate", gen(append(prefix, 1000)))
		for tail := range 3 {
			if got := hashPost(t, b+"/generate", gen(append(prefix, 2000+tail, 7))); got != first {
				t.Fatalf("prefix %d, tail %d went to %s, the first to %s", p, tail, got, first)
			}
		}
		used[first] = true
	}
	if len(used) != len(engines) {
		t.Fatalf("30 prefixes reached %d of 3 engines", len(used))
	}
}
