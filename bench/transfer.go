// Package bench measures what memwall's goals are stated against: the link
// between host and device (the physical limit of weight streaming) and the
// cost of allocation (memwall's pool against the driver's allocators).
// It returns numbers; cmd/memwall prints them.
package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/memwall/memwall/device"
)

// TransferOptions configure Transfer. Zero values take defaults.
type TransferOptions struct {
	// Bytes per copy (default 256 MiB).
	Bytes uint64
	// Reps is the number of timed copies per case (default 10), after one
	// untimed warm-up copy.
	Reps int
	// Progress, when set, is called after each case with its name.
	Progress func(done, total int, name string)
}

// TransferResult is one direction and host-memory kind.
type TransferResult struct {
	Name string  `json:"name"` // e.g. "h2d_pinned"
	Dir  string  `json:"direction"`
	Host string  `json:"host_memory,omitempty"` // pinned | pageable | "" for d2d
	Size uint64  `json:"bytes"`
	Reps int     `json:"reps"`
	GBps float64 `json:"GBps"` // median over reps, bytes copied / device time, 1e9 bytes/s
	Best float64 `json:"best_GBps"`
	// Worst is the slowest rep, to show stability.
	Worst float64 `json:"worst_GBps"`
}

// TransferReport is the whole measurement.
type TransferReport struct {
	Device  string           `json:"device"`
	Backend string           `json:"backend"`
	Results []TransferResult `json:"results"`
}

// Get returns the result with the given name, or false.
func (r TransferReport) Get(name string) (TransferResult, bool) {
	for _, x := range r.Results {
		if x.Name == name {
			return x, true
		}
	}
	return TransferResult{}, false
}

// Transfer measures H2D and D2H with pinned and pageable host memory and D2D,
// timing each copy with device events on one stream. Buffers hold random
// data (never zeros) and the last copy of each case is verified.
func Transfer(ctx context.Context, d device.Device, o TransferOptions) (TransferReport, error) {
	if o.Bytes == 0 {
		o.Bytes = 256 << 20
	}
	if o.Reps <= 0 {
		o.Reps = 10
	}
	info := d.Info()
	rep := TransferReport{Device: info.Name, Backend: info.Backend}
	n := o.Bytes
	s, err := d.NewStream()
	if err != nil {
		return rep, err
	}
	defer d.DestroyStream(s)
	e0, err := d.NewEvent(true)
	if err != nil {
		return rep, err
	}
	defer d.DestroyEvent(e0)
	e1, err := d.NewEvent(true)
	if err != nil {
		return rep, err
	}
	defer d.DestroyEvent(e1)

	dA, err := d.Alloc(n)
	if err != nil {
		return rep, fmt.Errorf("bench transfer: device buffer of %d bytes: %w", n, err)
	}
	defer d.Free(dA)
	dB, err := d.Alloc(n)
	if err != nil {
		return rep, fmt.Errorf("bench transfer: device buffer of %d bytes: %w", n, err)
	}
	defer d.Free(dB)
	pinned, err := d.HostAlloc(n)
	if err != nil {
		return rep, fmt.Errorf("bench transfer: pinned host buffer of %d bytes: %w", n, err)
	}
	defer d.HostFree(pinned)
	pageable := make([]byte, n)
	// Filling and copying hundreds of MiB takes a noticeable time on a loaded
	// host: look at ctx between slices of it, so an interrupt stops here too.
	const slice = 16 << 20
	r := rand.New(rand.NewPCG(1, 1^0x9e3779b97f4a7c15))
	for off := uint64(0); off < n; off += slice {
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("bench transfer: preparing %d bytes of data: 0 of %d copies: %w", n, o.Reps, err)
		}
		end := min(off+slice, n)
		fillFrom(pageable[off:end], r)
		copy(pinned.Bytes[off:end], pageable[off:end])
	}

	type tcase struct {
		name, dir, host string
		op              func() error
		check           func() error
	}
	back := make([]byte, n)
	verify := func(want []byte, what string) func() error {
		return func() error {
			if err := d.StreamSynchronize(s); err != nil {
				return err
			}
			for i := uint64(0); i < n; i += 4093 {
				if want[i] != back[i] {
					return fmt.Errorf("bench transfer: %s: data mismatch at byte %d", what, i)
				}
			}
			return nil
		}
	}
	readBack := func(src device.Ptr) func() error {
		return func() error { return d.CopyDtoH(back, src, s) }
	}
	cases := []tcase{
		{"h2d_pinned", "h2d", "pinned", func() error { return d.CopyHtoD(dA, pinned.Bytes, s) },
			func() error {
				if err := readBack(dA)(); err != nil {
					return err
				}
				return verify(pinned.Bytes, "h2d pinned")()
			}},
		{"h2d_pageable", "h2d", "pageable", func() error { return d.CopyHtoD(dB, pageable, s) },
			func() error {
				if err := readBack(dB)(); err != nil {
					return err
				}
				return verify(pageable, "h2d pageable")()
			}},
		{"d2h_pinned", "d2h", "pinned", func() error { return d.CopyDtoH(pinned.Bytes, dB, s) },
			func() error { copy(back, pinned.Bytes); return verify(pageable, "d2h pinned")() }},
		{"d2h_pageable", "d2h", "pageable", func() error { return d.CopyDtoH(back, dA, s) },
			func() error { return verify(pageable, "d2h pageable")() }},
		{"d2d", "d2d", "", func() error { return d.CopyDtoD(dB, dA, n, s) },
			func() error {
				if err := readBack(dB)(); err != nil {
					return err
				}
				return verify(pageable, "d2d")()
			}},
	}
	for ci, c := range cases {
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("bench transfer: %s: 0 of %d copies: %w", c.name, o.Reps, err)
		}
		if err := c.op(); err != nil { // warm-up
			return rep, fmt.Errorf("bench transfer: %s: %w", c.name, err)
		}
		times := make([]float64, 0, o.Reps)
		for r := 0; r < o.Reps; r++ {
			if err := ctx.Err(); err != nil {
				return rep, fmt.Errorf("bench transfer: %s: %d of %d copies: %w", c.name, r, o.Reps, err)
			}
			if err := d.EventRecord(e0, s); err != nil {
				return rep, err
			}
			if err := c.op(); err != nil {
				return rep, fmt.Errorf("bench transfer: %s: %w", c.name, err)
			}
			if err := d.EventRecord(e1, s); err != nil {
				return rep, err
			}
			if err := d.EventSynchronize(e1); err != nil {
				return rep, fmt.Errorf("bench transfer: %s: %w", c.name, err)
			}
			el, err := d.EventElapsed(e0, e1)
			if err != nil {
				return rep, err
			}
			if el <= 0 {
				el = time.Nanosecond
			}
			times = append(times, float64(n)/el.Seconds()/1e9)
		}
		if err := c.check(); err != nil {
			return rep, err
		}
		sort.Float64s(times)
		rep.Results = append(rep.Results, TransferResult{
			Name: c.name, Dir: c.dir, Host: c.host, Size: n, Reps: o.Reps,
			GBps: times[len(times)/2], Best: times[len(times)-1], Worst: times[0],
		})
		if o.Progress != nil {
			o.Progress(ci+1, len(cases), c.name)
		}
	}
	return rep, nil
}

// fillFrom fills b with bytes from r, eight per draw.
func fillFrom(b []byte, r *rand.Rand) {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		b[i], b[i+1], b[i+2], b[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		b[i+4], b[i+5], b[i+6], b[i+7] = byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
	}
	for ; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
}
