package sim_test

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/devicetest"
	"github.com/memwall/memwall/device/sim"
)

func TestKernelAcrossChunks(t *testing.T) {
	const g = 2 << 20
	d := newDev(t, nil)
	s := get(d.NewStream()).ok(t)
	va := get(d.Reserve(2 * g)).ok(t)
	for i := range 2 {
		ok(t, d.Map(va+device.Ptr(i*g), g, get(d.CreatePhysical(g)).ok(t)))
	}
	// Fill words straddling the boundary: the kernel sees one contiguous
	// view, the bytes land in both chunks.
	const words = 1000
	start := va + g - 4*words/2
	f := get(d.Function(get(d.LoadModule(nil)).ok(t), devicetest.FillKernel)).ok(t)
	ok(t, d.Launch(f, dim(4), dim(256), 0, s, start, uint64(words), uint32(5)))
	got := make([]byte, 4*words)
	ok(t, d.CopyDtoH(got, start, s))
	ok(t, d.StreamSynchronize(s))
	for i := range uint64(words) {
		if w := binary.LittleEndian.Uint32(got[4*i:]); w != devicetest.Pattern(5, i) {
			t.Fatalf("word %d = %#x, want %#x", i, w, devicetest.Pattern(5, i))
		}
	}
}

func TestKernelErrors(t *testing.T) {
	var kept *sim.Mem
	boom := sim.Kernel{Name: "boom", Run: func(*sim.Mem, device.Dim3, device.Dim3, []any) error { panic("kaboom") }}
	fails := sim.Kernel{Name: "fails", Run: func(*sim.Mem, device.Dim3, device.Dim3, []any) error { return errors.New("bad input") }}
	keep := sim.Kernel{Name: "keep", Run: func(m *sim.Mem, _, _ device.Dim3, _ []any) error { kept = m; return nil }}
	d := newDev(t, func(o *sim.Options) { o.Kernels = append(o.Kernels, boom, fails, keep) })
	s, s2 := get(d.NewStream()).ok(t), get(d.NewStream()).ok(t)
	mod := get(d.LoadModule([]byte("any bytes at all"))).ok(t)
	_, err := d.Function(mod, "missing")
	wantErr(t, "unknown kernel", err, device.ErrInvalid, "no simulated implementation of kernel missing")
	_, err = d.Function(mod+100, devicetest.FillKernel)
	wantErr(t, "unknown module", err, device.ErrInvalid, "unknown module")
	fill := get(d.Function(mod, devicetest.FillKernel)).ok(t)
	p := get(d.Alloc(4096)).ok(t)
	for _, tc := range []struct {
		name  string
		err   error
		frags []string
	}{
		{"int argument", d.Launch(fill, dim(1), dim(1), 0, s, p, 10, uint32(1)), []string{"argument 1", "type int"}},
		{"zero grid", d.Launch(fill, device.Dim3{X: 1}, dim(1), 0, s, p, uint64(1), uint32(1)), []string{"zero dimension"}},
		{"block too big", d.Launch(fill, dim(1), dim(2048), 0, s, p, uint64(1), uint32(1)), []string{"more than 1024 threads"}},
		{"unknown function", d.Launch(fill+100, dim(1), dim(1), 0, s), []string{"unknown function"}},
		{"unknown stream", d.Launch(fill, dim(1), dim(1), 0, s+100, p, uint64(1), uint32(1)), []string{"unknown stream"}},
	} {
		t.Run(tc.name, func(t *testing.T) { wantErr(t, tc.name, tc.err, device.ErrInvalid, tc.frags...) })
	}

	// A kernel touching memory past an allocation fails at the next
	// synchronize of its stream, once.
	ok(t, d.Launch(fill, dim(1), dim(1), 0, s, p, uint64(2000), uint32(1)))
	wantErr(t, "kernel out of range", d.StreamSynchronize(s), device.ErrInvalid, "kernel memwall_fill_u32", "crosses the end")
	ok(t, d.StreamSynchronize(s))
	// A panic and an error, on two streams: Synchronize reports both.
	ok(t, d.Launch(get(d.Function(mod, "boom")).ok(t), dim(1), dim(1), 0, s))
	ok(t, d.Launch(get(d.Function(mod, "fails")).ok(t), dim(1), dim(1), 0, s2))
	err = d.Synchronize()
	wantErr(t, "panicking kernel", err, device.ErrInvalid, "kernel boom panicked: kaboom", "kernel fails: bad input")
	ok(t, d.Synchronize())
	// StreamQuery reports the error once the stream is idle.
	ok(t, d.Launch(get(d.Function(mod, "fails")).ok(t), dim(1), dim(1), 0, s))
	if done, err := d.StreamQuery(s); done || err != nil {
		t.Errorf("StreamQuery with a launch queued = %v, %v; want false, nil", done, err)
	}
	if done, err := d.StreamQuery(s); !done || err == nil {
		t.Errorf("StreamQuery after the failed launch = %v, %v; want true and its error", done, err)
	}
	// Errors of a destroyed stream go to Synchronize.
	s3 := get(d.NewStream()).ok(t)
	ok(t, d.Launch(get(d.Function(mod, "fails")).ok(t), dim(1), dim(1), 0, s3))
	ok(t, d.DestroyStream(s3))
	if err := d.Synchronize(); err == nil || !strings.Contains(err.Error(), "kernel fails: bad input") {
		t.Errorf("Synchronize after a destroyed stream's launch failed = %v, want its error", err)
	}
	// Mem is dead after Run.
	ok(t, d.Launch(get(d.Function(mod, "keep")).ok(t), dim(1), dim(1), 0, s))
	ok(t, d.StreamSynchronize(s))
	_, err = kept.Bytes(p, 1)
	wantErr(t, "Mem after Run", err, device.ErrInvalid, "outside its Run")
	// Unloading a module stops its functions.
	ok(t, d.UnloadModule(mod))
	wantErr(t, "launch after unload", d.Launch(fill, dim(1), dim(1), 0, s, p, uint64(1), uint32(1)), device.ErrInvalid, "unloaded")
	wantErr(t, "unload twice", d.UnloadModule(mod), device.ErrInvalid)
}
