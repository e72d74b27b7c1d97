package httpfront

import (
	"encoding/json"
	"testing"
)

// TestPDRankDispatchBodies: with dp_dispatch on and both engines of two ranks, the prefill
// engine gets its rank as data_parallel_rank, and the decode engine its own rank and the
// prefill engine's as prefill_dp_rank; consecutive requests alternate the ranks.
func TestPDRankDispatchBodies(t *testing.T) {
	p := newFakeEngine(t, "P", "llama", withMode("prefill"))
	p.bootstrapPort, p.dpSize = 8998, 2
	d := newFakeEngine(t, "D", "llama", withMode("decode"))
	d.expectHost, d.expectPort, d.dpSize = "127.0.0.1", 8998, 2
	cfg := pdConfig(p, d, ptr(8998))
	cfg.DPDispatch.Enabled = true
	ts := startServer(t, cfg, Options{})
	for i := range 4 {
		if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", "")); r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	pb, _ := p.received()
	db, _ := d.received()
	if len(pb) != 4 || len(db) != 4 {
		t.Fatalf("prefill saw %d, decode %d", len(pb), len(db))
	}
	for i := range 4 {
		var pr, dr map[string]any
		if err := json.Unmarshal(pb[i], &pr); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(db[i], &dr); err != nil {
			t.Fatal(err)
		}
		want := float64(i % 2)
		if pr["data_parallel_rank"] != want || dr["data_parallel_rank"] != want || dr["prefill_dp_rank"] != want {
			t.Fatalf("request %d: prefill %v, decode %v / %v; want rank %v", i, pr["data_parallel_rank"], dr["data_parallel_rank"], dr["prefill_dp_rank"], want)
		}
		if _, ok := pr["prefill_dp_rank"]; ok {
			t.Fatalf("the prefill engine got prefill_dp_rank")
		}
		if pr["bootstrap_room"] != dr["bootstrap_room"] {
			t.Fatalf("rooms differ: %v %v", pr["bootstrap_room"], dr["bootstrap_room"])
		}
	}
	// Without dp_dispatch no rank field is added.
	cfg2 := pdConfig(p, d, ptr(8998))
	ts2 := startServer(t, cfg2, Options{})
	if r := post(t, ts2.url+"/v1/chat/completions", chatBody("llama", "hi", "")); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	pb, _ = p.received()
	var pr map[string]any
	_ = json.Unmarshal(pb[len(pb)-1], &pr)
	if _, ok := pr["data_parallel_rank"]; ok {
		t.Fatal("a rank without dp_dispatch")
	}
}
