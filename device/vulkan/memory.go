package vulkan

import (
	"fmt"
	"math/bits"
	"slices"
	"sort"
	"unsafe"

	"github.com/memwall/memwall/device"
)

// The synthetic address space: allocations get ranges from spaceBase up,
// each aligned to spaceAlign and followed by at least one unused granule,
// so that no Ptr of one allocation is ever the base of the next.
const (
	spaceBase     = 1 << 40
	spaceAlign    = 64 << 10
	spaceMaxAlign = 1 << 32
)

type allocKind int

const (
	kindDevice     allocKind = iota // Alloc
	kindHost                        // HostAlloc: mapped host-visible memory
	kindRegistered                  // HostRegister: imported host memory
	kindInternal                    // the device's own buffers (the memset byte table)
	kindReserve                     // Reserve: a sparse buffer
)

// allocation is one VkDeviceMemory with one VkBuffer bound over all of it,
// seen at the Ptr range [base, base+size). Ptr base is byte bufOff of buf.
type allocation struct {
	base   device.Ptr
	size   uint64
	kind   allocKind
	mem    uint64 // VkDeviceMemory
	buf    uint64 // VkBuffer
	bufOff uint64
	bda    uint64 // buffer device address of buffer byte 0, or 0
	bytes  uint64 // what the allocation took from its heap

	host unsafe.Pointer // host address of Ptr base (host kinds), else nil
	hb   *device.HostBuffer
	keep []byte       // registered memory, kept reachable while imported
	res  *reservation // kindReserve
}

func (a *allocation) end() device.Ptr { return a.base + device.Ptr(a.size) }

// addressSpace keeps the live allocations sorted by base.
type addressSpace struct {
	next uint64
	list []*allocation
}

// insert gives a the next range, its base aligned to a's size rounded up
// to a power of two (between spaceAlign and spaceMaxAlign), as GPU
// allocators align large blocks: a pool that places power-of-two blocks at
// offsets aligned to their size (buddy) finds its chunks aligned too.
// Addresses cost nothing, so the gaps do not matter.
func (s *addressSpace) insert(a *allocation) {
	align := uint64(1) << bits.Len64(max(a.size, 1)-1)
	s.insertAligned(a, min(max(align, spaceAlign), spaceMaxAlign))
}

// insertAligned is insert with the base aligned to align (a power of two).
func (s *addressSpace) insertAligned(a *allocation, align uint64) {
	s.next = (s.next + align - 1) &^ (align - 1)
	a.base = device.Ptr(s.next)
	span := (a.size + spaceAlign - 1) &^ (spaceAlign - 1)
	s.next += span + spaceAlign
	s.list = append(s.list, a) // bases only grow: appending keeps the order
}

func (s *addressSpace) remove(a *allocation) {
	i := sort.Search(len(s.list), func(i int) bool { return s.list[i].base >= a.base })
	if i < len(s.list) && s.list[i] == a {
		s.list = slices.Delete(s.list, i, i+1)
	}
}

// find returns the allocation holding p, or nil.
func (s *addressSpace) find(p device.Ptr) *allocation {
	i := sort.Search(len(s.list), func(i int) bool { return s.list[i].end() > p })
	if i < len(s.list) && s.list[i].base <= p {
		return s.list[i]
	}
	return nil
}

// hostIndex keeps host-kind allocations sorted by host address.
type hostIndex struct{ list []*allocation }

func hostAddr(a *allocation) uintptr { return uintptr(a.host) }

func (h *hostIndex) insert(a *allocation) {
	i := sort.Search(len(h.list), func(i int) bool { return hostAddr(h.list[i]) >= hostAddr(a) })
	h.list = slices.Insert(h.list, i, a)
}

func (h *hostIndex) remove(a *allocation) {
	if i := slices.Index(h.list, a); i >= 0 {
		h.list = slices.Delete(h.list, i, i+1)
	}
}

// find returns the allocation whose host bytes hold [p, p+n), or nil.
// Registered ranges may overlap; any one that holds the whole span serves.
func (h *hostIndex) find(p uintptr, n uint64) *allocation {
	i := sort.Search(len(h.list), func(i int) bool { return hostAddr(h.list[i]) > p })
	for j := i - 1; j >= 0; j-- {
		a := h.list[j]
		if p+uintptr(n) <= hostAddr(a)+uintptr(a.size) {
			return a
		}
		if j < i-8 { // overlapping registrations are rare; do not scan far
			break
		}
	}
	return nil
}

// span is a resolved range: a buffer and a byte offset in it.
type span struct {
	buf uint64
	off uint64
	a   *allocation
}

// resolve maps [p, p+n) to its buffer; the range must lie in one allocation.
func (d *Device) resolve(what string, p device.Ptr, n uint64) (span, error) {
	d.mu.Lock()
	a := d.space.find(p)
	d.mu.Unlock()
	if a == nil {
		return span{}, fmt.Errorf("vulkan: %s: address %#x is not in any allocation: %w", what, uint64(p), device.ErrInvalid)
	}
	if uint64(a.end()-p) < n {
		return span{}, fmt.Errorf("vulkan: %s: %d bytes at %#x run past the end of the %d-byte allocation at %#x: %w",
			what, n, uint64(p), a.size, uint64(a.base), device.ErrInvalid)
	}
	return span{buf: a.buf, off: a.bufOff + uint64(p-a.base), a: a}, nil
}

// hostSpan finds b in host memory the device can copy from directly.
func (d *Device) hostSpan(b []byte) (span, bool) {
	if len(b) == 0 {
		return span{}, false
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	d.mu.Lock()
	a := d.hostIdx.find(p, uint64(len(b)))
	d.mu.Unlock()
	if a == nil {
		return span{}, false
	}
	return span{buf: a.buf, off: a.bufOff + uint64(p-hostAddr(a)), a: a}, true
}

// chooseTypes picks the memory type for Alloc (device-local, on the
// largest device-local heap) and for host buffers (host-visible and
// coherent, off the device heap on discrete GPUs, cached preferred).
func (d *Device) chooseTypes() error {
	m := &d.memProps
	bad := uint32(memLazily | memProtected | memAMDCoherent | memAMDUncached)
	dev, host := -1, -1
	hostScore := func(t memoryType) int {
		s := 0
		if t.flags&memDeviceLocal == 0 {
			s += 2
		}
		if t.flags&memHostCached != 0 {
			s++
		}
		return s
	}
	for i := range m.typeCount {
		t := m.types[i]
		if t.flags&bad != 0 {
			continue
		}
		if t.flags&memDeviceLocal != 0 && m.heaps[t.heap].flags&heapDeviceLocal != 0 {
			if dev < 0 || m.heaps[t.heap].size > m.heaps[m.types[dev].heap].size ||
				(t.heap == m.types[dev].heap && m.types[dev].flags&memHostVisible != 0 && t.flags&memHostVisible == 0) {
				dev = int(i)
			}
		}
		if t.flags&(memHostVisible|memHostCoherent) == memHostVisible|memHostCoherent {
			if host < 0 || hostScore(t) > hostScore(m.types[host]) {
				host = int(i)
			}
		}
	}
	if dev < 0 {
		// No device-local type (some CPU drivers): any non-special type.
		for i := range m.typeCount {
			if m.types[i].flags&bad == 0 {
				dev = int(i)
				break
			}
		}
	}
	if dev < 0 || host < 0 {
		return fmt.Errorf("vulkan: device %q lacks a usable device-local (%d) or host-visible coherent (%d) memory type: %w",
			d.info.Name, dev, host, device.ErrUnsupported)
	}
	d.deviceType, d.hostType = uint32(dev), uint32(host)
	d.deviceHeap = m.types[dev].heap
	d.info.TotalBytes = m.heaps[d.deviceHeap].size
	return nil
}

func (d *Device) initMemory() error {
	mp := &physicalDeviceMemoryProperties2{sType: stPhysicalDeviceMemoryProperties2}
	callVoid(d.vk.getPhysicalDeviceMemoryProperties2, d.phys, uintptr(unsafe.Pointer(mp)))
	d.memProps = mp.props
	if err := d.chooseTypes(); err != nil {
		return err
	}
	t, err := d.newAllocation(1024, kindInternal, 0.5, nil)
	if err != nil {
		return err
	}
	tab := unsafe.Slice((*byte)(t.host), 1024)
	for i := range tab {
		tab[i] = byte(i / 4)
	}
	d.byteTable = t
	return nil
}

// usage is the buffer usage of every allocation: copies both ways,
// storage access from shaders, and device addresses where supported.
func (d *Device) usage() uint32 {
	u := uint32(bufferUsageTransferSrc | bufferUsageTransferDst | bufferUsageStorage)
	if d.hasBDA {
		u |= bufferUsageDeviceAddress
	}
	return u
}

// createBuffer makes a buffer of n bytes shared by the device's queue
// families, with an optional pNext chain.
func (d *Device) createBuffer(n uint64, flags uint32, pNext uintptr) (uint64, error) {
	var pn pinned
	defer pn.release()
	ci := &bufferCreateInfo{sType: stBufferCreateInfo, pNext: pNext, flags: flags, size: n, usage: d.usage(), sharing: sharingExclusive}
	if len(d.families) > 1 {
		ci.sharing, ci.familyCount, ci.families = sharingConcurrent, uint32(len(d.families)), refSlice(&pn, d.families)
	}
	var buf uint64
	if err := check("vkCreateBuffer", call(d.vk.createBuffer, d.dev, uintptr(unsafe.Pointer(ci)), 0, uintptr(unsafe.Pointer(&buf)))); err != nil {
		return 0, err
	}
	return buf, nil
}

// allocate makes a VkDeviceMemory of n bytes of type typeIdx, with device
// addresses and a priority where supported, importing host memory at
// import when it is not nil.
func (d *Device) allocate(n uint64, typeIdx uint32, priority float32, importHost uintptr) (uint64, error) {
	var pn pinned
	defer pn.release()
	ai := &memoryAllocateInfo{sType: stMemoryAllocateInfo, size: n, typeIdx: typeIdx}
	tail := &ai.pNext
	if d.hasBDA {
		fi := &memoryAllocateFlagsInfo{sType: stMemoryAllocateFlagsInfo, flags: memoryAllocateDeviceAddress}
		*tail = ref(&pn, fi)
		tail = &fi.pNext
	}
	if d.hasPriority {
		pi := &memoryPriorityAllocateInfo{sType: stMemoryPriorityAllocateInfo, priority: priority}
		*tail = ref(&pn, pi)
		tail = &pi.pNext
	}
	if importHost != 0 {
		ii := &importMemoryHostPointerInfo{sType: stImportMemoryHostPointerInfo, handleType: externalHostAllocation, host: importHost}
		*tail = ref(&pn, ii)
	}
	var mem uint64
	if err := check("vkAllocateMemory", call(d.vk.allocateMemory, d.dev, uintptr(unsafe.Pointer(ai)), 0, uintptr(unsafe.Pointer(&mem)))); err != nil {
		return 0, err
	}
	return mem, nil
}

// newAllocation creates a buffer of size bytes over new memory of the kind
// (device-local for kindDevice, mapped host-visible otherwise) and gives it
// a Ptr range.
func (d *Device) newAllocation(size uint64, kind allocKind, priority float32, _ []byte) (*allocation, error) {
	bufSize := (size + 255) &^ 255
	buf, err := d.createBuffer(bufSize, 0, 0)
	if err != nil {
		return nil, wrapOOM(err, size)
	}
	var req memoryRequirements
	callVoid(d.vk.getBufferMemoryRequirements, d.dev, uintptr(buf), uintptr(unsafe.Pointer(&req)))
	want := d.deviceType
	if kind != kindDevice {
		want = d.hostType
	}
	if req.typeBits&(1<<want) == 0 {
		callVoid(d.vk.destroyBuffer, d.dev, uintptr(buf), 0)
		return nil, fmt.Errorf("vulkan: buffers cannot use memory type %d (allowed %#x): %w", want, req.typeBits, device.ErrUnsupported)
	}
	mem, err := d.allocate(req.size, want, priority, 0)
	if err != nil {
		callVoid(d.vk.destroyBuffer, d.dev, uintptr(buf), 0)
		return nil, wrapOOM(err, size)
	}
	a := &allocation{size: size, kind: kind, mem: mem, buf: buf, bytes: req.size}
	if err := d.finish(a); err != nil {
		return nil, err
	}
	if kind != kindDevice {
		var p unsafe.Pointer
		if err := check("vkMapMemory", call(d.vk.mapMemory, d.dev, uintptr(mem), 0, uintptr(req.size), 0, uintptr(unsafe.Pointer(&p)))); err != nil {
			d.destroy(a)
			return nil, wrapOOM(err, size)
		}
		a.host = p
	}
	return a, nil
}

// finish binds a's memory to its buffer and reads the device address.
func (d *Device) finish(a *allocation) error {
	if err := check("vkBindBufferMemory", call(d.vk.bindBufferMemory, d.dev, uintptr(a.buf), uintptr(a.mem), 0)); err != nil {
		d.destroy(a)
		return err
	}
	if d.hasBDA {
		bi := &bufferDeviceAddressInfo{sType: stBufferDeviceAddressInfo, buffer: a.buf}
		a.bda = uint64(callVoid(d.vk.getBufferDeviceAddress, d.dev, uintptr(unsafe.Pointer(bi))))
	}
	return nil
}

// destroy releases a's buffer and memory (the caller has waited for work).
func (d *Device) destroy(a *allocation) {
	if a.host != nil && a.kind != kindRegistered {
		callVoid(d.vk.unmapMemory, d.dev, uintptr(a.mem))
	}
	if a.buf != 0 {
		callVoid(d.vk.destroyBuffer, d.dev, uintptr(a.buf), 0)
	}
	if a.mem != 0 {
		callVoid(d.vk.freeMemory, d.dev, uintptr(a.mem), 0)
	}
	a.buf, a.mem, a.host = 0, 0, nil
}

func wrapOOM(err error, size uint64) error {
	return fmt.Errorf("vulkan: allocating %d bytes: %w", size, err)
}

// MemInfo returns the free and total bytes of the device-local heap: the
// heap size less what this process uses of it, which is
// VK_EXT_memory_budget's heap usage where the driver offers it (the
// process's whole footprint there, driver-internal allocations included)
// and never less than what this handle allocated. The budget the driver
// advises, which accounts for other processes, is in Details: memwall does
// not subtract it here, since drivers compute it as a share of what is
// left and it would move by less than an allocation.
func (d *Device) MemInfo() (free, total uint64, err error) {
	total = d.info.TotalBytes
	d.mu.Lock()
	used := d.used
	d.mu.Unlock()
	if d.hasBudget {
		var pn pinned
		defer pn.release()
		b := &physicalDeviceMemoryBudget{sType: stPhysicalDeviceMemoryBudget}
		mp := &physicalDeviceMemoryProperties2{sType: stPhysicalDeviceMemoryProperties2, pNext: ref(&pn, b)}
		callVoid(d.vk.getPhysicalDeviceMemoryProperties2, d.phys, uintptr(unsafe.Pointer(mp)))
		used = max(used, b.usage[d.deviceHeap])
	}
	return total - min(used, total), total, nil
}

// Alloc returns size bytes of device-local memory at priority 0.5 (see
// AllocPriority).
func (d *Device) Alloc(size uint64) (device.Ptr, error) { return d.AllocPriority(size, 0.5) }

// AllocPriority is Alloc with a VK_EXT_memory_priority priority in [0, 1]
// (1 for weights, 0.5 for activations): under memory pressure the driver
// demotes low-priority allocations first. Without the extension the
// priority is ignored.
func (d *Device) AllocPriority(size uint64, priority float32) (device.Ptr, error) {
	if size == 0 {
		return 0, fmt.Errorf("vulkan: Alloc(0): %w", device.ErrInvalid)
	}
	if !(priority >= 0 && priority <= 1) {
		return 0, fmt.Errorf("vulkan: priority %v outside [0, 1]: %w", priority, device.ErrInvalid)
	}
	if heap := d.info.TotalBytes; size > heap || (d.maxAlloc > 0 && size > d.maxAlloc) {
		return 0, fmt.Errorf("vulkan: Alloc(%d): more than the %d-byte heap or the %d-byte allocation limit: %w",
			size, heap, d.maxAlloc, device.ErrOutOfMemory)
	}
	a, err := d.newAllocation(size, kindDevice, priority, nil)
	if err != nil {
		return 0, err
	}
	d.mu.Lock()
	d.space.insert(a)
	d.used += a.bytes
	d.mu.Unlock()
	return a.base, nil
}

// Free releases memory from Alloc after the work queued so far on every
// stream has completed.
func (d *Device) Free(p device.Ptr) error {
	d.mu.Lock()
	a := d.space.find(p)
	if a == nil || a.base != p || a.kind != kindDevice {
		d.mu.Unlock()
		return fmt.Errorf("vulkan: Free(%#x): not an allocation from Alloc: %w", uint64(p), device.ErrInvalid)
	}
	d.space.remove(a)
	d.used -= a.bytes
	d.mu.Unlock()
	err := d.Synchronize()
	d.destroy(a)
	return err
}

// HostAlloc returns size bytes of host-visible, coherent memory, mapped;
// its DevicePtr names it in the device address space (copies and kernels
// read and write it in place).
func (d *Device) HostAlloc(size uint64) (*device.HostBuffer, error) {
	if size == 0 {
		return nil, fmt.Errorf("vulkan: HostAlloc(0): %w", device.ErrInvalid)
	}
	a, err := d.newAllocation(size, kindHost, 0.5, nil)
	if err != nil {
		return nil, err
	}
	a.hb = &device.HostBuffer{Bytes: unsafe.Slice((*byte)(a.host), size), Kind: device.HostPinned}
	d.mu.Lock()
	d.space.insert(a)
	d.hostIdx.insert(a)
	d.mu.Unlock()
	a.hb.DevicePtr = a.base
	return a.hb, nil
}

// HostFree releases a buffer from HostAlloc or HostRegister after the work
// queued so far has completed.
func (d *Device) HostFree(b *device.HostBuffer) error {
	if b == nil || len(b.Bytes) == 0 {
		return fmt.Errorf("vulkan: HostFree of an empty buffer: %w", device.ErrInvalid)
	}
	d.mu.Lock()
	a := d.hostIdx.find(uintptr(unsafe.Pointer(&b.Bytes[0])), uint64(len(b.Bytes)))
	for _, c := range d.hostIdx.list { // registrations may overlap: find this buffer's own
		if c.hb == b {
			a = c
		}
	}
	if a == nil || a.hb != b {
		d.mu.Unlock()
		return fmt.Errorf("vulkan: HostFree: buffer not from HostAlloc or HostRegister: %w", device.ErrInvalid)
	}
	d.space.remove(a)
	d.hostIdx.remove(a)
	d.mu.Unlock()
	err := d.Synchronize()
	d.destroy(a)
	return err
}

// HostRegister imports b through VK_EXT_external_memory_host: the pages
// holding b (rounded out to minImportedHostPointerAlignment) become a
// buffer the device copies from and to in place. It fails with
// ErrUnsupported without the extension or when the driver refuses the
// memory (read-only mappings, for one, on some drivers).
func (d *Device) HostRegister(b []byte, flags device.RegisterFlags) (*device.HostBuffer, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("vulkan: HostRegister of an empty buffer: %w", device.ErrInvalid)
	}
	if !d.hasHostImport {
		return nil, fmt.Errorf("vulkan: HostRegister: VK_EXT_external_memory_host absent: %w", device.ErrUnsupported)
	}
	align := max(d.hostAlign, 4096)
	p := uintptr(unsafe.Pointer(&b[0]))
	start := p &^ uintptr(align-1)
	end := (p + uintptr(len(b)) + uintptr(align) - 1) &^ uintptr(align-1)
	n := uint64(end - start)
	props := &memoryHostPointerProperties{sType: stMemoryHostPointerProperties}
	if err := check("vkGetMemoryHostPointerPropertiesEXT", call(d.vk.getMemoryHostPointerProperties, d.dev, externalHostAllocation,
		start, uintptr(unsafe.Pointer(props)))); err != nil {
		return nil, fmt.Errorf("vulkan: HostRegister(%d bytes): %w: %w", len(b), err, device.ErrUnsupported)
	}
	var pn pinned
	defer pn.release()
	ext := &externalMemoryBufferCreateInfo{sType: stExternalMemoryBufferCreateInfo, handleTypes: externalHostAllocation}
	buf, err := d.createBuffer(n, 0, ref(&pn, ext))
	if err != nil {
		return nil, fmt.Errorf("vulkan: HostRegister: %w", err)
	}
	var req memoryRequirements
	callVoid(d.vk.getBufferMemoryRequirements, d.dev, uintptr(buf), uintptr(unsafe.Pointer(&req)))
	bits := props.typeBits & req.typeBits
	t := d.hostType
	if bits&(1<<t) == 0 {
		t = 0
		for bits&(1<<t) == 0 && t < 32 {
			t++
		}
	}
	if t >= 32 {
		callVoid(d.vk.destroyBuffer, d.dev, uintptr(buf), 0)
		return nil, fmt.Errorf("vulkan: HostRegister: no memory type can import this memory (host %#x, buffer %#x): %w",
			props.typeBits, req.typeBits, device.ErrUnsupported)
	}
	mem, err := d.allocate(n, t, 0.5, start)
	if err != nil {
		callVoid(d.vk.destroyBuffer, d.dev, uintptr(buf), 0)
		return nil, fmt.Errorf("vulkan: HostRegister(%d bytes): %w: %w", len(b), err, device.ErrUnsupported)
	}
	a := &allocation{size: uint64(len(b)), kind: kindRegistered, mem: mem, buf: buf, bufOff: uint64(p - start),
		host: unsafe.Pointer(&b[0]), keep: b}
	if err := d.finish(a); err != nil {
		return nil, fmt.Errorf("vulkan: HostRegister: %w", err)
	}
	a.hb = &device.HostBuffer{Bytes: b, Kind: device.HostRegistered}
	d.mu.Lock()
	d.space.insert(a)
	d.hostIdx.insert(a)
	d.mu.Unlock()
	if flags&device.RegisterDeviceMap != 0 {
		a.hb.DevicePtr = a.base
	}
	return a.hb, nil
}
