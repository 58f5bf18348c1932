package vulkan_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/vulkan"
	"github.com/memwall/memwall/graph"
	"github.com/memwall/memwall/kernels/spirv"
	"github.com/memwall/memwall/plan"
	"github.com/memwall/memwall/plan/bind"
	"github.com/memwall/memwall/pool"
)

// kernelSet is the fill and check kernels loaded on d.
type kernelSet struct {
	d           *vulkan.Device
	fill, check device.Function
}

func loadSet(t *testing.T, d *vulkan.Device) kernelSet {
	t.Helper()
	m, err := d.LoadModule(spirv.Module())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.UnloadModule(m) })
	ks := kernelSet{d: d}
	if ks.fill, err = d.Function(m, spirv.NameFill); err != nil {
		t.Fatal(err)
	}
	if ks.check, err = d.Function(m, spirv.NameCheck); err != nil {
		t.Fatal(err)
	}
	return ks
}

func grid(words uint64) device.Dim3 {
	return device.Dim3{X: uint32(min(max((words+255)/256, 1), 4096)), Y: 1, Z: 1}
}

var block = device.Dim3{X: 256, Y: 1, Z: 1}

func (k kernelSet) Fill(p device.Ptr, words uint64, seed uint32, s device.Stream) error {
	return k.d.Launch(k.fill, grid(words), block, 0, s, p, words, seed)
}

func (k kernelSet) Check(p device.Ptr, words uint64, seed uint32, counter device.Ptr, s device.Stream) error {
	return k.d.Launch(k.check, grid(words), block, 0, s, p, words, seed, counter)
}

// TestPoolData is the pool suite's data test on Vulkan: pool.New over the
// Vulkan device (growth in chunks of VkDeviceMemory), a long random
// alloc/free sequence with every live block filled with its own pattern by
// the fill kernel or by vkCmdFillBuffer, and every live block checked on
// the device by the check kernel at the end and at random points.
func TestPoolData(t *testing.T) {
	d := open(t)
	ks := loadSet(t, d)
	var configs []pool.Options
	for _, strat := range []string{"bestfit", "tlsf"} {
		configs = append(configs, pool.Options{Name: strat + "-chunks", Growth: pool.GrowChunks, Strategy: strat, ChunkBytes: 8 << 20})
		if d.Info().VirtualMemory { // sparse binding (MEMWALL_VULKAN_SPARSE=1)
			configs = append(configs, pool.Options{Name: strat + "-virtual", Growth: pool.GrowVirtual, Strategy: strat, ReserveBytes: 1 << 30})
		}
	}
	for _, o := range configs {
		strat := o.Name
		t.Run(strat, func(t *testing.T) {
			p, err := pool.New(d, o)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			s, err := d.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			defer d.DestroyStream(s)
			counter, err := d.Alloc(256)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Free(counter)
			type live struct {
				b       pool.Block
				seed    uint32
				pattern bool // written by the fill kernel, else a Memset32 of seed
			}
			r := rand.New(rand.NewPCG(7, uint64(len(strat))))
			var blocks []live
			verify := func(step int) {
				t.Helper()
				for _, l := range blocks {
					if l.pattern {
						if err := d.Memset8(counter, 0, 8, s); err != nil {
							t.Fatal(err)
						}
						if err := ks.Check(l.b.Ptr, l.b.Size/4, l.seed, counter, s); err != nil {
							t.Fatal(err)
						}
						var c [8]byte
						if err := d.CopyDtoH(c[:], counter, s); err != nil {
							t.Fatal(err)
						}
						if n := binary.LittleEndian.Uint64(c[:]); n != 0 {
							t.Fatalf("step %d: block %#x (%d bytes): %d words lost their pattern", step, uint64(l.b.Ptr), l.b.Size, n)
						}
						continue
					}
					got := make([]byte, 4*min(l.b.Size/4, 1024))
					if err := d.CopyDtoH(got, l.b.Ptr.Add(l.b.Size/4*4-uint64(len(got))), s); err != nil {
						t.Fatal(err)
					}
					for i := 0; i < len(got); i += 4 {
						if w := binary.LittleEndian.Uint32(got[i:]); w != l.seed {
							t.Fatalf("step %d: block %#x word %d = %#x, want %#x", step, uint64(l.b.Ptr), i/4, w, l.seed)
						}
					}
				}
			}
			steps := 600
			if testing.Short() {
				steps = 200
			}
			for i := range steps {
				if len(blocks) > 0 && (r.IntN(2) == 0 || len(blocks) > 40) {
					k := r.IntN(len(blocks))
					if err := p.Free(blocks[k].b); err != nil {
						t.Fatal(err)
					}
					blocks[k] = blocks[len(blocks)-1]
					blocks = blocks[:len(blocks)-1]
				} else {
					size := uint64(4) << r.IntN(20)
					size += uint64(r.IntN(int(size)))
					b, err := p.Alloc(size, pool.AllocOptions{Purpose: pool.Activations})
					if err != nil {
						t.Fatalf("step %d: Alloc(%d): %v", i, size, err)
					}
					l := live{b: b, seed: uint32(i)*2654435761 | 1, pattern: r.IntN(2) == 0}
					if l.pattern {
						err = ks.Fill(b.Ptr, b.Size/4, l.seed, s)
					} else {
						err = d.Memset32(b.Ptr, l.seed, b.Size/4, s)
					}
					if err != nil {
						t.Fatal(err)
					}
					blocks = append(blocks, l)
				}
				if i%150 == 149 {
					verify(i)
				}
			}
			verify(steps)
			st := p.Stats()
			t.Logf("%s: %d live blocks, %d bytes used of %d reserved", strat, st.LiveBlocks, st.UsedBytes, st.ReservedBytes)
		})
	}
}

func planModel(t *testing.T, name string) ([]plan.Buffer, plan.Layout) {
	t.Helper()
	g, err := graph.LoadONNX("../../testdata/onnx/"+name+".onnx", nil, graph.Options{})
	if err != nil {
		t.Fatal(err)
	}
	as, err := plan.Activations(g, plan.LivenessOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lay, _, err := plan.Solve(context.Background(), as.Buffers, plan.Options{Alignment: 256, TimeLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	return as.Buffers, lay
}

// runPlan is the seed's Figure 1 on Vulkan: one pool block (one
// VkDeviceMemory) holds every activation at the plan's offset; step k runs
// on stream k%2, fills what it produces and checks what it reads last. A
// step waits (a timeline-semaphore wait on the GPU) on the producers of its
// inputs and, with reuse, on the last readers of the bytes it overwrites
// (bind.Arena.Reuse). With shuffle the device defers all work and submits
// it in a random order that keeps exactly those waits. It returns the
// words the check kernel found corrupted.
func runPlan(t *testing.T, d *vulkan.Device, ks kernelSet, bufs []plan.Buffer, lay plan.Layout, reuse bool, shuffle uint64) uint64 {
	t.Helper()
	p, err := pool.New(d, pool.Options{Name: "activations"}) // virtual where sparse binding is on
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
	writers, lastReads := make([][]int, steps), make([][]int, steps)
	for i, b := range bufs {
		writers[b.Start] = append(writers[b.Start], i)
		lastReads[b.End-1] = append(lastReads[b.End-1], i)
	}
	var streams [2]device.Stream
	for i := range streams {
		if streams[i], err = d.NewStream(); err != nil {
			t.Fatal(err)
		}
		defer d.DestroyStream(streams[i])
	}
	events := make([]device.Event, steps)
	for k := range events {
		if events[k], err = d.NewEvent(false); err != nil {
			t.Fatal(err)
		}
		defer d.DestroyEvent(events[k])
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
	if shuffle != 0 {
		d.Defer()
	}
	for k := range steps {
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
	if shuffle != 0 {
		if err := d.FlushShuffled(shuffle); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Synchronize(); err != nil {
		t.Fatal(err)
	}
	var c [8]byte
	if err := d.CopyDtoH(c[:], counter, streams[0]); err != nil {
		t.Fatal(err)
	}
	return binary.LittleEndian.Uint64(c[:])
}

// TestBindLifetimes runs real graphs' plans on Vulkan with the reuse
// waits: in submission order and in shuffled orders, no tensor is
// overwritten before its last reader ran.
func TestBindLifetimes(t *testing.T) {
	d := open(t)
	ks := loadSet(t, d)
	models := []string{"squeezenet1_1", "mobilenet_v2"}
	if testing.Short() {
		models = models[:1]
	}
	for _, m := range models {
		bufs, lay := planModel(t, m)
		for _, shuffle := range []uint64{0, 1, 2} {
			t.Run(fmt.Sprintf("%s/shuffle%d", m, shuffle), func(t *testing.T) {
				if bad := runPlan(t, d, ks, bufs, lay, true, shuffle); bad != 0 {
					t.Fatalf("%d words corrupted with the reuse waits in place", bad)
				}
			})
		}
		t.Logf("%s: %d buffers in a %d-byte arena", m, len(bufs), lay.ArenaBytes)
	}
}

// TestDroppedBarrierIsCaught shows the reuse waits are what keeps the
// data: without them, the same plan flushed in a shuffled order (one the
// waits that remain allow) lets a writer overwrite a tensor before its
// last reader on the other stream ran, and the check kernel counts the
// damage.
func TestDroppedBarrierIsCaught(t *testing.T) {
	d := open(t)
	ks := loadSet(t, d)
	bufs, lay := planModel(t, "squeezenet1_1")
	var total uint64
	for seed := uint64(1); seed <= 6 && total == 0; seed++ {
		total += runPlan(t, d, ks, bufs, lay, false, seed)
	}
	if total == 0 {
		t.Fatal("no corruption without the reuse waits in six shuffled orders: the test cannot tell them apart")
	}
	t.Logf("without the reuse waits: %d words corrupted", total)
}

// TestSpin: memwall_spin holds the stream for a time that grows with the
// time asked, as timing events around it measure. Vulkan leaves the device
// clock's unit to the driver (nanoseconds on NVIDIA; lavapipe's runs
// faster), so only the order is asserted and the ratio is logged.
func TestSpin(t *testing.T) {
	d := open(t)
	m, err := d.LoadModule(spirv.Module())
	if err != nil {
		t.Fatal(err)
	}
	defer d.UnloadModule(m)
	f, err := d.Function(m, spirv.NameSpin)
	if err != nil {
		t.Fatal(err)
	}
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer d.DestroyStream(s)
	e0, _ := d.NewEvent(true)
	e1, _ := d.NewEvent(true)
	defer d.DestroyEvent(e0)
	defer d.DestroyEvent(e1)
	one := device.Dim3{X: 1, Y: 1, Z: 1}
	spin := func(want time.Duration) time.Duration {
		if err := d.EventRecord(e0, s); err != nil {
			t.Fatal(err)
		}
		if err := d.Launch(f, one, one, 0, s, uint64(want.Nanoseconds())); err != nil {
			if errors.Is(err, device.ErrUnsupported) || strings.Contains(err.Error(), "vkCreateComputePipelines") {
				t.Skipf("no device clock: %v", err)
			}
			t.Fatal(err)
		}
		if err := d.EventRecord(e1, s); err != nil {
			t.Fatal(err)
		}
		if err := d.EventSynchronize(e1); err != nil {
			t.Fatal(err)
		}
		el, err := d.EventElapsed(e0, e1)
		if err != nil {
			t.Fatal(err)
		}
		return el
	}
	spin(time.Millisecond) // the first dispatch compiles the pipeline
	short, long := spin(2*time.Millisecond), spin(40*time.Millisecond)
	if long <= short && d.Details().DeviceType == "cpu" {
		t.Skipf("this CPU driver's shader clock does not hold a spin: 2 ms took %v, 40 ms %v", short, long)
	}
	if long <= short || long > 10*time.Second {
		t.Fatalf("spins of 2 ms and 40 ms took %v and %v on the device", short, long)
	}
	t.Logf("spin of 40ms: %v between the timestamps (2ms: %v); device clock runs %.2f× nanoseconds", long, short, 40e6/float64(long.Nanoseconds()))
}
