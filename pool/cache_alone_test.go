package pool

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestProcCacheAlone drives one processor's cache by itself, with block
// records no arena made, through long random sequences of its operations
// (push and pop per class, park, take a parked block, hold back, take the
// held-back blocks, drain, unpark all) against a model, and checks after
// every operation that each class is a stack, parking keeps the newest
// largeSlots blocks and evicts the oldest, takeLarge serves only a block
// of the request's size rounded to the alignment, held-back blocks come
// back oldest first and ahead of the parked ones, drain leaves at most
// what it was asked to keep (class cls first, then the largest), and the
// byte counts are the sums of what the cache holds.
func TestProcCacheAlone(t *testing.T) {
	const align = 256
	for seed := uint64(1); seed <= 8; seed++ {
		r := rand.New(rand.NewPCG(seed, 77))
		c := &procCache{}
		lists := make([][]*meta, numClasses) // model: per class, the top last
		var parked []*meta                   // newest first
		var held []*meta                     // oldest first
		large := func() *meta {
			size := uint64(1+r.IntN(64)) * align
			return &meta{size: size + uint64(r.IntN(2))*align, shift: 0, req: size}
		}
		for op := 0; op < 20000; op++ {
			switch k := r.IntN(16); {
			case k < 4:
				cls := r.IntN(numClasses)
				m := &meta{size: sizeClasses[cls], class: cls + 1}
				c.push(m, cls)
				lists[cls] = append(lists[cls], m)
			case k < 7:
				cls := r.IntN(numClasses)
				got := c.pop(cls)
				var want *meta
				if n := len(lists[cls]); n > 0 {
					want, lists[cls] = lists[cls][n-1], lists[cls][:n-1]
				}
				if got != want {
					t.Fatalf("seed %d op %d: pop of class %d is not the last pushed", seed, op, cls)
				}
			case k < 9:
				m := large()
				ev := c.park(m)
				parked = append([]*meta{m}, parked...)
				var want *meta
				if len(parked) > largeSlots {
					want, parked = parked[largeSlots], parked[:largeSlots]
				}
				if ev != want {
					t.Fatalf("seed %d op %d: park evicted %p, want the oldest %p", seed, op, ev, want)
				}
			case k < 11:
				size := uint64(1+r.IntN(64)) * align
				got := c.takeLarge(size, align)
				var want *meta
				for i, m := range parked {
					if m.size >= size && m.size-size < align {
						want = m
						parked = slices.Delete(parked, i, i+1)
						break
					}
				}
				if got != want {
					t.Fatalf("seed %d op %d: takeLarge(%d) gave %v, want %v", seed, op, size, got, want)
				}
			case k < 13:
				m := large()
				due := c.deferFree(m)
				held = append(held, m)
				if due != (len(held) >= maxDeferred) {
					t.Fatalf("seed %d op %d: %d held back, deferFree says due %v", seed, op, len(held), due)
				}
				if due {
					checkChain(t, c.takeDeferred(), held)
					held = nil
				}
			case k == 13:
				checkChain(t, c.takeDeferred(), held)
				held = nil
			case k == 14:
				cls := r.IntN(numClasses)
				keep := uint64(r.IntN(4)) * (c.bytes / 3)
				before := c.bytes
				chain := c.drain(cls, keep)
				if c.bytes > keep {
					t.Fatalf("seed %d op %d: drain to %d left %d", seed, op, keep, c.bytes)
				}
				// What went is class cls's top blocks first, then the
				// largest classes': the model gives them up in that order.
				var want []*meta
				var gone uint64
				for k := cls; gone < before-keep && k >= 0; {
					if n := len(lists[k]); n > 0 {
						want = append(want, lists[k][n-1])
						lists[k] = lists[k][:n-1]
						gone += sizeClasses[k]
						continue
					}
					k = largestNonEmpty(lists)
				}
				slices.Reverse(want) // drain links each block before the previous
				checkChain(t, chain, want)
			default:
				chain := c.unparkAll()
				want := append(append([]*meta(nil), held...), reversed(parked)...)
				checkChain(t, chain, want)
				held, parked = nil, nil
			}
			checkCacheCounts(t, c, lists, parked, held)
		}
	}
}

func largestNonEmpty(lists [][]*meta) int {
	for k := len(lists) - 1; k >= 0; k-- {
		if len(lists[k]) > 0 {
			return k
		}
	}
	return -1
}

func reversed(ms []*meta) []*meta {
	out := slices.Clone(ms)
	slices.Reverse(out)
	return out
}

// checkChain checks that chain (linked through next) holds want, in order.
func checkChain(t *testing.T, chain *meta, want []*meta) {
	t.Helper()
	var got []*meta
	for m := chain; m != nil; m = m.next {
		got = append(got, m)
		if len(got) > len(want)+1 {
			break
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("chain of %d blocks, want %d in order", len(got), len(want))
	}
}

// checkCacheCounts checks the cache's counts against the model's contents.
func checkCacheCounts(t *testing.T, c *procCache, lists [][]*meta, parked, held []*meta) {
	t.Helper()
	var small uint64
	for k := range lists {
		if int(c.count[k]) != len(lists[k]) {
			t.Fatalf("class %d counts %d blocks, holds %d", k, c.count[k], len(lists[k]))
		}
		small += uint64(len(lists[k])) * sizeClasses[k]
	}
	var big uint64
	for _, m := range parked {
		big += m.size
	}
	for _, m := range held {
		big += m.size
	}
	if c.bytes != small || c.largeBytes != big || c.nDeferred != len(held) {
		t.Fatalf("cache counts %d small bytes, %d large, %d held back; holds %d, %d, %d",
			c.bytes, c.largeBytes, c.nDeferred, small, big, len(held))
	}
}
