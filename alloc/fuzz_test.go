package alloc_test

import (
	"testing"

	"github.com/memwall/memwall/alloc"
)

// maxFuzzOps and maxFuzzLive bound the work per input (every operation is
// followed by a full check of five allocators).
const (
	maxFuzzOps  = 512
	maxFuzzLive = 64
)

// FuzzOps decodes an operation sequence from the input and runs it over
// every strategy through the harness: shadow model checks on every answer
// and alloc.Check after every operation. The first two bytes pick the
// capacity; then each operation takes four bytes (see runFuzzOps).
func FuzzOps(f *testing.F) {
	f.Add([]byte{0, 0})
	f.Add([]byte{255, 255, 0, 20, 0, 40, 0, 12, 128, 50, 9, 0, 0, 0, 10, 1, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		capacity := (uint64(data[0])+1)*(uint64(data[1])+1)*4096 + uint64(data[0]&15)*37
		for _, name := range alloc.Strategies() {
			a, err := alloc.New(name, capacity)
			if err != nil {
				t.Fatal(err)
			}
			runFuzzOps(newHarness(t, a), data[2:])
		}
	})
}

// runFuzzOps runs 4-byte operations [op, x, y, z]:
//
//	op%16 in 0..8:  Alloc(size(x, y), align(z)), or a free once 64 are live
//	op%16 in 9..11: free a live block (x picks it, by offset or by age)
//	op%16 == 12:    free an offset that is no live block
//	op%16 == 13:    Grow by x*(y+1)*256 bytes, up to 4× the start
//	op%16 == 14:    Reset when x == 0, else Walk stopping after y%8+1 calls
//	op%16 == 15:    an invalid Alloc (size 0, bad alignment, too large)
func runFuzzOps(h *harness, ops []byte) {
	start := h.a.Capacity()
	for n := 0; len(ops) >= 4 && n < maxFuzzOps; n++ {
		op, x, y, z := ops[0], ops[1], ops[2], ops[3]
		ops = ops[4:]
		kind := op % 16
		if kind < 9 && len(h.live) >= maxFuzzLive {
			kind = 9
		}
		switch kind {
		default:
			h.alloc(fuzzSize(x, y), fuzzAlign(z))
		case 9, 10, 11:
			if len(h.live) == 0 {
				break
			}
			if y&1 == 0 {
				h.free(int(x) % len(h.live))
			} else {
				h.freeOffset(h.ages[int(x)%len(h.ages)])
			}
		case 12:
			var off uint64
			if len(h.live) > 0 {
				b := h.live[int(x)%len(h.live)]
				off = b.Offset + 1 + uint64(y)%b.Size // interior or the end
			} else {
				off = uint64(x) << (y % 64)
			}
			if !h.isLiveStart(off) {
				h.badFree(off)
			}
		case 13:
			if c := h.a.Capacity(); c < 4*start+4*alloc.SlabPageSize {
				h.grow(c + uint64(x)*(uint64(y)+1)*256)
			}
		case 14:
			if x == 0 {
				h.reset()
			} else {
				h.walkStopsEarly(int(y%8) + 1)
			}
		case 15:
			size, align := uint64(0), uint64(1)<<(y%64)
			switch x % 3 {
			case 1:
				size, align = fuzzSize(y, z)|1, uint64(z)|3
			case 2:
				size = h.a.Stats().MaxAlloc + 1 + uint64(z)
			}
			if _, err := h.alloc(size, align); err == nil {
				h.fatalf("invalid Alloc(%d, %d) succeeded", size, align)
			}
		}
		h.verify()
	}
	h.freeAll()
}

// fuzzSize maps two bytes to a size in [2^e, 2^(e+1)), e = x%30.
func fuzzSize(x, y byte) uint64 {
	e := uint(x % 30)
	return 1<<e | uint64(y)<<e>>8
}

// fuzzAlign maps a byte to an alignment: 0, a power of two up to 4 MiB,
// or (rarely) an invalid one.
func fuzzAlign(z byte) uint64 {
	switch {
	case z < 16:
		return 0
	case z >= 250:
		return uint64(z) // not a power of two
	}
	return 1 << (z % 23)
}
