package series

import (
	"bytes"
	"math"
	"sync"
	"testing"

	"github.com/VictoriaMetrics/metrics"
)

// TestHistogramExposedAsPrometheusHistogram: the same observations give the same exposition
// as metrics.PrometheusHistogram, series with and without labels, in order of name.
func TestHistogramExposedAsPrometheusHistogram(t *testing.T) {
	bounds := []float64{0.001, 0.0025, 0.5, 1, 2.5, 600}
	names := []string{`fam{route="/b",model="m"}`, `fam{route="/a",model="m\"q"}`, `fam`}
	// Binary fractions: sums are exact whatever order the shards are added in.
	obs := []float64{0, 0.0009765625, 0.001953125, 0.25, 1, 2, 512, 600, 601, 1 << 30, -1, math.NaN(), 0.5, 0.125}

	ref := metrics.NewSet()
	ours := metrics.NewSet()
	fam := NewHistogramFamily(ours, "fam")
	for k, name := range names {
		rh := ref.NewPrometheusHistogramExt(name, bounds)
		oh := fam.New(name, append(bounds, math.Inf(1)))
		for _, v := range obs[:len(obs)-k] {
			rh.Update(v)
			oh.Update(v)
		}
	}
	var want, got bytes.Buffer
	ref.WritePrometheus(&want)
	ours.WritePrometheus(&got)
	if got.String() != want.String() {
		t.Fatalf("exposition differs:\n got:\n%s\nwant:\n%s", got.String(), want.String())
	}
}

// TestHistogramConcurrentUpdates: updates from many goroutines are all counted.
func TestHistogramConcurrentUpdates(t *testing.T) {
	set := metrics.NewSet()
	h := NewHistogramFamily(set, "c").New("c", []float64{1, 2})
	const goroutines, each = 8, 1000
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for i := range each {
				h.Update(float64(i % 3)) // one per bucket
			}
		})
	}
	wg.Wait()
	counts, sum := h.snapshot()
	var n uint64
	for _, c := range counts {
		n += c
	}
	if n != goroutines*each {
		t.Fatalf("counted %d updates, want %d", n, goroutines*each)
	}
	if want := float64(goroutines * (each / 3 * 3)); sum != want {
		t.Fatalf("sum %g, want %g", sum, want)
	}
}

func TestHistogramBadSeriesIsABug(t *testing.T) {
	f := NewHistogramFamily(metrics.NewSet(), "fam")
	for name, bounds := range map[string][]float64{"other": {1}, "fam": {2, 1}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s %v: no panic", name, bounds)
				}
			}()
			f.New(name, bounds)
		}()
	}
}

// BenchmarkHistogramUpdate: Update from parallel goroutines, against
// metrics.PrometheusHistogram's (one mutex).
func BenchmarkHistogramUpdate(b *testing.B) {
	bounds := []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	b.Run("sharded", func(b *testing.B) {
		h := NewHistogramFamily(metrics.NewSet(), "h").New("h", bounds)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				h.Update(0.02)
			}
		})
	})
	b.Run("mutex-baseline", func(b *testing.B) {
		h := metrics.NewSet().NewPrometheusHistogramExt("h", bounds)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				h.Update(0.02)
			}
		})
	})
}

// TestHistogramFamilyRemove: a removed histogram is no longer written; the family's other
// series are, and an empty family writes nothing.
func TestHistogramFamilyRemove(t *testing.T) {
	set := metrics.NewSet()
	fam := NewHistogramFamily(set, "fam")
	a := fam.New(`fam{x="a"}`, []float64{1})
	b := fam.New(`fam{x="b"}`, []float64{1})
	a.Update(0.5)
	b.Update(2)
	fam.Remove(a)
	var got bytes.Buffer
	set.WritePrometheus(&got)
	want := `fam_bucket{x="b",le="1"} 0` + "\n" + `fam_bucket{x="b",le="+Inf"} 1` + "\n" +
		`fam_sum{x="b"} 2` + "\n" + `fam_count{x="b"} 1` + "\n"
	if got.String() != want {
		t.Fatalf("after removing a:\n got:\n%s\nwant:\n%s", got.String(), want)
	}
	fam.Remove(b)
	fam.Remove(b) // twice: nothing
	got.Reset()
	set.WritePrometheus(&got)
	if got.Len() != 0 {
		t.Fatalf("an empty family wrote:\n%s", got.String())
	}
}
