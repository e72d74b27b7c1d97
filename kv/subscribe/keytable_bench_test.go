//go:build linux

package subscribe

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// threadCPU returns the CPU time of the calling thread (user and system: page faults
// included), which a goroutine locked to its thread spent; unlike the wall clock, it does
// not count the times the kernel ran another thread on the core.
func threadCPU(b *testing.B) time.Duration {
	const clockThreadCPUTimeID = 3
	var ts syscall.Timespec
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		b.Fatal(errno)
	}
	return time.Duration(ts.Nano())
}

// BenchmarkKeyTableGrowth fills a keyTable with n random engine hashes, timing each put in
// its thread's CPU time, and reports the longest put that allocated the table's new slots
// (grow-put-ns), the longest put of all (max-put-ns), the 99.99th percentile of the puts
// (p99.99-put-ns) and the wall time per put over the fill (ns/put, the clock reads
// included: about a system call's worth a put).
func BenchmarkKeyTableGrowth(b *testing.B) {
	for _, n := range []int{1 << 20, 2 << 20, 4 << 20} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			runtime.LockOSThread() // the thread's CPU clock is the goroutine's
			defer runtime.UnlockOSThread()
			rng := rand.New(rand.NewPCG(1, uint64(n)))
			hs := make([]int64, n)
			for i := range hs {
				hs[i] = int64(rng.Uint64())
			}
			took := make([]time.Duration, n)
			b.ReportAllocs()
			var longest, growing, total time.Duration
			var p9999 []float64
			for b.Loop() {
				var kt keyTable[int64]
				start := time.Now()
				prev := threadCPU(b)
				for i, h := range hs {
					size := kt.cur.size
					kt.put(h, int64(i))
					now := threadCPU(b)
					took[i] = now - prev
					if kt.cur.size != size {
						growing = max(growing, took[i])
					}
					prev = now
				}
				total += time.Since(start)
				longest = max(longest, slices.Max(took))
				slices.Sort(took)
				p9999 = append(p9999, float64(took[len(took)*9999/10000].Nanoseconds()))
			}
			b.ReportMetric(float64(growing.Nanoseconds()), "grow-put-ns")
			b.ReportMetric(float64(longest.Nanoseconds()), "max-put-ns")
			b.ReportMetric(slices.Max(p9999), "p99.99-put-ns")
			b.ReportMetric(float64(total.Nanoseconds())/float64(b.N)/float64(n), "ns/put")
		})
	}
}
