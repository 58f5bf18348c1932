package sim

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/memwall/memwall/device"
)

// hostRate returns the bandwidth for a copy between host slice b and the
// device in direction pinnedGBps.
func (d *Device) hostRate(b []byte, pinnedGBps float64) float64 {
	if !d.mem.isPinned(b) {
		return d.o.PageableGBps
	}
	if d.o.Integrated {
		return d.o.DeviceGBps / 2
	}
	return pinnedGBps
}

// CopyHtoD queues a copy of src to dst on s. src is read when the copy runs:
// it must stay unchanged until then. A dst range that is not writable device
// memory, or an unknown stream, fails at once with ErrInvalid; an empty src
// is a no-op.
func (d *Device) CopyHtoD(dst device.Ptr, src []byte, s device.Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	st, err := d.stream(s)
	if err != nil || len(src) == 0 {
		return err
	}
	n := uint64(len(src))
	if _, _, err := d.span(dst, n, true); err != nil {
		return fmt.Errorf("sim: copy host to device: %w", err)
	}
	dur := d.o.CopyLatency + transfer(n, d.hostRate(src, d.o.PinnedHtoDGBps))
	d.submit(st, &op{kind: opHtoD, dst: dst, host: src, n: n}, engHtoD, dur)
	return nil
}

// CopyDtoH queues a copy of len(dst) bytes at src into dst on s. dst is
// written when the copy runs (without Backing, never). An invalid src range
// or unknown stream fails at once with ErrInvalid; an empty dst is a no-op.
func (d *Device) CopyDtoH(dst []byte, src device.Ptr, s device.Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	st, err := d.stream(s)
	if err != nil || len(dst) == 0 {
		return err
	}
	n := uint64(len(dst))
	if _, _, err := d.span(src, n, false); err != nil {
		return fmt.Errorf("sim: copy device to host: %w", err)
	}
	dur := d.o.CopyLatency + transfer(n, d.hostRate(dst, d.o.PinnedDtoHGBps))
	d.submit(st, &op{kind: opDtoH, src: src, host: dst, n: n}, engDtoH, dur)
	return nil
}

// CopyDtoD queues a copy of n bytes from src to dst on s; either side may be
// host memory mapped into the device. Overlapping ranges give undefined
// contents, as in CUDA. Invalid ranges or an unknown stream fail at once with
// ErrInvalid; n == 0 is a no-op.
func (d *Device) CopyDtoD(dst, src device.Ptr, n uint64, s device.Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	st, err := d.stream(s)
	if err != nil || n == 0 {
		return err
	}
	if _, _, err := d.span(src, n, false); err != nil {
		return fmt.Errorf("sim: copy device to device (source): %w", err)
	}
	if _, _, err := d.span(dst, n, true); err != nil {
		return fmt.Errorf("sim: copy device to device (destination): %w", err)
	}
	var dur time.Duration
	srcHost, dstHost := d.kindAt(src) == kindHost, d.kindAt(dst) == kindHost
	switch {
	case d.o.Integrated || !srcHost && !dstHost:
		dur = transfer(2*n, d.o.DeviceGBps)
	case srcHost && dstHost:
		dur = transfer(n, min(d.o.PinnedHtoDGBps, d.o.PinnedDtoHGBps))
	case srcHost:
		dur = transfer(n, d.o.PinnedHtoDGBps)
	default:
		dur = transfer(n, d.o.PinnedDtoHGBps)
	}
	d.submit(st, &op{kind: opDtoD, dst: dst, src: src, n: n}, engCompute, d.o.CopyLatency+dur)
	return nil
}

// Memset8 queues setting n bytes at dst to v on s. Invalid ranges or an
// unknown stream fail at once with ErrInvalid; n == 0 is a no-op.
func (d *Device) Memset8(dst device.Ptr, v byte, n uint64, s device.Stream) error {
	return d.memset(opMemset8, dst, uint32(v)*0x01010101, n, s)
}

// Memset32 queues setting count 32-bit words at dst to v on s. dst must be
// 4-byte aligned; that, invalid ranges and unknown streams fail at once with
// ErrInvalid; count == 0 is a no-op.
func (d *Device) Memset32(dst device.Ptr, v uint32, count uint64, s device.Stream) error {
	if dst%4 != 0 {
		return fmt.Errorf("sim: memset32 at %#x: address not 4-byte aligned: %w", uint64(dst), device.ErrInvalid)
	}
	if count > (1<<64-1)/4 {
		return fmt.Errorf("sim: memset32 of %d words: too many: %w", count, device.ErrInvalid)
	}
	return d.memset(opMemset32, dst, v, 4*count, s)
}

func (d *Device) memset(kind opKind, dst device.Ptr, v uint32, n uint64, s device.Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	st, err := d.stream(s)
	if err != nil || n == 0 {
		return err
	}
	if _, _, err := d.span(dst, n, true); err != nil {
		return fmt.Errorf("sim: memset: %w", err)
	}
	dur := d.o.LaunchLatency + transfer(n, d.o.DeviceGBps)
	d.submit(st, &op{kind: kind, dst: dst, val: v, n: n}, engCompute, dur)
	return nil
}

// run executes a dequeued operation: moves the bytes and counts it.
func (d *Device) run(o *op) error {
	st := &d.stats
	busy := o.end - o.start
	switch o.eng {
	case engHtoD:
		st.HtoDBusy += busy
	case engDtoH:
		st.DtoHBusy += busy
	case engCompute:
		st.ComputeBusy += busy
	}
	switch o.kind {
	case opHtoD:
		st.Copies++
		st.HtoDBytes += o.n
		dst, _, err := d.span(o.dst, o.n, true)
		if err != nil {
			return fmt.Errorf("sim: copy host to device: %w", err)
		}
		src := o.host
		for _, p := range dst {
			src = src[copy(p, src):]
		}
	case opDtoH:
		st.Copies++
		st.DtoHBytes += o.n
		src, _, err := d.span(o.src, o.n, false)
		if err != nil {
			return fmt.Errorf("sim: copy device to host: %w", err)
		}
		dst := o.host
		for _, p := range src {
			dst = dst[copy(dst, p):]
		}
	case opDtoD:
		st.Copies++
		st.DtoDBytes += o.n
		src, _, err := d.span(o.src, o.n, false)
		if err != nil {
			return fmt.Errorf("sim: copy device to device (source): %w", err)
		}
		dst, _, err := d.span(o.dst, o.n, true)
		if err != nil {
			return fmt.Errorf("sim: copy device to device (destination): %w", err)
		}
		copyPieces(dst, src)
	case opMemset8, opMemset32:
		st.Memsets++
		st.MemsetBytes += o.n
		dst, _, err := d.span(o.dst, o.n, true)
		if err != nil {
			return fmt.Errorf("sim: memset: %w", err)
		}
		var pat [4]byte
		binary.LittleEndian.PutUint32(pat[:], o.val)
		phase := 0
		for _, p := range dst {
			fill(p, pat, phase)
			phase = (phase + len(p)) % 4
		}
	case opKernel:
		st.Kernels++
		return d.runKernel(o.launch)
	}
	return nil
}

// copyPieces copies the concatenation of src into that of dst (equal total
// lengths).
func copyPieces(dst, src [][]byte) {
	var a, b []byte
	for {
		if len(a) == 0 {
			if len(dst) == 0 {
				return
			}
			a, dst = dst[0], dst[1:]
		}
		if len(b) == 0 {
			if len(src) == 0 {
				return
			}
			b, src = src[0], src[1:]
		}
		k := copy(a, b)
		a, b = a[k:], b[k:]
	}
}

// fill sets b to the repeating 4-byte pattern pat, starting at pattern
// position phase.
func fill(b []byte, pat [4]byte, phase int) {
	if len(b) == 0 {
		return
	}
	if pat == [4]byte{} {
		clear(b)
		return
	}
	k := min(len(b), 4)
	for i := range k {
		b[i] = pat[(phase+i)%4]
	}
	for k < len(b) {
		k += copy(b[k:], b[:k])
	}
}
