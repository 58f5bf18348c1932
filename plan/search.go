package plan

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// The search is a branch and bound over "canonical" layouts, after the ideas
// of MiniMalloc (M. D. Moffitt, "MiniMalloc: A Lightweight Memory Allocator
// for Hardware-Accelerated Machine Learning", ASPLOS 2023):
//
//   - Every layout can be pushed down until each buffer rests on the top of
//     a buffer live at a common step (or on 0), and then listed by
//     increasing offset. So the search only ever places a buffer exactly at
//     its lowest free offset above the buffers placed so far (its
//     "release"), in non-decreasing offset order, ties broken by a rank.
//   - A buffer is not placed at or above the lowest top any unplaced buffer
//     could reach: that layout leaves a gap the other buffer could drop
//     into, and its pushed-down form is found on another branch. And when a
//     placed buffer shares no step with any unplaced one and the branch
//     fails, its later siblings would fail too.
//   - Time is cut into sections: the sets of buffers live just before some
//     buffer ends. The unplaced buffers of a section must stack above its
//     floor (the tops placed there) and above the current offset; stacked
//     in order of their releases, each at or above its own, they end no
//     lower than any order could (a one-machine schedule with release
//     dates), and that end must fit the capacity. Branches that break this
//     in any section are cut.
//   - When the placed buffers split the unplaced ones into groups that
//     share no step, the groups are solved independently, each with its
//     buffers ranked afresh.
//   - Subtrees that held no layout are remembered by a hash of their state,
//     so a state reached again by another path is not searched twice.
//   - Several rank orders are tried round robin under a node budget that
//     doubles each round, so one unlucky order does not eat the time.
//
// The search works on a decision problem (does a layout fit a capacity?);
// minimising the arena is a bisection over capacities. All of it runs on
// sizes divided by the alignment, so offsets come out aligned.

// ErrNotFound is returned when the search ran out of time or nodes before
// finding a layout; a larger budget may still find one.
var ErrNotFound = errors.New("no layout found within the search budget")

// ErrInfeasible is returned when the search explored every canonical layout
// and none fits the capacity.
var ErrInfeasible = errors.New("no layout fits the capacity")

// Limits on what the search takes on. Larger instances are left to the
// greedy planners (Solve reports the search as skipped).
const (
	// MaxSearchBuffers is the most buffers of non-zero size the search
	// accepts.
	MaxSearchBuffers = 4096
	// maxSearchPairs bounds the pairs of buffers live together, which the
	// search keeps as adjacency lists.
	maxSearchPairs = 1 << 23
)

// searchStatus is the outcome of one (sub)search.
type searchStatus int

const (
	statusNotFound searchStatus = iota // exhausted: no layout below the capacity
	statusFound
	statusBudget   // node budget used up
	statusDeadline // deadline passed or context done
)

// searchInst is an instance prepared for the search: zero-size buffers
// dropped, sizes in units of the alignment, buffers renumbered by one
// preorder (index = rank, which breaks ties between equal offsets).
type searchInst struct {
	n      int
	order  string    // preorder keys, see preorders
	length []int     // lifetime length, by rank
	area   []float64 // size times length, by rank
	orig   []int     // rank -> index into the caller's buffers
	size   []int64   // units
	secLo  []int32   // buffer's sections are [secLo, secHi)
	secHi  []int32
	nbrOff []int32 // neighbours of rank i: nbr[nbrOff[i]:nbrOff[i+1]]
	nbr    []int32
	nsec   int
	memOff []int32 // members of section s: mem[memOff[s]:memOff[s+1]]
	mem    []int32
	bufMem []int32 // buffer r's memberships are numbered from bufMem[r]
	sum0   []int64 // per section: total size of its buffers
	cut0   []int32 // per section boundary s|s+1: buffers spanning it
}

// searchBase holds what every preorder shares.
type searchBase struct {
	idx   []int   // indexes of the caller's buffers that take space
	size  []int64 // units, by position in idx
	start []int
	end   []int
	secLo []int32
	secHi []int32
	nsec  int
	pairs [][2]int32 // positions of buffers live together, i < j
	total []int64    // largest section sum over each buffer's sections
}

// newSearchBase prepares bufs (valid per Validate) for the search with the
// given alignment. It returns an error when the instance exceeds the search
// limits.
func newSearchBase(bufs []Buffer, alignment uint64) (*searchBase, error) {
	a := max(alignment, 1)
	sb := &searchBase{}
	for i, b := range bufs {
		if b.Size == 0 {
			continue
		}
		sb.idx = append(sb.idx, i)
		sb.size = append(sb.size, int64(alignUp(b.Size, a)/a))
		sb.start = append(sb.start, b.Start)
		sb.end = append(sb.end, b.End)
	}
	n := len(sb.idx)
	if n > MaxSearchBuffers {
		return nil, fmt.Errorf("%d buffers, more than the search limit of %d", n, MaxSearchBuffers)
	}
	// Elementary segments between distinct times; a section is a segment
	// that some buffer's end closes. The maximal cliques are among them; the
	// others hold fewer buffers, whose lowest free offset can be higher, so
	// they let the floor inference cut earlier.
	times := make([]int, 0, 2*n)
	for i := range n {
		times = append(times, sb.start[i], sb.end[i])
	}
	slices.Sort(times)
	times = slices.Compact(times)
	segOf := func(t int) int { return sort.SearchInts(times, t) }
	endsAt := make([]bool, len(times))
	for i := range n {
		endsAt[segOf(sb.end[i])] = true
	}
	secOfSeg := make([]int32, len(times)) // number of sections before segment k
	var nsec int32
	for k := 0; k+1 < len(times); k++ {
		secOfSeg[k] = nsec
		if endsAt[k+1] {
			nsec++
		}
	}
	if len(times) > 0 {
		secOfSeg[len(times)-1] = nsec
	}
	sb.nsec = int(nsec)
	sb.secLo = make([]int32, n)
	sb.secHi = make([]int32, n)
	for i := range n {
		sb.secLo[i] = secOfSeg[segOf(sb.start[i])]
		sb.secHi[i] = secOfSeg[segOf(sb.end[i])]
		if sb.secHi[i] <= sb.secLo[i] {
			return nil, fmt.Errorf("internal: buffer %d spans no section", sb.idx[i])
		}
	}
	// Pairs live together: sweep by start.
	byStart := make([]int32, n)
	for i := range byStart {
		byStart[i] = int32(i)
	}
	slices.SortFunc(byStart, func(x, y int32) int { return cmp.Compare(sb.start[x], sb.start[y]) })
	var live []int32
	for _, i := range byStart {
		live = slices.DeleteFunc(live, func(j int32) bool { return sb.end[j] <= sb.start[i] })
		if len(sb.pairs)+len(live) > maxSearchPairs {
			return nil, fmt.Errorf("more than %d pairs of buffers live together, the search limit", maxSearchPairs)
		}
		for _, j := range live {
			sb.pairs = append(sb.pairs, [2]int32{min(i, j), max(i, j)})
		}
		live = append(live, i)
	}
	// Section sums and each buffer's largest section sum.
	var members int
	for i := range n {
		members += int(sb.secHi[i] - sb.secLo[i])
	}
	if members > maxSearchPairs {
		return nil, fmt.Errorf("more than %d section memberships, the search limit", maxSearchPairs)
	}
	sum := make([]int64, sb.nsec)
	for i := range n {
		for s := sb.secLo[i]; s < sb.secHi[i]; s++ {
			sum[s] += sb.size[i]
		}
	}
	sb.total = make([]int64, n)
	for i := range n {
		for s := sb.secLo[i]; s < sb.secHi[i]; s++ {
			sb.total[i] = max(sb.total[i], sum[s])
		}
	}
	return sb, nil
}

// preorders are the orders tried round robin (they break ties between
// buffers with the same lowest offset). Each letter is a key, big first: T
// the largest section total the buffer is part of, L its lifetime's length,
// A its area (size times length). The first of them finds layouts for most
// of the MiniMalloc benchmark instances fastest.
var preorders = []string{"TLA", "TAL", "LAT"}

func (sb *searchBase) instance(order string) *searchInst {
	n := len(sb.idx)
	area := func(i int) float64 { return float64(sb.size[i]) * float64(sb.end[i]-sb.start[i]) }
	pos := make([]int, n)
	for i := range pos {
		pos[i] = i
	}
	slices.SortFunc(pos, func(x, y int) int {
		for _, key := range order {
			var c int
			switch key {
			case 'T':
				c = cmp.Compare(sb.total[y], sb.total[x])
			case 'L':
				c = cmp.Compare(sb.end[y]-sb.start[y], sb.end[x]-sb.start[x])
			case 'A':
				c = cmp.Compare(area(y), area(x))
			}
			if c != 0 {
				return c
			}
		}
		return cmp.Compare(x, y)
	})
	rank := make([]int32, n)
	for r, p := range pos {
		rank[p] = int32(r)
	}
	in := &searchInst{n: n, nsec: sb.nsec, order: order}
	in.orig = make([]int, n)
	in.length = make([]int, n)
	in.area = make([]float64, n)
	in.size = make([]int64, n)
	in.secLo = make([]int32, n)
	in.secHi = make([]int32, n)
	for r, p := range pos {
		in.length[r] = sb.end[p] - sb.start[p]
		in.area[r] = area(p)
		in.orig[r] = sb.idx[p]
		in.size[r] = sb.size[p]
		in.secLo[r] = sb.secLo[p]
		in.secHi[r] = sb.secHi[p]
	}
	deg := make([]int32, n+1)
	for _, pr := range sb.pairs {
		deg[rank[pr[0]]+1]++
		deg[rank[pr[1]]+1]++
	}
	for i := 1; i <= n; i++ {
		deg[i] += deg[i-1]
	}
	in.nbrOff = deg
	in.nbr = make([]int32, 2*len(sb.pairs))
	fill := slices.Clone(deg[:n])
	for _, pr := range sb.pairs {
		a, b := rank[pr[0]], rank[pr[1]]
		in.nbr[fill[a]] = b
		fill[a]++
		in.nbr[fill[b]] = a
		fill[b]++
	}
	memOff := make([]int32, in.nsec+1)
	for r := range n {
		for sec := in.secLo[r]; sec < in.secHi[r]; sec++ {
			memOff[sec+1]++
		}
	}
	for sec := 1; sec <= in.nsec; sec++ {
		memOff[sec] += memOff[sec-1]
	}
	in.memOff = memOff
	in.bufMem = make([]int32, n+1)
	for r := range n {
		in.bufMem[r+1] = in.bufMem[r] + in.secHi[r] - in.secLo[r]
	}
	in.mem = make([]int32, memOff[in.nsec])
	fill = slices.Clone(memOff[:in.nsec])
	for r := range n {
		for sec := in.secLo[r]; sec < in.secHi[r]; sec++ {
			in.mem[fill[sec]] = int32(r)
			fill[sec]++
		}
	}
	in.sum0 = make([]int64, in.nsec)
	in.cut0 = make([]int32, max(in.nsec-1, 0))
	for r := range n {
		for s := in.secLo[r]; s < in.secHi[r]; s++ {
			in.sum0[s] += in.size[r]
		}
		for s := in.secLo[r]; s+1 < in.secHi[r]; s++ {
			in.cut0[s]++
		}
	}
	return in
}

// undo records a value to restore on backtracking.
type undo struct {
	i int32
	v int64
}

// searcher runs the depth-first search for one instance and capacity.
type searcher struct {
	*searchInst
	capacity int64

	off    []int64 // placed offset, -1 while unplaced
	minOff []int64 // lowest offset above the placed buffers live with it
	floor  []int64 // per section: where its unplaced buffers start, at least
	sum    []int64 // per section: total size of its unplaced buffers
	cut    []int32 // per boundary: unplaced buffers spanning it
	sol    []int64 // the layout found, by rank

	minLog   []undo
	floorLog []undo
	// Section members are kept with the unplaced ones first:
	// mem[memOff[s]:memOff[s]+unplaced[s]]; where[bufMem[b]+s-secLo[b]] is
	// b's index in mem for section s.
	unplaced []int32
	where    []int32
	jobs     []job

	// rank breaks ties between equal offsets: the preorder, redone within
	// each group solved on its own.
	rank    []int32
	rankLog []undo
	keys    []rankKey
	slab    []int32 // candidate lists of the open nodes, stacked

	nodes     int64
	nodeLimit int64
	failed    map[uint64]struct{} // hashes of subproblems with no layout
	deadline  time.Time
	done      <-chan struct{}
	// In a parallel round, index is this preorder's place and stop the
	// index above which searches give up.
	index int32
	stop  *atomic.Int32
}

func newSearcher(in *searchInst) *searcher {
	s := &searcher{
		searchInst: in,
		off:        make([]int64, in.n),
		minOff:     make([]int64, in.n),
		floor:      make([]int64, in.nsec),
		sum:        make([]int64, in.nsec),
		cut:        make([]int32, len(in.cut0)),
		sol:        make([]int64, in.n),
		unplaced:   make([]int32, in.nsec),
		rank:       make([]int32, in.n),
		where:      make([]int32, len(in.mem)),
	}
	for sec := range in.nsec {
		for i := in.memOff[sec]; i < in.memOff[sec+1]; i++ {
			b := in.mem[i]
			s.where[in.bufMem[b]+int32(sec)-in.secLo[b]] = i
		}
	}
	return s
}

// fit looks for a layout within capacity units, visiting at most nodeLimit
// nodes (cumulative count in s.nodes grows by what it used).
func (s *searcher) fit(capacity, nodeLimit int64, deadline time.Time, done <-chan struct{}) searchStatus {
	s.capacity = capacity
	s.nodeLimit = s.nodes + nodeLimit
	s.deadline = deadline
	s.done = done
	for i := range s.off {
		s.off[i] = -1
		s.minOff[i] = 0
	}
	clear(s.floor)
	for sec := range s.nsec {
		s.unplaced[sec] = s.memOff[sec+1] - s.memOff[sec]
	}
	copy(s.sum, s.sum0)
	if s.failed == nil {
		s.failed = make(map[uint64]struct{})
	}
	clear(s.failed)
	copy(s.cut, s.cut0)
	for i := range s.rank {
		s.rank[i] = int32(i)
	}
	s.rankLog = s.rankLog[:0]
	for _, v := range s.sum {
		if v > capacity {
			return statusNotFound
		}
	}
	s.minLog, s.floorLog, s.slab = s.minLog[:0], s.floorLog[:0], s.slab[:0]
	for r := range s.n {
		s.slab = append(s.slab, int32(r))
	}
	st := s.split(0, int32(s.nsec), s.slab[:s.n])
	if s.stop != nil {
		// A layout stops the preorders after this one; a proof that none
		// exists stops all.
		limit := s.index
		if st == statusNotFound {
			limit = -1
		}
		for st == statusFound || st == statusNotFound {
			cur := s.stop.Load()
			if cur <= limit || s.stop.CompareAndSwap(cur, limit) {
				break
			}
		}
	}
	return st
}

// split solves the independent groups of cands (sorted by minOff, rank)
// separated by zero cuts inside sections [lo, hi).
func (s *searcher) split(lo, hi int32, cands []int32) searchStatus {
	start := lo
	for b := lo; b < hi; b++ {
		if b+1 < hi && s.cut[b] > 0 {
			continue
		}
		// Sections [start, b+1) form one group.
		mark := len(s.slab)
		for _, c := range cands {
			if s.secLo[c] <= b && s.secHi[c] > start {
				s.slab = append(s.slab, c)
			}
		}
		var st searchStatus = statusFound
		if len(s.slab) > mark {
			rmark := s.rerank(s.slab[mark:])
			st = s.search(start, b+1, s.slab[mark:], 0, -1)
			for i := len(s.rankLog) - 1; i >= rmark; i-- {
				s.rank[s.rankLog[i].i] = int32(s.rankLog[i].v)
			}
			s.rankLog = s.rankLog[:rmark]
		}
		s.slab = s.slab[:mark]
		if st != statusFound {
			return st
		}
		start = b + 1
	}
	return statusFound
}

// rerank orders a group of unplaced buffers that is about to be solved on
// its own by the searcher's preorder, with section totals taken over the
// buffers still unplaced, and sorts group by (minOff, new rank). The old
// ranks are logged from the returned mark.
func (s *searcher) rerank(group []int32) int {
	mark := len(s.rankLog)
	keys := s.keys[:0]
	for _, c := range group {
		var t int64
		for sec := s.secLo[c]; sec < s.secHi[c]; sec++ {
			t = max(t, s.sum[sec])
		}
		keys = append(keys, rankKey{t, s.length[c], s.area[c], s.rank[c], c})
	}
	slices.SortFunc(keys, func(x, y rankKey) int {
		for _, key := range s.order {
			var c int
			switch key {
			case 'T':
				c = cmp.Compare(y.total, x.total)
			case 'L':
				c = cmp.Compare(y.length, x.length)
			case 'A':
				c = cmp.Compare(y.area, x.area)
			}
			if c != 0 {
				return c
			}
		}
		return cmp.Compare(x.rank, y.rank)
	})
	for r, k := range keys {
		s.rankLog = append(s.rankLog, undo{k.b, int64(s.rank[k.b])})
		s.rank[k.b] = int32(r)
	}
	s.keys = keys
	slices.SortFunc(group, func(x, y int32) int {
		return cmp.Or(cmp.Compare(s.minOff[x], s.minOff[y]), cmp.Compare(s.rank[x], s.rank[y]))
	})
	return mark
}

// rankKey is a buffer's preorder keys within rerank.
type rankKey struct {
	total  int64
	length int
	area   float64
	rank   int32
	b      int32
}

// search places the buffers of cands (unplaced, sorted by minOff then rank)
// living in sections [lo, hi), after a placement at lastOff of rank last.
func (s *searcher) search(lo, hi int32, cands []int32, lastOff int64, last int32) searchStatus {
	if len(cands) == 0 {
		return statusFound
	}
	s.nodes++
	if s.nodes >= s.nodeLimit {
		return statusBudget
	}
	if s.nodes&255 == 0 {
		if s.stop != nil && s.stop.Load() < s.index {
			return statusBudget // an earlier preorder found a layout
		}
		if time.Now().After(s.deadline) {
			return statusDeadline
		}
		select {
		case <-s.done:
			return statusDeadline
		default:
		}
	}
	// No buffer goes at or above the lowest top an unplaced one can reach.
	minHeight := int64(1<<62 - 1)
	// The subtree below depends only on the unplaced buffers, their lowest
	// offsets and ranks, and the last placement: a hash of those keys the
	// table of subtrees that held no layout.
	h := mix(mix(uint64(lastOff)) + uint64(uint32(last)))
	for _, c := range cands {
		minHeight = min(minHeight, s.minOff[c]+s.size[c])
		h += mix(mix(uint64(s.minOff[c])) + uint64(c)<<32 + uint64(uint32(s.rank[c])))
	}
	if _, seen := s.failed[h]; seen {
		return statusNotFound
	}
	st := s.branch(lo, hi, cands, lastOff, last, minHeight)
	if st == statusNotFound && len(s.failed) < maxFailed {
		s.failed[h] = struct{}{}
	}
	return st
}

// maxFailed bounds the table of subproblems known to have no layout.
const maxFailed = 1 << 20

// mix is a 64-bit finaliser (splitmix64's).
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// branch tries each buffer of cands that may come next.
func (s *searcher) branch(lo, hi int32, cands []int32, lastOff int64, last int32, minHeight int64) searchStatus {
	// Placements never go down, so each section's unplaced buffers will
	// stack above the next offset: it can be at most oMax.
	oMax := s.capacity
	for sec := lo; sec < hi; sec++ {
		if s.sum[sec] > 0 {
			oMax = min(oMax, s.capacity-s.sum[sec])
		}
	}
	for k := 0; k < len(cands); k++ {
		b := cands[k]
		o := s.minOff[b]
		if o >= minHeight || o > oMax {
			break
		}
		if o < lastOff || (o == lastOff && s.rank[b] < last) {
			continue // not in canonical order
		}
		st, hatless := s.place(lo, hi, cands, k, o)
		if st == statusFound {
			s.sol[b] = o
			return st
		}
		if st != statusNotFound {
			return st
		}
		if hatless {
			// b touched no unplaced buffer: placing it changed nothing
			// for the others, so the rest fails with b anywhere, and the
			// candidates after b would only place it later.
			break
		}
	}
	return statusNotFound
}

// place puts cands[k] at offset o, searches on, and undoes the placement.
// hatless reports that no unplaced buffer is live with b.
func (s *searcher) place(lo, hi int32, cands []int32, k int, o int64) (st searchStatus, hatless bool) {
	b := cands[k]
	top := o + s.size[b]
	if top > s.capacity {
		return statusNotFound, false
	}
	minMark, floorMark := len(s.minLog), len(s.floorLog)
	s.off[b] = o
	for sec := s.secLo[b]; sec < s.secHi[b]; sec++ {
		s.unplace(b, sec)
		s.sum[sec] -= s.size[b]
	}
	// Raise the lowest offsets of b's unplaced neighbours to its top. Their
	// sections form one interval around b's.
	tlo, thi := s.secLo[b], s.secHi[b]
	hatless = true
	for _, nb := range s.nbr[s.nbrOff[b]:s.nbrOff[b+1]] {
		if s.off[nb] >= 0 {
			continue
		}
		hatless = false
		if s.minOff[nb] < top {
			s.minLog = append(s.minLog, undo{nb, s.minOff[nb]})
			s.minOff[nb] = top
			tlo, thi = min(tlo, s.secLo[nb]), max(thi, s.secHi[nb])
		}
	}
	// Every section of b now has b as its highest placed buffer; in the
	// others around, a floor at or above top cannot rise (see raiseFloor).
	// Sections elsewhere keep their floors and lose no room (o <= oMax).
	ok := true
	for sec := s.secLo[b]; sec < s.secHi[b] && ok; sec++ {
		s.floorLog = append(s.floorLog, undo{sec, s.floor[sec]})
		s.floor[sec] = top
		ok = s.raiseFloor(sec)
	}
	for sec := tlo; sec < thi && ok; sec++ {
		if sec == s.secLo[b] {
			sec = s.secHi[b] - 1
			continue
		}
		if s.floor[sec] < top {
			ok = s.raiseFloor(sec)
		}
	}
	st = statusNotFound
	if ok {
		// The children: cands without b, re-sorted (only minOffs of b's
		// neighbours grew, so insertion sort moves few entries).
		mark := len(s.slab)
		s.slab = append(s.slab, cands[:k]...)
		s.slab = append(s.slab, cands[k+1:]...)
		child := s.slab[mark:]
		for i := 1; i < len(child); i++ {
			c := child[i]
			key := s.minOff[c]
			j := i
			for j > 0 && (s.minOff[child[j-1]] > key || (s.minOff[child[j-1]] == key && s.rank[child[j-1]] > s.rank[c])) {
				child[j] = child[j-1]
				j--
			}
			child[j] = c
		}
		splits := false
		for sec := s.secLo[b]; sec+1 < s.secHi[b]; sec++ {
			s.cut[sec]--
			if s.cut[sec] == 0 && sec >= lo && sec+1 < hi {
				splits = true
			}
		}
		if splits {
			st = s.split(lo, hi, child)
		} else {
			st = s.search(lo, hi, child, o, s.rank[b])
		}
		for sec := s.secLo[b]; sec+1 < s.secHi[b]; sec++ {
			s.cut[sec]++
		}
		s.slab = s.slab[:mark]
	}
	for sec := s.secLo[b]; sec < s.secHi[b]; sec++ {
		s.sum[sec] += s.size[b]
		s.unplaced[sec]++ // b sits right past the unplaced prefix
	}
	for i := len(s.floorLog) - 1; i >= floorMark; i-- {
		s.floor[s.floorLog[i].i] = s.floorLog[i].v
	}
	for i := len(s.minLog) - 1; i >= minMark; i-- {
		s.minOff[s.minLog[i].i] = s.minLog[i].v
	}
	s.floorLog, s.minLog = s.floorLog[:floorMark], s.minLog[:minMark]
	s.off[b] = -1
	return st, hatless
}

// unplace moves b out of the unplaced prefix of section sec's members, to
// just past its end. Undoing it is incrementing the prefix length, as long
// as undos come in reverse order.
func (s *searcher) unplace(b, sec int32) {
	i := s.where[s.bufMem[b]+sec-s.secLo[b]]
	last := s.memOff[sec] + s.unplaced[sec] - 1
	o := s.mem[last]
	s.mem[i], s.mem[last] = o, b
	s.where[s.bufMem[o]+sec-s.secLo[o]] = i
	s.where[s.bufMem[b]+sec-s.secLo[b]] = last
	s.unplaced[sec]--
}

// raiseFloor lifts section sec's floor to what its unplaced buffers need:
// stacked in order of their lowest offsets (each at or above its own), the
// best any order can do, they end at need; so the stack starts, in effect,
// no lower than need minus their total size. It reports whether the floor
// plus the unplaced sizes still fit the capacity.
func (s *searcher) raiseFloor(sec int32) bool {
	if s.sum[sec] == 0 {
		return s.floor[sec] <= s.capacity
	}
	first := s.memOff[sec]
	fl := s.floor[sec]
	members := s.mem[first : first+s.unplaced[sec]]
	// Cheap test first: stacked above the highest release, they still
	// fit. Then the floor need not rise now: it stays a valid bound, and a
	// later update recomputes it.
	var maxRelease int64
	for _, m := range members {
		maxRelease = max(maxRelease, s.minOff[m])
	}
	if max(fl, maxRelease)+s.sum[sec] <= s.capacity {
		return true
	}
	// Buffers released at or below the floor go first, in any order; the
	// others are grouped by release (releases are tops of placed buffers,
	// so there are few distinct ones) and kept sorted.
	t := fl
	js := s.jobs[:0]
	for _, m := range members {
		r := s.minOff[m]
		if r <= fl {
			t += s.size[m]
			continue
		}
		k := len(js)
		for k > 0 && js[k-1].release > r {
			k--
		}
		if k > 0 && js[k-1].release == r {
			js[k-1].size += s.size[m]
			continue
		}
		js = slices.Insert(js, k, job{r, s.size[m]})
	}
	for _, j := range js {
		t = max(t, j.release) + j.size
	}
	s.jobs = js
	if f := t - s.sum[sec]; f > s.floor[sec] {
		s.floorLog = append(s.floorLog, undo{sec, s.floor[sec]})
		s.floor[sec] = f
	}
	return s.floor[sec]+s.sum[sec] <= s.capacity
}

// job is an unplaced buffer in raiseFloor: it cannot start below release.
type job struct{ release, size int64 }

// searchRun is the outcome of a search over several preorders.
type searchRun struct {
	offsets []uint64 // by caller's buffer index; nil when none found
	arena   uint64
	status  searchStatus
	nodes   int64
}

// searchFit looks for a layout of bufs within capacity bytes, trying the
// preorders round robin with a node budget that doubles each round, until
// one finds a layout, one exhausts the space, nodeLimit (0: none) is spent,
// or the deadline passes.
//
// With more than one CPU the preorders of a round run at once. The result
// does not depend on it: each preorder's search under its budget is
// deterministic, and of a round's results the first preorder's that ended
// wins, as it would have run first. A preorder that finds a layout stops
// those after it (they could not win); one that proves nothing fits stops
// all.
func searchFit(insts []*searcher, bufs []Buffer, alignment uint64, capacity uint64, nodeLimit int64, deadline time.Time, done <-chan struct{}) searchRun {
	a := max(alignment, 1)
	units := int64(min(capacity/a, 1<<62))
	var run searchRun
	budget := int64(max(insts[0].n, 64))
	parallel := runtime.GOMAXPROCS(0) > 1 && insts[0].n >= 32
	results := make([]searchStatus, len(insts))
	for {
		b := budget
		if nodeLimit > 0 {
			b = min(b, (nodeLimit-run.nodes)/int64(len(insts)))
			if b <= 0 {
				run.status = statusBudget
				return run
			}
		}
		var stop atomic.Int32 // preorders with a larger index stop
		stop.Store(int32(len(insts)))
		for i, s := range insts {
			s.index, s.stop = int32(i), &stop
		}
		before := make([]int64, len(insts))
		for i, s := range insts {
			before[i] = s.nodes
		}
		if parallel {
			var wg sync.WaitGroup
			for i, s := range insts {
				wg.Go(func() { results[i] = s.fit(units, b, deadline, done) })
			}
			wg.Wait()
		} else {
			for i, s := range insts {
				if results[i] = s.fit(units, b, deadline, done); results[i] == statusFound || results[i] == statusNotFound {
					for j := i + 1; j < len(insts); j++ {
						results[j] = statusBudget
					}
					break
				}
			}
		}
		for i, s := range insts {
			run.nodes += s.nodes - before[i]
		}
		for i, st := range results {
			switch st {
			case statusFound:
				s := insts[i]
				offsets := make([]uint64, len(bufs))
				for r, k := range s.orig {
					offsets[k] = uint64(s.sol[r]) * a
				}
				run.offsets, run.arena, run.status = offsets, arenaOf(bufs, offsets, a), st
				return run
			case statusNotFound:
				run.status = st
				return run
			}
		}
		for _, st := range results {
			if st == statusDeadline {
				run.status = st
				return run
			}
		}
		budget *= 2
	}
}

// Search looks for a layout of bufs with the MiniMalloc-style branch and
// bound alone (no greedy planner). With opts.Capacity set it looks for any
// layout that fits; otherwise it bisects for the smallest arena between the
// lower bound and the naive one (every buffer apart), which it returns when
// it finds nothing smaller. It honours opts.Alignment, opts.TimeLimit
// (default 5 s), opts.NodeLimit and ctx. It returns an error wrapping
// ErrInvalid for bad input or an instance past the search limits,
// ErrInfeasible when it proved nothing fits opts.Capacity, ErrNotFound when
// it ran out of budget first, or ctx's error. The layout is verified.
func Search(ctx context.Context, bufs []Buffer, opts Options) (Layout, error) {
	if err := Validate(bufs, opts.Alignment); err != nil {
		return Layout{}, err
	}
	deadline := time.Now().Add(opts.timeLimit())
	sb, err := newSearchBase(bufs, opts.Alignment)
	if err != nil {
		return Layout{}, fmt.Errorf("plan search: %s: %w", err, ErrInvalid)
	}
	insts := searchers(sb)
	a := max(opts.Alignment, 1)
	var res searchRun
	if opts.Capacity > 0 {
		res = searchFit(insts, bufs, a, opts.Capacity, opts.NodeLimit, deadline, ctx.Done())
	} else {
		naive := stacked(bufs, a)
		res = searchMin(insts, bufs, a, LowerBound(Padded(bufs, a)), naive.ArenaBytes, opts.NodeLimit, deadline, ctx.Done())
		if res.offsets == nil && ctx.Err() == nil {
			// Nothing beat every buffer apart, which always fits.
			res.offsets, res.arena = naive.Offsets, naive.ArenaBytes
		}
	}
	if res.offsets == nil {
		if err := ctx.Err(); err != nil {
			return Layout{}, fmt.Errorf("plan search: %w", err)
		}
		if res.status == statusNotFound {
			return Layout{}, fmt.Errorf("plan search: %d bytes: %w", opts.Capacity, ErrInfeasible)
		}
		return Layout{}, fmt.Errorf("plan search: %d nodes: %w", res.nodes, ErrNotFound)
	}
	l := Layout{Offsets: res.offsets, ArenaBytes: res.arena, Alignment: a, Algorithm: AlgorithmSearch}
	if err := Verify(bufs, l); err != nil {
		return Layout{}, fmt.Errorf("plan search: internal error: %w", err)
	}
	return l, nil
}

func searchers(sb *searchBase) []*searcher {
	out := make([]*searcher, len(preorders))
	for i, p := range preorders {
		out[i] = newSearcher(sb.instance(p))
	}
	return out
}

// searchMin bisects for the smallest arena below hi bytes (an arena already
// known, so it need not be found again) and at least lo bytes (the lower
// bound); both are multiples of a. The first probe goes to the lower bound,
// which graphs often reach; each probe gets an equal share of the time left.
// The result holds the smallest layout found (nil offsets if none); its
// status is statusNotFound only when every probe exhausted its capacity.
func searchMin(insts []*searcher, bufs []Buffer, a, lo, hi uint64, nodeLimit int64, deadline time.Time, done <-chan struct{}) searchRun {
	loU, hiU := lo/a, hi/a
	var best searchRun
	var cut searchStatus // a probe that stopped short, if any
	first := true
	for loU < hiU {
		left := time.Until(deadline)
		if left <= 0 {
			best.status = statusDeadline
			break
		}
		var limit int64
		if nodeLimit > 0 {
			if limit = nodeLimit - best.nodes; limit <= 0 {
				best.status = statusBudget
				break
			}
		}
		probes := 1
		for span := hiU - loU; span > 1; span /= 2 {
			probes++
		}
		mid := loU + (hiU-loU-1)/2
		if first {
			mid, first = loU, false
		}
		r := searchFit(insts, bufs, a, mid*a, limit, time.Now().Add(left/time.Duration(probes)), done)
		best.nodes += r.nodes
		best.status = r.status
		if r.status == statusDeadline || r.status == statusBudget {
			cut = r.status
		}
		if r.offsets != nil {
			best.offsets, best.arena = r.offsets, r.arena
			hiU = r.arena / a
			continue
		}
		select {
		case <-done:
			return best
		default:
		}
		loU = mid + 1
	}
	if best.status == statusNotFound && cut != statusNotFound {
		best.status = cut // not every smaller arena was ruled out
	}
	return best
}

// stacked is the naive layout: every buffer apart, in index order.
func stacked(bufs []Buffer, a uint64) Layout {
	offsets := make([]uint64, len(bufs))
	var top uint64
	for i, b := range bufs {
		if b.Size == 0 {
			continue
		}
		offsets[i] = top
		top += alignUp(b.Size, a)
	}
	return Layout{Offsets: offsets, ArenaBytes: top, Alignment: a, Algorithm: "naive"}
}
