package kvcache

import "math/bits"

// The chained block hash: a 64-bit mix in the style of xxHash's rounds over
// the parent hash, the extra key and the block's tokens two at a time.
const (
	prime1 = 0x9e3779b185ebca87
	prime2 = 0xc2b2ae3d27d4eb4f
	prime3 = 0x165667b19e3779f9
)

func round(acc, v uint64) uint64 {
	acc += v * prime2
	acc = bits.RotateLeft64(acc, 31)
	return acc * prime1
}

func avalanche(h uint64) uint64 {
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	h ^= h >> 32
	return h
}

// rootHash is the parent hash of a sequence's first block.
func rootHash(extra uint64) uint64 { return avalanche(round(prime3, extra^0x6b76636163686531)) }

// chainHash is the hash of a full block of tokens whose parent block hashed
// to parent, under extra key extra.
func chainHash(parent, extra uint64, tokens []int32) uint64 {
	h := round(parent^prime3, extra)
	h = round(h, uint64(len(tokens)))
	i := 0
	for ; i+1 < len(tokens); i += 2 {
		h = round(h, uint64(uint32(tokens[i]))|uint64(uint32(tokens[i+1]))<<32)
	}
	if i < len(tokens) {
		h = round(h, uint64(uint32(tokens[i])))
	}
	if h = avalanche(h); h == 0 {
		h = 1 // 0 marks an empty slot of the hash table
	}
	return h
}

// BlockHashes returns the chained hashes of tokens' full blocks of
// blockTokens tokens under extraKey: the keys a cache-aware router matches
// against the BlockStored events' hashes.
func BlockHashes(tokens []int32, blockTokens int, extraKey uint64) []uint64 {
	if blockTokens <= 0 {
		return nil
	}
	out := make([]uint64, 0, len(tokens)/blockTokens)
	h := rootHash(extraKey)
	for j := 0; (j+1)*blockTokens <= len(tokens); j++ {
		h = chainHash(h, extraKey, tokens[j*blockTokens:(j+1)*blockTokens])
		out = append(out, h)
	}
	return out
}
