package httpfront

import (
	"bytes"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/httpfront/fleet"
	"switchyard/httpfront/jsontext"
	"switchyard/load"
	"switchyard/load/series"
)

// LoRA-adapter routing (config lora, models.<name>.lora_adapters): a request whose model
// names an adapter is routed by its base model's buckets, with engine.BucketRequest.Adapter
// set so that the groups' candidates are the engines holding it; with lora.auto_load, an
// engine picked to load it (Pick.LoadAdapter) gets it through its API before the request
// is forwarded. The body is forwarded as the client sent it: the engine serves the adapter
// under its name in the model field, as vLLM does.

// Engine routes that load and unload a LoRA adapter.
const (
	pathLoadLoRAVLLM     = "/v1/load_lora_adapter"
	pathLoadLoRASGLang   = "/load_lora_adapter"
	pathUnloadLoRAVLLM   = "/v1/unload_lora_adapter"
	pathUnloadLoRASGLang = "/unload_lora_adapter"
)

// Metric names of adapter routing.
const (
	metricLoRAPicks     = "switchyard_lora_picks_total"
	metricLoRALoads     = "switchyard_lora_loads_total"
	metricLoRAEvictions = "switchyard_lora_evictions_total"
	metricLoRASlotWaits = "switchyard_lora_slot_waits_total"
)

// loraRouting is a Server's adapter routing; nil when lora.enabled is off.
type loraRouting struct {
	cfg    config.LoRA
	logger *slog.Logger
	// now is the server's clock (Options.Now): the reservations' and the engines' adapter
	// lists' (fleet.Options.AdapterNow).
	now func() time.Time
	// model and path are the configured adapters: adapter name to base model and to path.
	model, path map[string]string
	metrics     map[string]*loraMetrics // by base model

	mu      sync.Mutex
	loading map[loadKey]*loadCall // loads under way, shared by concurrent requests

	// slotWaiters counts the requests waiting for an adapter slot, of every model
	// (lora.max_slot_waiters); room is each base model's wake-up of its waiters.
	slotWaiters atomic.Int64
	room        map[string]*slotRoom
}

// slotRoom wakes the requests of one base model waiting for an adapter slot: gen counts the
// events that may free one on an engine of the model (an adapter's last request ended, a
// load failed, the engine's adapter list or slots changed), and freed, while waiters is
// not 0, is closed and replaced at each, under mu. An event takes no lock while nobody
// waits.
type slotRoom struct {
	gen     atomic.Uint64
	waiters atomic.Int64
	mu      sync.Mutex
	freed   chan struct{}
}

type loraMetrics struct {
	hit, load, loaded, failed *metrics.Counter
	// joined counts the picks that waited for a load of the adapter another request began
	// on the engine (or that ended meanwhile) instead of loading it; reselected those whose
	// slot reservation went before their load began (the request is selected again).
	joined, reselected *metrics.Counter
	// replica counts the picks that loaded the adapter beside its holders
	// (lora.replicate_above).
	replica *metrics.Counter
	// evicted and evictFailed count the adapters unloaded to make room (lora.evict).
	evicted, evictFailed *metrics.Counter
	// The waits for an adapter slot (lora.max_slot_waiters), by how each ended.
	waitFreed, waitTimeout, waitFull, waitAbandoned *metrics.Counter
}

type loadKey struct{ worker, adapter string }

// loadCall is one adapter load under way; err is set before done is closed.
type loadCall struct {
	done chan struct{}
	err  *apiError
}

func newLoRARouting(cfg *config.Config, set *metrics.Set, logger *slog.Logger, now func() time.Time) *loraRouting {
	if !cfg.LoRA.Enabled {
		return nil
	}
	l := &loraRouting{cfg: cfg.LoRA, logger: logger, now: now, model: map[string]string{}, path: map[string]string{},
		metrics: map[string]*loraMetrics{}, loading: map[loadKey]*loadCall{}, room: map[string]*slotRoom{}}
	for name, m := range cfg.Models {
		l.room[name] = &slotRoom{freed: make(chan struct{})}
		for adapter, path := range m.LoRAAdapters {
			l.model[adapter], l.path[adapter] = name, path
		}
		base := `{model="` + series.Label(name) + `",result="`
		l.metrics[name] = &loraMetrics{
			hit:           set.NewCounter(metricLoRAPicks + base + `hit"}`),
			load:          set.NewCounter(metricLoRAPicks + base + `load"}`),
			replica:       set.NewCounter(metricLoRAPicks + base + `replica"}`),
			joined:        set.NewCounter(metricLoRAPicks + base + `joined"}`),
			reselected:    set.NewCounter(metricLoRAPicks + base + `reselected"}`),
			loaded:        set.NewCounter(metricLoRALoads + base + `ok"}`),
			failed:        set.NewCounter(metricLoRALoads + base + `failed"}`),
			evicted:       set.NewCounter(metricLoRAEvictions + base + `ok"}`),
			evictFailed:   set.NewCounter(metricLoRAEvictions + base + `failed"}`),
			waitFreed:     set.NewCounter(metricLoRASlotWaits + base + `freed"}`),
			waitTimeout:   set.NewCounter(metricLoRASlotWaits + base + `timeout"}`),
			waitFull:      set.NewCounter(metricLoRASlotWaits + base + `full"}`),
			waitAbandoned: set.NewCounter(metricLoRASlotWaits + base + `abandoned"}`),
		}
	}
	return l
}

// adapterRoute returns the route of the base model of adapter name and the adapter, or nil:
// a configured adapter, else one an engine of a configured model holds (slow path: a scan
// of the registry).
func (s *Server) adapterRoute(name []byte) (*modelRoute, string) {
	if s.lora == nil || len(name) == 0 {
		return nil, ""
	}
	if m, ok := s.lora.model[string(name)]; ok {
		return s.models[m], string(name)
	}
	for _, w := range s.wset.Load().Workers() {
		if mr := s.models[w.Model]; mr != nil && w.Adapters().Has(string(name)) {
			return mr, string(name)
		}
	}
	return nil, ""
}

// prepareAdapter counts the selection of an adapter request and loads the adapter onto every
// picked engine that does not hold it yet. It runs before the dispatch's guards are taken: a
// request waiting for a load holds its waitGuards meanwhile. The selection counts as a
// replica when a picked engine loads the adapter beside its holders, as a load when one
// loads it, as joined when every picked engine that was to load it found another request's
// load there, and as a hit when none was to load it; one whose reservation went before its
// load began (errAdapterReservationGone) as reselected, a failed load not at all.
func (s *Server) prepareAdapter(model, adapter string, p *engine.BucketPick, a *picked) *apiError {
	lm := s.lora.metrics[model]
	loads, replicates, joinedAll := false, false, true
	for _, x := range []struct {
		pick *engine.Pick
		m    *fleet.Member
	}{{&p.Plain, a.plain}, {&p.Prefill, a.prefill}, {&p.Decode, a.decode}} {
		if x.pick.Worker == nil || !x.pick.LoadAdapter {
			continue
		}
		loads = true
		replicates = replicates || x.pick.ReplicateAdapter
		joined, e := s.lora.load(x.m, x.pick, adapter, lm, s.now())
		if e == errAdapterReservationGone {
			lm.reselected.Inc()
		}
		if e != nil {
			return e
		}
		joinedAll = joinedAll && joined
	}
	switch {
	case replicates:
		lm.replica.Inc()
	case loads && joinedAll:
		lm.joined.Inc()
	case loads:
		lm.load.Inc()
	default:
		lm.hit.Inc()
	}
	return nil
}

// waitGuards are the in-flight guards of a request whose picked engines load its adapter
// first, on those engines (the plain engine, or the prefill and decode engines): taken at the
// pick, so that the request counts in their in-flight requests (admission caps, policies,
// the gauge) while it waits for the load, and handed to the dispatch, which makes them its
// own (load.Guard.Dispatch) instead of acquiring others. A request that is not dispatched
// releases them.
type waitGuards [2]*load.Guard

// waitGuards takes the in-flight guards of a request whose pick loads its adapter on some
// engine, at now; none (the zero value) when every picked engine holds it already.
func (s *Server) waitGuards(pick *engine.BucketPick, now time.Time) waitGuards {
	var g waitGuards
	switch {
	case !pick.IsPD():
		if pick.Plain.LoadAdapter {
			g[0] = s.tracker.AcquireWaiting(pick.Plain.Worker.Counters, now)
		}
	case pick.Prefill.LoadAdapter || pick.Decode.LoadAdapter:
		// The pair waits for either engine's load.
		g[0] = s.tracker.AcquireWaiting(pick.Prefill.Worker.Counters, now)
		g[1] = s.tracker.AcquireWaiting(pick.Decode.Worker.Counters, now)
	}
	return g
}

// release releases the guards of a request that is not dispatched.
func (g *waitGuards) release() {
	for i := range g {
		g[i].Release()
		g[i] = nil
	}
}

// adapterHolds are one request's holds of its adapter on its picked engines (the plain
// engine, or the prefill and decode engines): an adapter held is never evicted.
type adapterHolds [2]engine.AdapterHold

// hold takes the holds of adapter on the engines of pick at now; lost is the engine that no
// longer holds it (another pick evicted it since), after the holds taken were released.
func (l *loraRouting) hold(adapter string, pick *engine.BucketPick, now time.Time) (h adapterHolds, lost *engine.Worker) {
	ws := [2]*engine.Worker{pick.Plain.Worker}
	if pick.IsPD() {
		ws = [2]*engine.Worker{pick.Prefill.Worker, pick.Decode.Worker}
	}
	for i, w := range ws {
		if w == nil {
			continue
		}
		var ok bool
		if h[i], ok = w.HoldAdapter(adapter, now); !ok {
			h.release(now, l, w.Model)
			return adapterHolds{}, w
		}
	}
	return h, nil
}

// any reports whether h holds an adapter on some engine.
func (h *adapterHolds) any() bool { return *h != adapterHolds{} }

// release ends the holds at now; the end of an adapter's last use on an engine of model
// wakes l's requests for adapters of model waiting for a slot (l may be nil when h holds
// nothing).
func (h *adapterHolds) release(now time.Time, l *loraRouting, model string) {
	idle := false
	for i := range h {
		idle = h[i].Release(now) || idle
		h[i] = engine.AdapterHold{}
	}
	if idle {
		l.slotMayFree(model)
	}
}

// slotGeneration returns the count of the events that may have freed an adapter slot on an
// engine of base model model: a request reads it before a selection that may fail for
// engine.ErrAdapterSlotsInUse, for awaitAdapterSlot.
func (l *loraRouting) slotGeneration(model string) uint64 {
	if r := l.room[model]; r != nil {
		return r.gen.Load()
	}
	return 0
}

// slotMayFree records an event that may leave room for an adapter on an engine of base
// model model (an adapter's last request ended there, a load failed and freed its slot, the
// engine's adapter list or slots changed) and wakes the requests for adapters of model
// waiting for a slot. An engine of a model not configured has no waiters.
func (l *loraRouting) slotMayFree(model string) {
	if l == nil {
		return
	}
	r := l.room[model]
	if r == nil {
		return
	}
	r.gen.Add(1)
	if r.waiters.Load() == 0 {
		return // fast path: nobody waits
	}
	r.mu.Lock()
	close(r.freed)
	r.freed = make(chan struct{})
	r.mu.Unlock()
}

// nextLapse returns the earliest time after now at which a load's reservation of an adapter
// slot lapses on an engine of base model model (its load never started or never finished),
// or the zero time. Slow path: a scan of the registry.
func (s *Server) nextLapse(model string, now time.Time) time.Time {
	var next time.Time
	for _, w := range s.wset.Load().Workers() {
		if w.Model != model {
			continue
		}
		if t := w.Adapters().NextLapse(now); !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	return next
}

// awaitAdapterSlot makes a request for an adapter of base model model whose selection (begun
// at the model's slot generation gen) failed because every adapter slot that could take its
// adapter is taken by an adapter in use or a load under way (engine.ErrAdapterSlotsInUse)
// wait for an event that may free one on an engine of the model (slotMayFree), or for the
// earliest lapse of a load's reservation there, and reports whether it should be selected
// again. It does not wait, and reports false, with lora.max_slot_waiters requests waiting
// already (or 0 allowed), or once the request has waited lora.load_timeout (or
// server.request_timeout) in all: the selection's failure is then the request's answer. A
// client that leaves, or a hard stop, ends the wait with the request's error. Slow path:
// one timer and one client watch per wait.
func (s *Server) awaitAdapterSlot(ctx *fasthttp.RequestCtx, att *attempts, model string, gen uint64) (again bool, e *apiError) {
	l := s.lora
	limit := int64(l.cfg.MaxSlotWaiters)
	room := l.room[model]
	if limit <= 0 || room == nil {
		return false, nil
	}
	lm := l.metrics[model]
	now := s.now()
	if att.slotUntil.IsZero() {
		bound := l.cfg.LoadTimeout
		if t := s.cfg.Server.RequestTimeout; t > 0 {
			bound = min(bound, t)
		}
		att.slotUntil = now.Add(bound)
	}
	d := att.slotUntil.Sub(now)
	if d <= 0 {
		lm.waitTimeout.Inc()
		return false, nil
	}
	if l.slotWaiters.Add(1) > limit {
		l.slotWaiters.Add(-1)
		lm.waitFull.Inc()
		return false, nil
	}
	defer l.slotWaiters.Add(-1)
	room.waiters.Add(1)
	defer room.waiters.Add(-1)
	room.mu.Lock()
	freed := room.freed
	room.mu.Unlock()
	if room.gen.Load() != gen {
		// A slot may have freed since the selection began (before this request counted
		// among the waiters, so nobody woke it): select again at once.
		lm.waitFreed.Inc()
		return true, nil
	}
	// A reservation that lapses frees its slot without an event: the wait ends then, if
	// before its bound.
	lapse := false
	if t := s.nextLapse(model, now); !t.IsZero() && t.Before(att.slotUntil) {
		d, lapse = t.Sub(now), true
	}
	gone, stop := (*clientWatch)(ctx).Watch()
	defer stop()
	fired := make(chan struct{})
	cancel := s.opts.Clock.AfterFunc(d, func() { close(fired) })
	defer cancel()
	select {
	case <-freed:
		lm.waitFreed.Inc()
		return true, nil
	case <-fired:
		if lapse {
			lm.waitFreed.Inc()
			return true, nil
		}
		lm.waitTimeout.Inc()
		return false, nil
	case <-gone:
		lm.waitAbandoned.Inc()
		return false, errClientGoneSlot
	case <-s.hardStop:
		lm.waitAbandoned.Inc()
		return false, errShuttingDown
	}
}

// errClientGoneSlot answers (to nobody) a request whose client left while it waited for an
// adapter slot.
var errClientGoneSlot = newAPIError(CodeClientClosed, "the client closed the connection while the request waited for a LoRA adapter slot")

// load loads adapter onto the worker of pick p (lifecycle state m) at now unless a load of
// it is already under way there, in which case it waits for that one (bounded by the same
// load timeout), or the worker holds it already (a load that ended meanwhile). On success
// the worker holds the adapter. The pick's share in the slot's reservation is the load's
// from then on (engine.Pick.BeginAdapterLoad); a pick whose load never begins keeps it, for
// the caller to give back (engine.BucketPick.AbandonAdapters). A pick whose reservation is
// gone (the load it shared failed while it waited to dispatch, or it lapsed) does not load:
// it answers errAdapterReservationGone, and the request is selected again. joined reports
// that another request's load did it (one under way, or ended meanwhile).
func (l *loraRouting) load(m *fleet.Member, p *engine.Pick, adapter string, lm *loraMetrics, now time.Time) (joined bool, e *apiError) {
	path, ok := l.path[adapter]
	if !ok {
		return false, newAPIError(CodeAdapterLoad, "adapter "+adapter+" has no configured path (models.<name>.lora_adapters): it cannot be loaded")
	}
	w := p.Worker
	k := loadKey{w.ID, adapter}
	l.mu.Lock()
	if c := l.loading[k]; c != nil {
		l.mu.Unlock()
		p.BeginAdapterLoad(now) // the load under way is the pick's, whichever reservation it holds
		<-c.done
		return true, c.err
	}
	// No load of it is under way: one that ended did so before its call was removed (under
	// l.mu), so the worker's set says how it ended.
	if w.Adapters().Has(adapter) {
		// Slow path: loaded meanwhile; the load that ended dropped the reservation, else the
		// pick gives its share back.
		l.mu.Unlock()
		p.AbandonAdapter()
		return true, nil
	}
	if !p.BeginAdapterLoad(now) {
		l.mu.Unlock()
		return false, errAdapterReservationGone // slow path: the load it shared failed, or it lapsed
	}
	c := &loadCall{done: make(chan struct{})}
	l.loading[k] = c
	l.mu.Unlock()

	// The load (and the unload it needs first) is bounded by lora.load_timeout on the wall
	// clock, like every network wait.
	deadline := time.Now().Add(l.cfg.LoadTimeout)
	if victim := w.Adapters().Evicting(adapter); victim != "" {
		// Slow path: the pick evicted an adapter to make room; the engine unloads it first.
		// A failed unload leaves the load to the engine's answer (it refuses a full engine).
		if l.unload(m, victim, deadline) {
			lm.evicted.Inc()
		} else {
			lm.evictFailed.Inc()
		}
	}
	c.err = l.post(m, adapter, path, deadline)
	if c.err == nil {
		w.AddAdapter(adapter, l.now()) // on the clock the engine's list is asked on
		lm.loaded.Inc()
	} else {
		w.ReleaseAdapter(adapter)
		lm.failed.Inc()
		l.slotMayFree(w.Model) // the reserved slot is free again
	}
	l.mu.Lock()
	delete(l.loading, k)
	l.mu.Unlock()
	close(c.done)
	return false, c.err
}

// errAdapterReservationGone is load's answer for a pick whose slot reservation is gone
// before its load began: the request is selected again (attempts.reselect); it answers the
// client only when the request's selections run out.
var errAdapterReservationGone = newAPIError(CodeAdapterLoad,
	"the adapter slot reserved for the request's adapter load was released before the load began (a load it shared failed, or the reservation lapsed)")

// post asks the engine to load the adapter: vLLM's route, else SGLang's (an engine of flavour
// auto that answers 404 on the first is asked on the second). An engine that says the
// adapter is already loaded has it.
func (l *loraRouting) post(m *fleet.Member, adapter, path string, deadline time.Time) *apiError {
	body := jsontext.AppendString(append([]byte(nil), `{"lora_name":`...), adapter)
	body = jsontext.AppendString(append(body, `,"lora_path":`...), path)
	body = append(body, '}')
	status, answer, err := call(m, pathLoadLoRAVLLM, pathLoadLoRASGLang, body, deadline)
	if err != nil {
		return newAPIError(CodeAdapterLoad, "cannot load adapter "+adapter+" on engine "+m.ID()+": "+err.Error())
	}
	switch {
	case status == fasthttp.StatusOK:
		return nil
	case status == fasthttp.StatusBadRequest && bytes.Contains(answer, []byte("already")):
		return nil
	}
	if len(answer) > 256 {
		answer = answer[:256]
	}
	return newAPIError(CodeAdapterLoad, "cannot load adapter "+adapter+" on engine "+m.ID()+": it answered "+
		fasthttp.StatusMessage(status)+": "+string(answer))
}

// unload asks the engine to unload adapter, as post asks it to load one, and reports whether
// the engine no longer holds it (it unloaded it, or did not know it).
func (l *loraRouting) unload(m *fleet.Member, adapter string, deadline time.Time) bool {
	body := jsontext.AppendString(append([]byte(nil), `{"lora_name":`...), adapter)
	body = append(body, '}')
	status, answer, err := call(m, pathUnloadLoRAVLLM, pathUnloadLoRASGLang, body, deadline)
	if err != nil {
		l.logger.Warn("cannot unload a LoRA adapter", slog.String("worker", m.ID()), slog.String("adapter", adapter), slog.Any("error", err))
		return false
	}
	if status == fasthttp.StatusOK || status == fasthttp.StatusNotFound && bytes.Contains(answer, []byte(adapter)) {
		return true // a 404 naming the adapter: the engine does not hold it (else: no such route)
	}
	if len(answer) > 256 {
		answer = answer[:256]
	}
	l.logger.Warn("cannot unload a LoRA adapter", slog.String("worker", m.ID()), slog.String("adapter", adapter),
		slog.Int("status", status), slog.String("answer", string(answer)))
	return false
}

// call posts body to the engine's vLLM route, else its SGLang route (by the worker's flavour;
// an engine of flavour auto that answers 404 on the first is asked on the second), and
// returns the last answer's status and body.
func call(m *fleet.Member, vllmRoute, sglangRoute string, body []byte, deadline time.Time) (status int, answer []byte, err error) {
	routes := []string{vllmRoute, sglangRoute}
	switch m.Spec().Flavor {
	case config.FlavorVLLM:
		routes = routes[:1]
	case config.FlavorSGLang:
		routes = routes[1:]
	}
	for _, route := range routes {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetRequestURI(route)
		req.Header.SetHost(m.Upstream().HostPort())
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(body)
		err = m.Upstream().Do(req, resp, deadline)
		status, answer = resp.StatusCode(), append(answer[:0], resp.Body()...)
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
		if err != nil || status != fasthttp.StatusNotFound {
			break
		}
	}
	return status, answer, err
}

// modelsWithAdapters is GET /v1/models with LoRA routing on: the models (configured or served
// by a worker), then every adapter, configured or held by an engine, with its base model as parent (and its
// path as root when configured), as vLLM lists them.
func (s *Server) modelsWithAdapters() []byte {
	type entry struct{ id, parent, root string }
	var list []entry
	seen := map[string]bool{}
	for name := range s.models {
		list = append(list, entry{id: name})
		seen[name] = true
	}
	for _, w := range s.wset.Load().Workers() {
		if !seen[w.Model] {
			seen[w.Model] = true
			list = append(list, entry{id: w.Model})
		}
	}
	for adapter, model := range s.lora.model {
		list = append(list, entry{adapter, model, s.lora.path[adapter]})
		seen[adapter] = true
	}
	for _, w := range s.wset.Load().Workers() {
		if s.models[w.Model] == nil {
			continue
		}
		for _, a := range w.Adapters().Names() {
			if !seen[a] {
				seen[a] = true
				list = append(list, entry{id: a, parent: w.Model})
			}
		}
	}
	slices.SortFunc(list, func(a, b entry) int {
		if (a.parent == "") != (b.parent == "") {
			if a.parent == "" {
				return -1
			}
			return 1
		}
		return bytes.Compare([]byte(a.id), []byte(b.id))
	})
	b := []byte(`{"object":"list","data":[`)
	for i, e := range list {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsontext.AppendString(append(b, `{"id":`...), e.id)
		b = append(b, `,"object":"model","created":0,"owned_by":"switchyard"`...)
		if e.parent != "" {
			b = jsontext.AppendString(append(b, `,"parent":`...), e.parent)
			if e.root != "" {
				b = jsontext.AppendString(append(b, `,"root":`...), e.root)
			}
		}
		b = append(b, '}')
	}
	return append(b, "]}"...)
}
