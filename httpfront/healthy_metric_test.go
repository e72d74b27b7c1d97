package httpfront

import (
	"context"
	"testing"
)

// TestHealthyWorkersGauge: switchyard_healthy_workers{model,role} follows the health checks,
// down to 0 when /readiness reports the model's role missing.
func TestHealthyWorkersGauge(t *testing.T) {
	ts, a, b := twoWorkerServer(t, nil, Options{})
	const series = `switchyard_healthy_workers{model="llama",role="plain"} `
	check := func(want string) {
		t.Helper()
		if r := get(t, ts.url+"/metrics"); !contains(r.body, series+want) {
			t.Fatalf("metrics lack %s%s", series, want)
		}
	}
	check("2")
	a.health.Store(503)
	for range 2 {
		ts.workers.CheckOnce(context.Background(), ts.workers.Member("A"))
	}
	check("1")
	b.health.Store(503)
	for range 2 {
		ts.workers.CheckOnce(context.Background(), ts.workers.Member("B"))
	}
	check("0")
	if r := get(t, ts.url+"/readiness"); r.status != 503 {
		t.Fatalf("readiness %d with the gauge at 0", r.status)
	}
}
