package sim_test

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/sim"
)

func TestAddressErrors(t *testing.T) {
	d := newDev(t, nil)
	s := get(d.NewStream()).ok(t)
	p := get(d.Alloc(4096)).ok(t)
	freed := get(d.Alloc(4096)).ok(t)
	ok(t, d.Free(freed))
	va := get(d.Reserve(4 << 20)).ok(t)
	buf := make([]byte, 8192)
	hex := func(p device.Ptr) string { return fmt.Sprintf("%#x", uint64(p)) }
	tests := []struct {
		name  string
		err   error
		frags []string
	}{
		{"H2D crossing the end", d.CopyHtoD(p+4000, buf[:200], s), []string{hex(p + 4000), "crosses the end", "4096-byte allocation"}},
		{"D2H crossing the end", d.CopyDtoH(buf[:4097], p, s), []string{"crosses the end"}},
		{"D2D source crossing the end", d.CopyDtoD(p, p+1, 4096, s), []string{"source", "crosses the end"}},
		{"memset crossing the end", d.Memset8(p+1, 0, 4096, s), []string{"crosses the end"}},
		{"unmapped address", d.CopyHtoD(0x1234, buf[:1], s), []string{"0x1234 is not mapped"}},
		{"freed allocation", d.CopyDtoH(buf[:1], freed, s), []string{hex(freed), "not mapped"}},
		{"reserved but unmapped", d.Memset8(va+100, 0, 1, s), []string{hex(va + 100), "is not mapped"}},
		{"wraparound", d.Memset8(p, 0, 1<<64-1, s), []string{"wraps around"}},
		{"memset32 unaligned", d.Memset32(p+2, 0, 1, s), []string{"not 4-byte aligned"}},
		{"free interior", d.Free(p + 512), []string{"inside the allocation", hex(p)}},
		{"double free", d.Free(freed), []string{"not an allocation"}},
		{"free null", d.Free(0), nil},
		{"alloc zero", get(d.Alloc(0)).err, nil},
		{"unknown stream", d.CopyHtoD(p, buf[:1], s+99), []string{"unknown stream"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { wantErr(t, tc.name, tc.err, device.ErrInvalid, tc.frags...) })
	}
	// Nothing bad was queued: the stream is clean.
	ok(t, d.StreamSynchronize(s))
}

func TestOutOfMemory(t *testing.T) {
	d := newDev(t, func(o *sim.Options) { o.TotalBytes = 64 << 20; o.HostBytes = 8 << 20 })
	p := get(d.Alloc(60 << 20)).ok(t)
	_, err := d.Alloc(5 << 20)
	wantErr(t, "alloc beyond total", err, device.ErrOutOfMemory, "5242880 bytes", "4194304 of 67108864 bytes free")
	_, err = d.Alloc(1 << 62)
	wantErr(t, "absurd alloc", err, device.ErrOutOfMemory)
	_, err = d.CreatePhysical(6 << 20)
	wantErr(t, "physical chunk beyond total", err, device.ErrOutOfMemory)
	_, err = d.HostAlloc(9 << 20)
	wantErr(t, "pinned host beyond HostBytes", err, device.ErrOutOfMemory, "pinned host limit")
	_, err = d.HostAlloc(1 << 62)
	wantErr(t, "absurd pinned host alloc", err, device.ErrOutOfMemory)
	ok(t, d.Free(p))
	q := get(d.Alloc(64 << 20)).ok(t) // all of it is back
	ok(t, d.Free(q))
}

func TestMemInfoAccounting(t *testing.T) {
	const g = 2 << 20
	d := newDev(t, nil)
	total := d.Info().TotalBytes
	free := func() uint64 {
		t.Helper()
		f, tot, err := d.MemInfo()
		ok(t, err)
		if tot != total {
			t.Fatalf("MemInfo total %d, want %d", tot, total)
		}
		return f
	}
	type step struct {
		name string
		do   func()
		used uint64
	}
	var steps []step
	var p device.Ptr
	var h1, h2 device.PhysMem
	var va device.Ptr
	steps = append(steps,
		step{"alloc 1000 bytes counts 1024", func() { p = get(d.Alloc(1000)).ok(t) }, 1024},
		step{"reserve costs nothing", func() { va = get(d.Reserve(4 * g)).ok(t) }, 1024},
		step{"two chunks", func() { h1, h2 = get(d.CreatePhysical(g)).ok(t), get(d.CreatePhysical(2*g)).ok(t) }, 1024 + 3*g},
		step{"mapping costs nothing", func() { ok(t, d.Map(va, g, h1)); ok(t, d.Map(va+g, 2*g, h2)) }, 1024 + 3*g},
		step{"release of a mapped chunk is deferred", func() { ok(t, d.ReleasePhysical(h2)) }, 1024 + 3*g},
		step{"unmap returns the released chunk", func() { ok(t, d.Unmap(va+g, 2*g)) }, 1024 + g},
		step{"unmapped chunk is kept until released", func() { ok(t, d.Unmap(va, g)) }, 1024 + g},
		step{"release of an unmapped chunk is immediate", func() { ok(t, d.ReleasePhysical(h1)) }, 1024},
		step{"free", func() { ok(t, d.Free(p)); ok(t, d.Unreserve(va, 4*g)) }, 0},
	)
	for _, st := range steps {
		st.do()
		if got := total - free(); got != st.used {
			t.Errorf("%s: %d bytes used, want %d", st.name, got, st.used)
		}
	}
	if s := d.Stats(); s.AllocatedBytes != 0 || s.PhysicalBytes != 0 {
		t.Errorf("stats after freeing everything: %+v", s)
	}
}

func TestIntegratedHostAllocCountsAgainstDevice(t *testing.T) {
	d := newDev(t, func(o *sim.Options) { o.Integrated = true })
	in := d.Info()
	if !in.Integrated || in.PCIeGen != 0 {
		t.Errorf("Info: integrated %v, PCIe gen %d", in.Integrated, in.PCIeGen)
	}
	f0, _, _ := d.MemInfo()
	hb := get(d.HostAlloc(8 << 20)).ok(t)
	f1, _, _ := d.MemInfo()
	if f0-f1 != 8<<20 {
		t.Errorf("HostAlloc of 8 MiB took %d bytes of device memory, want all of it", f0-f1)
	}
	ok(t, d.HostFree(hb))
	if f2, _, _ := d.MemInfo(); f2 != f0 {
		t.Errorf("after HostFree free is %d, want %d", f2, f0)
	}
}

func TestVirtualMemoryErrors(t *testing.T) {
	const g = 2 << 20
	d := newDev(t, nil)
	va := get(d.Reserve(4 * g)).ok(t)
	h := get(d.CreatePhysical(g)).ok(t)
	h2 := get(d.CreatePhysical(2 * g)).ok(t)
	p := get(d.Alloc(g)).ok(t)
	ok(t, d.Map(va+g, 2*g, h2))
	released := get(d.CreatePhysical(g)).ok(t)
	ok(t, d.ReleasePhysical(released))
	for _, tc := range []struct {
		name string
		err  error
		frag string
	}{
		{"reserve unaligned size", get(d.Reserve(g + 1)).err, "granularity"},
		{"map unaligned address", d.Map(va+4096, g, h), "not aligned"},
		{"map wrong size", d.Map(va, 2*g, h), "whole chunks"},
		{"map outside a reservation", d.Map(p, g, h), "not in a reservation"},
		{"map past the reservation end", d.Map(va+3*g, 2*g, h2), "crosses the end"},
		{"map over a mapping", d.Map(va+2*g, g, h), "overlaps"},
		{"map a released chunk", d.Map(va, g, released), "unknown or released"},
		{"release twice", d.ReleasePhysical(released), "already released"},
		{"unmap half a mapping", d.Unmap(va+g, g), "wholly inside"},
		{"unmap an unmapped range", d.Unmap(va, g), "does not start a mapping"},
		{"unreserve with mappings", d.Unreserve(va, 4*g), "still mapped"},
		{"unreserve wrong size", d.Unreserve(va, 2*g), "were reserved"},
		{"unreserve unknown", d.Unreserve(p, g), "not a reservation"},
	} {
		t.Run(tc.name, func(t *testing.T) { wantErr(t, tc.name, tc.err, device.ErrInvalid, tc.frag) })
	}
	off := newDev(t, func(o *sim.Options) { o.VirtualMemory = false })
	_, err := off.Reserve(g)
	wantErr(t, "reserve without virtual memory", err, device.ErrUnsupported)
	_, err = off.CreatePhysical(g)
	wantErr(t, "create without virtual memory", err, device.ErrUnsupported)
}

func TestVirtualMemoryAliasing(t *testing.T) {
	const g = 2 << 20
	d := newDev(t, nil)
	s := get(d.NewStream()).ok(t)
	va := get(d.Reserve(2 * g)).ok(t)
	vb := get(d.Reserve(g)).ok(t)
	h := get(d.CreatePhysical(g)).ok(t)
	ok(t, d.Map(va, g, h))
	ok(t, d.Map(vb, g, h)) // the same chunk at two addresses
	data := bytes.Repeat([]byte{7}, 100)
	ok(t, d.CopyHtoD(va+5, data, s))
	got := make([]byte, 100)
	ok(t, d.CopyDtoH(got, vb+5, s))
	ok(t, d.StreamSynchronize(s))
	if !bytes.Equal(got, data) {
		t.Error("a write through one mapping is not visible through the other")
	}
}

func TestReadOnlyHostMemory(t *testing.T) {
	d := newDev(t, func(o *sim.Options) { o.Kernels = append(o.Kernels, writeKernel, readKernel) })
	s := get(d.NewStream()).ok(t)
	b := bytes.Repeat([]byte{3}, 1<<16)
	hb := get(d.HostRegister(b, device.RegisterReadOnly|device.RegisterDeviceMap)).ok(t)
	dev := get(d.Alloc(1 << 16)).ok(t)
	ro := fmt.Sprintf("%#x", uint64(hb.DevicePtr))
	wantErr(t, "H2D into read-only", d.CopyHtoD(hb.DevicePtr, make([]byte, 10), s), device.ErrInvalid, "read-only", ro)
	wantErr(t, "D2D into read-only", d.CopyDtoD(hb.DevicePtr+8, dev, 10, s), device.ErrInvalid, "read-only")
	wantErr(t, "memset into read-only", d.Memset8(hb.DevicePtr, 0, 10, s), device.ErrInvalid, "read-only")
	// Reading is fine, by copy and by kernel.
	ok(t, d.CopyDtoD(dev, hb.DevicePtr, 1<<16, s))
	mod := get(d.LoadModule(nil)).ok(t)
	rd := get(d.Function(mod, "read")).ok(t)
	ok(t, d.Launch(rd, dim(1), dim(1), 0, s, hb.DevicePtr, uint64(100)))
	ok(t, d.StreamSynchronize(s))
	// A kernel writing it fails at the next synchronize and leaves it intact.
	wr := get(d.Function(mod, "write")).ok(t)
	ok(t, d.Launch(wr, dim(1), dim(1), 0, s, hb.DevicePtr+10, uint64(100)))
	wantErr(t, "kernel write into read-only", d.StreamSynchronize(s), device.ErrInvalid, "kernel write", "read-only host memory", fmt.Sprintf("%#x", uint64(hb.DevicePtr+10)))
	if !bytes.Equal(b, bytes.Repeat([]byte{3}, 1<<16)) {
		t.Error("read-only host memory changed")
	}
	ok(t, d.StreamSynchronize(s)) // reported once
	// Overlapping registration, and read-only without support.
	_, err := d.HostRegister(b[100:200], 0)
	wantErr(t, "overlapping register", err, device.ErrInvalid, "overlaps")
	ok(t, d.HostFree(hb))
	_, err = newDev(t, func(o *sim.Options) { o.ReadOnlyHostRegister = false }).HostRegister(b, device.RegisterReadOnly)
	wantErr(t, "read-only without support", err, device.ErrUnsupported)
	// Without host mapping there is no DevicePtr.
	nomap := newDev(t, func(o *sim.Options) { o.CanMapHostMemory = false })
	if hb := get(nomap.HostAlloc(4096)).ok(t); hb.DevicePtr != 0 {
		t.Errorf("HostAlloc without host mapping has DevicePtr %#x", uint64(hb.DevicePtr))
	}
	if hb := get(nomap.HostRegister(make([]byte, 4096), device.RegisterDeviceMap)).ok(t); hb.DevicePtr != 0 {
		t.Errorf("HostRegister without host mapping has DevicePtr %#x", uint64(hb.DevicePtr))
	}
}

// writeKernel writes n bytes of 0xEE at a Ptr; readKernel sums them.
var (
	writeKernel = sim.Kernel{Name: "write", Run: func(m *sim.Mem, _, _ device.Dim3, args []any) error {
		b, err := m.Bytes(args[0].(device.Ptr), args[1].(uint64))
		if err != nil {
			return err
		}
		for i := range b {
			b[i] = 0xEE
		}
		return nil
	}}
	readKernel = sim.Kernel{Name: "read", Run: func(m *sim.Mem, _, _ device.Dim3, args []any) error {
		b, err := m.Bytes(args[0].(device.Ptr), args[1].(uint64))
		if err != nil {
			return err
		}
		sum := 0
		for _, c := range b {
			sum += int(c)
		}
		if sum != 3*len(b) {
			return fmt.Errorf("read %d, want %d", sum, 3*len(b))
		}
		return nil
	}}
)

func TestBackingOff(t *testing.T) {
	ran := false
	k := sim.Kernel{Name: "spy", Run: func(*sim.Mem, device.Dim3, device.Dim3, []any) error { ran = true; return nil }}
	d := newDev(t, func(o *sim.Options) { o.Backing = false; o.Kernels = []sim.Kernel{k} })
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	s := get(d.NewStream()).ok(t)
	p := get(d.Alloc(6 << 30)).ok(t)
	out := bytes.Repeat([]byte{1}, 4096)
	ok(t, d.Memset8(p, 9, 6<<30, s))
	ok(t, d.CopyDtoH(out, p+(5<<30), s))
	f := get(d.Function(get(d.LoadModule(nil)).ok(t), "spy")).ok(t)
	ok(t, d.Launch(f, dim(1), dim(1), 0, s, p))
	ok(t, d.StreamSynchronize(s))
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 64<<20 {
		t.Errorf("metadata-only device grew the heap by %d bytes", grew)
	}
	if out[0] != 1 {
		t.Error("metadata-only device wrote host memory")
	}
	if ran {
		t.Error("metadata-only device ran a kernel's Go implementation")
	}
	if d.Now() == 0 {
		t.Error("metadata-only work took no simulated time")
	}
	// Addresses are still checked.
	wantErr(t, "out of range without backing", d.CopyDtoH(out, p+(6<<30)-10, s), device.ErrInvalid, "crosses the end")
}

func TestReservationAndAddressReuse(t *testing.T) {
	d := newDev(t, nil)
	seen := map[device.Ptr]bool{}
	for range 100 {
		p := get(d.Alloc(1000)).ok(t)
		if seen[p] {
			t.Fatalf("address %#x handed out twice before the address space wrapped", uint64(p))
		}
		seen[p] = true
		ok(t, d.Free(p))
	}
	va := get(d.Reserve(64 << 30)).ok(t)
	if uint64(va)%(2<<20) != 0 {
		t.Errorf("reservation %#x not aligned to the granularity", uint64(va))
	}
	_, err := d.Reserve(1 << 62)
	wantErr(t, "absurd reservation", err, device.ErrOutOfMemory, "address space")
	ok(t, d.Unreserve(va, 64<<30))
}

func TestClose(t *testing.T) {
	d := sim.New(sim.DefaultOptions())
	s := get(d.NewStream()).ok(t)
	p := get(d.Alloc(4096)).ok(t)
	out := make([]byte, 4)
	ok(t, d.Memset8(p, 4, 4096, s))
	ok(t, d.CopyDtoH(out, p, s))
	ok(t, d.Close())
	if out[0] != 4 {
		t.Error("Close did not run queued work")
	}
	ok(t, d.Close())
	for name, err := range map[string]error{
		"Alloc":             get(d.Alloc(1)).err,
		"StreamSynchronize": d.StreamSynchronize(s),
		"Free":              d.Free(p),
		"Synchronize":       d.Synchronize(),
	} {
		if !errors.Is(err, device.ErrInvalid) {
			t.Errorf("%s after Close = %v, want ErrInvalid", name, err)
		}
	}
}

// TestFreeWaitsForQueuedWork: Free, HostFree and Unmap run all queued work
// first, as the driver's free waits, so a queued copy out of the memory
// being freed still sees its data.
func TestFreeWaitsForQueuedWork(t *testing.T) {
	const g = 2 << 20
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, d *sim.Device, s device.Stream, out []byte)
	}{
		{"Free", func(t *testing.T, d *sim.Device, s device.Stream, out []byte) {
			p := get(d.Alloc(4096)).ok(t)
			ok(t, d.Memset8(p, 7, 4096, s))
			ok(t, d.CopyDtoH(out, p, s))
			ok(t, d.Free(p))
		}},
		{"HostFree", func(t *testing.T, d *sim.Device, s device.Stream, out []byte) {
			hb := get(d.HostAlloc(4096)).ok(t)
			ok(t, d.Memset8(hb.DevicePtr, 7, 4096, s))
			ok(t, d.CopyDtoH(out, hb.DevicePtr, s))
			ok(t, d.HostFree(hb))
		}},
		{"Unmap", func(t *testing.T, d *sim.Device, s device.Stream, out []byte) {
			va := get(d.Reserve(g)).ok(t)
			ok(t, d.Map(va, g, get(d.CreatePhysical(g)).ok(t)))
			ok(t, d.Memset8(va, 7, 4096, s))
			ok(t, d.CopyDtoH(out, va, s))
			ok(t, d.Unmap(va, g))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDev(t, nil)
			out := make([]byte, 16)
			tc.run(t, d, get(d.NewStream()).ok(t), out)
			if out[0] != 7 || d.Stats().Pending != 0 {
				t.Errorf("%s returned with the copy not run (out %v, %d pending)", tc.name, out[:2], d.Stats().Pending)
			}
		})
	}
}
