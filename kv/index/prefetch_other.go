//go:build !amd64 || purego

package index

import (
	"sync/atomic"
	"unsafe"
)

// prefetch loads a word of each of the cache lines at p[:n] (each the address of a table slot
// or an owner record) and returns their sum, for the caller to keep: without a prefetch
// instruction, the loads of a batch at least overlap one another.
func prefetch(p *[pipeBatch]unsafe.Pointer, n int) uint64 {
	var sum uint64
	for _, a := range p[:n] {
		sum += atomic.LoadUint64((*uint64)(a))
	}
	return sum
}
