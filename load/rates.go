package load

import (
	"math"
	"sync/atomic"
)

// lineGain is the smoothing of a Line: each observation moves the line by this fraction of
// its error (after the first few, which move it by 1/n so that the line starts where the
// engine is).
const lineGain = 0.1

// lineClip bounds one observation: a value above lineClip times the line's prediction counts
// as lineClip times it, so one stalled request moves the line by at most
// lineGain·(lineClip−1) of its prediction.
const lineClip = 4

// Line is a learned cost line, y = Base + Slope·x with y in seconds, fitted online to the
// observations (x, y) of one engine by normalized least mean squares on the features
// (1, x/scale), where scale is the smoothed x: the error of an observation is shared
// between base and slope by how much each contributed to the prediction, so the base
// (fixed costs) and the slope (cost per unit of x) separate when x varies, and the line
// still predicts the typical x exactly when it does not. Base and Slope never go below 0.
//
// A Line is safe for concurrent use without locks: its parameters are atomics. Two
// observations made at the same time may overwrite each other's update; each is one sample
// of a smoothed estimate, so nothing but that sample is lost. The zero Line has no
// observations and predicts nothing.
type Line struct {
	base  atomic.Uint64 // float64 bits: seconds
	slope atomic.Uint64 // float64 bits: seconds per unit of x
	scale atomic.Uint64 // float64 bits: the smoothed x
	mean  atomic.Uint64 // float64 bits: the smoothed y (seconds), as scale smooths x
	n     atomic.Uint64
}

// Observe fits the line to one observation: x units of work took y seconds. Negative,
// NaN or infinite values are ignored.
func (l *Line) Observe(x, y float64) {
	if !(x >= 0) || !(y >= 0) || math.IsInf(x, 0) || math.IsInf(y, 0) {
		return
	}
	n := l.n.Add(1)
	if n == 1 {
		// The first observation is all slope (or all base at x = 0).
		if x > 0 {
			l.store(0, y/x, x)
		} else {
			l.store(y, 0, 1)
		}
		l.mean.Store(math.Float64bits(y))
		return
	}
	base, slope, scale := l.load()
	pred := base + slope*x
	if n > 4 && pred > 0 {
		y = min(y, lineClip*pred)
	}
	gain := max(1/float64(n), lineGain)
	if scale <= 0 {
		scale = max(x, 1)
	}
	u := x / scale
	err := y - pred
	norm := 1 + u*u
	base += gain * err / norm
	slope += gain * err * u / norm / scale
	scale += gain * (max(x, 1) - scale)
	l.store(max(base, 0), max(slope, 0), scale)
	mean := math.Float64frombits(l.mean.Load())
	l.mean.Store(math.Float64bits(mean + gain*(y-mean)))
}

// meanCost is the smoothed y over the smoothed x (the same smoothing of both), 0 before
// the first observation or while the smoothed x is 0.
func (l *Line) meanCost() float64 {
	if l.n.Load() == 0 {
		return 0
	}
	_, _, scale := l.load()
	if !(scale > 0) {
		return 0
	}
	return math.Float64frombits(l.mean.Load()) / scale
}

func (l *Line) load() (base, slope, scale float64) {
	return math.Float64frombits(l.base.Load()), math.Float64frombits(l.slope.Load()),
		math.Float64frombits(l.scale.Load())
}

func (l *Line) store(base, slope, scale float64) {
	l.base.Store(math.Float64bits(base))
	l.slope.Store(math.Float64bits(slope))
	l.scale.Store(math.Float64bits(scale))
}

// Params returns the line's base (seconds), slope (seconds per unit of x) and the number
// of observations it was fitted to; all zero before the first.
func (l *Line) Params() (base, slope float64, n uint64) {
	n = l.n.Load()
	if n == 0 {
		return 0, 0, 0
	}
	base, slope, _ = l.load()
	return base, slope, n
}

// At predicts y for x; ok is false before the first observation.
func (l *Line) At(x float64) (y float64, ok bool) {
	base, slope, n := l.Params()
	if n == 0 {
		return 0, false
	}
	return base + slope*max(x, 0), true
}

// Rates are one engine's service rates as the router learns them from what it observes
// of the requests it sends there (see the package documentation, "SLO estimates"):
//
//   - Prefill: time to first token, in seconds, against the prefill work in tokens (the
//     work queued ahead of the request plus its own uncached input; PrefillWork). Its
//     slope is the engine's cost per prefill token, its base the fixed part of a first
//     token (batch overhead, the decode step in progress, transport).
//   - Decode: time per output token, in seconds, against the engine's decode load in
//     requests (DecodeLoad). Its base is one decode step, its slope what each running
//     request adds.
//
// The zero value has learned nothing.
type Rates struct {
	Prefill Line
	Decode  Line
}

// PrefillSecondsPerToken is the engine's mean cost per prefill token at the work it
// typically sees: its smoothed time to first token over its smoothed prefill work (both
// smoothed alike, by Prefill's gain). Unlike the slope alone it does not depend on how the
// line split its prediction between base and slope (a line fitted where the work hardly
// varies may put most of it in either), so engines compare by what their first tokens
// actually cost; unlike the line's own prediction at the smoothed work, it does not keep
// the error of a first observation the line could not split: a first request of a few
// tokens, all fixed cost, set the line's slope to many times the engine's cost per token,
// and the line shed it over dozens of requests (TestPrefillSecondsPerTokenAfterTinyFirst),
// while the means are those of long prompts from the first one on. 0 when nothing was
// learned.
func (r *Rates) PrefillSecondsPerToken() float64 {
	return r.Prefill.meanCost()
}

// PrefillTokensPerSecond is the learned prefill throughput (1/slope of Prefill), or 0 when
// nothing was learned or the slope is 0.
func (r *Rates) PrefillTokensPerSecond() float64 {
	_, slope, n := r.Prefill.Params()
	if n == 0 || slope <= 0 {
		return 0
	}
	return 1 / slope
}
