package pool_test

import (
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/pool"
)

const mib = 1 << 20

// simVirtual is a metadata-only simulated device with 2 MiB pages, for
// tests that count the pool's device calls.
func simVirtual(t *testing.T) device.Device {
	o := sim.DefaultOptions()
	o.Backing = false
	o.VirtualMemory = true
	o.Granularity = 2 * mib
	d := sim.New(o)
	t.Cleanup(func() { d.Close() })
	return d
}

func mustAlloc(t *testing.T, p *pool.Pool, size uint64) pool.Block {
	t.Helper()
	b, err := p.Alloc(size, pool.AllocOptions{})
	if err != nil {
		t.Fatalf("alloc %d: %v", size, err)
	}
	return b
}

func mustFree(t *testing.T, p *pool.Pool, b pool.Block) {
	t.Helper()
	if err := p.Free(b); err != nil {
		t.Fatalf("free: %v", err)
	}
}

func checkBooks(t *testing.T, p *pool.Pool) {
	t.Helper()
	if err := pool.CheckPages(p); err != nil {
		t.Fatal(err)
	}
	if err := pool.CheckHandles(p); err != nil {
		t.Fatal(err)
	}
}

// holeOverGivenBackPage lays out x1 [0, 3 MiB), x2 [3, 11), x3 [11, 16)
// and x4 [16, 20) in a pool with no blocks yet, gives page 0 back to the
// device (x1 freed, Trim) and frees x3, whose pages stay mapped: best fit
// puts a block of up to 3 MiB in x1's hole, over the unmapped page, while
// x3's hole over mapped pages holds it too. It returns x1, whose address is
// the range's start.
func holeOverGivenBackPage(t *testing.T, p *pool.Pool) pool.Block {
	t.Helper()
	x1 := mustAlloc(t, p, 3*mib)
	mustAlloc(t, p, 8*mib)
	x3 := mustAlloc(t, p, 5*mib)
	mustAlloc(t, p, 4*mib)
	if off := uint64(x3.Ptr - x1.Ptr); off != 11*mib {
		t.Fatalf("setup: x3 at %d MiB from x1, want 11", off>>20)
	}
	mustFree(t, p, x1)
	if n := p.Trim(); n != 2*mib {
		t.Fatalf("trim gave back %d bytes, want the one free page", n)
	}
	mustFree(t, p, x3)
	return x1
}

// TestPlaceMapped: where best fit's choice for a block lies on a page that
// was given back while a free range over mapped pages holds the block,
// PlaceMapped puts it there with no device call; PlaceStrategy keeps best
// fit's choice and maps the page.
func TestPlaceMapped(t *testing.T) {
	for _, tc := range []struct {
		place    pool.Placement
		wantOff  uint64 // the block's offset from the first block
		wantMaps uint64 // maps the allocation makes
	}{
		{pool.PlaceMapped, 11 * mib, 0},
		{pool.PlaceStrategy, 0, 1},
	} {
		t.Run(tc.place.String(), func(t *testing.T) {
			p, err := pool.New(simVirtual(t), pool.Options{Cache: pool.CacheOff, Placement: tc.place})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			x1 := holeOverGivenBackPage(t, p)
			before := p.Stats()
			y := mustAlloc(t, p, 5*mib/2) // best fit: the 3 MiB hole at 0, over page 0
			after := p.Stats()
			if off := uint64(y.Ptr - x1.Ptr); off != tc.wantOff {
				t.Errorf("block at %.1f MiB, want %.1f", float64(off)/mib, float64(tc.wantOff)/mib)
			}
			if maps := after.Maps - before.Maps; maps != tc.wantMaps {
				t.Errorf("%d maps, want %d", maps, tc.wantMaps)
			}
			checkBooks(t, p)
		})
	}
}

// TestHandleRuns: with pages kept, a block over n unmapped pages maps them
// as one handle (one create and one map), which goes back to the device
// whole, and only once none of its pages holds a block; under a limit a
// handle covers at most a sixteenth of it; under the default soft target
// a small pool maps single pages, so that any free page can go back.
func TestHandleRuns(t *testing.T) {
	t.Run("keep", func(t *testing.T) {
		p, err := pool.New(simVirtual(t), pool.Options{Cache: pool.CacheOff, TargetRatio: pool.NoTarget})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		a := mustAlloc(t, p, 10*mib)
		if st := p.Stats(); st.DeviceAllocs != 1 || st.Maps != 1 || st.ReservedBytes != 10*mib {
			t.Fatalf("a 10 MiB block: %d creates, %d maps, %d bytes reserved; want 1, 1, 10 MiB", st.DeviceAllocs, st.Maps, st.ReservedBytes)
		}
		checkBooks(t, p)
		mustFree(t, p, a)
		b := mustAlloc(t, p, mib) // on the handle's first page
		if n := p.Trim(); n != 0 {
			t.Fatalf("trim gave back %d bytes of a handle still in use", n)
		}
		checkBooks(t, p)
		mustFree(t, p, b)
		if n := p.Trim(); n != 10*mib {
			t.Fatalf("trim gave back %d bytes, want the whole 10 MiB handle", n)
		}
		if st := p.Stats(); st.Unmaps != 1 || st.DeviceFrees != 1 || st.ReservedBytes != 0 {
			t.Fatalf("after trim: %d unmaps, %d releases, %d reserved; want 1, 1, 0", st.Unmaps, st.DeviceFrees, st.ReservedBytes)
		}
		checkBooks(t, p)
	})
	t.Run("limit", func(t *testing.T) {
		p, err := pool.New(simVirtual(t), pool.Options{Cache: pool.CacheOff, TargetRatio: pool.NoTarget, Limit: 64 * mib})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		mustAlloc(t, p, 10*mib) // handles of at most 4 MiB: 2 + 2 + 1 pages
		if st := p.Stats(); st.DeviceAllocs != 3 || st.Maps != 3 {
			t.Fatalf("a 10 MiB block under a 64 MiB limit: %d creates, %d maps; want 3, 3", st.DeviceAllocs, st.Maps)
		}
		checkBooks(t, p)
	})
	t.Run("target", func(t *testing.T) {
		p, err := pool.New(simVirtual(t), pool.Options{Cache: pool.CacheOff})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		mustAlloc(t, p, 10*mib)
		if st := p.Stats(); st.DeviceAllocs != 5 || st.Maps != 5 {
			t.Fatalf("a 10 MiB block under the default target: %d creates, %d maps; want 5, 5", st.DeviceAllocs, st.Maps)
		}
		checkBooks(t, p)
	})
}

// TestHandleMove: above the soft target, with no hold time (eager), the
// pages a block needs come from free handles, moved whole (one unmap and
// one map each) or released to pay for a new handle, so that a block over 75 unmapped pages costs far
// fewer than the two calls per page that single pages would, while the
// pool stays within its target (plus at most one handle).
func TestHandleMove(t *testing.T) {
	const target = 1.1
	p, err := pool.New(simVirtual(t), pool.Options{Cache: pool.CacheOff, TargetRatio: target, HoldTime: -1, Placement: pool.PlaceStrategy, ReserveBytes: 4 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	a := mustAlloc(t, p, 100*mib) // [0, 100)
	mustAlloc(t, p, 100*mib)      // [100, 200)
	c := mustAlloc(t, p, 100*mib) // [200, 300)
	mustAlloc(t, p, 2*mib)        // [300, 302)
	mustFree(t, p, a)
	mustFree(t, p, c) // two 100 MiB holes, mapped: 200 MiB free, the slack is 30
	before := p.Stats()
	mustAlloc(t, p, 150*mib) // fits neither hole: at the frontier, over 75 unmapped pages
	after := p.Stats()
	calls := after.DeviceCalls() - before.DeviceCalls()
	if calls == 0 || calls > 2*75/3 {
		t.Errorf("a block over 75 unmapped pages made %d device calls, want 1 to %d (single pages: 150)", calls, 2*75/3)
	}
	if after.Unmaps == before.Unmaps {
		t.Error("no free handle was moved or released above the target")
	}
	maxHandle := uint64((target - 1) * float64(after.PeakUsedBytes) / 2)
	if lim := uint64(target*float64(after.PeakUsedBytes)) + maxHandle; after.PeakReservedBytes > lim {
		t.Errorf("peak reserved %d MiB, target plus one handle %d MiB", after.PeakReservedBytes>>20, lim>>20)
	}
	checkBooks(t, p)
}

// TestSearchedNotParked: a block whose best-fit place lay on unmapped
// pages, placed by the search for mapped pages (PlaceMapped), is not parked
// for the next request of its size when it is freed: that request is
// placed by the arena again. A block at best fit's own choice on mapped
// pages is parked and serves the next request of its size whole, without
// the arena.
func TestSearchedNotParked(t *testing.T) {
	p, err := pool.New(simVirtual(t), pool.Options{Cache: pool.CacheShared})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	x1 := holeOverGivenBackPage(t, p)
	again := func(size uint64, wantOff uint64, parked bool) {
		t.Helper()
		b := mustAlloc(t, p, size)
		if off := uint64(b.Ptr - x1.Ptr); off != wantOff {
			t.Fatalf("%d-byte block at %.2f MiB, want %.2f", size, float64(off)/mib, float64(wantOff)/mib)
		}
		mustFree(t, p, b)
		before := pool.ArenaAllocs(p)
		b = mustAlloc(t, p, size)
		if off := uint64(b.Ptr - x1.Ptr); off != wantOff {
			t.Fatalf("the next %d-byte block at %.2f MiB, want %.2f", size, float64(off)/mib, float64(wantOff)/mib)
		}
		if fromArena := pool.ArenaAllocs(p) != before; fromArena == parked {
			t.Errorf("%d-byte block at %.2f MiB: next request from the arena %v, want %v", size, float64(wantOff)/mib, fromArena, !parked)
		}
		checkBooks(t, p)
	}
	// Best fit's choice, the 3 MiB hole at 0, lies over the unmapped page:
	// the block moves to x3's mapped pages and is not parked.
	again(5*mib/2, 11*mib, false)
	// Now held at 11 MiB: best fit puts 1 MiB in the 2.5 MiB hole after
	// it, on mapped pages, and the freed block is parked.
	again(mib, 11*mib+5*mib/2, true)
}
