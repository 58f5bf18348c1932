package cuda_test

import (
	"errors"
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

// TestDriverAnchor runs the driver anchor's two request streams (a working
// set with a victim freed before each allocation, and allocations freed at
// once) through both driver allocators: every timed pair yields a time,
// every block is freed (the device's free memory comes back), and a
// victim outside the working set is refused before any call.
func TestDriverAnchor(t *testing.T) {
	d := open(t).(*cuda.Device)
	before, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	w := device.AllocWorkload{Initial: []uint64{32 << 20, 48 << 20, 4096}, Warmup: 2}
	for i := 0; i < 34; i++ {
		w.Sizes = append(w.Sizes, uint64(512+i*100_003))
		w.Victims = append(w.Victims, i%3)
	}
	for _, async := range []bool{false, true} {
		for _, ws := range []device.AllocWorkload{w, {Sizes: w.Sizes, Warmup: 2}} {
			pairs, err := d.DriverPairTimes(ws, async)
			if err != nil {
				t.Fatal(err)
			}
			batches, err := d.DriverBatchTimes(ws, async, 16)
			if err != nil {
				t.Fatal(err)
			}
			a, f, err := d.DriverAllocTimes(ws, async)
			if err != nil {
				t.Fatal(err)
			}
			if len(pairs) != 32 || len(batches) != 2 || len(a) != 32 || len(f) != 32 {
				t.Errorf("async %v, live %d: %d pairs, %d batches, %d/%d split times; want 32, 2, 32/32", async, len(ws.Initial), len(pairs), len(batches), len(a), len(f))
			}
			for _, x := range pairs {
				if x <= 0 {
					t.Fatalf("non-positive pair time %v", x)
				}
			}
		}
	}
	bad := w
	bad.Victims = append([]int(nil), w.Victims...)
	bad.Victims[5] = 3
	if _, err := d.DriverPairTimes(bad, true); !errors.Is(err, device.ErrInvalid) {
		t.Errorf("victim outside the working set: %v, want ErrInvalid", err)
	}
	if err := d.Synchronize(); err != nil {
		t.Fatal(err)
	}
	after, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	// Allow some slack for the driver's own bookkeeping, less than one of
	// the working set's large blocks.
	if after+16<<20 < before {
		t.Errorf("free device memory %d after the anchor runs, %d before: blocks leaked", after, before)
	}
}
