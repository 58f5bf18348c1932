package plan

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
)

// Names of the offset planners, as Layout.Algorithm and Options.Algorithms
// spell them.
const (
	AlgorithmGreedySize    = "greedy-size"
	AlgorithmFFD           = "ffd"
	AlgorithmGreedyBreadth = "greedy-breadth"
	AlgorithmSearch        = "search"
	// AlgorithmPortfolio runs every greedy planner, then the search, and
	// keeps the smallest layout.
	AlgorithmPortfolio = "portfolio"
)

// GreedyBySize is TensorFlow Lite's "greedy by size" offset planner: buffers
// in decreasing size, each put in the smallest gap (best fit) left between
// already placed buffers whose lifetimes overlap its own, or above them all
// when no gap fits. Sizes are rounded up to alignment (0 or 1: none) and
// every offset is a multiple of it. It returns an error wrapping ErrInvalid
// when bufs fails Validate; the layout is not verified (see Verify).
func GreedyBySize(bufs []Buffer, alignment uint64) (Layout, error) {
	return greedyBySize(context.Background(), bufs, alignment)
}

// greedyBySize is GreedyBySize, stopped with ctx's error when ctx is done.
func greedyBySize(ctx context.Context, bufs []Buffer, alignment uint64) (Layout, error) {
	if err := Validate(bufs, alignment); err != nil {
		return Layout{}, err
	}
	order := bySizeOrder(bufs, func(a, b Buffer) int { return cmp.Compare(a.Start, b.Start) })
	return greedyLayout(ctx, bufs, order, alignment, true, AlgorithmGreedySize)
}

// FirstFitDecreasing places buffers in decreasing size (longer lifetimes
// first among equal sizes), each at the lowest offset where it does not
// collide with an already placed buffer whose lifetime overlaps its own.
// Alignment, errors and ownership are as for GreedyBySize.
func FirstFitDecreasing(bufs []Buffer, alignment uint64) (Layout, error) {
	return firstFitDecreasing(context.Background(), bufs, alignment)
}

// firstFitDecreasing is FirstFitDecreasing, stopped with ctx's error when
// ctx is done.
func firstFitDecreasing(ctx context.Context, bufs []Buffer, alignment uint64) (Layout, error) {
	if err := Validate(bufs, alignment); err != nil {
		return Layout{}, err
	}
	order := bySizeOrder(bufs, func(a, b Buffer) int { return cmp.Compare(b.End-b.Start, a.End-a.Start) })
	return greedyLayout(ctx, bufs, order, alignment, false, AlgorithmFFD)
}

// GreedyByBreadth is TensorFlow Lite's "greedy by breadth" offset planner:
// the steps of the schedule are visited in decreasing breadth (the total
// size of the buffers live there), and at each one the buffers live there
// and not yet placed are placed, largest first, in the best-fitting gap among
// already placed buffers whose lifetimes overlap theirs. Alignment, errors
// and ownership are as for GreedyBySize.
func GreedyByBreadth(bufs []Buffer, alignment uint64) (Layout, error) {
	return greedyByBreadth(context.Background(), bufs, alignment)
}

// greedyByBreadth is GreedyByBreadth, stopped with ctx's error when ctx is
// done.
func greedyByBreadth(ctx context.Context, bufs []Buffer, alignment uint64) (Layout, error) {
	if err := Validate(bufs, alignment); err != nil {
		return Layout{}, err
	}
	// Elementary time segments [times[k], times[k+1]) and their breadth.
	times := make([]int, 0, 2*len(bufs))
	for _, b := range bufs {
		times = append(times, b.Start, b.End)
	}
	slices.Sort(times)
	times = slices.Compact(times)
	nseg := max(len(times)-1, 0)
	segOf := func(t int) int { return sort.SearchInts(times, t) }
	diff := make([]uint64, nseg+1)
	for _, b := range bufs {
		s := alignUp(b.Size, alignment)
		diff[segOf(b.Start)] += s
		diff[segOf(b.End)] -= s // wraps, and unwraps in the prefix sum
	}
	breadth := make([]uint64, nseg)
	var run uint64
	for k := range nseg {
		run += diff[k]
		breadth[k] = run
	}
	// Rank segments by decreasing breadth (earlier first on ties); a buffer
	// is placed when the best-ranked segment it spans is visited.
	segs := make([]int, nseg)
	for k := range segs {
		segs[k] = k
	}
	slices.SortStableFunc(segs, func(x, y int) int { return cmp.Compare(breadth[y], breadth[x]) })
	rank := make([]int32, nseg)
	for r, k := range segs {
		rank[k] = int32(r)
	}
	rmq := newRangeMin(rank)
	key := make([]int32, len(bufs))
	for i, b := range bufs {
		key[i] = rmq.min(segOf(b.Start), segOf(b.End))
	}
	order := make([]int, len(bufs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(x, y int) int {
		return cmp.Or(cmp.Compare(key[x], key[y]), cmp.Compare(bufs[y].Size, bufs[x].Size), cmp.Compare(x, y))
	})
	return greedyLayout(ctx, bufs, order, alignment, true, AlgorithmGreedyBreadth)
}

// bySizeOrder returns buffer indexes by decreasing size, then tie, then
// index.
func bySizeOrder(bufs []Buffer, tie func(a, b Buffer) int) []int {
	order := make([]int, len(bufs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(x, y int) int {
		return cmp.Or(cmp.Compare(bufs[y].Size, bufs[x].Size), tie(bufs[x], bufs[y]), cmp.Compare(x, y))
	})
	return order
}

// slot is a placed buffer: bytes [off, end) during steps [start, stop).
type slot struct {
	off, end    uint64
	start, stop int
}

// greedyLayout places buffers in the given order, each in a gap between the
// already placed buffers that overlap it in time: the smallest gap that fits
// when bestFit, else the lowest. Buffers are kept sorted by offset, so one
// placement costs one pass over the placed buffers. It looks at ctx every
// checkEvery placements and stops with ctx's error, saying how many
// buffers it had placed.
func greedyLayout(ctx context.Context, bufs []Buffer, order []int, alignment uint64, bestFit bool, name string) (Layout, error) {
	offsets := make([]uint64, len(bufs))
	placed := make([]slot, 0, len(bufs))
	for n, i := range order {
		if n%checkEvery == 0 && ctx.Err() != nil {
			return Layout{}, fmt.Errorf("%d of %d buffers placed: %w", n, len(order), ctx.Err())
		}
		b := bufs[i]
		if b.Size == 0 {
			continue
		}
		size := alignUp(b.Size, alignment)
		// Offsets and padded sizes are multiples of alignment, so every gap
		// boundary is too.
		var prevEnd, best, bestGap uint64
		found := false
		for _, p := range placed {
			if p.stop <= b.Start || b.End <= p.start {
				continue
			}
			if p.off >= prevEnd+size {
				gap := p.off - prevEnd
				if !bestFit {
					best, found = prevEnd, true
					break
				}
				if !found || gap < bestGap {
					best, bestGap, found = prevEnd, gap, true
				}
			}
			prevEnd = max(prevEnd, p.end)
		}
		if !found {
			best = prevEnd
		}
		offsets[i] = best
		s := slot{best, best + size, b.Start, b.End}
		at, _ := slices.BinarySearchFunc(placed, s, func(a, t slot) int {
			return cmp.Or(cmp.Compare(a.off, t.off), cmp.Compare(a.end, t.end))
		})
		placed = slices.Insert(placed, at, s)
	}
	return Layout{Offsets: offsets, ArenaBytes: arenaOf(bufs, offsets, alignment), Alignment: max(alignment, 1), Algorithm: name}, nil
}

// checkEvery is how many buffers the greedy planners place, and Verify
// checks, between two looks at the context: a placement costs a pass over
// the buffers placed, so that even 10^5 of them, placed in seconds, stop
// within milliseconds.
const checkEvery = 64

// rangeMin answers minimum queries over a fixed slice (a sparse table).
type rangeMin struct{ levels [][]int32 }

func newRangeMin(v []int32) rangeMin {
	levels := [][]int32{v}
	for w := 1; 2*w <= len(v); w *= 2 {
		prev := levels[len(levels)-1]
		next := make([]int32, len(prev)-w)
		for i := range next {
			next[i] = min(prev[i], prev[i+w])
		}
		levels = append(levels, next)
	}
	return rangeMin{levels}
}

// min returns the minimum of v[lo:hi]; hi > lo.
func (r rangeMin) min(lo, hi int) int32 {
	n := hi - lo
	lvl := 0
	for 1<<(lvl+1) <= n {
		lvl++
	}
	return min(r.levels[lvl][lo], r.levels[lvl][hi-(1<<lvl)])
}
