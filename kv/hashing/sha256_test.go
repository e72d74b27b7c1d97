package hashing

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

// refChain is the wire hashes of tokens' blocks chained after parent (nil: from the
// start), computed with refBlock alone.
func refChain(parent *Digest, tokens []uint32, blockSize int) ([]int64, Digest) {
	var out []int64
	var last Digest
	if parent != nil {
		last = *parent
	}
	for i := 0; i < len(tokens); i += blockSize {
		var p *Digest
		if i > 0 || parent != nil {
			p = &last
		}
		last = refBlock(p, tokens[i:min(i+blockSize, len(tokens))])
		out = append(out, last.Hash())
	}
	return out, last
}

// hashPath names the block-hash path this build runs: the SHA extensions, or crypto/sha256
// (no extensions, another architecture, or -tags purego; make test runs both builds).
func hashPath() string {
	if haveSHANI {
		return "sha-extensions"
	}
	return "crypto/sha256"
}

// TestHashBlockMatchesSHA256 checks HashBlock against crypto/sha256 for every message length
// from 0 to 100 tokens, with and without a parent: this crosses each padding case (length
// field in the same 64-byte block, or spilling into the next) several times, and both the
// stack buffer and the heap buffer past stackBlockTokens.
func TestHashBlockMatchesSHA256(t *testing.T) {
	t.Log("path:", hashPath())
	rng := rand.New(rand.NewPCG(11, 11))
	parent := HashBlock(nil, []uint32{7, 8, 9})
	for n := 0; n <= 100; n++ {
		tokens := make([]uint32, n)
		for i := range tokens {
			tokens[i] = rng.Uint32()
		}
		for _, p := range []*Digest{nil, &parent} {
			if got, want := HashBlock(p, tokens), refBlock(p, tokens); got != want {
				t.Fatalf("%s: %d tokens, parent %v: got %x, want %x", hashPath(), n, p != nil, got, want)
			}
		}
	}
}

// TestChainHashesMatchReference checks whole chains against the reference for the block
// sizes engines use and every length from 0 to three blocks and one token, then a long
// chain with a short last block, from the start and from a parent.
func TestChainHashesMatchReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(12, 12))
	tokens := make([]uint32, 5000)
	for i := range tokens {
		tokens[i] = rng.Uint32()
	}
	parent := HashBlock(nil, []uint32{1, 2, 3})
	for _, bs := range []int{1, 4, 15, 16, 17, 32, 64, 65, 128, 256} {
		lengths := []int{4999}
		for n := 0; n <= 3*bs+1; n++ {
			lengths = append(lengths, n)
		}
		for _, n := range lengths {
			for _, p := range []*Digest{nil, &parent} {
				want, wantLast := refChain(p, tokens[:n], bs)
				got, gotLast := AppendChainHashes(nil, p, tokens[:n], bs)
				if !slices.Equal(got, want) || gotLast != wantLast {
					t.Fatalf("%s: block size %d, %d tokens, parent %v: hashes %v, want %v", hashPath(), bs, n, p != nil, got, want)
				}
				if p == nil && !slices.Equal(AppendBlockHashes(nil, tokens[:n], bs), want) {
					t.Fatalf("%s: AppendBlockHashes, block size %d, %d tokens differ", hashPath(), bs, n)
				}
			}
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
