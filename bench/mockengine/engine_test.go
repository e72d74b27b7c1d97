package mockengine

import (
	"context"
	"net"
	"strings"
	"testing"

	"switchyard/kv"
)

func TestContextStopsEngine(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	e, err := Start(ctx, Config{ZeroCost: true})
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(e.URL(), "http://")
	cancel()
	poll(t, "the engine to stop listening", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestInvalidConfig(t *testing.T) {
	_, err := Start(t.Context(), Config{Role: "router", PageSize: -1, Speedup: -1, Faults: Faults{FailRate: 3}})
	if err == nil {
		t.Fatal("Start accepted an invalid configuration")
	}
	for _, want := range []string{"role", "page_size", "speedup", "fail_rate"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not report %s", err, want)
		}
	}
	if e := (Engine{}); e.SetFaults(Faults{FailRate: -1}) == nil {
		t.Error("SetFaults accepted a negative rate")
	}
}

func TestAllBlocksClearedAtStart(t *testing.T) {
	e := startEngine(t, Config{ZeroCost: true, DPSize: 2, KVEvents: KVEvents{Replay: true}})
	for rank := range 2 {
		batches := replay(t, e.ReplayEndpoint(rank), 0, rank == 0)
		if len(batches) != 1 || batches[0].seq != 0 || len(batches[0].b.Events) != 1 ||
			batches[0].b.Events[0].Kind != kv.EventAllBlocksCleared || batches[0].b.DPRank != rank {
			t.Fatalf("rank %d: replay from 0 = %+v, want AllBlocksCleared as seq 0", rank, batches)
		}
	}
}
