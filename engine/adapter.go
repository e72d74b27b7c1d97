package engine

import (
	"slices"
	"time"
)

// AdapterSet is the LoRA adapters one engine holds, the loads the router has under way on it,
// and how many adapters it can hold (its slots): an immutable value the worker lifecycle
// publishes on the Worker (LearnAdapters) as it learns them, a group's pick reserves a slot in
// (ReserveAdapter) and dispatch completes (AddAdapter) or releases (ReleaseAdapter).
type AdapterSet struct {
	names   []string // sorted
	loading []reservation
	// Slots is how many adapters the engine holds at once; 0 means no known bound.
	Slots int
}

// reservation is a slot taken for an adapter load under way; it lapses at until (a load
// that was never started or never finished frees its slot then).
type reservation struct {
	name  string
	until time.Time
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

// Loading reports whether a load of adapter name holds a slot of the set at now.
func (s *AdapterSet) Loading(name string, now time.Time) bool {
	if s == nil {
		return false
	}
	return slices.ContainsFunc(s.loading, func(r reservation) bool { return r.name == name && now.Before(r.until) })
}

// Free reports whether the engine has room for one more adapter at now: its slots less the
// adapters it holds and the loads reserved until after now. A nil set (nothing learned yet)
// has room.
func (s *AdapterSet) Free(now time.Time) bool {
	if s == nil || s.Slots == 0 {
		return true
	}
	used := len(s.names)
	for _, r := range s.loading {
		if now.Before(r.until) {
			used++
		}
	}
	return used < s.Slots
}

// With returns a set with name added (s itself when it holds it already) and its
// reservation, if any, dropped.
func (s *AdapterSet) With(name string) *AdapterSet {
	if s.Has(name) {
		return s
	}
	var slots int
	if s != nil {
		slots = s.Slots
	}
	out := NewAdapterSet(append(slices.Clone(s.Names()), name), slots)
	if s != nil {
		out.loading = s.withoutLoading(name)
	}
	return out
}

// withoutLoading returns s's reservations other than name's, in a new slice.
func (s *AdapterSet) withoutLoading(name string) []reservation {
	var out []reservation
	for _, r := range s.loading {
		if r.name != name {
			out = append(out, r)
		}
	}
	return out
}

// Adapters returns the LoRA adapters the engine is known to hold, or nil when none were
// learned.
func (w *Worker) Adapters() *AdapterSet { return w.adapters.Load() }

// SetAdapters publishes the adapters the engine holds, replacing everything known.
func (w *Worker) SetAdapters(s *AdapterSet) { w.adapters.Store(s) }

// LearnAdapters publishes the adapters the engine says it holds and its slots, keeping the
// reservations of loads under way of adapters it does not list yet.
func (w *Worker) LearnAdapters(names []string, slots int) {
	for {
		old := w.adapters.Load()
		s := NewAdapterSet(names, slots)
		if old != nil {
			for _, r := range old.loading {
				if !s.Has(r.name) {
					s.loading = append(s.loading, r)
				}
			}
		}
		if w.adapters.CompareAndSwap(old, s) {
			return
		}
	}
}

// ReserveAdapter takes a slot for a load of adapter name until until, and reports whether
// the engine holds it, is loading it, or had a free slot at now.
func (w *Worker) ReserveAdapter(name string, now, until time.Time) bool {
	for {
		old := w.adapters.Load()
		if old.Has(name) || old.Loading(name, now) {
			return true
		}
		if !old.Free(now) {
			return false
		}
		s := &AdapterSet{}
		if old != nil {
			s.names, s.Slots = old.names, old.Slots // names is never modified
			for _, r := range old.loading {
				if now.Before(r.until) { // lapsed reservations go
					s.loading = append(s.loading, r)
				}
			}
		}
		s.loading = append(s.loading, reservation{name, until})
		if w.adapters.CompareAndSwap(old, s) {
			return true
		}
	}
}

// AddAdapter records that the engine now holds adapter name (after the router loaded it).
func (w *Worker) AddAdapter(name string) {
	for {
		old := w.adapters.Load()
		if old.Has(name) || w.adapters.CompareAndSwap(old, old.With(name)) {
			return
		}
	}
}

// ReleaseAdapter drops the reservation of a load of adapter name that failed.
func (w *Worker) ReleaseAdapter(name string) {
	for {
		old := w.adapters.Load()
		if old == nil || !slices.ContainsFunc(old.loading, func(r reservation) bool { return r.name == name }) {
			return
		}
		s := *old
		s.loading = old.withoutLoading(name)
		if w.adapters.CompareAndSwap(old, &s) {
			return
		}
	}
}
