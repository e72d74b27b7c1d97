package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"switchyard/bench/harness"
	"switchyard/bench/mockengine"
	"switchyard/config"
	"switchyard/httpfront"
	"switchyard/httpfront/fleet"
	"switchyard/load"
)

// runServe is the serve subcommand: it loads and validates the configuration, builds the
// front end and serves until ctx is cancelled (SIGINT/SIGTERM), then drains gracefully.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := loadServe(ctx, args, stdout, stderr)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: logLevel(cfg.Log.Level)}))
	exposeMetricKinds()
	set := metrics.NewSet()
	currentStamp().registerBuildInfo(set)
	srv, err := httpfront.New(cfg, httpfront.Options{Logger: logger, Metrics: set})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "switchyard serving on http://%s\n", srv.Addr())
	for _, a := range srv.RouteAccess() {
		mark := ""
		if a.Warn {
			mark = "  <-- check"
		}
		fmt.Fprintf(stdout, "  %-30s %s%s\n", a.Routes+":", a.Access, mark)
	}
	return srv.Run(ctx)
}

// exposeMetricKinds makes /metrics say each family's kind (# TYPE counter, gauge, histogram),
// so that Prometheus and Grafana treat counters as counters. The metrics library keeps this
// switch process-wide; the binary's commands that serve /metrics turn it on.
func exposeMetricKinds() { metrics.ExposeMetadata(true) }

// loadServe builds serve's configuration. sgl-router's command line names no model: the
// workers it lists are asked which one they serve first, waiting for them as sgl-router
// does at start-up (--worker-startup-timeout-secs, --worker-startup-check-interval).
func loadServe(ctx context.Context, args []string, stdout, stderr io.Writer) (*config.Config, error) {
	const usage = "usage: switchyard serve [--config FILE] [flags]"
	cl, err := config.ParseCommandLine(args)
	if err != nil {
		return checkLoaded(nil, err, stdout, stderr, "serve", usage)
	}
	if urls := cl.NeedsModel(); len(urls) > 0 {
		timeout, interval := cl.StartupWait()
		fmt.Fprintf(stderr, "switchyard: asking %d engines which model they serve (up to %s)\n", len(urls), timeout)
		client := &fasthttp.Client{Name: "switchyard", NoDefaultUserAgentHeader: true, MaxConnsPerHost: 2}
		defer client.CloseIdleConnections()
		var doer load.Doer = client
		if key, ok := cl.Setting("upstream.api_key"); ok && key != "" {
			doer = bearerDoer{client, "Bearer " + key}
		}
		model, err := fleet.WaitForModel(ctx, doer, urls, timeout, interval, nil)
		if err != nil {
			fmt.Fprintf(stderr, "cannot learn the model the workers serve: %v\n", err)
			return nil, errReported
		}
		cl.SetModel(model)
	}
	cfg, err := cl.Load(os.Environ())
	return checkLoaded(cfg, err, stdout, stderr, "serve", usage)
}

// bearerDoer sends every request with an Authorization header (the workers' key).
type bearerDoer struct {
	c    load.Doer
	auth string
}

func (b bearerDoer) DoDeadline(req *fasthttp.Request, resp *fasthttp.Response, deadline time.Time) error {
	req.Header.Set(fasthttp.HeaderAuthorization, b.auth)
	return b.c.DoDeadline(req, resp, deadline)
}

func logLevel(s string) slog.Level {
	switch s {
	case config.LogLevelDebug:
		return slog.LevelDebug
	case config.LogLevelWarn:
		return slog.LevelWarn
	case config.LogLevelError:
		return slog.LevelError
	}
	return slog.LevelInfo
}

// runServeDemo starts embedded mock engines (two plain engines behind a short and a long
// bucket, and a prefill/decode pair), puts the router in front of them on a loopback port,
// sends a short burst of chat requests, streaming and not, and prints where each went.
func runServeDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dispatch-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	setUsage(fs, "usage: switchyard dispatch-demo",
		"Starts mock engines and the router on 127.0.0.1, sends a burst of chat requests and prints where each went.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	start := func(id, model string, role mockengine.Role) (*mockengine.Engine, error) {
		return mockengine.Start(ctx, mockengine.Config{WorkerID: id, Model: model, Role: role, Speedup: 20,
			KVEvents: mockengine.KVEvents{Disabled: true}})
	}
	var engines []*mockengine.Engine
	defer func() {
		for _, e := range engines {
			_ = e.Close()
		}
	}()
	specs := []struct {
		id, model string
		role      mockengine.Role
	}{
		{"short-1", "llama", mockengine.RolePlain},
		{"long-1", "llama", mockengine.RolePlain},
		{"prefill-1", "llama-pd", mockengine.RolePrefill},
		{"decode-1", "llama-pd", mockengine.RoleDecode},
	}
	cfg := config.Default()
	cfg.Server.Port = 0
	for _, sp := range specs {
		e, err := start(sp.id, sp.model, sp.role)
		if err != nil {
			return err
		}
		engines = append(engines, e)
		cfg.Workers = append(cfg.Workers, config.Worker{ID: sp.id, URL: e.URL(), Model: sp.model,
			Role: config.Role(sp.role), DPSize: 1})
	}
	shortMax, longMax, shortCtx := int64(256), int64(65536), int64(1024)
	cfg.Models = map[string]config.Model{
		"llama": {Buckets: []config.Bucket{
			{ID: "short", Rank: 10, Limits: config.Limits{Max: &shortMax}, MaxContextTokens: &shortCtx,
				Groups: config.Groups{Plain: &config.Group{WorkerIDs: &[]string{"short-1"}}}},
			{ID: "long", Rank: 20, Limits: config.Limits{Max: &longMax},
				Groups: config.Groups{Plain: &config.Group{WorkerIDs: &[]string{"long-1"}}}},
		}},
		"llama-pd": {Buckets: []config.Bucket{{ID: "pd", Groups: config.Groups{PD: &config.PDGroups{
			Prefill: &config.Group{Policy: &config.Policy{Type: config.PolicyPowerOfTwo}},
			Decode:  &config.Group{Policy: &config.Policy{Type: config.PolicyPowerOfTwo}},
		}}}}},
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	srv, err := httpfront.New(cfg, httpfront.Options{Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx) }()
	defer func() {
		stop()
		<-done
	}()
	base := "http://" + srv.Addr().String()
	fmt.Fprintf(stdout, "router on %s in front of %d mock engines\n\n", base, len(engines))
	client := &http.Client{Timeout: 30 * time.Second}
	if err := harness.WaitReady(ctx, base, 10*time.Second); err != nil {
		return err
	}
	burst := []struct {
		model, prompt string
		maxTokens     int
		stream        bool
	}{
		{"llama", "Hello!", 16, false},
		{"llama", "Stream me a short poem.", 16, true},
		{"llama", strings.Repeat("A very long document. ", 150), 16, false},
		{"llama", "Short prompt, long answer.", 2000, true},
		{"llama-pd", "Disaggregated hello.", 16, false},
		{"llama-pd", "Disaggregated stream.", 16, true},
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tmodel\tstream\tmax_tokens\tstatus\tbucket\tworker\tprefill\tchunks")
	for i, r := range burst {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":%t}`,
			r.model, r.prompt, r.maxTokens, r.stream)
		resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			return err
		}
		chunks := 0
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 8<<20)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "data: ") {
				chunks++
			}
		}
		resp.Body.Close()
		prefill := resp.Header.Get("X-Switchyard-Prefill-Worker")
		if prefill == "" {
			prefill = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%t\t%d\t%d\t%s\t%s\t%s\t%d\n", i+1, r.model, r.stream, r.maxTokens, resp.StatusCode,
			resp.Header.Get("X-Switchyard-Bucket"), resp.Header.Get("X-Switchyard-Worker"), prefill, chunks)
	}
	return tw.Flush()
}
