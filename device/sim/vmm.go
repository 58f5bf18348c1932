package sim

import (
	"fmt"
	"slices"
	"sort"

	"github.com/memwall/memwall/device"
)

// vmm checks that virtual memory is on and size is a positive multiple of
// the granularity.
func (d *Device) vmm(op string, size uint64) error {
	if !d.o.VirtualMemory {
		return fmt.Errorf("sim: %s: virtual memory: %w", op, device.ErrUnsupported)
	}
	if size == 0 || size%d.o.Granularity != 0 {
		return fmt.Errorf("sim: %s: size %d is not a positive multiple of the granularity %d: %w",
			op, size, d.o.Granularity, device.ErrInvalid)
	}
	return nil
}

// Reserve reserves size bytes of address space aligned to the granularity.
// Reservations cost no device memory. It fails with ErrUnsupported without
// virtual memory, ErrInvalid for a size that is not a positive multiple of
// the granularity, and ErrOutOfMemory when the address space is exhausted.
func (d *Device) Reserve(size uint64) (device.Ptr, error) {
	if err := d.vmm("reserve", size); err != nil {
		return 0, err
	}
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	r := &region{kind: kindReserve, size: size}
	if err := d.mem.place(r, d.o.Granularity); err != nil {
		return 0, fmt.Errorf("sim: reserve %d bytes of address space: %w", size, err)
	}
	d.mem.reserves[r.start] = r
	return r.start, nil
}

// Unreserve releases a reservation made by Reserve with the same p and size.
// It fails with ErrInvalid for anything else, or while chunks are still
// mapped in it.
func (d *Device) Unreserve(p device.Ptr, size uint64) error {
	if err := d.vmm("unreserve", size); err != nil {
		return err
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	r := d.mem.reserves[p]
	if r == nil {
		return fmt.Errorf("sim: unreserve %#x: not a reservation: %w", uint64(p), device.ErrInvalid)
	}
	if r.size != size {
		return fmt.Errorf("sim: unreserve %#x: size %d, but %d bytes were reserved: %w", uint64(p), size, r.size, device.ErrInvalid)
	}
	if len(r.maps) > 0 {
		return fmt.Errorf("sim: unreserve %#x: %d chunk(s) still mapped: %w", uint64(p), len(r.maps), device.ErrInvalid)
	}
	d.mem.remove(r)
	delete(d.mem.reserves, p)
	return nil
}

// CreatePhysical creates a chunk of size bytes, counted against the device
// from now until it is released and unmapped everywhere. It fails with
// ErrOutOfMemory when the device has no room.
func (d *Device) CreatePhysical(size uint64) (device.PhysMem, error) {
	if err := d.vmm("create physical", size); err != nil {
		return 0, err
	}
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.mu.Unlock()
	if err := d.checkRoom("create physical chunk of", size); err != nil {
		return 0, err
	}
	h := device.PhysMem(d.handle())
	d.mem.chunks[h] = &chunk{size: size}
	d.mem.physical += size
	d.stats.AllocCalls++
	d.stats.DriverTime += d.o.AllocLatency
	return h, nil
}

// ReleasePhysical invalidates the handle h. The chunk's memory returns to
// the device at once when it is not mapped, otherwise at its last Unmap
// (mappings keep working until then). An unknown or released handle fails
// with ErrInvalid.
func (d *Device) ReleasePhysical(h device.PhysMem) error {
	if !d.o.VirtualMemory {
		return fmt.Errorf("sim: release physical: virtual memory: %w", device.ErrUnsupported)
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	c := d.mem.chunks[h]
	if c == nil {
		return fmt.Errorf("sim: release physical chunk %d: unknown or already released: %w", uint64(h), device.ErrInvalid)
	}
	delete(d.mem.chunks, h)
	c.released = true
	if c.maps == 0 {
		d.mem.physical -= c.size
		c.drop()
	}
	d.stats.FreeCalls++
	d.stats.DriverTime += d.o.FreeLatency
	return nil
}

// Map maps the whole chunk h at va, inside a reservation, granularity
// aligned, over no other mapping; a chunk may be mapped at several
// addresses, which then alias. Anything else fails with ErrInvalid.
func (d *Device) Map(va device.Ptr, size uint64, h device.PhysMem) error {
	if err := d.vmm("map", size); err != nil {
		return err
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	c := d.mem.chunks[h]
	if c == nil {
		return fmt.Errorf("sim: map at %#x: physical chunk %d unknown or released: %w", uint64(va), uint64(h), device.ErrInvalid)
	}
	if size != c.size {
		return fmt.Errorf("sim: map at %#x: size %d, but chunk %d has %d bytes (maps are whole chunks): %w",
			uint64(va), size, uint64(h), c.size, device.ErrInvalid)
	}
	r, off, err := d.reservationRange("map", va, size)
	if err != nil {
		return err
	}
	i := sort.Search(len(r.maps), func(i int) bool { return r.maps[i].off+r.maps[i].chunk.size > off })
	if i < len(r.maps) && r.maps[i].off < off+size {
		return fmt.Errorf("sim: map %d bytes at %#x: overlaps the chunk mapped at %#x: %w",
			size, uint64(va), uint64(r.start)+r.maps[i].off, device.ErrInvalid)
	}
	r.maps = slices.Insert(r.maps, i, &mapping{off: off, chunk: c})
	c.maps++
	return nil
}

// reservationRange checks that [va, va+size) is granularity-aligned and
// inside one reservation, and returns it with va's offset.
func (d *Device) reservationRange(op string, va device.Ptr, size uint64) (*region, uint64, error) {
	if uint64(va)%d.o.Granularity != 0 {
		return nil, 0, fmt.Errorf("sim: %s at %#x: address not aligned to the granularity %d: %w", op, uint64(va), d.o.Granularity, device.ErrInvalid)
	}
	r, _ := d.mem.find(va)
	if r == nil || r.kind != kindReserve {
		return nil, 0, fmt.Errorf("sim: %s at %#x: not in a reservation: %w", op, uint64(va), device.ErrInvalid)
	}
	off := uint64(va - r.start)
	if size > r.size-off {
		return nil, 0, fmt.Errorf("sim: %s %d bytes at %#x: crosses the end of the %d-byte reservation at %#x: %w",
			op, size, uint64(va), r.size, uint64(r.start), device.ErrInvalid)
	}
	return r, off, nil
}

// Unmap runs all queued work, then removes the mappings that exactly tile
// [va, va+size). A range that is partly unmapped or cuts a mapping fails
// with ErrInvalid and changes nothing. A released chunk's memory returns to
// the device when its last mapping goes.
func (d *Device) Unmap(va device.Ptr, size uint64) error {
	if err := d.vmm("unmap", size); err != nil {
		return err
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.mu.Unlock()
	r, off, err := d.reservationRange("unmap", va, size)
	if err != nil {
		return err
	}
	i := sort.Search(len(r.maps), func(i int) bool { return r.maps[i].off >= off })
	j, at := i, off
	for at < off+size {
		if j >= len(r.maps) || r.maps[j].off != at || r.maps[j].chunk.size > off+size-at {
			return fmt.Errorf("sim: unmap %d bytes at %#x: address %#x does not start a mapping wholly inside the range: %w",
				size, uint64(va), uint64(r.start)+at, device.ErrInvalid)
		}
		at += r.maps[j].chunk.size
		j++
	}
	d.drain()
	for _, m := range r.maps[i:j] {
		c := m.chunk
		c.maps--
		if c.released && c.maps == 0 {
			d.mem.physical -= c.size
			c.drop()
		}
	}
	r.maps = slices.Delete(r.maps, i, j)
	return nil
}
