package pool

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"testing"
)

// CheckHandles verifies the physical handles of every virtual arena: each
// mapped page belongs to exactly one handle, a run of pages [head,
// head+n) mapped with one device handle, and unmapped pages belong to
// none; the mapped bytes agree with the handles.
func CheckHandles(p *Pool) error {
	for _, s := range allShards(p) {
		if err := checkHandles(s); err != nil {
			return err
		}
	}
	return nil
}

func checkHandles(p *Pool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ai, a := range p.arenas {
		if !a.virtual {
			continue
		}
		var mapped uint64
		for i := uint64(0); i < uint64(len(a.pages)); {
			pg := &a.pages[i]
			if !pg.mapped {
				if pg.n != 0 || pg.h != 0 {
					return fmt.Errorf("arena %d page %d: unmapped but in a handle (head %d, %d pages)", ai, i, pg.head, pg.n)
				}
				i++
				continue
			}
			head, n := uint64(pg.head), uint64(pg.n)
			if head != i || n == 0 || head+n > uint64(len(a.pages)) {
				return fmt.Errorf("arena %d page %d: first mapped page of a run names head %d, %d pages", ai, i, head, n)
			}
			for j := head; j < head+n; j++ {
				q := &a.pages[j]
				if !q.mapped || uint64(q.head) != head || uint64(q.n) != n || q.h != pg.h {
					return fmt.Errorf("arena %d page %d: in the handle of pages [%d, %d) but mapped %v, head %d, %d pages, handle %d (want %d)",
						ai, j, head, head+n, q.mapped, q.head, q.n, q.h, pg.h)
				}
			}
			mapped += n * a.pageBytes
			i = head + n
		}
		if mapped != a.mapped {
			return fmt.Errorf("arena %d: handles map %d bytes, %d counted", ai, mapped, a.mapped)
		}
	}
	return nil
}

// readyEdges calls fn for each page i in [first, last] whose ready bit
// differs from page i-1's: starts says a run of ready pages starts at i
// (else one ended at i). It is placeSearch.visit's scan, through edgeBits.
func (a *arena) readyEdges(first, last uint64, fn func(i uint64, starts bool)) {
	for w := first / 64; first <= last && w <= last/64; w++ {
		d, x := a.edgeBits(w, first, last)
		for ; d != 0; d &= d - 1 {
			k := uint64(bits.TrailingZeros64(d))
			fn(w*64+k, x&(1<<k) != 0)
		}
	}
}

// TestReadyEdges: the word-at-a-time scan of the ready set reports exactly
// the pages whose ready bit differs from the page before, over random sets
// and ranges.
func TestReadyEdges(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 2000; trial++ {
		n := 1 + r.IntN(300)
		a := &arena{ready: make([]uint64, (n+63)/64)}
		run := r.IntN(8) + 1 // runs of similar bits, as mapped pages come
		bit := false
		for i := 0; i < n; i++ {
			if r.IntN(run) == 0 {
				bit = !bit
			}
			if bit {
				a.ready[i/64] |= 1 << (i % 64)
			}
		}
		first := 1 + uint64(r.IntN(n))
		last := first + uint64(r.IntN(n+1-int(first)))
		if last >= uint64(n) {
			last = uint64(n) - 1
		}
		var got, want []uint64
		a.readyEdges(first, last, func(i uint64, starts bool) {
			if starts != (a.ready[i/64]&(1<<(i%64)) != 0) {
				t.Fatalf("page %d: starts %v, bit %v", i, starts, !starts)
			}
			got = append(got, i)
		})
		for i := first; i <= last; i++ {
			if (a.ready[i/64]>>(i%64))&1 != (a.ready[(i-1)/64]>>((i-1)%64))&1 {
				want = append(want, i)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("trial %d [%d, %d]: edges %v, want %v", trial, first, last, got, want)
		}
	}
}

// TestMarkTouched: markTouched sets exactly the bits of pages [first,
// last], over random ranges within a word, across two, and across many.
func TestMarkTouched(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for trial := 0; trial < 5000; trial++ {
		n := 1 + r.IntN(400)
		a := &arena{touched: make([]uint64, (n+63)/64)}
		want := make([]uint64, len(a.touched))
		for i := range a.touched {
			a.touched[i] = r.Uint64() & r.Uint64()
			want[i] = a.touched[i]
		}
		first := uint64(r.IntN(n))
		last := first + uint64(r.IntN(min(n-int(first), 1+r.IntN(130))))
		for i := first; i <= last; i++ {
			want[i/64] |= 1 << (i % 64)
		}
		a.markTouched(first, last)
		if fmt.Sprint(a.touched) != fmt.Sprint(want) {
			t.Fatalf("trial %d [%d, %d]: %x, want %x", trial, first, last, a.touched, want)
		}
	}
}
