package mockengine

import (
	"encoding/json"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// LoRA simulates serving LoRA adapters on the base model: a bounded number of adapter slots,
// adapters loaded at start or at run time through the engine's API (vLLM's
// /v1/load_lora_adapter and /v1/unload_lora_adapter, SGLang's /load_lora_adapter and
// /unload_lora_adapter) with a simulated load time, listed in /v1/models with their parent,
// and requests whose model names an adapter that is not loaded refused with 404, as vLLM
// refuses an unknown model.
type LoRA struct {
	// Slots is how many adapters the engine holds at once; 0 turns LoRA off (any model name
	// is served as the base model). Default 0.
	Slots int
	// LoadTime is the simulated time one adapter load takes (divided by Speedup). Default 0.
	LoadTime time.Duration
	// Adapters are loaded at start, name to path; at most Slots. Default none.
	Adapters map[string]string
}

// loras is an engine's loaded adapters.
type loras struct {
	mu    sync.Mutex
	paths map[string]string // name -> path
	// loading holds the slots of loads under way, so that concurrent loads cannot overfill.
	loading int
	loads   atomic.Int64
}

func newLoras(cfg LoRA) *loras {
	l := &loras{paths: make(map[string]string, cfg.Slots)}
	for name, path := range cfg.Adapters {
		l.paths[name] = path
	}
	return l
}

// has reports whether adapter name is loaded.
func (l *loras) has(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.paths[name]
	return ok
}

// list returns the loaded adapters, sorted by name.
func (l *loras) list() (names, paths []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for n := range l.paths {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		paths = append(paths, l.paths[n])
	}
	return names, paths
}

// LoRALoads is how many adapters the engine loaded at run time.
func (e *Engine) LoRALoads() int64 { return e.lora.loads.Load() }

// LoRAAdapters returns the adapters the engine holds, sorted by name.
func (e *Engine) LoRAAdapters() []string {
	names, _ := e.lora.list()
	return names
}

// loraRequest is the body of a load or unload call (both engines use these names).
type loraRequest struct {
	Name string `json:"lora_name"`
	Path string `json:"lora_path"`
}

// serveLoadLoRA loads an adapter: it takes a free slot (400 when none is free or the
// adapter is already loaded, as vLLM answers) and holds the request for the load time.
func (e *Engine) serveLoadLoRA(ctx *fasthttp.RequestCtx) {
	var req loraRequest
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil || req.Name == "" || req.Path == "" {
		e.writeError(ctx, fasthttp.StatusBadRequest, "lora_name and lora_path are required")
		return
	}
	l := e.lora
	l.mu.Lock()
	if _, ok := l.paths[req.Name]; ok {
		l.mu.Unlock()
		e.writeError(ctx, fasthttp.StatusBadRequest, "The lora adapter '"+req.Name+"' has already been loaded.")
		return
	}
	if len(l.paths)+l.loading >= e.cfg.LoRA.Slots {
		l.mu.Unlock()
		e.writeError(ctx, fasthttp.StatusBadRequest, "no free LoRA adapter slot: unload an adapter first")
		return
	}
	l.loading++
	l.mu.Unlock()
	ok := e.sleep(e.ctx, time.Duration(float64(e.cfg.LoRA.LoadTime)/e.cfg.Speedup))
	l.mu.Lock()
	l.loading--
	if ok {
		l.paths[req.Name] = req.Path
	}
	l.mu.Unlock()
	if !ok {
		e.writeError(ctx, fasthttp.StatusServiceUnavailable, "the engine is shutting down")
		return
	}
	l.loads.Add(1)
	ctx.SetContentType("text/plain")
	ctx.SetBodyString("Success: LoRA adapter '" + req.Name + "' added successfully.")
}

// serveUnloadLoRA unloads an adapter (404 when it is not loaded).
func (e *Engine) serveUnloadLoRA(ctx *fasthttp.RequestCtx) {
	var req loraRequest
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil || req.Name == "" {
		e.writeError(ctx, fasthttp.StatusBadRequest, "lora_name is required")
		return
	}
	l := e.lora
	l.mu.Lock()
	_, ok := l.paths[req.Name]
	delete(l.paths, req.Name)
	l.mu.Unlock()
	if !ok {
		e.writeError(ctx, fasthttp.StatusNotFound, "The lora adapter '"+req.Name+"' cannot be found.")
		return
	}
	ctx.SetContentType("text/plain")
	ctx.SetBodyString("Success: LoRA adapter '" + req.Name + "' removed successfully.")
}

// unknownModel reports whether req's model is neither the base model nor a loaded adapter,
// when LoRA is on.
func (e *Engine) unknownModel(req *inferRequest) bool {
	return e.cfg.LoRA.Slots > 0 && req.model != "" && req.model != e.cfg.Model && !e.lora.has(req.model)
}
