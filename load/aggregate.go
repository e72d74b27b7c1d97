package load

import (
	"math"
	"sync/atomic"
	"time"
)

// DefaultFreshness is how long a rank's report stays usable when NewAggregator is given no
// window.
const DefaultFreshness = 5 * time.Second

// AggregatorStats counts the reports an Aggregator refused or reset on.
type AggregatorStats struct {
	// Ingested is the number of reports accepted.
	Ingested uint64
	// UnknownWorker counts reports for a worker not registered with SetWorker.
	UnknownWorker uint64
	// RankOutOfRange counts reports whose DP rank lies outside 0..dpSize−1.
	RankOutOfRange uint64
	// NoCaptureTime counts reports without a capture time.
	NoCaptureTime uint64
	// CounterResets counts cumulative prefill counters that went backwards (engine restarts).
	CounterResets uint64
}

// Aggregator keeps the latest report of every DP rank of every registered worker, derives
// prefill throughput from consecutive samples, and builds immutable Snapshots.
//
// An Aggregator is owned by one telemetry actor and is NOT safe for concurrent use: every
// method must be called from the owner's goroutine. Readers use the Snapshots it builds
// (published through a Table), never the Aggregator.
type Aggregator struct {
	freshness time.Duration
	// index maps a worker ID to its slot in workers. It is shared with the Snapshots built
	// from it and therefore never modified: a membership change replaces it (copy-on-write).
	index   map[string]int
	workers []*workerAgg
	stats   AggregatorStats
}

// workerAgg is one worker's state inside the Aggregator.
type workerAgg struct {
	id       string
	counters *Counters
	ranks    []rankAgg // len == dpSize
	entry    snapEntry // cached aggregate; valid unless dirty
	dirty    bool
}

// rankAgg is one DP rank's latest report and its prefill-throughput state.
type rankAgg struct {
	rep        RankReport // latest report; Fields includes HasPrefillQueue when queueMs is valid
	has        bool
	dispatches uint64 // Counters.Dispatched() when rep was ingested
	// pendingReqs and pendingTokens are Counters.PendingPrefill() when rep was ingested.
	pendingReqs, pendingTokens int64
	queueMs                    float64
	// slots is the rank's running-request slots: its reported max_running_requests, else
	// the most running requests it reported while requests waited; 0 while unknown.
	slots int64

	// base is the previous counter sample throughput is measured against.
	baseOK       bool
	baseUncached int64
	baseBusyUs   int64
}

// snapEntry is one worker's precomputed aggregate inside a Snapshot.
type snapEntry struct {
	obs Observation
	// freshUntil is the wall-clock unix nanosecond up to which every rank is fresh; the
	// entry is usable while complete && now <= freshUntil.
	freshUntil int64
	complete   bool
	// ranks holds each DP rank's own observation when the worker has more than one rank
	// (Snapshot.ObserveRank); nil otherwise.
	ranks []rankEntry
}

// rankEntry is one DP rank's observation inside a snapEntry.
type rankEntry struct {
	obs        Observation
	freshUntil int64
	has        bool
}

// NewAggregator returns an Aggregator whose reports stay fresh for freshness (DefaultFreshness
// when freshness <= 0).
func NewAggregator(freshness time.Duration) *Aggregator {
	if freshness <= 0 {
		freshness = DefaultFreshness
	}
	return &Aggregator{freshness: freshness, index: map[string]int{}}
}

// Freshness is the window within which a rank's report counts as fresh.
func (a *Aggregator) Freshness() time.Duration { return a.freshness }

// Stats returns the counts of accepted and refused reports.
func (a *Aggregator) Stats() AggregatorStats { return a.stats }

// SetWorker registers worker id with dpSize DP ranks (at least 1; smaller values mean 1) and
// the router-local counters whose dispatch count is recorded at ingest (nil records 0).
// Re-registering keeps the reports of ranks that still exist.
func (a *Aggregator) SetWorker(id string, dpSize int, c *Counters) {
	dpSize = max(dpSize, 1)
	w := a.worker(id)
	if w == nil {
		w = &workerAgg{id: id}
		a.workers = append(a.workers, w)
		a.reindex()
	}
	w.counters = c
	switch {
	case len(w.ranks) > dpSize:
		w.ranks = w.ranks[:dpSize:dpSize]
	case len(w.ranks) < dpSize:
		w.ranks = append(w.ranks, make([]rankAgg, dpSize-len(w.ranks))...)
	}
	w.dirty = true
}

// RemoveWorker forgets worker id and its reports.
func (a *Aggregator) RemoveWorker(id string) {
	i, ok := a.index[id]
	if !ok {
		return
	}
	last := len(a.workers) - 1
	a.workers[i] = a.workers[last]
	a.workers[last] = nil
	a.workers = a.workers[:last]
	a.reindex()
}

// worker returns id's state, or nil.
func (a *Aggregator) worker(id string) *workerAgg {
	if i, ok := a.index[id]; ok {
		return a.workers[i]
	}
	return nil
}

// reindex replaces the index after a membership change; earlier Snapshots keep the old one.
func (a *Aggregator) reindex() {
	index := make(map[string]int, len(a.workers))
	for i, w := range a.workers {
		index[w.id] = i
	}
	a.index = index
}

// Ingest records r as the latest report of its DP rank of worker id. Reports for an
// unregistered worker, for a rank outside 0..dpSize−1 or without a capture time are dropped
// and counted in Stats.
//
// When r carries the cumulative prefill counters, the prefill throughput since the rank's
// previous sample is 1e6·Δtotal_prefill_uncached/Δtotal_prefill_busy_us tokens per second
// and the rank's estimated prefill queue is 1000·waiting_uncached/throughput milliseconds.
// A counter that went backwards makes the estimate unavailable until two new samples have
// arrived; Δbusy ≤ 0 or a zero throughput makes it unavailable for that sample.
func (a *Aggregator) Ingest(id string, r RankReport) {
	w := a.worker(id)
	switch {
	case w == nil:
		a.stats.UnknownWorker++
		return
	case r.DPRank < 0 || r.DPRank >= len(w.ranks):
		a.stats.RankOutOfRange++
		return
	case r.At.IsZero():
		a.stats.NoCaptureTime++
		return
	}
	a.stats.Ingested++
	rk := &w.ranks[r.DPRank]
	r.Fields &^= HasPrefillQueue // derived here, never trusted from the caller
	rk.queueMs = 0
	if r.HasCounters {
		if tput, ok := a.throughput(rk, &r); ok && r.Fields&HasWaitingUncached != 0 {
			rk.queueMs = 1000 * float64(r.WaitingUncachedTokens) / tput
			r.Fields |= HasPrefillQueue
		}
	}
	rk.rep = r
	rk.has = true
	switch {
	case r.MaxRunningRequests > 0:
		rk.slots = r.MaxRunningRequests
	case r.Has(HasRunning|HasWaiting) && r.Waiting > 0:
		// Requests waited: the engine ran as many as it could (or as its KV allowed).
		rk.slots = max(rk.slots, r.Running)
	}
	if w.counters != nil {
		rk.dispatches = w.counters.Dispatched()
		rk.pendingReqs, rk.pendingTokens = w.counters.PendingPrefill()
		w.counters.slots.Store(w.slots())
	} else {
		rk.dispatches, rk.pendingReqs, rk.pendingTokens = 0, 0, 0
	}
	w.dirty = true
}

// slots is the worker's running-request slots, the sum over its ranks; 0 while some rank's
// is unknown.
func (w *workerAgg) slots() int64 {
	var n int64
	for i := range w.ranks {
		if w.ranks[i].slots <= 0 {
			return 0
		}
		n += w.ranks[i].slots
	}
	return n
}

// throughput advances rk's counter baseline with r's sample and returns the prefill
// throughput in tokens per second between them.
func (a *Aggregator) throughput(rk *rankAgg, r *RankReport) (float64, bool) {
	u, b := r.TotalPrefillUncached, r.TotalPrefillBusyUs
	if !rk.baseOK {
		rk.baseOK, rk.baseUncached, rk.baseBusyUs = true, u, b
		return 0, false
	}
	if u < rk.baseUncached || b < rk.baseBusyUs {
		// Engine restart: this sample is the first of a new series.
		a.stats.CounterResets++
		rk.baseUncached, rk.baseBusyUs = u, b
		return 0, false
	}
	dBusy := b - rk.baseBusyUs
	if dBusy <= 0 {
		// No prefill time elapsed: keep the baseline so the next sample spans both.
		return 0, false
	}
	tput := 1e6 * float64(u-rk.baseUncached) / float64(dBusy)
	rk.baseUncached, rk.baseBusyUs = u, b
	if !(tput > 0) || math.IsInf(tput, 0) {
		return 0, false
	}
	return tput, true
}

// aggregate computes w's snapshot entry.
func (a *Aggregator) aggregate(w *workerAgg) snapEntry {
	ranks := a.rankEntries(w)
	e := a.sum(w)
	e.ranks = ranks
	return e
}

// rankEntries returns each rank's own observation for a worker of several ranks.
func (a *Aggregator) rankEntries(w *workerAgg) []rankEntry {
	if len(w.ranks) < 2 {
		return nil
	}
	out := make([]rankEntry, len(w.ranks))
	for i := range w.ranks {
		rk := &w.ranks[i]
		if !rk.has {
			continue
		}
		r := &rk.rep
		out[i] = rankEntry{has: true, freshUntil: addNanosSat(unixNanoSat(r.At), int64(a.freshness)), obs: Observation{
			Fields: r.Fields, Running: r.Running, Waiting: r.Waiting, UsedTokens: r.UsedTokens,
			MaxTotalTokens: r.MaxTotalTokens, WaitingUncachedTokens: r.WaitingUncachedTokens,
			PrefillQueueMs: rk.queueMs, CapturedAt: r.At, DispatchesAtCapture: rk.dispatches,
		}}
	}
	return out
}

// sum computes w's aggregate over its ranks.
func (a *Aggregator) sum(w *workerAgg) snapEntry {
	var e snapEntry
	o := &e.obs
	o.Fields = ^Field(0)
	var oldest time.Time
	dispatches := uint64(math.MaxUint64)
	pendingReqs, pendingTokens := int64(math.MaxInt64), int64(math.MaxInt64)
	for i := range w.ranks {
		rk := &w.ranks[i]
		if !rk.has {
			return snapEntry{}
		}
		r := &rk.rep
		o.Fields &= r.Fields
		o.Running += r.Running
		o.Waiting += r.Waiting
		o.UsedTokens += r.UsedTokens
		o.MaxTotalTokens += r.MaxTotalTokens
		o.WaitingUncachedTokens += r.WaitingUncachedTokens
		o.PrefillQueueMs = max(o.PrefillQueueMs, rk.queueMs)
		if i == 0 || r.At.Before(oldest) {
			oldest = r.At
		}
		dispatches = min(dispatches, rk.dispatches)
		pendingReqs = min(pendingReqs, rk.pendingReqs)
		pendingTokens = min(pendingTokens, rk.pendingTokens)
	}
	// A metric some rank lacks is unknown for the worker, never a partial sum.
	if o.Fields&HasRunning == 0 {
		o.Running = 0
	}
	if o.Fields&HasWaiting == 0 {
		o.Waiting = 0
	}
	if o.Fields&HasUsedTokens == 0 {
		o.UsedTokens = 0
	}
	if o.Fields&HasCapacity == 0 {
		o.MaxTotalTokens = 0
	}
	if o.Fields&HasWaitingUncached == 0 {
		o.WaitingUncachedTokens = 0
	}
	if o.Fields&HasPrefillQueue == 0 {
		o.PrefillQueueMs = 0
	}
	o.CapturedAt = oldest
	o.DispatchesAtCapture = dispatches
	o.PendingRequestsAtCapture, o.PendingTokensAtCapture = max(pendingReqs, 0), max(pendingTokens, 0)
	e.complete = true
	e.freshUntil = addNanosSat(unixNanoSat(oldest), int64(a.freshness))
	return e
}

// Snapshot builds a new immutable Snapshot of every registered worker at now. Per worker
// it holds the aggregate over its DP ranks: sums of the counts, the oldest capture time,
// the fields every rank reported, the largest prefill queue estimate (only when every rank
// has one) and the lowest dispatch count and pending prefill recorded at ingest. Aggregates of unchanged
// workers are reused, and so is the ID index while membership is unchanged; the entries are
// always a new copy, so earlier Snapshots stay valid.
func (a *Aggregator) Snapshot(now time.Time) *Snapshot {
	s := &Snapshot{at: now, index: a.index, entries: make([]snapEntry, len(a.workers))}
	for i, w := range a.workers {
		if w.dirty {
			w.entry = a.aggregate(w)
			w.dirty = false
		}
		s.entries[i] = w.entry
	}
	return s
}

// Snapshot is an immutable view of every worker's aggregated load, safe for concurrent use
// by any number of readers.
type Snapshot struct {
	at      time.Time
	index   map[string]int // shared between Snapshots; read-only
	entries []snapEntry
}

// emptySnapshot is returned by a Table before its first Store. It is never modified.
var emptySnapshot = &Snapshot{}

// At is when the snapshot was built (zero for the empty snapshot).
func (s *Snapshot) At() time.Time { return s.at }

// Len is the number of workers the snapshot covers, fresh or not.
func (s *Snapshot) Len() int { return len(s.entries) }

// Observe returns worker id's aggregated load at now, or the zero Observation (unknown)
// when the worker is not in the snapshot, some expected DP rank has not reported, or some
// rank's report is older than the freshness window. It does not allocate.
func (s *Snapshot) Observe(id string, now time.Time) Observation {
	i, ok := s.index[id]
	if !ok {
		return Observation{}
	}
	e := &s.entries[i]
	if !e.complete || unixNanoSat(now) > e.freshUntil {
		return Observation{}
	}
	return e.obs
}

// ObserveRank returns DP rank rank's own load of worker id at now, or the zero Observation
// (unknown) when the worker is not in the snapshot, has a single rank, or that rank has no
// fresh report. It does not allocate.
func (s *Snapshot) ObserveRank(id string, rank int, now time.Time) Observation {
	i, ok := s.index[id]
	if !ok {
		return Observation{}
	}
	e := &s.entries[i]
	if rank < 0 || rank >= len(e.ranks) {
		return Observation{}
	}
	r := &e.ranks[rank]
	if !r.has || unixNanoSat(now) > r.freshUntil {
		return Observation{}
	}
	return r.obs
}

// Table publishes the latest Snapshot to concurrent readers (copy-on-write: the owner
// builds a new Snapshot and stores it; readers load whichever is current).
type Table struct {
	p atomic.Pointer[Snapshot]
}

// NewTable returns a Table holding an empty Snapshot.
func NewTable() *Table {
	t := &Table{}
	t.p.Store(emptySnapshot)
	return t
}

// Load returns the current Snapshot; never nil.
func (t *Table) Load() *Snapshot {
	if s := t.p.Load(); s != nil {
		return s
	}
	return emptySnapshot
}

// Store publishes s; nil publishes an empty Snapshot.
func (t *Table) Store(s *Snapshot) {
	if s == nil {
		s = emptySnapshot
	}
	t.p.Store(s)
}

// unixNanoSat is t in unix nanoseconds, saturated to the int64 range (UnixNano itself is
// undefined outside 1678..2262).
func unixNanoSat(t time.Time) int64 {
	const maxSec = math.MaxInt64 / int64(time.Second)
	sec := t.Unix()
	switch {
	case sec >= maxSec:
		return math.MaxInt64
	case sec <= -maxSec:
		return math.MinInt64
	}
	return t.UnixNano()
}

func addNanosSat(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
