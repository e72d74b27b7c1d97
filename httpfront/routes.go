package httpfront

import (
	"errors"
	"log/slog"
	"net"
	"slices"

	"github.com/valyala/fasthttp"

	"switchyard/httpfront/jsontext"
)

// handleServerError answers fasthttp's own failures: headers over server.max_header_bytes
// (431), a request that did not arrive in time (408), a malformed request (400). The
// connection closes after the answer, lingering unless the client was silent: it may still
// be sending.
func (s *Server) handleServerError(ctx *fasthttp.RequestCtx, err error) {
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.As(err, &small):
		writeError(ctx, errHeaderTooLarge)
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		writeError(ctx, errTooLarge)
	case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, fasthttp.ErrTimeout):
		// The client sent nothing more in time: nothing to drain.
		writeError(ctx, newAPIError(CodeRequestTimeout, "the request did not arrive in time"))
		ctx.SetConnectionClose()
		return
	default:
		writeError(ctx, newAPIError(CodeMalformedRequest, "malformed HTTP request"))
	}
	lingerClose(ctx)
}

// expectContinue answers "Expect: 100-continue": a body announced over the cap gets 413 at
// once, without 100 Continue, and the connection closes lingering.
func (s *Server) expectContinue(ctx *fasthttp.RequestCtx) int {
	if int64(ctx.Request.Header.ContentLength()) > s.maxBody() {
		writeError(ctx, errTooLarge)
		lingerClose(ctx)
		return fasthttp.StatusRequestEntityTooLarge
	}
	return fasthttp.StatusContinue
}

// lingerClose closes ctx's connection after the answer, lingering (see lingerMaxBytes): for
// an answer sent before the request body was read.
func lingerClose(ctx *fasthttp.RequestCtx) {
	ctx.SetConnectionClose()
	if c, ok := ctx.Conn().(*clientConn); ok {
		c.lingerOnClose()
	}
}

// handle routes a request. A panic fails only its own request, with a 500.
//
// The routing is route's: with its many returns here, the compiler would not open-code the
// deferred recover (a defer record pushed and run by the runtime on every request).
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	defer func() {
		if r := recover(); r != nil {
			s.logger.Error("request handler panicked", slog.Any("panic", r), slog.String("path", string(ctx.Path())))
			writeError(ctx, newAPIError(CodeInternal, "internal error"))
		}
	}()
	s.route(ctx)
}

// route serves a request by its path.
func (s *Server) route(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	switch string(path) {
	case "/v1/chat/completions":
		s.inference(ctx, routeChat)
		return
	case "/v1/completions":
		s.inference(ctx, routeCompletions)
		return
	case "/generate":
		s.inference(ctx, routeGenerate)
		return
	case "/v1/responses":
		s.inference(ctx, routeResponses)
		return
	case "/v1/embeddings":
		s.inference(ctx, routeEmbeddings)
		return
	case "/v1/rerank", "/rerank":
		s.inference(ctx, routeRerank)
		return
	case "/tokenize":
		s.inference(ctx, routeTokenize)
		return
	case "/detokenize":
		s.inference(ctx, routeDetokenize)
		return
	case "/get_model_info":
		s.metrics.other[otherModelInfo].Inc()
		s.modelInfo(ctx)
		return
	case "/get_server_info":
		s.metrics.other[otherServerInfo].Inc()
		s.serverInfo(ctx)
		return
	case "/flush_cache":
		s.metrics.other[otherFlushCache].Inc()
		s.flushCache(ctx)
		return
	case "/v1/models":
		s.metrics.other[otherModels].Inc()
		if !s.clientGet(ctx) {
			return
		}
		ctx.SetContentType("application/json")
		if s.lora != nil {
			ctx.SetBody(s.modelsWithAdapters())
			return
		}
		ctx.SetBody(s.modelsBody())
		return
	case "/health", "/liveness":
		s.metrics.other[otherHealth].Inc()
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"status":"ok"}`)
		return
	case "/readiness":
		s.metrics.other[otherReadiness].Inc()
		s.readiness(ctx)
		return
	case "/metrics":
		if s.metricsLn != nil {
			s.metrics.other[otherUnknown].Inc()
			writeError(ctx, errMetricsElsewhere)
			return
		}
		s.writeMetrics(ctx)
		return
	}
	if len(path) >= len("/workers") && string(path[:len("/workers")]) == "/workers" {
		s.metrics.other[otherAdmin].Inc()
		s.admin(ctx)
		return
	}
	s.metrics.other[otherUnknown].Inc()
	writeError(ctx, errNotFound)
}

// readiness answers 200 when every configured model has a healthy engine for every stage
// its buckets require, else 503 naming what is missing.
func (s *Server) readiness(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	if s.draining.Load() {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString(`{"status":"draining"}`)
		return
	}
	reg := s.wset.Load()
	var missing []byte
	names := make([]string, 0, len(s.models))
	for n := range s.models {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		for _, st := range s.models[n].stages {
			if len(reg.Healthy(n, st)) == 0 {
				if len(missing) > 0 {
					missing = append(missing, ',')
				}
				missing = jsontext.AppendString(missing, n+"/"+st.String())
			}
		}
	}
	if len(missing) > 0 {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString(`{"status":"not_ready","missing":[` + string(missing) + `]}`)
		return
	}
	ctx.SetBodyString(`{"status":"ready"}`)
}
