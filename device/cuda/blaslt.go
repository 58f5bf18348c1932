package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/memwall/memwall/device"
)

// cuBLASLt, bound at run time like the driver: Device implements
// device.MatmulLibrary with it when a libcublasLt can be loaded. The library
// is looked for on first use (GemmName or Gemm), not at Open.

// EnvLibCublasLt names the environment variable that, when set, is the only
// libcublasLt path tried.
const EnvLibCublasLt = "MEMWALL_LIBCUBLASLT"

// cuBLAS and cuBLASLt constants (cublas_api.h, cublasLt.h, library_types.h).
const (
	ltComputeF32      = 68 // CUBLAS_COMPUTE_32F
	ltRF32            = 0  // CUDA_R_32F
	ltRF16            = 2  // CUDA_R_16F
	ltRBF16           = 14 // CUDA_R_16BF
	ltOpN             = 0  // CUBLAS_OP_N
	ltOpT             = 1  // CUBLAS_OP_T
	ltDescTransA      = 3  // CUBLASLT_MATMUL_DESC_TRANSA
	ltDescTransB      = 4  // CUBLASLT_MATMUL_DESC_TRANSB
	ltPrefMaxWorkspac = 1  // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES (uint64)

	ltStatusInvalidValue = 7
	ltStatusNotSupported = 15

	ltWorkspaceBytes = 32 << 20
	ltMaxPlans       = 256
	ltAlign          = 256 // pointers the heuristics' default alignment assumption covers
)

// ltHeuristic is cublasLtMatmulHeuristicResult_t (96 bytes).
type ltHeuristic struct {
	algo      [8]uint64 // cublasLtMatmulAlgo_t
	workspace uint64
	state     int32
	waves     float32
	reserved  [4]int32
}

// blasLt is the loaded library, its handle, and the plans made so far.
type blasLt struct {
	once sync.Once
	err  error // why the library is unavailable
	path string
	ver  uint64

	lib                                              uintptr
	create, destroy, getVersion                      uintptr
	descCreate, descSetAttr, descDestroy             uintptr
	layoutCreate, layoutDestroy                      uintptr
	prefCreate, prefSetAttr, prefDestroy, heuristics uintptr
	matmul                                           uintptr
	handle                                           uintptr

	mu    sync.Mutex
	plans map[ltKey]*ltPlan
	work  map[device.Stream]device.Ptr
}

type ltKey struct {
	dtype   string
	M, K, T uint32
}

// ltPlan is one product shape's descriptors and chosen algorithm.
type ltPlan struct {
	desc, a, b, d uintptr
	algo          ltHeuristic
}

// CublasLtCandidates returns the libcublasLt paths tried, in order: only
// getenv(EnvLibCublasLt) when set; else the sonames (13, 12, unversioned)
// through the dynamic linker, the directories of LD_LIBRARY_PATH, the CUDA
// toolkit and distribution directories, and pip's nvidia wheels
// (site-packages/nvidia/{cublas,cu13,...}/lib) under $VIRTUAL_ENV,
// $CONDA_PREFIX, virtual environments in /opt/*/ and the system Python
// prefixes. glob lists the paths matching a pattern (filepath.Glob; nil
// skips the pip directories).
func CublasLtCandidates(getenv func(string) string, glob func(string) ([]string, error)) []string {
	if getenv != nil {
		if p := getenv(EnvLibCublasLt); p != "" {
			return []string{p}
		}
	}
	names := []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"}
	out := append([]string(nil), names...)
	dirs := []string{}
	if getenv != nil {
		for _, d := range strings.Split(getenv("LD_LIBRARY_PATH"), ":") {
			if d != "" {
				dirs = append(dirs, d)
			}
		}
	}
	dirs = append(dirs, "/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib",
		"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64")
	if glob != nil {
		var pats []string
		if getenv != nil {
			for _, v := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
				if p := getenv(v); p != "" {
					pats = append(pats, filepath.Join(p, "lib/python3*/site-packages/nvidia/*/lib"))
				}
			}
		}
		for _, pat := range append(pats,
			"/opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib",
			"/opt/*/venv/lib/python3*/site-packages/nvidia/*/lib",
			"/usr/local/lib/python3*/dist-packages/nvidia/*/lib",
			"/usr/local/lib/python3*/site-packages/nvidia/*/lib",
			"/usr/lib/python3/dist-packages/nvidia/*/lib",
		) {
			m, _ := glob(pat)
			sort.Strings(m)
			dirs = append(dirs, m...)
		}
	}
	for _, d := range dirs {
		for _, n := range names {
			out = append(out, filepath.Join(d, n))
		}
	}
	return out
}

// lt returns the loaded cuBLASLt, loading it on first use.
func (c *Device) lt() (*blasLt, error) {
	b := &c.blas
	b.once.Do(func() { b.err = c.loadBlasLt(CublasLtCandidates(c.getenv, filepath.Glob)) })
	return b, b.err
}

func (c *Device) loadBlasLt(candidates []string) error {
	b := &c.blas
	var tried []string
	for _, p := range candidates {
		if strings.ContainsRune(p, '/') {
			if _, err := os.Stat(p); err != nil {
				continue
			}
		}
		lib, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err != nil {
			if !strings.Contains(err.Error(), "cannot open shared object file") {
				tried = append(tried, fmt.Sprintf("%s: %v", p, err))
			}
			continue
		}
		if err := b.bind(lib); err != nil {
			_ = purego.Dlclose(lib)
			tried = append(tried, fmt.Sprintf("%s: %v", p, err))
			continue
		}
		b.lib, b.path = lib, p
		b.ver = uint64(c.d.raw(b.getVersion))
		var h uintptr
		if err := c.ltCall("cublasLtCreate", b.create, uintptr(unsafe.Pointer(&h))); err != nil {
			return fmt.Errorf("cuda: cublaslt %s: %w", p, err)
		}
		b.handle = h
		b.plans = map[ltKey]*ltPlan{}
		b.work = map[device.Stream]device.Ptr{}
		return nil
	}
	msg := "not found (set " + EnvLibCublasLt + " to its path)"
	if len(tried) > 0 {
		msg = strings.Join(tried, "; ")
	}
	return fmt.Errorf("cuda: libcublasLt: %s: %w", msg, device.ErrUnsupported)
}

func (b *blasLt) bind(lib uintptr) error {
	var missing []string
	for _, s := range []struct {
		dst  *uintptr
		name string
	}{
		{&b.create, "cublasLtCreate"}, {&b.destroy, "cublasLtDestroy"}, {&b.getVersion, "cublasLtGetVersion"},
		{&b.descCreate, "cublasLtMatmulDescCreate"}, {&b.descSetAttr, "cublasLtMatmulDescSetAttribute"},
		{&b.descDestroy, "cublasLtMatmulDescDestroy"}, {&b.layoutCreate, "cublasLtMatrixLayoutCreate"},
		{&b.layoutDestroy, "cublasLtMatrixLayoutDestroy"}, {&b.prefCreate, "cublasLtMatmulPreferenceCreate"},
		{&b.prefSetAttr, "cublasLtMatmulPreferenceSetAttribute"}, {&b.prefDestroy, "cublasLtMatmulPreferenceDestroy"},
		{&b.heuristics, "cublasLtMatmulAlgoGetHeuristic"}, {&b.matmul, "cublasLtMatmul"},
	} {
		p, err := purego.Dlsym(lib, s.name)
		if err != nil || p == 0 {
			missing = append(missing, s.name)
			continue
		}
		*s.dst = p
	}
	if len(missing) > 0 {
		return fmt.Errorf("not a cuBLASLt: missing %s", strings.Join(missing, ", "))
	}
	return nil
}

// LtError is a failed cuBLASLt call.
type LtError struct {
	Func   string
	Status int
}

func (e *LtError) Error() string { return fmt.Sprintf("%s: cublasStatus %d", e.Func, e.Status) }

// Is maps CUBLAS_STATUS_NOT_SUPPORTED and INVALID_VALUE onto the device
// package's errors.
func (e *LtError) Is(target error) bool {
	switch target {
	case device.ErrUnsupported:
		return e.Status == ltStatusNotSupported
	case device.ErrInvalid:
		return e.Status == ltStatusInvalidValue
	}
	return false
}

// ltCall runs a cuBLASLt function with the device's context current on the
// calling OS thread (the library's internal runtime uses that context).
//
//go:uintptrescapes
func (c *Device) ltCall(name string, fn uintptr, args ...uintptr) error {
	if r := c.d.ctxCall(c.ctx, fn, args...); r != 0 {
		return &LtError{Func: name, Status: int(r)}
	}
	return nil
}

// GemmName is "cublaslt" when libcublasLt could be loaded, else "".
func (c *Device) GemmName() string {
	if _, err := c.lt(); err != nil {
		return ""
	}
	return "cublaslt"
}

// BlasLt reports the libcublasLt in use (path and cublasLtGetVersion), or
// why there is none.
func (c *Device) BlasLt() (path string, version uint64, err error) {
	b, err := c.lt()
	if err != nil {
		return "", 0, err
	}
	return b.path, b.ver, nil
}

var _ device.MatmulLibrary = (*Device)(nil)

// Gemm queues Y (T×M float32) = X (T×K) · W (M×K)ᵀ on s through
// cublasLtMatmul (row-major operands as the column-major "TN" product
// Yᵀ = W·Xᵀ; CUBLAS_COMPUTE_32F, float32 scale, α = 1, β = 0). Products it
// does not take fail with device.ErrUnsupported before anything is queued:
// dtypes other than bf16 and f16, an empty product, K not a multiple of 8 or
// M of 4, pointers not 256-byte aligned, no library, or no algorithm from
// the heuristics. Shapes are planned once
// (descriptors and algorithm cached); each stream gets its own 32 MiB
// workspace on first use, kept for the Device's life.
func (c *Device) Gemm(dtype string, W, X, Y device.Ptr, M, K, T uint32, s device.Stream) error {
	var typ uintptr
	switch dtype {
	case "bf16":
		typ = ltRBF16
	case "f16":
		typ = ltRF16
	default:
		return fmt.Errorf("cuda: cublaslt gemm: dtype %q: %w", dtype, device.ErrUnsupported)
	}
	if M == 0 || K == 0 || T == 0 {
		return fmt.Errorf("cuda: cublaslt gemm M=%d K=%d T=%d: empty: %w", M, K, T, device.ErrUnsupported)
	}
	if K%8 != 0 || M%4 != 0 {
		return fmt.Errorf("cuda: cublaslt gemm M=%d K=%d: rows not 16-byte multiples: %w", M, K, device.ErrUnsupported)
	}
	if W%ltAlign != 0 || X%ltAlign != 0 || Y%ltAlign != 0 {
		return fmt.Errorf("cuda: cublaslt gemm: operands not %d-byte aligned: %w", ltAlign, device.ErrUnsupported)
	}
	b, err := c.lt()
	if err != nil {
		return err
	}
	hs, err := c.stream(s)
	if err != nil {
		return err
	}
	plan, work, cached, err := c.ltPrepare(b, ltKey{dtype, M, K, T}, typ, s)
	if err != nil {
		return err
	}
	if !cached {
		defer c.ltFreePlan(b, plan)
	}
	alpha, beta := float32(1), float32(0)
	return c.ltCall("cublasLtMatmul", b.matmul, b.handle, plan.desc,
		uintptr(unsafe.Pointer(&alpha)), uintptr(W), plan.a, uintptr(X), plan.b,
		uintptr(unsafe.Pointer(&beta)), uintptr(Y), plan.d, uintptr(Y), plan.d,
		uintptr(unsafe.Pointer(&plan.algo.algo)), uintptr(work), ltWorkspaceBytes, hs)
}

// ltPrepare returns the plan for k and the workspace of stream s, making
// them on first use. Past ltMaxPlans shapes a plan is made for the one call
// (cached false: the caller frees it after the matmul is queued).
func (c *Device) ltPrepare(b *blasLt, k ltKey, typ uintptr, s device.Stream) (plan *ltPlan, work device.Ptr, cached bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	work = b.work[s]
	if work == 0 {
		p, err := c.Alloc(ltWorkspaceBytes)
		if err != nil {
			return nil, 0, false, fmt.Errorf("cuda: cublaslt workspace: %w", err)
		}
		b.work[s], work = p, p
	}
	if p := b.plans[k]; p != nil {
		return p, work, true, nil
	}
	p, err := c.ltPlan(b, k, typ)
	if err != nil {
		return nil, 0, false, err
	}
	if len(b.plans) >= ltMaxPlans {
		return p, work, false, nil
	}
	b.plans[k] = p
	return p, work, true, nil
}

func (c *Device) ltPlan(b *blasLt, k ltKey, typ uintptr) (p *ltPlan, err error) {
	p = &ltPlan{}
	defer func() {
		if err != nil {
			c.ltFreePlan(b, p)
			p = nil
		}
	}()
	if err := c.ltCall("cublasLtMatmulDescCreate", b.descCreate, uintptr(unsafe.Pointer(&p.desc)), ltComputeF32, ltRF32); err != nil {
		return nil, fmt.Errorf("cuda: cublaslt: %w", err)
	}
	opT, opN := int32(ltOpT), int32(ltOpN)
	if err := c.ltCall("cublasLtMatmulDescSetAttribute", b.descSetAttr, p.desc, ltDescTransA, uintptr(unsafe.Pointer(&opT)), 4); err != nil {
		return nil, fmt.Errorf("cuda: cublaslt: TRANSA: %w", err)
	}
	if err := c.ltCall("cublasLtMatmulDescSetAttribute", b.descSetAttr, p.desc, ltDescTransB, uintptr(unsafe.Pointer(&opN)), 4); err != nil {
		return nil, fmt.Errorf("cuda: cublaslt: TRANSB: %w", err)
	}
	M, K, T := uintptr(k.M), uintptr(k.K), uintptr(k.T)
	// Column-major: A = W as K×M (ld K, transposed), B = X as K×T (ld K), D = Y as M×T (ld M).
	for _, l := range []struct {
		dst             *uintptr
		typ, rows, cols uintptr
		ld              uintptr
		what            string
	}{{&p.a, typ, K, M, K, "A"}, {&p.b, typ, K, T, K, "B"}, {&p.d, ltRF32, M, T, M, "D"}} {
		if err := c.ltCall("cublasLtMatrixLayoutCreate", b.layoutCreate, uintptr(unsafe.Pointer(l.dst)), l.typ, l.rows, l.cols, l.ld); err != nil {
			return nil, fmt.Errorf("cuda: cublaslt: layout %s: %w", l.what, err)
		}
	}
	var pref uintptr
	if err := c.ltCall("cublasLtMatmulPreferenceCreate", b.prefCreate, uintptr(unsafe.Pointer(&pref))); err != nil {
		return nil, fmt.Errorf("cuda: cublaslt: %w", err)
	}
	defer c.ltCall("cublasLtMatmulPreferenceDestroy", b.prefDestroy, pref)
	ws := uint64(ltWorkspaceBytes)
	if err := c.ltCall("cublasLtMatmulPreferenceSetAttribute", b.prefSetAttr, pref, ltPrefMaxWorkspac, uintptr(unsafe.Pointer(&ws)), 8); err != nil {
		return nil, fmt.Errorf("cuda: cublaslt: workspace preference: %w", err)
	}
	var res [4]ltHeuristic
	var n int32
	if err := c.ltCall("cublasLtMatmulAlgoGetHeuristic", b.heuristics, b.handle, p.desc, p.a, p.b, p.d, p.d, pref,
		uintptr(len(res)), uintptr(unsafe.Pointer(&res[0])), uintptr(unsafe.Pointer(&n))); err != nil {
		return nil, fmt.Errorf("cuda: cublaslt %s M=%d K=%d T=%d: heuristics: %w", k.dtype, k.M, k.K, k.T, err)
	}
	for _, r := range res[:max(0, min(int(n), len(res)))] {
		if r.state == 0 && r.workspace <= ltWorkspaceBytes {
			p.algo = r
			return p, nil
		}
	}
	return nil, fmt.Errorf("cuda: cublaslt %s M=%d K=%d T=%d: no algorithm: %w", k.dtype, k.M, k.K, k.T, device.ErrUnsupported)
}

func (c *Device) ltFreePlan(b *blasLt, p *ltPlan) {
	var errs []error
	for _, l := range []uintptr{p.a, p.b, p.d} {
		if l != 0 {
			errs = append(errs, c.ltCall("cublasLtMatrixLayoutDestroy", b.layoutDestroy, l))
		}
	}
	if p.desc != 0 {
		errs = append(errs, c.ltCall("cublasLtMatmulDescDestroy", b.descDestroy, p.desc))
	}
	_ = errors.Join(errs...) // nothing to report them to; the descriptors are host memory
}

// GemmWorkspaceBytes is the device memory Gemm holds per stream it ran on:
// cuBLASLt's workspace, allocated on the stream's first Gemm and kept for
// the Device's life (outside any pool). Zero when the library is missing.
func (c *Device) GemmWorkspaceBytes() uint64 {
	if c.GemmName() == "" {
		return 0
	}
	return ltWorkspaceBytes
}
