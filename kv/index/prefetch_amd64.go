//go:build amd64 && !purego

package index

import "unsafe"

// prefetch asks the processor to bring in the cache lines at p[:n] (PREFETCHT0), without
// waiting for them, and returns 0.
//
//go:noescape
func prefetch(p *[pipeBatch]unsafe.Pointer, n int) uint64
