package httpfront

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"switchyard/actors"
	"switchyard/config"
	"switchyard/httpfront/fleet"
	"switchyard/load"
)

// maxAdminBody caps an admin request's body.
const maxAdminBody = 1 << 20

// admin serves the worker admin API: GET /workers, POST /workers, GET and DELETE
// /workers/{id or URL}. A worker is named by its ID or, as sgl-router's clients do, by its
// URL (URL-encoded in the path). It is the slow path: it may allocate freely.
func (s *Server) admin(ctx *fasthttp.RequestCtx) {
	if e := s.adminAccess.check(ctx); e != nil {
		skipBody(ctx)
		writeError(ctx, e)
		return
	}
	path := string(ctx.Path())
	const prefix = "/workers/"
	switch {
	case path == "/workers" && ctx.IsGet():
		s.listWorkers(ctx)
	case path == "/workers" && ctx.IsPost():
		s.addWorker(ctx)
	case len(path) > len(prefix) && path[:len(prefix)] == prefix && (ctx.IsGet() || ctx.IsDelete()):
		ref, ok := workerRef(ctx)
		if !ok {
			writeError(ctx, newAPIError(CodeInvalidWorker, "the worker must be named by its ID or its URL-encoded URL"))
			return
		}
		if ctx.IsGet() {
			s.getWorker(ctx, ref)
			return
		}
		s.deleteWorker(ctx, ref)
	case path == "/workers" || (len(path) > len(prefix) && path[:len(prefix)] == prefix):
		writeError(ctx, errMethodNotAllowed)
	default:
		writeError(ctx, errNotFound)
	}
}

// workerRef returns the worker a /workers/{ref} path names: the rest of the path as sent
// (not normalized, so that "http://" survives), URL-decoded.
func workerRef(ctx *fasthttp.RequestCtx) (string, bool) {
	raw := string(ctx.Request.URI().PathOriginal())
	i := strings.Index(raw, "/workers/")
	if i < 0 {
		return "", false
	}
	ref, err := url.PathUnescape(raw[i+len("/workers/"):])
	if err != nil || ref == "" {
		return "", false
	}
	return ref, true
}

// member returns the worker named ref: by ID, else by URL.
func (s *Server) member(ref string) *fleet.Member {
	if m := s.workers.Member(ref); m != nil {
		return m
	}
	return s.workers.MemberByURL(ref)
}

// getWorker answers GET /workers/{ref}: the worker, or, while its addition is under way or
// after it failed, the addition's job status (sgl-router's shape).
func (s *Server) getWorker(ctx *fasthttp.RequestCtx, ref string) {
	if m := s.member(ref); m != nil {
		writeJSON(ctx, fasthttp.StatusOK, s.view(m))
		return
	}
	if st, id, ok := s.workers.Job(ref); ok {
		writeJSON(ctx, fasthttp.StatusOK, pendingView{ID: id, URL: st.WorkerURL, JobStatus: st})
		return
	}
	writeError(ctx, newAPIError(CodeWorkerNotFound, "no worker "+strconv.Quote(ref)))
}

// pendingView is a worker whose addition has not completed, as GET /workers/{url} shows it.
type pendingView struct {
	ID        string          `json:"id"`
	URL       string          `json:"url"`
	IsHealthy bool            `json:"is_healthy"`
	JobStatus fleet.JobStatus `json:"job_status"`
}

func (s *Server) deleteWorker(ctx *fasthttp.RequestCtx, ref string) {
	m := s.member(ref)
	if m == nil {
		writeError(ctx, newAPIError(CodeWorkerNotFound, "no worker "+strconv.Quote(ref)))
		return
	}
	id := m.ID()
	if err := s.removeWorker(id); err != nil {
		writeError(ctx, newAPIError(CodeWorkerNotFound, "no worker "+strconv.Quote(ref)))
		return
	}
	s.publishWorkerChange(id, true, nil)
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"removed": id, "success": true,
		"message": "worker " + id + " (" + m.URL() + ") removed"})
}

// workerView is one worker as GET /workers shows it: its lifecycle view, its load, and the
// names sgl-router's clients read for the same facts.
type workerView struct {
	fleet.View
	// Load says where the worker's load comes from and what the router sees of it.
	Load *loadView `json:"load,omitempty"`
	// ModelID is the model (sgl-router's name).
	ModelID string `json:"model_id"`
	// WorkerType is regular, prefill or decode (sgl-router's role names).
	WorkerType string `json:"worker_type"`
	// IsHealthy is whether picks may choose the worker: healthy with a breaker that lets a
	// dispatch through (sgl-router's name).
	IsHealthy bool `json:"is_healthy"`
	// ConnectionMode is always http.
	ConnectionMode string `json:"connection_mode"`
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
	v := workerView{View: m.View(), ConnectionMode: "http"}
	v.ModelID, v.IsHealthy, v.WorkerType = v.Model, v.Eligible, v.Role
	if v.WorkerType == string(config.RolePlain) {
		v.WorkerType = "regular"
	}
	if ls, ok := s.tele.(loadStatuser); ok {
		if status, ok := ls.LoadStatus(m.ID()); ok {
			v.Load = newLoadView(status, s.loads.Load().Observe(m.ID(), s.now()))
		}
	}
	return v
}

// listWorkers answers GET /workers: every worker, their count, and the counts by role as
// sgl-router's clients read them.
func (s *Server) listWorkers(ctx *fasthttp.RequestCtx) {
	members := s.workers.Members()
	views := make([]workerView, 0, len(members))
	stats := map[string]int{"prefill_count": 0, "decode_count": 0, "regular_count": 0}
	for _, m := range members {
		v := s.view(m)
		stats[v.WorkerType+"_count"]++
		views = append(views, v)
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"workers": views, "total": len(views), "stats": stats})
}

// addRequest is a POST /workers body: Switchyard's worker fields (labels included: the PD
// compatibility labels, sgl-router's labels object), sgl-router's names of them (model_id,
// worker_type), and sgl-router's fields without an equivalent, refused when set.
type addRequest struct {
	WorkerSpec
	ModelID    string `json:"model_id"`
	WorkerType string `json:"worker_type"`

	APIKey          *string         `json:"api_key"`
	Priority        json.RawMessage `json:"priority"`
	Cost            json.RawMessage `json:"cost"`
	TokenizerPath   json.RawMessage `json:"tokenizer_path"`
	ReasoningParser json.RawMessage `json:"reasoning_parser"`
	ToolParser      json.RawMessage `json:"tool_parser"`
	ChatTemplate    json.RawMessage `json:"chat_template"`
}

// spec returns the worker the request describes, or why it cannot be added.
func (r *addRequest) spec(upstreamKey string) (WorkerSpec, error) {
	spec := r.WorkerSpec
	if r.ModelID != "" {
		if spec.Model != "" && spec.Model != r.ModelID {
			return spec, fmt.Errorf("model %q and model_id %q differ", spec.Model, r.ModelID)
		}
		spec.Model = r.ModelID
	}
	if r.WorkerType != "" {
		role := r.WorkerType
		if role == "regular" {
			role = string(config.RolePlain)
		}
		if spec.Role != "" && spec.Role != role {
			return spec, fmt.Errorf("role %q and worker_type %q differ", spec.Role, r.WorkerType)
		}
		spec.Role = role
	}
	if r.APIKey != nil && *r.APIKey != upstreamKey {
		return spec, errors.New("api_key: a worker has no key of its own; every worker gets upstream.api_key (sgl-router's --api-key)")
	}
	for _, f := range []struct {
		name string
		v    json.RawMessage
	}{{"priority", r.Priority}, {"cost", r.Cost}, {"tokenizer_path", r.TokenizerPath},
		{"reasoning_parser", r.ReasoningParser}, {"tool_parser", r.ToolParser}, {"chat_template", r.ChatTemplate}} {
		if v := strings.TrimSpace(string(f.v)); v != "" && v != "null" && v != "{}" {
			return spec, fmt.Errorf("%s: no equivalent in Switchyard", f.name)
		}
	}
	return spec, nil
}

// addWorker answers POST /workers. A worker whose model is given is added at once (201 with
// the worker, introspected first); one given without a model is added in the background,
// once its engine names its model (202, as sgl-router answers; GET /workers/{url} follows
// it).
func (s *Server) addWorker(ctx *fasthttp.RequestCtx) {
	var req addRequest
	body, held, e := s.readBody(ctx, nil, maxAdminBody)
	defer s.budget.release(held)
	if e != nil {
		writeError(ctx, e)
		return
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(ctx, newAPIError(CodeInvalidWorker, "cannot decode worker: "+err.Error()))
		return
	}
	spec, err := req.spec(s.cfg.Upstream.APIKey)
	if err != nil {
		writeError(ctx, newAPIError(CodeInvalidWorker, "cannot add worker: "+err.Error()))
		return
	}
	if spec.Model == "" {
		s.addWorkerLater(ctx, spec)
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
	s.publishWorkerChange(m.ID(), false, &spec)
	writeJSON(ctx, fasthttp.StatusCreated, s.view(m))
}

// addWorkerLater starts the background addition of spec and answers 202 with where to
// follow it.
func (s *Server) addWorkerLater(ctx *fasthttp.RequestCtx, spec WorkerSpec) {
	id, err := s.workers.AddLater(spec)
	switch {
	case errors.Is(err, ErrWorkerExists):
		writeError(ctx, newAPIError(CodeWorkerExists, err.Error()))
		return
	case errors.Is(err, ErrInvalidWorker):
		writeError(ctx, newAPIError(CodeInvalidWorker, err.Error()))
		return
	case errors.Is(err, fleet.ErrTooManyJobs):
		writeError(ctx, newAPIError(CodeOverloaded, err.Error()))
		return
	case err != nil:
		writeError(ctx, newAPIError(CodeShuttingDown, err.Error()))
		return
	}
	s.publishWorkerChange(id, false, &spec) // the other replicas learn its model themselves
	location := "/workers/" + url.PathEscape(spec.URL)
	ctx.Response.Header.Set(fasthttp.HeaderLocation, location)
	writeJSON(ctx, fasthttp.StatusAccepted, map[string]any{"status": "accepted", "worker_id": id, "url": spec.URL,
		"location": location, "message": "worker addition queued: the model is learnt from the engine"})
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
