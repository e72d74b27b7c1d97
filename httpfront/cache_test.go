package httpfront

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/config"
	"switchyard/kv"
	"switchyard/kv/events"
	"switchyard/kv/hashing"
	"switchyard/kv/subscribe"
	"switchyard/tokenizer"
)

// cacheConfig is two plain engines behind one bucket whose group runs cache_aware, with no
// tokenizer configured and no KV-event subscriptions (the tests write the index).
func cacheConfig(a, b *fakeEngine) *config.Config {
	cfg := baseConfig()
	cfg.KV.Enabled = false
	cfg.CacheAware.MinMatchedTokens = 32
	cfg.Workers = []config.Worker{plainWorker("A", a.url, "llama"), plainWorker("B", b.url, "llama")}
	policy := config.Policy{Type: config.PolicyCacheAware}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{{ID: "all",
		Groups: config.Groups{Plain: &config.Group{Policy: &policy}}}}}}
	return cfg
}

func counter(set *metrics.Set, name string) uint64 { return set.GetOrCreateCounter(name).Get() }

// TestCacheAwareServing: a cache_aware group builds (its cache state replaces the "needs a
// cache source" refusal), a model without a tokenizer gets the built-in one, each request
// makes exactly one prefix lookup before its pick and goes to the engine holding its
// prefix, and a request without token IDs (a batch) makes none and falls back on load.
func TestCacheAwareServing(t *testing.T) {
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	set := metrics.NewSet()
	ts := startServer(t, cacheConfig(a, b), Options{Metrics: set, SkipStartupChecks: true, NoTelemetry: true, Seed: 1})
	if ts.models["llama"].tok == nil || !ts.models["llama"].prefix {
		t.Fatal("a cache_aware model without a tokenizer got no built-in one, or makes no lookup")
	}

	content := strings.Repeat("the shared system prompt says hello to everyone. ", 12)
	tk := tokenizer.NewSimple()
	text, err := tk.ApplyChatTemplate([]tokenizer.Message{{Role: "user", Content: content}})
	if err != nil {
		t.Fatal(err)
	}
	ids := tk.Encode(text)
	x := ts.Cache().Index()
	for _, w := range []string{"A", "B"} {
		if _, err := x.SetWorker(w, "llama", 1, 16); err != nil {
			t.Fatal(err)
		}
	}
	payload, err := events.NewEncoder().Encode(&events.EventBatch{Events: []events.Event{{Kind: events.EventBlockStored,
		BlockHashes: hashing.AppendBlockHashes(nil, ids, 16), TokenIDs: ids, BlockSize: 16, Medium: events.MediumGPU}}}, events.ShapeArray)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := subscribe.NewIngestor(x, "A", false, nil).Apply(payload, 0); err != nil {
		t.Fatal(err)
	}
	var l kv.Lookup
	lookupCtx, cancelLookup := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelLookup()
	if err := x.Sync(lookupCtx); err != nil { // lookups read what the shards applied
		t.Fatal(err)
	}
	if err := x.Lookup(lookupCtx, "llama", ids, &l); err != nil || l.Tokens("A") < 32 {
		t.Fatalf("the index did not apply A's blocks: %+v, %v", l, err)
	}

	const (
		lookups   = `switchyard_kv_lookups_total{source="local",outcome="ok"}`
		candidate = `switchyard_cache_aware_decisions_total{outcome="cache_candidate"}`
		noLookup  = `switchyard_cache_aware_fallbacks_total{reason="no_lookup"}`
	)
	l0, c0 := counter(set, lookups), counter(set, candidate)
	for i := range 4 {
		r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", content, ""))
		if r.status != 200 || r.header.Get(headerWorker) != "A" {
			t.Fatalf("request %d: status %d, worker %q: want A, which holds the prefix", i, r.status, r.header.Get(headerWorker))
		}
	}
	if l, c := counter(set, lookups)-l0, counter(set, candidate)-c0; l != 4 || c != 4 {
		t.Fatalf("%d lookups and %d cache_candidate decisions for 4 requests, want 4 and 4", l, c)
	}

	l0, n0 := counter(set, lookups), counter(set, noLookup)
	r := post(t, ts.url+"/v1/completions", `{"model":"llama","prompt":["`+content+`","`+content+`"],"max_tokens":4}`)
	if r.status != 200 {
		t.Fatalf("batch: status %d: %s", r.status, r.body)
	}
	if l, n := counter(set, lookups)-l0, counter(set, noLookup)-n0; l != 0 || n != 1 {
		t.Fatalf("batch: %d lookups, %d no_lookup fallbacks, want 0 and 1", l, n)
	}
}

// TestCacheAwareUnavailableIndexer: with an indexer that cannot be reached, requests are
// still served (a miss, load fallback) and the unavailable source is counted apart.
func TestCacheAwareUnavailableIndexer(t *testing.T) {
	a, b := newFakeEngine(t, "A", "llama"), newFakeEngine(t, "B", "llama")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + ln.Addr().String()
	_ = ln.Close() // nothing listens there any more
	cfg := cacheConfig(a, b)
	cfg.CacheAware.Source = config.CacheSourceRemote
	cfg.CacheAware.RemoteURL = gone
	set := metrics.NewSet()
	ts := startServer(t, cfg, Options{Metrics: set, SkipStartupChecks: true, NoTelemetry: true, Seed: 1})
	if ts.Cache().Index() != nil {
		t.Fatal("a remote source built a local index")
	}
	for i := range 3 {
		if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hello there", "")); r.status != 200 {
			t.Fatalf("request %d: status %d: %s", i, r.status, r.body)
		}
	}
	if n := counter(set, `switchyard_cache_aware_fallbacks_total{reason="source_unavailable"}`); n != 3 {
		t.Fatalf("%d source_unavailable fallbacks, want 3", n)
	}
	if n := counter(set, `switchyard_kv_lookups_total{source="remote",outcome="unavailable"}`); n != 3 {
		t.Fatalf("%d unavailable remote lookups, want 3", n)
	}
}
