package bind_test

import (
	"context"
	"encoding/binary"
	"os"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cuda"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/graph"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/plan"
	"github.com/memwall/memwall/plan/bind"
	"github.com/memwall/memwall/pool"
)

// openDevice returns the GPU when MEMWALL_TEST_DEVICE=cuda, else a backed
// simulator; shuffle makes the simulator run ready work of different
// streams in a random order, so a missing dependency shows up as bad data.
func openDevice(t *testing.T, shuffle bool, seed uint64) device.Device {
	if os.Getenv("MEMWALL_TEST_DEVICE") == "cuda" {
		d, err := cuda.Open(cuda.Options{})
		if err != nil {
			t.Fatalf("MEMWALL_TEST_DEVICE=cuda: %v", err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	o := sim.DefaultOptions()
	o.Backing = true
	o.Kernels = kernels.Sim()
	o.Shuffle, o.Seed = shuffle, seed
	return sim.New(o)
}

func planModel(t *testing.T, path string, inplace bool) ([]plan.Buffer, plan.Layout) {
	t.Helper()
	g, err := graph.LoadONNX(path, nil, graph.Options{})
	if err != nil {
		t.Fatal(err)
	}
	as, err := plan.Activations(g, plan.LivenessOptions{InPlace: inplace})
	if err != nil {
		t.Fatal(err)
	}
	lay, _, err := plan.Solve(context.Background(), as.Buffers, plan.Options{Alignment: 256, TimeLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	return as.Buffers, lay
}

// runLifetimes executes the plan's lifetimes on two streams, step k on
// stream k%2: each step fills the buffers it produces with their own
// pattern and checks the buffers it reads last. Steps wait on their data
// producers and, when reuse is set, on Arena.Reuse. It returns the number of
// 32-bit words found corrupted.
func runLifetimes(t *testing.T, d device.Device, bufs []plan.Buffer, lay plan.Layout, reuse bool) uint64 {
	t.Helper()
	ks, err := kernels.Load(d, os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	defer ks.Close()
	p, err := pool.New(d, pool.Options{Name: "activations"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	a, err := bind.Bind(p, bufs, lay)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release()
	steps := 0
	for _, b := range bufs {
		steps = max(steps, b.End)
	}
	writers := make([][]int, steps)
	lastReads := make([][]int, steps)
	for i, b := range bufs {
		writers[b.Start] = append(writers[b.Start], i)
		lastReads[b.End-1] = append(lastReads[b.End-1], i)
	}
	streams := [2]device.Stream{}
	for i := range streams {
		if streams[i], err = d.NewStream(); err != nil {
			t.Fatal(err)
		}
	}
	events := make([]device.Event, steps)
	for k := range events {
		if events[k], err = d.NewEvent(false); err != nil {
			t.Fatal(err)
		}
	}
	counter, err := d.Alloc(256)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(counter)
	if err := d.Memset8(counter, 0, 8, streams[0]); err != nil {
		t.Fatal(err)
	}
	if err := d.StreamSynchronize(streams[0]); err != nil {
		t.Fatal(err)
	}
	for k := 0; k < steps; k++ {
		st := streams[k%2]
		wait := func(j int) {
			if j%2 != k%2 {
				if err := d.StreamWaitEvent(st, events[j]); err != nil {
					t.Fatal(err)
				}
			}
		}
		for _, i := range lastReads[k] {
			if bufs[i].Start < k {
				wait(bufs[i].Start)
			}
		}
		if reuse {
			for _, j := range a.Reuse(k) {
				wait(j)
			}
		}
		for _, i := range writers[k] {
			if err := ks.Fill(a.Addr[i], a.Sizes[i]/4, uint32(i)+1, st); err != nil {
				t.Fatal(err)
			}
		}
		for _, i := range lastReads[k] {
			if err := ks.Check(a.Addr[i], a.Sizes[i]/4, uint32(i)+1, counter, st); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.EventRecord(events[k], st); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Synchronize(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	if err := d.CopyDtoH(buf, counter, streams[0]); err != nil {
		t.Fatal(err)
	}
	if err := d.StreamSynchronize(streams[0]); err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		_ = d.DestroyEvent(e)
	}
	for _, s := range streams {
		_ = d.DestroyStream(s)
	}
	return binary.LittleEndian.Uint64(buf)
}

// TestGPULifetimes runs the packed lifetimes of real graphs: with the reuse
// dependencies, no tensor is overwritten before its last reader ran. On the
// GPU machine it runs with MEMWALL_TEST_DEVICE=cuda.
func TestGPULifetimes(t *testing.T) {
	models := []string{"mobilenet_v2", "resnet50", "bert_base"}
	if testing.Short() {
		models = models[:1]
	}
	for _, m := range models {
		for _, inplace := range []bool{false, true} {
			name := m
			if inplace {
				name += "/inplace"
			}
			t.Run(name, func(t *testing.T) {
				bufs, lay := planModel(t, "../../testdata/onnx/"+m+".onnx", inplace)
				d := openDevice(t, true, 3)
				if bad := runLifetimes(t, d, bufs, lay, true); bad != 0 {
					t.Fatalf("%d words corrupted with the reuse dependencies in place", bad)
				}
				t.Logf("%d buffers, arena %d bytes, lower bound %d", len(bufs), lay.ArenaBytes, plan.LowerBound(bufs))
			})
		}
	}
}

// TestReuseIsNecessary shows the ordering rule matters: without the reuse
// waits, the simulator running streams in a random order lets a later
// writer overwrite a tensor before its last reader on the other stream.
func TestReuseIsNecessary(t *testing.T) {
	if os.Getenv("MEMWALL_TEST_DEVICE") == "cuda" {
		t.Skip("the negative test needs the simulator's random stream order")
	}
	bufs, lay := planModel(t, "../../testdata/onnx/squeezenet1_1.onnx", false)
	var total uint64
	for seed := uint64(1); seed <= 4 && total == 0; seed++ {
		total += runLifetimes(t, openDevice(t, true, seed), bufs, lay, false)
	}
	if total == 0 {
		t.Fatal("no corruption without the reuse dependencies: the test cannot tell them apart")
	}
}

func TestReuseDependencies(t *testing.T) {
	// Two buffers share offset 0 in time: a on [0,2), b on [3,5); c on
	// [1,4) at another offset. b's writer (step 3) must wait for a's last
	// reader (step 1) and nothing else.
	bufs := []plan.Buffer{{ID: "a", Start: 0, End: 2, Size: 256}, {ID: "c", Start: 1, End: 4, Size: 256}, {ID: "b", Start: 3, End: 5, Size: 512}}
	lay := plan.Layout{Offsets: []uint64{0, 512, 0}, ArenaBytes: 768, Alignment: 256}
	if err := plan.Verify(bufs, lay); err != nil {
		t.Fatal(err)
	}
	deps := bind.Reuse(bufs, lay)
	if len(deps) != 5 {
		t.Fatalf("deps for %d steps, want 5", len(deps))
	}
	for s, want := range [][]int{nil, nil, nil, {1}, nil} {
		if len(deps[s]) != len(want) || (len(want) > 0 && deps[s][0] != want[0]) {
			t.Fatalf("step %d: deps %v, want %v", s, deps[s], want)
		}
	}
}
