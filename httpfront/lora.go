package httpfront

import (
	"bytes"
	"slices"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"switchyard/config"
	"switchyard/engine"
	"switchyard/httpfront/fleet"
	"switchyard/httpfront/jsontext"
	"switchyard/load/series"
)

// LoRA-adapter routing (config lora, models.<name>.lora_adapters): a request whose model
// names an adapter is routed by its base model's buckets, with engine.BucketRequest.Adapter
// set so that the groups' candidates are the engines holding it; with lora.auto_load, an
// engine picked to load it (Pick.LoadAdapter) gets it through its API before the request
// is forwarded. The body is forwarded as the client sent it: the engine serves the adapter
// under its name in the model field, as vLLM does.

// Engine routes that load a LoRA adapter.
const (
	pathLoadLoRAVLLM   = "/v1/load_lora_adapter"
	pathLoadLoRASGLang = "/load_lora_adapter"
)

// Metric names of adapter routing.
const (
	metricLoRAPicks = "switchyard_lora_picks_total"
	metricLoRALoads = "switchyard_lora_loads_total"
)

// loraRouting is a Server's adapter routing; nil when lora.enabled is off.
type loraRouting struct {
	cfg config.LoRA
	// model and path are the configured adapters: adapter name to base model and to path.
	model, path map[string]string
	metrics     map[string]*loraMetrics // by base model

	mu      sync.Mutex
	loading map[loadKey]*loadCall // loads under way, shared by concurrent requests
}

type loraMetrics struct {
	hit, load, loaded, failed *metrics.Counter
}

type loadKey struct{ worker, adapter string }

// loadCall is one adapter load under way; err is set before done is closed.
type loadCall struct {
	done chan struct{}
	err  *apiError
}

func newLoRARouting(cfg *config.Config, set *metrics.Set) *loraRouting {
	if !cfg.LoRA.Enabled {
		return nil
	}
	l := &loraRouting{cfg: cfg.LoRA, model: map[string]string{}, path: map[string]string{},
		metrics: map[string]*loraMetrics{}, loading: map[loadKey]*loadCall{}}
	for name, m := range cfg.Models {
		for adapter, path := range m.LoRAAdapters {
			l.model[adapter], l.path[adapter] = name, path
		}
		base := `{model="` + series.Label(name) + `",result="`
		l.metrics[name] = &loraMetrics{
			hit:    set.NewCounter(metricLoRAPicks + base + `hit"}`),
			load:   set.NewCounter(metricLoRAPicks + base + `load"}`),
			loaded: set.NewCounter(metricLoRALoads + base + `ok"}`),
			failed: set.NewCounter(metricLoRALoads + base + `failed"}`),
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
// picked engine that does not hold it yet. It runs before any guard is taken.
func (s *Server) prepareAdapter(model, adapter string, p *engine.BucketPick, a *picked) *apiError {
	lm := s.lora.metrics[model]
	loads := false
	for _, x := range []struct {
		pick *engine.Pick
		m    *fleet.Member
	}{{&p.Plain, a.plain}, {&p.Prefill, a.prefill}, {&p.Decode, a.decode}} {
		if x.pick.Worker == nil || !x.pick.LoadAdapter {
			continue
		}
		loads = true
		if e := s.lora.load(x.m, x.pick.Worker, adapter, lm); e != nil {
			return e
		}
	}
	if loads {
		lm.load.Inc()
	} else {
		lm.hit.Inc()
	}
	return nil
}

// load loads adapter onto worker w (lifecycle state m) unless a load of it is already under
// way there, in which case it waits for that one (bounded by the same load timeout). On
// success the worker holds the adapter.
func (l *loraRouting) load(m *fleet.Member, w *engine.Worker, adapter string, lm *loraMetrics) *apiError {
	path, ok := l.path[adapter]
	if !ok {
		return newAPIError(CodeAdapterLoad, "adapter "+adapter+" has no configured path (models.<name>.lora_adapters): it cannot be loaded")
	}
	k := loadKey{w.ID, adapter}
	l.mu.Lock()
	if c := l.loading[k]; c != nil {
		l.mu.Unlock()
		<-c.done
		return c.err
	}
	c := &loadCall{done: make(chan struct{})}
	l.loading[k] = c
	l.mu.Unlock()

	// The load is bounded by lora.load_timeout on the wall clock, like every network wait.
	c.err = l.post(m, adapter, path, time.Now().Add(l.cfg.LoadTimeout))
	if c.err == nil {
		w.AddAdapter(adapter)
		lm.loaded.Inc()
	} else {
		w.ReleaseAdapter(adapter)
		lm.failed.Inc()
	}
	l.mu.Lock()
	delete(l.loading, k)
	l.mu.Unlock()
	close(c.done)
	return c.err
}

// post asks the engine to load the adapter: vLLM's route, else SGLang's (an engine of flavour
// auto that answers 404 on the first is asked on the second). An engine that says the
// adapter is already loaded has it.
func (l *loraRouting) post(m *fleet.Member, adapter, path string, deadline time.Time) *apiError {
	routes := []string{pathLoadLoRAVLLM, pathLoadLoRASGLang}
	switch m.Spec().Flavor {
	case config.FlavorVLLM:
		routes = routes[:1]
	case config.FlavorSGLang:
		routes = routes[1:]
	}
	body := jsontext.AppendString(append([]byte(nil), `{"lora_name":`...), adapter)
	body = jsontext.AppendString(append(body, `,"lora_path":`...), path)
	body = append(body, '}')
	var status int
	var answer []byte
	for _, route := range routes {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.Header.SetMethod(fasthttp.MethodPost)
		req.SetRequestURI(route)
		req.Header.SetHost(m.Upstream().HostPort())
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(body)
		err := m.Upstream().Do(req, resp, deadline)
		status, answer = resp.StatusCode(), append(answer[:0], resp.Body()...)
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
		if err != nil {
			return newAPIError(CodeAdapterLoad, "cannot load adapter "+adapter+" on engine "+m.ID()+": "+err.Error())
		}
		if status != fasthttp.StatusNotFound {
			break
		}
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
