package engine

import (
	"slices"
)

// AdapterSet is the LoRA adapters one engine holds and how many it can hold (its slots): an
// immutable value the worker lifecycle publishes on the Worker (SetAdapters) as it learns
// them, and dispatch replaces when it has loaded one.
type AdapterSet struct {
	names []string // sorted
	// Slots is how many adapters the engine holds at once; 0 means no known bound.
	Slots int
}

// NewAdapterSet returns the set of names (copied, duplicates dropped) with slots slots.
func NewAdapterSet(names []string, slots int) *AdapterSet {
	s := &AdapterSet{names: slices.Clone(names), Slots: max(slots, 0)}
	slices.Sort(s.names)
	s.names = slices.Compact(s.names)
	return s
}

// Has reports whether the set holds adapter name. A nil set holds none.
func (s *AdapterSet) Has(name string) bool {
	if s == nil {
		return false
	}
	_, ok := slices.BinarySearch(s.names, name)
	return ok
}

// Names returns the adapters, sorted; the caller must not modify the slice.
func (s *AdapterSet) Names() []string {
	if s == nil {
		return nil
	}
	return s.names
}

// Free reports whether the engine has room for one more adapter. A nil set (nothing learned
// yet) has room.
func (s *AdapterSet) Free() bool { return s == nil || s.Slots == 0 || len(s.names) < s.Slots }

// With returns a set with name added (s itself when it holds it already).
func (s *AdapterSet) With(name string) *AdapterSet {
	if s.Has(name) {
		return s
	}
	var slots int
	if s != nil {
		slots = s.Slots
	}
	return NewAdapterSet(append(slices.Clone(s.Names()), name), slots)
}

// Adapters returns the LoRA adapters the engine is known to hold, or nil when none were
// learned.
func (w *Worker) Adapters() *AdapterSet { return w.adapters.Load() }

// SetAdapters publishes the adapters the engine holds.
func (w *Worker) SetAdapters(s *AdapterSet) { w.adapters.Store(s) }

// AddAdapter records that the engine now holds adapter name (after the router loaded it).
func (w *Worker) AddAdapter(name string) {
	for {
		old := w.adapters.Load()
		if old.Has(name) || w.adapters.CompareAndSwap(old, old.With(name)) {
			return
		}
	}
}
