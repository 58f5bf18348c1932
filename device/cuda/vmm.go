package cuda

import (
	"fmt"
	"unsafe"

	"github.com/memwall/memwall/device"
)

// allocProp mirrors CUmemAllocationProp (32 bytes on 64-bit platforms).
type allocProp struct {
	typ         uint32 // CU_MEM_ALLOCATION_TYPE_PINNED = 1
	handleTypes uint32 // none
	locType     uint32 // CU_MEM_LOCATION_TYPE_DEVICE = 1
	locID       int32
	win32       uintptr
	compression uint8
	rdma        uint8
	usage       uint16
	_           [4]byte
}

// accessDesc mirrors CUmemAccessDesc (12 bytes).
type accessDesc struct {
	locType uint32
	locID   int32
	flags   uint32 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
}

func (c *Device) prop() *allocProp {
	return &allocProp{typ: 1, locType: 1, locID: c.dev}
}

func (c *Device) granularity() (uint64, error) {
	var g uint64
	err := c.call("cuMemGetAllocationGranularity", c.d.cuMemGetAllocationGranularity,
		uintptr(unsafe.Pointer(&g)), uintptr(unsafe.Pointer(c.prop())), 0 /* MINIMUM */)
	return g, err
}

func (c *Device) vmm(op string, size uint64) error {
	if !c.info.VirtualMemory {
		return fmt.Errorf("cuda: %s: virtual memory: %w", op, device.ErrUnsupported)
	}
	if size == 0 || size%c.info.Granularity != 0 {
		return fmt.Errorf("cuda: %s: size %d is not a positive multiple of the granularity %d: %w",
			op, size, c.info.Granularity, device.ErrInvalid)
	}
	return nil
}

// Reserve reserves device address space.
func (c *Device) Reserve(size uint64) (device.Ptr, error) {
	if err := c.vmm("reserve", size); err != nil {
		return 0, err
	}
	var p uint64
	if err := c.call("cuMemAddressReserve", c.d.cuMemAddressReserve, uintptr(unsafe.Pointer(&p)), uintptr(size), 0, 0, 0); err != nil {
		return 0, fmt.Errorf("cuda: reserve %d bytes of address space: %w", size, err)
	}
	return device.Ptr(p), nil
}

// Unreserve frees a reservation.
func (c *Device) Unreserve(p device.Ptr, size uint64) error {
	if err := c.vmm("unreserve", size); err != nil {
		return err
	}
	return c.call("cuMemAddressFree", c.d.cuMemAddressFree, uintptr(p), uintptr(size))
}

// CreatePhysical allocates a physical chunk.
func (c *Device) CreatePhysical(size uint64) (device.PhysMem, error) {
	if err := c.vmm("create physical", size); err != nil {
		return 0, err
	}
	var h uint64
	if err := c.call("cuMemCreate", c.d.cuMemCreate, uintptr(unsafe.Pointer(&h)), uintptr(size), uintptr(unsafe.Pointer(c.prop())), 0); err != nil {
		return 0, fmt.Errorf("cuda: create %d-byte physical chunk: %w", size, err)
	}
	return device.PhysMem(h), nil
}

// ReleasePhysical releases a chunk (freed once unmapped everywhere).
func (c *Device) ReleasePhysical(h device.PhysMem) error {
	if !c.info.VirtualMemory {
		return fmt.Errorf("cuda: release physical: %w", device.ErrUnsupported)
	}
	return c.call("cuMemRelease", c.d.cuMemRelease, uintptr(h))
}

// Map maps the chunk at va and makes it readable and writable by the device.
func (c *Device) Map(va device.Ptr, size uint64, h device.PhysMem) error {
	if err := c.vmm("map", size); err != nil {
		return err
	}
	if err := c.call("cuMemMap", c.d.cuMemMap, uintptr(va), uintptr(size), 0, uintptr(h), 0); err != nil {
		return fmt.Errorf("cuda: map %d bytes at %#x: %w", size, uint64(va), err)
	}
	acc := &accessDesc{locType: 1, locID: c.dev, flags: 3}
	if err := c.call("cuMemSetAccess", c.d.cuMemSetAccess, uintptr(va), uintptr(size), uintptr(unsafe.Pointer(acc)), 1); err != nil {
		_ = c.call("cuMemUnmap", c.d.cuMemUnmap, uintptr(va), uintptr(size))
		return fmt.Errorf("cuda: set access on %d bytes at %#x: %w", size, uint64(va), err)
	}
	return nil
}

// Unmap unmaps [va, va+size).
func (c *Device) Unmap(va device.Ptr, size uint64) error {
	if err := c.vmm("unmap", size); err != nil {
		return err
	}
	return c.call("cuMemUnmap", c.d.cuMemUnmap, uintptr(va), uintptr(size))
}
