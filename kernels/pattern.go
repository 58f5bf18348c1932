package kernels

// Pattern is the word memwall_fill_u32 writes at index i for a seed, and the
// specification the CUDA kernel follows: a multiplicative hash of the low 32
// bits of i, xored with the seed, then the murmur3 finalizer.
//
//	x = uint32(i)*0x9E3779B1 ^ seed
//	x ^= x >> 16; x *= 0x85EBCA6B
//	x ^= x >> 13; x *= 0xC2B2AE35
//	x ^= x >> 16
//
// The pattern repeats every 2^32 words (16 GiB).
func Pattern(seed uint32, i uint64) uint32 {
	x := uint32(i)*0x9E3779B1 ^ seed
	x ^= x >> 16
	x *= 0x85EBCA6B
	x ^= x >> 13
	x *= 0xC2B2AE35
	x ^= x >> 16
	return x
}
