package pool_test

import (
	"fmt"
	"slices"
	"sync"

	"github.com/memwall/memwall/device"
)

// shadowDevice wraps a device without backing bytes and keeps, for the
// words a test writes, which physical memory holds them: each allocation
// and each physical handle is an object, and an address resolves through
// the live allocations and mappings to (object, offset). Two blocks on one
// byte, a page mapped under two live blocks, a page moved away from under
// a live block, or a block on unmapped memory all show as a word that
// reads back wrong (or not at all), at the cost of a map lookup instead of
// real memory the size of the device.
type shadowDevice struct {
	device.Device
	mu      sync.Mutex
	next    uint64
	spans   []shadowSpan // allocations and mappings, sorted by va
	handles map[device.PhysMem]uint64
	words   map[uint64]map[uint64]uint64 // object -> offset -> word
}

// shadowSpan is an allocation or a mapping: [va, va+size) is object obj
// from offset off.
type shadowSpan struct {
	va   device.Ptr
	size uint64
	obj  uint64
}

func newShadow(d device.Device) *shadowDevice {
	return &shadowDevice{Device: d, handles: map[device.PhysMem]uint64{}, words: map[uint64]map[uint64]uint64{}}
}

func (s *shadowDevice) object() uint64 {
	s.next++
	s.words[s.next] = map[uint64]uint64{}
	return s.next
}

func (s *shadowDevice) insert(sp shadowSpan) {
	i, _ := slices.BinarySearchFunc(s.spans, sp.va, func(x shadowSpan, va device.Ptr) int { return cmpPtr(x.va, va) })
	s.spans = slices.Insert(s.spans, i, sp)
}

func cmpPtr(a, b device.Ptr) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// remove drops the span starting at va and returns it.
func (s *shadowDevice) remove(va device.Ptr) (shadowSpan, bool) {
	i, ok := slices.BinarySearchFunc(s.spans, va, func(x shadowSpan, va device.Ptr) int { return cmpPtr(x.va, va) })
	if !ok {
		return shadowSpan{}, false
	}
	sp := s.spans[i]
	s.spans = slices.Delete(s.spans, i, i+1)
	return sp, true
}

func (s *shadowDevice) Alloc(size uint64) (device.Ptr, error) {
	p, err := s.Device.Alloc(size)
	if err == nil {
		s.mu.Lock()
		s.insert(shadowSpan{va: p, size: size, obj: s.object()})
		s.mu.Unlock()
	}
	return p, err
}

func (s *shadowDevice) Free(p device.Ptr) error {
	err := s.Device.Free(p)
	if err == nil {
		s.mu.Lock()
		if sp, ok := s.remove(p); ok {
			delete(s.words, sp.obj)
		}
		s.mu.Unlock()
	}
	return err
}

func (s *shadowDevice) CreatePhysical(size uint64) (device.PhysMem, error) {
	h, err := s.Device.CreatePhysical(size)
	if err == nil {
		s.mu.Lock()
		s.handles[h] = s.object()
		s.mu.Unlock()
	}
	return h, err
}

func (s *shadowDevice) ReleasePhysical(h device.PhysMem) error {
	err := s.Device.ReleasePhysical(h)
	if err == nil {
		s.mu.Lock()
		delete(s.words, s.handles[h])
		delete(s.handles, h)
		s.mu.Unlock()
	}
	return err
}

func (s *shadowDevice) Map(va device.Ptr, size uint64, h device.PhysMem) error {
	err := s.Device.Map(va, size, h)
	if err == nil {
		s.mu.Lock()
		s.insert(shadowSpan{va: va, size: size, obj: s.handles[h]})
		s.mu.Unlock()
	}
	return err
}

func (s *shadowDevice) Unmap(va device.Ptr, size uint64) error {
	err := s.Device.Unmap(va, size)
	if err == nil {
		s.mu.Lock()
		for end := va + device.Ptr(size); va < end; {
			sp, ok := s.remove(va)
			if !ok {
				break
			}
			va += device.Ptr(sp.size)
		}
		s.mu.Unlock()
	}
	return err
}

// resolve returns the object and offset behind address p. Called with
// s.mu held.
func (s *shadowDevice) resolve(p device.Ptr) (obj, off uint64, err error) {
	i, _ := slices.BinarySearchFunc(s.spans, p, func(x shadowSpan, va device.Ptr) int {
		if x.va+device.Ptr(x.size) <= va {
			return -1
		}
		if x.va > va {
			return 1
		}
		return 0
	})
	if i == len(s.spans) || s.spans[i].va > p {
		return 0, 0, fmt.Errorf("address %#x is neither allocated nor mapped", uint64(p))
	}
	sp := s.spans[i]
	return sp.obj, uint64(p - sp.va), nil
}

// store writes word w at address p.
func (s *shadowDevice) store(p device.Ptr, w uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	obj, off, err := s.resolve(p)
	if err != nil {
		return err
	}
	s.words[obj][off] = w
	return nil
}

// drop forgets the word at address p (a block freed: its words are no
// longer checked, and keeping them would grow the maps with every block
// written).
func (s *shadowDevice) drop(p device.Ptr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if obj, off, err := s.resolve(p); err == nil {
		delete(s.words[obj], off)
	}
}

// load reads the word at address p (0 where nothing was written).
func (s *shadowDevice) load(p device.Ptr) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	obj, off, err := s.resolve(p)
	if err != nil {
		return 0, err
	}
	return s.words[obj][off], nil
}
