package sim

import (
	"fmt"
	"slices"
	"sort"
	"unsafe"

	"github.com/memwall/memwall/device"
)

// The simulated address space: [addrBase, addrLimit).
const (
	addrBase  = device.Ptr(0x7f0000000000)
	addrLimit = addrBase + 1<<47
	// allocAlign is the alignment of Alloc and of host-mapped buffers (CUDA
	// guarantees 256; 512 like its allocator in practice).
	allocAlign = 512
)

type regionKind uint8

const (
	kindAlloc   regionKind = iota // from Alloc
	kindHost                      // host memory mapped into the device
	kindReserve                   // a virtual-memory reservation
)

func (k regionKind) String() string {
	switch k {
	case kindAlloc:
		return "allocation"
	case kindHost:
		return "host-mapped buffer"
	default:
		return "reservation"
	}
}

// region is one range of the simulated address space.
type region struct {
	kind   regionKind
	start  device.Ptr
	size   uint64 // addressable bytes
	charge uint64 // bytes counted against the device (allocations)
	backed        // backing bytes: made at first use for allocations, the host slice for kindHost
	// readOnly marks host memory the device must not write.
	readOnly bool
	maps     []*mapping // kindReserve: sorted by off
}

func (r *region) end() device.Ptr { return r.start + device.Ptr(r.size) }

// mapping is a physical chunk mapped at offset off of a reservation.
type mapping struct {
	off   uint64
	chunk *chunk
}

// chunk is physical memory created for virtual mapping.
type chunk struct {
	size     uint64
	backed        // made at first use
	maps     int  // live mappings
	released bool // ReleasePhysical was called; freed at the last unmap
}

// hostBuf is a pinned host buffer: HostAlloc'd or registered.
type hostBuf struct {
	addr   uintptr // address of b[0]
	b      []byte
	kind   device.HostMemoryKind
	region *region // device alias, or nil
}

// memory is the simulator's memory state, guarded by Device.mu.
type memory struct {
	regions  []*region // sorted by start
	next     device.Ptr
	allocs   map[device.Ptr]*region
	reserves map[device.Ptr]*region
	chunks   map[device.PhysMem]*chunk
	host     []*hostBuf // sorted by addr
	// charges
	allocated, physical, pinned uint64
}

func (m *memory) init() {
	m.next = addrBase
	m.allocs = map[device.Ptr]*region{}
	m.reserves = map[device.Ptr]*region{}
	m.chunks = map[device.PhysMem]*chunk{}
}

func alignUp(v, a uint64) uint64 { return (v + a - 1) &^ (a - 1) }

// find returns the region containing p, or nil.
func (m *memory) find(p device.Ptr) (*region, int) {
	i := sort.Search(len(m.regions), func(i int) bool { return m.regions[i].start > p })
	if i == 0 {
		return nil, -1
	}
	r := m.regions[i-1]
	if uint64(p-r.start) < r.size {
		return r, i - 1
	}
	return nil, -1
}

// fits reports whether [p, p+size) is free address space, and where a region
// there would be inserted.
func (m *memory) fits(p device.Ptr, size uint64) (int, bool) {
	if p < addrBase || p > addrLimit || uint64(addrLimit-p) < size {
		return 0, false
	}
	i := sort.Search(len(m.regions), func(i int) bool { return m.regions[i].start >= p })
	if i > 0 && m.regions[i-1].end() > p {
		return i, false
	}
	if i < len(m.regions) && uint64(m.regions[i].start-p) < size {
		return i, false
	}
	return i, true
}

// place inserts r at a free, aligned address (next fit, wrapping around):
// addresses are not reused until the space has been gone through once, so a
// stale pointer usually hits unmapped memory.
func (m *memory) place(r *region, align uint64) error {
	if r.size > uint64(addrLimit-addrBase) {
		return fmt.Errorf("sim: %d bytes exceed the %d-byte address space: %w", r.size, uint64(addrLimit-addrBase), device.ErrOutOfMemory)
	}
	p := device.Ptr(alignUp(uint64(m.next), align))
	i, ok := m.fits(p, r.size)
	if !ok {
		p = device.Ptr(alignUp(uint64(addrBase), align))
		for i = 0; i < len(m.regions); i++ {
			if m.regions[i].start >= p && uint64(m.regions[i].start-p) >= r.size {
				break
			}
			if e := m.regions[i].end(); e > p {
				p = device.Ptr(alignUp(uint64(e), align))
			}
		}
		if p > addrLimit || uint64(addrLimit-p) < r.size {
			return fmt.Errorf("sim: no free %d-byte range of address space: %w", r.size, device.ErrOutOfMemory)
		}
	}
	r.start = p
	m.regions = slices.Insert(m.regions, i, r)
	m.next = r.end()
	return nil
}

func (m *memory) remove(r *region) {
	_, i := m.find(r.start)
	if i >= 0 && m.regions[i] == r {
		m.regions = slices.Delete(m.regions, i, i+1)
	}
}

// free returns the free device memory.
func (d *Device) free() uint64 {
	used := d.mem.allocated + d.mem.physical
	if d.o.Integrated {
		used += d.mem.pinned
	}
	if used >= d.o.TotalBytes {
		return 0
	}
	return d.o.TotalBytes - used
}

// checkRoom fails with ErrOutOfMemory when n bytes do not fit in the free
// device memory.
func (d *Device) checkRoom(what string, n uint64) error {
	if f := d.free(); n > f {
		return fmt.Errorf("sim: %s %d bytes: %w (%d of %d bytes free)", what, n, device.ErrOutOfMemory, f, d.o.TotalBytes)
	}
	return nil
}

// MemInfo returns free = TotalBytes − allocations − physical chunks (− pinned
// host memory on an integrated device), and TotalBytes.
func (d *Device) MemInfo() (free, total uint64, err error) {
	if err := d.enter(); err != nil {
		return 0, 0, err
	}
	defer d.mu.Unlock()
	return d.free(), d.o.TotalBytes, nil
}

// Alloc returns size bytes of device memory aligned to 512 bytes; the
// allocation counts against the device rounded up to 512 bytes. Addresses
// past size (even in the rounding) are not accessible. It fails with
// ErrInvalid for size 0 and ErrOutOfMemory, naming the free and total bytes,
// when the device has no room.
func (d *Device) Alloc(size uint64) (device.Ptr, error) {
	if size == 0 {
		return 0, fmt.Errorf("sim: alloc of 0 bytes: %w", device.ErrInvalid)
	}
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	if size > d.o.TotalBytes {
		return 0, d.checkRoom("alloc", size)
	}
	charge := alignUp(size, allocAlign)
	if err := d.checkRoom("alloc", charge); err != nil {
		return 0, err
	}
	r := &region{kind: kindAlloc, size: size, charge: charge}
	if err := d.mem.place(r, allocAlign); err != nil {
		return 0, fmt.Errorf("sim: alloc %d bytes: %w", size, err)
	}
	d.mem.allocs[r.start] = r
	d.mem.allocated += charge
	d.stats.AllocCalls++
	d.stats.DriverTime += d.o.AllocLatency
	return r.start, nil
}

// Free releases an allocation from Alloc after running all queued work. A
// pointer that is not the start of a live allocation fails with ErrInvalid.
func (d *Device) Free(p device.Ptr) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	r := d.mem.allocs[p]
	if r == nil {
		if in, _ := d.mem.find(p); in != nil {
			return fmt.Errorf("sim: free %#x: inside the %s at %#x, not its start: %w", uint64(p), in.kind, uint64(in.start), device.ErrInvalid)
		}
		return fmt.Errorf("sim: free %#x: not an allocation (already freed, or never allocated): %w", uint64(p), device.ErrInvalid)
	}
	d.drain()
	d.mem.remove(r)
	delete(d.mem.allocs, p)
	d.mem.allocated -= r.charge
	r.drop()
	d.stats.FreeCalls++
	d.stats.DriverTime += d.o.FreeLatency
	return nil
}

// hostAddr is the address of b's first byte, for pinned-range lookups (the
// Go heap does not move objects; the address is never dereferenced).
func hostAddr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// hostIndex returns the index of the pinned buffer containing address a, or -1.
func (m *memory) hostIndex(a uintptr) int {
	i := sort.Search(len(m.host), func(i int) bool { return m.host[i].addr > a })
	if i == 0 {
		return -1
	}
	h := m.host[i-1]
	if a-h.addr < uintptr(len(h.b)) {
		return i - 1
	}
	return -1
}

// isPinned reports whether b lies wholly inside one pinned buffer.
func (m *memory) isPinned(b []byte) bool {
	a := hostAddr(b)
	i := m.hostIndex(a)
	if i < 0 {
		return false
	}
	h := m.host[i]
	return a-h.addr+uintptr(len(b)) <= uintptr(len(h.b))
}

// addHost records a pinned buffer, mapping it into the device when asked.
func (d *Device) addHost(b []byte, kind device.HostMemoryKind, mapped, readOnly bool) (*device.HostBuffer, error) {
	h := &hostBuf{addr: hostAddr(b), b: b, kind: kind}
	if mapped {
		r := &region{kind: kindHost, size: uint64(len(b)), backed: backed{buf: b}, readOnly: readOnly}
		if err := d.mem.place(r, allocAlign); err != nil {
			return nil, err
		}
		h.region = r
	}
	i := sort.Search(len(d.mem.host), func(i int) bool { return d.mem.host[i].addr > h.addr })
	d.mem.host = slices.Insert(d.mem.host, i, h)
	hb := &device.HostBuffer{Bytes: b, Kind: kind}
	if h.region != nil {
		hb.DevicePtr = h.region.start
	}
	d.stats.AllocCalls++
	d.stats.DriverTime += d.o.AllocLatency
	return hb, nil
}

// HostAlloc returns size bytes of zeroed host memory (a Go slice, real even
// without Backing) that copies treat as pinned. When the device can map host
// memory, DevicePtr aliases it for kernels and device-to-device copies. It
// fails with ErrInvalid for size 0 and ErrOutOfMemory beyond
// Options.HostBytes in total (or, on an integrated device, beyond the free
// device memory).
func (d *Device) HostAlloc(size uint64) (*device.HostBuffer, error) {
	if size == 0 {
		return nil, fmt.Errorf("sim: host alloc of 0 bytes: %w", device.ErrInvalid)
	}
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	if size > d.o.HostBytes || d.mem.pinned > d.o.HostBytes-size {
		return nil, fmt.Errorf("sim: pinned host alloc %d bytes: %w (%d of the %d-byte pinned host limit in use)",
			size, device.ErrOutOfMemory, d.mem.pinned, d.o.HostBytes)
	}
	if d.o.Integrated {
		if err := d.checkRoom("pinned host alloc", size); err != nil {
			return nil, err
		}
	}
	hb, err := d.addHost(make([]byte, size), device.HostPinned, d.o.CanMapHostMemory, false)
	if err != nil {
		return nil, fmt.Errorf("sim: pinned host alloc %d bytes: %w", size, err)
	}
	d.mem.pinned += size
	return hb, nil
}

// HostRegister treats b as pinned. With RegisterDeviceMap (and
// CanMapHostMemory) DevicePtr aliases b; with RegisterReadOnly the device
// may only read it, and an operation writing it fails. RegisterReadOnly on a
// device without ReadOnlyHostRegister fails with ErrUnsupported; an empty b,
// unknown flags, or memory overlapping a buffer already pinned fail with
// ErrInvalid. The simulator cannot tell whether b is really read-only
// memory: registering a PROT_READ mapping without RegisterReadOnly is
// accepted here (CUDA rejects it).
func (d *Device) HostRegister(b []byte, flags device.RegisterFlags) (*device.HostBuffer, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("sim: host register of an empty buffer: %w", device.ErrInvalid)
	}
	if flags&^(device.RegisterDeviceMap|device.RegisterReadOnly) != 0 {
		return nil, fmt.Errorf("sim: host register: unknown flags %#x: %w", uint32(flags), device.ErrInvalid)
	}
	if flags&device.RegisterReadOnly != 0 && !d.o.ReadOnlyHostRegister {
		return nil, fmt.Errorf("sim: read-only host register: %w", device.ErrUnsupported)
	}
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.mu.Unlock()
	a := hostAddr(b)
	i := sort.Search(len(d.mem.host), func(i int) bool { return d.mem.host[i].addr+uintptr(len(d.mem.host[i].b)) > a })
	if i < len(d.mem.host) && d.mem.host[i].addr < a+uintptr(len(b)) {
		return nil, fmt.Errorf("sim: host register %d bytes at %#x: overlaps a buffer already pinned at %#x: %w",
			len(b), a, d.mem.host[i].addr, device.ErrInvalid)
	}
	mapped := flags&device.RegisterDeviceMap != 0 && d.o.CanMapHostMemory
	hb, err := d.addHost(b, device.HostRegistered, mapped, flags&device.RegisterReadOnly != 0)
	if err != nil {
		return nil, fmt.Errorf("sim: host register %d bytes: %w", len(b), err)
	}
	return hb, nil
}

// HostFree runs all queued work, then frees a HostAlloc'd buffer or
// unregisters a registered one (whose memory the caller keeps). Its Bytes
// must not be used afterwards. A buffer this device did not hand out fails
// with ErrInvalid.
func (d *Device) HostFree(b *device.HostBuffer) error {
	if b == nil || len(b.Bytes) == 0 {
		return fmt.Errorf("sim: host free of an empty buffer: %w", device.ErrInvalid)
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	a := hostAddr(b.Bytes)
	i := d.mem.hostIndex(a)
	if i < 0 || d.mem.host[i].addr != a {
		return fmt.Errorf("sim: host free %#x: not a buffer this device allocated or registered: %w", a, device.ErrInvalid)
	}
	h := d.mem.host[i]
	d.drain()
	d.mem.host = slices.Delete(d.mem.host, i, i+1)
	if h.region != nil {
		d.mem.remove(h.region)
		h.region.buf = nil
	}
	if h.kind == device.HostPinned {
		d.mem.pinned -= uint64(len(h.b))
	}
	d.stats.FreeCalls++
	d.stats.DriverTime += d.o.FreeLatency
	return nil
}

// span resolves [p, p+n) into the backing byte ranges it covers, in order.
// Without Backing it only checks the range and returns no pieces. write
// rejects read-only host memory; ro reports whether any piece is read-only.
// Errors wrap ErrInvalid and name the address.
func (d *Device) span(p device.Ptr, n uint64, write bool) (pieces [][]byte, ro bool, err error) {
	if n == 0 {
		return nil, false, nil
	}
	if uint64(p)+n < uint64(p) {
		return nil, false, fmt.Errorf("sim: range %#x+%d wraps around the address space: %w", uint64(p), n, device.ErrInvalid)
	}
	r, _ := d.mem.find(p)
	if r == nil {
		return nil, false, fmt.Errorf("sim: address %#x is not mapped: %w", uint64(p), device.ErrInvalid)
	}
	off := uint64(p - r.start)
	if n > r.size-off {
		return nil, false, fmt.Errorf("sim: range %#x+%d crosses the end of the %d-byte %s at %#x: %w",
			uint64(p), n, r.size, r.kind, uint64(r.start), device.ErrInvalid)
	}
	backing := d.o.Backing
	switch r.kind {
	case kindAlloc, kindHost:
		if write && r.readOnly {
			return nil, true, fmt.Errorf("sim: device write to read-only host memory at %#x: %w", uint64(p), device.ErrInvalid)
		}
		if !backing {
			return nil, r.readOnly, nil
		}
		buf := r.bytes(r.size) // a host-mapped buffer's is its slice
		return [][]byte{buf[off : off+n : off+n]}, r.readOnly, nil
	}
	// A reservation: walk its mappings.
	i := sort.Search(len(r.maps), func(i int) bool { return r.maps[i].off+r.maps[i].chunk.size > off })
	for n > 0 {
		if i >= len(r.maps) || r.maps[i].off > off {
			return nil, false, fmt.Errorf("sim: address %#x (in the reservation at %#x) is not mapped: %w",
				uint64(r.start)+off, uint64(r.start), device.ErrInvalid)
		}
		m := r.maps[i]
		lo := off - m.off
		k := min(n, m.chunk.size-lo)
		if backing {
			pieces = append(pieces, m.chunk.bytes(m.chunk.size)[lo:lo+k:lo+k])
		}
		off += k
		n -= k
		i++
	}
	return pieces, false, nil
}

// kindAt returns the kind of the region holding p (valid after span succeeded).
func (d *Device) kindAt(p device.Ptr) regionKind {
	if r, _ := d.mem.find(p); r != nil {
		return r.kind
	}
	return kindAlloc
}
