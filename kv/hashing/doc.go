// Package hashing computes SGLang's KV block hashes: a SHA-256 chain over blocks of page-size
// tokens, each token as 4 little-endian bytes; a block's wire hash is the first 8 bytes of its
// digest as a big-endian int64. AppendBlockHashes hashes a token sequence; AppendChainHashes
// continues a chain from a block's Digest. The router and the mock engine both hash with
// these functions, so their hashes agree by construction, and the golden vector of
// INTEROP.md pins them to SGLang's.
//
// On amd64 with the SHA extensions (detected with golang.org/x/sys/cpu) the compression runs
// in assembly that internal/shagen generates (sha256_amd64.s; `go generate ./kv/hashing`), a
// whole chain of 16-token blocks in one loop; elsewhere, and with -tags purego,
// crypto/sha256. `make test` runs this package a second time with -tags purego.
//
// The functions are pure and safe for concurrent use; they allocate nothing for blocks of up
// to 64 tokens beyond growing dst.
package hashing
