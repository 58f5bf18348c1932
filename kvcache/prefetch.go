//go:build amd64 || arm64

package kvcache

// prefetch asks the processor to bring the cache line at addr closer
// (PREFETCHT0, PRFM PLDL1KEEP): a hint that never faults, so that a hash
// slot or block the next operation will read is not a cold miss then.
//
//go:noescape
func prefetch(addr uintptr)
