package cuda_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cuda"
	"github.com/memwall/memwall/kernels"
)

func TestCublasLtCandidates(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if got := cuda.CublasLtCandidates(env(map[string]string{cuda.EnvLibCublasLt: "/x/libcublasLt.so.13", "LD_LIBRARY_PATH": "/y"}), nil); !slices.Equal(got, []string{"/x/libcublasLt.so.13"}) {
		t.Errorf("with %s set: %v, want only it", cuda.EnvLibCublasLt, got)
	}
	globbed := map[string][]string{
		"/opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib": {"/opt/app/.venv/lib/python3.12/site-packages/nvidia/cu13/lib", "/opt/app/.venv/lib/python3.12/site-packages/nvidia/cublas/lib"},
		"/env/lib/python3*/site-packages/nvidia/*/lib":         {"/env/lib/python3.11/site-packages/nvidia/cublas/lib"},
	}
	glob := func(p string) ([]string, error) { return globbed[p], nil }
	got := cuda.CublasLtCandidates(env(map[string]string{"LD_LIBRARY_PATH": "/a/lib::/b", "VIRTUAL_ENV": "/env"}), glob)
	if !slices.Equal(got[:3], []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"}) {
		t.Errorf("first candidates %v: want the sonames through the dynamic linker", got[:3])
	}
	idx := func(p string) int { return slices.Index(got, p) }
	for _, p := range []string{"/a/lib/libcublasLt.so.13", "/b/libcublasLt.so.12", "/usr/local/cuda/lib64/libcublasLt.so.13",
		"/usr/lib/x86_64-linux-gnu/libcublasLt.so.12",
		"/opt/app/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublasLt.so.13",
		"/opt/app/.venv/lib/python3.12/site-packages/nvidia/cublas/lib/libcublasLt.so.12",
		"/env/lib/python3.11/site-packages/nvidia/cublas/lib/libcublasLt.so.13"} {
		if idx(p) < 0 {
			t.Errorf("%s not among the candidates %v", p, got)
		}
	}
	if idx("/a/lib/libcublasLt.so.13") > idx("/usr/local/cuda/lib64/libcublasLt.so.13") {
		t.Error("LD_LIBRARY_PATH must come before the toolkit directory")
	}
	for _, p := range got {
		if strings.HasPrefix(p, "/libcublasLt") {
			t.Errorf("empty LD_LIBRARY_PATH entry became %s", p)
		}
	}
}

func TestCublasLtAbsent(t *testing.T) {
	d, err := cuda.Open(cuda.Options{Getenv: func(k string) string {
		if k == cuda.EnvLibCublasLt {
			return "/nonexistent/libcublasLt.so.13"
		}
		return ""
	}})
	if err != nil {
		t.Skipf("no usable CUDA GPU here: %v", err)
	}
	defer d.Close()
	if n := d.GemmName(); n != "" {
		t.Errorf("GemmName with a missing library = %q", n)
	}
	if err := d.Gemm("bf16", 256, 256, 256, 4, 8, 9, 1); !errors.Is(err, device.ErrUnsupported) {
		t.Errorf("Gemm without the library: %v, want ErrUnsupported", err)
	}
}

// cuBLASLt products against the float64 reference, on the GPU machine.
func TestCublasLtGemm(t *testing.T) {
	d := open(t).(*cuda.Device)
	if d.GemmName() == "" {
		_, _, err := d.BlasLt()
		t.Skipf("no cuBLASLt: %v", err)
	}
	path, ver, _ := d.BlasLt()
	t.Logf("cuBLASLt %d from %s", ver, path)
	if w := d.GemmWorkspaceBytes(); w != 32<<20 {
		t.Errorf("GemmWorkspaceBytes = %d, want 32 MiB", w)
	}
	st, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer d.DestroyStream(st)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, dt := range []string{"bf16", "f16"} {
		for _, sh := range []struct{ M, K, T int }{{64, 64, 16}, {4096, 4096, 9}, {1000, 328, 77}, {11008, 4096, 512}, {4, 8, 2048}} {
			t.Run(fmt.Sprintf("%s M=%d K=%d T=%d", dt, sh.M, sh.K, sh.T), func(t *testing.T) {
				w := make([]float32, sh.M*sh.K)
				x := make([]float32, sh.T*sh.K)
				for i := range w {
					w[i] = float32(rng.NormFloat64())
				}
				for i := range x {
					x[i] = float32(rng.NormFloat64())
				}
				W, _ := kernels.Encode(dt, w)
				X, _ := kernels.Encode(dt, x)
				pw, px, py := devBuf(t, d, len(W)), devBuf(t, d, len(X)), devBuf(t, d, 4*sh.M*sh.T)
				must := func(err error) {
					t.Helper()
					if err != nil {
						t.Fatal(err)
					}
				}
				must(d.CopyHtoD(pw, W, st))
				must(d.CopyHtoD(px, X, st))
				must(d.Memset8(py, 0xFF, uint64(4*sh.M*sh.T), st))
				must(d.Gemm(dt, pw, px, py, uint32(sh.M), uint32(sh.K), uint32(sh.T), st))
				yb := make([]byte, 4*sh.M*sh.T)
				must(d.CopyDtoH(yb, py, st))
				must(d.StreamSynchronize(st))
				y, _ := kernels.Decode("f32", yb)
				must(kernels.CheckMatmul(dt, W, X, y, sh.M, sh.K, sh.T, 3000, 1))
			})
		}
	}
	if err := d.Gemm("f32", 256, 256, 256, 1, 1, 9, st); !errors.Is(err, device.ErrUnsupported) {
		t.Errorf("f32: %v, want ErrUnsupported", err)
	}
	if err := d.Gemm("bf16", 256+2, 256, 256, 4, 8, 9, st); !errors.Is(err, device.ErrUnsupported) {
		t.Errorf("misaligned W: %v, want ErrUnsupported", err)
	}
	if err := d.Gemm("bf16", 256, 256, 256, 4, 333, 9, st); !errors.Is(err, device.ErrUnsupported) {
		t.Errorf("odd K: %v, want ErrUnsupported", err)
	}
}

func devBuf(t *testing.T, d device.Device, n int) device.Ptr {
	p, err := d.Alloc(uint64(max(n, 1)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Free(p) })
	return p
}
