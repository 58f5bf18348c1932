package residency

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/plan"
	"github.com/memwall/memwall/pool"
)

// prepareSource chooses and sets up the host side of the streamed copies.
func (r *Residency) prepareSource() error {
	if len(r.streamed) == 0 && !r.o.Live {
		r.source = Auto
		return nil
	}
	want := r.o.Source
	fits := func() bool {
		return r.host != nil && (r.o.HostBytes == 0 || r.sourcedBytes() <= r.o.HostBytes)
	}
	if want == Auto {
		switch {
		case r.d.Info().ReadOnlyHostRegister:
			want = Register
		case fits():
			want = Pinned
		default:
			want = Bounce
		}
	}
	if want == Register && len(r.registered) > 0 {
		r.source = Register // registered by placeInPlace or placeMapped
		return nil
	}
	if want == Register {
		err := r.register()
		if err == nil {
			r.source = Register
			return nil
		}
		if r.o.Source == Register {
			return err
		}
		r.log.Debug("residency: registering the mapped file failed, copying to pinned memory", "err", err)
		if uerr := r.unregister(); uerr != nil {
			return errors.Join(err, uerr)
		}
		want = Bounce
		if fits() {
			want = Pinned
		}
	}
	if want == Pinned {
		err := r.copyPinned()
		if err == nil {
			r.source = Pinned
			return nil
		}
		if r.o.Source == Pinned {
			return err
		}
		r.log.Debug("residency: pinned copy failed, using bounce buffers", "err", err)
		if ferr := r.freeHost(); ferr != nil {
			return errors.Join(err, ferr)
		}
	}
	r.source = Bounce
	return r.makeBounce()
}

// register page-locks, per file, the page-aligned range of the mapping
// that holds every extent, read-only, and points each streamed extent at
// it. The range covers the resident extents too: a copy whose source
// straddles the edge of a registered range (a resident tensor sharing a
// page with a streamed one) is refused by the driver (seen on the H200:
// CUDA_ERROR_INVALID_VALUE uploading model.norm.weight).
func (r *Residency) register() error {
	type span struct{ lo, hi uint64 }
	spans := map[string]*span{}
	for i := range r.groups {
		for _, e := range r.groups[i].plan.Extents {
			sp := spans[e.File]
			if sp == nil {
				sp = &span{lo: e.Offset, hi: e.Offset + e.Bytes}
				spans[e.File] = sp
			}
			sp.lo, sp.hi = min(sp.lo, e.Offset), max(sp.hi, e.Offset+e.Bytes)
		}
	}
	const page = 4096
	r.regPtr = map[string]regBase{}
	base := map[string][]byte{}
	baseOff := map[string]uint64{}
	for _, f := range slices.Sorted(maps.Keys(spans)) {
		sp := spans[f]
		// Whole pages where the mapping allows (the driver pins pages).
		lo := sp.lo / page * page
		b := r.m.Data(format.Tensor{File: f, Offset: lo, Bytes: alignUp(sp.hi, page) - lo})
		if b == nil {
			b = r.m.Data(format.Tensor{File: f, Offset: lo, Bytes: sp.hi - lo})
		}
		if b == nil {
			return fmt.Errorf("residency: %s: range [%d, %d) is not mapped", f, lo, sp.hi)
		}
		t0 := time.Now()
		hb, err := r.d.HostRegister(b, device.RegisterReadOnly|device.RegisterDeviceMap)
		if err != nil {
			return fmt.Errorf("residency: register %d bytes of %s read-only: %w", len(b), f, err)
		}
		r.log.Debug("residency: registered mapped file", "file", f, "bytes", len(b), "took", time.Since(t0))
		r.registered = append(r.registered, hb)
		r.stats.RegisteredBytes += uint64(len(b))
		base[f], baseOff[f] = hb.Bytes, lo
		r.regPtr[f] = regBase{ptr: hb.DevicePtr, off: lo}
	}
	for _, i := range r.sourced() {
		g := &r.groups[i]
		g.host = make([][]byte, len(g.plan.Extents))
		for j, e := range g.plan.Extents {
			off := e.Offset - baseOff[e.File]
			g.host[j] = base[e.File][off : off+e.Bytes : off+e.Bytes]
		}
	}
	return nil
}

func (r *Residency) unregister() error {
	var errs []error
	for _, hb := range r.registered {
		if err := r.d.HostFree(hb); err != nil {
			errs = append(errs, fmt.Errorf("residency: unregister: %w", err))
		}
	}
	r.registered = nil
	r.stats.RegisteredBytes = 0
	for _, i := range r.sourced() {
		r.groups[i].host = nil
	}
	return errors.Join(errs...)
}

// copyPinned copies every streamed group into a block of the host pool.
func (r *Residency) copyPinned() error {
	if r.host == nil {
		return errors.New("residency: a pinned copy needs a host pool")
	}
	if n := r.sourcedBytes(); r.o.HostBytes != 0 && n > r.o.HostBytes {
		return fmt.Errorf("residency: pinned copy of %d streamed bytes exceeds HostBytes %d", n, r.o.HostBytes)
	}
	for _, i := range r.sourced() {
		g := &r.groups[i]
		blk, err := r.host.Alloc(g.plan.Copy, pool.AllocOptions{Purpose: pool.Weights})
		if err != nil {
			return fmt.Errorf("residency: pinned copy of %s (%d bytes): %w", g.plan.Name, g.plan.Copy, err)
		}
		r.hostBlocks = append(r.hostBlocks, blk)
		r.stats.HostBytes += blk.Size
		dstAll := blk.Bytes()
		if uint64(len(dstAll)) < g.plan.Copy {
			return fmt.Errorf("residency: host pool block of %d bytes for %d: the host pool must be a pinned host pool (pool.NewHost)", len(dstAll), g.plan.Copy)
		}
		g.host = make([][]byte, len(g.plan.Extents))
		var off uint64
		for j, e := range g.plan.Extents {
			src, err := r.extentBytes(e)
			if err != nil {
				return err
			}
			dst := dstAll[off : off+e.Bytes : off+e.Bytes]
			parallelCopy(dst, src)
			g.host[j] = dst
			off += e.Bytes
		}
	}
	return nil
}

// freeHost gives back the host pool's blocks (pinned copy and bounce).
func (r *Residency) freeHost() error {
	var errs []error
	for _, b := range r.hostBlocks {
		if err := r.host.Free(b); err != nil {
			errs = append(errs, fmt.Errorf("residency: free pinned copy: %w", err))
		}
	}
	r.hostBlocks = nil
	for _, b := range r.bounce {
		if err := r.host.Free(b); err != nil {
			errs = append(errs, fmt.Errorf("residency: free bounce buffer: %w", err))
		}
	}
	r.bounce = nil
	r.stats.HostBytes = 0
	if r.source != Register {
		for _, i := range r.sourced() {
			r.groups[i].host = nil
		}
	}
	return errors.Join(errs...)
}

func (r *Residency) makeBounce() error {
	if r.host == nil {
		return errors.New("residency: bounce buffers need a host pool")
	}
	for range r.o.Bounces {
		b, err := r.host.Alloc(r.o.BounceBytes, pool.AllocOptions{Purpose: pool.Staging})
		if err != nil {
			return fmt.Errorf("residency: bounce buffer of %d bytes: %w", r.o.BounceBytes, err)
		}
		r.bounce = append(r.bounce, b)
		r.stats.HostBytes += b.Size
		if uint64(len(b.Bytes())) < r.o.BounceBytes {
			return fmt.Errorf("residency: host pool block of %d bytes for a bounce buffer: the host pool must be a pinned host pool (pool.NewHost)", len(b.Bytes()))
		}
		ev, err := r.newEvent(false)
		if err != nil {
			return err
		}
		r.bounceDone = append(r.bounceDone, ev)
	}
	return nil
}

// bounceCopy stages one extent through the bounce buffers: for each chunk
// the host waits until the buffer's previous copy is done, refills it from
// the mapping and queues its copy.
func (r *Residency) bounceCopy(dst device.Ptr, e plan.Extent) error {
	src, err := r.extentBytes(e)
	if err != nil {
		return err
	}
	for off := uint64(0); off < e.Bytes; off += r.o.BounceBytes {
		k := r.bounceNext % len(r.bounce)
		r.bounceNext++
		if err := r.d.EventSynchronize(r.bounceDone[k]); err != nil {
			return err
		}
		end := min(off+r.o.BounceBytes, e.Bytes)
		buf := r.bounce[k].Bytes()[:end-off]
		parallelCopy(buf, src[off:end])
		if err := r.d.CopyHtoD(dst.Add(off), buf, r.copyS); err != nil {
			return err
		}
		if err := r.d.EventRecord(r.bounceDone[k], r.copyS); err != nil {
			return err
		}
	}
	return nil
}

// sourced is the groups whose bytes need a host source: the streamed
// ones, or every group under Options.Live (any may stream later).
func (r *Residency) sourced() []int {
	if !r.o.Live {
		return r.streamed
	}
	all := make([]int, len(r.groups))
	for i := range all {
		all[i] = i
	}
	return all
}

// sourcedBytes is the bytes a pinned copy of the sourced groups takes.
func (r *Residency) sourcedBytes() uint64 {
	var n uint64
	for _, i := range r.sourced() {
		n += r.groups[i].plan.Copy
	}
	return n
}

// parallelCopy copies src into dst (same length) with a few goroutines:
// one core does not saturate memory bandwidth, and page faults on a fresh
// mapping are serialised per thread.
func parallelCopy(dst, src []byte) {
	const part = 32 << 20
	if len(src) <= part {
		copy(dst, src)
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for off := 0; off < len(src); off += part {
		end := min(off+part, len(src))
		sem <- struct{}{}
		wg.Go(func() {
			copy(dst[off:end], src[off:end])
			<-sem
		})
	}
	wg.Wait()
}

func alignUp(x, a uint64) uint64 { return (x + a - 1) / a * a }

// regBase is where a registered range of a file starts: its device
// address and its file offset.
type regBase struct {
	ptr device.Ptr
	off uint64
}

// placeInPlace, on a device whose memory is host memory
// (Info().HostMemory), registers the model's mapping read-only and points
// every resident tensor's view at its bytes there: nothing is allocated or
// copied for resident groups. When the mapping cannot be registered (a
// file read into memory rather than mapped, say) it undoes the
// registration, logs why, and leaves the resident groups to be copied.
func (r *Residency) placeInPlace() error {
	if !r.d.Info().HostMemory {
		return nil
	}
	if err := r.register(); err != nil {
		r.log.Debug("residency: using the mapped file in place failed, copying the resident groups", "err", err)
		r.regPtr = nil
		return r.unregister()
	}
	r.inPlace = true
	for i := range r.groups {
		g := &r.groups[i]
		if !g.resident {
			continue
		}
		for j, t := range g.plan.Tensors {
			b := r.regPtr[t.File]
			g.views[j].Ptr = b.ptr.Add(t.Offset - b.off)
		}
		for _, e := range g.plan.Extents {
			r.stats.InPlaceBytes += e.Bytes
		}
	}
	return nil
}

// placeMapped points the views of the plan's mapped groups
// (plan.WeightGroup.Mapped) at the model's mapping, registered read-only
// and mapped into the device, so that kernels read them in place over the
// link: no device memory, no copy. It needs the registration, hence the
// Register source (Auto chooses it) and a device that maps registered
// read-only memory; a device whose memory is host memory has every
// resident group in place already.
func (r *Residency) placeMapped() error {
	var mapped []int
	for i := range r.groups {
		if r.groups[i].plan.Mapped {
			mapped = append(mapped, i)
		}
	}
	if len(mapped) == 0 || r.inPlace {
		return nil
	}
	in := r.d.Info()
	switch {
	case r.o.Source != Auto && r.o.Source != Register:
		return fmt.Errorf("residency: group %s is mapped (read in place from host memory), which needs the %s source, not %s",
			r.groups[mapped[0]].plan.Name, Register, r.o.Source)
	case !in.ReadOnlyHostRegister || !in.CanMapHostMemory:
		return fmt.Errorf("residency: group %s is mapped (read in place from host memory), which the %s device cannot do (read-only register %v, map host memory %v)",
			r.groups[mapped[0]].plan.Name, in.Backend, in.ReadOnlyHostRegister, in.CanMapHostMemory)
	}
	if err := r.register(); err != nil {
		return err
	}
	for _, i := range mapped {
		g := &r.groups[i]
		for j, t := range g.plan.Tensors {
			b := r.regPtr[t.File]
			if b.ptr == 0 {
				return fmt.Errorf("residency: group %s is mapped but the registered %s has no device address", g.plan.Name, t.File)
			}
			g.views[j].Ptr = b.ptr.Add(t.Offset - b.off)
		}
		for _, e := range g.plan.Extents {
			r.stats.MappedBytes += e.Bytes
		}
	}
	return nil
}
