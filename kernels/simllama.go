package kernels

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cpu/hostmath"
	"github.com/memwall/memwall/half"
)

// Go twins of the Llama-layer kernels, for the simulator. They compute in
// float32 what kernels.cu computes (sums may be ordered differently: the
// results agree within float32 rounding) and check their arguments as the
// CUDA code needs them.

func llamaGoKernels() []goKernel {
	ks := []goKernel{
		{name: NameEmbed, run: runEmbed, cost: costEmbed},
		{name: NameRMSNorm, run: runRMSNorm, cost: costRMSNorm},
		{name: NameRoPE, run: runRoPE, cost: costRoPE},
		{name: NameSiluMul, run: runSiluMul, cost: costElem(6, 4, 12)},
		{name: NameAdd, run: runAdd, cost: costElem(3, 2, 12)},
		{name: NameCast, run: runCast, cost: costElem(4, 3, 8)},
		{name: NameRound, run: runRound, cost: costElem(3, 2, 8)},
		{name: NameKVWrite, run: runKVWrite, cost: costKVWrite},
	}
	ks = append(ks, attnGoKernels()...)
	return append(ks, goKernel{name: NameAttnCombine, run: runCombine, cost: costCombine},
		goKernel{name: NameAttnFlash, run: runFlash, cost: costFlash},
		goKernel{name: NameAttnDecode, run: runAttnDecode, cost: costAttn})
}

// runAttnDecode: memwall_attn_decode computes what memwall_attn_e4 does
// (in log2 units, the same within float32 rounding) for its shapes.
func runAttnDecode(mem memory, grid, block device.Dim3, args []any) error {
	if err := checkDecodeArgs(args); err != nil {
		return err
	}
	return runAttnSplit(NameAttnDecode, 4, mem, grid, block, args)
}

// checkDecodeArgs refuses what memwall_attn_decode does not take:
// arguments that do not parse, more than 8 query heads per kv head, head
// dims other than 64 and 128, an f32 cache.
func checkDecodeArgs(args []any) error {
	const k = NameAttnDecode
	a, err := parseAttn(k, args)
	if err != nil {
		return err
	}
	if a.L.KVHeads == 0 || a.nHeads%a.L.KVHeads != 0 || a.nHeads/a.L.KVHeads > attnHeads || (a.L.HeadDim != 64 && a.L.HeadDim != 128) ||
		a.L.DType == F32 {
		return fmt.Errorf("kernels: %s: %d heads, layout %+v: %w", k, a.nHeads, a.L, device.ErrInvalid)
	}
	return nil
}

func attnGoKernels() []goKernel {
	var ks []goKernel
	for _, e := range attnLanes {
		ks = append(ks, goKernel{name: AttnName(32 * e), run: runAttn(e), cost: costAttn})
	}
	return ks
}

// args reads a launch's arguments by kind: 'p' device.Ptr, 'u' uint32, 'U'
// uint64, 'f' float32. It stores them in order into ptrs, u32s, u64s, f32s.
type kargs struct {
	p []device.Ptr
	u []uint32
	U []uint64
	f []float32
}

func parseArgs(kernel, kinds string, args []any) (kargs, error) {
	var a kargs
	if err := argCount(kernel, args, len(kinds)); err != nil {
		return a, err
	}
	for i, k := range kinds {
		switch k {
		case 'p':
			v, err := argPtr(kernel, args, i)
			if err != nil {
				return a, err
			}
			a.p = append(a.p, v)
		case 'u':
			v, err := argU32(kernel, args, i)
			if err != nil {
				return a, err
			}
			a.u = append(a.u, v)
		case 'U':
			v, err := argU64(kernel, args, i)
			if err != nil {
				return a, err
			}
			a.U = append(a.U, v)
		case 'f':
			v, ok := args[i].(float32)
			if !ok {
				return a, argErr(kernel, i, "float32", args[i])
			}
			a.f = append(a.f, v)
		}
	}
	return a, nil
}

func dtArg(kernel string, c uint32) (string, int, error) {
	dt, ok := codeDtype(c)
	if !ok {
		return "", 0, fmt.Errorf("kernels: %s: dtype code %d: %w", kernel, c, device.ErrInvalid)
	}
	elt, _ := ElemSize(dt)
	return dt, elt, nil
}

// buf is n elements of elt bytes at p, checked for alignment.
func buf(kernel, what string, mem memory, p device.Ptr, n uint64, elt int) ([]byte, error) {
	if p == 0 || uint64(p)%uint64(elt) != 0 {
		return nil, fmt.Errorf("kernels: %s: %s %#x is not %d-byte aligned: %w", kernel, what, uint64(p), elt, device.ErrInvalid)
	}
	if n > math.MaxUint64/uint64(elt) {
		return nil, fmt.Errorf("kernels: %s: %s: %d elements overflow: %w", kernel, what, n, device.ErrInvalid)
	}
	b, err := mem.Bytes(p, n*uint64(elt))
	if err != nil {
		return nil, fmt.Errorf("kernels: %s: %s: %w", kernel, what, err)
	}
	return b, nil
}

func getF(b []byte, i uint64) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
}

func putF(b []byte, i uint64, v float32) { binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v)) }

func getDT(dt string, b []byte, i uint64) float32 {
	switch dt {
	case BF16:
		return half.BF16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
	case F16:
		return half.F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
	}
	return getF(b, i)
}

func putDT(dt string, b []byte, i uint64, v float32) {
	switch dt {
	case BF16:
		binary.LittleEndian.PutUint16(b[2*i:], half.F32ToBF16(v))
	case F16:
		binary.LittleEndian.PutUint16(b[2*i:], half.F32ToF16(v))
	default:
		putF(b, i, v)
	}
}

// RoundTo returns v rounded to dtype's precision (nearest even) as a
// float32: what the Round kernel stores. f32 and unknown dtypes return v.
func RoundTo(dtype string, v float32) float32 { return hostmath.Round(hostDType(dtype), v) }

// hostDType is dtype as package hostmath names it; unknown names are F32
// (callers have validated them, or want v unrounded).
func hostDType(dtype string) hostmath.DType {
	switch dtype {
	case BF16:
		return hostmath.BF16
	case F16:
		return hostmath.F16
	}
	return hostmath.F32
}

func runEmbed(mem memory, grid, block device.Dim3, args []any) error {
	const k = NameEmbed
	a, err := parseArgs(k, "pupp"+"uu", args)
	if err != nil {
		return err
	}
	if err := checkLinearLaunch(k, grid, block); err != nil {
		return err
	}
	dt, elt, err := dtArg(k, a.u[0])
	if err != nil {
		return err
	}
	T, H := uint64(a.u[1]), uint64(a.u[2])
	if T == 0 {
		return nil
	}
	ids, err := buf(k, "ids", mem, a.p[1], T, 4)
	if err != nil {
		return err
	}
	out, err := buf(k, "out", mem, a.p[2], T*H, 4)
	if err != nil {
		return err
	}
	for t := range T {
		id := uint64(binary.LittleEndian.Uint32(ids[4*t:]))
		row, err := buf(k, fmt.Sprintf("table row %d", id), mem, a.p[0].Add(id*H*uint64(elt)), H, elt)
		if err != nil {
			return err
		}
		for i := range H {
			putF(out, t*H+i, getDT(dt, row, i))
		}
	}
	return nil
}

func costEmbed(_, _ device.Dim3, args []any) (goCost, bool) {
	a, err := parseArgs("", "puppuu", args)
	if err != nil {
		return goCost{}, false
	}
	_, elt, err := dtArg("", a.u[0])
	if err != nil {
		return goCost{}, false
	}
	n := float64(a.u[1]) * float64(a.u[2])
	return goCost{bytes: n*float64(elt) + 4*n + 4*float64(a.u[1])}, true
}

// RMSNormRow is the float32 math of the RMSNorm kernel for one row: out[i]
// = odt(n·w[i]) with n = x[i]·r rounded to odt, r = 1/√(Σx²/H + eps) (the
// sum in float32, in order; the GPU sums in another order). It returns the
// values as float32 (already rounded to odt).
func RMSNormRow(x, w []float32, odt string, eps float32) []float32 {
	out := make([]float32, len(x))
	hostmath.RMSNorm(out, x, w, hostDType(odt), eps)
	return out
}

func runRMSNorm(mem memory, grid, block device.Dim3, args []any) error {
	const k = NameRMSNorm
	a, err := parseArgs(k, "ppupuuufpu", args)
	if err != nil {
		return err
	}
	if err := checkLinearLaunch(k, grid, block); err != nil {
		return err
	}
	rdt, _, err := dtArg(k, a.u[4])
	if err != nil {
		return err
	}
	wdt, we, err := dtArg(k, a.u[0])
	if err != nil {
		return err
	}
	odt, oe, err := dtArg(k, a.u[1])
	if err != nil {
		return err
	}
	T, H, eps := uint64(a.u[2]), uint64(a.u[3]), a.f[0]
	if T == 0 || H == 0 {
		return nil
	}
	xb, err := buf(k, "x", mem, a.p[0], T*H, 4)
	if err != nil {
		return err
	}
	wb, err := buf(k, "w", mem, a.p[1], H, we)
	if err != nil {
		return err
	}
	ob, err := buf(k, "out", mem, a.p[2], T*H, oe)
	if err != nil {
		return err
	}
	w := make([]float32, H)
	for i := range H {
		w[i] = getDT(wdt, wb, i)
	}
	var yb []byte
	if a.p[3] != 0 {
		if yb, err = buf(k, "y", mem, a.p[3], T*H, 4); err != nil {
			return err
		}
	}
	x := make([]float32, H)
	for t := range T {
		for i := range H {
			x[i] = getF(xb, t*H+i)
			if yb != nil { // the residual first, written back (ResidualRMSNorm)
				x[i] = RoundTo(rdt, x[i]+RoundTo(rdt, getF(yb, t*H+i)))
				putF(xb, t*H+i, x[i])
			}
		}
		for i, v := range RMSNormRow(x, w, odt, eps) {
			putDT(odt, ob, t*H+uint64(i), v)
		}
	}
	return nil
}

func costRMSNorm(_, _ device.Dim3, args []any) (goCost, bool) {
	a, err := parseArgs("", "ppupuuufpu", args)
	if err != nil {
		return goCost{}, false
	}
	_, we, err1 := dtArg("", a.u[0])
	_, oe, err2 := dtArg("", a.u[1])
	if err1 != nil || err2 != nil {
		return goCost{}, false
	}
	n := float64(a.u[2]) * float64(a.u[3])
	return goCost{flops: 4 * n, bytes: 4*n + float64(oe)*n + float64(we)*float64(a.u[3])}, true
}

// RopePair is the RoPE kernel's float32 math for one pair (a, b) at
// position pos with inverse frequency f: angle float32(pos)·f, then
// (a·cos − b·sin, b·cos + a·sin) with float32 cos and sin.
func RopePair(a, b float32, pos int32, f float32) (float32, float32) {
	return hostmath.RopePair(a, b, pos, f)
}

// RopePairIn is the RoPE kernel's math in dtype dt (RoPEIn): RopePair for
// f32; for bf16 and f16, with cos, sin, a and b rounded to dt,
// (dt(dt(a·cos) − dt(b·sin)), dt(dt(b·cos) + dt(a·sin))).
func RopePairIn(dt string, a, b float32, pos int32, f float32) (float32, float32) {
	return hostmath.RopePairIn(hostDType(dt), a, b, pos, f)
}

// ropeArgs are a RoPE launch's shape, rounding dtype, positions and
// frequencies (T 0: nothing to do).
type ropeArgs struct {
	T, nH, hd uint64
	rdt       string
	pos, inv  []byte
}

// ropeOperands reads memwall_rope's and memwall_rope_gguf's common
// operands: T, nHeads, headDim and flags (its last four integers), and the
// positions and inverse frequencies at pointers posArg and posArg+1.
func ropeOperands(k string, mem memory, a kargs, posArg int) (ropeArgs, error) {
	r := ropeArgs{T: uint64(a.u[0]), nH: uint64(a.u[1]), hd: uint64(a.u[2])}
	var ok bool
	if r.rdt, ok = codeDtype(a.u[3] >> 1); !ok {
		return ropeArgs{}, fmt.Errorf("kernels: %s: flags %#x: unknown dtype code %d: %w", k, a.u[3], a.u[3]>>1, device.ErrInvalid)
	}
	if r.T == 0 || r.nH == 0 || r.hd/2 == 0 {
		return ropeArgs{}, nil
	}
	var err error
	if r.pos, err = buf(k, "pos", mem, a.p[posArg], r.T, 4); err != nil {
		return ropeArgs{}, err
	}
	if r.inv, err = buf(k, "invFreq", mem, a.p[posArg+1], r.hd/2, 4); err != nil {
		return ropeArgs{}, err
	}
	return r, nil
}

func runRoPE(mem memory, grid, block device.Dim3, args []any) error {
	const k = NameRoPE
	a, err := parseArgs(k, "pppuuuu", args)
	if err != nil {
		return err
	}
	if err := checkLinearLaunch(k, grid, block); err != nil {
		return err
	}
	r, err := ropeOperands(k, mem, a, 1)
	if err != nil || r.T == 0 {
		return err
	}
	xb, err := buf(k, "x", mem, a.p[0], r.T*r.nH*r.hd, 4)
	if err != nil {
		return err
	}
	pairs := r.halves
	if a.u[3]&1 != 0 {
		pairs = interleaved
	}
	r.rotate(xb, xb, pairs, pairs)
	return nil
}

// rotate applies RoPE to every head of r's T rows: the pair i of a head
// (i < hd/2) is read from src at from(i) and written to dst at to(i), its
// offsets in the head, as RopePairIn rotates it.
func (r ropeArgs) rotate(src, dst []byte, from, to func(i uint64) (uint64, uint64)) {
	for t := range r.T {
		pos := int32(binary.LittleEndian.Uint32(r.pos[4*t:]))
		for h := range r.nH {
			base := (t*r.nH + h) * r.hd
			for i := range r.hd / 2 {
				ia, ib := from(i)
				oa, ob := to(i)
				x, y := RopePairIn(r.rdt, getF(src, base+ia), getF(src, base+ib), pos, getF(r.inv, i))
				putF(dst, base+oa, x)
				putF(dst, base+ob, y)
			}
		}
	}
}

// halves is HF's pairing: (i, i + hd/2); interleaved is GGUF's: (2i, 2i+1).
func (r ropeArgs) halves(i uint64) (uint64, uint64) { return i, i + r.hd/2 }

func interleaved(i uint64) (uint64, uint64) { return 2 * i, 2*i + 1 }

// runRoPEGGUF is memwall_rope_gguf: the HF pair (i, i+half) of each head
// read from src at (2i, 2i+1), rotated as runRoPE rotates it, into dst.
func runRoPEGGUF(mem memory, grid, block device.Dim3, args []any) error {
	const k = NameRoPEGGUF
	a, err := parseArgs(k, "ppppuuuu", args)
	if err != nil {
		return err
	}
	if err := checkLinearLaunch(k, grid, block); err != nil {
		return err
	}
	r, err := ropeOperands(k, mem, a, 2)
	if err != nil || r.T == 0 {
		return err
	}
	n := r.T * r.nH * r.hd
	sb, err := buf(k, "src", mem, a.p[0], n, 4)
	if err != nil {
		return err
	}
	db, err := buf(k, "dst", mem, a.p[1], n, 4)
	if err != nil {
		return err
	}
	r.rotate(sb, db, interleaved, r.halves)
	return nil
}

func costRoPEGGUF(_, _ device.Dim3, args []any) (goCost, bool) {
	a, err := parseArgs("", "ppppuuuu", args)
	if err != nil {
		return goCost{}, false
	}
	n := float64(a.u[0]) * float64(a.u[1]) * float64(a.u[2])
	return goCost{flops: 3 * n, bytes: 8 * n}, true
}

func costRoPE(_, _ device.Dim3, args []any) (goCost, bool) {
	a, err := parseArgs("", "pppuuuu", args)
	if err != nil {
		return goCost{}, false
	}
	n := float64(a.u[0]) * float64(a.u[1]) * float64(a.u[2])
	return goCost{flops: 3 * n, bytes: 8 * n}, true
}

// SiluMulValue is the SiluMul kernel's math: odt(odt(silu(g))·u) for odt
// bf16/f16, silu(g)·u in float32 for f32.
func SiluMulValue(g, u float32, odt string) float32 {
	return hostmath.SiluMulValue(g, u, hostDType(odt))
}

// elemKernel runs a grid-stride element kernel: kinds are its arguments,
// n the uint64 count (its last argument).
func elemLaunch(k, kinds string, grid, block device.Dim3, args []any) (kargs, uint64, error) {
	a, err := parseArgs(k, kinds, args)
	if err != nil {
		return a, 0, err
	}
	if err := checkLinearLaunch(k, grid, block); err != nil {
		return a, 0, err
	}
	return a, a.U[len(a.U)-1], nil
}

func runSiluMul(mem memory, grid, block device.Dim3, args []any) error {
	return siluMulOver(nil, mem, grid, block, args)
}

// siluMulOver is memwall_silumul with its elements split over r (nil: on
// the caller), hostmath.SiluMul's math on each part.
func siluMulOver(r *hostmath.Runner, mem memory, grid, block device.Dim3, args []any) error {
	const k = NameSiluMul
	a, n, err := elemLaunch(k, "pppuuU", grid, block, args)
	if err != nil || n == 0 {
		return err
	}
	odt, oe, err := dtArg(k, a.u[0])
	if err != nil {
		return err
	}
	rdt, _, err := dtArg(k, a.u[1])
	if err != nil {
		return err
	}
	g, err := buf(k, "g", mem, a.p[0], n, 4)
	if err != nil {
		return err
	}
	u, err := buf(k, "u", mem, a.p[1], n, 4)
	if err != nil {
		return err
	}
	out, err := buf(k, "out", mem, a.p[2], n, oe)
	if err != nil {
		return err
	}
	hr, ho := hostDType(rdt), hostDType(odt)
	r.Run(int(n), 4096, func(lo, hi int) {
		const chunk = 256
		var gv, uv [chunk]float32
		for i0 := lo; i0 < hi; i0 += chunk {
			c := min(chunk, hi-i0)
			for i := range c {
				gv[i], uv[i] = getF(g, uint64(i0+i)), getF(u, uint64(i0+i))
			}
			hostmath.SiluMul(gv[:c], gv[:c], uv[:c], hr, ho)
			for i := range c {
				putDT(odt, out, uint64(i0+i), gv[i])
			}
		}
	})
	return nil
}

func runAdd(mem memory, grid, block device.Dim3, args []any) error {
	const k = NameAdd
	a, n, err := elemLaunch(k, "ppU", grid, block, args)
	if err != nil || n == 0 {
		return err
	}
	x, err := buf(k, "x", mem, a.p[0], n, 4)
	if err != nil {
		return err
	}
	y, err := buf(k, "y", mem, a.p[1], n, 4)
	if err != nil {
		return err
	}
	for i := range n {
		putF(x, i, getF(x, i)+getF(y, i))
	}
	return nil
}

func runCast(mem memory, grid, block device.Dim3, args []any) error {
	const k = NameCast
	a, n, err := elemLaunch(k, "ppuU", grid, block, args)
	if err != nil || n == 0 {
		return err
	}
	odt, oe, err := dtArg(k, a.u[0])
	if err != nil {
		return err
	}
	x, err := buf(k, "x", mem, a.p[0], n, 4)
	if err != nil {
		return err
	}
	out, err := buf(k, "out", mem, a.p[1], n, oe)
	if err != nil {
		return err
	}
	for i := range n {
		putDT(odt, out, i, getF(x, i))
	}
	return nil
}

func runRound(mem memory, grid, block device.Dim3, args []any) error {
	const k = NameRound
	a, n, err := elemLaunch(k, "puU", grid, block, args)
	if err != nil || n == 0 {
		return err
	}
	dt, _, err := dtArg(k, a.u[0])
	if err != nil {
		return err
	}
	x, err := buf(k, "x", mem, a.p[0], n, 4)
	if err != nil {
		return err
	}
	for i := range n {
		putF(x, i, RoundTo(dt, getF(x, i)))
	}
	return nil
}

// costElem: an element kernel of nargs arguments, flops and bytes per
// element.
func costElem(nargs int, flops, bytes float64) func(_, _ device.Dim3, args []any) (goCost, bool) {
	return func(_, _ device.Dim3, args []any) (goCost, bool) {
		if len(args) != nargs {
			return goCost{}, false
		}
		n, ok := args[nargs-1].(uint64)
		if !ok {
			return goCost{}, false
		}
		return goCost{flops: flops * float64(n), bytes: bytes * float64(n)}, true
	}
}

// kvArgs are the cache-addressing arguments shared by kvwrite and attn.
type kvArgs struct {
	cache, table device.Ptr
	start, T     uint32
	L            KVLayout
	layer        uint32
}

// tableEntries reads the block ids for positions [0, start+T).
func (kv kvArgs) blocks(k string, mem memory) ([]uint32, error) {
	n := (uint64(kv.start) + uint64(kv.T) + uint64(kv.L.BlockTokens) - 1) / uint64(kv.L.BlockTokens)
	b, err := buf(k, "table", mem, kv.table, n, 4)
	if err != nil {
		return nil, err
	}
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return ids, nil
}

// row returns the K (kv 0) or V row of kv head at position p.
func (kv kvArgs) row(k string, mem memory, blocks []uint32, kvIdx, p, head uint32) ([]byte, error) {
	off := kv.L.Offset(blocks[p/kv.L.BlockTokens], kv.layer, kvIdx, p, head)
	elt, _ := ElemSize(kv.L.DType)
	return buf(k, "cache", mem, kv.cache.Add(off), uint64(kv.L.HeadDim), elt)
}

func runKVWrite(mem memory, grid, block device.Dim3, args []any) error {
	const k = NameKVWrite
	a, err := parseArgs(k, "ppppuuuuuuuU", args)
	if err != nil {
		return err
	}
	if err := checkLinearLaunch(k, grid, block); err != nil {
		return err
	}
	dt, _, err := dtArg(k, a.u[6])
	if err != nil {
		return err
	}
	kv := kvArgs{cache: a.p[2], table: a.p[3], start: a.u[0], T: a.u[1], layer: a.u[5],
		L: KVLayout{BlockTokens: a.u[2], KVHeads: a.u[3], HeadDim: a.u[4], Layers: a.u[5] + 1, DType: dt, BlockBytes: a.U[0]}}
	if kv.T == 0 {
		return nil
	}
	if kv.L.BlockTokens == 0 {
		return fmt.Errorf("kernels: %s: blockTokens 0: %w", k, device.ErrInvalid)
	}
	n := uint64(kv.T) * uint64(kv.L.KVHeads) * uint64(kv.L.HeadDim)
	kb, err := buf(k, "k", mem, a.p[0], n, 4)
	if err != nil {
		return err
	}
	vb, err := buf(k, "v", mem, a.p[1], n, 4)
	if err != nil {
		return err
	}
	blocks, err := kv.blocks(k, mem)
	if err != nil {
		return err
	}
	hd := uint64(kv.L.HeadDim)
	for t := range kv.T {
		for h := range kv.L.KVHeads {
			src := (uint64(t)*uint64(kv.L.KVHeads) + uint64(h)) * hd
			for kvIdx, from := range [][]byte{kb, vb} {
				row, err := kv.row(k, mem, blocks, uint32(kvIdx), kv.start+t, h)
				if err != nil {
					return err
				}
				for e := range hd {
					putDT(dt, row, e, getF(from, src+e))
				}
			}
		}
	}
	return nil
}

func costKVWrite(_, _ device.Dim3, args []any) (goCost, bool) {
	a, err := parseArgs("", "ppppuuuuuuuU", args)
	if err != nil {
		return goCost{}, false
	}
	_, elt, err := dtArg("", a.u[6])
	if err != nil {
		return goCost{}, false
	}
	n := 2 * float64(a.u[1]) * float64(a.u[3]) * float64(a.u[4])
	return goCost{bytes: n * (4 + float64(elt))}, true
}

// attnArgs are memwall_attn's arguments.
type attnArgs struct {
	kvArgs
	q, part, out   device.Ptr
	nHeads         uint32
	scale          float32
	chunk, odtCode uint32
}

const attnKinds = "pppuuuuuuuuUfuppu"

func parseAttn(k string, args []any) (attnArgs, error) {
	a, err := parseArgs(k, attnKinds, args)
	if err != nil {
		return attnArgs{}, err
	}
	dt, _, err := dtArg(k, a.u[7])
	if err != nil {
		return attnArgs{}, err
	}
	return attnArgs{
		kvArgs: kvArgs{cache: a.p[1], table: a.p[2], start: a.u[0], T: a.u[1], layer: a.u[6],
			L: KVLayout{BlockTokens: a.u[5], KVHeads: a.u[3], HeadDim: a.u[4], Layers: a.u[6] + 1, DType: dt, BlockBytes: a.U[0]}},
		q: a.p[0], part: a.p[3], out: a.p[4], nHeads: a.u[2], scale: a.f[0], chunk: a.u[8], odtCode: a.u[9],
	}, nil
}

func runAttn(lanes uint32) func(mem memory, grid, block device.Dim3, args []any) error {
	return func(mem memory, grid, block device.Dim3, args []any) error {
		return runAttnSplit(AttnName(32*lanes), lanes, mem, grid, block, args)
	}
}

func runAttnSplit(k string, lanes uint32, mem memory, grid, block device.Dim3, args []any) error {
	op, err := attnOperands(k, lanes, mem, grid, block, args)
	if err != nil || op.a.T == 0 {
		return err
	}
	a, hd, splits := op.a, uint64(op.a.L.HeadDim), op.splits
	q := make([]float32, hd)
	acc := make([]float32, hd)
	var scores []float32
	for t := range a.T {
		n := uint64(a.start) + uint64(t) + 1
		for h := range a.nHeads {
			row := uint64(t)*uint64(a.nHeads) + uint64(h)
			for e := range hd {
				q[e] = getF(op.q, row*hd+e)
			}
			for s := range splits {
				p0 := s * uint64(a.chunk)
				p1 := min(n, p0+uint64(a.chunk))
				m, l, err := a.split(mem, op.blocks, q, h/op.G, p0, p1, acc, &scores)
				if err != nil {
					return err
				}
				op.put(row, s, m, l, acc)
			}
		}
	}
	return nil
}

// attnOp is a checked launch of a split-attention kernel: its arguments,
// the query heads per kv head, the splits, and the bytes of q, of the
// output (out, or the partials when split) and the block table's ids.
type attnOp struct {
	a      attnArgs
	odt    string
	G      uint32
	splits uint64
	q, out []byte
	blocks []uint32
}

// attnOperands parses and checks a launch of kernel k (head dims up to
// 32·lanes) and fetches its operands; with T = 0 it fetches nothing.
func attnOperands(k string, lanes uint32, mem memory, grid, block device.Dim3, args []any) (attnOp, error) {
	a, err := parseAttn(k, args)
	if err != nil {
		return attnOp{}, err
	}
	odt, oe, err := dtArg(k, a.odtCode)
	if err != nil {
		return attnOp{}, err
	}
	L := a.L
	if L.KVHeads == 0 || a.nHeads%L.KVHeads != 0 || L.HeadDim == 0 || L.HeadDim > 32*lanes || L.BlockTokens == 0 || a.chunk == 0 {
		return attnOp{}, fmt.Errorf("kernels: %s: nHeads %d, layout %+v, chunk %d: %w", k, a.nHeads, L, a.chunk, device.ErrInvalid)
	}
	groups := ceilDiv(a.nHeads/L.KVHeads, attnHeads)
	ctx := uint64(a.start) + uint64(a.T)
	if block != blockDim() || grid.X != L.KVHeads*groups || grid.Y != a.T || grid.Z == 0 ||
		uint64(grid.Z)*uint64(a.chunk) < ctx || grid.Z > maxSplits {
		return attnOp{}, fmt.Errorf("kernels: %s: grid %v block %v does not match the heads, tokens and splits: %w", k, grid, block, device.ErrInvalid)
	}
	op := attnOp{a: a, odt: odt, G: a.nHeads / L.KVHeads, splits: uint64(grid.Z)}
	if a.T == 0 {
		return op, nil
	}
	hd := uint64(L.HeadDim)
	rows := uint64(a.T) * uint64(a.nHeads)
	if op.q, err = buf(k, "q", mem, a.q, rows*hd, 4); err != nil {
		return op, err
	}
	if op.splits == 1 {
		op.out, err = buf(k, "out", mem, a.out, rows*hd, oe)
	} else {
		op.out, err = buf(k, "part", mem, a.part, rows*op.splits*(hd+2), 4)
	}
	if err != nil {
		return op, err
	}
	op.blocks, err = a.blocks(k, mem)
	return op, err
}

// put writes query row row's result of split s: out = odt(acc/l) when
// the context is not split, else the partial (m, l, acc).
func (op *attnOp) put(row, s uint64, m, l float32, acc []float32) {
	hd := uint64(op.a.L.HeadDim)
	if op.splits == 1 {
		for e := range hd {
			putDT(op.odt, op.out, row*hd+e, acc[e]/l)
		}
		return
	}
	base := (row*op.splits + s) * (hd + 2)
	putF(op.out, base, m)
	putF(op.out, base+1, l)
	for e := range hd {
		putF(op.out, base+2+e, acc[e])
	}
}

// split computes one split's softmax partial over positions [p0, p1):
// m = max score (−Inf when empty), l = Σ exp(s − m), acc = Σ exp(s − m)·v.
func (a attnArgs) split(mem memory, blocks []uint32, q []float32, kvh uint32, p0, p1 uint64, acc []float32, scores *[]float32) (float32, float32, error) {
	const k = NameAttn
	clear(acc)
	if p1 <= p0 {
		return float32(math.Inf(-1)), 0, nil
	}
	sc := (*scores)[:0]
	m := float32(math.Inf(-1))
	for p := p0; p < p1; p++ {
		kr, err := a.row(k, mem, blocks, 0, uint32(p), kvh)
		if err != nil {
			return 0, 0, err
		}
		var d float32
		for e, qv := range q {
			d += qv * getDT(a.L.DType, kr, uint64(e))
		}
		d *= a.scale
		sc = append(sc, d)
		m = max(m, d)
	}
	*scores = sc
	var l float32
	for i, p := 0, p0; p < p1; i, p = i+1, p+1 {
		w := float32(math.Exp(float64(sc[i] - m)))
		l += w
		vr, err := a.row(k, mem, blocks, 1, uint32(p), kvh)
		if err != nil {
			return 0, 0, err
		}
		for e := range acc {
			acc[e] += w * getDT(a.L.DType, vr, uint64(e))
		}
	}
	return m, l, nil
}

func costAttn(grid, _ device.Dim3, args []any) (goCost, bool) {
	a, err := parseAttn("", args)
	if err != nil {
		return goCost{}, false
	}
	elt, _ := ElemSize(a.L.DType)
	// Σ over tokens of the positions each attends to.
	pairs := float64(a.T)*float64(a.start) + float64(a.T)*(float64(a.T)+1)/2
	hd := float64(a.L.HeadDim)
	flops := 4 * pairs * hd * float64(a.nHeads)
	// Each block reads its positions' K and V rows once for its heads.
	kv := pairs * 2 * hd * float64(elt) * float64(grid.X)
	return goCost{flops: flops, bytes: kv + 8*float64(a.T)*float64(a.nHeads)*hd}, true
}

func runCombine(mem memory, grid, block device.Dim3, args []any) error {
	const k = NameAttnCombine
	a, err := parseArgs(k, "ppuuuu", args)
	if err != nil {
		return err
	}
	if err := checkLinearLaunch(k, grid, block); err != nil {
		return err
	}
	odt, oe, err := dtArg(k, a.u[0])
	if err != nil {
		return err
	}
	rows, hd, splits := uint64(a.u[1]), uint64(a.u[2]), uint64(a.u[3])
	if splits == 0 || splits > maxSplits {
		return fmt.Errorf("kernels: %s: %d splits: %w", k, splits, device.ErrInvalid)
	}
	if rows == 0 || hd == 0 {
		return nil
	}
	pb, err := buf(k, "part", mem, a.p[0], rows*splits*(hd+2), 4)
	if err != nil {
		return err
	}
	ob, err := buf(k, "out", mem, a.p[1], rows*hd, oe)
	if err != nil {
		return err
	}
	c := make([]float32, splits)
	for r := range rows {
		base := r * splits * (hd + 2)
		M := float32(math.Inf(-1))
		for s := range splits {
			M = max(M, getF(pb, base+s*(hd+2)))
		}
		var L float32
		for s := range splits {
			ms := getF(pb, base+s*(hd+2))
			c[s] = 0
			if !math.IsInf(float64(ms), -1) {
				c[s] = float32(math.Exp(float64(ms - M)))
			}
			L += getF(pb, base+s*(hd+2)+1) * c[s]
		}
		for e := range hd {
			var A float32
			for s := range splits {
				A += getF(pb, base+s*(hd+2)+2+e) * c[s]
			}
			putDT(odt, ob, r*hd+e, A/L)
		}
	}
	return nil
}

func costCombine(_, _ device.Dim3, args []any) (goCost, bool) {
	a, err := parseArgs("", "ppuuuu", args)
	if err != nil {
		return goCost{}, false
	}
	n := float64(a.u[1]) * float64(a.u[3]) * (float64(a.u[2]) + 2)
	return goCost{flops: 2 * n, bytes: 4*n + 4*float64(a.u[1])*float64(a.u[2])}, true
}

// runFlash is memwall_attn_flash's math: q rounded to the cache dtype; for
// each tile of 64 positions up to the query's own, scores in log2 units
// (q·k·scale·log2 e, f32), running max m, corr = 2^(m_old − m), weights
// p = 2^(s − m) summed in f32 into l, and acc = acc·corr + Σ dtype(p)·v; out
// = acc / l.
func runFlash(mem memory, grid, block device.Dim3, args []any) error {
	const k = NameAttnFlash
	a, err := parseAttn(k, args)
	if err != nil {
		return err
	}
	odt, oe, err := dtArg(k, a.odtCode)
	if err != nil {
		return err
	}
	L := a.L
	if L.KVHeads == 0 || a.nHeads%L.KVHeads != 0 || (L.HeadDim != 64 && L.HeadDim != 128) || L.BlockTokens == 0 ||
		(L.DType != BF16 && L.DType != F16) {
		return fmt.Errorf("kernels: %s: nHeads %d, layout %+v: %w", k, a.nHeads, L, device.ErrInvalid)
	}
	if block != (device.Dim3{X: flashThreads, Y: 1, Z: 1}) || grid.X != ceilDiv(a.T, flashRows) || grid.Y != a.nHeads || grid.Z != 1 {
		return fmt.Errorf("kernels: %s: grid %v block %v do not match T=%d and %d heads: %w", k, grid, block, a.T, a.nHeads, device.ErrInvalid)
	}
	if a.T == 0 {
		return nil
	}
	hd := uint64(L.HeadDim)
	rows := uint64(a.T) * uint64(a.nHeads)
	qb, err := buf(k, "q", mem, a.q, rows*hd, 4)
	if err != nil {
		return err
	}
	ob, err := buf(k, "out", mem, a.out, rows*hd, oe)
	if err != nil {
		return err
	}
	blocks, err := a.blocks(k, mem)
	if err != nil {
		return err
	}
	G := a.nHeads / L.KVHeads
	sc := a.scale * float32(math.Log2E)
	q := make([]float32, hd)
	acc := make([]float32, hd)
	s := make([]float32, flashRows)
	for t := range a.T {
		qp := uint64(a.start) + uint64(t)
		for h := range a.nHeads {
			row := uint64(t)*uint64(a.nHeads) + uint64(h)
			for e := range hd {
				q[e] = RoundTo(L.DType, getF(qb, row*hd+e))
			}
			clear(acc)
			m, l := float32(math.Inf(-1)), float32(0)
			for p0 := uint64(0); p0 <= qp; p0 += flashRows {
				n := min(uint64(flashRows), qp+1-p0)
				mx := m
				for i := range n {
					kr, err := a.row(k, mem, blocks, 0, uint32(p0+i), h/G)
					if err != nil {
						return err
					}
					var d float32
					for e, qv := range q {
						d += qv * getDT(L.DType, kr, uint64(e))
					}
					s[i] = d * sc
					mx = max(mx, s[i])
				}
				corr := float32(math.Exp2(float64(m - mx)))
				m = mx
				l *= corr
				for e := range acc {
					acc[e] *= corr
				}
				for i := range n {
					p := float32(math.Exp2(float64(s[i] - m)))
					l += p
					pr := RoundTo(L.DType, p)
					vr, err := a.row(k, mem, blocks, 1, uint32(p0+i), h/G)
					if err != nil {
						return err
					}
					for e := range acc {
						acc[e] += pr * getDT(L.DType, vr, uint64(e))
					}
				}
			}
			for e := range hd {
				putDT(odt, ob, row*hd+e, acc[e]/l)
			}
		}
	}
	return nil
}

func costFlash(_, _ device.Dim3, args []any) (goCost, bool) {
	a, err := parseAttn("", args)
	if err != nil {
		return goCost{}, false
	}
	elt, _ := ElemSize(a.L.DType)
	pairs := float64(a.T)*float64(a.start) + float64(a.T)*(float64(a.T)+1)/2
	hd := float64(a.L.HeadDim)
	// Each block of 64 tokens reads K and V up to its last token.
	var rows float64
	for t0 := uint64(0); t0 < uint64(a.T); t0 += flashRows {
		rows += float64(uint64(a.start) + min(t0+flashRows, uint64(a.T)))
	}
	kv := rows * float64(a.nHeads) * 2 * hd * float64(elt)
	return goCost{flops: 4 * pairs * hd * float64(a.nHeads), bytes: kv + 8*float64(a.T)*float64(a.nHeads)*hd}, true
}
