package httpfront

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/httpfront/fleet"
	"switchyard/load"
)

// The routes clients call beside inference, as sgl-router serves them: GET /get_model_info
// (through the selection, to one engine of the model), GET /get_server_info (every engine's,
// gathered), POST /flush_cache (sent to every engine, each one's answer reported) and
// GET /v1/models (every model the fleet serves). They are the slow path.

// maxEchoBody bounds what an engine's answer to a gathered call contributes.
const maxEchoBody = 64 << 10

// modelsBody returns GET /v1/models: every configured model and every model a registered
// worker serves, sorted.
func (s *Server) modelsBody() []byte {
	names := make([]string, 0, len(s.models))
	for n := range s.models {
		names = append(names, n)
	}
	for _, w := range s.wset.Load().Workers() {
		names = append(names, w.Model)
	}
	slices.Sort(names)
	return modelsBody(slices.Compact(names))
}

// modelInfo answers GET /get_model_info[?model=NAME] with the answer of one engine of the
// model, chosen by the model's selection as a request of no length would be.
func (s *Server) modelInfo(ctx *fasthttp.RequestCtx) {
	if !s.clientGet(ctx) {
		return
	}
	mr := s.only
	if name := ctx.QueryArgs().Peek("model"); len(name) > 0 {
		mr = s.models[string(name)]
		if mr == nil {
			writeError(ctx, paramError(CodeModelNotFound, "model", "the model `"+string(name)+"` does not exist"))
			return
		}
	}
	if mr == nil {
		writeError(ctx, paramError(CodeMissingModel, "model", "more than one model is configured: name one with ?model="))
		return
	}
	start := s.now()
	breq := &engine.BucketRequest{Model: mr.name, ExpectedPeak: -1, Now: start}
	pick, adm, e := s.selectAdmitted(mr, breq, start)
	if e != nil {
		writeError(ctx, e)
		return
	}
	w, m, ticket := pick.Plain.Worker, adm.plain, adm.tPlain
	if pick.IsPD() {
		adm.tDecode.Done(fleet.OutcomeNeutral)
		w, m, ticket = pick.Prefill.Worker, adm.prefill, adm.tPrefill
	}
	guard := s.tracker.Acquire(w.Counters, start)
	defer guard.Release()
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodGet)
	req.SetRequestURI(fleet.PathGetModelInfo)
	req.Header.SetHost(m.Upstream().HostPort())
	if err := m.Upstream().Do(req, resp, time.Now().Add(s.cfg.Health.Timeout)); err != nil {
		ae, verdict := s.upstreamFailure(w, err)
		ticket.Done(verdict)
		writeError(ctx, ae)
		return
	}
	ticket.Done(s.statusOutcome(w, resp.StatusCode()))
	ctx.SetStatusCode(resp.StatusCode())
	ctx.SetContentTypeBytes(resp.Header.ContentType())
	ctx.Response.Header.Set(headerWorker, w.ID)
	ctx.SetBody(resp.Body())
}

// selectAdmitted runs the bucket loop for breq and has the picked engines admit the
// dispatch, selecting again without an engine that refuses (its half-open breaker's probe
// is taken, or it was removed), for a call that is not retried.
func (s *Server) selectAdmitted(mr *modelRoute, breq *engine.BucketRequest, start time.Time) (pick engine.BucketPick, adm picked, e *apiError) {
	for round := 1; ; round++ {
		var err error
		if pick, err = s.sel.Select(mr.resolver, breq); err != nil {
			s.metrics.selectionFailed(err)
			return pick, adm, selectionError(err)
		}
		a, refused := admitPicked(&pick, start)
		if refused == nil {
			return pick, a, nil
		}
		if round == maxAdmitRounds || !breq.Retry.Excluded.Add(refused) {
			return pick, adm, newAPIError(CodeNoAvailableEngine, "every engine selected for the request refused it")
		}
	}
}

// gathered is one engine's part of a gathered call.
type gathered struct {
	ID     string          `json:"id"`
	URL    string          `json:"url"`
	Model  string          `json:"model"`
	Role   string          `json:"role"`
	Status int             `json:"status,omitempty"`
	Body   json.RawMessage `json:"-"`
	Error  string          `json:"error,omitempty"`
}

// gather runs call on every worker at once and returns their answers by worker ID.
func (s *Server) gather(call func(m *fleet.Member, g *gathered)) []gathered {
	members := s.workers.Members()
	out := make([]gathered, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		w := m.Worker()
		out[i] = gathered{ID: m.ID(), URL: m.URL(), Model: w.Model, Role: w.Stage.String()}
		wg.Go(func() { call(m, &out[i]) })
	}
	wg.Wait()
	return out
}

// serverInfo answers GET /get_server_info: the introspection of the first engine that
// answers (plain or prefill engines first, by ID), which clients written for one engine read,
// and under "workers" every engine's, or why it has none.
func (s *Server) serverInfo(ctx *fasthttp.RequestCtx) {
	if !s.clientGet(ctx) {
		return
	}
	parts := s.gather(func(m *fleet.Member, g *gathered) {
		if m.Spec().Flavor == config.FlavorVLLM {
			g.Error = "the engine has no introspection route (flavor vllm)"
			return
		}
		base := strings.TrimRight(m.URL(), "/")
		var last error
		for _, path := range []string{fleet.PathServerInfo, fleet.PathGetServerInfo} {
			err := load.Fetch(context.Background(), m.Upstream().Probe(), base+path, "application/json", s.cfg.Health.Timeout, maxEchoBody,
				func(status int, body []byte) error {
					g.Status = status
					if status != fasthttp.StatusOK || !json.Valid(body) || bytes.TrimSpace(body)[0] != '{' {
						return errNotJSONObject
					}
					g.Body = append(json.RawMessage(nil), body...)
					return nil
				})
			if err == nil {
				return
			}
			last = err
		}
		g.Error = last.Error()
	})
	top := map[string]any{}
	slices.SortStableFunc(parts, func(a, b gathered) int {
		return compareBool(a.Role == "decode", b.Role == "decode")
	})
	for _, p := range parts {
		if p.Body != nil && json.Unmarshal(p.Body, &top) == nil {
			break
		}
	}
	workers := make([]map[string]any, len(parts))
	for i, p := range parts {
		w := map[string]any{"id": p.ID, "url": p.URL, "model": p.Model, "role": p.Role}
		if p.Body != nil {
			w["server_info"] = p.Body
		} else {
			w["error"] = p.Error
		}
		workers[i] = w
	}
	top["workers"] = workers
	writeJSON(ctx, fasthttp.StatusOK, top)
}

// errNotJSONObject: an engine's answer is not a JSON object.
var errNotJSONObject = newAPIError(CodeUpstream, "the engine's answer is not a JSON object")

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// flushCache answers POST /flush_cache: every engine is asked to flush its prefix cache
// (/flush_cache; a vLLM-flavoured one /reset_prefix_cache), and each one's answer is
// reported. 200 when every engine flushed, else 502 with the same report. It is an admin
// route. An engine that flushed holds nothing any more: the approximate source forgets what
// it held.
func (s *Server) flushCache(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() && !ctx.IsGet() {
		writeError(ctx, errMethodNotAllowed)
		return
	}
	if e := s.adminAccess.check(ctx); e != nil {
		writeError(ctx, e)
		return
	}
	parts := s.gather(func(m *fleet.Member, g *gathered) {
		path := "/flush_cache"
		if m.Spec().Flavor == config.FlavorVLLM {
			path = "/reset_prefix_cache"
		}
		req := fasthttp.AcquireRequest()
		resp := fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetRequestURI(strings.TrimRight(m.URL(), "/") + path)
		if err := m.Upstream().Probe().DoDeadline(req, resp, time.Now().Add(s.cfg.Health.Timeout)); err != nil {
			g.Error = err.Error()
			return
		}
		g.Status = resp.StatusCode()
		if g.Status/100 != 2 {
			body := resp.Body()
			g.Error = "the engine answered " + string(body[:min(len(body), 512)])
		}
	})
	results := make([]map[string]any, len(parts))
	failed := 0
	for i, p := range parts {
		ok := p.Error == ""
		r := map[string]any{"id": p.ID, "url": p.URL, "success": ok}
		if p.Status != 0 {
			r["status"] = p.Status
		}
		if !ok {
			failed++
			r["error"] = p.Error
		} else if s.cache != nil && s.cache.Approximate() != nil {
			s.cache.Approximate().RemoveWorker(p.ID)
		}
		results[i] = r
	}
	body := map[string]any{"success": failed == 0, "results": results}
	if failed == 0 {
		body["message"] = "every engine flushed its cache"
		writeJSON(ctx, fasthttp.StatusOK, body)
		return
	}
	e := newAPIError(CodeUpstream, "not every engine flushed its cache")
	body["error"] = map[string]any{"message": e.message, "type": e.class().typ, "param": nil, "code": e.code}
	writeJSON(ctx, e.status(), body)
}

// clientGet admits a GET on a client route: it answers 405 to another method and 401 without
// the client key (server.api_key), and then returns false.
func (s *Server) clientGet(ctx *fasthttp.RequestCtx) bool {
	if !ctx.IsGet() {
		writeError(ctx, errMethodNotAllowed)
		return false
	}
	if e := checkKey(ctx, s.cfg.Server.APIKey); e != nil {
		writeError(ctx, e)
		return false
	}
	return true
}
