package kv

import (
	"crypto/sha256"
	"encoding/binary"
)

// Digest is the full SHA-256 digest of one block in a hash chain. The next block's digest
// covers it, so a block's hash identifies the whole prefix up to and including that block.
type Digest [sha256.Size]byte

// Hash returns the block's wire hash: the first eight bytes of the digest read as a
// big-endian signed 64-bit integer.
func (d *Digest) Hash() int64 { return int64(binary.BigEndian.Uint64(d[:8])) }

// stackBlockTokens is the largest block HashBlock hashes from a stack buffer.
const stackBlockTokens = 64

// HashBlock returns the digest of one block of tokens that follows the block whose digest is
// parent, or starts the sequence when parent is nil:
//
//	SHA-256(parent digest (32 bytes, absent for the first block) ‖ each token as 4 bytes LE)
//
// This is SGLang's block hashing; the wire hash is Digest.Hash.
func HashBlock(parent *Digest, tokens []uint32) Digest {
	if len(tokens) <= stackBlockTokens {
		var buf [sha256.Size + 4*stackBlockTokens]byte
		return hashBlockInto(buf[:], parent, tokens)
	}
	return hashBlockInto(make([]byte, sha256.Size+4*len(tokens)), parent, tokens)
}

// hashBlockInto hashes one block using buf, which holds at least 32 + 4*len(tokens) bytes.
func hashBlockInto(buf []byte, parent *Digest, tokens []uint32) Digest {
	n := 0
	if parent != nil {
		n = copy(buf, parent[:])
	}
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(buf[n:], t)
		n += 4
	}
	return sha256.Sum256(buf[:n])
}

// AppendBlockHashes appends the wire hashes of tokens' blocks to dst. tokens is cut into
// blocks of blockSize (the engine's page size); the last block may be short. A blockSize
// below 1 appends nothing.
//
// Golden vector: tokens [1 2 3 4 5], block size 4 → [-3488128144981237669,
// -3787494577174227566].
func AppendBlockHashes(dst []int64, tokens []uint32, blockSize int) []int64 {
	dst, _ = AppendChainHashes(dst, nil, tokens, blockSize)
	return dst
}

// AppendChainHashes appends the wire hashes of tokens' blocks to dst, chaining the first
// block after parent (nil: tokens start the sequence), and returns the digest of the last
// block hashed. When tokens is empty it returns the parent's digest (the zero Digest for a
// nil parent). The last block may be short; a caller that continues the chain later passes
// only whole blocks.
func AppendChainHashes(dst []int64, parent *Digest, tokens []uint32, blockSize int) ([]int64, Digest) {
	var last Digest
	if parent != nil {
		last = *parent
	}
	if blockSize < 1 || len(tokens) == 0 {
		return dst, last
	}
	var stack [sha256.Size + 4*stackBlockTokens]byte
	buf := stack[:]
	if blockSize > stackBlockTokens {
		buf = make([]byte, sha256.Size+4*blockSize)
	}
	dst = growInt64(dst, (len(tokens)+blockSize-1)/blockSize)
	prev := parent
	for i := 0; i < len(tokens); i += blockSize {
		last = hashBlockInto(buf, prev, tokens[i:min(i+blockSize, len(tokens))])
		dst = append(dst, last.Hash())
		prev = &last
	}
	return dst, last
}

// growInt64 makes room for n more elements in dst.
func growInt64(dst []int64, n int) []int64 {
	if cap(dst)-len(dst) >= n {
		return dst
	}
	out := make([]int64, len(dst), len(dst)+n)
	copy(out, dst)
	return out
}
