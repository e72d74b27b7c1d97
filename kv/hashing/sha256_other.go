//go:build !amd64 || purego

package hashing

import "encoding/binary"

// putTokensLE writes tokens to buf as 4-byte little-endian integers and returns the bytes
// written.
func putTokensLE(buf []byte, tokens []uint32) int {
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(buf[4*i:], t)
	}
	return 4 * len(tokens)
}

// haveSHANI is false off amd64: block hashing uses crypto/sha256.
const haveSHANI = false

func compress(*[8]uint32, []byte) { panic("kv: no SHA extensions on this platform") }

func chain16(*[8]uint32, []uint32, []int64) { panic("kv: no SHA extensions on this platform") }
