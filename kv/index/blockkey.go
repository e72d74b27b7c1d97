package index

import (
	"hash/maphash"
	"unsafe"

	"switchyard/internal/mix"
)

// Block keys: what the index keys a block by (Config.BlockKey, the router's kv.block_key).
const (
	// BlockKeyEngine keys blocks by the engines' own block hashes: SGLang's SHA-256 chain
	// (package hashing), which lookups reproduce from the prompt. Engines whose hashes the
	// router cannot reproduce (vLLM) are re-keyed to that chain from their token IDs. The
	// default.
	BlockKeyEngine = "engine"
	// BlockKeyRouter keys blocks by the router's own chain of 64-bit keys (RouterKeys),
	// computed at ingest from every BlockStored's token IDs, with a map per owner from the
	// engine's hashes for BlockRemoved and parents, and at lookup from the prompt: several
	// times cheaper to compute than the SHA-256 chain, for a map entry per held block and
	// the token IDs decoded at ingest.
	BlockKeyRouter = "router"
)

// RouterKeys computes the router's own block keys (BlockKeyRouter). Block i of a sequence,
// its tokens t_i, has the key
//
//	k_i = mix(k_{i-1} ^ maphash(seed, t_i as 4-byte words)),  k_{-1} = 0
//
// where maphash is hash/maphash's keyed hash (its length is part of it, so a short last block
// differs from a whole one) and mix splitmix64's finalizer (internal/mix), a bijection: two blocks after
// the same prefix get one key only if their token hashes collide, and the token hashes of a
// prompt's blocks do not depend on each other, so the processor computes them side by side
// while only the finalizer is sequential.
//
// The seed is random per index (per process): keys never leave the process (lookups of
// other routers send tokens to the indexer, which keys them itself), and a seed nobody
// knows is what keeps prompts from being chosen to make keys collide or pile up in one
// table line. Two different prefixes share a key with probability 2^-64 (the engines' 64-bit
// wire hashes give the same odds): with 10M blocks resident, a looked-up block that nobody
// holds matches a resident key with probability about 10^7/2^64, 5.4·10^-13; a
// collision carries over to the blocks that follow it with the same tokens, as the chain
// keeps 64 bits.
//
// Safe for concurrent use.
type RouterKeys struct {
	seed maphash.Seed
}

// NewRouterKeys returns a key chain with a new random seed. An index has its own
// (Index.RouterKeys); keys of two chains do not agree.
func NewRouterKeys() *RouterKeys { return &RouterKeys{seed: maphash.MakeSeed()} }

// Block returns the key of the block of tokens that follows the block whose key is parent
// (0 for a sequence's first block).
func (k *RouterKeys) Block(parent int64, tokens []uint32) int64 {
	return int64(mix.Mix64(uint64(parent) ^ maphash.Bytes(k.seed, tokenBytes(tokens))))
}

// AppendChain appends the keys of tokens' blocks to dst, chaining the first after parent (0:
// tokens start the sequence), and returns the last block's key (parent when tokens is
// empty). tokens is cut into blocks of blockSize; the last block may be short (a caller that
// continues the chain later passes whole blocks). A blockSize below 1 appends nothing.
func (k *RouterKeys) AppendChain(dst []int64, parent int64, tokens []uint32, blockSize int) ([]int64, int64) {
	if blockSize < 1 {
		return dst, parent
	}
	if n := (len(tokens) + blockSize - 1) / blockSize; cap(dst)-len(dst) < n {
		grown := make([]int64, len(dst), len(dst)+n)
		copy(grown, dst)
		dst = grown
	}
	h := uint64(parent)
	for i := 0; i < len(tokens); i += blockSize {
		h = mix.Mix64(h ^ maphash.Bytes(k.seed, tokenBytes(tokens[i:min(i+blockSize, len(tokens))])))
		dst = append(dst, int64(h))
	}
	return dst, int64(h)
}

// tokenBytes is tokens' memory as bytes (4 per token, in the machine's byte order: keyed
// hashes of it stay in the process).
func tokenBytes(tokens []uint32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), 4*len(tokens))
}
