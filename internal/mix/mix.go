// Package mix holds Switchyard's one 64-bit mixing function, for the places that spread a
// hash or a counter over all 64 bits: the hash rings of the stateless policies, the
// router's own KV block keys, and the bench's deterministic token and text generators.
package mix

// Mix64 is splitmix64's finalizer: a bijection on 64-bit words in which every output bit
// depends on every input bit. It is not keyed: callers that must resist chosen inputs mix
// in a secret first.
func Mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
