package vulkan_test

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/devicetest"
	"github.com/memwall/memwall/device/fault"
	"github.com/memwall/memwall/device/vulkan"
	"github.com/memwall/memwall/kernels/spirv"
)

// open returns the Vulkan device MEMWALL_VULKAN_DEVICE selects (the best
// one by default), or skips with the reason when this machine has no
// usable Vulkan loader and driver (Mesa's lavapipe, mesa-vulkan-drivers,
// is enough). With MEMWALL_TEST_DEVICE=vulkan (the GPU run) a device that
// does not open fails the test instead.
func open(t testing.TB) *vulkan.Device {
	t.Helper()
	return openWith(t, vulkan.Options{})
}

// openWith is open with options.
func openWith(t testing.TB, o vulkan.Options) *vulkan.Device {
	t.Helper()
	d, err := vulkan.Open(o)
	if err != nil {
		if os.Getenv("MEMWALL_TEST_DEVICE") == "vulkan" {
			t.Fatalf("MEMWALL_TEST_DEVICE=vulkan: %v", err)
		}
		t.Skipf("no usable Vulkan device here (install libvulkan1 and mesa-vulkan-drivers): %v", err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return d
}

func loadKernels(d device.Device) (device.Module, error) { return d.LoadModule(spirv.Module()) }

// TestConformance runs the device suite with 32 MiB large copies even under
// -short: on a CPU driver a few MiB copy in microseconds, and the suite's
// "still busy right after queueing" checks need work that lasts.
func TestConformance(t *testing.T) {
	devicetest.Run(t, func(t *testing.T) device.Device { return open(t) }, devicetest.Options{LoadKernels: loadKernels, LargeBytes: 32 << 20})
}

// TestConformanceThroughFault runs the suite through the fault wrapper with
// no rules: the wrapper is transparent on Vulkan too.
func TestConformanceThroughFault(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the plain conformance run covers the backend")
	}
	devicetest.Run(t, func(t *testing.T) device.Device { return fault.Wrap(open(t), &fault.Config{}) },
		devicetest.Options{LoadKernels: loadKernels, LargeBytes: 32 << 20})
}

func TestInfo(t *testing.T) {
	d := open(t)
	in := d.Info()
	if in.Backend != "vulkan" || in.Name == "" || in.TotalBytes == 0 || in.ComputeMajor != 1 || in.ComputeMinor < 2 {
		t.Fatalf("info %+v", in)
	}
	t.Logf("%s (%s): %d MiB, Vulkan %d.%d, %d copy queues, loader %s, disabled %q",
		in.Name, in.DriverVersion, in.TotalBytes>>20, in.ComputeMajor, in.ComputeMinor, in.CopyEngines, d.LoaderPath(), in.Disabled)
}

// TestStructSizes holds the hand-written layouts to the sizes in
// vulkan_core.h (x86-64 and arm64 Linux).
func TestStructSizes(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("layouts are checked on 64-bit platforms")
	}
	for name, got := range vulkan.StructSizes() {
		if want, ok := cSizes[name]; !ok {
			t.Errorf("%s: no C size recorded", name)
		} else if got != want {
			t.Errorf("sizeof(%s) = %d, C has %d", name, got, want)
		}
	}
}

var cSizes = map[string]uintptr{
	"VkApplicationInfo": 48, "VkInstanceCreateInfo": 64, "VkDeviceQueueCreateInfo": 40, "VkDeviceCreateInfo": 72,
	"VkPhysicalDeviceProperties": 824, "VkPhysicalDeviceProperties2": 840, "VkPhysicalDeviceVulkan11Properties": 112,
	"VkPhysicalDeviceDriverProperties": 536, "VkPhysicalDeviceFeatures": 220, "VkPhysicalDeviceFeatures2": 240,
	"VkPhysicalDeviceVulkan12Features": 208, "VkPhysicalDeviceMemoryProperties": 520, "VkPhysicalDeviceMemoryProperties2": 536,
	"VkPhysicalDeviceMemoryBudgetPropertiesEXT": 272, "VkQueueFamilyProperties": 24, "VkExtensionProperties": 260,
	"VkMemoryAllocateInfo": 32, "VkBufferCreateInfo": 56, "VkMemoryRequirements": 24, "VkSubmitInfo": 72,
	"VkTimelineSemaphoreSubmitInfo": 48, "VkSemaphoreWaitInfo": 40, "VkBufferCopy": 24, "VkComputePipelineCreateInfo": 96,
	"VkPipelineShaderStageCreateInfo": 48, "VkSpecializationInfo": 32, "VkSpecializationMapEntry": 16,
	"VkPipelineLayoutCreateInfo": 48, "VkImportMemoryHostPointerInfoEXT": 32, "VkMemoryBarrier": 24,
	"VkSparseMemoryBind": 40, "VkBindSparseInfo": 96, "VkCommandBufferAllocateInfo": 32, "VkQueryPoolCreateInfo": 32,
}

// TestBadLibrary needs no Vulkan: MEMWALL_LIBVULKAN naming a file that is
// not a loader fails with a message naming the file, never panics.
func TestBadLibrary(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "libvulkan.so.1")
	if err := os.WriteFile(bad, []byte("not a shared object"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{bad, filepath.Join(dir, "missing.so")} {
		_, err := vulkan.Open(vulkan.Options{Getenv: func(k string) string {
			if k == "MEMWALL_LIBVULKAN" {
				return path
			}
			return ""
		}})
		if !errors.Is(err, vulkan.ErrNoLoader) || !strings.Contains(err.Error(), path) {
			t.Errorf("MEMWALL_LIBVULKAN=%s: %v, want ErrNoLoader naming the path", path, err)
		}
	}
}

// TestDeviceSelection: MEMWALL_VULKAN_DEVICE (or Options.Device) picks a
// device by index or by a part of its name; one that names no device
// fails with ErrInvalid listing the devices.
func TestDeviceSelection(t *testing.T) {
	name := open(t).Info().Name
	for _, sel := range []string{"0", strings.ToUpper(name[:min(4, len(name))])} {
		d, err := vulkan.Open(vulkan.Options{Getenv: func(k string) string {
			if k == "MEMWALL_VULKAN_DEVICE" {
				return sel
			}
			return ""
		}})
		if err != nil {
			t.Fatalf("MEMWALL_VULKAN_DEVICE=%s: %v", sel, err)
		}
		d.Close()
	}
	for _, sel := range []string{"99", "no such gpu", "-1"} {
		_, err := vulkan.Open(vulkan.Options{Device: sel})
		if !errors.Is(err, device.ErrInvalid) || !strings.Contains(err.Error(), name) {
			t.Errorf("Device %q: %v, want ErrInvalid listing %q", sel, err, name)
		}
	}
}

// TestHostRegisterUnaligned registers slices that start and end inside
// pages (the import is rounded out to the driver's alignment): copies
// from and to them, and through their DevicePtr, touch exactly their bytes.
func TestHostRegisterUnaligned(t *testing.T) {
	d := open(t)
	if !d.Details().ExternalMemoryHost {
		t.Skip("no VK_EXT_external_memory_host")
	}
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer d.DestroyStream(s)
	backing := make([]byte, 3<<20)
	for _, c := range []struct{ off, n int }{{100, 5000}, {4096, 4096}, {7, 1<<20 + 3}, {4095, 1}} {
		b := backing[c.off : c.off+c.n]
		for i := range b {
			b[i] = byte(i*7 + c.off)
		}
		flags := device.RegisterFlags(0)
		if c.off%2 == 0 {
			flags = device.RegisterDeviceMap
		}
		hb, err := d.HostRegister(b, flags)
		if err != nil {
			t.Fatalf("HostRegister(+%d, %d): %v", c.off, c.n, err)
		}
		p, err := d.Alloc(uint64(c.n))
		if err != nil {
			t.Fatal(err)
		}
		if err := d.CopyHtoD(p, b, s); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, c.n)
		if err := d.CopyDtoH(got, p, s); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, b) {
			t.Fatalf("+%d, %d bytes: the copy from registered memory differs", c.off, c.n)
		}
		before, after := backing[c.off-1], byte(0)
		if c.off+c.n < len(backing) {
			after = backing[c.off+c.n]
		}
		if err := d.Memset8(p, 0xEE, uint64(c.n), s); err != nil {
			t.Fatal(err)
		}
		if err := d.CopyDtoH(b, p, s); err != nil { // into the registered memory itself
			t.Fatal(err)
		}
		if err := d.StreamSynchronize(s); err != nil {
			t.Fatal(err)
		}
		if bytes.Count(b, []byte{0xEE}) != c.n || backing[c.off-1] != before || (c.off+c.n < len(backing) && backing[c.off+c.n] != after) {
			t.Fatalf("+%d, %d bytes: the copy into registered memory missed its bytes or touched a neighbour", c.off, c.n)
		}
		if flags&device.RegisterDeviceMap != 0 && hb.DevicePtr == 0 {
			t.Errorf("+%d: RegisterDeviceMap gave no DevicePtr", c.off)
		}
		if err := d.HostFree(hb); err != nil {
			t.Fatal(err)
		}
		if err := d.Free(p); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAllocPriority: priorities outside [0, 1] are refused, those inside
// allocate usable memory whether or not the driver has memory priority.
func TestAllocPriority(t *testing.T) {
	d := open(t)
	for _, pr := range []float32{-0.1, 1.5, float32(math.NaN())} {
		if _, err := d.AllocPriority(4096, pr); !errors.Is(err, device.ErrInvalid) {
			t.Errorf("AllocPriority(4096, %v) = %v, want ErrInvalid", pr, err)
		}
	}
	for _, pr := range []float32{0, 0.5, 1} {
		p, err := d.AllocPriority(1<<20, pr)
		if err != nil {
			t.Fatalf("AllocPriority(1 MiB, %v): %v", pr, err)
		}
		if err := d.Free(p); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNaturalAlignment: an allocation's Ptr is aligned to its size rounded
// up to a power of two (64 KiB to 4 GiB), as GPU allocators align large
// blocks, so that pools placing power-of-two blocks at aligned offsets
// (buddy) can use whole chunks.
func TestNaturalAlignment(t *testing.T) {
	d := open(t)
	for _, n := range []uint64{1, 300 << 10, 3 << 20, 32 << 20, 33 << 20} {
		p, err := d.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		want := max(uint64(64<<10), uint64(1)<<(64-bitsLeadingZeros(n-1)))
		if n == 1 {
			want = 64 << 10
		}
		if uint64(p)%want != 0 {
			t.Errorf("Alloc(%d) = %#x, not aligned to %d", n, uint64(p), want)
		}
		d.Free(p)
	}
}

func bitsLeadingZeros(x uint64) int {
	n := 0
	for i := 63; i >= 0 && x>>uint(i)&1 == 0; i-- {
		n++
	}
	return n
}

// TestPickFamilies: compute goes to an async-compute family with
// timestamps where there is one, copies to a copy-only family (never a
// video one); without such families both share the universal one.
func TestPickFamilies(t *testing.T) {
	const g, c, tr, sp, dec, enc = 0x1, 0x2, 0x4, 0x8, 0x20, 0x40
	for _, tc := range []struct {
		name          string
		fams          [][3]uint32
		compute, copy int
	}{
		{"nvidia", [][3]uint32{{g | c | tr | sp, 16, 64}, {tr | sp, 2, 64}, {c | tr | sp, 8, 64}, {tr | sp | dec, 1, 64}, {tr | sp | enc, 1, 64}}, 2, 1},
		{"video first", [][3]uint32{{g | c | tr, 1, 64}, {tr | dec, 1, 0}, {tr, 2, 0}}, 0, 2},
		{"amd", [][3]uint32{{g | c | tr | sp, 1, 64}, {c | tr | sp, 4, 64}, {tr | sp, 2, 64}}, 1, 2},
		{"lavapipe", [][3]uint32{{g | c | tr, 1, 64}}, 0, -1},
		{"compute without timestamps", [][3]uint32{{g | c | tr, 1, 64}, {c | tr, 4, 0}}, 0, -1},
		{"empty family", [][3]uint32{{g | c | tr, 1, 64}, {c, 0, 64}, {tr, 0, 64}}, 0, -1},
	} {
		c, tr := vulkan.PickFamilies(tc.fams)
		if c != tc.compute || tr != tc.copy {
			t.Errorf("%s: compute %d, transfer %d; want %d, %d", tc.name, c, tr, tc.compute, tc.copy)
		}
	}
}

// TestReopen opens and closes the device many times in one process (8,
// or MEMWALL_VULKAN_REOPEN): every open succeeds and works. Without the
// driver kept loaded across opens, NVIDIA's driver refused
// vkCreateInstance with VK_ERROR_INCOMPATIBLE_DRIVER after 30 (its
// libnvidia-tls.so exhausts glibc's static TLS when loaded again and again).
func TestReopen(t *testing.T) {
	n := reopenCount(t, "MEMWALL_VULKAN_REOPEN", 8)
	first := open(t)
	t.Logf("driver %q; this open kept %d more shared objects loaded (the process's first open keeps the driver's)", first.Details().Driver, vulkan.Pinned(first))
	for i := range n {
		d, err := vulkan.Open(vulkan.Options{})
		if err != nil {
			t.Fatalf("open %d of %d: %v", i+1, n, err)
		}
		p, err := d.Alloc(4096)
		if err == nil {
			err = d.Free(p)
		}
		if cerr := d.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatalf("open %d of %d: %v", i+1, n, err)
		}
	}
}

// TestReopenUnpinned is the account of what TestReopen guards against:
// with MEMWALL_VULKAN_REOPEN_UNPINNED=N (in a process of its own, before
// any pinned open) it opens and closes N times leaving the driver to the
// loader's unloading and logs the first open that fails, if any.
func TestReopenUnpinned(t *testing.T) {
	if os.Getenv("MEMWALL_VULKAN_REOPEN_UNPINNED") == "" {
		t.Skip("MEMWALL_VULKAN_REOPEN_UNPINNED=N runs it (alone in its process)")
	}
	n := reopenCount(t, "MEMWALL_VULKAN_REOPEN_UNPINNED", 0)
	for i := range n {
		d, err := vulkan.OpenUnpinned(vulkan.Options{})
		if err != nil {
			t.Logf("unpinned: open %d of %d failed: %v", i+1, n, err)
			return
		}
		d.Close()
	}
	t.Logf("unpinned: all %d opens succeeded", n)
}

func reopenCount(t *testing.T, env string, def int) int {
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a count", env, v)
	}
	return n
}

// TestConformanceSplitCopies runs the suite with copies of 32 MiB and more
// split over three copy queues (on a driver with fewer, parts share them).
func TestConformanceSplitCopies(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the plain conformance run covers the backend")
	}
	devicetest.Run(t, func(t *testing.T) device.Device { return openWith(t, vulkan.Options{CopyQueues: 3}) },
		devicetest.Options{LoadKernels: loadKernels, LargeBytes: 32 << 20})
}

// TestNoDriverSaysWhy: a loader that finds no driver fails Open with
// VK_ERROR_INCOMPATIBLE_DRIVER and the hint for NVIDIA's headless driver.
func TestNoDriverSaysWhy(t *testing.T) {
	open(t).Close() // skips without a loader and a driver
	t.Setenv("VK_DRIVER_FILES", filepath.Join(t.TempDir(), "none.json"))
	t.Setenv("VK_ICD_FILENAMES", "")
	_, err := vulkan.Open(vulkan.Options{})
	var ve *vulkan.Error
	if !errors.As(err, &ve) || ve.Code != -9 || !strings.Contains(err.Error(), "libEGL_nvidia.so.0") {
		t.Fatalf("no driver: %v, want VK_ERROR_INCOMPATIBLE_DRIVER with the hint", err)
	}
}
