package httpfront

import (
	"net"
	"net/http"
	"testing"

	"switchyard/config"
)

// publicListener is a loopback listener that reports a routable address, as a router
// listening on 0.0.0.0 or a LAN address does; tests still connect over loopback.
type publicListener struct{ net.Listener }

func (publicListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 8080} }

// TestAdminAccess: the admin API takes the admin key when set, else the data-plane key;
// with no key it is open only on loopback or with server.admin_open, and refused otherwise.
// /metrics takes server.metrics_api_key when set.
func TestAdminAccess(t *testing.T) {
	e := newFakeEngine(t, "A", "llama")
	tests := []struct {
		name                     string
		apiKey, adminKey, metKey string
		public, adminOpen        bool
		// the status of GET, POST and DELETE /workers with each key ("" = none)
		want map[string]int
		code string // the error code without a key, when refused
		// the status of /metrics without a key
		metrics int
	}{
		{name: "admin key", apiKey: "data", adminKey: "adm",
			want: map[string]int{"": 401, "data": 403, "adm": 200}, code: CodeMissingAPIKey, metrics: 200},
		{name: "only the data-plane key", apiKey: "data",
			want: map[string]int{"": 401, "wrong": 403, "data": 200}, code: CodeMissingAPIKey, metrics: 200},
		{name: "only the data-plane key, beyond loopback", apiKey: "data", public: true,
			want: map[string]int{"": 401, "data": 200}, code: CodeMissingAPIKey, metrics: 200},
		{name: "no key on loopback",
			want: map[string]int{"": 200}, metrics: 200},
		{name: "no key beyond loopback", public: true,
			want: map[string]int{"": 403, "anything": 403}, code: CodeAdminDisabled, metrics: 200},
		{name: "no key beyond loopback, admin_open", public: true, adminOpen: true,
			want: map[string]int{"": 200}, metrics: 200},
		{name: "metrics key", metKey: "met",
			want: map[string]int{"": 200}, metrics: 401},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := oneEngineConfig(e)
			cfg.Server.APIKey, cfg.Server.AdminAPIKey, cfg.Server.MetricsAPIKey = tt.apiKey, tt.adminKey, tt.metKey
			cfg.Server.AdminOpen = tt.adminOpen
			opts := Options{SkipStartupChecks: true, NoTelemetry: true}
			if tt.public {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				opts.Listener = publicListener{ln}
			}
			ts := startServer(t, cfg, opts)
			if tt.public {
				ts.url = "http://" + opts.Listener.(publicListener).Listener.Addr().String()
			}
			for key, want := range tt.want {
				var h []string
				if key != "" {
					h = []string{"Authorization", "Bearer " + key}
				}
				if r := get(t, ts.url+"/workers", h...); r.status != want {
					t.Errorf("GET /workers with key %q: %d, want %d: %s", key, r.status, want, r.body)
				} else if key == "" && tt.code != "" && r.errorCode() != tt.code {
					t.Errorf("GET /workers without a key: code %q, want %q", r.errorCode(), tt.code)
				}
				add := post(t, ts.url+"/workers", `{"url":"`+e.url+`","id":"B","model":"llama","role":"plain"}`, h...)
				wantAdd := want
				if want == 200 {
					wantAdd = 201
				}
				if add.status != wantAdd {
					t.Errorf("POST /workers with key %q: %d, want %d: %s", key, add.status, wantAdd, add.body)
				}
				req, _ := http.NewRequest(http.MethodDelete, ts.url+"/workers/B", nil)
				if key != "" {
					req.Header.Set("Authorization", "Bearer "+key)
				}
				if r := do(t, req); r.status != want {
					t.Errorf("DELETE /workers/B with key %q: %d, want %d: %s", key, r.status, want, r.body)
				}
			}
			if r := get(t, ts.url+"/metrics"); r.status != tt.metrics {
				t.Errorf("/metrics without a key: %d, want %d", r.status, tt.metrics)
			}
			if tt.metKey != "" {
				if r := get(t, ts.url+"/metrics", "Authorization", "Bearer "+tt.metKey); r.status != 200 {
					t.Errorf("/metrics with its key: %d", r.status)
				}
			}
		})
	}
}

func TestAccessRulesDescribeEachGroup(t *testing.T) {
	loop := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}
	public := &net.TCPAddr{IP: net.IPv4zero}
	data, admin, metrics := accessRules(config.Server{}, public)
	if data.desc.Warn || !admin.desc.Warn || admin.refused == nil || metrics.desc.Warn {
		t.Fatalf("no keys beyond loopback: %+v %+v %+v", data.desc, admin.desc, metrics.desc)
	}
	if _, admin, _ = accessRules(config.Server{}, loop); admin.refused != nil || admin.desc.Warn {
		t.Fatalf("no keys on loopback: %+v", admin.desc)
	}
	if _, admin, _ = accessRules(config.Server{APIKey: "k"}, public); admin.key != "k" || admin.refused != nil {
		t.Fatalf("data-plane key only: %+v", admin)
	}
}
