// Package devicetest is the conformance suite every device.Device
// implementation passes: the simulator, the fault-injecting wrapper and the
// CUDA backend on a real GPU run the same subtests, so that what passes on
// the simulator means something on the GPU.
//
// The suite checks only what the device contract promises: data arrives,
// work on a stream runs in order, events order work across streams, errors
// wrap the device package's sentinels. It never provokes errors that a GPU
// reports asynchronously (out-of-range device accesses), since those can
// poison a real device context for the rest of the run.
package devicetest

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/internal/longtest"
)

// Options tune the suite.
type Options struct {
	// LoadKernels loads a module that holds memwall_fill_u32(dst Ptr,
	// n uint64, seed uint32), which writes Pattern(seed, i) to word i of the
	// n 32-bit words at dst. Nil skips the kernel subtests.
	LoadKernels func(device.Device) (device.Module, error)
	// LargeBytes is the size of the large copies (default 6 MiB + 12 KiB,
	// 64 MiB with -long, 4 MiB with -short); it is rounded down to a
	// multiple of 4 KiB and must be at least 1 MiB.
	LargeBytes uint64
}

// FillKernel is the kernel name the kernel subtest launches.
const FillKernel = "memwall_fill_u32"

// Pattern is the specification of memwall_fill_u32: the word it writes at
// index i for a seed (a multiplicative hash of the low 32 bits of i, xored
// with the seed, then the murmur3 finalizer).
func Pattern(seed uint32, i uint64) uint32 {
	x := uint32(i)*0x9E3779B1 ^ seed
	x ^= x >> 16
	x *= 0x85EBCA6B
	x ^= x >> 13
	x *= 0xC2B2AE35
	x ^= x >> 16
	return x
}

// Run runs the conformance subtests. open is called once per subtest and
// must return a ready device; it owns the device's lifetime (register Close
// with t.Cleanup there if needed). The suite frees everything it allocates.
func Run(t *testing.T, open func(t *testing.T) device.Device, opts Options) {
	if opts.LargeBytes == 0 {
		// Above the 2 MiB page and not a power of two by default; the
		// hundreds of MiB a real device is held to under -long.
		opts.LargeBytes = longtest.Choose[uint64](6<<20+12<<10, 64<<20)
		if testing.Short() && !longtest.Enabled() {
			opts.LargeBytes = 4 << 20
		}
	}
	opts.LargeBytes &^= 4<<10 - 1
	if opts.LargeBytes < 1<<20 {
		t.Fatalf("devicetest: Options.LargeBytes %d is below 1 MiB", opts.LargeBytes)
	}
	tests := []struct {
		name string
		fn   func(t *testing.T, d device.Device, o Options)
	}{
		{"Info", testInfo},
		{"MemInfo", testMemInfo},
		{"AllocFree", testAllocFree},
		{"BadFree", testBadFree},
		{"OutOfMemory", testOutOfMemory},
		{"Memset", testMemset},
		{"CopyRoundTrip", testCopyRoundTrip},
		{"CopyInterior", testCopyInterior},
		{"StreamOrder", testStreamOrder},
		{"EventOrder", testEventOrder},
		{"EventQuery", testEventQuery},
		{"EventElapsed", testEventElapsed},
		{"WaitNeverRecorded", testWaitNeverRecorded},
		{"StreamLifecycle", testStreamLifecycle},
		{"UnknownHandles", testUnknownHandles},
		{"VirtualMemory", testVirtualMemory},
		{"HostMapped", testHostMapped},
		{"HostRegister", testHostRegister},
		{"HostRegisterReadOnlyFile", testHostRegisterReadOnlyFile},
		{"Kernel", testKernel},
		{"Concurrent", testConcurrent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := open(t)
			if d == nil {
				t.Fatal("open returned a nil device")
			}
			tc.fn(t, d, opts)
		})
	}
}

// ---------------------------------------------------------------------------
// Helpers. Each registers its own cleanup, so subtests free what they take.

func check(t *testing.T, err error, format string, a ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(format, a...), err)
	}
}

func newStream(t *testing.T, d device.Device) device.Stream {
	t.Helper()
	s, err := d.NewStream()
	check(t, err, "NewStream")
	t.Cleanup(func() {
		if err := d.DestroyStream(s); err != nil {
			t.Errorf("DestroyStream: %v", err)
		}
	})
	return s
}

func newEvent(t *testing.T, d device.Device, timing bool) device.Event {
	t.Helper()
	e, err := d.NewEvent(timing)
	check(t, err, "NewEvent(%v)", timing)
	t.Cleanup(func() {
		if err := d.DestroyEvent(e); err != nil {
			t.Errorf("DestroyEvent: %v", err)
		}
	})
	return e
}

func alloc(t *testing.T, d device.Device, n uint64) device.Ptr {
	t.Helper()
	p, err := d.Alloc(n)
	check(t, err, "Alloc(%d)", n)
	if p == 0 {
		t.Fatalf("Alloc(%d) returned the null pointer", n)
	}
	t.Cleanup(func() {
		if err := d.Free(p); err != nil {
			t.Errorf("Free(%#x): %v", uint64(p), err)
		}
	})
	return p
}

func hostAlloc(t *testing.T, d device.Device, n uint64) *device.HostBuffer {
	t.Helper()
	b, err := d.HostAlloc(n)
	check(t, err, "HostAlloc(%d)", n)
	if uint64(len(b.Bytes)) != n {
		t.Fatalf("HostAlloc(%d) returned %d bytes", n, len(b.Bytes))
	}
	if b.Kind != device.HostPinned {
		t.Errorf("HostAlloc: Kind = %v, want HostPinned", b.Kind)
	}
	t.Cleanup(func() {
		if err := d.HostFree(b); err != nil {
			t.Errorf("HostFree: %v", err)
		}
	})
	return b
}

// random fills a new slice of n bytes from a seeded generator.
func random(seed uint64, n uint64) []byte {
	b := make([]byte, n)
	fillRandom(seed, b)
	return b
}

// fillRandom fills b with xorshift output: cheap enough for 64 MiB buffers,
// and every 8-byte word differs from its neighbours.
func fillRandom(seed uint64, b []byte) {
	x := seed*0x9E3779B97F4A7C15 | 1
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	for ; i < len(b); i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}

// hostBuf makes a host buffer of n bytes, pinned or pageable.
func hostBuf(t *testing.T, d device.Device, n uint64, pinned bool) []byte {
	t.Helper()
	if pinned {
		return hostAlloc(t, d, n).Bytes
	}
	return make([]byte, n)
}

// sameBytes fails t naming the first differing offset.
func sameBytes(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %d bytes, want %d", what, len(got), len(want))
	}
	if bytes.Equal(got, want) {
		return
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: %d bytes differ; first at offset %d: got %#02x, want %#02x",
				what, countDiff(got, want), i, got[i], want[i])
		}
	}
}

func countDiff(a, b []byte) int {
	n := 0
	for i := range a {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}

// failsNowOrAtSync reports whether an operation that must fail did: either
// the call returned an error, or the stream's next synchronize does.
func failsNowOrAtSync(d device.Device, s device.Stream, err error) error {
	if err != nil {
		return err
	}
	return d.StreamSynchronize(s)
}

// bigCopies queues k host-to-device copies of src to dst on s: enough work
// that a GPU is still busy a few microseconds later.
func bigCopies(t *testing.T, d device.Device, dst device.Ptr, src []byte, k int, s device.Stream) {
	t.Helper()
	for range k {
		check(t, d.CopyHtoD(dst, src, s), "CopyHtoD(%d bytes)", len(src))
	}
}

// ---------------------------------------------------------------------------
// Subtests.

func testInfo(t *testing.T, d device.Device, _ Options) {
	in := d.Info()
	if in.Backend == "" || in.Name == "" {
		t.Errorf("Info: empty Backend %q or Name %q", in.Backend, in.Name)
	}
	if in.TotalBytes == 0 {
		t.Error("Info: TotalBytes = 0")
	}
	// A GPU has a compute capability; the host backend ("cpu") has none
	// and reports 0.0.
	if in.Backend != "cpu" && in.ComputeMajor <= 0 || in.ComputeMajor < 0 || in.ComputeMinor < 0 {
		t.Errorf("Info: compute capability %d.%d", in.ComputeMajor, in.ComputeMinor)
	}
	if in.Multiprocessors <= 0 {
		t.Errorf("Info: Multiprocessors = %d", in.Multiprocessors)
	}
	if in.CopyEngines < 0 {
		t.Errorf("Info: CopyEngines = %d", in.CopyEngines)
	}
	if in.VirtualMemory && (in.Granularity == 0 || bits.OnesCount64(in.Granularity) != 1) {
		t.Errorf("Info: VirtualMemory with granularity %d (want a power of two)", in.Granularity)
	}
	if in.PCIeGen < 0 || in.PCIeWidth < 0 {
		t.Errorf("Info: PCIe gen %d width %d", in.PCIeGen, in.PCIeWidth)
	}
}

func testMemInfo(t *testing.T, d device.Device, o Options) {
	free, total, err := d.MemInfo()
	check(t, err, "MemInfo")
	if total != d.Info().TotalBytes {
		t.Errorf("MemInfo total %d, Info.TotalBytes %d", total, d.Info().TotalBytes)
	}
	if free == 0 || free > total {
		t.Fatalf("MemInfo free %d of %d", free, total)
	}
	n := o.LargeBytes
	p, err := d.Alloc(n)
	check(t, err, "Alloc(%d)", n)
	free2, _, err := d.MemInfo()
	check(t, err, "MemInfo")
	if free2 > free-n {
		t.Errorf("after Alloc(%d) free went from %d to %d: want a drop of at least %d", n, free, free2, n)
	}
	check(t, d.Free(p), "Free")
	free3, _, err := d.MemInfo()
	check(t, err, "MemInfo")
	if free3 < free2+n {
		t.Errorf("after Free of %d bytes free went from %d to %d only", n, free2, free3)
	}
}

func testAllocFree(t *testing.T, d device.Device, _ Options) {
	if _, err := d.Alloc(0); !errors.Is(err, device.ErrInvalid) {
		t.Errorf("Alloc(0) = %v, want ErrInvalid", err)
	}
	type rng struct{ p, n uint64 }
	var got []rng
	for _, n := range []uint64{1, 255, 256, 4097, 1 << 20, 3<<20 + 5} {
		p, err := d.Alloc(n)
		check(t, err, "Alloc(%d)", n)
		if p == 0 || p%256 != 0 {
			t.Errorf("Alloc(%d) = %#x: want a non-null address aligned to 256", n, uint64(p))
		}
		got = append(got, rng{uint64(p), n})
	}
	slices.SortFunc(got, func(a, b rng) int { return cmp.Compare(a.p, b.p) })
	for i := 1; i < len(got); i++ {
		if got[i-1].p+got[i-1].n > got[i].p {
			t.Errorf("allocations overlap: %#x+%d and %#x", got[i-1].p, got[i-1].n, got[i].p)
		}
	}
	for _, r := range got {
		check(t, d.Free(device.Ptr(r.p)), "Free(%#x)", r.p)
	}
}

func testBadFree(t *testing.T, d device.Device, _ Options) {
	s := newStream(t, d)
	p, err := d.Alloc(1 << 20)
	check(t, err, "Alloc")
	if err := d.Free(p + 256); !errors.Is(err, device.ErrInvalid) {
		t.Errorf("Free of an interior pointer = %v, want ErrInvalid", err)
	}
	if err := d.Free(0); !errors.Is(err, device.ErrInvalid) {
		t.Errorf("Free(0) = %v, want ErrInvalid", err)
	}
	// The allocation survived the bad frees.
	want := random(1, 1<<20)
	got := make([]byte, len(want))
	check(t, d.CopyHtoD(p, want, s), "CopyHtoD")
	check(t, d.CopyDtoH(got, p, s), "CopyDtoH")
	check(t, d.StreamSynchronize(s), "StreamSynchronize")
	sameBytes(t, "round trip after bad frees", got, want)
	check(t, d.Free(p), "Free")
	if err := d.Free(p); !errors.Is(err, device.ErrInvalid) {
		t.Errorf("double Free = %v, want ErrInvalid", err)
	}
	hostAlloc(t, d, 4096)
	foreign := &device.HostBuffer{Bytes: make([]byte, 4096)}
	if err := d.HostFree(foreign); !errors.Is(err, device.ErrInvalid) {
		t.Errorf("HostFree of a foreign buffer = %v, want ErrInvalid", err)
	}
}

func testOutOfMemory(t *testing.T, d device.Device, _ Options) {
	for _, n := range []uint64{1 << 62, d.Info().TotalBytes + 1<<30} {
		p, err := d.Alloc(n)
		if err == nil {
			_ = d.Free(p)
			t.Errorf("Alloc(%d) succeeded", n)
			continue
		}
		if !errors.Is(err, device.ErrOutOfMemory) {
			t.Errorf("Alloc(%d) = %v, want ErrOutOfMemory", n, err)
		}
	}
	// The device still works.
	p := alloc(t, d, 4096)
	s := newStream(t, d)
	check(t, d.Memset8(p, 7, 4096, s), "Memset8")
	check(t, d.StreamSynchronize(s), "StreamSynchronize")
}

func testMemset(t *testing.T, d device.Device, _ Options) {
	const n = 1<<20 + 12
	p := alloc(t, d, n)
	s := newStream(t, d)
	want := make([]byte, n)
	check(t, d.Memset8(p, 0xAB, n, s), "Memset8 all")
	for i := range want {
		want[i] = 0xAB
	}
	check(t, d.Memset8(p+5, 0x11, 1001, s), "Memset8 odd range")
	for i := 5; i < 5+1001; i++ {
		want[i] = 0x11
	}
	check(t, d.Memset32(p+16, 0xDEADBEEF, 1000, s), "Memset32")
	for i := range 1000 {
		binary.LittleEndian.PutUint32(want[16+4*i:], 0xDEADBEEF)
	}
	check(t, d.Memset32(p+n-8, 0x01020304, 2, s), "Memset32 at the end")
	binary.LittleEndian.PutUint32(want[n-8:], 0x01020304)
	binary.LittleEndian.PutUint32(want[n-4:], 0x01020304)
	got := make([]byte, n)
	check(t, d.CopyDtoH(got, p, s), "CopyDtoH")
	check(t, d.StreamSynchronize(s), "StreamSynchronize")
	sameBytes(t, "memset result", got, want)

	if err := failsNowOrAtSync(d, s, d.Memset32(p+2, 1, 4, s)); err == nil {
		t.Error("Memset32 at a 2-byte aligned address succeeded")
	}
}

func testCopyRoundTrip(t *testing.T, d device.Device, o Options) {
	s := newStream(t, d)
	sizes := []uint64{1, 3, 4097, 1<<20 + 13, o.LargeBytes}
	a := alloc(t, d, o.LargeBytes)
	b := alloc(t, d, o.LargeBytes)
	for _, pinned := range []bool{false, true} {
		kind := map[bool]string{false: "pageable", true: "pinned"}[pinned]
		src := hostBuf(t, d, o.LargeBytes, pinned)
		dst := hostBuf(t, d, o.LargeBytes, pinned)
		for i, n := range sizes {
			t.Run(fmt.Sprintf("%s/%d", kind, n), func(t *testing.T) {
				in, out := src[:n], dst[:n]
				fillRandom(uint64(100+i), in)
				clear(out)
				check(t, d.CopyHtoD(a, in, s), "CopyHtoD")
				check(t, d.CopyDtoD(b, a, n, s), "CopyDtoD")
				check(t, d.CopyDtoH(out, b, s), "CopyDtoH")
				check(t, d.StreamSynchronize(s), "StreamSynchronize")
				sameBytes(t, "H2D, D2D, D2H", out, in)
			})
		}
	}
}

func testCopyInterior(t *testing.T, d device.Device, _ Options) {
	const n = 64 << 10
	s := newStream(t, d)
	a, b := alloc(t, d, n), alloc(t, d, n)
	src := random(7, n)
	check(t, d.Memset8(b, 0, n, s), "Memset8")
	check(t, d.CopyHtoD(a, src, s), "CopyHtoD")
	// Odd interior offsets on both sides.
	check(t, d.CopyDtoD(b+7, a+3, n-10, s), "CopyDtoD interior")
	got := make([]byte, n)
	check(t, d.CopyDtoH(got, b, s), "CopyDtoH")
	part := make([]byte, 999)
	check(t, d.CopyDtoH(part, a+1001, s), "CopyDtoH interior")
	check(t, d.StreamSynchronize(s), "StreamSynchronize")
	want := make([]byte, n)
	copy(want[7:], src[3:n-7])
	sameBytes(t, "interior D2D", got, want)
	sameBytes(t, "interior D2H", part, src[1001:2000])
}

func testStreamOrder(t *testing.T, d device.Device, o Options) {
	// Three rounds through the same device buffers with no synchronization
	// between them: each round's read must see that round's data.
	n := o.LargeBytes / 4
	s := newStream(t, d)
	a, b := alloc(t, d, n), alloc(t, d, n)
	const rounds = 3
	var ins, outs [rounds][]byte
	for r := range rounds {
		ins[r] = hostBuf(t, d, n, r%2 == 0)
		fillRandom(uint64(200+r), ins[r])
		outs[r] = make([]byte, n)
		check(t, d.CopyHtoD(a, ins[r], s), "CopyHtoD")
		check(t, d.CopyDtoD(b, a, n, s), "CopyDtoD")
		check(t, d.CopyDtoH(outs[r], b, s), "CopyDtoH")
	}
	check(t, d.StreamSynchronize(s), "StreamSynchronize")
	for r := range rounds {
		sameBytes(t, fmt.Sprintf("round %d", r), outs[r], ins[r])
	}
}

func testEventOrder(t *testing.T, d device.Device, o Options) {
	// A producer stream writes a buffer, a consumer stream reads it after
	// waiting on the producer's event, and the producer waits on the
	// consumer's event before overwriting the buffer in the next round.
	n := o.LargeBytes
	s1, s2 := newStream(t, d), newStream(t, d)
	written, read := newEvent(t, d, false), newEvent(t, d, false)
	a, b := alloc(t, d, n), alloc(t, d, n)
	const rounds = 3
	var ins, outs [rounds][]byte
	for r := range rounds {
		ins[r] = hostBuf(t, d, n, true)
		fillRandom(uint64(300+r), ins[r])
		outs[r] = make([]byte, n)
		check(t, d.StreamWaitEvent(s1, read), "StreamWaitEvent(s1, read)")
		check(t, d.CopyHtoD(a, ins[r], s1), "CopyHtoD")
		check(t, d.EventRecord(written, s1), "EventRecord(written)")
		check(t, d.StreamWaitEvent(s2, written), "StreamWaitEvent(s2, written)")
		check(t, d.CopyDtoD(b, a, n, s2), "CopyDtoD")
		check(t, d.EventRecord(read, s2), "EventRecord(read)")
		check(t, d.CopyDtoH(outs[r], b, s2), "CopyDtoH")
	}
	check(t, d.StreamSynchronize(s2), "StreamSynchronize(s2)")
	check(t, d.StreamSynchronize(s1), "StreamSynchronize(s1)")
	for r := range rounds {
		sameBytes(t, fmt.Sprintf("round %d", r), outs[r], ins[r])
	}
}

// poll calls q until it reports true, failing after a generous deadline.
func poll(t *testing.T, what string, q func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, err := q()
		check(t, err, "%s", what)
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still false after 30 s", what)
		}
		time.Sleep(20 * time.Microsecond)
	}
}

func testEventQuery(t *testing.T, d device.Device, o Options) {
	s := newStream(t, d)
	e := newEvent(t, d, false)
	ok, err := d.EventQuery(e)
	if err != nil || !ok {
		t.Errorf("EventQuery of a never-recorded event = %v, %v; want true, nil", ok, err)
	}
	src := hostAlloc(t, d, o.LargeBytes)
	fillRandom(9, src.Bytes)
	a := alloc(t, d, o.LargeBytes)
	bigCopies(t, d, a, src.Bytes, 4, s)
	check(t, d.EventRecord(e, s), "EventRecord")
	ok, err = d.EventQuery(e)
	check(t, err, "EventQuery")
	if ok {
		t.Errorf("EventQuery right after queueing %d MiB of copies = true, want false", 4*o.LargeBytes>>20)
	}
	ok, err = d.StreamQuery(s)
	check(t, err, "StreamQuery")
	if ok {
		t.Error("StreamQuery of a busy stream = true, want false")
	}
	poll(t, "EventQuery", func() (bool, error) { return d.EventQuery(e) })
	poll(t, "StreamQuery", func() (bool, error) { return d.StreamQuery(s) })
	check(t, d.EventSynchronize(e), "EventSynchronize")
	got := make([]byte, 4096)
	check(t, d.CopyDtoH(got, a+device.Ptr(o.LargeBytes)-4096, s), "CopyDtoH")
	check(t, d.StreamSynchronize(s), "StreamSynchronize")
	sameBytes(t, "data after the copies", got, src.Bytes[o.LargeBytes-4096:])
}

func testEventElapsed(t *testing.T, d device.Device, o Options) {
	s := newStream(t, d)
	start, end := newEvent(t, d, true), newEvent(t, d, true)
	src := hostAlloc(t, d, o.LargeBytes)
	a := alloc(t, d, o.LargeBytes)
	check(t, d.EventRecord(start, s), "EventRecord(start)")
	check(t, d.CopyHtoD(a, src.Bytes, s), "CopyHtoD")
	check(t, d.EventRecord(end, s), "EventRecord(end)")
	check(t, d.EventSynchronize(end), "EventSynchronize")
	el, err := d.EventElapsed(start, end)
	check(t, err, "EventElapsed")
	if el <= 0 {
		t.Errorf("EventElapsed over a %d-byte copy = %v, want > 0", o.LargeBytes, el)
	}
	if el > time.Minute {
		t.Errorf("EventElapsed over a %d-byte copy = %v, implausibly long", o.LargeBytes, el)
	}
	plain := newEvent(t, d, false)
	check(t, d.EventRecord(plain, s), "EventRecord(plain)")
	check(t, d.EventSynchronize(plain), "EventSynchronize(plain)")
	if _, err := d.EventElapsed(start, plain); err == nil {
		t.Error("EventElapsed with an event created without timing succeeded")
	}
}

func testWaitNeverRecorded(t *testing.T, d device.Device, _ Options) {
	s := newStream(t, d)
	e := newEvent(t, d, false)
	check(t, d.StreamWaitEvent(s, e), "StreamWaitEvent on a never-recorded event")
	check(t, d.EventSynchronize(e), "EventSynchronize of a never-recorded event")
	p := alloc(t, d, 4096)
	want := random(11, 4096)
	got := make([]byte, 4096)
	check(t, d.CopyHtoD(p, want, s), "CopyHtoD")
	check(t, d.CopyDtoH(got, p, s), "CopyDtoH")
	check(t, d.StreamSynchronize(s), "StreamSynchronize")
	sameBytes(t, "round trip after waiting on a never-recorded event", got, want)
}

func testStreamLifecycle(t *testing.T, d device.Device, o Options) {
	s, err := d.NewStream()
	check(t, err, "NewStream")
	ok, err := d.StreamQuery(s)
	if err != nil || !ok {
		t.Errorf("StreamQuery of a new stream = %v, %v; want true, nil", ok, err)
	}
	// Destroying a stream with queued work lets the work finish.
	n := o.LargeBytes
	p := alloc(t, d, n)
	src := hostAlloc(t, d, n)
	fillRandom(13, src.Bytes)
	got := make([]byte, n)
	check(t, d.CopyHtoD(p, src.Bytes, s), "CopyHtoD")
	check(t, d.CopyDtoH(got, p, s), "CopyDtoH")
	check(t, d.DestroyStream(s), "DestroyStream with queued work")
	check(t, d.Synchronize(), "Synchronize")
	sameBytes(t, "work queued before DestroyStream", got, src.Bytes)
	if err := d.StreamSynchronize(s); !errors.Is(err, device.ErrInvalid) {
		t.Errorf("StreamSynchronize of a destroyed stream = %v, want ErrInvalid", err)
	}
}

func testUnknownHandles(t *testing.T, d device.Device, _ Options) {
	s := newStream(t, d)
	e := newEvent(t, d, false)
	badS, badE := s+0x1000, e+0x1000
	for name, err := range map[string]error{
		"StreamSynchronize": d.StreamSynchronize(badS),
		"EventRecord":       d.EventRecord(badE, s),
		"EventRecord(s)":    d.EventRecord(e, badS),
		"StreamWaitEvent":   d.StreamWaitEvent(s, badE),
		"DestroyStream":     d.DestroyStream(badS),
		"DestroyEvent":      d.DestroyEvent(badE),
	} {
		if !errors.Is(err, device.ErrInvalid) {
			t.Errorf("%s with an unknown handle = %v, want ErrInvalid", name, err)
		}
	}
}

func testVirtualMemory(t *testing.T, d device.Device, _ Options) {
	in := d.Info()
	if !in.VirtualMemory {
		if _, err := d.Reserve(2 << 20); !errors.Is(err, device.ErrUnsupported) {
			t.Errorf("Reserve without virtual memory = %v, want ErrUnsupported", err)
		}
		t.Skip("device reports no virtual memory")
	}
	g := in.Granularity
	if _, err := d.Reserve(g + 1); !errors.Is(err, device.ErrInvalid) {
		t.Errorf("Reserve(granularity+1) = %v, want ErrInvalid", err)
	}
	va, err := d.Reserve(4 * g)
	check(t, err, "Reserve(4 granules)")
	if uint64(va)%g != 0 {
		t.Errorf("Reserve = %#x, not aligned to the granularity %d", uint64(va), g)
	}
	free0, _, err := d.MemInfo()
	check(t, err, "MemInfo")
	var chunks [3]device.PhysMem
	for i := range chunks {
		chunks[i], err = d.CreatePhysical(g)
		check(t, err, "CreatePhysical(%d)", g)
	}
	if free1, _, err := d.MemInfo(); err == nil && free1 > free0-3*g {
		t.Errorf("3 physical chunks of %d bytes took free memory from %d to %d only", g, free0, free1)
	}
	check(t, d.Map(va, g, chunks[0]), "Map chunk 0 at granule 0")
	check(t, d.Map(va+device.Ptr(g), g, chunks[1]), "Map chunk 1 at granule 1")
	if err := d.Map(va+device.Ptr(g), g, chunks[2]); err == nil {
		t.Error("Map over an existing mapping succeeded")
		_ = d.Unmap(va+device.Ptr(g), g)
	}

	s := newStream(t, d)
	data := random(17, 2*g)
	check(t, d.CopyHtoD(va, data, s), "CopyHtoD across the chunk boundary")
	got := make([]byte, 2*g)
	check(t, d.CopyDtoH(got, va, s), "CopyDtoH across the chunk boundary")
	mid := make([]byte, 8192)
	check(t, d.CopyDtoH(mid, va+device.Ptr(g)-4096, s), "CopyDtoH straddling the boundary")
	check(t, d.StreamSynchronize(s), "StreamSynchronize")
	sameBytes(t, "two mapped chunks", got, data)
	sameBytes(t, "straddling read", mid, data[g-4096:g+4096])

	// Unmap chunk 1 and map chunk 2 at the same address; chunk 0 is intact,
	// and chunk 1 keeps its bytes when mapped elsewhere.
	check(t, d.Unmap(va+device.Ptr(g), g), "Unmap chunk 1")
	check(t, d.Map(va+device.Ptr(g), g, chunks[2]), "Map chunk 2 where chunk 1 was")
	check(t, d.Map(va+device.Ptr(3*g), g, chunks[1]), "Map chunk 1 at granule 3")
	fresh := random(19, g)
	check(t, d.CopyHtoD(va+device.Ptr(g), fresh, s), "CopyHtoD into chunk 2")
	first := make([]byte, g)
	second := make([]byte, g)
	moved := make([]byte, g)
	check(t, d.CopyDtoH(first, va, s), "CopyDtoH chunk 0")
	check(t, d.CopyDtoH(second, va+device.Ptr(g), s), "CopyDtoH chunk 2")
	check(t, d.CopyDtoH(moved, va+device.Ptr(3*g), s), "CopyDtoH chunk 1 at its new address")
	check(t, d.StreamSynchronize(s), "StreamSynchronize")
	sameBytes(t, "chunk 0 after remapping its neighbour", first, data[:g])
	sameBytes(t, "chunk 2", second, fresh)
	sameBytes(t, "chunk 1 remapped", moved, data[g:])

	// Release while mapped: the mapping keeps working until unmapped.
	for i, c := range chunks {
		check(t, d.ReleasePhysical(c), "ReleasePhysical(chunk %d)", i)
	}
	check(t, d.CopyDtoH(first, va, s), "CopyDtoH after release")
	check(t, d.StreamSynchronize(s), "StreamSynchronize")
	sameBytes(t, "chunk 0 after release", first, data[:g])
	check(t, d.Unmap(va, 2*g), "Unmap granules 0-1")
	check(t, d.Unmap(va+device.Ptr(3*g), g), "Unmap granule 3")
	check(t, d.Unreserve(va, 4*g), "Unreserve")
	if free2, _, err := d.MemInfo(); err == nil && free2 < free0 {
		t.Errorf("after releasing and unmapping every chunk free is %d, was %d before creating them", free2, free0)
	}
}

func testHostMapped(t *testing.T, d device.Device, _ Options) {
	if !d.Info().CanMapHostMemory {
		t.Skip("device cannot map host memory")
	}
	const n = 1<<20 + 100
	hb := hostAlloc(t, d, n)
	if hb.DevicePtr == 0 {
		t.Fatal("HostAlloc on a device that can map host memory returned no DevicePtr")
	}
	fillRandom(23, hb.Bytes)
	p := alloc(t, d, n)
	s := newStream(t, d)
	got := make([]byte, n)
	check(t, d.CopyDtoD(p, hb.DevicePtr, n, s), "CopyDtoD from host-mapped memory")
	check(t, d.CopyDtoH(got, p, s), "CopyDtoH")
	check(t, d.StreamSynchronize(s), "StreamSynchronize")
	sameBytes(t, "zero-copy read", got, hb.Bytes)

	// And the device writes into host memory through the mapping.
	want := random(29, 4096)
	check(t, d.CopyHtoD(p, want, s), "CopyHtoD")
	check(t, d.CopyDtoD(hb.DevicePtr+1000, p, 4096, s), "CopyDtoD into host-mapped memory")
	check(t, d.StreamSynchronize(s), "StreamSynchronize")
	sameBytes(t, "zero-copy write", hb.Bytes[1000:1000+4096], want)
}

func testHostRegister(t *testing.T, d device.Device, _ Options) {
	const n = 1 << 20
	buf := random(31, n)
	orig := slices.Clone(buf)
	hb, err := d.HostRegister(buf, device.RegisterDeviceMap)
	if errors.Is(err, device.ErrUnsupported) {
		t.Skipf("HostRegister: %v", err)
	}
	check(t, err, "HostRegister")
	defer func() { check(t, d.HostFree(hb), "HostFree (unregister)") }()
	if hb.Kind != device.HostRegistered || &hb.Bytes[0] != &buf[0] || len(hb.Bytes) != n {
		t.Errorf("HostRegister returned kind %v, %d bytes, aliasing the input %v", hb.Kind, len(hb.Bytes), &hb.Bytes[0] == &buf[0])
	}
	p := alloc(t, d, n)
	s := newStream(t, d)
	got := make([]byte, n)
	check(t, d.CopyHtoD(p, buf, s), "CopyHtoD from registered memory")
	check(t, d.CopyDtoH(got, p, s), "CopyDtoH")
	check(t, d.StreamSynchronize(s), "StreamSynchronize")
	sameBytes(t, "copy from registered memory", got, orig)
	if d.Info().CanMapHostMemory {
		if hb.DevicePtr == 0 {
			t.Fatal("HostRegister with RegisterDeviceMap returned no DevicePtr")
		}
		check(t, d.Memset8(p, 0, n, s), "Memset8")
		check(t, d.CopyDtoD(p, hb.DevicePtr, n, s), "CopyDtoD from registered memory")
		check(t, d.CopyDtoH(got, p, s), "CopyDtoH")
		check(t, d.StreamSynchronize(s), "StreamSynchronize")
		sameBytes(t, "zero-copy read of registered memory", got, orig)
	}
}

func testHostRegisterReadOnlyFile(t *testing.T, d device.Device, _ Options) {
	in := d.Info()
	if !in.ReadOnlyHostRegister || !in.CanMapHostMemory {
		t.Skip("device does not support registering read-only host memory mapped into the device")
	}
	const n = 4 << 20
	data := random(37, n)
	b, unmap, err := mapFileReadOnly(t, data)
	if err != nil {
		t.Skipf("read-only file mapping: %v", err)
	}
	defer unmap()
	hb, err := d.HostRegister(b, device.RegisterReadOnly|device.RegisterDeviceMap)
	check(t, err, "HostRegister(read-only mmap, RegisterReadOnly|RegisterDeviceMap)")
	defer func() { check(t, d.HostFree(hb), "HostFree (unregister)") }()
	if hb.DevicePtr == 0 {
		t.Fatal("HostRegister with RegisterDeviceMap returned no DevicePtr")
	}
	p, q := alloc(t, d, n), alloc(t, d, n)
	s := newStream(t, d)
	check(t, d.CopyHtoD(p, b, s), "CopyHtoD from the read-only mapping")
	check(t, d.CopyDtoD(q, hb.DevicePtr, n, s), "CopyDtoD through the mapping's DevicePtr")
	got1, got2 := make([]byte, n), make([]byte, n)
	check(t, d.CopyDtoH(got1, p, s), "CopyDtoH")
	check(t, d.CopyDtoH(got2, q, s), "CopyDtoH")
	check(t, d.StreamSynchronize(s), "StreamSynchronize")
	sameBytes(t, "H2D from a read-only file mapping", got1, data)
	sameBytes(t, "zero-copy read of a read-only file mapping", got2, data)
}

func testKernel(t *testing.T, d device.Device, o Options) {
	if o.LoadKernels == nil {
		t.Skip("no kernels: Options.LoadKernels is nil")
	}
	m, err := o.LoadKernels(d)
	check(t, err, "LoadKernels")
	t.Cleanup(func() {
		if err := d.UnloadModule(m); err != nil {
			t.Errorf("UnloadModule: %v", err)
		}
	})
	if _, err := d.Function(m, "memwall_no_such_kernel"); err == nil {
		t.Error("Function of an unknown kernel name succeeded")
	}
	f, err := d.Function(m, FillKernel)
	check(t, err, "Function(%s)", FillKernel)
	const words = 1<<20 + 7
	const guard = 64 // words after the fill that must stay untouched
	p := alloc(t, d, 4*(words+guard))
	s := newStream(t, d)
	check(t, d.Memset32(p, 0xA5A5A5A5, words+guard, s), "Memset32")
	for _, seed := range []uint32{0, 0xC0FFEE} {
		grid := device.Dim3{X: uint32((words + 255) / 256), Y: 1, Z: 1}
		block := device.Dim3{X: 256, Y: 1, Z: 1}
		check(t, d.Launch(f, grid, block, 0, s, p, uint64(words), seed), "Launch %s", FillKernel)
		got := make([]byte, 4*(words+guard))
		check(t, d.CopyDtoH(got, p, s), "CopyDtoH")
		check(t, d.StreamSynchronize(s), "StreamSynchronize")
		bad := 0
		for i := range uint64(words + guard) {
			w := binary.LittleEndian.Uint32(got[4*i:])
			want := uint32(0xA5A5A5A5)
			if i < words {
				want = Pattern(seed, i)
			}
			if w != want {
				if bad < 5 {
					t.Errorf("seed %#x: word %d = %#08x, want %#08x", seed, i, w, want)
				}
				bad++
			}
		}
		if bad > 0 {
			t.Fatalf("seed %#x: %d of %d words wrong", seed, bad, words+guard)
		}
	}
}

func testConcurrent(t *testing.T, d device.Device, _ Options) {
	const workers, iters = 8, 16
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- worker(d, uint64(w), iters)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	check(t, d.Synchronize(), "Synchronize")
}

// worker allocates, copies, synchronizes and frees on its own stream while
// others do the same.
func worker(d device.Device, id uint64, iters int) (err error) {
	s, err := d.NewStream()
	if err != nil {
		return fmt.Errorf("worker %d: NewStream: %w", id, err)
	}
	defer func() {
		if e := d.DestroyStream(s); e != nil && err == nil {
			err = fmt.Errorf("worker %d: DestroyStream: %w", id, e)
		}
	}()
	e, err := d.NewEvent(false)
	if err != nil {
		return fmt.Errorf("worker %d: NewEvent: %w", id, err)
	}
	defer d.DestroyEvent(e)
	r := rand.New(rand.NewPCG(id, 42))
	for i := range iters {
		n := 1 + r.Uint64N(256<<10)
		p, err := d.Alloc(n)
		if err != nil {
			return fmt.Errorf("worker %d: Alloc(%d): %w", id, n, err)
		}
		in := random(id<<32|uint64(i), n)
		out := make([]byte, n)
		if err := d.CopyHtoD(p, in, s); err != nil {
			return fmt.Errorf("worker %d: CopyHtoD: %w", id, err)
		}
		if err := d.CopyDtoH(out, p, s); err != nil {
			return fmt.Errorf("worker %d: CopyDtoH: %w", id, err)
		}
		if err := d.EventRecord(e, s); err != nil {
			return fmt.Errorf("worker %d: EventRecord: %w", id, err)
		}
		if i%2 == 0 {
			err = d.EventSynchronize(e)
		} else {
			err = d.StreamSynchronize(s)
		}
		if err != nil {
			return fmt.Errorf("worker %d: synchronize: %w", id, err)
		}
		if !bytes.Equal(in, out) {
			return fmt.Errorf("worker %d: iteration %d: %d-byte round trip differs", id, i, n)
		}
		if _, _, err := d.MemInfo(); err != nil {
			return fmt.Errorf("worker %d: MemInfo: %w", id, err)
		}
		if err := d.Free(p); err != nil {
			return fmt.Errorf("worker %d: Free: %w", id, err)
		}
	}
	return nil
}
