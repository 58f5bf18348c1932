package vulkan_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/vulkan"
	"github.com/memwall/memwall/kernels/spirv"
)

// model is the host's copy of what every live allocation must hold.
type model struct {
	ptrs  []device.Ptr
	bytes map[device.Ptr][]byte
}

// opRunner applies a byte-coded sequence of operations to the device and to
// the model, checking the device against the model as it goes.
type opRunner struct {
	t      *testing.T
	d      *vulkan.Device
	s      [2]device.Stream
	e      device.Event
	pinned *device.HostBuffer
	m      model
}

const maxAllocBytes = 1 << 20

func newRunner(t *testing.T, d *vulkan.Device) *opRunner {
	r := &opRunner{t: t, d: d, m: model{bytes: map[device.Ptr][]byte{}}}
	var err error
	for i := range r.s {
		if r.s[i], err = d.NewStream(); err != nil {
			t.Fatal(err)
		}
	}
	if r.e, err = d.NewEvent(false); err != nil {
		t.Fatal(err)
	}
	if r.pinned, err = d.HostAlloc(maxAllocBytes); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *opRunner) close() {
	r.d.Synchronize()
	for _, p := range r.m.ptrs {
		r.d.Free(p)
	}
	r.d.HostFree(r.pinned)
	r.d.DestroyEvent(r.e)
	for _, s := range r.s {
		r.d.DestroyStream(s)
	}
}

func (r *opRunner) fatalf(format string, a ...any) {
	r.t.Helper()
	r.t.Fatalf(format, a...)
}

// pick returns a live allocation and a sub-range [off, off+n) of it drawn
// from x.
func (r *opRunner) pick(x *rand.Rand) (device.Ptr, []byte, uint64, uint64) {
	p := r.m.ptrs[x.IntN(len(r.m.ptrs))]
	b := r.m.bytes[p]
	off := x.Uint64N(uint64(len(b)))
	n := 1 + x.Uint64N(uint64(len(b))-off)
	return p, b, off, n
}

// step applies one operation chosen by op, with its arguments drawn from x.
// Work alternates between two streams ordered by an event, so every
// operation sees the ones before it.
func (r *opRunner) step(i int, op byte, x *rand.Rand) {
	d := r.d
	s := r.s[i%2]
	if err := d.StreamWaitEvent(s, r.e); err != nil {
		r.fatalf("op %d: StreamWaitEvent: %v", i, err)
	}
	if len(r.m.ptrs) == 0 {
		op = 0
	}
	switch op % 8 {
	case 0: // alloc, zeroed with Memset8
		n := 1 + x.Uint64N(maxAllocBytes)
		p, err := d.Alloc(n)
		if err != nil {
			r.fatalf("op %d: Alloc(%d): %v", i, n, err)
		}
		if err := d.Memset8(p, 0, n, s); err != nil {
			r.fatalf("op %d: Memset8: %v", i, err)
		}
		r.m.ptrs = append(r.m.ptrs, p)
		r.m.bytes[p] = make([]byte, n)
	case 1: // free
		k := x.IntN(len(r.m.ptrs))
		p := r.m.ptrs[k]
		if err := d.Free(p); err != nil {
			r.fatalf("op %d: Free: %v", i, err)
		}
		r.m.ptrs = append(r.m.ptrs[:k], r.m.ptrs[k+1:]...)
		delete(r.m.bytes, p)
	case 2, 3: // H2D from pageable or pinned memory
		p, b, off, n := r.pick(x)
		src := make([]byte, n)
		if op%8 == 3 {
			src = r.pinned.Bytes[:n]
			if err := d.StreamSynchronize(r.s[(i+1)%2]); err != nil { // the other stream may still read it
				r.fatalf("op %d: %v", i, err)
			}
			if err := d.StreamSynchronize(s); err != nil {
				r.fatalf("op %d: %v", i, err)
			}
		}
		for j := range src {
			src[j] = byte(x.Uint32())
		}
		if err := d.CopyHtoD(p.Add(off), src, s); err != nil {
			r.fatalf("op %d: CopyHtoD: %v", i, err)
		}
		copy(b[off:], src)
	case 4: // D2D between (possibly the same) allocations, non-overlapping
		p, b, off, n := r.pick(x)
		q := r.m.ptrs[x.IntN(len(r.m.ptrs))]
		c := r.m.bytes[q]
		n = min(n, uint64(len(c)))
		qoff := x.Uint64N(uint64(len(c)) - n + 1)
		if p == q && off < qoff+n && qoff < off+n {
			return
		}
		if err := d.CopyDtoD(p.Add(off), q.Add(qoff), n, s); err != nil {
			r.fatalf("op %d: CopyDtoD: %v", i, err)
		}
		copy(b[off:off+n], c[qoff:qoff+n])
	case 5: // Memset8 at any alignment
		p, b, off, n := r.pick(x)
		v := byte(x.Uint32())
		if err := d.Memset8(p.Add(off), v, n, s); err != nil {
			r.fatalf("op %d: Memset8(+%d, %d): %v", i, off, n, err)
		}
		for j := off; j < off+n; j++ {
			b[j] = v
		}
	case 6: // Memset32 at a 4-byte aligned offset
		p, b, off, _ := r.pick(x)
		off &^= 3
		words := (uint64(len(b)) - off) / 4
		if words == 0 {
			return
		}
		words = 1 + x.Uint64N(words)
		v := x.Uint32()
		if err := d.Memset32(p.Add(off), v, words, s); err != nil {
			r.fatalf("op %d: Memset32: %v", i, err)
		}
		for j := range words {
			binary.LittleEndian.PutUint32(b[off+4*j:], v)
		}
	case 7: // read back a range, into pageable or pinned memory, and compare
		p, b, off, n := r.pick(x)
		got := make([]byte, n)
		if x.IntN(2) == 0 {
			for _, st := range []device.Stream{r.s[(i+1)%2], s} { // an H2D may still read the pinned buffer
				if err := d.StreamSynchronize(st); err != nil {
					r.fatalf("op %d: %v", i, err)
				}
			}
			got = r.pinned.Bytes[:n]
		}
		if err := d.CopyDtoH(got, p.Add(off), s); err != nil {
			r.fatalf("op %d: CopyDtoH: %v", i, err)
		}
		if err := d.StreamSynchronize(s); err != nil { // a copy into pinned memory is asynchronous
			r.fatalf("op %d: %v", i, err)
		}
		if !bytes.Equal(got, b[off:off+n]) {
			r.fatalf("op %d: %d bytes at +%d of a %d-byte allocation differ from the model", i, n, off, len(b))
		}
	}
	if err := d.EventRecord(r.e, s); err != nil {
		r.fatalf("op %d: EventRecord: %v", i, err)
	}
}

// checkAll reads every live allocation back.
func (r *opRunner) checkAll(i int) {
	s := r.s[0]
	if err := r.d.StreamWaitEvent(s, r.e); err != nil {
		r.fatalf("%v", err)
	}
	for _, p := range r.m.ptrs {
		want := r.m.bytes[p]
		got := make([]byte, len(want))
		if err := r.d.CopyDtoH(got, p, s); err != nil {
			r.fatalf("after op %d: CopyDtoH: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			r.fatalf("after op %d: the %d-byte allocation at %#x differs from the model", i, len(want), uint64(p))
		}
	}
}

// TestRandomOps runs long random sequences of allocations, frees, copies
// of every kind and memsets at every alignment on two event-ordered
// streams, checking each read against a host model and every allocation
// at intervals; three sequences on the default device, two with copies
// split over queues and D2D by shader.
func TestRandomOps(t *testing.T) {
	d := open(t)
	// Copies between host-visible memory and the device split over three
	// queues from 4 KiB up, and device-to-device copies as shaders even on
	// a CPU driver.
	split := openWith(t, vulkan.Options{CopyQueues: 3, Getenv: func(k string) string {
		if k == "MEMWALL_VULKAN_SHADER_COPY" {
			return "1"
		}
		return os.Getenv(k)
	}})
	vulkan.SetSplitMin(split, 4096)
	steps := 600
	if testing.Short() {
		steps = 200
	}
	for seed := range uint64(5) {
		d := d
		if seed >= 3 {
			d = split
		}
		r := newRunner(t, d)
		x := rand.New(rand.NewPCG(seed, 99))
		for i := range steps {
			r.step(i, byte(x.Uint32()), x)
			if i%50 == 49 {
				r.checkAll(i)
			}
		}
		r.checkAll(steps)
		r.close()
	}
	if vulkan.SplitCopies(split) == 0 {
		t.Error("no copy was split over the copy queues")
	}
	t.Logf("%d copies split", vulkan.SplitCopies(split))
}

// FuzzOps decodes the fuzzer's bytes as an operation sequence (one byte
// per operation, its arguments drawn from a generator seeded by the
// sequence) and checks it as TestRandomOps does.
func FuzzOps(f *testing.F) {
	f.Add([]byte{0, 2, 7, 5, 7, 6, 7, 4, 7})
	f.Add([]byte{0, 0, 3, 4, 4, 5, 1, 7, 0, 6, 7})
	d := open(f)
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 64 {
			ops = ops[:64]
		}
		r := newRunner(t, d)
		defer r.close()
		x := rand.New(rand.NewPCG(uint64(len(ops)), binary.LittleEndian.Uint64(append(append([]byte(nil), ops...), make([]byte, 8)...))))
		for i, op := range ops {
			r.step(i, op, x)
		}
		r.checkAll(len(ops))
	})
}

// FuzzSplitSPIRV: SplitSPIRV never panics, and what it accepts it splits
// into modules that concatenate back to the input, each opening with the
// magic number.
func FuzzSplitSPIRV(f *testing.F) {
	m := spirv.Module()
	f.Add(m)
	f.Add(m[:len(m)/2])
	f.Add([]byte{3, 2, 35, 7, 0, 0, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		mods, entries, err := vulkan.SplitSPIRV(b)
		if err != nil {
			if !errors.Is(err, device.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if len(mods) != len(entries) {
			t.Fatalf("%d modules, %d entry lists", len(mods), len(entries))
		}
		if !bytes.Equal(bytes.Join(mods, nil), b) {
			t.Fatal("the modules do not concatenate to the input")
		}
		for i, mod := range mods {
			if binary.LittleEndian.Uint32(mod) != 0x07230203 {
				t.Fatalf("module %d lacks the magic number", i)
			}
		}
	})
}

// TestCopyDtoDRandom copies random ranges between device allocations —
// 16-byte aligned and large (the shader path) and not (vkCmdCopyBuffer) —
// and checks every byte of the destination: the copied range equals the
// source, the rest is untouched.
func TestCopyDtoDRandom(t *testing.T) {
	for _, shader := range []string{"", "1", "0"} {
		d := openWith(t, vulkan.Options{Getenv: func(k string) string {
			if k == "MEMWALL_VULKAN_SHADER_COPY" {
				return shader
			}
			return os.Getenv(k)
		}})
		t.Run("MEMWALL_VULKAN_SHADER_COPY="+shader, func(t *testing.T) {
			if got := vulkan.ShaderCopy(d); shader != "" && got != (shader == "1") && d.Details().BufferDeviceAddress {
				t.Fatalf("shader copy %v", got)
			}
			copyDtoDRandom(t, d)
		})
	}
}

func copyDtoDRandom(t *testing.T, d *vulkan.Device) {
	t.Logf("shader copy: %v", vulkan.ShaderCopy(d))
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	const size = 4 << 20
	src, err := d.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := d.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i*31 + i>>11)
	}
	if err := d.CopyHtoD(src, want, s); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 17))
	cur := make([]byte, size)
	if err := d.Memset8(dst, 0, size, s); err != nil {
		t.Fatal(err)
	}
	for it := range 40 {
		var so, do, n uint64
		if it%2 == 0 { // the aligned, large case
			n = 16 * (4096 + r.Uint64N(size/16-4096))
			so, do = 16*r.Uint64N((size-n)/16+1), 16*r.Uint64N((size-n)/16+1)
		} else {
			n = 1 + r.Uint64N(size/2)
			so, do = r.Uint64N(size-n+1), r.Uint64N(size-n+1)
		}
		if err := d.CopyDtoD(dst.Add(do), src.Add(so), n, s); err != nil {
			t.Fatalf("copy %d: %v", it, err)
		}
		copy(cur[do:do+n], want[so:so+n])
		got := make([]byte, size)
		if err := d.CopyDtoH(got, dst, s); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, cur) {
			i := 0
			for got[i] == cur[i] {
				i++
			}
			t.Fatalf("copy %d (%d bytes, %d -> %d): byte %d is %d, want %d", it, n, so, do, i, got[i], cur[i])
		}
	}
}

// TestSplitCopiesRandom: with CopyQueues 3, random large copies between
// host-visible memory and the device arrive whole, and an event recorded
// after one covers all of its parts: a second stream that waits on it and
// copies the bytes on sees every one of them.
func TestSplitCopiesRandom(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: copies of 32-48 MiB")
	}
	d := openWith(t, vulkan.Options{CopyQueues: 3})
	const size = 48 << 20
	up, err := d.HostAlloc(size)
	if err != nil {
		t.Fatal(err)
	}
	down, err := d.HostAlloc(size)
	if err != nil {
		t.Fatal(err)
	}
	a, err := d.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	s1, _ := d.NewStream()
	s2, _ := d.NewStream()
	ev, _ := d.NewEvent(false)
	r := rand.New(rand.NewPCG(5, 9))
	for it := range 6 {
		n := uint64(32<<20) + r.Uint64N(size-32<<20)
		ho, do := r.Uint64N(size-n+1), r.Uint64N(size-n+1)
		for i := range up.Bytes[ho : ho+n] {
			up.Bytes[ho+uint64(i)] = byte(i*7 + it)
		}
		if err := d.CopyHtoD(a.Add(do), up.Bytes[ho:ho+n], s1); err != nil {
			t.Fatal(err)
		}
		if err := d.EventRecord(ev, s1); err != nil {
			t.Fatal(err)
		}
		if err := d.StreamWaitEvent(s2, ev); err != nil {
			t.Fatal(err)
		}
		if err := d.CopyDtoD(b, a.Add(do), n, s2); err != nil {
			t.Fatal(err)
		}
		if err := d.CopyDtoH(down.Bytes[:n], b, s2); err != nil {
			t.Fatal(err)
		}
		if err := d.StreamSynchronize(s2); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(down.Bytes[:n], up.Bytes[ho:ho+n]) {
			i := 0
			for down.Bytes[i] == up.Bytes[ho+uint64(i)] {
				i++
			}
			t.Fatalf("copy %d (%d bytes): byte %d differs", it, n, i)
		}
	}
	if vulkan.SplitCopies(d) < 12 {
		t.Errorf("%d split copies, want 12", vulkan.SplitCopies(d))
	}
}
