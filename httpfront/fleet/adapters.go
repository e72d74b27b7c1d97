package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"

	"github.com/valyala/fasthttp"

	"switchyard/engine"
	"switchyard/load"
)

// maxModelEntries bounds the entries of one /v1/models answer the router reads.
const maxModelEntries = 4096

// ModelEntry is one entry of an engine's /v1/models answer. vLLM lists its base model with
// a null parent and each LoRA adapter with the base model as parent and the adapter's path
// as root.
type ModelEntry struct {
	ID     string  `json:"id"`
	Root   string  `json:"root"`
	Parent *string `json:"parent"`
}

// IsAdapter reports whether the entry is a LoRA adapter (it names a parent model).
func (m *ModelEntry) IsAdapter() bool { return m.Parent != nil && *m.Parent != "" && *m.Parent != m.ID }

// DecodeModelList decodes a /v1/models body: the router's one decoder of it. Entries
// without an id are skipped; more than maxModelEntries entries are an error.
func DecodeModelList(body []byte) ([]ModelEntry, error) {
	var list struct {
		Data []ModelEntry `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("cannot decode %s: %w", PathModels, err)
	}
	if len(list.Data) > maxModelEntries {
		return nil, fmt.Errorf("cannot decode %s: %d entries, more than %d", PathModels, len(list.Data), maxModelEntries)
	}
	out := list.Data[:0]
	for _, m := range list.Data {
		if m.ID != "" {
			out = append(out, m)
		}
	}
	return out, nil
}

// RefreshAdapters asks m's engine which LoRA adapters it holds (its /v1/models entries with a
// parent) and publishes them on its worker, with the engine's adapter slots (introspected,
// else Options.AdapterSlots), and tells Options.AdapterRoom when the answer may have made
// room there. A failed answer keeps what was known. The adapter loop calls it every
// Options.AdapterRefresh; so may tests.
func (f *Fleet) RefreshAdapters(ctx context.Context, m *Member) {
	var entries []ModelEntry
	asOf := f.opts.AdapterNow() // what the router changes after this wins over the answer
	err := load.Fetch(ctx, m.up.Probe(), strings.TrimRight(m.url, "/")+PathModels, "application/json", f.health.Timeout, maxInfoBody,
		func(status int, body []byte) error {
			if status != fasthttp.StatusOK {
				return &errStatus{PathModels, status}
			}
			var err error
			entries, err = DecodeModelList(body)
			return err
		})
	if err != nil {
		f.logger.Debug("cannot learn the worker's LoRA adapters", slog.String("worker", m.id), slog.Any("error", err))
		return
	}
	var names []string
	for i := range entries {
		if entries[i].IsAdapter() {
			names = append(names, entries[i].ID)
		}
	}
	w := m.worker.Load()
	if w == nil {
		return
	}
	info := m.info.Load()
	roomy := w.LearnAdapters(names, f.adapterSlots(info), asOf)
	if m.info.Load() != info {
		// Slow path: the engine's facts arrived meanwhile, and their slots may have been
		// applied before this answer (applyAdapterSlots): apply them again.
		roomy = w.SetAdapterSlots(f.adapterSlots(m.info.Load())) || roomy
	}
	if roomy {
		f.adapterRoom(w)
	}
}

// applyAdapterSlots makes m's published worker count the adapter slots of m's facts (taken
// when they arrive: until then, the adapters learned count Options.AdapterSlots), and tells
// Options.AdapterRoom when that is more slots than counted before.
func (f *Fleet) applyAdapterSlots(m *Member) {
	if f.opts.AdapterRefresh <= 0 {
		return
	}
	if w := m.worker.Load(); w.SetAdapterSlots(f.adapterSlots(m.info.Load())) {
		f.adapterRoom(w)
	}
}

// adapterRoom tells Options.AdapterRoom that w's engine may have room for an adapter.
func (f *Fleet) adapterRoom(w *engine.Worker) {
	if f.opts.AdapterRoom != nil {
		f.opts.AdapterRoom(w.Model)
	}
}

// adapterSlots is an engine's LoRA adapter slots: introspected (info may be nil), else
// Options.AdapterSlots.
func (f *Fleet) adapterSlots(info *Info) int {
	if info != nil && info.LoRASlots > 0 {
		return info.LoRASlots
	}
	return f.opts.AdapterSlots
}
