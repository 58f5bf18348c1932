//go:build linux && (amd64 || arm64)

package vulkan

import (
	"os"
	"sync"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/memwall/memwall/pool"
)

var _ pool.PriorityAllocator = (*Device)(nil)

// allocSpy stands between the device and vkAllocateMemory and records the
// VkMemoryPriorityAllocateInfoEXT priority of every allocation (-1: none
// in the chain).
type allocSpy struct {
	mu    sync.Mutex
	sizes []uint64
	prios []float32
}

func (s *allocSpy) take() (sizes []uint64, prios []float32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sizes, prios = s.sizes, s.prios
	s.sizes, s.prios = nil, nil
	return sizes, prios
}

// spyAllocations routes d's vkAllocateMemory through a recording
// callback. On a driver without memory priority it turns the priority
// chain on (forced reports so); the chain then reaches that driver too,
// which ignores a structure of an extension it was not asked for.
func spyAllocations(t *testing.T, d *Device) (spy *allocSpy, forced bool) {
	spy = &allocSpy{}
	real := d.vk.allocateMemory
	cb := purego.NewCallback(func(dev uintptr, info *memoryAllocateInfo, alloc, mem uintptr) uintptr {
		prio := float32(-1)
		for p := info.pNext; p != 0; {
			// sType and pNext lead every chain structure. p is the address of
			// a pinned Go value; its bits are read as a pointer (not made by
			// arithmetic, which the race detector's checkptr refuses).
			hdr := *(**memoryPriorityAllocateInfo)(unsafe.Pointer(&p))
			if hdr.sType == stMemoryPriorityAllocateInfo {
				prio = hdr.priority
			}
			p = hdr.pNext
		}
		spy.mu.Lock()
		spy.sizes, spy.prios = append(spy.sizes, info.size), append(spy.prios, prio)
		spy.mu.Unlock()
		r, _, _ := purego.SyscallN(real, dev, uintptr(unsafe.Pointer(info)), alloc, mem)
		return r
	})
	d.vk.allocateMemory = cb
	forced = !d.hasPriority
	d.hasPriority = true
	t.Cleanup(func() { d.vk.allocateMemory = real })
	return spy, forced
}

// openHere opens the Vulkan device for this package's own tests, or skips
// (fails under MEMWALL_TEST_DEVICE=vulkan) without one; it closes at the
// end of the test.
func openHere(t *testing.T) *Device {
	t.Helper()
	d, err := Open(Options{})
	if err != nil {
		if os.Getenv("MEMWALL_TEST_DEVICE") == "vulkan" {
			t.Fatalf("MEMWALL_TEST_DEVICE=vulkan: %v", err)
		}
		t.Skipf("no usable Vulkan device here: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestPriorityReachesAllocate: Alloc asks vkAllocateMemory for priority
// 0.5, AllocPriority for its own, and a pool of weights
// (Options.Priority = PurposePriority(Weights)) takes each of its chunks
// at 1.0 while a pool of activations takes them at 0.5.
func TestPriorityReachesAllocate(t *testing.T) {
	d := openHere(t)
	spy, forced := spyAllocations(t, d)
	t.Logf("memory priority in the driver: %v", !forced)
	for _, c := range []struct {
		prio  float32
		alloc func() error
	}{
		{0.5, func() error { p, err := d.Alloc(1 << 20); d.Free(p); return err }},
		{1, func() error { p, err := d.AllocPriority(1<<20, 1); d.Free(p); return err }},
		{0.25, func() error { p, err := d.AllocPriority(1<<20, 0.25); d.Free(p); return err }},
	} {
		if err := c.alloc(); err != nil {
			t.Fatal(err)
		}
		if _, prios := spy.take(); len(prios) != 1 || prios[0] != c.prio {
			t.Errorf("want one vkAllocateMemory at priority %v, got %v", c.prio, prios)
		}
	}
	for _, purpose := range []pool.Purpose{pool.Weights, pool.Activations} {
		want := pool.PurposePriority(purpose)
		p, err := pool.New(d, pool.Options{Growth: pool.GrowChunks, ChunkBytes: 2 << 20, Priority: want, Cache: pool.CacheOff})
		if err != nil {
			t.Fatal(err)
		}
		var blocks []pool.Block
		for i := range 6 {
			b, err := p.Alloc(uint64(1+i)<<20, pool.AllocOptions{Purpose: purpose})
			if err != nil {
				t.Fatal(err)
			}
			blocks = append(blocks, b)
		}
		for _, b := range blocks {
			p.Free(b)
		}
		p.Close()
		sizes, prios := spy.take()
		if len(prios) < 2 {
			t.Fatalf("%s pool: %d allocations, want one per chunk", purpose, len(prios))
		}
		for i, pr := range prios {
			if pr != want {
				t.Errorf("%s pool: chunk %d (%d bytes) at priority %v, want %v", purpose, i, sizes[i], pr, want)
			}
		}
	}
}

// TestDefaultPoolPriorities: one pool made with pool.DefaultOptions (as
// the engine's and serve's are) over the Vulkan device gives a weight
// group its own chunk at priority 1.0 and a KV cache or staging block its
// own at 0.5, through to vkAllocateMemory.
func TestDefaultPoolPriorities(t *testing.T) {
	d := openHere(t)
	o := pool.DefaultOptions(d)
	if o.Growth != pool.GrowChunks || !o.PriorityByPurpose {
		t.Skipf("the default pool here grows by %v (PriorityByPurpose %v)", o.Growth, o.PriorityByPurpose)
	}
	p, err := pool.New(d, o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	spy, forced := spyAllocations(t, d)
	t.Logf("memory priority in the driver: %v", !forced)
	for _, c := range []struct {
		purpose pool.Purpose
		size    uint64
	}{{pool.Weights, 96 << 20}, {pool.KV, 64 << 20}, {pool.Weights, 40 << 20}, {pool.Staging, 48 << 20}} {
		b, err := p.Alloc(c.size, pool.AllocOptions{Purpose: c.purpose})
		if err != nil {
			t.Fatal(err)
		}
		sizes, prios := spy.take()
		if want := pool.PurposePriority(c.purpose); len(prios) != 1 || prios[0] != want || sizes[0] < c.size {
			t.Errorf("%s block of %d bytes: vkAllocateMemory %v at %v, want one at %v", c.purpose, c.size, sizes, prios, want)
		}
		defer p.Free(b)
	}
}
