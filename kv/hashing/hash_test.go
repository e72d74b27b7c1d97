package hashing

import (
	"slices"
	"testing"
)

func TestAppendBlockHashesGolden(t *testing.T) {
	tests := []struct {
		name      string
		tokens    []uint32
		blockSize int
		want      []int64
	}{
		{"interop vector", []uint32{1, 2, 3, 4, 5}, 4, []int64{-3488128144981237669, -3787494577174227566}},
		{"one whole block", []uint32{1, 2, 3, 4}, 4, []int64{-3488128144981237669}},
		{"empty", nil, 4, nil},
		{"no block size", []uint32{1, 2}, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := AppendBlockHashes(nil, tt.tokens, tt.blockSize)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("AppendBlockHashes = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestAppendChainHashesContinues(t *testing.T) {
	tokens := make([]uint32, 100)
	for i := range tokens {
		tokens[i] = uint32(i*7919) + 1<<31 // above 2^31, as simulated tokenizers emit
	}
	for _, bs := range []int{1, 4, 16, 64, 65, 100} {
		whole := AppendBlockHashes(nil, tokens, bs)
		// Hash the first k whole blocks, then continue from the returned digest.
		k := 2
		if 2*bs > len(tokens) {
			k = 0
		}
		head, d := AppendChainHashes(nil, nil, tokens[:k*bs], bs)
		var parent *Digest
		if k > 0 {
			parent = &d
		}
		got, _ := AppendChainHashes(head, parent, tokens[k*bs:], bs)
		if !slices.Equal(got, whole) {
			t.Fatalf("block size %d: chained hashes differ from one-shot hashes", bs)
		}
		// HashBlock agrees with the chain.
		first := HashBlock(nil, tokens[:min(bs, len(tokens))])
		if first.Hash() != whole[0] {
			t.Fatalf("block size %d: HashBlock = %d, want %d", bs, first.Hash(), whole[0])
		}
	}
}

func TestAppendBlockHashesAppends(t *testing.T) {
	dst := []int64{42}
	got := AppendBlockHashes(dst, []uint32{1, 2, 3, 4}, 4)
	if !slices.Equal(got, []int64{42, -3488128144981237669}) {
		t.Fatalf("got %v", got)
	}
}
