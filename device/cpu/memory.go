package cpu

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"unsafe"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cpu/hostmath"
)

type regionKind uint8

const (
	kindAlloc      regionKind = iota // Alloc: anonymous pages
	kindPinned                       // HostAlloc: anonymous pages
	kindRegistered                   // HostRegister: the caller's memory
)

func (k regionKind) String() string {
	switch k {
	case kindAlloc:
		return "allocation"
	case kindPinned:
		return "pinned host buffer"
	}
	return "registered host memory"
}

// region is one range of host memory the device hands out or was given.
type region struct {
	kind     regionKind
	start    device.Ptr
	buf      []byte // exactly the addressable bytes
	mapping  []byte // what to unmap (Alloc, HostAlloc), page-rounded
	readOnly bool
	hb       *device.HostBuffer
}

func (r *region) end() device.Ptr { return r.start + device.Ptr(len(r.buf)) }

// memory is the table of regions, sorted by start; its lock is separate
// from the device's so that kernels looking up addresses do not wait for
// calls that queue work.
type memory struct {
	mu      sync.RWMutex
	regions []*region
	used    uint64 // bytes counted against TotalBytes
}

const pageSize = 4096

func addr(b []byte) device.Ptr { return device.Ptr(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

// find returns the region holding [p, p+n), or an error naming the range.
func (m *memory) find(p device.Ptr, n uint64) (*region, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.findLocked(p, n)
}

func (m *memory) findLocked(p device.Ptr, n uint64) (*region, error) {
	i := sort.Search(len(m.regions), func(i int) bool { return m.regions[i].start > p })
	if i > 0 {
		r := m.regions[i-1]
		if off := uint64(p - r.start); off < uint64(len(r.buf)) && n <= uint64(len(r.buf))-off {
			return r, nil
		}
		if off := uint64(p - r.start); off < uint64(len(r.buf)) {
			return nil, fmt.Errorf("cpu: %d bytes at %#x run past the end of the %d-byte %s at %#x: %w",
				n, uint64(p), len(r.buf), r.kind, uint64(r.start), device.ErrInvalid)
		}
	}
	return nil, fmt.Errorf("cpu: address %#x (%d bytes) is in no allocation or registered host memory: %w", uint64(p), n, device.ErrInvalid)
}

// bytes returns the n bytes at p, the memory itself. write refuses
// read-only memory.
func (m *memory) bytes(p device.Ptr, n uint64, write bool) ([]byte, error) {
	if n == 0 {
		return []byte{}, nil
	}
	r, err := m.find(p, n)
	if err != nil {
		return nil, err
	}
	if write && r.readOnly {
		return nil, fmt.Errorf("cpu: %d bytes at %#x are read-only registered memory: %w", n, uint64(p), device.ErrInvalid)
	}
	off := uint64(p - r.start)
	return r.buf[off : off+n : off+n], nil
}

func (m *memory) insert(r *region) {
	m.mu.Lock()
	defer m.mu.Unlock()
	i := sort.Search(len(m.regions), func(i int) bool { return m.regions[i].start >= r.start })
	m.regions = slices.Insert(m.regions, i, r)
}

// overlaps reports whether [p, p+n) meets a region.
func (m *memory) overlaps(p device.Ptr, n uint64) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	i := sort.Search(len(m.regions), func(i int) bool { return m.regions[i].end() > p })
	return i < len(m.regions) && uint64(m.regions[i].start) < uint64(p)+n
}

// remove takes the region starting at p out of the table when match
// accepts it, and returns it (nil when none).
func (m *memory) remove(p device.Ptr, match func(*region) bool) *region {
	m.mu.Lock()
	defer m.mu.Unlock()
	i := sort.Search(len(m.regions), func(i int) bool { return m.regions[i].start >= p })
	if i == len(m.regions) || m.regions[i].start != p || !match(m.regions[i]) {
		return nil
	}
	r := m.regions[i]
	m.regions = slices.Delete(m.regions, i, i+1)
	return r
}

// MemInfo returns free = TotalBytes less what Alloc and HostAlloc hold, and
// TotalBytes. It does not read the host's free memory: other processes'
// use is not subtracted.
func (d *Device) MemInfo() (free, total uint64, err error) {
	if err := d.enter(); err != nil {
		return 0, 0, err
	}
	defer d.mu.Unlock()
	return d.free(), d.o.TotalBytes, nil
}

func (d *Device) free() uint64 {
	d.mem.mu.RLock()
	defer d.mem.mu.RUnlock()
	return d.o.TotalBytes - min(d.mem.used, d.o.TotalBytes)
}

// take maps size bytes of anonymous pages counted against TotalBytes.
func (d *Device) take(what string, size uint64) ([]byte, []byte, error) {
	if size == 0 {
		return nil, nil, fmt.Errorf("cpu: %s of 0 bytes: %w", what, device.ErrInvalid)
	}
	pages := (size + pageSize - 1) / pageSize * pageSize
	// The bytes are counted before the mapping, so that concurrent calls
	// never take more than TotalBytes together.
	d.mem.mu.Lock()
	free := d.o.TotalBytes - min(d.mem.used, d.o.TotalBytes)
	if size > 1<<62 || pages > free {
		d.mem.mu.Unlock()
		return nil, nil, fmt.Errorf("cpu: %s of %d bytes: %w (%d of %d bytes free)", what, size, device.ErrOutOfMemory, free, d.o.TotalBytes)
	}
	d.mem.used += pages
	d.mem.mu.Unlock()
	b, err := mapAnon(int(pages))
	if err != nil {
		d.mem.mu.Lock()
		d.mem.used -= pages
		d.mem.mu.Unlock()
		return nil, nil, fmt.Errorf("cpu: %s of %d bytes: mmap: %v: %w", what, size, err, device.ErrOutOfMemory)
	}
	if d.o.Pages != PagesLazy && len(b) >= hugeBytes {
		adviseHuge(b)
	}
	return b[:size:size], b, nil
}

func (d *Device) give(r *region) error {
	err := unmap(r.mapping)
	d.mem.mu.Lock()
	d.mem.used -= uint64(len(r.mapping))
	d.mem.mu.Unlock()
	if err != nil {
		return fmt.Errorf("cpu: munmap of the %s at %#x: %v", r.kind, uint64(r.start), err)
	}
	return nil
}

// Alloc maps size bytes of anonymous host memory, page-aligned, counted
// against TotalBytes in whole pages; the bytes past size are not
// addressable. Alloc(0) fails with ErrInvalid, a size above the free bytes
// with ErrOutOfMemory.
func (d *Device) Alloc(size uint64) (device.Ptr, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	d.mu.Unlock()
	b, m, err := d.take("alloc", size)
	if err != nil {
		return 0, err
	}
	r := &region{kind: kindAlloc, start: addr(b), buf: b, mapping: m}
	d.mem.insert(r)
	return r.start, nil
}

// Free waits for the work queued on every stream, then unmaps an
// allocation. Any address but one Alloc returned fails with ErrInvalid.
func (d *Device) Free(p device.Ptr) error {
	if err := d.enter(); err != nil {
		return err
	}
	d.mu.Unlock()
	if p == 0 {
		return fmt.Errorf("cpu: free of the null pointer: %w", device.ErrInvalid)
	}
	if r, err := d.mem.find(p, 1); err != nil || r.start != p || r.kind != kindAlloc {
		return fmt.Errorf("cpu: free of %#x: not the start of an allocation: %w", uint64(p), device.ErrInvalid)
	}
	d.idle()
	r := d.mem.remove(p, func(r *region) bool { return r.kind == kindAlloc })
	if r == nil {
		return fmt.Errorf("cpu: free of %#x: not the start of an allocation: %w", uint64(p), device.ErrInvalid)
	}
	return d.give(r)
}

// HostAlloc maps size bytes of anonymous host memory; its DevicePtr is
// its address (the device reads host memory directly). It counts against
// TotalBytes.
func (d *Device) HostAlloc(size uint64) (*device.HostBuffer, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	d.mu.Unlock()
	b, m, err := d.take("host alloc", size)
	if err != nil {
		return nil, err
	}
	hb := &device.HostBuffer{Bytes: b, DevicePtr: addr(b), Kind: device.HostPinned}
	d.mem.insert(&region{kind: kindPinned, start: hb.DevicePtr, buf: b, mapping: m, hb: hb})
	return hb, nil
}

// HostRegister records b (which must stay valid until HostFree) as
// memory kernels and copies may address at DevicePtr, b's own address;
// nothing is copied or locked. Unless Options.Pages is PagesLazy, b's
// pages are mapped into the process before it returns (see Pages), so that
// no product faults them in later. RegisterReadOnly makes the device
// refuse to write it. A range overlapping memory already known fails with
// ErrInvalid.
func (d *Device) HostRegister(b []byte, flags device.RegisterFlags) (*device.HostBuffer, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	d.mu.Unlock()
	if len(b) == 0 {
		return nil, fmt.Errorf("cpu: register of 0 bytes: %w", device.ErrInvalid)
	}
	p := addr(b)
	if d.mem.overlaps(p, uint64(len(b))) {
		return nil, fmt.Errorf("cpu: register of %d bytes at %#x: overlaps memory already allocated or registered: %w", len(b), uint64(p), device.ErrInvalid)
	}
	prepareRegistered(b, d.o.Pages, d.o.Workers)
	hb := &device.HostBuffer{Bytes: b, DevicePtr: p, Kind: device.HostRegistered}
	d.mem.insert(&region{kind: kindRegistered, start: p, buf: b[:len(b):len(b)], readOnly: flags&device.RegisterReadOnly != 0, hb: hb})
	return hb, nil
}

// HostFree waits for the work queued on every stream, then unmaps a
// HostAlloc'd buffer or forgets a registered one (leaving its memory
// alone). A buffer the device did not hand out fails with ErrInvalid.
func (d *Device) HostFree(b *device.HostBuffer) error {
	if err := d.enter(); err != nil {
		return err
	}
	d.mu.Unlock()
	if b == nil || len(b.Bytes) == 0 {
		return fmt.Errorf("cpu: host free of an empty buffer: %w", device.ErrInvalid)
	}
	mine := func(r *region) bool { return r.hb == b }
	if r, err := d.mem.find(addr(b.Bytes), 1); err != nil || !mine(r) {
		return fmt.Errorf("cpu: host free of %d bytes at %#x: not a buffer of this device: %w", len(b.Bytes), uint64(addr(b.Bytes)), device.ErrInvalid)
	}
	d.idle()
	r := d.mem.remove(addr(b.Bytes), mine)
	if r == nil {
		return fmt.Errorf("cpu: host free of %d bytes at %#x: not a buffer of this device: %w", len(b.Bytes), uint64(addr(b.Bytes)), device.ErrInvalid)
	}
	if r.kind == kindRegistered {
		return nil
	}
	return d.give(r)
}

// Reserve and the rest of device.VirtualMemory are not implemented: they
// fail with ErrUnsupported.
func (d *Device) Reserve(size uint64) (device.Ptr, error) { return 0, errNoVM("reserve") }

// Unreserve fails with ErrUnsupported.
func (d *Device) Unreserve(device.Ptr, uint64) error { return errNoVM("unreserve") }

// CreatePhysical fails with ErrUnsupported.
func (d *Device) CreatePhysical(uint64) (device.PhysMem, error) { return 0, errNoVM("create physical") }

// ReleasePhysical fails with ErrUnsupported.
func (d *Device) ReleasePhysical(device.PhysMem) error { return errNoVM("release physical") }

// Map fails with ErrUnsupported.
func (d *Device) Map(device.Ptr, uint64, device.PhysMem) error { return errNoVM("map") }

// Unmap fails with ErrUnsupported.
func (d *Device) Unmap(device.Ptr, uint64) error { return errNoVM("unmap") }

func errNoVM(op string) error {
	return fmt.Errorf("cpu: %s: virtual memory is not implemented on the CPU device: %w", op, device.ErrUnsupported)
}

// Mem gives a kernel the device's memory and workers. It is valid only
// during the Run call it was passed to.
type Mem struct{ d *Device }

// Bytes returns the n bytes at p: the memory itself, to read (a write to
// read-only registered memory faults, which fails the launch when it
// happens on the stream's goroutine; a kernel's outputs come from
// Writable). A range
// outside the device's allocations and registrations fails with ErrInvalid
// naming it.
func (m *Mem) Bytes(p device.Ptr, n uint64) ([]byte, error) { return m.d.mem.bytes(p, n, false) }

// Writable is Bytes for memory the kernel writes: read-only registered
// memory fails with ErrInvalid instead of faulting.
func (m *Mem) Writable(p device.Ptr, n uint64) ([]byte, error) { return m.d.mem.bytes(p, n, true) }

// Runner returns the workers a kernel may split its work over. A kernel
// must not call Run from inside a part of it.
func (m *Mem) Runner() *hostmath.Runner { return m.d.runner }

// Math returns the variant of hostmath's kernels the device runs.
func (m *Mem) Math() *hostmath.Kernels { return m.d.math }
