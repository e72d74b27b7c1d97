package httpfront

import (
	"context"
	"testing"
	"time"

	"switchyard/config"
)

// TestRunCancelledBeforeServeReturns cancels Run before (or while) its listener starts
// serving: Run must still stop, whichever of shutdown and Serve comes first.
func TestRunCancelledBeforeServeReturns(t *testing.T) {
	e := newFakeEngine(t, "A", "llama")
	for i := range 20 {
		cfg := baseConfig()
		cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
		cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("all", nil, nil, "A")}}}
		s, err := New(cfg, Options{SkipStartupChecks: true})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("run %d: Run = %v", i, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("run %d: Run did not return after its context was cancelled", i)
		}
	}
}
