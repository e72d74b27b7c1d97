package report

import (
	"strconv"
	"testing"
	"time"

	"switchyard/bench/loadgen"
)

// BenchmarkSummarize measures aggregating a run of n requests over 8 engines.
func BenchmarkSummarize(b *testing.B) {
	workers := make([]string, 8)
	for i := range workers {
		workers[i] = "e" + strconv.Itoa(i)
	}
	for _, n := range []int{1_000, 100_000} {
		results := make([]loadgen.Result, n)
		for i := range results {
			results[i] = ok(workers[i%8], 2000, 1024*(i%2), 32, time.Duration(i%997)*time.Millisecond, time.Millisecond, time.Second)
		}
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				Summarize(results, SummaryOptions{Workers: workers, TimeScale: 4, Elapsed: time.Minute})
			}
		})
	}
}
