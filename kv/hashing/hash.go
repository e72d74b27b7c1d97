package hashing

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

// blockBufLen is the buffer one block of n tokens is hashed in: parent digest, tokens and
// SHA-256 padding (0x80, zeros, 64-bit length) rounded up to whole 64-byte blocks.
func blockBufLen(n int) int { return (sha256.Size + 4*n + 9 + 63) &^ 63 }

// stackBufLen is blockBufLen(stackBlockTokens).
const stackBufLen = (sha256.Size + 4*stackBlockTokens + 9 + 63) &^ 63

// sha256IV is SHA-256's initial hash value (FIPS 180-4, 5.3.3).
var sha256IV = [8]uint32{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19}

// HashBlock returns the digest of one block of tokens that follows the block whose digest is
// parent, or starts the sequence when parent is nil:
//
//	SHA-256(parent digest (32 bytes, absent for the first block) ‖ each token as 4 bytes LE)
//
// This is SGLang's block hashing; the wire hash is Digest.Hash.
func HashBlock(parent *Digest, tokens []uint32) Digest {
	if len(tokens) <= stackBlockTokens {
		var buf [stackBufLen]byte
		return hashBlockInto(buf[:], parent, tokens)
	}
	return hashBlockInto(make([]byte, blockBufLen(len(tokens))), parent, tokens)
}

// hashBlockInto hashes one block using buf, which holds at least blockBufLen(len(tokens))
// bytes.
//
// With the SHA extensions it pads the message itself and runs the compression function
// directly: a 16-token block with its parent is two compressions, and crypto/sha256's
// per-call work (state setup, buffering, padding writes) would cost about as much again.
func hashBlockInto(buf []byte, parent *Digest, tokens []uint32) Digest {
	n := 0
	if parent != nil {
		n = copy(buf, parent[:])
	}
	n += putTokensLE(buf[n:], tokens)
	if !haveSHANI {
		return sha256.Sum256(buf[:n])
	}
	h := sha256IV
	compress(&h, pad(buf, n))
	return digestOf(&h)
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
	var stack [stackBufLen]byte
	buf := stack[:]
	if blockSize > stackBlockTokens {
		buf = make([]byte, blockBufLen(blockSize))
	}
	dst = growInt64(dst, (len(tokens)+blockSize-1)/blockSize)
	prev := parent
	i := 0
	if haveSHANI {
		if prev == nil {
			// The first block has no parent: a message of another length (and possibly
			// the whole, short prompt).
			i = min(blockSize, len(tokens))
			last = hashBlockInto(buf, nil, tokens[:i])
			dst = append(dst, last.Hash())
			prev = &last
		}
		var whole int
		dst, last, whole = appendChainedBlocks(dst, buf, prev, tokens[i:], blockSize)
		i += whole * blockSize
		prev = &last
	}
	for ; i < len(tokens); i += blockSize {
		last = hashBlockInto(buf, prev, tokens[i:min(i+blockSize, len(tokens))])
		dst = append(dst, last.Hash())
		prev = &last
	}
	return dst, last
}

// appendChainedBlocks hashes the whole blocks of tokens that follow parent with the SHA
// extensions and appends their wire hashes to dst (which has room for them). It returns the
// last block's digest (parent's when there is none) and the number of blocks hashed.
//
// Every message has the same layout (parent digest, blockSize tokens, padding): the padding is
// written once, and the chaining state goes from one message into the next as words, without
// a round trip through a Digest.
func appendChainedBlocks(dst []int64, buf []byte, parent *Digest, tokens []uint32, blockSize int) ([]int64, Digest, int) {
	blocks := len(tokens) / blockSize
	if blocks == 0 {
		return dst, *parent, 0
	}
	if blockSize == 16 {
		// The most common page size: the whole chain in assembly, the state in registers.
		var h [8]uint32
		for j := range h {
			h[j] = binary.BigEndian.Uint32(parent[4*j:])
		}
		start := len(dst)
		dst = dst[:start+blocks]
		chain16(&h, tokens, dst[start:])
		return dst, digestOf(&h), blocks
	}
	msg := pad(buf, sha256.Size+4*blockSize)
	copy(msg, parent[:])
	var h [8]uint32
	for b := range blocks {
		putTokensLE(msg[sha256.Size:], tokens[b*blockSize:(b+1)*blockSize])
		h = sha256IV
		compress(&h, msg)
		dst = append(dst, int64(uint64(h[0])<<32|uint64(h[1])))
		for j, v := range h {
			binary.BigEndian.PutUint32(msg[4*j:], v)
		}
	}
	var d Digest
	copy(d[:], msg[:sha256.Size])
	return dst, d, blocks
}

// pad writes SHA-256's padding after the n message bytes in buf (0x80, zeros, the length in
// bits) and returns the padded message: whole 64-byte blocks.
func pad(buf []byte, n int) []byte {
	total := (n + 9 + 63) &^ 63
	buf[n] = 0x80
	clear(buf[n+1 : total-8])
	binary.BigEndian.PutUint64(buf[total-8:total], uint64(n)*8)
	return buf[:total]
}

// digestOf is the digest of state h: its words, big-endian.
func digestOf(h *[8]uint32) Digest {
	var d Digest
	for i, v := range h {
		binary.BigEndian.PutUint32(d[4*i:], v)
	}
	return d
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
