// Package kernels holds memwall's own GPU kernels: a pattern fill and check
// (device and pool data tests), a spin kernel (stream-ordering tests: "a
// kernel still running"), matrix multiply over streamed weights (GEMV for
// decode steps, GEMM for prefill-sized batches, or the device's cuBLASLt) in
// bf16, f16 and f32 with float32 accumulation, and the other ops of a Llama
// layer: Embed, RMSNorm, RoPE, KVWrite into a paged KV cache, grouped-query
// Attention over it (flash-decoding for decode, tensor cores for prefill),
// SiluMul, Add, Cast and Round.
//
// Quick start:
//
//	s, err := kernels.Load(dev, os.Getenv) // picks the PTX for the GPU
//	...
//	err = s.RMSNorm(x, w, "f32", xn, "bf16", T, H, 1e-5, stream)
//	err = s.Matmul("bf16", wq, xn, q, M, H, T, stream)
//
// The kernels are CUDA C (kernels.cu), compiled by scripts/build-ptx.sh to
// PTX for compute_90, compute_80 and compute_70, embedded here
// gzip-compressed; Load hands the one the GPU can run to a device.Device and
// resolves every kernel into a Set with typed launch helpers that validate
// their arguments.
//
// On the compute_90 module (Hopper and newer) every kernel starts with
// griddepcontrol.wait, so a Set launches them through the device's
// device.OverlapLauncher when it has one (CUDA's programmatic dependent
// launch): a kernel's blocks are scheduled while the previous kernel on the
// stream drains, and the GEMV kernels first prefetch part of their weight
// rows into L2 (SetGemvPrefetch), to hide the ramp-up that a launch whose
// first loads miss L2 pays otherwise. MEMWALL_KERNELS_PDL=0 at Load, or
// SetOverlap(false), launches them plainly.
//
// The environment variable MEMWALL_KERNELS_PTX (read through the getenv
// function the caller passes) names a PTX file to use instead, so a freshly
// built module can be tried before it is committed.
//
// For the simulated device, Sim returns Go implementations of the same
// kernels with cost models; for the CPU device (device/cpu), CPU returns
// them with the products and attention on package hostmath's vector
// kernels; HostMatmul, ReferenceRow, CheckMatmul,
// RMSNormRow, RopePair, SiluMulValue and RoundTo are the host-side math
// that results are verified against.
package kernels

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/kernels/spirv"
)

// The three embedded builds of kernels.cu, gzip-compressed: compute_90
// (compute_80's kernels with programmatic dependent launch and L2
// prefetch; Hopper and newer), compute_80 (tensor cores, cp.async; Ampere
// and newer) and compute_70 (CUDA cores only; Volta and Turing).
var (
	//go:embed kernels_sm90.ptx.gz
	embeddedSM90 []byte
	//go:embed kernels_sm80.ptx.gz
	embeddedSM80 []byte
	//go:embed kernels_sm70.ptx.gz
	embeddedSM70 []byte
)

// PTX targets Load chooses between (see EmbeddedFor).
const (
	TargetSM90 = "sm90"
	TargetSM80 = "sm80"
	TargetSM70 = "sm70"
)

// Targets lists the embedded PTX targets, newest first.
func Targets() []string { return []string{TargetSM90, TargetSM80, TargetSM70} }

// EmbeddedFor returns the embedded PTX text of target (TargetSM90,
// TargetSM80 or TargetSM70), decompressed into a new slice, or nil for any
// other name. A placeholder that is not gzip data (committed before a
// build) is returned as it is.
func EmbeddedFor(target string) []byte {
	switch target {
	case TargetSM90:
		return gunzipPTX(embeddedSM90)
	case TargetSM80:
		return gunzipPTX(embeddedSM80)
	case TargetSM70:
		return gunzipPTX(embeddedSM70)
	}
	return nil
}

// gunzipPTX decompresses an embedded module (at most maxPTXBytes); data
// that is not gzip, or does not decompress, comes back as a copy, which
// Load then refuses as not PTX.
func gunzipPTX(b []byte) []byte {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return bytes.Clone(b)
	}
	out, err := io.ReadAll(io.LimitReader(zr, maxPTXBytes+1))
	if err != nil || len(out) > maxPTXBytes {
		return bytes.Clone(b)
	}
	return out
}

// TargetFor returns the embedded target a GPU of compute capability
// major.minor runs: TargetSM90 from 9.0 on, TargetSM80 from 8.0, else
// TargetSM70 (and for an unknown capability, 0.0).
func TargetFor(major, minor int) string {
	switch {
	case major >= 9:
		return TargetSM90
	case major >= 8:
		return TargetSM80
	}
	return TargetSM70
}

// embeddedName is the Source of a Set loaded from an embedded target.
func embeddedName(target string) string { return "embedded kernels_" + target + ".ptx" }

// EnvPTX is the environment variable that, when set to a file path, makes
// Load use that PTX instead of the embedded one.
const EnvPTX = "MEMWALL_KERNELS_PTX"

// Kernel names: the extern "C" entry points of kernels.cu.
const (
	NameFill  = "memwall_fill_u32"
	NameCheck = "memwall_check_u32"
	NameSpin  = "memwall_spin"
)

// GemvName and GemmName return the matrix kernel names for a dtype
// ("memwall_gemv_bf16", ...). The dtype is not validated.
func GemvName(dtype string) string { return "memwall_gemv_" + dtype }

// Gemv1Name returns the single-token GEMV kernel name for a dtype
// ("memwall_gemv1_bf16"): Matmul's kernel for T = 1.
func Gemv1Name(dtype string) string { return "memwall_gemv1_" + dtype }

// GemmName: see GemvName.
func GemmName(dtype string) string { return "memwall_gemm_" + dtype }

// Names lists every kernel a Set resolves, in a fixed order.
func Names() []string {
	n := []string{NameFill, NameCheck, NameSpin}
	for _, dt := range DTypes() {
		n = append(n, GemvName(dt), GemmName(dt), Gemv1Name(dt))
		for k := gemvMMA; k < gemvKinds; k++ {
			n = append(n, gemvName(k, dt))
		}
		n = append(n, gemvGroupName(dt))
	}
	return append(n, llamaNames()...)
}

// GemvMaxTokens is the largest T that Matmul runs with the GEMV kernels;
// larger T runs the tiled GEMM kernels.
const GemvMaxTokens = 8

// Launch-shape constants, mirrored from kernels.cu.
const (
	threadsPerBlock = 256 // every kernel but spin
	gemmTileF32     = 64
	gemmTile16      = 128
	maxGridX        = 1<<31 - 1
	maxGridY        = 65535
	maxPTXBytes     = 64 << 20
)

// Errors callers can branch on with errors.Is.
var (
	// ErrNoPTX: the embedded PTX is a placeholder committed before a
	// build, and no MEMWALL_KERNELS_PTX override was given.
	ErrNoPTX = errors.New("no compiled PTX: the embedded module is a placeholder (run scripts/build-ptx.sh or set " + EnvPTX + ")")
	// ErrDType: a dtype other than bf16, f16 or f32.
	ErrDType = errors.New("unsupported dtype")
	// ErrShape: dimensions or buffer lengths that do not fit together or
	// exceed a launch limit.
	ErrShape = errors.New("bad matrix shape")
	// ErrMismatch: a result differs from its reference by more than the
	// tolerance (see MatmulError).
	ErrMismatch = errors.New("result differs from reference")
)

// Embedded returns the compute_80 PTX compiled into the binary,
// decompressed (see EmbeddedFor for the other targets).
func Embedded() []byte { return EmbeddedFor(TargetSM80) }

// IsPTX reports whether b looks like real nvcc output: a leading "//"
// comment and an entry for memwall_fill_u32.
func IsPTX(b []byte) bool {
	if len(b) < 2 || b[0] != '/' || b[1] != '/' {
		return false
	}
	for _, e := range PTXEntries(b) {
		if e == NameFill {
			return true
		}
	}
	return false
}

// PTXEntries returns the names of the kernel entry points declared in PTX
// text (".entry NAME(" with an optional ".visible" or ".weak" before it), in
// order of appearance. Text that is not PTX yields no names.
func PTXEntries(ptx []byte) []string {
	var names []string
	const key = ".entry"
	for i := 0; i+len(key) <= len(ptx); i++ {
		if ptx[i] != '.' || string(ptx[i:i+len(key)]) != key {
			continue
		}
		// ".entry" must start a token and be followed by blanks and a name.
		if i > 0 && !isBlank(ptx[i-1]) {
			continue
		}
		j := i + len(key)
		if j >= len(ptx) || !isBlank(ptx[j]) {
			continue
		}
		for j < len(ptx) && isBlank(ptx[j]) {
			j++
		}
		start := j
		for j < len(ptx) && isIdent(ptx[j]) {
			j++
		}
		if j > start {
			names = append(names, string(ptx[start:j]))
		}
		i = j - 1
	}
	return names
}

// sourceHashPrefix starts the comment line scripts/build-ptx.sh appends.
const sourceHashPrefix = "// memwall kernels.cu sha256 "

// PTXSourceHash returns the hex SHA-256 of the kernels.cu a PTX file was
// built from, as recorded by scripts/build-ptx.sh in its last comment line,
// and false when the PTX carries no such record.
func PTXSourceHash(ptx []byte) (string, bool) {
	i := bytes.LastIndex(ptx, []byte(sourceHashPrefix))
	if i < 0 {
		return "", false
	}
	rest := ptx[i+len(sourceHashPrefix):]
	if j := bytes.IndexAny(rest, "\r\n"); j >= 0 {
		rest = rest[:j]
	}
	h := string(bytes.TrimSpace(rest))
	return h, h != ""
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func isIdent(c byte) bool {
	return c == '_' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// Set is the loaded kernel module with every kernel resolved. It is safe
// for concurrent use as far as the device is. Close unloads the module.
type Set struct {
	d         device.Device
	mod       device.Module
	source    string
	fill      device.Function
	check     device.Function
	spin      device.Function
	gemvk     [gemvKinds]map[string]device.Function // by variant (gemv.go), then dtype
	gemvg     map[string]device.Function            // MatmulGroup's kernel by dtype
	quant     map[string]device.Function            // the quantized kernels the module has, by name (quant.go)
	gemm      map[string]device.Function
	llama     llamaFuncs
	extra     map[string]device.Function // the ExtraNames the module has (resolveExtra)
	ropeOff   bool                       // RoPEGGUF turned off (SetRoPEGGUF)
	q8Off     bool                       // 8-bit-activation products turned off (SetQ8Activations)
	q8Layout  Q8Layout                   // their kernels' layout (SetQ8Layout)
	state     stateFuncs                 // the step-state kernels, when the module has them (stepstate.go)
	rows      rowsFuncs                  // the row kernels, when the module has them (rows.go)
	blocks    uint32                     // grid cap for the grid-stride kernels
	sms       uint32                     // multiprocessors (a guess when the device does not say)
	gemmLib   device.MatmulLibrary       // nil: memwall's own GEMM for every T
	flash     bool                       // Attention uses memwall_attn_flash for prefill
	flashOK   bool                       // the module and device can run it
	decodeOff bool                       // Attention never uses memwall_attn_decode
	gemvOff   [gemvKinds]bool            // GEMV variants the self-test turned off
	tensor    bool                       // the module has compute_80's tensor-core kernels
	disabled  []string                   // fast kernels the self-test turned off, and why
	overlap   device.OverlapLauncher     // non-nil: the module waits on griddepcontrol and the device overlaps launches
	overlapOn bool                       // launch through overlap (SetOverlap)
	prefetch  uint32                     // GEMV L2 prefetch per block: bytes | evict-last bit 31 (SetGemvPrefetch)
	// gemvmOverlap: memwall_gemvm_* too is launched overlapped (off: the
	// H200 sweep measured it slower so; the sweep turns it on to re-measure).
	gemvmOverlap bool
	// groupOverlap: MatmulGroup's kernel too is launched overlapped, with
	// prefetch (on at Load: TestCUDAGroupOverlap on the H200 measured every
	// grouped shape and both decoder layers faster so, in both orders).
	groupOverlap bool

	scratchMu sync.Mutex
	scratch   map[device.Stream]scratchBuf // attention split partials, per stream

	// spirvMatmul holds, on a Vulkan device, package spirv's matrix
	// product by dtype, which Matmul runs for every T (loadSPIRV); nil on
	// the PTX and simulator modules.
	spirvMatmul map[string]device.Function
}

// Load loads the kernel module on d and resolves every kernel in Names.
// The PTX is the file named by getenv(EnvPTX) when that is non-empty (read
// in full, at most 64 MiB), else the embedded target TargetFor(the device's
// compute capability): kernels_sm90.ptx, kernels_sm80.ptx or
// kernels_sm70.ptx; getenv may be nil (no override). On the CPU device
// (backend "cpu") there is no PTX: its module holds the kernels registered
// with it (CPU). getenv(EnvPDL) == "0" turns overlapped launches off
// (SetOverlap) and getenv(EnvPrefetch), a byte count, sets
// SetGemvPrefetch. On a device whose backend is neither "sim" nor "cpu", a
// placeholder or a module lacking a kernel is refused before the driver
// sees it (ErrNoPTX, or an error naming the missing kernel). Errors name the PTX
// source and, where one is at fault, the kernel. On failure nothing stays
// loaded. Source says which PTX was loaded. On a Vulkan device it loads
// package spirv's kernels instead (Fill, Check, Spin and Matmul only; see
// loadSPIRV), whatever getenv says.
func Load(d device.Device, getenv func(string) string) (*Set, error) {
	info := d.Info()
	if info.Backend == "vulkan" {
		return loadSPIRV(d)
	}
	target := TargetFor(info.ComputeMajor, info.ComputeMinor)
	ptx, source := EmbeddedFor(target), embeddedName(target)
	if info.Backend == cpuBackend {
		// The CPU device runs the kernels registered with it (CPU): no PTX.
		ptx, source = nil, cpuSource
	}
	if getenv != nil {
		if path := getenv(EnvPTX); path != "" {
			b, err := readPTX(path)
			if err != nil {
				return nil, err
			}
			ptx, source = b, path
		}
	}
	s, err := LoadPTX(d, ptx, source)
	if err != nil || getenv == nil {
		return s, err
	}
	if getenv(EnvFlash) == "0" {
		s.SetFlashAttention(false)
	}
	if getenv(EnvPDL) == "0" {
		s.SetOverlap(false)
	}
	if v := getenv(EnvQ8Layout); v != "" {
		l, ok := q8LayoutNames[v]
		if !ok {
			s.Close()
			return nil, fmt.Errorf("kernels: %s=%q: want staged, grouped or grouped-r4: %w", EnvQ8Layout, v, device.ErrInvalid)
		}
		s.SetQ8Layout(l)
	}
	if v := getenv(EnvPrefetch); v != "" {
		n, perr := strconv.ParseUint(v, 10, 29)
		if perr != nil {
			s.Close()
			return nil, fmt.Errorf("kernels: %s=%q: not a byte count below 512 MiB: %w", EnvPrefetch, v, device.ErrInvalid)
		}
		s.SetGemvPrefetch(uint32(n))
	}
	return s, nil
}

// cpuBackend is device/cpu's Info.Backend, and cpuSource the Source of a
// Set loaded on it.
const (
	cpuBackend = "cpu"
	cpuSource  = "Go kernels on the host (kernels.CPU)"
)

// EnvPDL is the environment variable that, set to "0" when Load runs, makes
// the Set launch the compute_90 module's kernels plainly instead of
// overlapped (for A/B runs; see SetOverlap).
const EnvPDL = "MEMWALL_KERNELS_PDL"

// EnvPrefetch is the environment variable that, set to a byte count when
// Load runs, replaces DefaultGemvPrefetch (see SetGemvPrefetch).
const EnvPrefetch = "MEMWALL_KERNELS_PREFETCH"

// EnvFlash is the environment variable that, set to "0" when Load runs,
// keeps Attention off the tensor-core prefill kernel (FlashAttention).
const EnvFlash = "MEMWALL_KERNELS_FLASH"

// PTXTarget returns the NN of the ".target sm_NN" line of PTX text, or 0.
func PTXTarget(ptx []byte) int {
	i := bytes.Index(ptx, []byte("\n.target sm_"))
	if i < 0 {
		return 0
	}
	n := 0
	for _, c := range ptx[i+len("\n.target sm_"):] {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
		if n > 1000 {
			return 0
		}
	}
	return n
}

// LoadPTX is Load with the PTX given: source names it in errors and in
// Source. It is how a test loads each embedded target on one GPU.
func LoadPTX(d device.Device, ptx []byte, source string) (*Set, error) {
	info := d.Info()
	if info.Backend != "sim" && info.Backend != cpuBackend {
		if !IsPTX(ptx) {
			if strings.HasPrefix(source, "embedded ") {
				return nil, fmt.Errorf("kernels: %s: %w", source, ErrNoPTX)
			}
			return nil, fmt.Errorf("kernels: %s: not PTX from nvcc (no leading comment or no .entry %s): %w", source, NameFill, ErrNoPTX)
		}
		have := map[string]bool{}
		for _, e := range PTXEntries(ptx) {
			have[e] = true
		}
		for _, n := range Names() {
			if !have[n] {
				return nil, fmt.Errorf("kernels: %s: no entry for kernel %s (rebuild with scripts/build-ptx.sh)", source, n)
			}
		}
	}
	mod, err := d.LoadModule(ptx)
	if err != nil {
		return nil, fmt.Errorf("kernels: load %s: %w", source, err)
	}
	s := &Set{d: d, mod: mod, source: source,
		gemm: map[string]device.Function{}, gemvg: map[string]device.Function{}, scratch: map[device.Stream]scratchBuf{}}
	for k := range s.gemvk {
		s.gemvk[k] = map[string]device.Function{}
	}
	s.blocks, s.sms = 1024, 128
	if info.Multiprocessors > 0 {
		s.blocks = uint32(min(info.Multiprocessors*8, 1<<20)) // 8 blocks of 256 threads fill an SM
		s.sms = uint32(min(info.Multiprocessors, 1<<16))
	}
	if lib, ok := d.(device.MatmulLibrary); ok && lib.GemmName() != "" {
		s.gemmLib = lib
	}
	s.tensor = info.Backend == "sim" || info.ComputeMajor >= 8 && PTXTarget(ptx) >= 80
	if ol, ok := d.(device.OverlapLauncher); ok && info.Backend != "sim" && PTXTarget(ptx) >= 90 && ol.CanOverlap() {
		s.overlap, s.overlapOn = ol, true
	}
	s.prefetch = DefaultGemvPrefetch
	s.q8Off = info.Backend == cpuBackend
	s.q8Layout = DefaultQ8Layout
	s.groupOverlap = true
	s.flashOK = s.tensor
	s.flash = s.flashOK
	resolve := func(name string) (device.Function, error) {
		f, err := d.Function(mod, name)
		if err != nil {
			switch info.Backend {
			case "sim":
				return 0, fmt.Errorf("kernels: kernel %s (put kernels.Sim() in sim.Options.Kernels): %w", name, err)
			case cpuBackend:
				return 0, fmt.Errorf("kernels: kernel %s (put kernels.CPU() in cpu.Options.Kernels): %w", name, err)
			}
			return 0, fmt.Errorf("kernels: %s: kernel %s: %w", source, name, err)
		}
		return f, nil
	}
	fail := func(err error) (*Set, error) {
		if uerr := d.UnloadModule(mod); uerr != nil {
			err = errors.Join(err, fmt.Errorf("kernels: unload after failure: %w", uerr))
		}
		return nil, err
	}
	if s.fill, err = resolve(NameFill); err != nil {
		return fail(err)
	}
	if s.check, err = resolve(NameCheck); err != nil {
		return fail(err)
	}
	if s.spin, err = resolve(NameSpin); err != nil {
		return fail(err)
	}
	for _, dt := range DTypes() {
		for k := range s.gemvk {
			if s.gemvk[k][dt], err = resolve(gemvName(k, dt)); err != nil {
				return fail(err)
			}
		}
		if s.gemm[dt], err = resolve(GemmName(dt)); err != nil {
			return fail(err)
		}
		if s.gemvg[dt], err = resolve(gemvGroupName(dt)); err != nil {
			return fail(err)
		}
	}
	if err := s.llama.resolve(resolve); err != nil {
		return fail(err)
	}
	s.resolveQuant(ptx, info.Backend == "sim" || info.Backend == cpuBackend, func(name string) (device.Function, error) { return d.Function(mod, name) })
	s.resolveState(ptx, info.Backend == "sim" || info.Backend == cpuBackend, func(name string) (device.Function, error) { return d.Function(mod, name) })
	s.resolveExtra(ptx, info.Backend == "sim" || info.Backend == cpuBackend, func(name string) (device.Function, error) { return d.Function(mod, name) })
	s.resolveRows(ptx, info.Backend == "sim" || info.Backend == cpuBackend, func(name string) (device.Function, error) { return d.Function(mod, name) })
	if info.Backend != "sim" && info.ComputeMajor > 0 {
		if err := s.selfTest(); err != nil {
			// The self-test could not run: keep to the general kernels.
			s.flash, s.flashOK, s.decodeOff = false, false, true
			s.disabled = append(s.disabled, "flash and decode attention: self-test did not run: "+err.Error())
		}
	}
	return s, nil
}

// spirvSource is Source for a Set of package spirv's kernels.
const spirvSource = "embedded SPIR-V (kernels/spirv)"

// loadSPIRV loads package spirv's kernels on a Vulkan device: Fill, Check
// and Spin, and Matmul by spirv's matrix product for every dtype and T.
// The Llama kernels, MatmulGroup and the GEMV variants are PTX and Go only:
// a Set from it runs nothing else.
func loadSPIRV(d device.Device) (*Set, error) {
	mod, err := d.LoadModule(spirv.Module())
	if err != nil {
		return nil, fmt.Errorf("kernels: load %s: %w", spirvSource, err)
	}
	s := &Set{d: d, mod: mod, source: spirvSource, gemm: map[string]device.Function{}, gemvg: map[string]device.Function{},
		scratch: map[device.Stream]scratchBuf{}, spirvMatmul: map[string]device.Function{}, blocks: 1024, sms: 128}
	if info := d.Info(); info.Multiprocessors > 0 {
		s.blocks = uint32(min(info.Multiprocessors*8, 1<<20))
		s.sms = uint32(min(info.Multiprocessors, 1<<16))
	}
	resolve := func(name string) (device.Function, error) {
		f, err := d.Function(mod, name)
		if err != nil {
			return 0, fmt.Errorf("kernels: %s: kernel %s: %w", spirvSource, name, err)
		}
		return f, nil
	}
	for _, k := range []struct {
		f    *device.Function
		name string
	}{{&s.fill, NameFill}, {&s.check, NameCheck}, {&s.spin, NameSpin}} {
		if *k.f, err = resolve(k.name); err != nil {
			return nil, errors.Join(err, d.UnloadModule(mod))
		}
	}
	for _, dt := range spirv.MatmulDTypes {
		if s.spirvMatmul[dt], err = resolve(spirv.MatmulName(dt)); err != nil {
			return nil, errors.Join(err, d.UnloadModule(mod))
		}
	}
	return s, nil
}

// checkOperands refuses a product's operand that is null or not aligned:
// W and X to their element of elt bytes, Y to 4 bytes.
func checkOperands(kernel string, elt int, W, X, Y device.Ptr) error {
	for _, p := range []struct {
		name  string
		v     device.Ptr
		align uint64
	}{{"W", W, uint64(elt)}, {"X", X, uint64(elt)}, {"Y", Y, 4}} {
		if p.v == 0 || uint64(p.v)%p.align != 0 {
			return fmt.Errorf("kernels: %s: %s %#x is not a %d-byte aligned address: %w", kernel, p.name, uint64(p.v), p.align, device.ErrInvalid)
		}
	}
	return nil
}

// matmulSPIRV launches spirv's matrix product (see Matmul).
func (s *Set) matmulSPIRV(dtype string, W, X, Y device.Ptr, M, K, T uint32, st device.Stream) error {
	f, ok := s.spirvMatmul[dtype]
	if !ok {
		return fmt.Errorf("kernels: matmul: dtype %q: %w", dtype, ErrDType)
	}
	name := spirv.MatmulName(dtype)
	elt, _ := ElemSize(dtype)
	if err := checkOperands(name, elt, W, X, Y); err != nil {
		return err
	}
	if uint64(T)*uint64(M) >= 1<<32 || uint64(M)*uint64(K) >= 1<<32 || uint64(T)*uint64(K) >= 1<<32 {
		return fmt.Errorf("kernels: %s M=%d K=%d T=%d: an index reaches 2^32: %w", name, M, K, T, ErrShape)
	}
	grid := device.Dim3{X: uint32(min(uint64(T)*uint64(M), 65535)), Y: 1, Z: 1}
	if err := s.d.Launch(f, grid, device.Dim3{X: spirv.MatmulBlock, Y: 1, Z: 1}, 0, st, W, X, Y, M, K, T); err != nil {
		return fmt.Errorf("kernels: %s M=%d K=%d T=%d: %w", name, M, K, T, err)
	}
	return nil
}

func readPTX(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("kernels: %s: %w", EnvPTX, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxPTXBytes+1))
	if err != nil {
		return nil, fmt.Errorf("kernels: %s %s: %w", EnvPTX, path, err)
	}
	if len(b) > maxPTXBytes {
		return nil, fmt.Errorf("kernels: %s %s: larger than the %d MiB limit", EnvPTX, path, maxPTXBytes>>20)
	}
	return b, nil
}

// launchK launches f on st: overlapped with the previous kernel on st when
// the module and device allow it and SetOverlap has not turned it off,
// else plainly.
func (s *Set) launchK(f device.Function, grid, block device.Dim3, shared uint32, st device.Stream, args ...any) error {
	if s.overlapOn {
		return s.overlap.LaunchOverlapped(f, grid, block, shared, st, args...)
	}
	return s.d.Launch(f, grid, block, shared, st, args...)
}

// Overlap reports whether the Set launches its kernels overlapped with the
// previous kernel on the stream (programmatic dependent launch): true on
// the compute_90 module with a device that offers device.OverlapLauncher,
// unless SetOverlap(false) or MEMWALL_KERNELS_PDL=0 turned it off.
func (s *Set) Overlap() bool { return s.overlapOn }

// SetOverlap turns overlapped launches on or off; on takes effect only
// where Overlap could be true (it reports whether it is now). It must not
// race with launches. Results do not depend on it: every kernel of the
// compute_90 module waits for the previous kernel before it reads or
// writes anything another kernel touches.
func (s *Set) SetOverlap(on bool) bool {
	s.overlapOn = on && s.overlap != nil
	return s.overlapOn
}

// DefaultGemvPrefetch is the bytes of its weight rows each GEMV block of the
// compute_90 module prefetches into L2 before it waits for the previous
// kernel (see SetGemvPrefetch).
const DefaultGemvPrefetch = 8 << 10

// SetGemvPrefetch sets how many bytes of its rows of W each block of the
// GEMV kernel (Matmul for T = 1) prefetches into L2 before it waits for the
// previous kernel on the stream, capped at the block's rows (8 rows); 0
// prefetches nothing; MatmulGroup's blocks prefetch as much. (Matmul's
// T = 2..8 kernel is launched plainly and prefetches nothing: the H200
// measured it slower overlapped.) Only the compute_90 module prefetches; the hint never changes a
// result. bytes is taken modulo 2²⁹. It must not race with launches.
func (s *Set) SetGemvPrefetch(bytes uint32) { s.prefetch = bytes & prefetchBytesMask }

// GemvPrefetch returns the bytes set by SetGemvPrefetch.
func (s *Set) GemvPrefetch() uint32 { return s.prefetch & prefetchBytesMask }

// The GEMV kernels' prefetch argument: the byte cap in the low 29 bits,
// and bits for the sweep's alternatives: the bytes spread over the block's
// rows (the first bytes of each) instead of from its first row on, launch
// of the next kernel before this one's wait, the evict_last L2 policy.
const (
	prefetchBytesMask = 1<<29 - 1
	prefetchPerRow    = 1 << 29
	prefetchEarly     = 1 << 30
	prefetchEvictLast = 1 << 31
)

// Source says where the loaded PTX came from: "embedded kernels_sm90.ptx",
// "embedded kernels_sm80.ptx", "embedded kernels_sm70.ptx", the override
// path, or on a Vulkan device "embedded SPIR-V (kernels/spirv)".
func (s *Set) Source() string { return s.source }

// GemmLibrary names what runs Matmul's bf16 and f16 products of more than
// GemvMaxTokens tokens: the device's MatmulLibrary ("cublaslt") when it
// offers one, else "memwall" (the kernels of this package).
func (s *Set) GemmLibrary() string {
	if s.gemmLib != nil {
		return s.gemmLib.GemmName()
	}
	return "memwall"
}

// SetGemmLibrary replaces the library Matmul uses for prefill products; nil
// selects memwall's own GEMM. It must not race with Matmul calls.
func (s *Set) SetGemmLibrary(lib device.MatmulLibrary) {
	if lib != nil && lib.GemmName() == "" {
		lib = nil
	}
	s.gemmLib = lib
}

// Close frees the Set's scratch memory and unloads the module. The Set must
// not be used afterwards.
func (s *Set) Close() error {
	err := s.freeScratch()
	if uerr := s.d.UnloadModule(s.mod); uerr != nil {
		err = errors.Join(err, fmt.Errorf("kernels: unload: %w", uerr))
	}
	return err
}

func (s *Set) gridFor(n uint64) device.Dim3 {
	b := (n + threadsPerBlock - 1) / threadsPerBlock
	return device.Dim3{X: uint32(min(max(b, 1), uint64(s.blocks))), Y: 1, Z: 1}
}

// blockDim is the block of every kernel but spin.
func blockDim() device.Dim3 { return device.Dim3{X: threadsPerBlock, Y: 1, Z: 1} }

// Fill writes Pattern(seed, i) to the n 32-bit words at dst (4-byte
// aligned) on stream st. n == 0 launches nothing.
func (s *Set) Fill(dst device.Ptr, n uint64, seed uint32, st device.Stream) error {
	if n == 0 {
		return nil
	}
	if dst == 0 || dst%4 != 0 {
		return fmt.Errorf("kernels: %s: dst %#x is not a 4-byte aligned address: %w", NameFill, uint64(dst), device.ErrInvalid)
	}
	if err := s.launchK(s.fill, s.gridFor(n), blockDim(), 0, st, dst, n, seed); err != nil {
		return fmt.Errorf("kernels: %s: %w", NameFill, err)
	}
	return nil
}

// Check counts the words among the n at src that differ from
// Pattern(seed, i) and adds the count to the uint64 at mismatches (8-byte
// aligned device memory the caller zeroes and reads back; see Mismatches).
// n == 0 launches nothing.
func (s *Set) Check(src device.Ptr, n uint64, seed uint32, mismatches device.Ptr, st device.Stream) error {
	if n == 0 {
		return nil
	}
	if src == 0 || src%4 != 0 {
		return fmt.Errorf("kernels: %s: src %#x is not a 4-byte aligned address: %w", NameCheck, uint64(src), device.ErrInvalid)
	}
	if mismatches == 0 || mismatches%8 != 0 {
		return fmt.Errorf("kernels: %s: counter %#x is not an 8-byte aligned address: %w", NameCheck, uint64(mismatches), device.ErrInvalid)
	}
	if err := s.launchK(s.check, s.gridFor(n), blockDim(), 0, st, src, n, seed, mismatches); err != nil {
		return fmt.Errorf("kernels: %s: %w", NameCheck, err)
	}
	return nil
}

// Mismatches zeroes the 8-byte counter at scratch, runs Check on st, waits
// for st and returns the count. Work queued on st earlier (a Fill, a copy)
// is ordered before the check.
func (s *Set) Mismatches(src device.Ptr, n uint64, seed uint32, scratch device.Ptr, st device.Stream) (uint64, error) {
	if err := s.d.Memset8(scratch, 0, 8, st); err != nil {
		return 0, fmt.Errorf("kernels: %s: zero counter: %w", NameCheck, err)
	}
	if err := s.Check(src, n, seed, scratch, st); err != nil {
		return 0, err
	}
	var buf [8]byte
	if err := s.d.CopyDtoH(buf[:], scratch, st); err != nil {
		return 0, fmt.Errorf("kernels: %s: read counter: %w", NameCheck, err)
	}
	if err := s.d.StreamSynchronize(st); err != nil {
		return 0, fmt.Errorf("kernels: %s: %w", NameCheck, err)
	}
	return binary.LittleEndian.Uint64(buf[:]), nil
}

// Spin launches one thread that busy-waits on the GPU's global timer for d,
// occupying st until then. Negative d is an error.
func (s *Set) Spin(d time.Duration, st device.Stream) error {
	if d < 0 {
		return fmt.Errorf("kernels: %s: negative duration %v: %w", NameSpin, d, device.ErrInvalid)
	}
	one := device.Dim3{X: 1, Y: 1, Z: 1}
	if err := s.launchK(s.spin, one, one, 0, st, uint64(d.Nanoseconds())); err != nil {
		return fmt.Errorf("kernels: %s: %w", NameSpin, err)
	}
	return nil
}

// MatmulShape is how Matmul launches a product: the kernel and its grid and
// block.
type MatmulShape struct {
	Kernel string
	Grid   device.Dim3
	Block  device.Dim3
}

// ShapeFor returns the launch of Y[T×M] = X[T×K]·W[M×K]ᵀ in dtype on a GPU
// of unknown size: T = 1 runs memwall_gemv1_<dtype> (8 rows of W per
// block), T ≤ GemvMaxTokens memwall_gemv_<dtype> (16 rows per block);
// larger T runs memwall_gemm_<dtype> over 64×64 (f32) or 128×128 (bf16,
// f16) output tiles. Set.Shape gives what Matmul launches on a loaded Set,
// which sizes the GEMV to the GPU. It fails with ErrDType, or ErrShape when
// M or T is 0 or the grid would exceed CUDA's limits.
func ShapeFor(dtype string, M, K, T uint32) (MatmulShape, error) {
	return shapeFor(dtype, M, K, T, 0, false, nil)
}

// Shape returns the launch Matmul uses on s for a product of memwall's own
// kernels (products the GEMM library takes are not described): for T ≤
// GemvMaxTokens the GEMV variant and grid of the selection rule for s's GPU
// (gemv.go: memwall_gemv1_<dtype> for T = 1; above, memwall_gemvm_<dtype>
// with a grid sized to the multiprocessor count for bf16/f16 on compute_80,
// else memwall_gemv_<dtype>), above as ShapeFor. Errors as ShapeFor's.
func (s *Set) Shape(dtype string, M, K, T uint32) (MatmulShape, error) {
	return shapeFor(dtype, M, K, T, s.sms, s.tensor, &s.gemvOff)
}

func shapeFor(dtype string, M, K, T, sms uint32, tensor bool, off *[gemvKinds]bool) (MatmulShape, error) {
	if _, err := ElemSize(dtype); err != nil {
		return MatmulShape{}, fmt.Errorf("kernels: matmul: %w", err)
	}
	if M == 0 || T == 0 {
		return MatmulShape{}, fmt.Errorf("kernels: matmul %s M=%d K=%d T=%d: empty output: %w", dtype, M, K, T, ErrShape)
	}
	if T <= GemvMaxTokens {
		p := planGemv(dtype, M, K, T, sms, tensor, off)
		return MatmulShape{Kernel: gemvName(p.kind, dtype), Block: blockDim(),
			Grid: device.Dim3{X: p.grid, Y: 1, Z: 1}}, nil
	}
	tile := uint32(gemmTile16)
	if dtype == F32 {
		tile = gemmTileF32
	}
	g := device.Dim3{X: ceilDiv(M, tile), Y: ceilDiv(T, tile), Z: 1}
	if g.X > maxGridX || g.Y > maxGridY {
		return MatmulShape{}, fmt.Errorf("kernels: matmul %s M=%d K=%d T=%d: grid %dx%d exceeds %dx%d: %w",
			dtype, M, K, T, g.X, g.Y, maxGridX, maxGridY, ErrShape)
	}
	return MatmulShape{Kernel: GemmName(dtype), Block: blockDim(), Grid: g}, nil
}

// gemvRowsPerBlock is the rows of W a GEMV block takes: one per warp for T
// = 1 (memwall_gemv1_*), two above.
func gemvRowsPerBlock(T uint32) uint32 {
	if T <= 1 {
		return threadsPerBlock / 32
	}
	return 2 * threadsPerBlock / 32
}

func ceilDiv(a, b uint32) uint32 { return uint32((uint64(a) + uint64(b) - 1) / uint64(b)) }

// Matmul queues Y[t, m] = Σ_k W[m, k]·X[t, k] on st: W is M×K and X is T×K,
// both row-major in dtype ("bf16", "f16", "f32"), Y is T×M row-major
// float32, accumulated in float32. W and X must be aligned to their element
// size and Y to 4 bytes (16-byte alignment and K a multiple of 8 take the
// vectorized paths). M == 0 or T == 0 launches nothing; K == 0 writes zeros.
// Errors wrap ErrDType, ErrShape or device.ErrInvalid and name the kernel.
// A block-quantized dtype (QuantDTypes: W's rows in package quant's blocks,
// K a multiple of the block) takes X as float32 and runs
// memwall_qmatmul_<dtype> for every T; a module without that kernel fails
// with device.ErrUnsupported.
func (s *Set) Matmul(dtype string, W, X, Y device.Ptr, M, K, T uint32, st device.Stream) error {
	if _, ok := QuantType(dtype); ok {
		if M == 0 || T == 0 {
			return nil
		}
		return s.matmulQuant(dtype, W, X, Y, M, K, T, st)
	}
	elt, err := ElemSize(dtype)
	if err != nil {
		return fmt.Errorf("kernels: matmul: %w", err)
	}
	if M == 0 || T == 0 {
		return nil
	}
	if s.spirvMatmul != nil {
		return s.matmulSPIRV(dtype, W, X, Y, M, K, T, st)
	}
	sh, err := s.Shape(dtype, M, K, T)
	if err != nil {
		return err
	}
	if err := checkOperands(sh.Kernel, elt, W, X, Y); err != nil {
		return err
	}
	if T > GemvMaxTokens && dtype != F32 && s.gemmLib != nil {
		err := s.gemmLib.Gemm(dtype, W, X, Y, M, K, T, st)
		if err == nil {
			return nil
		}
		if !errors.Is(err, device.ErrUnsupported) {
			return fmt.Errorf("kernels: matmul %s M=%d K=%d T=%d through %s: %w", dtype, M, K, T, s.gemmLib.GemmName(), err)
		}
		// Not a product the library takes: memwall's own GEMM below.
	}
	if T <= GemvMaxTokens {
		return s.launchGemv(planGemv(dtype, M, K, T, s.sms, s.tensor, &s.gemvOff), dtype, W, X, Y, M, K, T, st)
	}
	if err := s.launchK(s.gemm[dtype], sh.Grid, sh.Block, 0, st, W, X, Y, M, K, T); err != nil {
		return fmt.Errorf("kernels: %s M=%d K=%d T=%d: %w", sh.Kernel, M, K, T, err)
	}
	return nil
}
