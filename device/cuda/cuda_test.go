package cuda_test

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cuda"
	"github.com/memwall/memwall/device/devicetest"
	"github.com/memwall/memwall/device/fault"
	"github.com/memwall/memwall/kernels"
)

// open returns the first GPU, or skips when this machine has none.
func open(t *testing.T) device.Device {
	d, err := cuda.Open(cuda.Options{})
	if err != nil {
		t.Skipf("no usable CUDA GPU here (the suite runs on the GPU machine): %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// loadKernels loads memwall's PTX: the file named by MEMWALL_KERNELS_PTX
// when set (a freshly compiled one), else the embedded module.
func loadKernels(d device.Device) (device.Module, error) {
	ptx := kernels.Embedded()
	if p := os.Getenv(kernels.EnvPTX); p != "" {
		b, err := os.ReadFile(p)
		if err != nil {
			return 0, err
		}
		ptx = b
	}
	if !kernels.IsPTX(ptx) {
		return 0, errors.New("no compiled PTX embedded (run scripts/build-ptx.sh on a machine with nvcc)")
	}
	return d.LoadModule(ptx)
}

func TestConformance(t *testing.T) {
	devicetest.Run(t, open, devicetest.Options{LoadKernels: loadKernels, LargeBytes: 256 << 20})
}

// TestConformanceThroughFault runs the suite through the fault wrapper with
// no rules set: the wrapper must be transparent on the real driver too.
func TestConformanceThroughFault(t *testing.T) {
	devicetest.Run(t, func(t *testing.T) device.Device { return fault.Wrap(open(t), &fault.Config{}) },
		devicetest.Options{LoadKernels: loadKernels, LargeBytes: 64 << 20})
}

func TestInfo(t *testing.T) {
	d := open(t)
	in := d.Info()
	if in.Backend != "cuda" || in.Name == "" || in.TotalBytes == 0 || in.ComputeMajor == 0 {
		t.Fatalf("info %+v", in)
	}
	free, total, err := d.MemInfo()
	if err != nil || free == 0 || free > total || total != in.TotalBytes {
		t.Fatalf("MemInfo %d/%d %v, info total %d", free, total, err, in.TotalBytes)
	}
	t.Logf("%s: %d MiB, cc %d.%d, %d SMs, PCIe gen %d x%d, %d copy engines, VMM %v (%d), disabled %q",
		in.Name, in.TotalBytes>>20, in.ComputeMajor, in.ComputeMinor, in.Multiprocessors,
		in.PCIeGen, in.PCIeWidth, in.CopyEngines, in.VirtualMemory, in.Granularity, in.Disabled)
}

// TestBadLibrary needs no GPU: MEMWALL_LIBCUDA naming a file that is not a
// CUDA driver must fail with a message naming the file, never panic.
func TestBadLibrary(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "libcuda.so.1")
	if err := os.WriteFile(bad, []byte("not a shared object"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{bad, filepath.Join(dir, "missing.so")} {
		_, err := cuda.Open(cuda.Options{Getenv: func(k string) string {
			if k == "MEMWALL_LIBCUDA" {
				return path
			}
			return ""
		}})
		if err == nil {
			t.Fatalf("%s: Open succeeded", path)
		}
		if !errors.Is(err, cuda.ErrNoDriver) || !strings.Contains(err.Error(), path) {
			t.Fatalf("%s: error %q does not name the file or wrap ErrNoDriver", path, err)
		}
	}
}

func TestLibraryCandidates(t *testing.T) {
	c := cuda.LibraryCandidates(func(string) string { return "" })
	if len(c) < 3 || c[0] != "libcuda.so.1" {
		t.Fatalf("candidates %q", c)
	}
	c = cuda.LibraryCandidates(func(k string) string { return "/x/libcuda.so" })
	if len(c) != 1 || c[0] != "/x/libcuda.so" {
		t.Fatalf("MEMWALL_LIBCUDA not the only candidate: %q", c)
	}
}

// TestDriverAnchor opens both driver allocators (cuMemAlloc and
// cuMemAllocAsync on a stream of its own) and runs random sizes through
// each: no handle's range overlaps another live one's, and after every
// block is freed and the allocator released the device's free memory comes
// back.
// (bench's tests time request streams through it.)
func TestDriverAnchor(t *testing.T) {
	d := open(t).(*cuda.Device)
	before, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, async := range []bool{false, true} {
		alloc, free, release, err := d.DriverAllocator(async)
		if err != nil {
			t.Fatal(err)
		}
		type blk struct{ ptr, size uint64 }
		var live []blk
		for i := 0; i < 400; i++ {
			if len(live) > 0 && r.IntN(3) == 0 {
				k := r.IntN(len(live))
				if err := free(live[k].ptr); err != nil {
					t.Fatal(err)
				}
				live = append(live[:k], live[k+1:]...)
				continue
			}
			size := uint64(512) << r.IntN(17) // 512 B to 32 MiB
			size += uint64(r.IntN(int(size)))
			ptr, err := alloc(size)
			if err != nil {
				t.Fatalf("async %v: alloc %d: %v", async, size, err)
			}
			for _, b := range live {
				if ptr < b.ptr+b.size && b.ptr < ptr+size {
					t.Fatalf("async %v: [%#x,+%d) overlaps live [%#x,+%d)", async, ptr, size, b.ptr, b.size)
				}
			}
			live = append(live, blk{ptr, size})
		}
		for _, b := range live {
			if err := free(b.ptr); err != nil {
				t.Fatal(err)
			}
		}
		if err := release(); err != nil {
			t.Fatalf("async %v: release: %v", async, err)
		}
	}
	if err := d.Synchronize(); err != nil {
		t.Fatal(err)
	}
	after, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	// Allow some slack for the driver's own bookkeeping (the async pool
	// may keep what it reserved), less than one of the largest blocks.
	if after+64<<20 < before {
		t.Errorf("free device memory %d after the anchor runs, %d before: blocks leaked", after, before)
	}
}
