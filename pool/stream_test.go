package pool_test

import (
	"encoding/binary"
	"os"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/pool"
)

func overlaps(a, b pool.Block) bool {
	return a.Ptr < b.Ptr+device.Ptr(b.Size) && b.Ptr < a.Ptr+device.Ptr(a.Size)
}

func readWords(t *testing.T, d device.Device, b pool.Block, s device.Stream) []uint32 {
	t.Helper()
	buf := make([]byte, b.Size)
	if err := d.CopyDtoH(buf, b.Ptr, s); err != nil {
		t.Fatal(err)
	}
	if err := d.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	w := make([]uint32, len(buf)/4)
	for i := range w {
		w[i] = binary.LittleEndian.Uint32(buf[4*i:])
	}
	return w
}

// TestStreamOrderedWithKernelRunning frees a block on s1 while a kernel is
// still running there and the block's last write is queued behind it. s1
// may reuse the block at once (its next write is ordered after the old
// one); s2 must not get it while s1's work is pending. Both blocks are
// checked after everything finishes.
func TestStreamOrderedWithKernelRunning(t *testing.T) {
	d := newSim(t, true, 1<<30)
	ks, err := kernels.Load(d, os.Getenv)
	if err != nil {
		t.Skipf("kernels unavailable on this device: %v", err)
	}
	defer ks.Close()
	p, err := pool.New(d, pool.Options{Cache: pool.CacheOff})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s1, _ := d.NewStream()
	s2, _ := d.NewStream()
	done, _ := d.NewEvent(false)
	const n = 4 << 20
	a, err := p.Alloc(n, pool.AllocOptions{Stream: s1})
	if err != nil {
		t.Fatal(err)
	}
	if err := ks.Spin(200*time.Millisecond, s1); err != nil {
		t.Fatal(err)
	}
	if err := d.Memset32(a.Ptr, 0xAAAAAAAA, n/4, s1); err != nil {
		t.Fatal(err)
	}
	if err := d.EventRecord(done, s1); err != nil {
		t.Fatal(err)
	}
	if err := p.FreeAsync(a, s1); err != nil {
		t.Fatal(err)
	}
	c, err := p.Alloc(n, pool.AllocOptions{Stream: s2})
	if err != nil {
		t.Fatal(err)
	}
	finished, err := d.EventQuery(done)
	if err != nil {
		t.Fatal(err)
	}
	if overlaps(a, c) && !finished {
		t.Fatalf("s2 got %#x, overlapping a block whose free on s1 is still pending", c.Ptr)
	}
	if err := d.Memset32(c.Ptr, 0xCCCCCCCC, n/4, s2); err != nil {
		t.Fatal(err)
	}
	b, err := p.Alloc(n, pool.AllocOptions{Stream: s1})
	if err != nil {
		t.Fatal(err)
	}
	if b.Ptr != a.Ptr && !finished {
		t.Logf("s1 did not reuse its own pending block (got %#x, freed %#x)", b.Ptr, a.Ptr)
	}
	if err := d.Memset32(b.Ptr, 0xBBBBBBBB, n/4, s1); err != nil {
		t.Fatal(err)
	}
	if err := d.Synchronize(); err != nil {
		t.Fatal(err)
	}
	for i, w := range readWords(t, d, c, s2) {
		if w != 0xCCCCCCCC {
			t.Fatalf("s2's block word %d = %#x: s1's queued write landed in it", i, w)
		}
	}
	for i, w := range readWords(t, d, b, s1) {
		if w != 0xBBBBBBBB {
			t.Fatalf("s1's reused block word %d = %#x: the reuse was not ordered after the old write", i, w)
		}
	}
	_ = p.FreeAsync(b, s1)
	_ = p.FreeAsync(c, s2)
}
