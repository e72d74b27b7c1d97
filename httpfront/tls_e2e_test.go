package httpfront

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"switchyard/config"
	"switchyard/httpfront/fleet"
)

// testPKI is a public key infrastructure made for one test with crypto/x509: the engines'
// authority and a server certificate it signed for 127.0.0.1 and engine.test, the
// router's client authority with the router's client certificate, and an unrelated
// authority. The router's files are PEM files in the test's temporary directory.
type testPKI struct {
	caFile, wrongCAFile           string
	clientCertFile, clientKeyFile string
	// server is an engine's TLS: its certificate, and it requires a client certificate
	// signed by the client authority.
	server *tls.Config
}

const routerCN = "switchyard-router"

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	p := &testPKI{}
	ca, caKey := testCA(t, "engines CA")
	clientCA, clientCAKey := testCA(t, "clients CA")
	wrong, _ := testCA(t, "someone else's CA")
	p.caFile = writePEM(t, dir, "ca.pem", "CERTIFICATE", ca.Raw)
	p.wrongCAFile = writePEM(t, dir, "wrong-ca.pem", "CERTIFICATE", wrong.Raw)

	serverDER, serverKey := testIssue(t, ca, caKey, &x509.Certificate{Subject: pkix.Name{CommonName: "engine"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"engine.test"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	clientDER, clientKey := testIssue(t, clientCA, clientCAKey, &x509.Certificate{Subject: pkix.Name{CommonName: routerCN},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	p.clientCertFile = writePEM(t, dir, "router.pem", "CERTIFICATE", clientDER)
	keyDER, err := x509.MarshalPKCS8PrivateKey(clientKey)
	if err != nil {
		t.Fatal(err)
	}
	p.clientKeyFile = writePEM(t, dir, "router.key", "PRIVATE KEY", keyDER)

	clients := x509.NewCertPool()
	clients.AddCert(clientCA)
	p.server = &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{serverDER}, PrivateKey: serverKey}},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    clients,
		MinVersion:   tls.VersionTLS12,
	}
	return p
}

// testCA makes a self-signed certificate authority.
func testCA(t *testing.T, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// testIssue signs a leaf certificate from tmpl (names and usages) with the authority.
func testIssue(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, tmpl *x509.Certificate) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber, _ = rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

func writePEM(t *testing.T, dir, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// String returns everything written so far.
func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// anyBucket is a plain bucket whose group takes every healthy engine of its model.
func anyBucket(id string) config.Bucket {
	return config.Bucket{ID: id, Groups: config.Groups{Plain: &config.Group{}}}
}

func withPolled(ch chan string) engineOpt { return func(e *fakeEngine) { e.polled = ch } }

// assertNoClearText checks that every connection the engine accepted opened with a TLS
// handshake record, and that there was at least one.
func assertNoClearText(t *testing.T, e *fakeEngine) {
	t.Helper()
	firsts := e.raw.firsts()
	if len(firsts) == 0 {
		t.Fatal("the router never connected to the engine")
	}
	for i, b := range firsts {
		if b != 0x16 {
			t.Fatalf("connection %d to the engine began with %q, not a TLS handshake: sent in clear text", i, b)
		}
	}
}

// TestMutualTLSEndToEnd: an engine that requires a client certificate is introspected,
// health-checked, polled for load and dispatched to over TLS with the router's
// certificate, from the configuration (upstream.tls) and through the admin API.
func TestMutualTLSEndToEnd(t *testing.T) {
	p := newTestPKI(t)
	polled := make(chan string, 64)
	a := newFakeEngine(t, "A", "llama", withTLS(p.server), withPolled(polled))
	cfg := baseConfig()
	cfg.Workers = []config.Worker{plainWorker("A", a.url, "llama")}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{anyBucket("b")}}}
	cfg.Upstream.TLS = config.UpstreamTLS{CAFiles: []string{p.caFile}, CertFile: p.clientCertFile, KeyFile: p.clientKeyFile}
	cfg.Load.Source = config.LoadSourceHTTP
	cfg.Load.PollInterval = 20 * time.Millisecond
	cfg.Load.Freshness = time.Second
	ts := startServer(t, cfg, Options{}) // start-up introspection and health check, telemetry on

	if r := get(t, ts.url+"/readiness"); r.status != 200 {
		t.Fatalf("readiness: %d %s", r.status, r.body)
	}
	if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", "")); r.status != 200 || !contains(r.body, "hello from A") {
		t.Fatalf("chat over mTLS: %d %s", r.status, r.body)
	}
	r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", `"stream":true`))
	if r.status != 200 || !contains(r.body, "data: [DONE]") {
		t.Fatalf("stream over mTLS: %d %s", r.status, r.body)
	}
	select {
	case <-polled:
	case <-time.After(10 * time.Second):
		t.Fatal("no load poll reached the engine")
	}

	// A worker added through the admin API takes upstream.tls too (given its model, it is
	// introspected before the answer; without one it would be added in the background).
	b := newFakeEngine(t, "B", "llama", withTLS(p.server))
	if r := post(t, ts.url+"/workers", `{"url":"`+b.url+`","id":"B","model":"llama"}`); r.status != 201 ||
		!contains(r.body, `"introspected":true`) || !contains(r.body, `"healthy":true`) {
		t.Fatalf("add an https worker: %d %s", r.status, r.body)
	}
	for range 2 {
		if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", "")); r.status != 200 {
			t.Fatalf("chat after adding B: %d %s", r.status, r.body)
		}
	}
	if b.hits.Load() == 0 {
		t.Fatal("the added https worker served nothing")
	}

	a.mu.Lock()
	peers := append([]string(nil), a.peers...)
	a.mu.Unlock()
	seen := map[string]bool{}
	for _, pc := range peers {
		path, cn, _ := strings.Cut(pc, " ")
		if cn != routerCN {
			t.Errorf("request %s came with client certificate %q, want %q", path, cn, routerCN)
		}
		seen[path] = true
	}
	for _, path := range []string{"/server_info", "/health", "/v1/chat/completions", "/v1/loads"} {
		if !seen[path] {
			t.Errorf("no %s request over mTLS; saw %v", path, peers)
		}
	}
	assertNoClearText(t, a)
	assertNoClearText(t, b)
}

// TestUpstreamTLSRefused: against an engine that requires a client certificate, a router
// that trusts the wrong authority, or shows no certificate, finds the worker unhealthy with
// a log that says why, answers a request with a clear error, and never sends a byte of
// HTTP in clear text.
func TestUpstreamTLSRefused(t *testing.T) {
	p := newTestPKI(t)
	tests := []struct {
		name    string
		tls     config.UpstreamTLS
		log     string // in the start-up health check's warning
		message string // in the dispatch's error
		tls12   bool   // the engine speaks TLS 1.2 at most: it refuses in the handshake
	}{
		{"wrong authority", config.UpstreamTLS{CAFiles: []string{p.wrongCAFile}, CertFile: p.clientCertFile, KeyFile: p.clientKeyFile},
			"certificate signed by unknown authority", "failed the TLS handshake", false},
		{"no client certificate", config.UpstreamTLS{CAFiles: []string{p.caFile}},
			"asks for a client certificate, and the router has none", "asks for a client certificate, and the router has none", false},
		{"no client certificate, TLS 1.2", config.UpstreamTLS{CAFiles: []string{p.caFile}},
			"asks for a client certificate, and the router has none", "asks for a client certificate, and the router has none", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			server := p.server.Clone()
			if tt.tls12 {
				server.MaxVersion = tls.VersionTLS12
			}
			e := newFakeEngine(t, "A", "llama", withTLS(server))
			cfg := baseConfig()
			cfg.Workers = []config.Worker{plainWorker("A", e.url, "llama")}
			cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{anyBucket("b")}}}
			cfg.Upstream.TLS = tt.tls
			var logs lockedBuffer
			logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			ts := startServer(t, cfg, Options{NoTelemetry: true, Logger: logger})
			if r := get(t, ts.url+"/readiness"); r.status != 503 {
				t.Fatalf("readiness with the engine refusing the router: %d %s", r.status, r.body)
			}
			if r := get(t, ts.url+"/workers"); !contains(r.body, `"healthy":false`) {
				t.Fatalf("worker not unhealthy: %s", r.body)
			}
			if l := logs.String(); !strings.Contains(l, "worker failed its start-up health check") || !strings.Contains(l, tt.log) {
				t.Fatalf("the start-up warning does not say %q:\n%s", tt.log, l)
			}
			if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", "")); r.status != 503 || r.errorCode() != CodeNoAvailableEngine {
				t.Fatalf("request with no healthy engine: %d %s", r.status, r.body)
			}

			// Dispatched to (its start-up check skipped), the failure tells the client why.
			cfg2 := *cfg
			cfg2.Server.Port = 0
			ts2 := startServer(t, &cfg2, Options{NoTelemetry: true, SkipStartupChecks: true})
			r := post(t, ts2.url+"/v1/chat/completions", chatBody("llama", "hi", ""))
			if r.status != 502 || r.errorCode() != CodeUpstream || !contains(r.body, tt.message) {
				t.Fatalf("dispatch refused by TLS: %d %s, want 502 saying %q", r.status, r.body, tt.message)
			}
			if n := e.hits.Load(); n != 0 {
				t.Fatalf("the engine served %d inference requests", n)
			}
			if len(e.peers) != 0 {
				t.Fatalf("requests reached the engine's handler: %v", e.peers)
			}
			assertNoClearText(t, e)
		})
	}
}

// TestUpstreamTLSPerWorker: workers[].tls overrides upstream.tls key by key, server_name
// included: the worker with the right authority and name is served, the others are not.
func TestUpstreamTLSPerWorker(t *testing.T) {
	p := newTestPKI(t)
	a := newFakeEngine(t, "A", "llama", withTLS(p.server))
	b := newFakeEngine(t, "B", "llama", withTLS(p.server))
	c := newFakeEngine(t, "C", "llama", withTLS(p.server))
	cfg := baseConfig()
	wa, wb, wc := plainWorker("A", a.url, "llama"), plainWorker("B", b.url, "llama"), plainWorker("C", c.url, "llama")
	wa.TLS = &config.UpstreamTLS{CAFiles: []string{p.caFile}, ServerName: "engine.test"}
	wc.TLS = &config.UpstreamTLS{CAFiles: []string{p.caFile}, ServerName: "other.test"}
	cfg.Workers = []config.Worker{wa, wb, wc}
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{anyBucket("b")}}}
	cfg.Upstream.TLS = config.UpstreamTLS{CAFiles: []string{p.wrongCAFile}, CertFile: p.clientCertFile, KeyFile: p.clientKeyFile}
	ts := startServer(t, cfg, Options{NoTelemetry: true})
	reg := ts.Workers()
	if !reg.Worker("A").Healthy() || reg.Worker("B").Healthy() || reg.Worker("C").Healthy() {
		t.Fatalf("healthy A %v B %v C %v, want only A (its own authority and name)",
			reg.Worker("A").Healthy(), reg.Worker("B").Healthy(), reg.Worker("C").Healthy())
	}
	for range 3 {
		if r := post(t, ts.url+"/v1/chat/completions", chatBody("llama", "hi", "")); r.status != 200 || r.header.Get(headerWorker) != "A" {
			t.Fatalf("chat: %d %s from %s", r.status, r.body, r.header.Get(headerWorker))
		}
	}
	assertNoClearText(t, b)
	assertNoClearText(t, c)
}

// TestLoadTLSErrors: a file that cannot be read, holds no certificate, or a key that does
// not match its certificate stops the start with an error naming the key.
func TestLoadTLSErrors(t *testing.T) {
	p := newTestPKI(t)
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig()
	cfg.Workers = []config.Worker{
		plainWorker("A", "https://127.0.0.1:1", "llama"),
		plainWorker("B", "https://127.0.0.1:2", "llama"),
		plainWorker("C", "https://127.0.0.1:3", "llama"),
	}
	cfg.Workers[1].TLS = &config.UpstreamTLS{CertFile: p.clientCertFile, KeyFile: p.caFile}
	cfg.Workers[2].TLS = &config.UpstreamTLS{ServerName: "engine.test"} // inherits the global problems only
	cfg.Models = map[string]config.Model{"llama": {Buckets: []config.Bucket{anyBucket("b")}}}
	cfg.Upstream.TLS = config.UpstreamTLS{CAFiles: []string{filepath.Join(dir, "missing.pem"), garbage, p.caFile}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	_, err := fleet.LoadTLS(cfg)
	var lines []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var fe *config.FieldError
		if !errors.As(e, &fe) || !errors.Is(e, config.ErrInvalid) {
			t.Errorf("%v is not a config.FieldError of ErrInvalid", e)
		}
		lines = append(lines, e.Error())
	}
	want := []string{"upstream.tls.ca_files[0]: cannot read the certificate authorities: ", "upstream.tls.ca_files[1]: " + garbage + " holds no PEM certificate",
		"workers[1].tls.cert_file: cannot load the client certificate with key_file " + p.caFile + ": "}
	if len(lines) != len(want) {
		t.Fatalf("LoadTLS errors:\n%s\nwant %d", strings.Join(lines, "\n"), len(want))
	}
	for i := range want {
		if !strings.HasPrefix(lines[i], want[i]) {
			t.Errorf("error %d = %q, want it to begin %q", i, lines[i], want[i])
		}
	}
	if _, err := New(cfg, Options{NoTelemetry: true}); err == nil || !strings.Contains(err.Error(), "upstream.tls.ca_files[0]") {
		t.Fatalf("New = %v, want the start to fail naming upstream.tls.ca_files[0]", err)
	}
}
