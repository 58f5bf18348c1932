package cuda_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cuda"
)

// TestGraphReplay captures an upload from pinned memory, a kernel and a
// download, then replays the graph with new host inputs: each replay must
// read the pinned buffer as it is at launch time, and a sync call inside a
// capture must fail the capture, not crash.
func TestGraphReplay(t *testing.T) {
	d := open(t)
	g, ok := d.(device.Grapher)
	if !ok || !g.CanGraph() {
		t.Skip("the driver has no graph API")
	}
	mod, err := loadKernels(d)
	if err != nil {
		t.Skip(err)
	}
	fill, err := d.Function(mod, "memwall_fill_u32")
	if err != nil {
		t.Fatal(err)
	}
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer d.DestroyStream(s)
	in, err := d.HostAlloc(64)
	if err != nil {
		t.Fatal(err)
	}
	defer d.HostFree(in)
	out, err := d.HostAlloc(128)
	if err != nil {
		t.Fatal(err)
	}
	defer d.HostFree(out)
	a, err := d.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(a)
	b, err := d.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(b)

	if err := g.BeginCapture(s); err != nil {
		t.Fatal(err)
	}
	if err := g.BeginCapture(s); !errors.Is(err, device.ErrInvalid) {
		t.Errorf("second BeginCapture: %v, want ErrInvalid", err)
	}
	if c, err := d.(*cuda.Device).Capturing(s); !c || err != nil {
		t.Errorf("Capturing = %v, %v during a capture", c, err)
	}
	steps := []error{
		d.CopyHtoD(a, in.Bytes[:64], s),
		d.CopyDtoD(b, a, 64, s),
		d.Launch(fill, device.Dim3{X: 1, Y: 1, Z: 1}, device.Dim3{X: 256, Y: 1, Z: 1}, 0, s, a, uint64(16), uint32(7)),
		d.CopyDtoH(out.Bytes[:64], b, s),
		d.CopyDtoH(out.Bytes[64:128], a, s),
	}
	if err := errors.Join(steps...); err != nil {
		t.Fatal(err)
	}
	graph, err := g.EndCapture(s)
	if err != nil {
		t.Fatal(err)
	}
	defer g.DestroyGraph(graph)
	filled := make([]byte, 64)
	for r := range 4 {
		for i := range 16 {
			binary.LittleEndian.PutUint32(in.Bytes[4*i:], uint32(1000*r+i))
		}
		if err := g.LaunchGraph(graph, s); err != nil {
			t.Fatal(err)
		}
		if err := d.StreamSynchronize(s); err != nil {
			t.Fatal(err)
		}
		for i := range 16 {
			if v := binary.LittleEndian.Uint32(out.Bytes[4*i:]); v != uint32(1000*r+i) {
				t.Fatalf("replay %d: word %d = %d, want %d (the upload did not read the pinned buffer at launch)", r, i, v, 1000*r+i)
			}
		}
		if r == 0 {
			copy(filled, out.Bytes[64:128])
		} else if string(filled) != string(out.Bytes[64:128]) {
			t.Fatalf("replay %d: the kernel's output changed", r)
		}
	}
	// A synchronize inside a capture is refused or invalidates it.
	if err := g.BeginCapture(s); err != nil {
		t.Fatal(err)
	}
	serr := d.StreamSynchronize(s)
	bad, eerr := g.EndCapture(s)
	if serr == nil && eerr == nil {
		g.DestroyGraph(bad)
		t.Fatal("StreamSynchronize inside a capture and EndCapture both succeeded")
	}
	if c, _ := d.(*cuda.Device).Capturing(s); c {
		t.Error("the stream still captures after EndCapture")
	}
	if err := g.LaunchGraph(device.Graph(12345), s); !errors.Is(err, device.ErrInvalid) {
		t.Errorf("LaunchGraph of an unknown graph: %v", err)
	}
}
