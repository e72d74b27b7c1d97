package httpfront

import (
	"fmt"
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/config"
	"switchyard/engine"
)

// approxConfig is engines behind one plain bucket whose group runs cache_aware with the
// approximate source, no tokenizer (the prompt's text is matched).
func approxConfig(engines ...*fakeEngine) *config.Config {
	cfg := baseConfig()
	cfg.CacheAware.Source = config.CacheSourceApproximate
	// One shard: a request's lookup then follows the recording of every request before it
	// (mailbox order), so that the engines' shares of the tree it reads are up to date.
	// With several shards a record may still be queued on another shard: the tree is an
	// approximation either way.
	cfg.KV.Shards = 1
	for _, e := range engines {
		cfg.Workers = append(cfg.Workers, plainWorker(e.id, e.url, "llama"))
	}
	policy := config.Policy{Type: config.PolicyCacheAware}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{{ID: "all",
		Groups: config.Groups{Plain: &config.Group{Policy: &policy}}}}}}
	return cfg
}

// TestCacheAwareApproximateServing: engines that publish no KV events, the router's own tree
// of what it sent. A conversation repeated with another last message goes back to the engine
// that served it; distinct conversations spread over the engines; a removed worker's part of
// the tree is dropped at once.
func TestCacheAwareApproximateServing(t *testing.T) {
	var engines []*fakeEngine
	for _, id := range []string{"A", "B", "C"} {
		engines = append(engines, newFakeEngine(t, id, "llama"))
	}
	set := metrics.NewSet()
	ts := startServer(t, approxConfig(engines...), Options{Metrics: set, SkipStartupChecks: true, NoTelemetry: true, Seed: 1})
	if ts.models["llama"].tok != nil || !ts.models["llama"].prefix {
		t.Fatal("an approximate cache_aware model without a tokenizer got one, or makes no lookup")
	}
	system := func(i int) string {
		return strings.Repeat(fmt.Sprintf("system prompt number %d tells the assistant what to do. ", i), 6)
	}
	chat := func(sys, user string) string {
		return `{"model":"llama","max_tokens":4,"messages":[{"role":"system","content":"` + sys +
			`"},{"role":"user","content":"` + user + `"}]}`
	}
	first := map[int]string{}
	spread := map[string]int{}
	for i := range 6 {
		r := post(t, ts.url+"/v1/chat/completions", chat(system(i), "first question"))
		if r.status != 200 {
			t.Fatalf("conversation %d: status %d: %s", i, r.status, r.body)
		}
		first[i] = r.header.Get(headerWorker)
		spread[first[i]]++
	}
	for _, id := range []string{"A", "B", "C"} {
		if spread[id] != 2 {
			t.Errorf("6 distinct conversations over 3 engines: %v, want 2 each", spread)
			break
		}
	}
	for i := range 6 {
		r := post(t, ts.url+"/v1/chat/completions", chat(system(i), fmt.Sprintf("another question, number %d", i)))
		if w := r.header.Get(headerWorker); r.status != 200 || w != first[i] {
			t.Errorf("conversation %d repeated: status %d on %q, want %q which served it", i, r.status, w, first[i])
		}
	}
	if got := counter(set, `switchyard_cache_aware_decisions_total{outcome="`+engine.ReasonCacheCandidate+`"}`); got != 6 {
		t.Errorf("%d cache_candidate decisions, want 6 (the repeats)", got)
	}
	x := ts.Cache().Approximate()
	if x.Resident("A") == 0 || x.Stats().Recorded != 12 {
		t.Errorf("tree: A holds %d symbols, %d recorded; want some and 12", x.Resident("A"), x.Stats().Recorded)
	}
	r := doMethod(t, "DELETE", ts.url+"/workers/A")
	if r.status != 200 {
		t.Fatalf("DELETE /workers/A: %d %s", r.status, r.body)
	}
	// The removal is posted before any later lookup to every shard: the next lookup sees it.
	for i, w := range first {
		if w != "A" {
			continue
		}
		r := post(t, ts.url+"/v1/chat/completions", chat(system(i), "after the removal"))
		if got := r.header.Get(headerWorker); r.status != 200 || got == "A" {
			t.Errorf("conversation %d after A's removal: %d on %q", i, r.status, got)
		}
	}
	if x.Resident("A") != 0 {
		t.Errorf("a removed worker still holds %d symbols", x.Resident("A"))
	}
}
