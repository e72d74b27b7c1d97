package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckFlowAndRetryKeys: `switchyard check` accepts the concurrency limits, queues, rate
// limits and retries, and names the field of each bad value.
func TestCheckFlowAndRetryKeys(t *testing.T) {
	write := tempWriter(t)
	good := write("good.yaml", `
server:
  max_concurrent_requests: 32
  queue_size: 16
  queue_timeout: 5s
  rate_limit: {requests_per_second: 50, burst: 100, per_key: {requests_per_second: 5, max_keys: 1000}}
workers:
  - {id: W1, url: "http://127.0.0.1:1", model: m}
models:
  m:
    max_concurrent_requests: 8
    queue_timeout: 2s
    buckets: [{id: a, groups: {plain: {}}}]
retry:
  max_retries: 3
  retryable_statuses: [500, 502, 503, 504]
  budget: {ratio: 0.1, window: 30s}
`)
	if code, out, errOut := runCmd(t, "check", "--config", good); code != 0 || !strings.Contains(out, "configuration ok") {
		t.Fatalf("good config: exit %d\n%s%s", code, out, errOut)
	}
	bad := write("bad.yaml", `
server:
  queue_size: -1
  rate_limit: {per_key: {max_keys: 0}}
workers:
  - {id: W1, url: "http://127.0.0.1:1", model: m}
models:
  m:
    queue_timeout: -1s
    buckets: [{id: a, groups: {plain: {}}}]
retry:
  max_retries: 9
  jitter: 2
  retryable_statuses: [404]
`)
	code, _, errOut := runCmd(t, "check", "--config", bad)
	if code != 1 {
		t.Fatalf("bad config: exit %d, want 1", code)
	}
	for _, want := range []string{
		"server.queue_size: must be at least 0, got -1",
		"server.rate_limit.per_key.max_keys: must be at least 1, got 0",
		"models.m.queue_timeout: must not be negative",
		"retry.max_retries: must be in 0..8, got 9",
		"retry.jitter: must be in 0..1, got 2",
		"retry.retryable_statuses[0]: must be 408, 429 or 500..599, got 404",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("check output lacks %q:\n%s", want, errOut)
		}
	}
}

// TestCheckUpstreamTLSAndMetricsListener: `switchyard check` reads the TLS files the
// configuration names, as the router's start does, and names the key of each that cannot
// be used; it accepts the metrics listener keys and rejects tls on an http:// worker.
func TestCheckUpstreamTLSAndMetricsListener(t *testing.T) {
	write := tempWriter(t)
	notPEM := write("not.pem", "not a certificate\n")
	bad := write("bad.yaml", `
server: {metrics_host: 0.0.0.0, metrics_port: 29000}
upstream:
  tls: {ca_files: [`+filepath.Join(filepath.Dir(notPEM), "missing.pem")+`]}
workers:
  - {id: W1, url: "https://127.0.0.1:1", model: m, tls: {ca_files: [`+notPEM+`], server_name: engine.test}}
models:
  m: {buckets: [{id: a, groups: {plain: {}}}]}
`)
	code, _, errOut := runCmd(t, "check", "--config", bad)
	if code != 1 {
		t.Fatalf("missing TLS files: exit %d, want 1", code)
	}
	for _, want := range []string{
		"upstream.tls.ca_files[0]: cannot read the certificate authorities",
		"workers[0].tls.ca_files[0]: " + notPEM + " holds no PEM certificate",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("check output lacks %q:\n%s", want, errOut)
		}
	}
	plain := write("plain.yaml", `
workers:
  - {id: W1, url: "http://127.0.0.1:1", model: m, tls: {server_name: engine.test}}
models:
  m: {buckets: [{id: a, groups: {plain: {}}}]}
`)
	if code, _, errOut := runCmd(t, "check", "--config", plain); code != 1 ||
		!strings.Contains(errOut, "workers[0].tls: the worker's url is http://, which never uses TLS") {
		t.Fatalf("tls on an http worker: exit %d\n%s", code, errOut)
	}
}

// tempWriter returns a function that writes a file in the test's temporary directory and
// returns its path.
func tempWriter(t *testing.T) func(name, doc string) string {
	t.Helper()
	dir := t.TempDir()
	return func(name, doc string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
}
