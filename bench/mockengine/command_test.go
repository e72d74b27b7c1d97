package mockengine

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"regexp"
	"strings"
	"sync"
	"testing"
)

func TestCommandHelp(t *testing.T) {
	var stderr bytes.Buffer
	err := Command(t.Context(), []string{"--help"}, io.Discard, &stderr)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want flag.ErrHelp", err)
	}
	help := stderr.String()
	fs, _ := newFlagSet(io.Discard)
	fs.VisitAll(func(f *flag.Flag) {
		re := regexp.MustCompile(`(?m)^  --` + regexp.QuoteMeta(f.Name) + `\b.*\n\s+\S.*\(default .+\)$`)
		if !re.MatchString(help) {
			t.Errorf("--help does not document --%s with its default", f.Name)
		}
	})
	for _, want := range []string{"--count", "--role", "--zero-cost", "--kv-events", "--load-publish", "--fault-hang", "--speedup"} {
		if !strings.Contains(help, want) {
			t.Errorf("--help lacks %s", want)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader on different goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestCommandRuns(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- Command(ctx, []string{"--port", "0", "--count", "2", "--zero-cost", "--role", "prefill", "--kv-replay", "auto",
			"--kv-events-shape", "map", "--fault-fail-first", "1", "--log-level", "warn"}, &stdout, &stderr)
	}()
	urlRE := regexp.MustCompile(`listening on (http://\S+)`)
	var urls []string
	poll(t, "two engines to start", func() bool {
		urls = nil
		for _, m := range urlRE.FindAllStringSubmatch(stdout.String(), -1) {
			urls = append(urls, m[1])
		}
		return len(urls) == 2
	})
	c := newClient(t)
	for _, u := range urls {
		r := do(t, c, "GET", u+"/server_info", nil)
		m := r.json(t)
		if m["disaggregation_mode"] != "prefill" || path(t, m, "kv_events", "event_shape") != "map" || path(t, m, "kv_events", "replay_endpoint_port_base") == nil {
			t.Errorf("%s: server_info %s", u, r.body)
		}
		body := map[string]any{"text": "x", "bootstrap_host": "127.0.0.1", "bootstrap_room": 1}
		if r := do(t, c, "POST", u+"/generate", body); r.status != 500 {
			t.Errorf("%s: first request %d, want the injected 500", u, r.status)
		}
		if r := do(t, c, "POST", u+"/generate", body); r.status != 200 {
			t.Errorf("%s: second request %d %s", u, r.status, r.body)
		}
	}
	c.CloseIdleConnections()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Command: %v (stderr %s)", err, stderr.String())
	}
}

func TestCommandFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		check   func(t *testing.T, cfg Config)
		wantErr string
	}{
		{name: "derived ports", args: []string{"--port", "30000", "--dp-size", "2", "--kv-replay", "auto", "--role", "prefill"}, check: func(t *testing.T, cfg Config) {
			if cfg.KVEvents.PortBase != 31000 || cfg.LoadPublish.PortBase != 32000 || cfg.KVEvents.ReplayPortBase != 33000 || !cfg.KVEvents.Replay || cfg.BootstrapPort != 8998 {
				t.Errorf("ports %+v %+v bootstrap %d", cfg.KVEvents, cfg.LoadPublish, cfg.BootstrapPort)
			}
		}},
		{name: "explicit endpoints", args: []string{"--kv-events", "tcp://*:5557", "--load-publish", "off"}, check: func(t *testing.T, cfg Config) {
			if cfg.KVEvents.PortBase != 5557 || !cfg.LoadPublish.Disabled {
				t.Errorf("kv %+v load %+v", cfg.KVEvents, cfg.LoadPublish)
			}
		}},
		{name: "faults", args: []string{"--fault-drop-after-tokens", "0", "--fault-latency", "5ms", "--fault-hang"}, check: func(t *testing.T, cfg Config) {
			if !cfg.Faults.Drop || cfg.Faults.DropAfterTokens != 0 || cfg.Faults.Latency.Milliseconds() != 5 || !cfg.Faults.Hang {
				t.Errorf("faults %+v", cfg.Faults)
			}
		}},
		{name: "zero costs stay zero", args: []string{"--prefill-overhead", "0", "--prefill-per-token", "0", "--decode-step", "0", "--decode-per-request", "0"}, check: func(t *testing.T, cfg Config) {
			if *cfg.withDefaults().Costs != (Costs{}) {
				t.Errorf("costs %+v", *cfg.Costs)
			}
		}},
		{name: "vllm flavor has no load gauge", args: []string{"--flavor", "vllm", "--port", "30000"}, check: func(t *testing.T, cfg Config) {
			if cfg.Flavor != FlavorVLLM || !cfg.LoadPublish.Disabled || cfg.KVEvents.PortBase != 31000 {
				t.Errorf("flavor %q load %+v kv %+v", cfg.Flavor, cfg.LoadPublish, cfg.KVEvents)
			}
		}},
		{name: "unknown flavor", args: []string{"--flavor", "tgi"}, wantErr: `unknown flavor "tgi"`},
		{name: "overlap", args: []string{"--port", "30000", "--count", "1500"}, wantErr: "overlap"},
		{name: "port space", args: []string{"--port", "65000"}, wantErr: "exceed 65535"},
		{name: "every problem at once", args: []string{"--role", "router", "--kv-events-shape", "tuple", "--page-size", "-1", "--fault-fail-rate", "2"},
			wantErr: "role"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs, f := newFlagSet(io.Discard)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			cfg, err := f.config(io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				if tt.name == "every problem at once" {
					for _, w := range []string{"kv-events-shape", "page_size", "fail_rate"} {
						if !strings.Contains(err.Error(), w) {
							t.Errorf("err %v does not report %s", err, w)
						}
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, cfg)
		})
	}
}
