package engine

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/kernels"
)

// DefaultMappedGatherCost is what the plan charges a step for gathering a
// row of a mapped embedding table beyond the row's bytes over the link when
// Options.Gather holds no measurement: the latency of a first read of host
// memory from the device (a few microseconds on PCIe).
const DefaultMappedGatherCost = 5 * time.Microsecond

// GatherCost is MeasureGather's timing of the embedding gather a decode
// step queues, from mapped pinned host memory and from device memory. The
// zero value holds no measurement.
type GatherCost struct {
	// Host and Device are the median device time of one gather of one row
	// (one token's embedding) with the table in mapped host memory and in
	// device memory.
	Host   time.Duration `json:"host"`
	Device time.Duration `json:"device"`
	// RowBytes is the bytes of one row of the model's table; Gathers the
	// gathers of distinct rows queued back to back per timing, Reps the
	// timings each median is taken over.
	RowBytes uint64 `json:"row_bytes"`
	Gathers  int    `json:"gathers"`
	Reps     int    `json:"reps"`
}

// Measured reports whether g holds a measurement.
func (g GatherCost) Measured() bool { return g.Reps > 0 }

// Extra is what a step pays for reading its row over the link instead of
// from device memory: Host − Device, at least 0.
func (g GatherCost) Extra() time.Duration { return max(0, g.Host-g.Device) }

// gatherRows and gatherReps size MeasureGather: 64 distinct rows queued
// back to back (a step's gather depends on the step before it, so their
// latencies add), timed 7 times.
const (
	gatherRows = 64
	gatherReps = 7
)

// MeasureGather times, on stream st, the gather a decode step queues for
// m's embedding table (ks.Embed of one row of the table's dtype) with the
// table's rows in mapped pinned host memory (what a mapped table is read
// from: device.HostBuffer.DevicePtr) and in device memory, and returns the
// medians. Only the rows gathered are allocated, on d directly and freed
// before it returns; the data is zeros. A device that cannot read host
// memory in place (Info().CanMapHostMemory false, or HostMemory: its memory
// is the host's) fails with an error wrapping device.ErrUnsupported.
func MeasureGather(d device.Device, ks *kernels.Set, m *llama.Model, st device.Stream) (g GatherCost, err error) {
	info := d.Info()
	if !info.CanMapHostMemory || info.HostMemory {
		return g, fmt.Errorf("engine: gather cost on %s: host memory read in place: %w", info.Name, device.ErrUnsupported)
	}
	cfg := m.Config
	emb := m.Tensors.Embedding
	if cfg.Vocab <= 0 || emb.Bytes%uint64(cfg.Vocab) != 0 {
		return g, fmt.Errorf("engine: gather cost: embedding %s: %d bytes are not %d rows", emb.Name, emb.Bytes, cfg.Vocab)
	}
	g.RowBytes, g.Gathers, g.Reps = emb.Bytes/uint64(cfg.Vocab), gatherRows, gatherReps
	wdt := weightDType(emb.DType)
	if wdt == "" {
		return GatherCost{}, fmt.Errorf("engine: gather cost: embedding %s: dtype %s: not one the kernels gather", emb.Name, emb.DType)
	}
	tableBytes := g.RowBytes * gatherRows
	var frees []func() error
	defer func() {
		if serr := d.StreamSynchronize(st); serr != nil && err == nil {
			err = fmt.Errorf("engine: gather cost: %w", serr)
		}
		for _, f := range slices.Backward(frees) {
			if ferr := f(); ferr != nil && err == nil {
				err = fmt.Errorf("engine: gather cost: %w", ferr)
			}
		}
		if err != nil {
			g = GatherCost{}
		}
	}()
	hb, err := d.HostAlloc(tableBytes)
	if err != nil {
		return g, fmt.Errorf("engine: gather cost: host table: %w", err)
	}
	frees = append(frees, func() error { return d.HostFree(hb) })
	if hb.DevicePtr == 0 {
		return g, fmt.Errorf("engine: gather cost on %s: pinned memory not mapped: %w", info.Name, device.ErrUnsupported)
	}
	clear(hb.Bytes)
	alloc := func(n uint64) (device.Ptr, error) {
		p, err := d.Alloc(n)
		if err == nil {
			frees = append(frees, func() error { return d.Free(p) })
		}
		return p, err
	}
	table, err := alloc(tableBytes)
	if err != nil {
		return g, fmt.Errorf("engine: gather cost: device table: %w", err)
	}
	ids, err := alloc(4 * gatherRows)
	if err != nil {
		return g, fmt.Errorf("engine: gather cost: ids: %w", err)
	}
	out, err := alloc(4 * uint64(cfg.Hidden))
	if err != nil {
		return g, fmt.Errorf("engine: gather cost: output: %w", err)
	}
	idBytes := make([]byte, 4*gatherRows)
	for i := range gatherRows {
		idBytes[4*i] = byte(i) // little-endian int32 i < 256
	}
	if err := errors.Join(d.CopyHtoD(ids, idBytes, st), d.Memset8(table, 0, tableBytes, st)); err != nil {
		return g, fmt.Errorf("engine: gather cost: %w", err)
	}
	var evs [2]device.Event
	for i := range evs {
		if evs[i], err = d.NewEvent(true); err != nil {
			return g, fmt.Errorf("engine: gather cost: event: %w", err)
		}
		ev := evs[i]
		frees = append(frees, func() error { return d.DestroyEvent(ev) })
	}
	time1 := func(t device.Ptr) (time.Duration, error) {
		if err := d.EventRecord(evs[0], st); err != nil {
			return 0, err
		}
		for i := range gatherRows {
			if err := ks.Embed(t, wdt, ids+device.Ptr(4*i), out, 1, uint32(cfg.Hidden), st); err != nil {
				return 0, err
			}
		}
		if err := d.EventRecord(evs[1], st); err != nil {
			return 0, err
		}
		if err := d.EventSynchronize(evs[1]); err != nil {
			return 0, err
		}
		el, err := d.EventElapsed(evs[0], evs[1])
		return el / gatherRows, err
	}
	// One untimed pass of each loads the kernel and warms the paths.
	var hs, ds []time.Duration
	for rep := -1; rep < gatherReps; rep++ {
		h, err := time1(hb.DevicePtr)
		if err != nil {
			return g, fmt.Errorf("engine: gather cost: from host memory: %w", err)
		}
		dv, err := time1(table)
		if err != nil {
			return g, fmt.Errorf("engine: gather cost: from device memory: %w", err)
		}
		if rep >= 0 {
			hs, ds = append(hs, h), append(ds, dv)
		}
	}
	slices.Sort(hs)
	slices.Sort(ds)
	g.Host, g.Device = hs[len(hs)/2], ds[len(ds)/2]
	return g, nil
}

// Gather returns the gather cost the engine planned with (Options.Gather;
// the zero value when none was measured).
func (e *Engine) Gather() GatherCost { return e.opt.Gather }
