package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"switchyard/bench/mockengine"
	"switchyard/config"
)

// TestCacheAwareThroughIndexer: the end-to-end checks of TestCacheAwareEndToEnd with the
// index in `switchyard indexer` (runIndexer, subscribed to the engines itself) and two
// routers sharing it (cache_aware.source remote): a request warms an engine through one
// router, and the shared prefix goes to that engine through either.
func TestCacheAwareThroughIndexer(t *testing.T) {
	engines := startCacheEngines(t, 3)
	indexer := startIndexer(t, engines)
	cfg := func() *config.Config {
		c := cacheRouterConfig(engines)
		c.CacheAware.Source = config.CacheSourceRemote
		c.CacheAware.RemoteURL = indexer
		c.CacheAware.QueryTimeout = cacheQueryTimeout
		return c
	}
	r1, r2 := startCacheRouter(t, cfg()), startCacheRouter(t, cfg())
	if r1.srv.Cache().Index() != nil || r2.srv.Cache().Index() != nil {
		t.Fatal("a router with a remote source built an index of its own")
	}
	env := &cacheEnv{routers: []*cacheRouter{r1, r2}, kvMetrics: indexer + "/metrics", engines: byID(engines)}
	runCacheScenario(t, env)
	for i, r := range env.routers {
		if n := metricValue(t, r.base+"/metrics", seriesRemoteOK); n == 0 {
			t.Errorf("router %d made no remote lookup", i+1)
		}
	}
}

// startIndexer runs `switchyard indexer` on 127.0.0.1:0 following engines (discovered
// through /server_info) and returns its base URL; it stops when the test ends.
func startIndexer(t *testing.T, engines []*mockengine.Engine) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("workers:\n")
	for _, e := range engines {
		b.WriteString("  - id: " + e.WorkerID() + "\n    url: " + e.URL() + "\n    model: " + cacheModel + "\n")
	}
	b.WriteString("kv:\n  reconnect_backoff: 20ms\nserver:\n  drain_timeout: 5s\nlog:\n  level: error\n")
	path := filepath.Join(t.TempDir(), "indexer.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- runIndexer(ctx, []string{"--listen", "127.0.0.1:0", "--config", path}, outW, io.Discard)
		_ = outW.Close()
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("runIndexer: %v", err)
		}
	})
	line, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil {
		t.Fatalf("the indexer printed no address: %v", err)
	}
	go func() { _, _ = io.Copy(io.Discard, outR) }()
	i := strings.Index(line, "http://")
	if i < 0 {
		t.Fatalf("the indexer printed %q", line)
	}
	return strings.TrimSpace(line[i:])
}
