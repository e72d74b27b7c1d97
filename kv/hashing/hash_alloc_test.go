//go:build !race

package hashing

import (
	"testing"
)

func TestAppendBlockHashesAllocs(t *testing.T) {
	tokens := make([]uint32, 4096)
	dst := make([]int64, 0, 4096)
	for _, bs := range []int{16, 64} {
		if n := testing.AllocsPerRun(20, func() { dst = AppendBlockHashes(dst[:0], tokens, bs) }); n != 0 {
			t.Errorf("block size %d: %v allocations, want 0", bs, n)
		}
	}
}
