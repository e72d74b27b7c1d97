package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"switchyard/actors"
	"switchyard/httpfront/fleet"
	"switchyard/kv"
	"switchyard/kv/index"
	"switchyard/kv/indexer"
	"switchyard/kv/subscribe"
)

// defaultIndexerListen is the indexer's listen address when --listen is not given.
const defaultIndexerListen = "127.0.0.1:9400"

// runIndexer is the indexer subcommand: the prefix index as a network service that several
// routers share (cache_aware.source remote, cache_aware.remote_url). It reads the same
// configuration as serve — the workers and the kv section — subscribes to every worker's KV
// events itself, and serves indexer.Handler's routes until ctx is cancelled.
//
//	switchyard indexer [--listen HOST:PORT] [--config FILE] [configuration flags]
func runIndexer(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	listen, rest, err := indexerFlags(args)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errReported
	}
	cfg, err := loadConfig(rest, stdout, stderr, "indexer",
		"usage: switchyard indexer [--listen HOST:PORT] [--config FILE] [flags]",
		fmt.Sprintf("  --listen HOST:PORT  address of the indexer's HTTP service (default %s)", defaultIndexerListen))
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: logLevel(cfg.Log.Level)}))
	exposeMetricKinds()
	set := metrics.NewSet()
	idx, err := index.New(index.Config{Shards: cfg.KV.Shards, MaxBlocks: cfg.KV.MaxBlocks, HashCacheChunks: cfg.KV.HashCacheChunks, BlockKey: cfg.KV.BlockKey,
		SplitBlocks: cfg.KV.LookupSplitBlocks, Metrics: kv.NewMetrics(set)})
	if err != nil {
		return err
	}
	defer idx.Close()
	// Engines named without a kv_events endpoint are introspected, as the router does.
	client := &fasthttp.Client{Name: "switchyard-indexer", NoDefaultUserAgentHeader: true, MaxConnsPerHost: 4,
		MaxIdleConnDuration: cfg.Upstream.MaxIdleConnDuration, ReadTimeout: cfg.Health.Timeout}
	defer client.CloseIdleConnections()
	mc := actors.ManagerConfigFrom(cfg, idx, logger.With(slog.String("component", "kv")), nil)
	mc.Discover = &fleet.KVDiscoverer{Client: client, Timeout: cfg.Health.Timeout}
	mgr, err := subscribe.NewManager(mc)
	if err != nil {
		return err
	}
	for _, w := range cfg.Workers {
		if err := mgr.AddWorker(actors.WorkerSpecFrom(w)); err != nil {
			return fmt.Errorf("cannot follow worker %s: %w", w.ID, err)
		}
	}
	h, err := indexer.NewHandler(indexer.Config{Index: idx, Manager: mgr, Metrics: set, Logger: logger})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %w", listen, err)
	}
	srv := &fasthttp.Server{
		Handler:            h.Serve,
		Name:               "switchyard-indexer",
		MaxRequestBodySize: indexer.MaxQueryBytes,
		ReadTimeout:        cfg.Server.RequestTimeout,
		Logger:             slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Go(func() { errs <- mgr.Run(runCtx) })
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil {
			errs <- fmt.Errorf("cannot serve: %w", err)
			cancel()
		}
	})
	logger.Info("indexer started", slog.String("listen", ln.Addr().String()), slog.Int("workers", len(cfg.Workers)),
		slog.String("bind_endpoint", cfg.KV.BindEndpoint))
	fmt.Fprintf(stdout, "switchyard indexer listening on http://%s\n", ln.Addr())
	<-runCtx.Done()
	sctx, scancel := context.WithTimeout(context.Background(), cfg.Server.DrainTimeout)
	defer scancel()
	if err := srv.ShutdownWithContext(sctx); err != nil {
		logger.Warn("indexer shutdown incomplete", slog.Any("error", err))
	}
	cancel()
	wg.Wait()
	close(errs)
	var first error
	for err := range errs {
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

// indexerFlags takes --listen (or -listen, with "=" or a separate value) out of args and
// returns the rest for config.Load.
func indexerFlags(args []string) (listen string, rest []string, err error) {
	listen = defaultIndexerListen
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "listen" {
			rest = append(rest, a)
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				return "", nil, errors.New("switchyard indexer: --listen needs HOST:PORT")
			}
			i++
			value = args[i]
		}
		if _, _, err := net.SplitHostPort(value); err != nil {
			return "", nil, fmt.Errorf("switchyard indexer: --listen %q: %w", value, err)
		}
		listen = value
	}
	return listen, rest, nil
}
