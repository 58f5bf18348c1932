// pattern(seed, i) is kernels.Pattern: a multiplicative hash of the low 32
// bits of i, xored with the seed, then the murmur3 finalizer.
uint pattern(uint seed, uint64_t i) {
    uint x = uint(i) * 0x9E3779B1u ^ seed;
    x ^= x >> 16;
    x *= 0x85EBCA6Bu;
    x ^= x >> 13;
    x *= 0xC2B2AE35u;
    x ^= x >> 16;
    return x;
}
