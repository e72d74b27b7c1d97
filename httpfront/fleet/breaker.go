package fleet

import (
	"sync/atomic"
	"time"

	"switchyard/config"
)

// BreakerState is a circuit breaker's state; its numeric value is exported as the
// switchyard_worker_breaker_state gauge.
type BreakerState int

// Breaker states.
const (
	BreakerClosed   BreakerState = 0
	BreakerOpen     BreakerState = 1
	BreakerHalfOpen BreakerState = 2
)

func (s BreakerState) String() string {
	switch s {
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half_open"
	}
	return "closed"
}

// Outcome is what one dispatch says about its engine.
type Outcome uint8

const (
	// OutcomeSuccess: the engine answered 1xx-3xx, or completed its stream.
	OutcomeSuccess Outcome = iota
	// OutcomeNeutral says nothing about the engine: a 4xx answer (the request's fault), a
	// client that left, the request's own deadline, a failure of the router's own (no free
	// connection, no file descriptor).
	OutcomeNeutral
	// OutcomeError is a 5xx answer other than 502, 503 and 504, such as a 500 to a parameter
	// the engine cannot serve: it may be specific to the request, so it counts only in the
	// error rate of the breaker's window.
	OutcomeError
	// OutcomeFailure is a failure the engine is answerable for whatever the request: no
	// connection, a timeout, 502, 503 or 504, a stream the engine broke or left silent. It
	// counts as consecutive and in the error rate.
	OutcomeFailure
)

func (o Outcome) String() string {
	switch o {
	case OutcomeNeutral:
		return "neutral"
	case OutcomeError:
		return "error"
	case OutcomeFailure:
		return "failure"
	}
	return "success"
}

// OutcomeOfStatus classifies an engine's answer status.
func OutcomeOfStatus(status int) Outcome {
	switch {
	case status < 400:
		return OutcomeSuccess
	case status < 500:
		return OutcomeNeutral
	case status == 502, status == 503, status == 504:
		return OutcomeFailure
	}
	return OutcomeError
}

// BreakerSettings are a breaker's thresholds (health.breaker_*).
type BreakerSettings struct {
	// Enabled turns the breaker on; a disabled breaker is always closed.
	Enabled bool
	// Failures consecutive OutcomeFailure open it.
	Failures int
	// ErrorRate is the share of OutcomeError and OutcomeFailure over Window that opens it,
	// once MinRequests dispatches were counted in Window.
	ErrorRate   float64
	MinRequests int
	Window      time.Duration
	// Cooldown is the open time before it turns half-open.
	Cooldown time.Duration
	// Successes consecutive successful probes close a half-open breaker.
	Successes int
}

// BreakerSettingsFrom reads the breaker keys of the health section.
func BreakerSettingsFrom(h config.Health) BreakerSettings {
	return BreakerSettings{
		Enabled: h.BreakerEnabled, Failures: h.BreakerFailures, ErrorRate: h.BreakerErrorRate,
		MinRequests: h.BreakerMinRequests, Window: h.BreakerWindow, Cooldown: h.BreakerCooldown,
		Successes: h.BreakerSuccesses,
	}
}

// The breaker's state word: the state, the half-open probe in flight, the consecutive
// failures (closed) and the consecutive probe successes (half-open).
const (
	wState    = 0x3
	wProbing  = 1 << 2
	failShift = 8
	failMask  = 0xffff << failShift
	succShift = 24
	succMask  = 0xff << succShift
)

// The error-rate window is a ring of ringSlots slots of 2^slotShift nanoseconds each, the
// least power of two with at most 15 slots covering the window (a shift, not a division,
// finds a dispatch's slot); the window spans b.span slots. A slot holds its epoch (its index
// in time) with the errors recorded in it, packed in one word, the worker's dispatch count
// when the slot began, and its neutral outcomes, tagged with their own epoch. The window's
// volume is the dispatches since its oldest slot began, read from the count the router
// keeps anyway, so that a success writes nothing, less the neutral outcomes of the window
// (4xx answers, clients that left, the router's own failures), which say nothing of the
// engine: a flood of client errors does not dilute the engine's error rate.
const ringSlots = 16

// Breaker is one worker's circuit breaker over dispatch outcomes (POLICY_DESIGN section 8
// keeps breakers outside the policies). Closed, it opens on Failures consecutive
// OutcomeFailure, or when the share of OutcomeError and OutcomeFailure over the window
// reaches ErrorRate with at least MinRequests dispatches counted; OutcomeNeutral counts
// neither as an error nor in the volume the rate is taken over. Open, it refuses every dispatch until Cooldown has passed; the owner then calls
// Expire, which makes it half-open. Half-open, it admits exactly one probe at a time: a
// successful probe (Successes in a row) closes it, a failed one (OutcomeError included)
// opens it again, a neutral one frees the probe slot for the next dispatch.
//
// The breaker is on the path of every request: its state is one atomic word and the window
// a ring of atomic slots, changed with compare-and-swap; no lock. The window buckets each
// outcome by its dispatch's start time, which the request already read, so that counting
// reads no clock; the clock is read only to time an opening.
type Breaker struct {
	set      BreakerSettings
	now      func() time.Time
	volume   func() uint64 // the worker's dispatches so far
	shift    uint          // log2 of a slot's nanoseconds
	span     uint64        // slots the window spans, at most ringSlots-1
	openedAt atomic.Int64  // unix nanoseconds of the latest opening
	// word is read by every Admit; the window's slots, written by every Record, live on
	// other cache lines, so that counting does not evict it from the readers' caches.
	_     [cacheLine]byte
	word  atomic.Uint64
	_     [cacheLine - 8]byte
	slots [ringSlots]paddedSlot
}

// cacheLine is the size the breaker's hot fields are kept apart by.
const cacheLine = 64

// paddedSlot is one window slot on a cache line of its own: epoch<<32 | errors, the
// dispatch count when the epoch began, and epoch<<32 | neutral outcomes.
type paddedSlot struct {
	word    atomic.Uint64
	base    atomic.Uint64
	neutral atomic.Uint64
	_       [cacheLine - 24]byte
}

// NewBreaker returns a closed breaker timing its openings with now and reading the worker's
// dispatch count (load.Counters.Dispatched) with volume; settings below their minimum are
// raised to it.
func NewBreaker(s BreakerSettings, now func() time.Time, volume func() uint64) *Breaker {
	s.Failures = max(s.Failures, 1)
	s.Successes = max(s.Successes, 1)
	s.MinRequests = max(s.MinRequests, 1)
	if s.ErrorRate <= 0 || s.ErrorRate > 1 {
		s.ErrorRate = 1
	}
	if s.Window <= 0 {
		s.Window = time.Minute
	}
	b := &Breaker{set: s, now: now, volume: volume}
	for b.shift = 10; int64(1)<<b.shift*(ringSlots-1) < int64(s.Window); b.shift++ {
	}
	b.span = uint64((int64(s.Window) + int64(1)<<b.shift - 1) >> b.shift)
	return b
}

// Transition is a breaker state change a caller acts upon (republish the worker's
// eligibility, schedule the cool-down).
type Transition uint8

// Transitions.
const (
	NoChange Transition = iota
	// Opened: the breaker opened (from closed or half-open); schedule Expire after Cooldown.
	Opened
	// HalfOpened: the cool-down ended; the worker may take one probe.
	HalfOpened
	// Closed: a probe closed the breaker.
	Closed
	// ProbeTaken: the half-open probe slot was taken; the worker takes no other dispatch.
	ProbeTaken
	// ProbeFreed: the probe ended without a verdict (or with a success short of
	// Successes); the slot is free again.
	ProbeFreed
)

// State returns the current state.
func (b *Breaker) State() BreakerState { return BreakerState(b.word.Load() & wState) }

// Cooldown returns the open time before half-open.
func (b *Breaker) Cooldown() time.Duration { return b.set.Cooldown }

// Eligible reports whether the breaker lets picks choose its worker: closed, or half-open
// with the probe slot free.
func (b *Breaker) Eligible() bool {
	w := b.word.Load()
	switch BreakerState(w & wState) {
	case BreakerClosed:
		return true
	case BreakerHalfOpen:
		return w&wProbing == 0
	}
	return false
}

// Admit is called before a dispatch. Closed (the fast path: one atomic load) it admits.
// Half-open it admits the dispatch as the probe when the probe slot is free (probe true,
// Transition ProbeTaken). Otherwise it refuses: the caller picks another engine.
func (b *Breaker) Admit() (probe bool, t Transition, ok bool) {
	for {
		w := b.word.Load()
		switch BreakerState(w & wState) {
		case BreakerClosed:
			return false, NoChange, true
		case BreakerOpen:
			return false, NoChange, false
		}
		if w&wProbing != 0 {
			return false, NoChange, false
		}
		if b.word.CompareAndSwap(w, w|wProbing) {
			return true, ProbeTaken, true
		}
	}
}

// Record counts the outcome of a dispatch that started at start. probe says whether Admit
// admitted the dispatch as the half-open probe. Outcomes of dispatches admitted before the
// breaker opened are ignored while it is open or half-open.
func (b *Breaker) Record(o Outcome, probe bool, start time.Time) Transition {
	if !b.set.Enabled {
		return NoChange
	}
	if probe {
		return b.recordProbe(o)
	}
	w := b.word.Load()
	if BreakerState(w&wState) != BreakerClosed {
		return NoChange
	}
	if o == OutcomeNeutral {
		b.countNeutral(start)
		return NoChange
	}
	errs := b.count(o != OutcomeSuccess, start)
	for {
		w = b.word.Load()
		if BreakerState(w&wState) != BreakerClosed {
			return NoChange
		}
		fails := (w & failMask) >> failShift
		next := w
		switch o {
		case OutcomeSuccess:
			if fails == 0 {
				return NoChange // the common case: nothing to write
			}
			next = w &^ failMask
		case OutcomeFailure:
			if fails < 0xffff {
				fails++
			}
			next = w&^failMask | fails<<failShift
		}
		open := o == OutcomeFailure && int(fails) >= b.set.Failures || o != OutcomeSuccess && errs
		if open {
			next = uint64(BreakerOpen)
		}
		if next == w {
			return NoChange
		}
		if open {
			b.openedAt.Store(b.now().UnixNano())
		}
		if b.word.CompareAndSwap(w, next) {
			if open {
				b.clearWindow()
				return Opened
			}
			return NoChange
		}
	}
}

func (b *Breaker) recordProbe(o Outcome) Transition {
	for {
		w := b.word.Load()
		if BreakerState(w&wState) != BreakerHalfOpen || w&wProbing == 0 {
			return NoChange // the breaker was reset meanwhile
		}
		var next uint64
		var t Transition
		switch o {
		case OutcomeSuccess:
			succ := (w&succMask)>>succShift + 1
			if int(succ) >= b.set.Successes {
				next, t = uint64(BreakerClosed), Closed
			} else {
				next, t = uint64(BreakerHalfOpen)|succ<<succShift, ProbeFreed
			}
		case OutcomeNeutral:
			next, t = w&^wProbing, ProbeFreed
		default:
			next, t = uint64(BreakerOpen), Opened
			b.openedAt.Store(b.now().UnixNano())
		}
		if b.word.CompareAndSwap(w, next) {
			if t == Closed {
				b.clearWindow()
			}
			return t
		}
	}
}

// Expire turns an open breaker whose cool-down has passed at now half-open.
func (b *Breaker) Expire(now time.Time) Transition {
	for {
		w := b.word.Load()
		if BreakerState(w&wState) != BreakerOpen || now.UnixNano()-b.openedAt.Load() < int64(b.set.Cooldown) {
			return NoChange
		}
		if b.word.CompareAndSwap(w, uint64(BreakerHalfOpen)) {
			return HalfOpened
		}
	}
}

// OpenedAt returns when the breaker last opened.
func (b *Breaker) OpenedAt() time.Time { return time.Unix(0, b.openedAt.Load()) }

// count records one dispatch that started at start in the window (an error when failed) and
// reports whether the window's error rate now opens the breaker. A success only reads, but
// for the first one of a window slot, which starts the slot.
func (b *Breaker) count(failed bool, start time.Time) bool {
	epoch := uint64(start.UnixNano()>>b.shift) & 0xffffffff
	slot := &b.slots[epoch%ringSlots]
	for {
		v := slot.word.Load()
		if v>>32 == epoch {
			if !failed {
				return false
			}
			if slot.word.CompareAndSwap(v, v+1) {
				break
			}
			continue
		}
		if v>>32 > epoch && v>>32-epoch < ringSlots {
			return false // a dispatch so old that its slot already serves a newer epoch
		}
		// Slow path: the first outcome of a new slot starts it. The dispatch it records was
		// counted when it started: the slot's volume includes it.
		next := epoch << 32
		if failed {
			next++
		}
		if slot.word.CompareAndSwap(v, next) {
			slot.base.Store(max(b.volume(), 1) - 1)
			if !failed {
				return false
			}
			break
		}
	}
	var errs, base uint64
	oldest := epoch + 1
	for i := range b.slots {
		v := b.slots[i].word.Load()
		if e := v >> 32; e <= epoch && epoch-e < b.span {
			errs += v & 0xffffffff
			if e < oldest {
				oldest, base = e, b.slots[i].base.Load()
			}
		}
	}
	// The neutral outcomes of dispatches that started since the oldest slot began.
	var neutral uint64
	for i := range b.slots {
		v := b.slots[i].neutral.Load()
		if e := v >> 32; e >= oldest && e <= epoch {
			neutral += v & 0xffffffff
		}
	}
	vol := b.volume()
	vol -= min(base, vol)
	vol -= min(neutral, vol)
	total := max(vol, errs)
	return total >= uint64(b.set.MinRequests) && float64(errs) >= b.set.ErrorRate*float64(total)
}

// countNeutral records one neutral outcome of a dispatch that started at start: it leaves
// the window's volume.
func (b *Breaker) countNeutral(start time.Time) {
	epoch := uint64(start.UnixNano()>>b.shift) & 0xffffffff
	slot := &b.slots[epoch%ringSlots]
	for {
		v := slot.neutral.Load()
		next := epoch<<32 | 1
		switch e := v >> 32; {
		case e == epoch:
			if v&0xffffffff == 0xffffffff {
				return // saturated
			}
			next = v + 1
		case e > epoch && e-epoch < ringSlots:
			return // a dispatch so old that its slot already serves a newer epoch
		}
		if slot.neutral.CompareAndSwap(v, next) {
			return
		}
	}
}

func (b *Breaker) clearWindow() {
	for i := range b.slots {
		b.slots[i].word.Store(0)
		b.slots[i].neutral.Store(0)
	}
}
