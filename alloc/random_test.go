package alloc_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/memwall/memwall/alloc"
	"github.com/memwall/memwall/internal/longtest"
)

// randomOps is the length of the long random sequence per strategy, with
// alloc.Check after every operation.
func randomOps() int {
	switch {
	case longtest.Enabled():
		return 1_000_000
	case raceEnabled:
		return 30_000
	case testing.Short():
		return 100_000
	}
	return 250_000
}

// gpuSize draws a request size as GPU inference workloads make them:
// log-uniform from 256 B to maxSize, then rounded the way frameworks round
// (to 512 B, to a power of two, to 256 B) or left odd; a few tiny ones.
func gpuSize(r *rand.Rand, maxSize uint64) uint64 {
	if r.IntN(20) == 0 {
		return 1 + r.Uint64N(255)
	}
	lo, hi := 8.0, math.Log2(float64(maxSize))
	s := uint64(math.Exp2(lo + r.Float64()*(hi-lo)))
	switch r.IntN(4) {
	case 0:
		s = (s + 511) &^ 511
	case 1:
		s = nextPow2(s)
	case 2:
		s = (s + 255) &^ 255
	}
	return max(1, min(s, maxSize))
}

// gpuAlign draws an alignment: mostly 256 B (CUDA's) and its neighbours,
// sometimes none, sometimes large (2 MiB pages).
func gpuAlign(r *rand.Rand) uint64 {
	switch x := r.IntN(100); {
	case x < 15:
		return 1
	case x < 20:
		return 0 // means 1
	case x < 60:
		return 256
	case x < 80:
		return 512
	case x < 90:
		return 4096
	case x < 97:
		return 64 * KiB
	}
	return 2 * MiB
}

type randomConfig struct {
	capacity, maxSize uint64
	maxLive           int
}

func configFor(name string) randomConfig {
	// ~40 live blocks of the GPU mix (log-uniform up to 40 MiB) average
	// ~150 MiB, so the allocators run near full and some requests fail:
	// the OOM paths get exercised too.
	c := randomConfig{capacity: 160 * MiB, maxLive: 64}
	if name == "slab" {
		c.capacity = 32 * MiB // 16 pages
	}
	c.maxSize = min(64*MiB, c.capacity/4)
	if name == "slab" {
		c.maxSize = alloc.SlabMaxAlloc
	}
	return c
}

// TestRandomOps runs a long random sequence of allocations, frees (in
// FIFO, LIFO and random order), invalid calls, walks, grows and resets
// over every strategy, with the shadow model and alloc.Check verifying the
// allocator after every single operation.
func TestRandomOps(t *testing.T) {
	ops := randomOps()
	forEach(t, func(t *testing.T, name string) {
		cfg := configFor(name)
		h := newHarness(t, mustNew(t, name, cfg.capacity))
		r := rand.New(rand.NewPCG(0x5eed, uint64(len(name))))
		var allocs, fails, frees, grows, resets int
		var fragSum float64
		for op := 0; op < ops; op++ {
			switch x := r.IntN(1_000_000); {
			case x < 4:
				h.reset()
				resets++
			case x < 24:
				if c := h.a.Capacity(); c < 2*cfg.capacity {
					if h.grow(c + 1 + r.Uint64N(c/8)) {
						grows++
					}
				}
			case x < 1024:
				h.walkStopsEarly(1 + r.IntN(8))
			case x < 6024:
				h.badFree(badOffset(h, r))
			case x < 8024:
				size, align := invalidRequest(r, h.a.Stats().MaxAlloc)
				if _, err := h.alloc(size, align); err == nil {
					t.Fatalf("Alloc(%d, %d) succeeded", size, align)
				}
			default:
				n := len(h.live)
				wantAlloc := n == 0 || n < cfg.maxLive && r.IntN(100) < 50+40*boolInt(n < cfg.maxLive/4)
				if wantAlloc {
					if _, err := h.alloc(gpuSize(r, cfg.maxSize), gpuAlign(r)); err != nil {
						fails++
					} else {
						allocs++
					}
					break
				}
				frees++
				switch y := r.IntN(10); {
				case y < 4: // oldest first: scratch freed in order
					h.freeOffset(h.ages[0])
				case y < 6: // newest first
					h.freeOffset(h.ages[len(h.ages)-1])
				default:
					h.free(r.IntN(n))
				}
			}
			h.verify()
			fragSum += h.a.Stats().FragmentationFactor()
		}
		st := h.a.Stats()
		t.Logf("%s: %d ops: %d allocs, %d failed, %d frees, %d grows, %d resets; final %+v; mean fragmentation factor %.3f",
			name, ops, allocs, fails, frees, grows, resets, st, fragSum/float64(ops))
		if allocs < ops/4 || fails > allocs {
			t.Errorf("sequence mostly failed: %d allocs, %d failures", allocs, fails)
		}
		h.freeAll()
	})
}

// badOffset picks an offset that starts no live block: interior, end,
// recently freed, past the capacity.
func badOffset(h *harness, r *rand.Rand) uint64 {
	for {
		var off uint64
		switch x := r.IntN(5); {
		case x == 0 && len(h.live) > 0:
			b := h.live[r.IntN(len(h.live))]
			if b.Size < 2 {
				continue
			}
			off = b.Offset + 1 + r.Uint64N(b.Size-1)
		case x == 1 && len(h.live) > 0:
			off = h.live[r.IntN(len(h.live))].End()
		case x == 2:
			off = h.a.Capacity() + r.Uint64N(1<<20)
		case x == 3:
			off = r.Uint64N(h.a.Capacity() + 1)
		default:
			off = r.Uint64()
		}
		if !h.isLiveStart(off) {
			return off
		}
	}
}

// invalidRequest returns a request every strategy must refuse without an
// OOM: size 0, a bad alignment, or more than MaxAlloc.
func invalidRequest(r *rand.Rand, maxAlloc uint64) (size, align uint64) {
	switch r.IntN(3) {
	case 0:
		return 0, 1 << r.IntN(20)
	case 1:
		return 1 + r.Uint64N(MiB), 3 + 2*r.Uint64N(1000)
	}
	return maxAlloc + 1 + r.Uint64N(1<<20), 256
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
