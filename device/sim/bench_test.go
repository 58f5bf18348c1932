package sim_test

import (
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/sim"
)

// BenchmarkAllocFree is one Alloc and one Free with 1000 other allocations
// live: the simulator's own cost per driver call pair (trace replay).
func BenchmarkAllocFree(b *testing.B) {
	o := sim.DefaultOptions()
	o.Backing = false
	d := sim.New(o)
	defer d.Close()
	for range 1000 {
		if _, err := d.Alloc(1 << 20); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for b.Loop() {
		p, err := d.Alloc(4096)
		if err != nil {
			b.Fatal(err)
		}
		if err := d.Free(p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkQueuedOp is the cost of submitting and running one memset on a
// metadata-only device, with four streams ordered by events.
func BenchmarkQueuedOp(b *testing.B) {
	o := sim.DefaultOptions()
	o.Backing = false
	d := sim.New(o)
	defer d.Close()
	p, _ := d.Alloc(1 << 20)
	var ss [4]device.Stream
	for i := range ss {
		ss[i], _ = d.NewStream()
	}
	e, _ := d.NewEvent(false)
	i := 0
	for b.Loop() {
		s := ss[i%4]
		if i%8 == 0 {
			_ = d.EventRecord(e, s)
			_ = d.StreamWaitEvent(ss[(i+1)%4], e)
		}
		if err := d.Memset8(p, 0, 1<<20, s); err != nil {
			b.Fatal(err)
		}
		i++
	}
	if err := d.Synchronize(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkCopyHtoD measures host throughput of a backed 64 MiB copy
// (host memmove plus bookkeeping), not the modelled PCIe time.
func BenchmarkCopyHtoD(b *testing.B) {
	d := sim.New(sim.DefaultOptions())
	defer d.Close()
	const n = 64 << 20
	p, _ := d.Alloc(n)
	s, _ := d.NewStream()
	src := make([]byte, n)
	b.SetBytes(n)
	for b.Loop() {
		if err := d.CopyHtoD(p, src, s); err != nil {
			b.Fatal(err)
		}
		if err := d.StreamSynchronize(s); err != nil {
			b.Fatal(err)
		}
	}
}
