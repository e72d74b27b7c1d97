package engine

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"switchyard/load"
)

// Worker is one engine. Its identity fields never change after construction; health is an
// atomic flag flipped through WorkerSet.SetHealthy, which also republishes the registry so
// that groups see the change; labels are an atomic snapshot (SetLabels) read at every pick. A *Worker is stable for the worker's lifetime: a removed and
// re-added worker is a new *Worker even with the same ID.
type Worker struct {
	// ID is the stable worker ID.
	ID string
	// URL is the engine's base URL.
	URL string
	// Model is the served model name.
	Model string
	// Stage is the worker's role label.
	Stage Stage
	// BootstrapPort is a prefill engine's PD bootstrap port; 0 means none.
	BootstrapPort int
	// DPSize is the number of data-parallel ranks (at least 1).
	DPSize int
	// CanPrefill marks a decode engine that can also serve a request alone, prefill
	// included: a PD bucket's bypass target (Bucket.BypassBelow).
	CanPrefill bool
	// Counters is the worker's router-local accounting (in-flight, dispatches). Never nil.
	Counters *load.Counters
	// Handle is the worker lifecycle's state of this worker (httpfront/fleet sets it before
	// publishing the worker), so that dispatch reaches the engine's client and breaker from
	// a pick without a lookup. Nil for workers built elsewhere; engine never reads it.
	Handle any
	// AdapterRoom, when set (before the worker is published), is called with the worker's
	// model when a pick gives back an adapter slot it reserved and no other pick or load
	// relies on (Pick.AbandonAdapter): a request waiting for a slot may find one now.
	AdapterRoom func(model string)
	// labels are the worker's labels (configured over introspected) that PD compatibility
	// compares; nil when none. Like health, they may change while the worker is published
	// (SetLabels: re-introspection learned new ones) without making it a new worker.
	labels atomic.Pointer[map[string]string]

	healthy atomic.Bool
	// ownAdapters is the worker's AdapterSet cell, unless sharedAdapters (set by
	// ShareAdapters before the worker is published) names its predecessor's: one engine's
	// adapters have one cell, whichever of its workers a pick or a load went through.
	ownAdapters    atomic.Pointer[AdapterSet]
	sharedAdapters *atomic.Pointer[AdapterSet]
}

// adapters returns the cell of the worker's AdapterSet.
func (w *Worker) adapters() *atomic.Pointer[AdapterSet] {
	if c := w.sharedAdapters; c != nil {
		return c
	}
	return &w.ownAdapters
}

// ShareAdapters makes w, a worker rebuilt for the engine of old (its facts changed), keep
// old's AdapterSet: the same cell, not a copy, so that a load, a release or a give-back
// that ends on old after w is published reaches w too. Call it before w is published.
func (w *Worker) ShareAdapters(old *Worker) { w.sharedAdapters = old.adapters() }

// NewWorker returns a healthy worker. A nil counters gets a private set.
func NewWorker(id, url, model string, stage Stage, counters *load.Counters) *Worker {
	if counters == nil {
		counters = new(load.Counters)
	}
	w := &Worker{ID: id, URL: url, Model: model, Stage: stage, DPSize: 1, Counters: counters}
	w.healthy.Store(true)
	return w
}

// Label returns the worker's label name, or "" when it has none.
func (w *Worker) Label(name string) string {
	if m := w.labels.Load(); m != nil {
		return (*m)[name]
	}
	return ""
}

// Labels returns the worker's labels, nil when none. The map is shared: do not modify it.
func (w *Worker) Labels() map[string]string {
	if m := w.labels.Load(); m != nil {
		return *m
	}
	return nil
}

// SetLabels replaces the worker's labels with m (nil or empty: none). m must not be
// modified afterwards. A published worker's labels change at once for every pick that
// reads them after the call; its identity (and so a retry's exclusion of it) stays.
func (w *Worker) SetLabels(m map[string]string) {
	if len(m) == 0 {
		w.labels.Store(nil)
		return
	}
	w.labels.Store(&m)
}

// Healthy reports the worker's current health.
func (w *Worker) Healthy() bool { return w.healthy.Load() }

// String returns the worker's ID.
func (w *Worker) String() string { return w.ID }

type modelStage struct {
	model string
	stage Stage
}

// Registry is an immutable snapshot of the live workers. Groups cache what they derive from a
// snapshot and recompute only when the snapshot pointer changes.
type Registry struct {
	byID map[string]*Worker
	all  []*Worker // sorted by ID
	// healthy workers per (model, stage), sorted by ID.
	healthy map[modelStage][]*Worker
}

// NewRegistry builds a snapshot from workers. IDs must be unique.
func NewRegistry(workers []*Worker) (*Registry, error) {
	r := &Registry{
		byID:    make(map[string]*Worker, len(workers)),
		all:     slices.Clone(workers),
		healthy: make(map[modelStage][]*Worker),
	}
	for _, w := range workers {
		if w == nil {
			return nil, fmt.Errorf("cannot build registry: %w", errNilWorker)
		}
		if _, dup := r.byID[w.ID]; dup {
			return nil, fmt.Errorf("cannot build registry: duplicate worker ID %q", w.ID)
		}
		r.byID[w.ID] = w
	}
	slices.SortFunc(r.all, func(a, b *Worker) int { return cmp.Compare(a.ID, b.ID) })
	for _, w := range r.all {
		if w.Healthy() {
			k := modelStage{w.Model, w.Stage}
			r.healthy[k] = append(r.healthy[k], w)
		}
	}
	return r, nil
}

// Worker returns the worker with the given ID, or nil.
func (r *Registry) Worker(id string) *Worker { return r.byID[id] }

// Workers returns every worker, sorted by ID. The caller must not modify the slice.
func (r *Registry) Workers() []*Worker { return r.all }

// Healthy returns the healthy workers of a model and stage, sorted by ID. The caller must not
// modify the slice.
func (r *Registry) Healthy(model string, stage Stage) []*Worker {
	return r.healthy[modelStage{model, stage}]
}

// WorkerSet publishes the current Registry behind an atomic pointer. Readers call Load;
// writers (worker lifecycle) serialize on a mutex and publish a new snapshot.
type WorkerSet struct {
	mu  sync.Mutex
	cur atomic.Pointer[Registry]
}

// NewWorkerSet returns a set holding the given workers.
func NewWorkerSet(workers []*Worker) (*WorkerSet, error) {
	r, err := NewRegistry(workers)
	if err != nil {
		return nil, err
	}
	s := &WorkerSet{}
	s.cur.Store(r)
	return s, nil
}

// Load returns the current snapshot.
func (s *WorkerSet) Load() *Registry { return s.cur.Load() }

// Add publishes a snapshot with w added; its ID must be new.
func (s *WorkerSet) Add(w *Worker) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.cur.Load()
	if old.byID[w.ID] != nil {
		return fmt.Errorf("cannot add worker %q: %w", w.ID, ErrDuplicateWorker)
	}
	r, err := NewRegistry(append(slices.Clone(old.all), w))
	if err != nil {
		return err
	}
	s.cur.Store(r)
	return nil
}

// Remove publishes a snapshot without the worker and returns it, or nil when unknown.
func (s *WorkerSet) Remove(id string) *Worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.cur.Load()
	w := old.byID[id]
	if w == nil {
		return nil
	}
	rest := make([]*Worker, 0, len(old.all)-1)
	for _, o := range old.all {
		if o != w {
			rest = append(rest, o)
		}
	}
	r, _ := NewRegistry(rest) // IDs were unique before; cannot fail
	s.cur.Store(r)
	return w
}

// SetHealthy sets a worker's health and republishes the snapshot when it changed. It reports
// whether the worker exists.
func (s *WorkerSet) SetHealthy(id string, healthy bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.cur.Load()
	w := old.byID[id]
	if w == nil {
		return false
	}
	if w.healthy.Swap(healthy) == healthy {
		return true
	}
	r, _ := NewRegistry(old.all)
	s.cur.Store(r)
	return true
}
