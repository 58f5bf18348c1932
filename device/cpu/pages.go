package cpu

import (
	"fmt"
	"sync"
)

// Pages says what HostRegister does with the pages of the memory it
// registers, and whether Alloc asks for huge pages. Products on this
// device read weights straight from a file's mapping; a page not yet
// mapped into the process faults on first touch, inside the first step
// that reads it (millions of faults for a 7B model's 13.5 GB at 4 KiB).
type Pages int

const (
	// PagesPopulate (the default) maps every registered page into the
	// process before HostRegister returns (Linux's MADV_POPULATE_READ, or
	// a read of each page where the kernel lacks it), on all workers, as
	// CUDA's cuMemHostRegister makes registered pages resident; Alloc'd
	// memory of 2 MiB or more is advised to use transparent huge pages.
	PagesPopulate Pages = iota
	// PagesLazy leaves registered pages to fault in when first read and
	// gives no advice.
	PagesLazy
	// PagesHuge is PagesPopulate after asking the kernel to back the
	// registered range with huge pages where it can (MADV_HUGEPAGE, then
	// MADV_COLLAPSE per 2 MiB: a tmpfs file's cached pages are collapsed in
	// place; a file system that cannot is left at 4 KiB pages, silently).
	PagesHuge
)

// ParsePages reads "populate" (or ""), "lazy" or "huge".
func ParsePages(s string) (Pages, error) {
	switch s {
	case "", "populate":
		return PagesPopulate, nil
	case "lazy":
		return PagesLazy, nil
	case "huge":
		return PagesHuge, nil
	}
	return 0, fmt.Errorf("cpu: pages %q: want populate, lazy or huge", s)
}

func (p Pages) String() string {
	switch p {
	case PagesPopulate:
		return "populate"
	case PagesLazy:
		return "lazy"
	case PagesHuge:
		return "huge"
	}
	return fmt.Sprintf("Pages(%d)", int(p))
}

// hugeBytes is the size of a transparent huge page on the platforms that
// have them (x86-64 and arm64 with 4 KiB base pages).
const hugeBytes = 2 << 20

// prepareRegistered applies mode to b, a range about to be registered,
// splitting the work over workers goroutines in hugeBytes-aligned pieces.
// Failures are not errors: the pages then fault in when read.
func prepareRegistered(b []byte, mode Pages, workers int) {
	if mode == PagesLazy || len(b) == 0 {
		return
	}
	if mode == PagesHuge {
		adviseHuge(b)
	}
	base := addr(b)
	first := (uint64(base) + hugeBytes - 1) &^ (hugeBytes - 1)
	var pieces [][]byte
	if off := first - uint64(base); off > 0 && off < uint64(len(b)) {
		pieces = append(pieces, b[:off])
		b = b[off:]
	}
	const piece = 64 * hugeBytes
	for len(b) > 0 {
		n := min(len(b), piece)
		pieces = append(pieces, b[:n])
		b = b[n:]
	}
	var wg sync.WaitGroup
	next := make(chan []byte)
	for range max(1, min(workers, len(pieces))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range next {
				if mode == PagesHuge {
					collapse(p)
				}
				populate(p)
			}
		}()
	}
	for _, p := range pieces {
		next <- p
	}
	close(next)
	wg.Wait()
}

// touch reads one byte of every 4 KiB of b, so that each page is mapped;
// the sum keeps the reads from being optimized away.
func touch(b []byte) byte {
	var s byte
	for i := 0; i < len(b); i += 4096 {
		s += b[i]
	}
	if len(b) > 0 {
		s += b[len(b)-1]
	}
	return s
}
