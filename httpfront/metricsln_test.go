package httpfront

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"

	"switchyard/config"
)

// signalHandler passes each record to next and signals msg when a record with that message
// is logged.
type signalHandler struct {
	slog.Handler
	msg    string
	signal chan struct{}
}

func (h signalHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		select {
		case h.signal <- struct{}{}:
		default:
		}
	}
	return h.Handler.Handle(ctx, r)
}

// TestMetricsListener: with server.metrics_port, /metrics is served on its own listener and
// not on the data plane, counts what the data plane serves, and keeps answering while the
// data plane drains.
func TestMetricsListener(t *testing.T) {
	a := newFakeEngine(t, "A", "llama", withGate())
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", a.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{plainBucket("b", nil, nil, "A")}}}
	cfg.Server.MetricsPort = ptr(0)
	cfg.Server.MetricsAPIKey = "mk"
	var logs lockedBuffer
	draining := make(chan struct{}, 1)
	logger := slog.New(signalHandler{Handler: slog.NewTextHandler(&logs, nil), msg: "draining", signal: draining})
	ts := startServer(t, cfg, Options{NoTelemetry: true, Logger: logger})
	murl := "http://" + ts.MetricsAddr().String()
	if ts.MetricsAddr().String() == ts.Addr().String() {
		t.Fatal("the metrics listener is the data plane's")
	}

	if r := get(t, ts.url+"/metrics"); r.status != 404 || !contains(r.body, "server.metrics_port") {
		t.Fatalf("data plane /metrics: %d %s", r.status, r.body)
	}
	if r := post(t, murl+"/v1/chat/completions", chatBody("llama", "hi", "")); r.status != 404 {
		t.Fatalf("the metrics listener served inference: %d %s", r.status, r.body)
	}
	if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", "")); r.status != 200 {
		t.Fatalf("chat: %d %s", r.status, r.body)
	}
	if r := get(t, murl+"/metrics"); r.status != 401 {
		t.Fatalf("metrics listener without server.metrics_api_key: %d %s", r.status, r.body)
	}
	r := get(t, murl+"/metrics", "Authorization", "Bearer mk")
	if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") ||
		!contains(r.body, `switchyard_responses_total{route="/v1/chat/completions",model="llama",status="200"} 1`) ||
		!contains(r.body, "process_cpu_seconds_total") {
		t.Fatalf("metrics listener: %d %s", r.status, r.body)
	}
	if !strings.Contains(logs.String(), "serving metrics apart from the data plane") {
		t.Errorf("start-up log does not name the metrics listener:\n%s", logs.String())
	}

	// A stream holds the drain open; the metrics listener still answers and shows it.
	held := make(chan response, 1)
	go func() { held <- post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", `"stream":true`)) }()
	waitFor(t, a.streamed, "the held stream")
	ts.cancel()
	waitFor(t, draining, "the drain")
	if r := get(t, murl+"/metrics", "Authorization", "Bearer mk"); r.status != 200 || !contains(r.body, "switchyard_inflight_requests 1") {
		t.Fatalf("metrics during the drain: %d %s", r.status, r.body)
	}
	close(a.gate)
	if r := <-held; r.status != 200 {
		t.Fatalf("held stream: %d", r.status)
	}
	ts.stop(t)
	if c, err := net.Dial("tcp", ts.MetricsAddr().String()); err == nil {
		c.Close()
		t.Fatal("the metrics listener still accepts after Run returned")
	}
}

// TestMetricsListenerPortTaken: a metrics port that cannot be listened on stops New with an
// error naming the keys.
func TestMetricsListenerPortTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := baseConfig()
	cfg.Server.MetricsPort = ptr(taken.Addr().(*net.TCPAddr).Port)
	_, err = New(cfg, Options{NoTelemetry: true})
	if err == nil || !strings.Contains(err.Error(), "server.metrics_host and metrics_port") ||
		!strings.Contains(err.Error(), strconv.Itoa(*cfg.Server.MetricsPort)) {
		t.Fatalf("New = %v", err)
	}
}
