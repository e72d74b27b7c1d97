package load

import (
	"math"
	"sync/atomic"
)

// lineGain is the smoothing of a Line: each observation has this weight in the line's
// moments, the older ones together the rest (after the first few, which weigh 1/n each, so
// that the line is the exact least-squares fit of its first observations).
const lineGain = 0.1

// lineClip bounds one observation: a value above lineClip times the line's prediction counts
// as lineClip times it, so one stalled request moves the line by at most
// lineGain·(lineClip−1) of its prediction (at the typical x).
const lineClip = 4

// linePrior is the weight of a Line's prior split, all slope (y proportional to x), against
// the spread of x: the slope is cov(x,y)/var(x) where x varies by much more than
// √linePrior (3%) of its mean, and y/x of the means where it hardly varies (so a line
// fitted where x is constant still predicts that x exactly, and a single observation is
// all slope).
const linePrior = 0.001

// lineWeights bounds an observation's weight in a Line against the typical one, both ways:
// an observation weighs (typical y / the line's prediction at its x)², so the fit is one of
// relative errors (the error of a first token that costs 20 ms counts as much as that of
// one that costs 2 s), and a run of tiny or huge x neither freezes the line nor takes it
// over.
const lineWeights = 16

// Line is a learned cost line, y = Base + Slope·x with y in seconds, fitted online to the
// observations (x, y) of one engine by weighted least squares over exponentially
// forgotten observations: the line holds the smoothed x and y (their means) and the
// smoothed variance of x and covariance of x and y, and reads its slope off them
// (cov/var, drawn towards all slope by linePrior where x hardly varies) and its base as the
// mean y less the slope times the mean x. Two observations at distinct x separate base and
// slope exactly, so a first request of a few tokens (its first token nearly all fixed
// cost) is corrected by the next long one, not over dozens; the first observation alone is
// all slope (all base at x = 0). The line always passes through its mean point, so it
// predicts the typical x exactly whatever its split. Base and Slope never go below 0: a
// slope above mean y / mean x counts as that (base 0), a negative one as 0 (all base).
//
// A Line is safe for concurrent use without locks: its state is atomics. Two
// observations made at the same time may overwrite each other's update, and a reader may
// see one field of a concurrent update before the others; each field stays finite and in
// range (means and variance non-negative), and the slope and base are clamped as they
// are read, so nothing but that sample is lost. The zero Line has no observations and
// predicts nothing.
type Line struct {
	mx  atomic.Uint64 // float64 bits: the weighted smoothed x
	my  atomic.Uint64 // float64 bits: the weighted smoothed y (seconds)
	vxx atomic.Uint64 // float64 bits: the weighted smoothed variance of x
	cxy atomic.Uint64 // float64 bits: the weighted smoothed covariance of x and y
	// scale and mean smooth x and y by lineGain, unweighted, for meanCost.
	scale atomic.Uint64 // float64 bits: the smoothed x (at least 1 each)
	mean  atomic.Uint64 // float64 bits: the smoothed y (seconds)
	n     atomic.Uint64
}

// Observe fits the line to one observation: x units of work took y seconds. Negative,
// NaN or infinite values are ignored, and so is an x or y so large that the moments
// would overflow.
func (l *Line) Observe(x, y float64) {
	if !(x >= 0) || !(y >= 0) || math.IsInf(x, 0) || math.IsInf(y, 0) {
		return
	}
	n := l.n.Load() + 1
	gain := max(1/float64(n), lineGain)
	mx, my, vxx, cxy := l.moments()
	h := gain
	if n > 1 {
		pred := lineAt(mx, my, vxx, cxy, x)
		if n > 4 && pred > 0 {
			y = min(y, lineClip*pred)
		}
		// The observation's weight against the typical one, (my/pred)², bounded; h is
		// its share of the total (the older ones weigh 1−gain together).
		w := float64(lineWeights)
		if pred > 0 {
			w = min(max(my*my/(pred*pred), 1.0/lineWeights), lineWeights)
		} else if !(my > 0) {
			w = 1
		}
		h = gain * w / (1 - gain + gain*w)
	}
	dx, dy := x-mx, y-my
	mx += h * dx
	my += h * dy
	vxx = (1 - h) * (vxx + h*dx*dx)
	cxy = (1 - h) * (cxy + h*dx*dy)
	scale := math.Float64frombits(l.scale.Load())
	mean := math.Float64frombits(l.mean.Load())
	scale += gain * (max(x, 1) - scale)
	mean += gain * (y - mean)
	if !finite(mx) || !finite(my) || !finite(vxx) || !finite(cxy) || !finite(scale) || !finite(mean) {
		return
	}
	l.mx.Store(math.Float64bits(mx))
	l.my.Store(math.Float64bits(my))
	l.vxx.Store(math.Float64bits(vxx))
	l.cxy.Store(math.Float64bits(cxy))
	l.scale.Store(math.Float64bits(scale))
	l.mean.Store(math.Float64bits(mean))
	l.n.Add(1) // after the moments: a reader that sees n > 0 sees them
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func (l *Line) moments() (mx, my, vxx, cxy float64) {
	return math.Float64frombits(l.mx.Load()), math.Float64frombits(l.my.Load()),
		math.Float64frombits(l.vxx.Load()), math.Float64frombits(l.cxy.Load())
}

// lineParams is the base and slope of the line with moments mx, my, vxx and cxy.
func lineParams(mx, my, vxx, cxy float64) (base, slope float64) {
	if !(mx > 0) || !(my > 0) {
		return max(my, 0), 0
	}
	all := my / mx // the prior: all slope
	k := linePrior * mx * mx
	slope = (cxy + k*all) / (max(vxx, 0) + k)
	if !(slope > 0) { // negative or NaN (a torn read)
		return my, 0
	}
	if slope >= all {
		return 0, all
	}
	return my - slope*mx, slope
}

// lineAt is the prediction at x of the line with moments mx, my, vxx and cxy.
func lineAt(mx, my, vxx, cxy, x float64) float64 {
	base, slope := lineParams(mx, my, vxx, cxy)
	return base + slope*max(x, 0)
}

// meanCost is the smoothed y over the smoothed x (the same smoothing of both), 0 before
// the first observation or while the smoothed x is 0.
func (l *Line) meanCost() float64 {
	if l.n.Load() == 0 {
		return 0
	}
	scale := math.Float64frombits(l.scale.Load())
	if !(scale > 0) {
		return 0
	}
	return math.Float64frombits(l.mean.Load()) / scale
}

// Params returns the line's base (seconds), slope (seconds per unit of x) and the number
// of observations it was fitted to; all zero before the first.
func (l *Line) Params() (base, slope float64, n uint64) {
	n = l.n.Load()
	if n == 0 {
		return 0, 0, 0
	}
	base, slope = lineParams(l.moments())
	return base, slope, n
}

// At predicts y for x; ok is false before the first observation.
func (l *Line) At(x float64) (y float64, ok bool) {
	if l.n.Load() == 0 {
		return 0, false
	}
	mx, my, vxx, cxy := l.moments()
	return lineAt(mx, my, vxx, cxy, x), true
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
// smoothed alike, by Prefill's gain, unweighted). Unlike the slope alone it does not depend
// on how the line splits its prediction between base and slope (a line fitted where the
// work hardly varies falls back to all slope, and one where it varies may put little in
// the slope), so engines compare by what their first tokens actually cost, fixed part
// included; after a first request of a few tokens, all fixed cost, the means are those of
// long prompts from the first long one on (TestPrefillSecondsPerTokenAfterTinyFirst). 0
// when nothing was learned.
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
