package indexer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"switchyard/kv"
	"switchyard/kv/events"
	"switchyard/kv/index"
	"switchyard/kv/subscribe"
)

// Indexer routes besides PathMatch.
const (
	PathHealth  = "/health"
	PathMetrics = "/metrics"
	PathStatus  = "/v1/status"
	PathWorkers = "/v1/workers"
)

// Config configures a Handler.
type Config struct {
	// Index answers the lookups. Required.
	Index *index.Index
	// Manager, when set, serves the worker routes (add, remove, status of subscriptions).
	Manager *subscribe.Manager
	// Metrics is exported on /metrics. Default: the index's set.
	Metrics *metrics.Set
	// LookupTimeout bounds one lookup. Default DefaultLookupTimeout (100 ms).
	LookupTimeout time.Duration
	// Logger receives request failures (on change). Default: discard.
	Logger *slog.Logger
}

// Handler serves an Index over HTTP for `switchyard indexer`: several routers share
// one index through RemoteSource.
//
//	POST   /v1/prefix/match   a lookup (binary or JSON, see AppendQuery)
//	GET    /health            200 "ok"
//	GET    /metrics           Prometheus text
//	GET    /v1/status         JSON: index statistics and each worker's subscriptions
//	POST   /v1/workers        JSON WorkerSpec body ({"id","url","model","dp_size",
//	                          "block_size","kv_events","replay","topic","no_discovery",
//	                          "rekey"}): follow a worker's KV events
//	DELETE /v1/workers/{id}   stop following a worker and drop its entries
//
// The handler is safe for concurrent use; it holds no per-request state beyond pooled
// buffers.
type Handler struct {
	cfg    Config
	log    *slog.Logger
	bufs   sync.Pool // *indexerScratch
	served *metrics.Counter
	bad    *metrics.Counter
}

type indexerScratch struct {
	tokens []uint32
	out    []byte
	lookup kv.Lookup
}

// NewHandler returns the handler.
func NewHandler(cfg Config) (*Handler, error) {
	if cfg.Index == nil {
		return nil, errors.New("cannot create indexer handler: nil index")
	}
	if cfg.Metrics == nil {
		cfg.Metrics = cfg.Index.Metrics().Set()
	}
	if cfg.LookupTimeout <= 0 {
		cfg.LookupTimeout = index.DefaultLookupTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	h := &Handler{cfg: cfg, log: cfg.Logger}
	h.bufs.New = func() any { return &indexerScratch{} }
	h.served = cfg.Metrics.GetOrCreateCounter(`switchyard_indexer_queries_total{result="ok"}`)
	h.bad = cfg.Metrics.GetOrCreateCounter(`switchyard_indexer_queries_total{result="rejected"}`)
	return h, nil
}

// Serve handles one request.
func (h *Handler) Serve(ctx *fasthttp.RequestCtx) {
	path := string(ctx.Path())
	method := string(ctx.Method())
	switch {
	case path == PathMatch && method == fasthttp.MethodPost:
		h.match(ctx)
	case path == PathHealth && (method == fasthttp.MethodGet || method == fasthttp.MethodHead):
		ctx.SetContentType("text/plain; charset=utf-8")
		ctx.SetBodyString("ok\n")
	case path == PathMetrics && method == fasthttp.MethodGet:
		ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
		h.cfg.Metrics.WritePrometheus(ctx)
	case path == PathStatus && method == fasthttp.MethodGet:
		h.status(ctx)
	case path == PathWorkers && method == fasthttp.MethodPost && h.cfg.Manager != nil:
		h.addWorker(ctx)
	case strings.HasPrefix(path, PathWorkers+"/") && method == fasthttp.MethodDelete && h.cfg.Manager != nil:
		h.removeWorker(ctx, strings.TrimPrefix(path, PathWorkers+"/"))
	case path == PathMatch || path == PathHealth || path == PathMetrics || path == PathStatus ||
		(h.cfg.Manager != nil && (path == PathWorkers || strings.HasPrefix(path, PathWorkers+"/"))):
		ctx.Error("method not allowed\n", fasthttp.StatusMethodNotAllowed)
	default:
		ctx.Error("not found\n", fasthttp.StatusNotFound)
	}
}

func (h *Handler) match(ctx *fasthttp.RequestCtx) {
	sc := h.bufs.Get().(*indexerScratch)
	defer h.bufs.Put(sc)
	body := ctx.PostBody()
	jsonIn := isJSON(ctx.Request.Header.ContentType())
	var model string
	var err error
	if len(body) > MaxQueryBytes {
		err = fmt.Errorf("%w: %w: body of %d bytes", events.ErrMalformed, ErrQueryTooLarge, len(body))
	} else if jsonIn {
		model, sc.tokens, err = DecodeJSONQuery(body)
	} else {
		var m []byte
		m, sc.tokens, err = DecodeQuery(body, sc.tokens)
		model = string(m)
	}
	if err != nil {
		h.bad.Inc()
		code := fasthttp.StatusBadRequest
		if errors.Is(err, ErrQueryTooLarge) {
			code = fasthttp.StatusRequestEntityTooLarge
		}
		ctx.Error(err.Error()+"\n", code)
		return
	}
	lctx, cancel := context.WithTimeout(context.Background(), h.cfg.LookupTimeout)
	err = h.cfg.Index.Lookup(lctx, model, sc.tokens, &sc.lookup)
	cancel()
	if err != nil {
		ctx.Error(err.Error()+"\n", fasthttp.StatusServiceUnavailable)
		return
	}
	h.served.Inc()
	if jsonIn {
		sc.out = AppendJSONAnswer(sc.out[:0], &sc.lookup)
		ctx.SetContentType(ContentTypeJSON)
	} else {
		sc.out = AppendAnswer(sc.out[:0], &sc.lookup, string(ctx.Request.Header.Peek(HeaderRanks)) == "1")
		ctx.SetContentType(ContentTypeBinary)
	}
	ctx.SetBody(sc.out) // copies: the scratch goes back to the pool
	if cap(sc.tokens) > 1<<20 {
		sc.tokens = nil
	}
}

// Status is GET /v1/status.
type Status struct {
	Blocks      int64                    `json:"blocks"`
	MemoryBytes int64                    `json:"memory_bytes"`
	Owners      int                      `json:"owners"`
	Shards      int                      `json:"shards"`
	Evicted     uint64                   `json:"evicted"`
	Stale       uint64                   `json:"stale_ops"`
	Ingest      kv.IngestCounts          `json:"ingest"`
	Lookups     kv.LookupCounts          `json:"lookups"`
	Workers     []subscribe.WorkerStatus `json:"workers"`
}

func (h *Handler) status(ctx *fasthttp.RequestCtx) {
	x := h.cfg.Index
	st := x.Stats()
	out := Status{
		Blocks: st.Blocks, MemoryBytes: st.MemoryBytes, Owners: st.Owners, Shards: x.Shards(),
		Evicted: st.Evicted, Stale: st.Stale, Ingest: x.Metrics().Ingest(), Lookups: x.Metrics().LocalLookups(),
		Workers: []subscribe.WorkerStatus{},
	}
	if h.cfg.Manager != nil {
		out.Workers = h.cfg.Manager.Status()
	}
	writeJSON(ctx, fasthttp.StatusOK, out)
}

// workerBody is POST /v1/workers.
type workerBody struct {
	ID          string `json:"id"`
	URL         string `json:"url"`
	Model       string `json:"model"`
	DPSize      int    `json:"dp_size"`
	BlockSize   int    `json:"block_size"`
	KVEvents    string `json:"kv_events"`
	Replay      string `json:"replay"`
	Topic       string `json:"topic"`
	NoDiscovery bool   `json:"no_discovery"`
	Rekey       bool   `json:"rekey"`
}

func (h *Handler) addWorker(ctx *fasthttp.RequestCtx) {
	var b workerBody
	dec := json.NewDecoder(strings.NewReader(string(ctx.PostBody())))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		ctx.Error("cannot decode worker: "+err.Error()+"\n", fasthttp.StatusBadRequest)
		return
	}
	spec := subscribe.WorkerSpec{ID: b.ID, URL: b.URL, Model: b.Model, DPSize: b.DPSize, BlockSize: b.BlockSize,
		KVEvents: b.KVEvents, Replay: b.Replay, Topic: b.Topic, NoDiscovery: b.NoDiscovery, Rekey: b.Rekey}
	if spec.KVEvents != "" {
		if _, err := subscribe.PublishersFor(spec.KVEvents, spec.Replay, spec.Topic, spec.URL, spec.DPSize); err != nil {
			ctx.Error(err.Error()+"\n", fasthttp.StatusBadRequest)
			return
		}
	}
	if err := h.cfg.Manager.AddWorker(spec); err != nil {
		ctx.Error(err.Error()+"\n", fasthttp.StatusBadRequest)
		return
	}
	h.log.Info("worker added", slog.String("worker", spec.ID))
	writeJSON(ctx, fasthttp.StatusCreated, map[string]string{"id": spec.ID})
}

func (h *Handler) removeWorker(ctx *fasthttp.RequestCtx, id string) {
	if id == "" || !h.cfg.Manager.RemoveWorker(id) {
		ctx.Error("unknown worker\n", fasthttp.StatusNotFound)
		return
	}
	h.log.Info("worker removed", slog.String("worker", id))
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

func writeJSON(ctx *fasthttp.RequestCtx, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		ctx.Error(err.Error(), fasthttp.StatusInternalServerError)
		return
	}
	ctx.SetStatusCode(code)
	ctx.SetContentType(ContentTypeJSON)
	ctx.SetBody(append(b, '\n'))
}
