package mockengine

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"switchyard/httpfront/jsontext"
	"switchyard/load"
)

// handle routes every HTTP request. Every response carries X-Worker-Id; a panic becomes a
// 500 and is logged.
func (e *Engine) handle(ctx *fasthttp.RequestCtx) {
	defer func() {
		if v := recover(); v != nil {
			e.log.Error("mock engine handler panicked", slog.String("path", string(ctx.Path())), slog.Any("panic", v))
			ctx.ResetBody()
			e.writeError(ctx, fasthttp.StatusInternalServerError, "internal error")
		}
	}()
	ctx.Response.Header.Set("X-Worker-Id", e.workerID)
	path := string(ctx.Path())
	if e.down() && !isMockControl(path) {
		e.writeError(ctx, fasthttp.StatusServiceUnavailable, "the engine is restarting")
		return
	}
	if !e.serves(path) {
		e.writeError(ctx, fasthttp.StatusNotFound, fmt.Sprintf("route %s %s not found", ctx.Method(), path))
		return
	}
	switch path {
	case "/v1/chat/completions", "/v1/completions", "/generate":
		e.noteTraceparent(ctx)
	}
	switch path {
	case "/v1/chat/completions":
		e.serveInference(ctx, apiChat)
	case "/v1/completions":
		e.serveInference(ctx, apiCompletions)
	case "/generate":
		e.serveInference(ctx, apiGenerate)
	case "/health":
		if e.method(ctx, "GET") {
			e.serveHealth(ctx)
		}
	case "/health_generate":
		if e.method(ctx, "GET") {
			e.serveHealthGenerate(ctx)
		}
	case "/server_info", "/get_server_info":
		if e.method(ctx, "GET") {
			e.writeJSON(ctx, fasthttp.StatusOK, e.serverInfo())
		}
	case "/v1/models":
		if e.method(ctx, "GET") {
			e.serveModels(ctx)
		}
	case "/get_load":
		if e.method(ctx, "GET") {
			e.serveGetLoad(ctx)
		}
	case "/v1/loads":
		if e.method(ctx, "GET") {
			e.serveLoads(ctx)
		}
	case "/metrics":
		if e.method(ctx, "GET") {
			e.serveMetrics(ctx)
		}
	case "/get_model_info":
		if e.method(ctx, "GET") {
			e.serveModelInfo(ctx)
		}
	case "/v1/embeddings":
		if e.method(ctx, "POST") {
			e.serveEmbeddings(ctx)
		}
	case "/v1/rerank", "/rerank":
		if e.method(ctx, "POST") {
			e.serveRerank(ctx)
		}
	case "/v1/responses":
		if e.method(ctx, "POST") {
			e.serveResponses(ctx)
		}
	case "/tokenize":
		if e.method(ctx, "POST") {
			e.serveTokenize(ctx)
		}
	case "/detokenize":
		if e.method(ctx, "POST") {
			e.serveDetokenize(ctx)
		}
	case "/version":
		if e.method(ctx, "GET") {
			e.writeJSON(ctx, fasthttp.StatusOK, map[string]string{"version": "switchyard-mock"})
		}
	case "/reset_prefix_cache":
		if e.method(ctx, "POST") {
			if !e.FlushCache() {
				e.writeError(ctx, fasthttp.StatusBadRequest, "Cache not reset because there are pending requests.")
				return
			}
			ctx.SetStatusCode(fasthttp.StatusOK)
		}
	case "/flush_cache":
		if e.method(ctx, "POST", "GET") {
			e.serveFlush(ctx)
		}
	case "/abort_request":
		if e.method(ctx, "POST") {
			e.serveAbort(ctx)
		}
	case "/v1/load_lora_adapter", "/load_lora_adapter":
		if e.method(ctx, "POST") {
			e.serveLoadLoRA(ctx)
		}
	case "/v1/unload_lora_adapter", "/unload_lora_adapter":
		if e.method(ctx, "POST") {
			e.serveUnloadLoRA(ctx)
		}
	case "/mock/faults":
		if e.method(ctx, "GET", "PUT", "POST") {
			e.serveFaults(ctx)
		}
	case "/mock/restart":
		if e.method(ctx, "POST") {
			e.Restart()
			e.writeJSON(ctx, fasthttp.StatusOK, map[string]bool{"success": true})
		}
	default:
		e.writeError(ctx, fasthttp.StatusNotFound, fmt.Sprintf("route %s %s not found", ctx.Method(), path))
	}
}

// maxTraceparents bounds the traceparent headers an engine keeps.
const maxTraceparents = 256

// noteTraceparent keeps the request's traceparent header, when it has one.
func (e *Engine) noteTraceparent(ctx *fasthttp.RequestCtx) {
	v := ctx.Request.Header.Peek("Traceparent")
	if len(v) == 0 {
		return
	}
	e.tpMu.Lock()
	defer e.tpMu.Unlock()
	if len(e.traceparents) == maxTraceparents {
		e.traceparents = append(e.traceparents[:0], e.traceparents[1:]...)
	}
	e.traceparents = append(e.traceparents, string(v))
}

// Traceparents returns the traceparent headers of the latest inference requests that had one
// (at most 256), oldest first: what a tracing router forwarded.
func (e *Engine) Traceparents() []string {
	e.tpMu.Lock()
	defer e.tpMu.Unlock()
	return append([]string(nil), e.traceparents...)
}

func isMockControl(path string) bool { return len(path) > 6 && path[:6] == "/mock/" }

// serves reports whether the engine's flavour has path: vLLM lacks SGLang's native routes,
// SGLang the vLLM-only ones; both have the OpenAI routes, /health, /v1/models, /metrics and
// the mock controls.
func (e *Engine) serves(path string) bool {
	switch path {
	case "/generate", "/health_generate", "/server_info", "/get_server_info", "/get_load", "/v1/loads",
		"/flush_cache", "/abort_request", "/get_model_info":
		return e.cfg.Flavor == FlavorSGLang
	case "/version", "/reset_prefix_cache", "/rerank":
		return e.cfg.Flavor == FlavorVLLM
	case "/v1/load_lora_adapter", "/v1/unload_lora_adapter":
		return e.cfg.Flavor == FlavorVLLM && e.cfg.LoRA.Slots > 0
	case "/load_lora_adapter", "/unload_lora_adapter":
		return e.cfg.Flavor == FlavorSGLang && e.cfg.LoRA.Slots > 0
	}
	return true
}

// method checks the request method, answering 405 otherwise.
func (e *Engine) method(ctx *fasthttp.RequestCtx, allowed ...string) bool {
	m := string(ctx.Method())
	for _, a := range allowed {
		if m == a || (m == "HEAD" && a == "GET") {
			return true
		}
	}
	ctx.Response.Header.Set("Allow", fmt.Sprint(allowed))
	e.writeError(ctx, fasthttp.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s", m, ctx.Path()))
	return false
}

// handleServerError answers requests fasthttp could not parse.
func (e *Engine) handleServerError(ctx *fasthttp.RequestCtx, err error) {
	ctx.Response.Header.Set("X-Worker-Id", e.workerID)
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		e.writeError(ctx, fasthttp.StatusRequestEntityTooLarge, "request body too large")
		return
	}
	e.writeError(ctx, fasthttp.StatusBadRequest, "cannot parse request: "+err.Error())
}

// errorType is the OpenAI error type of a status.
func errorType(status int) string {
	switch status {
	case 400:
		return "BadRequestError"
	case 401:
		return "AuthenticationError"
	case 403:
		return "PermissionDeniedError"
	case 404:
		return "NotFoundError"
	case 405:
		return "MethodNotAllowedError"
	case 413:
		return "RequestTooLargeError"
	case 429:
		return "RateLimitError"
	case 503:
		return "ServiceUnavailableError"
	}
	if status >= 500 {
		return "InternalServerError"
	}
	return "Error"
}

// writeError writes an OpenAI-style error: {"error": {"message", "type", "param", "code"}}.
func (e *Engine) writeError(ctx *fasthttp.RequestCtx, status int, msg string) {
	b := make([]byte, 0, 128+len(msg))
	b = append(b, `{"error":{"message":`...)
	b = jsontext.AppendString(b, msg)
	b = append(b, `,"type":`...)
	b = jsontext.AppendString(b, errorType(status))
	b = append(b, `,"param":null,"code":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, "}}"...)
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.Response.SetBodyRaw(b)
}

func (e *Engine) writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		e.writeError(ctx, fasthttp.StatusInternalServerError, "cannot encode response: "+err.Error())
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.Response.SetBodyRaw(b)
}

func (e *Engine) serveHealth(ctx *fasthttp.RequestCtx) {
	if e.unhealthy() {
		e.writeError(ctx, fasthttp.StatusServiceUnavailable, "the engine is unhealthy")
		return
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
}

// serveHealthGenerate runs a one-token generation through the scheduler.
func (e *Engine) serveHealthGenerate(ctx *fasthttp.RequestCtx) {
	if e.unhealthy() {
		e.writeError(ctx, fasthttp.StatusServiceUnavailable, "the engine is unhealthy")
		return
	}
	if status := e.injectedStatus(e.faults.Load()); status != 0 {
		e.writeError(ctx, status, "injected failure")
		return
	}
	prompt := e.tok.Encode("health")
	if e.cfg.Role == RoleDecode {
		// A decode engine has no prefill partner for its own health check; report healthy.
		ctx.SetStatusCode(fasthttp.StatusOK)
		return
	}
	req := &inferRequest{api: apiGenerate, prompts: [][]uint32{prompt}, n: 1, maxTokens: 1, dpRank: -1}
	j := e.newJob(req)
	defer j.close()
	j.submit()
	if err := j.wait(); err != nil {
		e.writeError(ctx, fasthttp.StatusServiceUnavailable, "health generation failed: "+err.Error())
		return
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
}

func (e *Engine) serveModels(ctx *fasthttp.RequestCtx) {
	type model struct {
		ID          string  `json:"id"`
		Object      string  `json:"object"`
		Created     int64   `json:"created"`
		OwnedBy     string  `json:"owned_by"`
		Root        string  `json:"root"`
		Parent      *string `json:"parent"`
		MaxModelLen int     `json:"max_model_len"`
	}
	list := []model{{ID: e.cfg.Model, Object: "model", Created: e.started.Unix(), OwnedBy: string(e.cfg.Flavor), Root: e.cfg.Model, MaxModelLen: e.cfg.ContextLength}}
	names, paths := e.lora.list()
	for i, n := range names {
		// Adapters as vLLM lists them: the adapter's path as root, the base model as parent.
		list = append(list, model{ID: n, Object: "model", Created: e.started.Unix(), OwnedBy: string(e.cfg.Flavor), Root: paths[i],
			Parent: &e.cfg.Model, MaxModelLen: e.cfg.ContextLength})
	}
	e.writeJSON(ctx, fasthttp.StatusOK, struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", list})
}

// reports returns every rank's load report.
func (e *Engine) reports() ([]load.RankReport, []rankExtra) {
	now := e.clock.Now()
	reps := make([]load.RankReport, len(e.ranks))
	extras := make([]rankExtra, len(e.ranks))
	for i, r := range e.ranks {
		reps[i], extras[i] = r.report(now)
	}
	return reps, extras
}

func (e *Engine) serveGetLoad(ctx *fasthttp.RequestCtx) {
	reps, _ := e.reports()
	out := make([]load.GetLoadRank, len(reps))
	for i := range reps {
		out[i] = load.NewGetLoadRank(&reps[i])
	}
	e.writeJSON(ctx, fasthttp.StatusOK, out)
}

func (e *Engine) serveLoads(ctx *fasthttp.RequestCtx) {
	reps, extras := e.reports()
	body := load.NewLoadsBody(e.clock.Now(), "switchyard-mock", reps)
	for i := range body.Loads {
		l, x := &body.Loads[i], extras[i]
		l.GenThroughput, l.CacheHitRate, l.Utilization = x.genThroughput, x.cacheHitRate, x.utilization
		l.Queues, _ = json.Marshal(map[string]int64{"waiting": x.queued, "running": reps[i].Running})
		if e.cfg.Role != RolePlain {
			l.Disaggregation, _ = json.Marshal(map[string]any{
				"mode": string(e.cfg.Role), "transfer_queue_reqs": x.transfers,
			})
		}
	}
	e.writeJSON(ctx, fasthttp.StatusOK, body)
}

func (e *Engine) serveFlush(ctx *fasthttp.RequestCtx) {
	if !e.FlushCache() {
		e.writeError(ctx, fasthttp.StatusBadRequest, "Cache not flushed because there are pending requests.")
		return
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString("Cache flushed.\n")
}

func (e *Engine) serveAbort(ctx *fasthttp.RequestCtx) {
	var body struct {
		Rid      string `json:"rid"`
		AbortAll bool   `json:"abort_all"`
	}
	if len(ctx.PostBody()) > 0 {
		if err := decodeJSON(ctx.PostBody(), &body); err != nil {
			e.writeError(ctx, fasthttp.StatusBadRequest, err.Error())
			return
		}
	}
	if body.Rid == "" && !body.AbortAll {
		e.writeError(ctx, fasthttp.StatusBadRequest, "rid or abort_all is required")
		return
	}
	n := e.abort(body.Rid, body.AbortAll)
	e.writeJSON(ctx, fasthttp.StatusOK, map[string]any{"success": true, "aborted": n})
}

// faultsJSON is the JSON form of Faults on /mock/faults; durations are Go duration strings.
type faultsJSON struct {
	FailFirst       int     `json:"fail_first"`
	FailRate        float64 `json:"fail_rate"`
	FailStatus      int     `json:"fail_status"`
	Status          int     `json:"status"`
	Latency         string  `json:"latency"`
	Drop            bool    `json:"drop"`
	DropAfterTokens int     `json:"drop_after_tokens"`
	Hang            bool    `json:"hang"`
	Unhealthy       bool    `json:"unhealthy"`
	UnhealthyAfter  string  `json:"unhealthy_after"`
	StopEvents      bool    `json:"stop_events"`
	StopEventsAfter string  `json:"stop_events_after"`
	RestartEvery    string  `json:"restart_every"`
	RestartDowntime string  `json:"restart_downtime"`
}

func (f Faults) toJSON() faultsJSON {
	return faultsJSON{
		FailFirst: f.FailFirst, FailRate: f.FailRate, FailStatus: f.FailStatus, Status: f.Status,
		Latency: f.Latency.String(), Drop: f.Drop, DropAfterTokens: f.DropAfterTokens, Hang: f.Hang,
		Unhealthy: f.Unhealthy, UnhealthyAfter: f.UnhealthyAfter.String(), StopEvents: f.StopEvents,
		StopEventsAfter: f.StopEventsAfter.String(), RestartEvery: f.RestartEvery.String(),
		RestartDowntime: f.RestartDowntime.String(),
	}
}

func (fj faultsJSON) faults() (Faults, error) {
	f := Faults{
		FailFirst: fj.FailFirst, FailRate: fj.FailRate, FailStatus: fj.FailStatus, Status: fj.Status,
		Drop: fj.Drop, DropAfterTokens: fj.DropAfterTokens, Hang: fj.Hang, Unhealthy: fj.Unhealthy,
		StopEvents: fj.StopEvents,
	}
	for _, d := range []struct {
		name string
		in   string
		out  *time.Duration
	}{
		{"latency", fj.Latency, &f.Latency}, {"unhealthy_after", fj.UnhealthyAfter, &f.UnhealthyAfter},
		{"stop_events_after", fj.StopEventsAfter, &f.StopEventsAfter}, {"restart_every", fj.RestartEvery, &f.RestartEvery},
		{"restart_downtime", fj.RestartDowntime, &f.RestartDowntime},
	} {
		if d.in == "" {
			continue
		}
		v, err := time.ParseDuration(d.in)
		if err != nil {
			return f, badf("%s: %v", d.name, err)
		}
		*d.out = v
	}
	return f, nil
}

// serveFaults reads (GET) or replaces (PUT, POST) the fault switches.
func (e *Engine) serveFaults(ctx *fasthttp.RequestCtx) {
	if ctx.IsGet() || ctx.IsHead() {
		e.writeJSON(ctx, fasthttp.StatusOK, e.Faults().toJSON())
		return
	}
	var fj faultsJSON
	if err := decodeJSON(ctx.PostBody(), &fj); err != nil {
		e.writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	f, err := fj.faults()
	if err == nil {
		err = e.SetFaults(f)
	}
	if err != nil {
		e.writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	e.writeJSON(ctx, fasthttp.StatusOK, e.Faults().toJSON())
}

// kvEventsInfo is the kv_events object of /server_info.
type kvEventsInfo struct {
	Publisher               string  `json:"publisher"`
	EndpointHost            string  `json:"endpoint_host"`
	EndpointPortBase        *int    `json:"endpoint_port_base,omitempty"`
	Topic                   string  `json:"topic"`
	BlockSize               int     `json:"block_size"`
	DPSize                  int     `json:"dp_size"`
	LoadEndpointPortBase    *int    `json:"load_endpoint_port_base,omitempty"`
	LoadTopic               string  `json:"load_topic,omitempty"`
	ReplayEndpointPortBase  *int    `json:"replay_endpoint_port_base,omitempty"`
	BufferSteps             int     `json:"buffer_steps,omitempty"`
	EventShape              string  `json:"event_shape"`
	LoadPublishIntervalSecs float64 `json:"load_publish_interval_s,omitempty"`
}

// serverInfo is the body of /server_info and /get_server_info.
func (e *Engine) serverInfo() map[string]any {
	cfg := &e.cfg
	mode := "null"
	if cfg.Role != RolePlain {
		mode = string(cfg.Role)
	}
	bootPort := cfg.DefaultBootstrapPort
	if e.boot != nil {
		bootPort = e.boot.port
	}
	info := map[string]any{
		"model_path":                      cfg.Model,
		"served_model_name":               cfg.Model,
		"tokenizer_path":                  cmp.Or(cfg.TokenizerPath, cfg.Model),
		"host":                            cfg.Host,
		"port":                            e.port,
		"disaggregation_mode":             mode,
		"disaggregation_bootstrap_port":   bootPort,
		"dp_size":                         cfg.DPSize,
		"tp_size":                         cfg.TPSize,
		"page_size":                       cfg.PageSize,
		"disaggregation_transfer_backend": cfg.TransferBackend,
		"kv_cache_dtype":                  cfg.KVCacheDType,
		"context_length":                  cfg.ContextLength,
		"max_total_num_tokens":            cfg.CacheTokens,
		"max_running_requests":            cfg.MaxRunning,
		"max_prefill_tokens":              cfg.MaxPrefillTokens,
		"max_loras_per_batch":             cfg.LoRA.Slots,
		"max_loaded_loras":                cfg.LoRA.Slots,
		"version":                         "switchyard-mock",
		"worker_id":                       e.workerID,
		"kv_events":                       nil,
		"kv_events_config":                nil,
		"mock": map[string]any{
			"speedup": cfg.Speedup, "zero_cost": cfg.ZeroCost,
			"costs_us": map[string]int64{
				"prefill_overhead": cfg.Costs.PrefillOverhead.Microseconds(), "prefill_per_token": cfg.Costs.PrefillPerToken.Microseconds(),
				"decode_step": cfg.Costs.DecodeStep.Microseconds(), "decode_per_request": cfg.Costs.DecodePerRequest.Microseconds(),
			},
		},
	}
	r0 := e.ranks[0]
	if r0.kvpub.sock == nil && r0.loadpub == nil {
		return info
	}
	kve := kvEventsInfo{
		Publisher: "null", EndpointHost: e.zmqHost, Topic: cfg.KVEvents.Topic, BlockSize: cfg.PageSize,
		DPSize: cfg.DPSize, EventShape: cfg.KVEvents.Shape.String(),
	}
	config := map[string]any{"publisher": "null", "topic": cfg.KVEvents.Topic, "buffer_steps": cfg.KVEvents.BufferSteps, "hwm": cfg.KVEvents.HWM, "replay_endpoint": nil}
	if r0.kvpub.sock != nil && r0.kvpub.sock.Port() != 0 {
		p := r0.kvpub.sock.Port()
		kve.Publisher, kve.EndpointPortBase = "zmq", &p
		config["publisher"] = "zmq"
		config["endpoint"] = "tcp://" + net.JoinHostPort(e.zmqHost, strconv.Itoa(p))
	}
	if r0.kvpub.replay != nil {
		p := r0.kvpub.replay.Port()
		kve.ReplayEndpointPortBase, kve.BufferSteps = &p, cfg.KVEvents.BufferSteps
		config["replay_endpoint"] = "tcp://" + net.JoinHostPort(e.zmqHost, strconv.Itoa(p))
	}
	if r0.loadpub != nil {
		p := r0.loadpub.Port()
		kve.LoadEndpointPortBase, kve.LoadTopic = &p, "load"
		kve.LoadPublishIntervalSecs = cfg.LoadPublish.Interval.Seconds()
		info["load_publish_endpoint"] = "tcp://" + net.JoinHostPort(e.zmqHost, strconv.Itoa(p))
	}
	info["kv_events"] = kve
	if cfgJSON, err := json.Marshal(config); err == nil {
		info["kv_events_config"] = string(cfgJSON)
	}
	return info
}
