package pool

import "fmt"

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
