//go:build amd64 && !purego

package hashing

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// putTokensLE writes tokens to buf as 4-byte little-endian integers and returns the bytes
// written. amd64 is little-endian: the tokens' memory already has that layout.
func putTokensLE(buf []byte, tokens []uint32) int {
	if len(tokens) == 0 {
		return 0
	}
	return copy(buf[:4*len(tokens)], unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens)))
}

//go:generate go run ./internal/shagen/gen sha256_amd64.s

// blockSHANI runs the SHA-256 compression function over n 64-byte blocks at p, updating h,
// with the x86 SHA extensions. It needs SHA, SSSE3 and SSE4.1 (haveSHANI).
//
//go:noescape
func blockSHANI(h *[8]uint32, p *byte, n int)

// chain16SHANI hashes n chained blocks of 16 tokens at tokens: h holds the parent's state
// words (its digest read as big-endian words) and ends with the last block's; each block's
// wire hash goes to dst[i].
//
//go:noescape
func chain16SHANI(h *[8]uint32, tokens *uint32, n int, dst *int64)

// chain16 is chain16SHANI over slices: len(tokens) = 16*len(dst).
func chain16(h *[8]uint32, tokens []uint32, dst []int64) {
	if len(dst) > 0 {
		chain16SHANI(h, &tokens[:16*len(dst)][0], len(dst), &dst[0])
	}
}

// cpuid executes CPUID for leaf and sub-leaf.
func cpuid(leaf, sub uint32) (a, b, c, d uint32)

// haveSHANI reports whether this CPU has the instructions blockSHANI uses: SSSE3 and
// SSE4.1 as golang.org/x/sys/cpu reports them, and the SHA extensions, which that package
// does not report on x86 (CPUID leaf 7, EBX bit 29). Set once at start-up; a build with
// -tags purego has no SHA path at all (sha256_other.go).
var haveSHANI = cpu.X86.HasSSSE3 && cpu.X86.HasSSE41 && hasSHAExt()

func hasSHAExt() bool {
	if maxLeaf, _, _, _ := cpuid(0, 0); maxLeaf < 7 {
		return false
	}
	_, b7, _, _ := cpuid(7, 0)
	const shaExt = 1 << 29 // leaf 7, EBX
	return b7&shaExt != 0
}

// compress runs blockSHANI over msg, whose length is a multiple of 64.
func compress(h *[8]uint32, msg []byte) { blockSHANI(h, &msg[0], len(msg)/64) }
