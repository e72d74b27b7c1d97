package series

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// histShards is the number of independently updated copies of a Histogram's counts. A
// power of two.
const histShards = 8

// Histogram is a classic Prometheus histogram (`le` buckets, _sum, _count) whose Update
// takes no lock: it adds to one of histShards copies of the counts, picked at random, with
// atomics; a scrape adds the copies up. Exposed exactly as metrics.PrometheusHistogram
// exposes itself. Make it with HistogramFamily.New.
type Histogram struct {
	name   string
	bounds []float64 // upper bounds, +Inf left out
	shards [histShards]histShard
}

// histShard is one copy of the counts: one per bound and one for +Inf, and the sum's bits.
type histShard struct {
	counts []atomic.Uint64
	sum    atomic.Uint64
	_      [32]byte // keep neighbouring shards' words off one cache line
}

// Update records v; NaN and negative values are ignored, as metrics.PrometheusHistogram
// ignores them.
func (h *Histogram) Update(v float64) {
	if math.IsNaN(v) || v < 0 {
		return
	}
	i := len(h.bounds)
	for j, ub := range h.bounds {
		if v <= ub {
			i = j
			break
		}
	}
	sh := &h.shards[rand.Uint32()&(histShards-1)]
	sh.counts[i].Add(1)
	for range 64 { // contended only by updates of the same shard
		old := sh.sum.Load()
		if sh.sum.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

// UpdateDuration records the seconds since start.
func (h *Histogram) UpdateDuration(start time.Time) { h.Update(time.Since(start).Seconds()) }

// snapshot adds the shards up: per-bucket counts (the last one +Inf), the sum.
func (h *Histogram) snapshot() (counts []uint64, sum float64) {
	counts = make([]uint64, len(h.bounds)+1)
	for s := range h.shards {
		sh := &h.shards[s]
		for i := range sh.counts {
			counts[i] += sh.counts[i].Load()
		}
		sum += math.Float64frombits(sh.sum.Load())
	}
	return counts, sum
}

// writeTo writes h's series as metrics.PrometheusHistogram does.
func (h *Histogram) writeTo(w io.Writer) {
	counts, sum := h.snapshot()
	family, labels := h.name, ""
	if i := strings.IndexByte(h.name, '{'); i >= 0 {
		family, labels = h.name[:i], h.name[i+1:len(h.name)-1]+","
	}
	var cum uint64
	for i, ub := range h.bounds {
		cum += counts[i]
		fmt.Fprintf(w, "%s_bucket{%sle=\"%v\"} %d\n", family, labels, ub, cum)
	}
	cum += counts[len(h.bounds)]
	fmt.Fprintf(w, "%s_bucket{%sle=\"+Inf\"} %d\n", family, labels, cum)
	braced := ""
	if labels != "" {
		braced = "{" + labels[:len(labels)-1] + "}"
	}
	if float64(int64(sum)) == sum {
		fmt.Fprintf(w, "%s_sum%s %d\n", family, braced, int64(sum))
	} else {
		fmt.Fprintf(w, "%s_sum%s %g\n", family, braced, sum)
	}
	fmt.Fprintf(w, "%s_count%s %d\n", family, braced, cum)
}

// HistogramFamily is the Histograms of one metric family on a set, written together (one
// HELP and TYPE when the set exposes metadata) at each scrape, in order of name. Unlike the
// set's GetOrCreate metrics, a family is not shared by name: make it once per set, in the
// component that owns the family's series (a second family of one name on a set would
// write its series twice).
type HistogramFamily struct {
	family string
	mu     sync.Mutex // registration and scrapes, never Update
	hs     []*Histogram
}

// NewHistogramFamily registers family's writer on set.
func NewHistogramFamily(set *metrics.Set, family string) *HistogramFamily {
	f := &HistogramFamily{family: family}
	set.RegisterMetricsWriter(f.write)
	return f
}

// New returns the family's histogram name (family{labels}) with the given upper bounds
// (strictly increasing; a last +Inf is left out). A bad name or bounds are a bug.
func (f *HistogramFamily) New(name string, bounds []float64) *Histogram {
	if name != f.family && !strings.HasPrefix(name, f.family+"{") {
		panic("BUG: series: histogram " + name + " outside its family " + f.family)
	}
	if err := metrics.ValidateBuckets(bounds); err != nil {
		panic("BUG: series: histogram " + name + ": " + err.Error())
	}
	if math.IsInf(bounds[len(bounds)-1], +1) {
		bounds = bounds[:len(bounds)-1]
	}
	h := &Histogram{name: name, bounds: slices.Clone(bounds)}
	for s := range h.shards {
		h.shards[s].counts = make([]atomic.Uint64, len(bounds)+1)
	}
	f.mu.Lock()
	f.hs = append(f.hs, h)
	slices.SortFunc(f.hs, func(a, b *Histogram) int { return strings.Compare(a.name, b.name) })
	f.mu.Unlock()
	return h
}

// Remove takes h out of the family: it is no longer written (its owner closed). Updates to
// it are kept by h alone.
func (f *HistogramFamily) Remove(h *Histogram) {
	f.mu.Lock()
	f.hs = slices.DeleteFunc(f.hs, func(x *Histogram) bool { return x == h })
	f.mu.Unlock()
}

func (f *HistogramFamily) write(w io.Writer) {
	f.mu.Lock()
	hs := slices.Clone(f.hs)
	f.mu.Unlock()
	if len(hs) == 0 {
		return
	}
	metrics.WriteMetadataIfNeeded(w, f.family, "histogram")
	for _, h := range hs {
		h.writeTo(w)
	}
}
