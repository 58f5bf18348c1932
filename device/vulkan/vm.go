package vulkan

import (
	"fmt"
	"math/bits"
	"unsafe"

	"github.com/memwall/memwall/device"
)

// Virtual memory over sparse binding (opt-in: Options.Sparse or
// MEMWALL_VULKAN_SPARSE=1, where the device has sparseBinding and
// sparseResidencyBuffer and a queue family that binds). A reservation is
// a sparse, partially resident VkBuffer with a Ptr range; a physical chunk
// is a VkDeviceMemory; Map binds a chunk at an offset of the buffer with
// vkQueueBindSparse and waits for the bind, so the mapping is in place
// before any later submission. The granularity is the sparse buffer's
// memory alignment. Without it every method fails with ErrUnsupported and
// pools grow in chunks.

const (
	bufferCreateSparseBinding   = 0x1
	bufferCreateSparseResidency = 0x2
)

// physChunk is a CreatePhysical chunk; its memory is freed once it is
// released and no mapping refers to it.
type physChunk struct {
	mem      uint64
	size     uint64
	maps     int
	released bool
}

// reservation is the sparse side of a kindReserve allocation.
type reservation struct {
	maps map[uint64]*physChunk // buffer offset → chunk mapped there
}

// sparseState is the device's sparse binding machinery.
type sparseState struct {
	q        *queue
	granule  uint64
	typeBits uint32
	sem      uint64 // timeline the binds signal
	value    uint64
}

// initSparse probes the granularity with a sparse buffer and makes the
// binds' semaphore. It returns why virtual memory stays off, or "".
func (d *Device) initSparse(want bool) string {
	p := d.picked
	switch {
	case !want:
		return "sparse binding of a growable range is off (Options.Sparse, MEMWALL_VULKAN_SPARSE=1); pools grow in chunks"
	case p.feat.features[featSparseBinding] == 0 || p.feat.features[featSparseResidencyBuffer] == 0:
		return "no sparseBinding or sparseResidencyBuffer; pools grow in chunks"
	}
	var q *queue
	for _, f := range []*family{d.compute, d.transfer} {
		if f.flags&queueSparseBinding != 0 {
			q = f.queues[len(f.queues)-1]
			break
		}
	}
	if q == nil || d.vk.queueBindSparse == 0 {
		return "no queue family binds sparse memory; pools grow in chunks"
	}
	buf, err := d.createBuffer(64<<20, bufferCreateSparseBinding|bufferCreateSparseResidency, 0)
	if err != nil {
		return fmt.Sprintf("a sparse buffer could not be created (%v); pools grow in chunks", err)
	}
	var req memoryRequirements
	callVoid(d.vk.getBufferMemoryRequirements, d.dev, uintptr(buf), uintptr(unsafe.Pointer(&req)))
	callVoid(d.vk.destroyBuffer, d.dev, uintptr(buf), 0)
	if req.alignment == 0 || bits.OnesCount64(req.alignment) != 1 || req.typeBits&(1<<d.deviceType) == 0 {
		return fmt.Sprintf("sparse buffers have alignment %d and memory types %#x; pools grow in chunks", req.alignment, req.typeBits)
	}
	sem, _, err := d.createTimeline()
	if err != nil {
		return err.Error()
	}
	d.sparse = &sparseState{q: q, granule: req.alignment, typeBits: req.typeBits, sem: sem}
	d.info.VirtualMemory, d.info.Granularity = true, req.alignment
	return ""
}

func (d *Device) noVM(what string) error {
	return fmt.Errorf("vulkan: %s: no sparse binding: %w", what, device.ErrUnsupported)
}

// Reserve creates a sparse buffer of size bytes (a multiple of the
// granularity) and gives it a Ptr range; nothing is bound.
func (d *Device) Reserve(size uint64) (device.Ptr, error) {
	sp := d.sparse
	if sp == nil {
		return 0, d.noVM(fmt.Sprintf("Reserve(%d)", size))
	}
	if size == 0 || size%sp.granule != 0 {
		return 0, fmt.Errorf("vulkan: Reserve(%d): not a positive multiple of the granularity %d: %w", size, sp.granule, device.ErrInvalid)
	}
	buf, err := d.createBuffer(size, bufferCreateSparseBinding|bufferCreateSparseResidency, 0)
	if err != nil {
		return 0, fmt.Errorf("vulkan: Reserve(%d): %w", size, err)
	}
	a := &allocation{size: size, kind: kindReserve, buf: buf, res: &reservation{maps: map[uint64]*physChunk{}}}
	if d.hasBDA {
		bi := &bufferDeviceAddressInfo{sType: stBufferDeviceAddressInfo, buffer: a.buf}
		a.bda = uint64(callVoid(d.vk.getBufferDeviceAddress, d.dev, uintptr(unsafe.Pointer(bi))))
	}
	d.mu.Lock()
	d.space.insertAligned(a, max(sp.granule, spaceAlign))
	d.mu.Unlock()
	return a.base, nil
}

// Unreserve destroys a reservation with nothing mapped in it.
func (d *Device) Unreserve(p device.Ptr, size uint64) error {
	if d.sparse == nil {
		return d.noVM("Unreserve")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	a := d.space.find(p)
	if a == nil || a.kind != kindReserve || a.base != p || a.size != size {
		return fmt.Errorf("vulkan: Unreserve(%#x, %d): not a reservation: %w", uint64(p), size, device.ErrInvalid)
	}
	if len(a.res.maps) > 0 {
		return fmt.Errorf("vulkan: Unreserve(%#x): %d chunks still mapped: %w", uint64(p), len(a.res.maps), device.ErrInvalid)
	}
	d.space.remove(a)
	callVoid(d.vk.destroyBuffer, d.dev, uintptr(a.buf), 0)
	return nil
}

// CreatePhysical allocates a chunk of device-local memory.
func (d *Device) CreatePhysical(size uint64) (device.PhysMem, error) {
	sp := d.sparse
	if sp == nil {
		return 0, d.noVM(fmt.Sprintf("CreatePhysical(%d)", size))
	}
	if size == 0 || size%sp.granule != 0 {
		return 0, fmt.Errorf("vulkan: CreatePhysical(%d): not a positive multiple of the granularity %d: %w", size, sp.granule, device.ErrInvalid)
	}
	if size > d.info.TotalBytes {
		return 0, fmt.Errorf("vulkan: CreatePhysical(%d): more than the heap: %w", size, device.ErrOutOfMemory)
	}
	mem, err := d.allocate(size, d.deviceType, 0.5, 0)
	if err != nil {
		return 0, wrapOOM(err, size)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	id := device.PhysMem(d.newID())
	d.chunks[id] = &physChunk{mem: mem, size: size}
	d.used += size
	return id, nil
}

// ReleasePhysical releases a chunk; its memory is freed once unmapped.
func (d *Device) ReleasePhysical(h device.PhysMem) error {
	if d.sparse == nil {
		return d.noVM("ReleasePhysical")
	}
	d.mu.Lock()
	c := d.chunks[h]
	delete(d.chunks, h)
	if c == nil {
		d.mu.Unlock()
		return fmt.Errorf("vulkan: ReleasePhysical: unknown chunk %d: %w", uint64(h), device.ErrInvalid)
	}
	c.released = true
	free := c.maps == 0
	if free {
		d.used -= c.size
	}
	d.mu.Unlock()
	if free {
		callVoid(d.vk.freeMemory, d.dev, uintptr(c.mem), 0)
	}
	return nil
}

// bind binds (mem != 0) or unbinds the range of a reservation's buffer and
// waits for the bind to complete.
func (d *Device) bind(buf, off, size, mem uint64) error {
	sp := d.sparse
	var pn pinned
	defer pn.release()
	mb := &sparseMemoryBind{resourceOffset: off, size: size, memory: mem}
	bb := &sparseBufferMemoryBindInfo{buffer: buf, bindCount: 1, binds: ref(&pn, mb)}
	sp.q.mu.Lock()
	sp.value++
	v := sp.value
	sig, sigVal := []uint64{sp.sem}, []uint64{v}
	ts := &timelineSemaphoreSubmitInfo{sType: stTimelineSemaphoreSubmitInfo, signalCount: 1, signalValues: refSlice(&pn, sigVal)}
	bi := &bindSparseInfo{sType: stBindSparseInfo, pNext: ref(&pn, ts), bufferBindCount: 1, bufferBinds: ref(&pn, bb),
		signalCount: 1, signalSemaphores: refSlice(&pn, sig)}
	r := call(d.vk.queueBindSparse, sp.q.h, 1, uintptr(unsafe.Pointer(bi)), 0)
	sp.q.mu.Unlock()
	if err := check("vkQueueBindSparse", r); err != nil {
		return err
	}
	return d.waitValues([]semWait{{sp.sem, v}})
}

// Map binds the whole chunk h at va (granule aligned, inside one
// reservation, over nothing mapped).
func (d *Device) Map(va device.Ptr, size uint64, h device.PhysMem) error {
	sp := d.sparse
	if sp == nil {
		return d.noVM("Map")
	}
	d.mu.Lock()
	a := d.space.find(va)
	c := d.chunks[h]
	var err error
	switch {
	case a == nil || a.kind != kindReserve:
		err = fmt.Errorf("address %#x is not in a reservation", uint64(va))
	case c == nil:
		err = fmt.Errorf("unknown chunk %d", uint64(h))
	case size != c.size:
		err = fmt.Errorf("size %d is not the chunk's %d", size, c.size)
	case uint64(va-a.base)%sp.granule != 0 || uint64(a.end()-va) < size:
		err = fmt.Errorf("[%#x, +%d) is not granule-aligned inside the reservation", uint64(va), size)
	}
	var off uint64
	if err == nil {
		off = uint64(va - a.base)
		for o, m := range a.res.maps {
			if o < off+size && off < o+m.size {
				err = fmt.Errorf("[%#x, +%d) overlaps the mapping at %#x", uint64(va), size, uint64(a.base)+o)
				break
			}
		}
	}
	if err != nil {
		d.mu.Unlock()
		return fmt.Errorf("vulkan: Map: %w: %w", err, device.ErrInvalid)
	}
	a.res.maps[off] = c
	c.maps++
	d.mu.Unlock()
	if err := d.bind(a.buf, off, size, c.mem); err != nil {
		d.mu.Lock()
		delete(a.res.maps, off)
		c.maps--
		d.mu.Unlock()
		return fmt.Errorf("vulkan: Map: %w", err)
	}
	return nil
}

// Unmap unbinds the mappings that make up [va, va+size), after the work
// queued so far has completed.
func (d *Device) Unmap(va device.Ptr, size uint64) error {
	if d.sparse == nil {
		return d.noVM("Unmap")
	}
	d.mu.Lock()
	a := d.space.find(va)
	if a == nil || a.kind != kindReserve {
		d.mu.Unlock()
		return fmt.Errorf("vulkan: Unmap: address %#x is not in a reservation: %w", uint64(va), device.ErrInvalid)
	}
	off := uint64(va - a.base)
	var offs []uint64
	covered := uint64(0)
	for o, m := range a.res.maps {
		inside := o >= off && o+m.size <= off+size
		if !inside && o < off+size && off < o+m.size {
			d.mu.Unlock()
			return fmt.Errorf("vulkan: Unmap(%#x, %d): splits the mapping at %#x: %w", uint64(va), size, uint64(a.base)+o, device.ErrInvalid)
		}
		if inside {
			offs = append(offs, o)
			covered += m.size
		}
	}
	if covered != size {
		d.mu.Unlock()
		return fmt.Errorf("vulkan: Unmap(%#x, %d): only %d bytes of it are mapped: %w", uint64(va), size, covered, device.ErrInvalid)
	}
	d.mu.Unlock()
	if err := d.Synchronize(); err != nil {
		return err
	}
	for _, o := range offs {
		d.mu.Lock()
		c := a.res.maps[o]
		d.mu.Unlock()
		if err := d.bind(a.buf, o, c.size, 0); err != nil {
			return fmt.Errorf("vulkan: Unmap: %w", err)
		}
		d.mu.Lock()
		delete(a.res.maps, o)
		c.maps--
		free := c.released && c.maps == 0
		if free {
			d.used -= c.size
		}
		d.mu.Unlock()
		if free {
			callVoid(d.vk.freeMemory, d.dev, uintptr(c.mem), 0)
		}
	}
	return nil
}
