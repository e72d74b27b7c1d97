//go:build !race

package httpfront

import (
	"testing"

	"github.com/valyala/fasthttp"

	"switchyard/config"
)

// TestFlowGateAllocations locks in the fast path of admission: with every limit configured
// and none reached, a request's rate-limit check (with an API key), its concurrency slots
// and their release allocate nothing.
func TestFlowGateAllocations(t *testing.T) {
	cfg := baseConfig()
	cfg.Server.MaxConcurrentRequests = 64
	cfg.Server.RateLimit = config.RateLimit{RequestsPerSecond: 1e9, Burst: 1 << 30,
		PerKey: config.KeyRateLimit{RequestsPerSecond: 1e9, Burst: 1 << 30, MaxKeys: 100}}
	cfg.Models = map[string]config.Model{"llama": {MaxConcurrentRequests: 64}}
	s := &Server{cfg: cfg, gate: newGate(cfg, Options{}), now: newFakeClock().Now, hardStop: make(chan struct{})}
	if s.gate == nil || s.gate.Router() == nil || s.gate.Model("llama") == nil {
		t.Fatal("limits not configured")
	}
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.Set(fasthttp.HeaderAuthorization, "Bearer key-1")
	run := func() {
		if e := s.limitRate(&ctx); e != nil {
			t.Fatal(e)
		}
		tk, e := s.admit(&ctx, "llama", &requestFacts{})
		if e != nil {
			t.Fatal(e)
		}
		tk.Release()
	}
	run() // the key's first use adds it to the table
	if n := testing.AllocsPerRun(1000, run); n != 0 {
		t.Fatalf("%v allocations per admitted request, want 0", n)
	}
}
