package httpfront

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"

	"github.com/valyala/fasthttp"

	"switchyard/actors"
	"switchyard/httpfront/fleet"
	"switchyard/httpfront/jsontext"
	"switchyard/load"
)

// maxAdminBody caps an admin request's body.
const maxAdminBody = 1 << 20

// admin serves the worker admin API: GET /workers, POST /workers, DELETE /workers/{id}.
// It is the slow path: it may allocate freely.
func (s *Server) admin(ctx *fasthttp.RequestCtx) {
	if e := s.adminAccess.check(ctx); e != nil {
		skipBody(ctx)
		writeError(ctx, e)
		return
	}
	path := string(ctx.Path())
	switch {
	case path == "/workers" && ctx.IsGet():
		s.listWorkers(ctx)
	case path == "/workers" && ctx.IsPost():
		s.addWorker(ctx)
	case len(path) > len("/workers/") && path[:len("/workers/")] == "/workers/" && ctx.IsDelete():
		id := path[len("/workers/"):]
		if err := s.workers.Remove(id); err != nil {
			writeError(ctx, newAPIError(CodeWorkerNotFound, "no worker "+strconv.Quote(id)))
			return
		}
		if n, err := s.affinity.InvalidateWorker(id); err != nil {
			s.logger.Warn("cannot invalidate the removed worker's affinity bindings", slog.String("worker", id), slog.Any("error", err))
		} else if n > 0 {
			s.logger.Info("invalidated affinity bindings", slog.String("worker", id), slog.Int("bindings", n))
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"removed":` + string(jsontext.AppendString(nil, id)) + `}`)
	case path == "/workers" || (len(path) > len("/workers/") && path[:len("/workers/")] == "/workers/"):
		writeError(ctx, errMethodNotAllowed)
	default:
		writeError(ctx, errNotFound)
	}
}

// workerView is one worker as GET /workers shows it: its lifecycle view and its load.
type workerView struct {
	fleet.View
	// Load says where the worker's load comes from and what the router sees of it.
	Load *loadView `json:"load,omitempty"`
}

// loadView is a worker's load as GET /workers shows it: the source, and the engine-reported
// figures (absent while unknown: stale, rank-incomplete or never reported).
type loadView struct {
	// Source is v1_loads, get_load, prometheus, zmq or none.
	Source string `json:"source"`
	// Flavor is the engine kind its metrics page revealed (vllm, sglang); omitted otherwise.
	Flavor string `json:"flavor,omitempty"`
	// Malformed counts load answers that did not decode.
	Malformed uint64 `json:"malformed"`
	Known     bool   `json:"known"`
	Running   *int64 `json:"running,omitempty"`
	Waiting   *int64 `json:"waiting,omitempty"`
	KVTokens  *int64 `json:"kv_used_tokens,omitempty"`
	KVTotal   *int64 `json:"kv_capacity_tokens,omitempty"`
}

// view returns m's admin view, with its load when the telemetry can tell it.
func (s *Server) view(m *fleet.Member) workerView {
	v := workerView{View: m.View()}
	if ls, ok := s.tele.(loadStatuser); ok {
		if status, ok := ls.LoadStatus(m.ID()); ok {
			v.Load = newLoadView(status, s.loads.Load().Observe(m.ID(), s.now()))
		}
	}
	return v
}

func (s *Server) listWorkers(ctx *fasthttp.RequestCtx) {
	members := s.workers.Members()
	views := make([]workerView, 0, len(members))
	for _, m := range members {
		views = append(views, s.view(m))
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"workers": views})
}

func (s *Server) addWorker(ctx *fasthttp.RequestCtx) {
	var spec WorkerSpec
	body, held, e := s.readBody(ctx, nil, maxAdminBody)
	defer s.budget.release(held)
	if e != nil {
		writeError(ctx, e)
		return
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		writeError(ctx, newAPIError(CodeInvalidWorker, "cannot decode worker: "+err.Error()))
		return
	}
	// The request goroutine waits for introspection (bounded by the health timeout); the
	// admin API is not on the hot path.
	m, err := s.workers.Add(context.Background(), spec, true)
	switch {
	case errors.Is(err, ErrWorkerExists):
		writeError(ctx, newAPIError(CodeWorkerExists, err.Error()))
		return
	case errors.Is(err, ErrInvalidWorker):
		writeError(ctx, newAPIError(CodeInvalidWorker, err.Error()))
		return
	case errors.Is(err, ErrIntrospection):
		writeError(ctx, newAPIError(CodeIntrospection, err.Error()))
		return
	case err != nil:
		writeError(ctx, newAPIError(CodeInternal, err.Error()))
		return
	}
	writeJSON(ctx, fasthttp.StatusCreated, s.view(m))
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(ctx, newAPIError(CodeInternal, err.Error()))
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

func newLoadView(st actors.LoadStatus, o load.Observation) *loadView {
	v := &loadView{Source: st.Source.String(), Flavor: st.Flavor, Malformed: st.Malformed, Known: o.Known()}
	opt := func(f load.Field, x int64) *int64 {
		if !o.Has(f) {
			return nil
		}
		return &x
	}
	v.Running = opt(load.HasRunning, o.Running)
	v.Waiting = opt(load.HasWaiting, o.Waiting)
	v.KVTokens = opt(load.HasUsedTokens, o.UsedTokens)
	v.KVTotal = opt(load.HasCapacity, o.MaxTotalTokens)
	return v
}
