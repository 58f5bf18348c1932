package sim_test

import (
	"bytes"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/sim"
)

// rssBytes is the process's resident memory (VmRSS).
func rssBytes(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Skip("no VmRSS in /proc/self/status")
	return 0
}

// TestBackingCostsWrittenPages: a backed allocation or physical chunk costs
// host memory for the pages written, not for its size, and gives it back when
// freed: eight rounds of 1 GiB allocations and chunks, one word written per
// MiB, each read back and freed, leave the process's resident memory within
// 256 MiB of where it started. Every new allocation and chunk reads zero.
func TestBackingCostsWrittenPages(t *testing.T) {
	const gib, mib = 1 << 30, 1 << 20
	d := newDev(t, func(o *sim.Options) { o.TotalBytes = 4 * gib })
	s := get(d.NewStream()).ok(t)
	word, zero := []byte("memwall!"), make([]byte, 8)
	got := make([]byte, 8)
	touch := func(p device.Ptr) {
		t.Helper()
		for off := uint64(0); off < gib; off += mib {
			ok(t, d.CopyDtoH(got, p+device.Ptr(off), s))
			ok(t, d.StreamSynchronize(s))
			if !bytes.Equal(got, zero) {
				t.Fatalf("new memory at +%d reads %x, want zeros", off, got)
			}
			ok(t, d.CopyHtoD(p+device.Ptr(off), word, s))
		}
		ok(t, d.StreamSynchronize(s))
		ok(t, d.CopyDtoH(got, p+gib-mib, s))
		ok(t, d.StreamSynchronize(s))
		if !bytes.Equal(got, word) {
			t.Fatalf("last word reads %q, want %q", got, word)
		}
	}
	before := rssBytes(t)
	for range 8 {
		p := get(d.Alloc(gib)).ok(t)
		touch(p)
		ok(t, d.Free(p))
		va := get(d.Reserve(gib)).ok(t)
		h := get(d.CreatePhysical(gib)).ok(t)
		ok(t, d.Map(va, gib, h))
		touch(va)
		ok(t, d.Unmap(va, gib))
		ok(t, d.ReleasePhysical(h))
		ok(t, d.Unreserve(va, gib))
	}
	if after := rssBytes(t); after > before+256*mib {
		t.Errorf("resident memory grew from %d to %d MiB over 16 GiB of sparsely written allocations", before/mib, after/mib)
	}
}

// TestDroppedDeviceGivesBackBacking: the written bytes of a device that is
// dropped without Close return to the system once it is collected.
func TestDroppedDeviceGivesBackBacking(t *testing.T) {
	const size = 256 << 20
	before := rssBytes(t)
	func() {
		d := sim.New(sim.DefaultOptions())
		s := get(d.NewStream()).ok(t)
		p := get(d.Alloc(size)).ok(t)
		ok(t, d.Memset8(p, 1, size, s))
		ok(t, d.StreamSynchronize(s))
		if rss := rssBytes(t); rss < before+size/2 {
			t.Fatalf("resident memory %d MiB after writing %d MiB (from %d MiB): the bytes were not written", rss>>20, size>>20, before>>20)
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		runtime.GC()
		rss := rssBytes(t)
		if rss < before+size/4 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("resident memory %d MiB 5 s after the device was dropped (from %d MiB)", rss>>20, before>>20)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
