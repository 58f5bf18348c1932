package bench

import (
	"fmt"
	"time"

	"github.com/memwall/memwall/device"
)

// AllocWorkload is a stream of allocation requests for timing an
// allocator pair by pair (the driver's own, as the anchor memwall's pool is
// measured against): the blocks of sizes Initial are allocated first and
// kept live; then pair i frees the block in slot Victims[i] and allocates
// Sizes[i] in its place. With no Initial blocks, pair i allocates Sizes[i]
// and frees it at once. The first Warmup pairs are not timed. Every block
// still live at the end is freed.
type AllocWorkload struct {
	Initial []uint64
	Sizes   []uint64
	Victims []int
	Warmup  int
}

// Check reports, wrapping device.ErrInvalid, a workload whose victims do
// not name a slot of Initial or whose warm-up is longer than it.
func (w AllocWorkload) Check() error {
	if len(w.Initial) > 0 && len(w.Victims) != len(w.Sizes) {
		return fmt.Errorf("alloc workload: %d victims for %d sizes: %w", len(w.Victims), len(w.Sizes), device.ErrInvalid)
	}
	for i, v := range w.Victims {
		if len(w.Initial) > 0 && (v < 0 || v >= len(w.Initial)) {
			return fmt.Errorf("alloc workload: victim %d of pair %d outside the %d live slots: %w", v, i, len(w.Initial), device.ErrInvalid)
		}
	}
	if w.Warmup < 0 || w.Warmup > len(w.Sizes) {
		return fmt.Errorf("alloc workload: %d warm-up pairs of %d: %w", w.Warmup, len(w.Sizes), device.ErrInvalid)
	}
	return nil
}

// DriverAnchor is implemented by devices whose driver allocator memwall's
// pool is measured against (device/cuda, device/vulkan). The device hands
// out the bare allocator; bench owns the request streams and the clock.
type DriverAnchor interface {
	// DriverAllocator opens the driver's own allocator for the calling
	// goroutine: with async the stream-ordered one, on a stream of its
	// own (an error wrapping device.ErrUnsupported where the driver has
	// none). alloc returns a handle for a block of at least size bytes;
	// free gives one back. Both call the driver with no binding work
	// per call beyond the foreign call itself, and may be called only
	// from the goroutine that opened them until release, which waits for
	// the stream, returns the goroutine's OS thread and frees nothing:
	// blocks still held are the caller's to free first.
	DriverAllocator(async bool) (alloc func(size uint64) (uint64, error), free func(handle uint64) error, release func() error, err error)
}

// anchorPairTimes times each of w's timed pairs, its free and allocation
// together, with one clock read before and one after (no read between the
// two calls), the way bench measures memwall's pairs.
func anchorPairTimes(a DriverAnchor, w AllocWorkload, async bool) ([]time.Duration, error) {
	pairs, _, err := anchorTimes(a, w, async, false, 1)
	return pairs, err
}

// anchorBatchTimes times batches of batch pairs back to back with one
// clock read before and one after each batch, the way bench times
// memwall's batches; it returns one duration per whole batch.
func anchorBatchTimes(a DriverAnchor, w AllocWorkload, async bool, batch int) ([]time.Duration, error) {
	if batch < 1 {
		return nil, fmt.Errorf("anchor: batch of %d pairs: %w", batch, device.ErrInvalid)
	}
	ts, _, err := anchorTimes(a, w, async, false, batch)
	return ts, err
}

// anchorAllocTimes times, for each timed pair, the allocation and the free
// apart.
func anchorAllocTimes(a DriverAnchor, w AllocWorkload, async bool) (alloc, free []time.Duration, err error) {
	return anchorTimes(a, w, async, true, 1)
}

// anchorTimes runs w on the anchor's allocator, opened on this goroutine
// for the whole run, and frees every block still live at the end.
func anchorTimes(a DriverAnchor, w AllocWorkload, async, split bool, batch int) (alloc, free []time.Duration, err error) {
	if err := w.Check(); err != nil {
		return nil, nil, err
	}
	r, err := openAnchor(a, async, w.Initial)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if cerr := r.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	alloc, free, r.live, err = timePairs(w, r.alloc, r.free, r.live, time.Now, split, batch)
	return alloc, free, err
}

// anchorRun is the anchor's allocator opened on one goroutine, with the
// handles it holds live.
type anchorRun struct {
	alloc   func(size uint64) (uint64, error)
	free    func(handle uint64) error
	release func() error
	live    []uint64
}

// openAnchor opens the anchor's allocator (stream-ordered with async) on
// this goroutine and allocates the blocks of sizes initial; on an error
// it has freed them and released the allocator.
func openAnchor(a DriverAnchor, async bool, initial []uint64) (*anchorRun, error) {
	alloc, free, release, err := a.DriverAllocator(async)
	if err != nil {
		return nil, err
	}
	r := &anchorRun{alloc: alloc, free: free, release: release, live: make([]uint64, 0, len(initial))}
	for _, size := range initial {
		h, err := alloc(size)
		if err != nil {
			_ = r.close() // the allocation's error is the one to report
			return nil, err
		}
		r.live = append(r.live, h)
	}
	return r, nil
}

// close frees every block still live and releases the allocator; the
// first error is returned.
func (r *anchorRun) close() error {
	var err error
	for _, h := range r.live {
		if ferr := r.free(h); ferr != nil && err == nil {
			err = ferr
		}
	}
	r.live = nil
	if rerr := r.release(); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

// timePairs runs w's pairs over the working set live (empty when each
// block is freed at once) reading the clock now, and returns the times
// (see anchorTimes) and the working set as it stands: a slot whose
// replacement failed is dropped, so every handle returned is live.
func timePairs(w AllocWorkload, allocOne func(uint64) (uint64, error), freeOne func(uint64) error, live []uint64,
	now func() time.Time, split bool, batch int) (alloc, free []time.Duration, _ []uint64, err error) {
	alloc = make([]time.Duration, 0, len(w.Sizes))
	free = make([]time.Duration, 0, len(w.Sizes))
	var t0 time.Time
	for i, size := range w.Sizes {
		timed := i >= w.Warmup
		k := i - w.Warmup // index among the timed pairs
		if timed && k%batch == 0 {
			t0 = now()
		}
		var t1 time.Time
		if len(live) > 0 {
			// Free the victim, then allocate in its slot.
			v := w.Victims[i]
			if err := freeOne(live[v]); err != nil {
				return alloc, free, append(live[:v], live[v+1:]...), err
			}
			if split && timed {
				t1 = now()
			}
			h, err := allocOne(size)
			if err != nil {
				return alloc, free, append(live[:v], live[v+1:]...), err
			}
			live[v] = h
		} else {
			h, err := allocOne(size)
			if err != nil {
				return alloc, free, live, err
			}
			if split && timed {
				t1 = now()
			}
			if err := freeOne(h); err != nil {
				return alloc, free, live, err
			}
		}
		if !timed || (k+1)%batch != 0 {
			continue
		}
		t2 := now()
		switch {
		case split && len(live) > 0: // free first, then alloc
			free = append(free, t1.Sub(t0))
			alloc = append(alloc, t2.Sub(t1))
		case split:
			alloc = append(alloc, t1.Sub(t0))
			free = append(free, t2.Sub(t1))
		default:
			alloc = append(alloc, t2.Sub(t0))
		}
	}
	return alloc, free, live, nil
}

// fillRatios sets every row's VsAnchor: its batch p50 over the anchor row's
// (DriverAsync, or DriverVulkan, on one goroutine) of the same mix.
func (rep *AllocReport) fillRatios() {
	anchor := map[string]float64{}
	for _, r := range rep.Results {
		if (r.Allocator == DriverAsync || r.Allocator == DriverVulkan) && r.Goroutines == 1 && r.Live > 0 {
			anchor[r.Mix] = r.BatchP50ns
		}
	}
	for i := range rep.Results {
		r := &rep.Results[i]
		if a := anchor[r.Mix]; a > 0 && r.BatchP50ns > 0 {
			r.VsAnchor = r.BatchP50ns / a
		}
	}
}
