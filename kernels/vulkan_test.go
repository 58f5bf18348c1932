package kernels_test

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/vulkan"
	"github.com/memwall/memwall/kernels"
)

// openVulkan opens the Vulkan device or skips (see device/vulkan's tests;
// Mesa's lavapipe is enough); MEMWALL_TEST_DEVICE=vulkan makes a device
// that does not open a failure.
func openVulkan(t *testing.T) *vulkan.Device {
	t.Helper()
	d, err := vulkan.Open(vulkan.Options{})
	if err != nil {
		if os.Getenv("MEMWALL_TEST_DEVICE") == "vulkan" {
			t.Fatalf("MEMWALL_TEST_DEVICE=vulkan: %v", err)
		}
		t.Skipf("no usable Vulkan device here (install libvulkan1 and mesa-vulkan-drivers): %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestVulkanMatmul: on a Vulkan device Load gives package spirv's kernels,
// and Matmul matches the float64 reference on every output for each dtype,
// over shapes with odd K, many tokens and 16-bit operands that start
// halfway into a 32-bit word; a misaligned operand is refused.
func TestVulkanMatmul(t *testing.T) {
	d := openVulkan(t)
	ks, err := kernels.Load(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ks.Close()
	if ks.Source() != "embedded SPIR-V (kernels/spirv)" {
		t.Errorf("Source %q", ks.Source())
	}
	st, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer d.DestroyStream(st)
	r := rand.New(rand.NewPCG(5, 9))
	for _, dt := range []string{kernels.BF16, kernels.F16, kernels.F32} {
		elt, _ := kernels.ElemSize(dt)
		for _, sh := range []struct{ M, K, T int }{{1, 1, 1}, {7, 13, 1}, {37, 99, 3}, {129, 257, 9}, {64, 1000, 40}, {3, 4097, 2}} {
			for _, skew := range []int{0, elt} { // operands at a 4-byte boundary, and one element past it
				vals := func(n int) []byte {
					v := make([]float32, n)
					for i := range v {
						v[i] = r.Float32()*2 - 1
					}
					b, err := kernels.Encode(dt, v)
					if err != nil {
						t.Fatal(err)
					}
					return b
				}
				W, X := vals(sh.M*sh.K), vals(sh.T*sh.K)
				upload := func(b []byte) (device.Ptr, device.Ptr) {
					base, err := d.Alloc(uint64(len(b) + 16))
					if err != nil {
						t.Fatal(err)
					}
					p := base + device.Ptr(skew)
					if err := d.CopyHtoD(p, b, st); err != nil {
						t.Fatal(err)
					}
					return base, p
				}
				wb, w := upload(W)
				xb, x := upload(X)
				y, err := d.Alloc(uint64(4 * sh.M * sh.T))
				if err != nil {
					t.Fatal(err)
				}
				if err := ks.Matmul(dt, w, x, y, uint32(sh.M), uint32(sh.K), uint32(sh.T), st); err != nil {
					t.Fatalf("%s %+v: %v", dt, sh, err)
				}
				out := make([]byte, 4*sh.M*sh.T)
				if err := d.CopyDtoH(out, y, st); err != nil {
					t.Fatal(err)
				}
				if err := d.StreamSynchronize(st); err != nil {
					t.Fatal(err)
				}
				Y := make([]float32, sh.M*sh.T)
				for i := range Y {
					Y[i] = math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:]))
				}
				if err := kernels.CheckMatmul(dt, W, X, Y, sh.M, sh.K, sh.T, 0, 1); err != nil {
					t.Errorf("%s %+v, operands %d bytes past a word: %v", dt, sh, skew, err)
				}
				if elt > 1 {
					if err := ks.Matmul(dt, w+1, x, y, uint32(sh.M), uint32(sh.K), uint32(sh.T), st); !errors.Is(err, device.ErrInvalid) {
						t.Errorf("%s: W at an odd address: %v, want device.ErrInvalid", dt, err)
					}
				}
				for _, p := range []device.Ptr{wb, xb, y} {
					if err := d.Free(p); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
	}
}
