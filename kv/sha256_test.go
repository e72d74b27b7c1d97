package kv

import (
	"crypto/sha256"
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"
)

// refBlock is one block's digest computed with crypto/sha256 alone.
func refBlock(parent *Digest, tokens []uint32) Digest {
	var msg []byte
	if parent != nil {
		msg = append(msg, parent[:]...)
	}
	for _, t := range tokens {
		msg = binary.LittleEndian.AppendUint32(msg, t)
	}
	return sha256.Sum256(msg)
}

// withFastHash runs f with the SHA-extension path on or off, restoring it after.
func withFastHash(t testing.TB, on bool, f func()) {
	t.Helper()
	if on && !haveSHANI {
		t.Skip("this CPU has no SHA extensions")
	}
	old := fastHash
	fastHash = on
	defer func() { fastHash = old }()
	f()
}

// TestHashBlockMatchesSHA256 checks both block-hash paths against crypto/sha256 for every
// message length from 0 to 100 tokens, with and without a parent: this crosses each padding
// case (length field in the same 64-byte block, or spilling into the next) several times,
// and both the stack buffer and the heap buffer past stackBlockTokens.
func TestHashBlockMatchesSHA256(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 11))
	parent := HashBlock(nil, []uint32{7, 8, 9})
	for _, fast := range []bool{false, true} {
		name := "crypto/sha256"
		if fast {
			name = "sha-extensions"
		}
		t.Run(name, func(t *testing.T) {
			withFastHash(t, fast, func() {
				for n := 0; n <= 100; n++ {
					tokens := make([]uint32, n)
					for i := range tokens {
						tokens[i] = rng.Uint32()
					}
					for _, p := range []*Digest{nil, &parent} {
						if got, want := HashBlock(p, tokens), refBlock(p, tokens); got != want {
							t.Fatalf("%d tokens, parent %v: got %x, want %x", n, p != nil, got, want)
						}
					}
				}
			})
		})
	}
}

// TestChainHashesSamePaths checks that whole chains agree between the two paths for the
// block sizes engines use, including a short last block.
func TestChainHashesSamePaths(t *testing.T) {
	if !haveSHANI {
		t.Skip("this CPU has no SHA extensions")
	}
	rng := rand.New(rand.NewPCG(12, 12))
	tokens := make([]uint32, 5000)
	for i := range tokens {
		tokens[i] = rng.Uint32()
	}
	for _, bs := range []int{1, 4, 16, 32, 64, 65, 128, 256} {
		var slow, fast []int64
		withFastHash(t, false, func() { slow = AppendBlockHashes(nil, tokens[:4999], bs) })
		withFastHash(t, true, func() { fast = AppendBlockHashes(nil, tokens[:4999], bs) })
		if len(slow) != len(fast) {
			t.Fatalf("block size %d: %d vs %d hashes", bs, len(slow), len(fast))
		}
		for i := range slow {
			if slow[i] != fast[i] {
				t.Fatalf("block size %d: hash %d differs: %d vs %d", bs, i, slow[i], fast[i])
			}
		}
	}
}

// TestChain16ContinuesFromAParent checks the 16-token assembly chain from a parent digest
// for lengths around block boundaries.
func TestChain16ContinuesFromAParent(t *testing.T) {
	if !haveSHANI {
		t.Skip("this CPU has no SHA extensions")
	}
	rng := rand.New(rand.NewPCG(13, 13))
	parent := HashBlock(nil, []uint32{1, 2, 3})
	for _, n := range []int{0, 1, 15, 16, 17, 31, 32, 33, 160, 161, 1000} {
		tokens := make([]uint32, n)
		for i := range tokens {
			tokens[i] = rng.Uint32()
		}
		var slow, fast []int64
		var slowLast, fastLast Digest
		withFastHash(t, false, func() { slow, slowLast = AppendChainHashes(nil, &parent, tokens, 16) })
		withFastHash(t, true, func() { fast, fastLast = AppendChainHashes(nil, &parent, tokens, 16) })
		if !slices.Equal(slow, fast) || slowLast != fastLast {
			t.Fatalf("%d tokens: hashes %v / %v, last %x / %x", n, slow, fast, slowLast, fastLast)
		}
	}
}

func FuzzHashBlock(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 2, 0, 0, 0}, true)
	f.Add(make([]byte, 4*16), false)
	f.Fuzz(func(t *testing.T, raw []byte, chained bool) {
		tokens := make([]uint32, len(raw)/4)
		for i := range tokens {
			tokens[i] = binary.LittleEndian.Uint32(raw[4*i:])
		}
		var parent *Digest
		if chained {
			p := refBlock(nil, tokens[:len(tokens)/2])
			parent = &p
		}
		if got, want := HashBlock(parent, tokens), refBlock(parent, tokens); got != want {
			t.Fatalf("%d tokens: got %x, want %x", len(tokens), got, want)
		}
	})
}
