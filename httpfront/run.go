package httpfront

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"switchyard/config"
	"switchyard/httpfront/hangup"
)

// Run checks the configured workers once (introspection and health, unless
// Options.SkipStartupChecks), starts health checks and the guard janitor, and serves until
// ctx is done. It then stops accepting connections, lets in-flight requests and streams
// finish for up to the drain timeout, ends whatever remains, and releases everything. Run
// may be called once; it returns nil after a clean shutdown.
func (s *Server) Run(ctx context.Context) error {
	err := errors.New("cannot run server: Run called twice")
	s.runOnce.Do(func() { err = s.run(ctx) })
	return err
}

// run starts the background parts after those New built, serves, drains, and stops every
// part in reverse order of starting.
func (s *Server) run(ctx context.Context) error {
	defer func() {
		s.life.stop()
		s.logger.Info("stopped")
	}()
	// The metrics listener serves from the start, through the drain (life stops it).
	s.startMetrics()
	if s.cfg.Abort.Enabled {
		// One goroutine watches every dispatching request's client (abort.go); without it
		// (not Linux) each watch has a goroutine of its own.
		if p, err := hangup.NewPoller(); err == nil {
			s.poller, s.conns.poller = p, p
			s.life.add("hang-up poller", func() { _ = p.Close() })
		}
	}
	if !s.opts.SkipStartupChecks {
		s.workers.StartupCheck(ctx)
	}
	health, stopHealth := context.WithCancel(context.Background())
	s.workers.Start(health)
	s.life.add("health checks", stopHealth) // the workers part waits for the loops
	s.life.spawn("guard janitor", s.runJanitor)
	s.life.spawn("affinity sweeper", s.runSweeper)
	if s.discovery != nil {
		// Pods keep joining and leaving until the drain is over.
		s.life.spawn("kubernetes discovery", s.discovery.Run)
	}
	if s.cache != nil {
		// The KV-event subscriptions follow the engines until the drain is over.
		s.life.spawn("KV-event subscriptions", func(ctx context.Context) {
			if err := s.cache.Run(ctx); err != nil {
				s.logger.Error("KV-event subscriptions stopped", slog.Any("error", err))
			}
		})
	}
	err := s.serve(ctx)
	// The drain is over: a cluster replica hands its bindings to the others before its
	// parts stop.
	s.leaveCluster()
	return err
}

// serve runs the fasthttp server until ctx is done (or Serve fails), then drains.
func (s *Server) serve(ctx context.Context) error {
	serveErr := make(chan error, 1)
	go func() { serveErr <- s.srv.Serve(s.conns) }()
	close(s.serving)
	s.logger.Info("serving", slog.String("addr", s.ln.Addr().String()), slog.Int("models", len(s.models)),
		slog.Int("workers", len(s.wset.Load().Workers())))
	for _, a := range s.RouteAccess() {
		level := slog.LevelInfo
		if a.Warn {
			level = slog.LevelWarn
		}
		s.logger.Log(context.Background(), level, "route access", slog.String("routes", a.Routes), slog.String("access", a.Access))
	}

	var runErr error
	served := false
	select {
	case <-ctx.Done():
	case runErr = <-serveErr:
		served = true
	}
	s.draining.Store(true)
	drain := s.cfg.Server.DrainTimeout
	if drain <= 0 {
		drain = 30 * time.Second
	}
	s.logger.Info("draining", slog.Duration("timeout", drain))
	dctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	if err := s.srv.ShutdownWithContext(dctx); err != nil {
		s.logger.Warn("drain timeout passed; closing remaining connections and streams")
	}
	// Shutdown closes only the listeners Serve has registered; when the context was cancelled
	// before Serve got that far, closing ours makes Serve return (a closed listener ends it
	// without error).
	_ = s.ln.Close()
	if !served {
		runErr = <-serveErr
	}
	// Prefill requests whose client has gone still count as in flight.
	bgDone := make(chan struct{})
	go func() {
		s.bg.Wait()
		close(bgDone)
	}()
	select {
	case <-bgDone:
	case <-dctx.Done():
	}
	// Streams still running end now with a shutting_down event; connections carrying one get
	// a bounded moment to deliver it before every connection closes.
	close(s.hardStop)
	s.workers.InterruptStreams()
	s.conns.closeIdle()
	gctx, cancelGrace := context.WithTimeout(context.Background(), s.opts.StreamEndGrace)
	if !s.conns.waitClosed(gctx) {
		s.logger.Warn("closing connections whose streams did not end in time", slog.Duration("grace", s.opts.StreamEndGrace))
	}
	cancelGrace()
	s.conns.closeAll()
	s.resumed.close()
	s.workers.CloseConnections()
	<-bgDone
	return runErr
}

// runJanitor releases in-flight guards older than load.guard_max_age (leaked by a bug)
// until ctx is done.
func (s *Server) runJanitor(ctx context.Context) {
	maxAge := s.cfg.Load.GuardMaxAge
	if maxAge <= 0 {
		maxAge = config.Default().Load.GuardMaxAge
	}
	t := time.NewTicker(DefaultJanitorInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n := s.tracker.ReleaseStale(s.now(), maxAge); n > 0 {
				s.metrics.staleGuards.Add(n)
				s.logger.Warn("released leaked in-flight guards", slog.Int("count", n))
			}
		}
	}
}

// runSweeper expires idle affinity bindings every affinity.sweep_interval until ctx is done.
func (s *Server) runSweeper(ctx context.Context) {
	sweep := s.cfg.Affinity.SweepInterval
	if sweep <= 0 {
		sweep = time.Minute
	}
	t := time.NewTicker(sweep)
	defer t.Stop()
	s.affinity.RunSweeper(ctx, t.C)
}
