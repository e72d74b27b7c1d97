package subscribe

import (
	"bufio"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"switchyard/kv"
	"switchyard/kv/events"
	"switchyard/kv/index"
)

// lagBuckets reads switchyard_kv_event_lag_seconds from set: cumulative counts by `le`.
func lagBuckets(t *testing.T, set *metrics.Set) map[string]string {
	t.Helper()
	var b strings.Builder
	set.WritePrometheus(&b)
	out := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(b.String()))
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, `switchyard_kv_event_lag_seconds_bucket{le="`); ok {
			le, v, _ := strings.Cut(rest, `"} `)
			out[le] = v
		}
		if v, ok := strings.CutPrefix(line, "switchyard_kv_event_lag_seconds_count "); ok {
			out["count"] = v
		}
	}
	return out
}

// TestEventLagMetric: every applied batch with a timestamp counts its age in
// switchyard_kv_event_lag_seconds; a batch without one, or a malformed one, does not.
func TestEventLagMetric(t *testing.T) {
	set := metrics.NewSet()
	x, err := index.New(index.Config{Shards: 1, Metrics: kv.NewMetrics(set)})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	if _, err := x.SetWorker("a", "m", 1, 16); err != nil {
		t.Fatal(err)
	}
	ing := NewIngestor(x, "a", false, nil)
	apply := func(ts float64) {
		t.Helper()
		payload, err := events.NewEncoder().Encode(&events.EventBatch{TS: ts, Events: []events.Event{{Kind: events.EventAllBlocksCleared}}}, events.ShapeArray)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ing.Apply(append([]byte(nil), payload...), 0); err != nil {
			t.Fatal(err)
		}
	}
	if got := lagBuckets(t, set)["count"]; got != "0" {
		t.Fatalf("before any batch: count %q, want an exported 0", got)
	}
	now := float64(time.Now().UnixNano()) / 1e9
	apply(now - 45)    // 45 s old: above the 30 s bucket, within 60 s
	apply(now + 3600)  // an engine clock an hour ahead: no lag
	apply(0)           // no timestamp: not counted
	apply(math.NaN())  // not a time: not counted
	apply(math.Inf(1)) // not a time: not counted
	if _, err := ing.Apply([]byte{0xc1}, 0); err == nil {
		t.Fatal("a malformed payload was applied")
	}
	got := lagBuckets(t, set)
	want := map[string]string{"count": "2", "0.001": "1", "30": "1", "60": "2", "+Inf": "2"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("bucket %s: %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
}
