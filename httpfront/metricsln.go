package httpfront

import (
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"
)

// metricsListener serves GET /metrics on a listener of its own (server.metrics_host and
// metrics_port), apart from the data plane, whose /metrics then answers 404; it asks what
// the data plane's /metrics asks (server.metrics_api_key). It serves from Run's start until
// the drain is over, so that the drain itself can be watched.
type metricsListener struct {
	ln      net.Listener
	srv     *fasthttp.Server
	started bool
	done    chan struct{}
}

// listenMetrics opens the metrics listener when server.metrics_port is set, as the last part
// New builds: it stops first of them, after the drain.
func (s *Server) listenMetrics() error {
	if s.cfg.Server.MetricsPort == nil {
		return nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(s.cfg.Server.MetricsHost, strconv.Itoa(*s.cfg.Server.MetricsPort)))
	if err != nil {
		return err
	}
	s.metricsLn = &metricsListener{
		ln: ln,
		srv: &fasthttp.Server{
			Handler:               s.handleMetricsListener,
			Name:                  "switchyard",
			NoDefaultServerHeader: true,
			ReadTimeout:           s.opts.ReadTimeout,
			WriteTimeout:          time.Minute,
			IdleTimeout:           s.opts.IdleTimeout,
			MaxRequestBodySize:    1 << 10,
			CloseOnShutdown:       true,
			Logger:                fasthttpLogger{s.logger},
		},
		done: make(chan struct{}),
	}
	s.life.add("metrics listener", s.stopMetrics)
	s.metricsAccess.desc.Routes = "/metrics (on " + ln.Addr().String() + ", server.metrics_port)"
	return nil
}

// MetricsAddr is the address of the separate metrics listener, or nil when /metrics is
// served on the data plane.
func (s *Server) MetricsAddr() net.Addr {
	if s.metricsLn == nil {
		return nil
	}
	return s.metricsLn.ln.Addr()
}

// startMetrics serves the metrics listener until stopMetrics.
func (s *Server) startMetrics() {
	m := s.metricsLn
	if m == nil {
		return
	}
	m.started = true
	s.logger.Info("serving metrics apart from the data plane", slog.String("addr", m.ln.Addr().String()))
	go func() {
		defer close(m.done)
		if err := m.srv.Serve(m.ln); err != nil {
			s.logger.Error("metrics listener stopped", slog.Any("error", err))
		}
	}()
}

// stopMetrics stops the metrics listener and waits for it (a listener never served is
// closed).
func (s *Server) stopMetrics() {
	m := s.metricsLn
	if m == nil {
		return
	}
	if !m.started {
		_ = m.ln.Close()
		return
	}
	_ = m.srv.Shutdown()
	_ = m.ln.Close() // Serve may not have registered it yet
	<-m.done
}

// handleMetricsListener answers the metrics listener: GET /metrics, nothing else.
func (s *Server) handleMetricsListener(ctx *fasthttp.RequestCtx) {
	if string(ctx.Path()) != "/metrics" {
		writeError(ctx, errNotFound)
		return
	}
	s.writeMetrics(ctx)
}

// writeMetrics answers GET /metrics with the Server's metrics and the process's, to a
// request that passes server.metrics_api_key.
func (s *Server) writeMetrics(ctx *fasthttp.RequestCtx) {
	s.metrics.other[otherMetrics].Inc()
	if e := s.metricsAccess.check(ctx); e != nil {
		writeError(ctx, e)
		return
	}
	ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
	s.set.WritePrometheus(ctx)
	metrics.WriteProcessMetrics(ctx)
}

// errMetricsElsewhere answers /metrics on the data plane when a metrics listener serves it.
var errMetricsElsewhere = newAPIError(CodeNotFound, "metrics are served on the metrics listener (server.metrics_port)")
