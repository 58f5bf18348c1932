package kernels

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/memwall/memwall/device"
)

// Kernel names of the Llama-layer kernels (extern "C" entries of kernels.cu).
const (
	NameEmbed       = "memwall_embed"
	NameRMSNorm     = "memwall_rmsnorm"
	NameRoPE        = "memwall_rope"
	NameSiluMul     = "memwall_silumul"
	NameAdd         = "memwall_add"
	NameCast        = "memwall_cast"
	NameRound       = "memwall_round"
	NameKVWrite     = "memwall_kvwrite"
	NameAttn        = "memwall_attn" // prefix of the split-attention entries (AttnName)
	NameAttnCombine = "memwall_attn_combine"
	NameAttnFlash   = "memwall_attn_flash"
	NameAttnDecode  = "memwall_attn_decode"
	// NameRoPEGGUF is RoPE from GGUF's Q/K row order (RoPEGGUF), newer than
	// the frozen compute_70 module: optional at load (ExtraNames).
	NameRoPEGGUF = "memwall_rope_gguf"
)

// ExtraNames are the kernels outside Names, QuantNames and StateNames that
// a module may lack (the frozen compute_70 one does): a Set without them
// runs the slower path they replace (HasRoPEGGUF, HasDequant).
func ExtraNames() []string {
	n := []string{NameRoPEGGUF}
	for _, dt := range QuantDTypes() {
		n = append(n, QDequantName(dt))
	}
	return append(n, q8Names()...)
}

// attnLanes are the elements per lane E of the split-attention entries:
// memwall_attn_e<E> takes head dims up to 32·E.
var attnLanes = [...]uint32{1, 2, 4, 8}

// AttnName returns the split-attention kernel for a head dimension
// ("memwall_attn_e4" for 65..128), or "" above MaxHeadDim.
func AttnName(headDim uint32) string {
	for _, e := range attnLanes {
		if headDim <= 32*e {
			return fmt.Sprintf("%s_e%d", NameAttn, e)
		}
	}
	return ""
}

func llamaNames() []string {
	n := []string{NameEmbed, NameRMSNorm, NameRoPE, NameSiluMul, NameAdd, NameCast, NameRound, NameKVWrite}
	for _, e := range attnLanes {
		n = append(n, AttnName(32*e))
	}
	return append(n, NameAttnCombine, NameAttnFlash, NameAttnDecode)
}

type llamaFuncs struct {
	embed, rmsnorm, rope, silumul, add, cast, round, kvwrite, combine, flash, decode device.Function
	attn                                                                             [len(attnLanes)]device.Function
}

func (f *llamaFuncs) resolve(get func(string) (device.Function, error)) error {
	for _, r := range []struct {
		dst  *device.Function
		name string
	}{{&f.embed, NameEmbed}, {&f.rmsnorm, NameRMSNorm}, {&f.rope, NameRoPE}, {&f.silumul, NameSiluMul},
		{&f.add, NameAdd}, {&f.cast, NameCast}, {&f.round, NameRound}, {&f.kvwrite, NameKVWrite},
		{&f.combine, NameAttnCombine}, {&f.flash, NameAttnFlash}, {&f.decode, NameAttnDecode}} {
		var err error
		if *r.dst, err = get(r.name); err != nil {
			return err
		}
	}
	for i, e := range attnLanes {
		var err error
		if f.attn[i], err = get(AttnName(32 * e)); err != nil {
			return err
		}
	}
	return nil
}

// attnFunc returns the split-attention entry for headDim (≤ MaxHeadDim).
func (f *llamaFuncs) attnFunc(headDim uint32) device.Function {
	for i, e := range attnLanes {
		if headDim <= 32*e {
			return f.attn[i]
		}
	}
	return 0
}

// dtype codes the kernels take (kDt* in kernels.cu).
const (
	codeF32  uint32 = 0
	codeBF16 uint32 = 1
	codeF16  uint32 = 2
)

func dtCode(dtype string) (uint32, error) {
	switch dtype {
	case F32:
		return codeF32, nil
	case BF16:
		return codeBF16, nil
	case F16:
		return codeF16, nil
	}
	_, err := ElemSize(dtype)
	return 0, err
}

func codeDtype(c uint32) (string, bool) {
	switch c {
	case codeF32:
		return F32, true
	case codeBF16:
		return BF16, true
	case codeF16:
		return F16, true
	}
	return "", false
}

// Limits of the Llama kernels.
const (
	// MaxHeadDim is the largest head dimension Attention takes.
	MaxHeadDim = 256
	// maxSplits bounds the position splits of one attention launch
	// (memwall_attn_combine keeps one weight per split in shared memory).
	maxSplits = 1024
	// minChunk is the fewest cached positions one attention block takes
	// when the context is split.
	minChunk = 128
	// maxScratch bounds the attention partials kept per stream.
	maxScratch = 64 << 20
	attnWarps  = 8 // kAttnWarps
	attnHeads  = 8 // kAttnHeads: query heads per block
	// flashRows is kFlashBr, the query tokens per flash-attention block;
	// flashMinT the fewest tokens Attention runs the flash kernel for.
	flashRows    = 64
	flashThreads = 128
	flashMinT    = 16
	decodeMaxT   = 8
)

// KVLayout describes the paged KV cache Attention and KVWrite address
// (docs/DESIGN.md, "The runtime"): block b starts at cache + b·BlockBytes;
// inside it, layer l's K then V rows of BlockTokens positions each, every
// row KVHeads·HeadDim elements of DType. Position p lives in block
// table[p / BlockTokens], slot p % BlockTokens, at byte
// block·BlockBytes + ((layer·2 + kv)·BlockTokens + slot)·KVHeads·HeadDim·elt
// + head·HeadDim·elt (kv 0 = K, 1 = V).
type KVLayout struct {
	BlockTokens, KVHeads, HeadDim, Layers uint32
	DType                                 string // "bf16", "f16" or "f32"
	BlockBytes                            uint64 // ≥ Layers·2·BlockTokens·KVHeads·HeadDim·elt
}

// RowBytes is the bytes of one position of one layer's K (or V): all kv
// heads.
func (l KVLayout) RowBytes() uint64 {
	elt, _ := ElemSize(l.DType)
	return uint64(l.KVHeads) * uint64(l.HeadDim) * uint64(elt)
}

// Offset returns the byte offset from the cache base of head's K (kv = 0)
// or V (kv = 1) row of position pos in layer, with block the table entry
// for pos (table[pos / BlockTokens]).
func (l KVLayout) Offset(block, layer, kv, pos, head uint32) uint64 {
	elt, _ := ElemSize(l.DType)
	slot := uint64(pos % l.BlockTokens)
	return uint64(block)*l.BlockBytes +
		((uint64(layer)*2+uint64(kv))*uint64(l.BlockTokens)+slot)*l.RowBytes() +
		uint64(head)*uint64(l.HeadDim)*uint64(elt)
}

// Validate checks the layout: known dtype, non-zero dimensions, HeadDim ≤
// MaxHeadDim, and BlockBytes large enough for every layer's K and V.
func (l KVLayout) Validate() error {
	elt, err := ElemSize(l.DType)
	if err != nil {
		return fmt.Errorf("kernels: kv layout: %w", err)
	}
	if l.BlockTokens == 0 || l.KVHeads == 0 || l.HeadDim == 0 || l.Layers == 0 {
		return fmt.Errorf("kernels: kv layout %+v: zero dimension: %w", l, ErrShape)
	}
	if l.HeadDim > MaxHeadDim {
		return fmt.Errorf("kernels: kv layout: head dim %d exceeds %d: %w", l.HeadDim, MaxHeadDim, ErrShape)
	}
	need := uint64(l.Layers) * 2 * uint64(l.BlockTokens) * uint64(l.KVHeads) * uint64(l.HeadDim) * uint64(elt)
	if l.BlockBytes < need {
		return fmt.Errorf("kernels: kv layout: block bytes %d, the layers need %d: %w", l.BlockBytes, need, ErrShape)
	}
	return nil
}

func checkPtr(kernel, name string, p device.Ptr, align uint64) error {
	if p == 0 || uint64(p)%align != 0 {
		return fmt.Errorf("kernels: %s: %s %#x is not a %d-byte aligned address: %w", kernel, name, uint64(p), align, device.ErrInvalid)
	}
	return nil
}

func (s *Set) rowGrid(rows uint32) device.Dim3 {
	return device.Dim3{X: max(1, min(rows, uint32(maxGridX))), Y: 1, Z: 1}
}

func (s *Set) launch(name string, f device.Function, grid device.Dim3, st device.Stream, args ...any) error {
	if err := s.launchK(f, grid, blockDim(), 0, st, args...); err != nil {
		return fmt.Errorf("kernels: %s: %w", name, err)
	}
	return nil
}

// Embed queues out[t, :] = float32(table[ids[t], :]) for t < T: table is a
// row-major V×H matrix in wdt, ids T int32 rows of it, out T×H float32.
// ids must be valid rows (the kernel cannot check them against V). T == 0
// launches nothing. A block-quantized wdt (QuantDTypes) dequantizes each
// row, exactly as package quant does (H a multiple of the block).
func (s *Set) Embed(table device.Ptr, wdt string, ids, out device.Ptr, T, H uint32, st device.Stream) error {
	if _, ok := QuantType(wdt); ok {
		return s.embedQuant(table, wdt, ids, out, T, H, st)
	}
	code, err := dtCode(wdt)
	if err != nil {
		return fmt.Errorf("kernels: %s: %w", NameEmbed, err)
	}
	if T == 0 {
		return nil
	}
	if H == 0 {
		return fmt.Errorf("kernels: %s: H = 0: %w", NameEmbed, ErrShape)
	}
	elt, _ := ElemSize(wdt)
	if err := errors.Join(checkPtr(NameEmbed, "table", table, uint64(elt)), checkPtr(NameEmbed, "ids", ids, 4),
		checkPtr(NameEmbed, "out", out, 4)); err != nil {
		return err
	}
	return s.launch(NameEmbed, s.llama.embed, s.rowGrid(T), st, table, code, ids, out, T, H)
}

// RMSNorm queues, for each row t < T of x (T×H float32),
// out[t, i] = odt(n·w[i]) with n = x[t, i]·rsqrt(Σᵢ x[t, i]²/H + eps), all in
// float32; when odt is bf16 or f16, n is rounded to odt before the product
// and the product rounded again (HF LlamaRMSNorm in a bf16 model:
// weight * hidden.to(bf16)). w has H elements of wdt (GGUF norms are f32);
// out is T×H of odt. x and out must not overlap unless they are the same
// f32 buffer.
func (s *Set) RMSNorm(x, w device.Ptr, wdt string, out device.Ptr, odt string, T, H uint32, eps float32, st device.Stream) error {
	return s.rmsnorm(x, 0, F32, w, wdt, out, odt, T, H, eps, st)
}

// ResidualRMSNorm is the residual add and the norm after it in one launch:
// per row t < T, x[t, i] = rdt(x[t, i] + rdt(y[t, i])) (rdt rounds to that
// dtype; "f32" rounds nothing) is written back to x, then out = RMSNorm(x)
// as RMSNorm computes it. x, out and the result equal Round(y, rdt),
// Add(x, y), Round(x, rdt), RMSNorm(x, w, wdt, out, odt) bit for bit,
// except that y is left unrounded. y is T×H float32 and must not overlap x
// or out.
func (s *Set) ResidualRMSNorm(x, y device.Ptr, rdt string, w device.Ptr, wdt string, out device.Ptr, odt string, T, H uint32, eps float32, st device.Stream) error {
	if err := checkPtr(NameRMSNorm, "y", y, 4); err != nil {
		return err
	}
	return s.rmsnorm(x, y, rdt, w, wdt, out, odt, T, H, eps, st)
}

// rmsnorm is RMSNorm, after the residual when y is not 0.
func (s *Set) rmsnorm(x, y device.Ptr, rdt string, w device.Ptr, wdt string, out device.Ptr, odt string, T, H uint32, eps float32, st device.Stream) error {
	rc, err := dtCode(rdt)
	if err != nil {
		return fmt.Errorf("kernels: %s: residual: %w", NameRMSNorm, err)
	}
	wc, err := dtCode(wdt)
	if err != nil {
		return fmt.Errorf("kernels: %s: weight: %w", NameRMSNorm, err)
	}
	oc, err := dtCode(odt)
	if err != nil {
		return fmt.Errorf("kernels: %s: output: %w", NameRMSNorm, err)
	}
	if T == 0 {
		return nil
	}
	if H == 0 || !(eps >= 0) || math.IsInf(float64(eps), 0) {
		return fmt.Errorf("kernels: %s: H = %d, eps = %g: %w", NameRMSNorm, H, eps, ErrShape)
	}
	we, _ := ElemSize(wdt)
	oe, _ := ElemSize(odt)
	if err := errors.Join(checkPtr(NameRMSNorm, "x", x, 4), checkPtr(NameRMSNorm, "w", w, uint64(we)),
		checkPtr(NameRMSNorm, "out", out, uint64(oe))); err != nil {
		return err
	}
	return s.launch(NameRMSNorm, s.llama.rmsnorm, s.rowGrid(T), st, x, w, wc, out, oc, T, H, eps, y, rc)
}

// RoPE rotates x (T×nHeads×headDim float32, in place) by position: pair i
// < headDim/2 of every head of row t turns by angle pos[t]·invFreq[i]
// (float32 product; cos and sin in float32, then a·cos − b·sin and
// b·cos + a·sin in float32). interleaved false pairs (i, i + headDim/2), HF's
// rotate_half; true pairs (2i, 2i+1), GGUF's layout. pos is T int32,
// invFreq headDim/2 float32 computed on the host (Llama-3 frequency scaling
// and any attention scaling folded in there). headDim must be even.
//
// HF computes cos and sin in float32 too, then rounds them to the model
// dtype and does the products in it: RoPEIn does that.
func (s *Set) RoPE(x, pos device.Ptr, T, nHeads, headDim uint32, invFreq device.Ptr, interleaved bool, st device.Stream) error {
	return s.RoPEIn(x, pos, T, nHeads, headDim, invFreq, interleaved, F32, st)
}

// RoPEIn is RoPE computed in dtype dt, in HF's order for a model of that
// dtype (LlamaRotaryEmbedding and apply_rotary_pos_emb): the angle and its
// cos and sin in float32 as in RoPE, then x, cos and sin rounded to dt and
// q·cos + rotate_half(q)·sin with every product and the sum rounded to dt
// (RopePairIn is the math). dt f32 is RoPE. x stays float32 in memory,
// holding dt values.
func (s *Set) RoPEIn(x, pos device.Ptr, T, nHeads, headDim uint32, invFreq device.Ptr, interleaved bool, dt string, st device.Stream) error {
	rc, err := dtCode(dt)
	if err != nil {
		return fmt.Errorf("kernels: %s: %w", NameRoPE, err)
	}
	if T == 0 {
		return nil
	}
	if nHeads == 0 || headDim == 0 || headDim%2 != 0 {
		return fmt.Errorf("kernels: %s: nHeads = %d, headDim = %d (want > 0 and even): %w", NameRoPE, nHeads, headDim, ErrShape)
	}
	if err := errors.Join(checkPtr(NameRoPE, "x", x, 4), checkPtr(NameRoPE, "pos", pos, 4),
		checkPtr(NameRoPE, "invFreq", invFreq, 4)); err != nil {
		return err
	}
	flags := rc << 1
	if interleaved {
		flags |= 1
	}
	n := uint64(T) * uint64(nHeads) * uint64(headDim/2)
	return s.launch(NameRoPE, s.llama.rope, s.gridFor(n), st, x, pos, invFreq, T, nHeads, headDim, flags)
}

// RoPEGGUF is RoPEIn with interleaved false of Q or K rows in GGUF's order:
// src (T×nHeads×headDim float32) holds each head's HF elements i and
// i + headDim/2 at 2i and 2i+1, as llama.cpp's permutation of the Q and K
// weight rows leaves them; dst gets the rotated head in HF's order. The
// same bits as permuting src into HF's order and then RoPEIn(dst, ...,
// false, dt), in one launch. src is 8-byte aligned and does not overlap
// dst. A Set whose module lacks the kernel (HasRoPEGGUF false) refuses it
// with device.ErrUnsupported.
func (s *Set) RoPEGGUF(src, dst, pos device.Ptr, T, nHeads, headDim uint32, invFreq device.Ptr, dt string, st device.Stream) error {
	const k = NameRoPEGGUF
	rc, err := dtCode(dt)
	if err != nil {
		return fmt.Errorf("kernels: %s: %w", k, err)
	}
	if !s.HasRoPEGGUF() {
		return fmt.Errorf("kernels: %s: not in %s (rebuild with scripts/build-ptx.sh) or turned off: %w", k, s.source, device.ErrUnsupported)
	}
	if T == 0 {
		return nil
	}
	if nHeads == 0 || headDim == 0 || headDim%2 != 0 {
		return fmt.Errorf("kernels: %s: nHeads = %d, headDim = %d (want > 0 and even): %w", k, nHeads, headDim, ErrShape)
	}
	n := uint64(T) * uint64(nHeads) * uint64(headDim)
	if uint64(src) < uint64(dst)+4*n && uint64(dst) < uint64(src)+4*n {
		return fmt.Errorf("kernels: %s: src %#x and dst %#x overlap over %d bytes: %w", k, uint64(src), uint64(dst), 4*n, ErrShape)
	}
	if err := errors.Join(checkPtr(k, "src", src, 8), checkPtr(k, "dst", dst, 4), checkPtr(k, "pos", pos, 4),
		checkPtr(k, "invFreq", invFreq, 4)); err != nil {
		return err
	}
	return s.launch(k, s.extra[k], s.gridFor(n/2), st, src, dst, pos, invFreq, T, nHeads, headDim, rc<<1)
}

// HasRoPEGGUF reports whether the Set runs RoPEGGUF: its module has
// memwall_rope_gguf (PTX built from this kernels.cu, or the Go twin) and
// SetRoPEGGUF(false) was not called.
func (s *Set) HasRoPEGGUF() bool {
	_, ok := s.extra[NameRoPEGGUF]
	return ok && !s.ropeOff
}

// SetRoPEGGUF turns RoPEGGUF off (false) or back on where the module has
// it, so that the path it replaces can be compared with it.
func (s *Set) SetRoPEGGUF(on bool) { s.ropeOff = !on }

// resolveExtra looks ExtraNames up: on the simulator and the CPU (all)
// every name is tried, elsewhere only those the PTX declares.
func (s *Set) resolveExtra(ptx []byte, all bool, get func(string) (device.Function, error)) {
	s.extra = map[string]device.Function{}
	entries := PTXEntries(ptx)
	for _, name := range ExtraNames() {
		if !all && !slices.Contains(entries, name) {
			continue
		}
		if f, err := get(name); err == nil {
			s.extra[name] = f
		}
	}
}

// SiluMul queues out[i] = odt(silu(g[i])·u[i]) for i < n, g and u float32;
// when odt is bf16 or f16, silu(g[i]) is rounded to odt before the product
// (HF: act_fn(gate) * up, each a bf16 tensor; round g and u to the model
// dtype first, with Round, to match it fully). n == 0 launches nothing.
func (s *Set) SiluMul(g, u, out device.Ptr, odt string, n uint64, st device.Stream) error {
	return s.SiluMulIn(g, u, F32, out, odt, n, st)
}

// SiluMulIn is SiluMul with g and u rounded to rdt first ("f32": not at
// all): the same bits as Round(g, rdt), Round(u, rdt), SiluMul(g, u, out,
// odt, n), except that g and u in memory stay unrounded. One launch instead
// of three.
func (s *Set) SiluMulIn(g, u device.Ptr, rdt string, out device.Ptr, odt string, n uint64, st device.Stream) error {
	rc, err := dtCode(rdt)
	if err != nil {
		return fmt.Errorf("kernels: %s: rounding: %w", NameSiluMul, err)
	}
	oc, err := dtCode(odt)
	if err != nil {
		return fmt.Errorf("kernels: %s: %w", NameSiluMul, err)
	}
	if n == 0 {
		return nil
	}
	oe, _ := ElemSize(odt)
	if err := errors.Join(checkPtr(NameSiluMul, "g", g, 4), checkPtr(NameSiluMul, "u", u, 4),
		checkPtr(NameSiluMul, "out", out, uint64(oe))); err != nil {
		return err
	}
	return s.launch(NameSiluMul, s.llama.silumul, s.gridFor(n), st, g, u, out, oc, rc, n)
}

// Add queues x[i] += y[i] for i < n, float32 (the residual stream). Follow
// it with Round to keep the residual in the model dtype as HF does.
func (s *Set) Add(x, y device.Ptr, n uint64, st device.Stream) error {
	if n == 0 {
		return nil
	}
	if err := errors.Join(checkPtr(NameAdd, "x", x, 4), checkPtr(NameAdd, "y", y, 4)); err != nil {
		return err
	}
	return s.launch(NameAdd, s.llama.add, s.gridFor(n), st, x, y, n)
}

// Cast queues out[i] = odt(x[i]) for i < n: float32 to bf16/f16 (round to
// nearest even) or a float32 copy. It makes a Matmul's X from activations.
func (s *Set) Cast(x, out device.Ptr, odt string, n uint64, st device.Stream) error {
	oc, err := dtCode(odt)
	if err != nil {
		return fmt.Errorf("kernels: %s: %w", NameCast, err)
	}
	if n == 0 {
		return nil
	}
	oe, _ := ElemSize(odt)
	if err := errors.Join(checkPtr(NameCast, "x", x, 4), checkPtr(NameCast, "out", out, uint64(oe))); err != nil {
		return err
	}
	return s.launch(NameCast, s.llama.cast, s.gridFor(n), st, x, out, oc, n)
}

// Round queues x[i] = float32(dtype(x[i])) for i < n, in place: float32
// values rounded (nearest even) to bf16 or f16 precision, so an engine can
// keep activations at the model dtype's precision between ops like HF does.
// dtype f32 leaves x as it is (nothing is launched).
func (s *Set) Round(x device.Ptr, dtype string, n uint64, st device.Stream) error {
	c, err := dtCode(dtype)
	if err != nil {
		return fmt.Errorf("kernels: %s: %w", NameRound, err)
	}
	if n == 0 || c == codeF32 {
		return nil
	}
	if err := checkPtr(NameRound, "x", x, 4); err != nil {
		return err
	}
	return s.launch(NameRound, s.llama.round, s.gridFor(n), st, x, c, n)
}

// KVWrite queues the K and V rows of T tokens (k and v: T×KVHeads×HeadDim
// float32) into layer of the paged cache at positions start..start+T−1,
// converted to L.DType (round to nearest even). table holds int32 block ids,
// at least ceil((start+T)/BlockTokens) of them. T == 0 launches nothing.
func (s *Set) KVWrite(k, v, cache, table device.Ptr, start, T uint32, L KVLayout, layer uint32, st device.Stream) error {
	if err := L.Validate(); err != nil {
		return fmt.Errorf("kernels: %s: %w", NameKVWrite, err)
	}
	if T == 0 {
		return nil
	}
	if err := checkPositions(NameKVWrite, start, T, L, layer); err != nil {
		return err
	}
	elt, _ := ElemSize(L.DType)
	if err := errors.Join(checkPtr(NameKVWrite, "k", k, 4), checkPtr(NameKVWrite, "v", v, 4),
		checkPtr(NameKVWrite, "cache", cache, uint64(elt)), checkPtr(NameKVWrite, "table", table, 4)); err != nil {
		return err
	}
	c, _ := dtCode(L.DType)
	n := uint64(T) * uint64(L.KVHeads) * uint64(L.HeadDim)
	return s.launch(NameKVWrite, s.llama.kvwrite, s.gridFor(n), st,
		k, v, cache, table, start, T, L.BlockTokens, L.KVHeads, L.HeadDim, layer, c, L.BlockBytes)
}

func checkPositions(kernel string, start, T uint32, L KVLayout, layer uint32) error {
	if layer >= L.Layers {
		return fmt.Errorf("kernels: %s: layer %d of %d: %w", kernel, layer, L.Layers, ErrShape)
	}
	if uint64(start)+uint64(T) > math.MaxInt32 {
		return fmt.Errorf("kernels: %s: positions %d+%d exceed int32: %w", kernel, start, T, ErrShape)
	}
	return nil
}

// AttnPlan is how Attention launches: grid (KVHeads·⌈group/8⌉, T, Splits)
// blocks of 256 threads, each split covering Chunk cached positions; with
// Splits > 1 the partials (ScratchBytes) are merged by a second kernel.
type AttnPlan struct {
	Grid         device.Dim3
	Chunk        uint32
	Splits       uint32
	ScratchBytes uint64
}

// PlanAttention returns the launch Attention uses on a GPU of sms
// multiprocessors: one split when the (kv head, token) blocks already fill
// the GPU or the context is short; else the context is split so about four
// blocks per multiprocessor run (flash-decoding), each split at least
// 128 positions, at most 1024 splits and 64 MiB of partials.
func PlanAttention(start, T, nHeads, kvHeads, headDim, sms uint32) AttnPlan {
	groups := ceilDiv(nHeads/kvHeads, attnHeads)
	ctx := uint64(start) + uint64(T)
	splits, chunk := attnSplits(ctx, attnSplitCap(T, nHeads, kvHeads, headDim, sms))
	p := AttnPlan{Grid: device.Dim3{X: kvHeads * groups, Y: T, Z: uint32(splits)}, Chunk: uint32(chunk), Splits: uint32(splits)}
	if splits > 1 {
		p.ScratchBytes = attnPartBytes(T, nHeads, headDim, splits)
	}
	return p
}

// attnSplitCap is the most splits one attention launch of T tokens takes,
// whatever the context: 1 when the (kv head, token) blocks already fill the
// GPU (four per multiprocessor), else the splits that would fill it, at
// most maxSplits and maxScratch of partials. The _at kernels take it as an
// argument and apply attnSplits on the device.
func attnSplitCap(T, nHeads, kvHeads, headDim, sms uint32) uint64 {
	groups := ceilDiv(nHeads/kvHeads, attnHeads)
	base := uint64(kvHeads) * uint64(groups) * uint64(T)
	want := 4 * uint64(max(sms, 1))
	if base >= want {
		return 1
	}
	per := uint64(T) * uint64(nHeads) * (uint64(headDim) + 2) * 4
	return max(1, min((want+base-1)/base, maxSplits, maxScratch/per))
}

// attnSplits splits a context of ctx positions under cap (attnSplitCap):
// one split up to minChunk positions, else up to cap splits of at least
// minChunk positions each, the chunk rounded up and the splits recounted
// so that none is empty. kernels.cu's attn_at_args is the same rule.
func attnSplits(ctx, cap uint64) (splits, chunk uint64) {
	splits = 1
	if cap > 1 && ctx > minChunk {
		splits = min(cap, (ctx+minChunk-1)/minChunk)
	}
	chunk = (ctx + splits - 1) / splits
	return (ctx + chunk - 1) / chunk, chunk
}

// attnPartBytes is the partials of T tokens' nHeads heads over splits.
func attnPartBytes(T, nHeads, headDim uint32, splits uint64) uint64 {
	return uint64(T) * uint64(nHeads) * splits * (uint64(headDim) + 2) * 4
}

// Attention queues grouped-query attention of T query tokens at positions
// start..start+T−1 against layer of the paged cache: query head h (of
// nHeads; q is T×nHeads×HeadDim float32) uses kv head h/(nHeads/KVHeads)
// and attends causally to positions 0..start+t, read through table (int32
// block ids, ⌈(start+T)/BlockTokens⌉ of them). Scores are scale·q·k in
// float32, softmax in float32, and out (T×nHeads×HeadDim) is written in
// odt. The rows of the current tokens must already be in the cache
// (KVWrite). Long contexts with few tokens are split across blocks
// (PlanAttention); the partials live in scratch memory the Set allocates per
// stream and keeps until Close.
func (s *Set) Attention(q, cache, table device.Ptr, start, T, nHeads uint32, L KVLayout, layer uint32, scale float32, out device.Ptr, odt string, st device.Stream) error {
	if err := L.Validate(); err != nil {
		return fmt.Errorf("kernels: %s: %w", NameAttn, err)
	}
	oc, err := dtCode(odt)
	if err != nil {
		return fmt.Errorf("kernels: %s: output: %w", NameAttn, err)
	}
	if T == 0 {
		return nil
	}
	if nHeads == 0 || nHeads%L.KVHeads != 0 {
		return fmt.Errorf("kernels: %s: %d query heads for %d kv heads (want a multiple): %w", NameAttn, nHeads, L.KVHeads, ErrShape)
	}
	if T > maxGridY {
		return fmt.Errorf("kernels: %s: T = %d exceeds %d: %w", NameAttn, T, maxGridY, ErrShape)
	}
	if err := checkPositions(NameAttn, start, T, L, layer); err != nil {
		return err
	}
	if math.IsNaN(float64(scale)) || math.IsInf(float64(scale), 0) {
		return fmt.Errorf("kernels: %s: scale %g: %w", NameAttn, scale, ErrShape)
	}
	elt, _ := ElemSize(L.DType)
	oe, _ := ElemSize(odt)
	if err := errors.Join(checkPtr(NameAttn, "q", q, 4), checkPtr(NameAttn, "cache", cache, uint64(elt)),
		checkPtr(NameAttn, "table", table, 4), checkPtr(NameAttn, "out", out, uint64(oe))); err != nil {
		return err
	}
	c, _ := dtCode(L.DType)
	if s.useFlash(T, nHeads, L, q, cache) {
		grid := device.Dim3{X: ceilDiv(T, flashRows), Y: nHeads, Z: 1}
		if err := s.launchK(s.llama.flash, grid, device.Dim3{X: flashThreads, Y: 1, Z: 1}, 0, st, q, cache, table, start, T, nHeads,
			L.KVHeads, L.HeadDim, L.BlockTokens, layer, c, L.BlockBytes, scale, uint32(0), device.Ptr(0), out, oc); err != nil {
			return fmt.Errorf("kernels: %s: %w", NameAttnFlash, err)
		}
		return nil
	}
	p := PlanAttention(start, T, nHeads, L.KVHeads, L.HeadDim, s.sms)
	var part device.Ptr
	if p.Splits > 1 {
		if part, err = s.scratchFor(st, p.ScratchBytes); err != nil {
			return fmt.Errorf("kernels: %s: %w", NameAttn, err)
		}
	}
	f := s.llama.attnFunc(L.HeadDim)
	if !s.decodeOff && useDecode(T, nHeads, L, cache) {
		f = s.llama.decode
	}
	if err := s.launchK(f, p.Grid, blockDim(), 0, st, q, cache, table, start, T, nHeads,
		L.KVHeads, L.HeadDim, L.BlockTokens, layer, c, L.BlockBytes, scale, p.Chunk, part, out, oc); err != nil {
		return fmt.Errorf("kernels: %s: %w", NameAttn, err)
	}
	if p.Splits == 1 {
		return nil
	}
	rows := T * nHeads
	return s.launch(NameAttnCombine, s.llama.combine, s.rowGrid(rows), st, part, out, oc, rows, L.HeadDim, p.Splits)
}

// useFlash reports whether Attention runs the tensor-core prefill kernel:
// enabled on the Set (FlashAttention), at least 16 tokens, head dim 64 or
// 128, a bf16 or f16 cache with 16-byte aligned rows and blocks, q 16-byte
// aligned (it is read as float4).
func (s *Set) useFlash(T, nHeads uint32, L KVLayout, q, cache device.Ptr) bool {
	return s.flash && T >= flashMinT && (L.HeadDim == 64 || L.HeadDim == 128) &&
		(L.DType == BF16 || L.DType == F16) && cache%16 == 0 && q%16 == 0 && L.BlockBytes%16 == 0 &&
		nHeads <= maxGridY
}

// useDecode reports whether Attention runs memwall_attn_decode (lanes over
// positions) rather than memwall_attn_e*: at most decodeMaxT tokens, at most
// 8 query heads per kv head, head dim 64 or 128, a bf16 or f16 cache with
// 16-byte aligned rows.
func useDecode(T, nHeads uint32, L KVLayout, cache device.Ptr) bool {
	return T <= decodeMaxT && nHeads/L.KVHeads <= attnHeads && (L.HeadDim == 64 || L.HeadDim == 128) &&
		(L.DType == BF16 || L.DType == F16) && cache%16 == 0 && L.BlockBytes%16 == 0
}

// FlashAttention reports whether Attention runs prefill (T ≥ 16, head dim
// 64 or 128, bf16/f16 cache) on the tensor-core kernel memwall_attn_flash:
// true on GPUs of compute capability 8.0 and newer with a compute_80 or
// newer module (and on the simulator), unless MEMWALL_KERNELS_FLASH=0 was
// set at Load or SetFlashAttention(false) was called. That kernel rounds
// q and the softmax weights to the cache dtype for its products (as HF's
// bf16 attention does); the split kernel keeps them in float32.
func (s *Set) FlashAttention() bool { return s.flash }

// SetFlashAttention turns the flash prefill kernel off, or back on where the
// module and GPU support it. It must not race with Attention calls.
func (s *Set) SetFlashAttention(on bool) { s.flash = on && s.flashOK }

// scratchBuf is device memory for attention partials.
type scratchBuf struct {
	p    device.Ptr
	size uint64
}

// scratchFor returns at least n bytes of scratch for stream st, growing it
// (the old buffer is freed; Free waits for work still using it).
func (s *Set) scratchFor(st device.Stream, n uint64) (device.Ptr, error) {
	s.scratchMu.Lock()
	defer s.scratchMu.Unlock()
	b := s.scratch[st]
	if b.size >= n {
		return b.p, nil
	}
	if b.p != 0 {
		if err := s.d.Free(b.p); err != nil {
			return 0, fmt.Errorf("free scratch: %w", err)
		}
		delete(s.scratch, st)
	}
	size := max(n, 1<<20)
	p, err := s.d.Alloc(size)
	if err != nil {
		return 0, fmt.Errorf("scratch of %d bytes: %w", size, err)
	}
	s.scratch[st] = scratchBuf{p: p, size: size}
	return p, nil
}

func (s *Set) freeScratch() error {
	s.scratchMu.Lock()
	defer s.scratchMu.Unlock()
	var err error
	for st, b := range s.scratch {
		if ferr := s.d.Free(b.p); ferr != nil {
			err = errors.Join(err, fmt.Errorf("kernels: free scratch: %w", ferr))
		}
		delete(s.scratch, st)
	}
	return err
}

// GemmWorkspaceBytes is the device memory the matrix library holds per
// stream that ran a prefill product (cuBLASLt's workspace: 32 MiB, kept for
// the device's life, outside any pool), or 0 with memwall's GEMM.
func (s *Set) GemmWorkspaceBytes() uint64 {
	if w, ok := s.gemmLib.(interface{ GemmWorkspaceBytes() uint64 }); ok {
		return w.GemmWorkspaceBytes()
	}
	return 0
}

// WarmUpMatmul runs one product of each shape ({M, K, T}, in dtype) through
// Matmul on st, on temporary buffers, and waits for it: what a first
// prefill would otherwise load lazily — the matrix library's plan for each
// shape, the stream's workspace (GemmWorkspaceBytes) and the library's
// kernel modules (CUDA loads them on first use) — is then resident, so
// memory measured afterwards includes it. The temporary buffers, freed
// before it returns, take the largest shape's (M·K + T·K)·elt + 4·T·M
// bytes. The library itself is loaded at Load.
func (s *Set) WarmUpMatmul(dtype string, shapes [][3]uint32, st device.Stream) error {
	elt, err := ElemSize(dtype)
	if err != nil {
		return fmt.Errorf("kernels: warm up: %w", err)
	}
	var w, x, y uint64
	for _, sh := range shapes {
		M, K, T := uint64(sh[0]), uint64(sh[1]), uint64(sh[2])
		w, x, y = max(w, M*K*uint64(elt)), max(x, T*K*uint64(elt)), max(y, 4*T*M)
	}
	if len(shapes) == 0 {
		return nil
	}
	var bufs []device.Ptr
	defer func() {
		for _, p := range bufs {
			s.d.Free(p)
		}
	}()
	ptrs := make([]device.Ptr, 3)
	for i, n := range []uint64{w, x, y} {
		p, err := s.d.Alloc(max(n, 256))
		if err != nil {
			return fmt.Errorf("kernels: warm up: %w", err)
		}
		bufs = append(bufs, p)
		ptrs[i] = p
		if err := s.d.Memset8(p, 0, max(n, 256), st); err != nil {
			return fmt.Errorf("kernels: warm up: %w", err)
		}
	}
	for _, sh := range shapes {
		if err := s.Matmul(dtype, ptrs[0], ptrs[1], ptrs[2], sh[0], sh[1], sh[2], st); err != nil {
			return fmt.Errorf("kernels: warm up: %w", err)
		}
	}
	if err := s.d.StreamSynchronize(st); err != nil {
		return fmt.Errorf("kernels: warm up: %w", err)
	}
	return nil
}
