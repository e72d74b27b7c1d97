package engine

import (
	"math"
	"slices"
	"sync/atomic"
	"time"
)

// AdapterSet is the LoRA adapters one engine holds, the loads the router has under way on it,
// and how many adapters it can hold (its slots): an immutable value the worker lifecycle
// publishes on the Worker (LearnAdapters) as it learns them, a group's pick reserves a slot in
// (ReserveAdapter) and dispatch completes (AddAdapter) or releases (ReleaseAdapter), or a
// pick that is not dispatched gives back (Pick.AbandonAdapter).
//
// Each adapter held carries its use (adapterUse), shared by every version of the set that
// holds it: the requests using it on the engine (HoldAdapter) and when it was last used. A
// pick that finds every slot full may evict the least recently used adapter no request uses
// (ReserveAdapter with an evictable set): it is dropped from the set at once, and its
// unload goes with the reservation of the load that replaces it (Evicting).
type AdapterSet struct {
	names []string // sorted
	uses  []*adapterUse
	// loading are the loads under way, each with the adapter it evicts, if any.
	loading []reservation
	// gone are the adapters evicted lately, with when: an engine's list asked for before
	// then may still name them (LearnAdapters).
	gone []evicted
	// Slots is how many adapters the engine holds at once; 0 means no known bound.
	Slots int
}

// evicted is an adapter evicted at at (unix nanoseconds).
type evicted struct {
	name string
	at   int64
}

// maxGone bounds the evictions a set remembers.
const maxGone = 64

// adapterUse is the use of one adapter on one engine. inflight counts the requests holding
// it; evictedUse marks it evicted (no hold can be taken any more). last is the unix
// nanoseconds of its latest hold or release.
type adapterUse struct {
	inflight atomic.Int64
	last     atomic.Int64
	// added is the unix nanoseconds at which the router loaded it (AddAdapter); 0 for an
	// adapter learned from the engine.
	added int64
}

// evictedUse is adapterUse.inflight of an evicted adapter.
const evictedUse = -1

func newAdapterUse(now int64) *adapterUse {
	u := &adapterUse{added: now}
	u.last.Store(now)
	return u
}

// reservation is a slot taken for an adapter load under way; it lapses at until (a load
// that was never started or never finished frees its slot then). victim is the adapter the
// load evicts first ("" when the slot was free). key names it to the picks that rely on it
// (AdapterReservation); picks counts them: the pick that took it and those that found the
// load under way. A pick whose dispatch never begins the load gives its share back
// (Pick.AbandonAdapter); the reservation goes with the last share, unless a dispatch began
// its load (Pick.BeginAdapterLoad keeps that pick's share until the load's end drops the
// reservation: AddAdapter or ReleaseAdapter). began marks a reservation whose load a
// dispatch began: its victim may be unloaded already. A reservation that lapses before its
// load began gives its victim back, as the last share's give-back does (expireLoads).
type reservation struct {
	name   string
	victim string
	until  time.Time
	key    *reservationKey
	picks  int
	began  bool
}

// reservationKey identifies one reservation (its pointer); it is never modified.
type reservationKey struct{ name string }

// AdapterReservation is one pick's share in a reservation of an adapter slot
// (Worker.ReserveAdapter); the zero value shares none.
type AdapterReservation struct{ key *reservationKey }

// NewAdapterSet returns the set of names (copied, duplicates dropped) with slots slots.
func NewAdapterSet(names []string, slots int) *AdapterSet {
	s := &AdapterSet{names: slices.Clone(names), Slots: max(slots, 0)}
	slices.Sort(s.names)
	s.names = slices.Compact(s.names)
	s.uses = make([]*adapterUse, len(s.names))
	for i := range s.uses {
		s.uses[i] = &adapterUse{}
	}
	return s
}

// use returns the use of adapter name, or nil when the set does not hold it.
func (s *AdapterSet) use(name string) *adapterUse {
	if s == nil {
		return nil
	}
	if i, ok := slices.BinarySearch(s.names, name); ok {
		return s.uses[i]
	}
	return nil
}

// Has reports whether the set holds adapter name (and it is not being evicted). A nil set
// holds none.
func (s *AdapterSet) Has(name string) bool {
	u := s.use(name)
	return u != nil && u.inflight.Load() != evictedUse
}

// InFlight returns how many requests hold adapter name on the engine (0 when it is not held).
func (s *AdapterSet) InFlight(name string) int64 {
	if u := s.use(name); u != nil {
		return max(u.inflight.Load(), 0)
	}
	return 0
}

// Evicting returns the adapter the load of adapter name under way evicts first, or "".
func (s *AdapterSet) Evicting(name string) string {
	if s == nil {
		return ""
	}
	for _, r := range s.loading {
		if r.name == name {
			return r.victim
		}
	}
	return ""
}

// CanEvict reports whether the set holds an adapter that evictable accepts and no request
// uses: a full engine could make room by unloading it.
func (s *AdapterSet) CanEvict(evictable map[string]struct{}) bool {
	return s.victim(evictable) >= 0
}

// victim returns the index of the least recently used adapter evictable accepts and no
// request uses, or -1.
func (s *AdapterSet) victim(evictable map[string]struct{}) int {
	if s == nil {
		return -1
	}
	best, bestLast := -1, int64(0)
	for i, n := range s.names {
		if _, ok := evictable[n]; !ok || s.uses[i].inflight.Load() != 0 {
			continue
		}
		if l := s.uses[i].last.Load(); best < 0 || l < bestLast {
			best, bestLast = i, l
		}
	}
	return best
}

// InUse reports whether a slot of the set is taken at now by an adapter evictable accepts
// that a request uses, or by a load under way: the end of those requests, or of the load
// (whose requests then use the adapter, or which failed and frees the slot), may leave an
// adapter to evict.
func (s *AdapterSet) InUse(evictable map[string]struct{}, now time.Time) bool {
	if s == nil {
		return false
	}
	for i, n := range s.names {
		if _, ok := evictable[n]; ok && s.uses[i].inflight.Load() > 0 {
			return true
		}
	}
	return slices.ContainsFunc(s.loading, func(r reservation) bool { return now.Before(r.until) })
}

// NextLapse returns the earliest time after now at which a reservation of the set lapses
// (a load that never started or never finished frees its slot then), or the zero time.
func (s *AdapterSet) NextLapse(now time.Time) time.Time {
	var next time.Time
	if s == nil {
		return next
	}
	for _, r := range s.loading {
		if now.Before(r.until) && (next.IsZero() || r.until.Before(next)) {
			next = r.until
		}
	}
	return next
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
func (s *AdapterSet) Free(now time.Time) bool { return s.FreeSlots(now) > 0 }

// FreeSlots returns how many more adapters the engine has room for at now: its slots less
// the adapters it holds and the loads reserved until after now; math.MaxInt for a nil set
// (nothing learned yet) or one of unbounded slots.
func (s *AdapterSet) FreeSlots(now time.Time) int {
	if s == nil || s.Slots == 0 {
		return math.MaxInt
	}
	used := len(s.names)
	for _, r := range s.loading {
		if now.Before(r.until) {
			used++
		}
	}
	return max(s.Slots-used, 0)
}

// With returns a set with name added at now (s itself when it holds it already) and its
// reservation, if any, dropped.
func (s *AdapterSet) With(name string, now time.Time) *AdapterSet {
	if s.Has(name) {
		return s
	}
	var slots int
	if s != nil {
		slots = s.Slots
	}
	out := &AdapterSet{Slots: slots}
	if s != nil {
		i, _ := slices.BinarySearch(s.names, name)
		out.names = slices.Insert(slices.Clone(s.names), i, name)
		out.uses = slices.Insert(slices.Clone(s.uses), i, newAdapterUse(now.UnixNano()))
		out.loading = s.withoutLoading(name)
		out.gone = s.gone
	} else {
		out.names, out.uses = []string{name}, []*adapterUse{newAdapterUse(now.UnixNano())}
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
func (w *Worker) Adapters() *AdapterSet { return w.adapters().Load() }

// SetAdapters publishes the adapters the engine holds, replacing everything known.
func (w *Worker) SetAdapters(s *AdapterSet) { w.adapters().Store(s) }

// LearnAdapters publishes the adapters the engine says it holds and its slots, in its
// answer to a question asked at asOf, keeping the reservations of loads under way of adapters
// it does not list yet and the use of the adapters it still holds. What the router did since
// asOf wins over the answer: an adapter it loaded since is kept, one it evicted since (or is
// evicting) is left out. It reports whether the answer may have made room on the engine
// (roomy): an adapter known before is gone (the engine unloaded it), one the router did not
// know is there (a full engine may evict it), or the engine has more slots than known.
// asOf is on the clock of the times the router's changes are recorded at (ReserveAdapter's
// now, AddAdapter's now).
func (w *Worker) LearnAdapters(names []string, slots int, asOf time.Time) (roomy bool) {
	at := asOf.UnixNano()
	for {
		old := w.adapters().Load()
		names := slices.DeleteFunc(slices.Clone(names), func(n string) bool {
			return old != nil && (slices.ContainsFunc(old.loading, func(r reservation) bool { return r.victim == n }) ||
				slices.ContainsFunc(old.gone, func(g evicted) bool { return g.name == n && g.at >= at }))
		})
		if old != nil {
			for i, n := range old.names {
				if u := old.uses[i]; u.added >= at && u.inflight.Load() != evictedUse && !slices.Contains(names, n) {
					names = append(names, n) // loaded since the question
				}
			}
		}
		s := NewAdapterSet(names, slots)
		if old != nil {
			for i, n := range s.names {
				if u := old.use(n); u != nil && u.inflight.Load() != evictedUse {
					s.uses[i] = u
				}
			}
			for _, r := range old.loading {
				if !s.Has(r.name) {
					s.loading = append(s.loading, r)
				}
			}
			for _, g := range old.gone {
				if g.at >= at {
					s.gone = append(s.gone, g) // older evictions are in the engine's answer
				}
			}
		}
		if w.adapters().CompareAndSwap(old, s) {
			return old != nil && (!slices.Equal(old.names, s.names) || moreSlots(old.Slots, s.Slots))
		}
	}
}

// SetAdapterSlots sets the engine's adapter slots (0: no known bound), keeping everything
// else known, and reports whether the engine has more slots than known before. It does
// nothing while no adapters were learned (a nil set has room).
func (w *Worker) SetAdapterSlots(slots int) (more bool) {
	slots = max(slots, 0)
	for {
		old := w.adapters().Load()
		if old == nil || old.Slots == slots {
			return false
		}
		s := *old // the slices are never modified
		s.Slots = slots
		if w.adapters().CompareAndSwap(old, &s) {
			return moreSlots(old.Slots, slots)
		}
	}
}

// moreSlots reports whether slots after leave more room than slots before (0 is unbounded).
func moreSlots(before, after int) bool {
	return before != 0 && (after == 0 || after > before)
}

// ReserveAdapter takes a slot for a load of adapter name until until, and reports whether
// the engine holds it, is loading it, had a free slot at now, or — with every slot full and
// evictable non-nil — held an adapter evictable accepts that no request used: the least
// recently used one is then evicted (dropped from the set, no hold can be taken on it any
// more), recorded as evicted at now, and named by the reservation (Evicting), for dispatch
// to unload before the load.
// r is the caller's share in the reservation, new or of the load under way (the zero value
// when the engine holds the adapter): a pick that does not begin the load gives it back
// (Pick.AbandonAdapter), so that the slot frees at once when no other pick relies on it.
func (w *Worker) ReserveAdapter(name string, now, until time.Time, evictable map[string]struct{}) (r AdapterReservation, ok bool) {
	victim := "" // evicted by this call, to drop from the set
	for {
		old := w.adapters().Load()
		if victim == "" && old.lapsed(now) {
			// Slow path: a reservation lapsed; its victim, if its load never began, is the
			// engine's again before this pick looks.
			w.expireLoads(now)
			continue
		}
		if victim == "" && old.Has(name) {
			return AdapterReservation{}, true
		}
		if victim == "" {
			if i := old.live(name, now); i >= 0 {
				// A load of it holds a slot already: share its reservation.
				s := *old
				s.loading = slices.Clone(old.loading)
				s.loading[i].picks++
				if w.adapters().CompareAndSwap(old, &s) {
					return AdapterReservation{s.loading[i].key}, true
				}
				continue
			}
		}
		if victim == "" && !old.Free(now) {
			i := old.victim(evictable)
			if i < 0 {
				return AdapterReservation{}, false
			}
			if !old.uses[i].inflight.CompareAndSwap(0, evictedUse) {
				continue // a request took it meanwhile: look again
			}
			victim = old.names[i]
		}
		s := &AdapterSet{}
		if old != nil {
			s.names, s.uses, s.Slots, s.gone = old.names, old.uses, old.Slots, old.gone // never modified
			if i, ok := slices.BinarySearch(s.names, victim); victim != "" && ok {
				if u := s.uses[i]; !u.inflight.CompareAndSwap(0, evictedUse) && u.inflight.Load() != evictedUse {
					// Slow path: the engine's list was learned again meanwhile and a request
					// holds the adapter anew; no room is made.
					return AdapterReservation{}, false
				}
				s.names = slices.Delete(slices.Clone(s.names), i, i+1)
				s.uses = slices.Delete(slices.Clone(s.uses), i, i+1)
				s.gone = append(slices.Clone(s.gone[max(len(s.gone)-maxGone+1, 0):]), evicted{victim, now.UnixNano()})
			}
			for _, r := range old.loading {
				if now.Before(r.until) { // lapsed reservations go
					s.loading = append(s.loading, r)
				}
			}
		}
		key := &reservationKey{name}
		s.loading = append(s.loading, reservation{name: name, victim: victim, until: until, key: key, picks: 1})
		if w.adapters().CompareAndSwap(old, s) {
			return AdapterReservation{key}, true
		}
	}
}

// live returns the index of the reservation of a load of adapter name that holds a slot at
// now, or -1.
func (s *AdapterSet) live(name string, now time.Time) int {
	if s == nil {
		return -1
	}
	return slices.IndexFunc(s.loading, func(r reservation) bool { return r.name == name && now.Before(r.until) })
}

// abandonAdapter gives back share r of a pick that never began its load, and reports whether
// the reservation went with it (no other pick relied on it): its slot is free again, and the
// adapter it evicted, which was never unloaded, is the engine's again. A share of a
// reservation gone already (its load ended, or it lapsed) gives back nothing.
func (w *Worker) abandonAdapter(r AdapterReservation) (freed bool) {
	for {
		old := w.adapters().Load()
		if old == nil {
			return false
		}
		i := slices.IndexFunc(old.loading, func(x reservation) bool { return x.key == r.key })
		if i < 0 {
			return false
		}
		s := *old
		if res := old.loading[i]; res.picks > 1 {
			s.loading = slices.Clone(old.loading)
			s.loading[i].picks--
		} else {
			s.loading = slices.Delete(slices.Clone(old.loading), i, i+1)
			if !res.began {
				s.restore(res.victim)
			}
		}
		if w.adapters().CompareAndSwap(old, &s) {
			return len(s.loading) < len(old.loading)
		}
	}
}

// restore gives back to s, a set of the caller's own (its slices may be replaced, never
// modified), adapter v that a reservation evicted and that was never unloaded: it is held
// again, and its latest eviction record (the reservation's) is removed. Nothing for "" or
// an adapter s holds.
func (s *AdapterSet) restore(v string) {
	if v == "" || s.use(v) != nil {
		return
	}
	// Slow path: the victim was dropped from the set but never unloaded.
	j, _ := slices.BinarySearch(s.names, v)
	s.names = slices.Insert(slices.Clone(s.names), j, v)
	s.uses = slices.Insert(slices.Clone(s.uses), j, &adapterUse{})
	for k := len(s.gone) - 1; k >= 0; k-- {
		if s.gone[k].name == v { // its latest eviction, the reservation's
			s.gone = slices.Delete(slices.Clone(s.gone), k, k+1)
			break
		}
	}
}

// lapsed reports whether a reservation of s has lapsed at now and is still in it.
func (s *AdapterSet) lapsed(now time.Time) bool {
	return s != nil && slices.ContainsFunc(s.loading, func(r reservation) bool { return !now.Before(r.until) })
}

// expireLoads drops the reservations that have lapsed at now (their load never started or
// never finished): the adapter each evicted, when its load never began (so the engine was
// never asked to unload it), is the engine's again. The slots were free already (a lapsed
// reservation holds none). It does nothing, and allocates nothing, when none lapsed.
func (w *Worker) expireLoads(now time.Time) {
	for {
		old := w.adapters().Load()
		if !old.lapsed(now) {
			return
		}
		s := *old
		s.loading = nil
		for _, r := range old.loading {
			if now.Before(r.until) {
				s.loading = append(s.loading, r)
			} else if !r.began {
				s.restore(r.victim)
			}
		}
		if w.adapters().CompareAndSwap(old, &s) {
			return
		}
	}
}

// AbandonAdapter gives back the pick's share in the reservation of its adapter load
// (Worker.ReserveAdapter) when the pick is not dispatched: refused, failed on the other side
// of its PD pair, or its request gone. The slot frees at once when no other pick relies on
// the reservation and no load of it began; the worker's AdapterRoom is then told. It does
// nothing for a pick that reserved nothing, or after BeginAdapterLoad.
func (p *Pick) AbandonAdapter() {
	r := p.Reservation
	if r.key == nil {
		return
	}
	p.Reservation = AdapterReservation{}
	if p.Worker.abandonAdapter(r) && p.Worker.AdapterRoom != nil {
		p.Worker.AdapterRoom(p.Worker.Model)
	}
}

// BeginAdapterLoad records at now that dispatch begins the pick's adapter load (or joins the
// one under way) and reports whether the pick's reservation still holds its slot. When it
// does, the reservation is the load's now, ends with it (AddAdapter, or ReleaseAdapter when
// it fails), and no longer gives its victim back when it lapses; AbandonAdapter gives back
// nothing any more. When it does not (the load the pick shared ended, failed, while the
// pick waited to dispatch; or the reservation lapsed), the pick must not load: a load
// without a reservation would take a slot another pick may have reserved. The pick keeps
// its share then, for the caller to give back (AbandonAdapter). A pick that reserved
// nothing reports true.
func (p *Pick) BeginAdapterLoad(now time.Time) bool {
	r := p.Reservation
	if r.key == nil {
		return true
	}
	w := p.Worker
	for {
		old := w.adapters().Load()
		if old == nil {
			return false
		}
		i := slices.IndexFunc(old.loading, func(x reservation) bool { return x.key == r.key })
		if i < 0 || !now.Before(old.loading[i].until) {
			return false
		}
		if !old.loading[i].began {
			s := *old
			s.loading = slices.Clone(old.loading)
			s.loading[i].began = true
			if !w.adapters().CompareAndSwap(old, &s) {
				continue
			}
		}
		p.Reservation = AdapterReservation{}
		return true
	}
}

// AbandonAdapters is AbandonAdapter for each pick of the selection.
func (p *BucketPick) AbandonAdapters() {
	p.Plain.AbandonAdapter()
	p.Prefill.AbandonAdapter()
	p.Decode.AbandonAdapter()
}

// AdapterHold is one request's use of an adapter on an engine, from HoldAdapter until
// Release; an adapter in use is never evicted.
type AdapterHold struct{ u *adapterUse }

// HoldAdapter takes a hold of adapter name on the engine at now for a request dispatched to
// it; it fails when the engine does not hold the adapter (any more: it may have just been
// evicted). The caller must Release the hold when the request ends, on every path.
func (w *Worker) HoldAdapter(name string, now time.Time) (AdapterHold, bool) {
	u := w.adapters().Load().use(name)
	if u == nil {
		return AdapterHold{}, false
	}
	for {
		n := u.inflight.Load()
		if n == evictedUse {
			return AdapterHold{}, false
		}
		if u.inflight.CompareAndSwap(n, n+1) {
			u.last.Store(now.UnixNano())
			return AdapterHold{u}, true
		}
	}
}

// Release ends the hold at now and reports whether it was the adapter's last on the engine
// (no request uses it any more: it may be evicted). Release of the zero hold does nothing.
func (h AdapterHold) Release(now time.Time) (idle bool) {
	if h.u == nil {
		return false
	}
	h.u.last.Store(now.UnixNano())
	return h.u.inflight.Add(-1) == 0
}

// AddAdapter records that the engine holds adapter name from now on (the router loaded it;
// now is on the clock LearnAdapters' asOf is read on).
func (w *Worker) AddAdapter(name string, now time.Time) {
	for {
		old := w.adapters().Load()
		if old.Has(name) || w.adapters().CompareAndSwap(old, old.With(name, now)) {
			return
		}
	}
}

// ReleaseAdapter drops the reservation of a load of adapter name that failed.
func (w *Worker) ReleaseAdapter(name string) {
	for {
		old := w.adapters().Load()
		if old == nil || !slices.ContainsFunc(old.loading, func(r reservation) bool { return r.name == name }) {
			return
		}
		s := *old
		s.loading = old.withoutLoading(name)
		if w.adapters().CompareAndSwap(old, &s) {
			return
		}
	}
}
