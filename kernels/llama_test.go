package kernels

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/sim"
)

// rig runs kernels of one Set on one device and moves data in and out.
type rig struct {
	t  testing.TB
	d  device.Device
	s  *Set
	st device.Stream
}

func newRig(t testing.TB, d device.Device, s *Set) *rig {
	st, err := d.NewStream()
	must(t, err)
	t.Cleanup(func() { d.DestroyStream(st) })
	return &rig{t: t, d: d, s: s, st: st}
}

func (r *rig) upload(b []byte) device.Ptr {
	r.t.Helper()
	p := alloc(r.t, r.d, uint64(len(b)))
	if len(b) > 0 {
		must(r.t, r.d.CopyHtoD(p, b, r.st))
		must(r.t, r.d.StreamSynchronize(r.st))
	}
	return p
}

func (r *rig) f32(v []float32) device.Ptr { return r.upload(f32Bytes(v)) }

// uploadAt copies b to off bytes past the start of a new allocation and
// returns that address.
func (r *rig) uploadAt(b []byte, off int) device.Ptr {
	r.t.Helper()
	p := alloc(r.t, r.d, uint64(len(b)+off)) + device.Ptr(off)
	if len(b) > 0 {
		must(r.t, r.d.CopyHtoD(p, b, r.st))
		must(r.t, r.d.StreamSynchronize(r.st))
	}
	return p
}

func (r *rig) i32(v []int32) device.Ptr {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return r.upload(b)
}

// zeros returns n bytes of device memory filled with NaN patterns (0xFF),
// so unwritten outputs show.
func (r *rig) nans(n uint64) device.Ptr {
	p := alloc(r.t, r.d, n)
	must(r.t, r.d.Memset8(p, 0xFF, n, r.st))
	return p
}

func (r *rig) read(p device.Ptr, n uint64) []byte {
	r.t.Helper()
	b := make([]byte, n)
	must(r.t, r.d.CopyDtoH(b, p, r.st))
	must(r.t, r.d.StreamSynchronize(r.st))
	return b
}

// readDT reads n elements of dtype at p as float32.
func (r *rig) readDT(dt string, p device.Ptr, n int) []float32 {
	elt, _ := ElemSize(dt)
	out, err := Decode(dt, r.read(p, uint64(n*elt)))
	must(r.t, err)
	return out
}

func f32Bytes(v []float32) []byte {
	b, _ := Encode(F32, v)
	return b
}

func randF32(rng *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * scale)
	}
	return v
}

// relErr is ‖got − want‖₂ / ‖want‖₂ (absolute when ‖want‖ = 0; +Inf when a
// value is not finite or the lengths differ).
func relErr(got []float32, want []float64) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var num, den float64
	for i, w := range want {
		d := float64(got[i]) - w
		if math.IsNaN(d) || math.IsInf(d, 0) {
			return math.Inf(1)
		}
		num += d * d
		den += w * w
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

func relErr32(got, want []float32) float64 {
	w := make([]float64, len(want))
	for i, v := range want {
		w[i] = float64(v)
	}
	return relErr(got, w)
}

// llamaCase is one randomized kernel run: run queues it on a rig and
// returns its output; ref is the float64 reference (with the roundings the
// contract names) and tol the relative error allowed against it.
type llamaCase struct {
	kernel, name string
	run          func(r *rig) []float32
	ref          []float64
	tol          float64
	odt          string // attention: the output dtype
}

func tolFor(dt string, f32 float64) float64 {
	switch dt {
	case BF16:
		return 1e-2
	case F16:
		return 2e-3
	}
	return f32
}

func pick[T any](rng *rand.Rand, v ...T) T { return v[rng.IntN(len(v))] }

// roundRef rounds a float64 to dtype through float32, as the kernels store.
func roundRef(dt string, v float64) float64 { return float64(RoundTo(dt, float32(v))) }

func embedCase(rng *rand.Rand) llamaCase {
	wdt := pick(rng, DTypes()...)
	V, H, T := 1+rng.IntN(50), 1+rng.IntN(300), 1+rng.IntN(20)
	tab, _ := Encode(wdt, randF32(rng, V*H, 1))
	ids := make([]int32, T)
	ref := make([]float64, 0, T*H)
	dec, _ := Decode(wdt, tab)
	for t := range ids {
		ids[t] = int32(rng.IntN(V))
		for i := range H {
			ref = append(ref, float64(dec[int(ids[t])*H+i]))
		}
	}
	return llamaCase{kernel: "embed", name: fmt.Sprintf("%s V=%d H=%d T=%d", wdt, V, H, T), ref: ref, tol: 0,
		run: func(r *rig) []float32 {
			out := r.nans(uint64(4 * T * H))
			must(r.t, r.s.Embed(r.upload(tab), wdt, r.i32(ids), out, uint32(T), uint32(H), r.st))
			return r.readDT(F32, out, T*H)
		}}
}

func rmsnormCase(rng *rand.Rand) llamaCase { return rmsnormCaseH(rng, 1+rng.IntN(2000)) }

// rmsnormCaseH is rmsnormCase with H given (the kernel keeps rows of up to
// 4096 elements in registers and loops over longer ones).
func rmsnormCaseH(rng *rand.Rand, H int) llamaCase {
	wdt, odt := pick(rng, F32, BF16, F16), pick(rng, DTypes()...)
	T := 1 + rng.IntN(9)
	eps := pick(rng, float32(1e-5), float32(1e-6), 0)
	x := randF32(rng, T*H, pick(rng, 0.01, 1, 30))
	wb, _ := Encode(wdt, randF32(rng, H, 1))
	w, _ := Decode(wdt, wb)
	ref := make([]float64, 0, T*H)
	for t := range T {
		var ss float64
		for _, v := range x[t*H : t*H+H] {
			ss += float64(v) * float64(v)
		}
		rs := 1 / math.Sqrt(ss/float64(H)+float64(eps))
		for i, v := range x[t*H : t*H+H] {
			ref = append(ref, roundRef(odt, roundRef(odt, float64(v)*rs)*float64(w[i])))
		}
	}
	return llamaCase{kernel: "rmsnorm", name: fmt.Sprintf("w %s out %s T=%d H=%d", wdt, odt, T, H), ref: ref, tol: tolFor(odt, 1e-5),
		run: func(r *rig) []float32 {
			oe, _ := ElemSize(odt)
			out := r.nans(uint64(oe * T * H))
			must(r.t, r.s.RMSNorm(r.f32(x), r.upload(wb), wdt, out, odt, uint32(T), uint32(H), eps, r.st))
			return r.readDT(odt, out, T*H)
		}}
}

func ropeCase(rng *rand.Rand) llamaCase {
	T, nH, hd := 1+rng.IntN(9), 1+rng.IntN(5), 2*(1+rng.IntN(80))
	il := rng.IntN(2) == 1
	rdt := pick(rng, F32, F32, BF16, F16)
	in := ropeInputs(rng, T, nH, hd, il, rdt)
	kernel := "rope"
	if rdt != F32 {
		kernel = "rope_" + rdt
	}
	return llamaCase{kernel: kernel, name: fmt.Sprintf("T=%d heads=%d dim=%d pos %d interleaved=%v in %s", T, nH, hd, in.pos[0], il, rdt), ref: in.ref, tol: tolFor(rdt, 1e-5),
		run: func(r *rig) []float32 {
			xp := r.f32(in.x)
			must(r.t, r.s.RoPEIn(xp, r.i32(in.pos), uint32(T), uint32(nH), uint32(hd), r.f32(in.inv), il, rdt, r.st))
			return r.readDT(F32, xp, len(in.x))
		}}
}

// ropeGGUFCase is RoPEGGUF against HF-order RoPE's reference: the input is
// a ropeCase input with each head in GGUF's order (HF element i at 2i,
// i + hd/2 at 2i+1), the output in HF's.
func ropeGGUFCase(rng *rand.Rand) llamaCase {
	T, nH, hd := 1+rng.IntN(9), 1+rng.IntN(40), 2*(1+rng.IntN(128))
	rdt := pick(rng, F32, BF16, F16)
	in := ropeInputs(rng, T, nH, hd, false, rdt)
	return llamaCase{kernel: "rope_gguf", name: fmt.Sprintf("T=%d heads=%d dim=%d pos %d in %s", T, nH, hd, in.pos[0], rdt), ref: in.ref, tol: tolFor(rdt, 1e-5),
		run: func(r *rig) []float32 {
			out := r.nans(uint64(4 * len(in.x)))
			must(r.t, r.s.RoPEGGUF(r.f32(ggufOrder(in.x, hd)), out, r.i32(in.pos), uint32(T), uint32(nH), uint32(hd), r.f32(in.inv), rdt, r.st))
			return r.readDT(F32, out, len(in.x))
		}}
}

// ggufOrder lays each head of x (hd elements) out as llama.cpp's Q/K
// permutation leaves it: HF element i at 2i, i + hd/2 at 2i+1.
func ggufOrder(x []float32, hd int) []float32 {
	out := make([]float32, len(x))
	for b := 0; b < len(x); b += hd {
		for i := range hd / 2 {
			out[b+2*i], out[b+2*i+1] = x[b+i], x[b+i+hd/2]
		}
	}
	return out
}

// ropeIn is one RoPE case's input and its float64 reference.
type ropeIn struct {
	x, inv []float32
	pos    []int32
	ref    []float64
}

func ropeInputs(rng *rand.Rand, T, nH, hd int, il bool, rdt string) ropeIn {
	x := randF32(rng, T*nH*hd, 1)
	start := rng.IntN(32000)
	pos := make([]int32, T)
	for t := range pos {
		pos[t] = int32(start + t)
	}
	half := hd / 2
	inv := make([]float32, half)
	for i := range inv {
		inv[i] = float32(math.Pow(500000, -2*float64(i)/float64(hd)))
	}
	ref := make([]float64, len(x))
	for t := range T {
		for h := range nH {
			base := (t*nH + h) * hd
			for i := range half {
				ia, ib := i, i+half
				if il {
					ia, ib = 2*i, 2*i+1
				}
				// The angle is a float32 product, as in HF (inv_freq @ positions in float32).
				ang := float64(float32(pos[t]) * inv[i])
				c, s := math.Cos(ang), math.Sin(ang)
				a, b := float64(x[base+ia]), float64(x[base+ib])
				if rdt == F32 {
					ref[base+ia] = a*c - b*s
					ref[base+ib] = b*c + a*s
					continue
				}
				// HF's order in the model dtype: every value and product rounded.
				r := func(v float64) float64 { return roundRef(rdt, v) }
				c, s, a, b = r(c), r(s), r(a), r(b)
				ref[base+ia] = r(r(a*c) - r(b*s))
				ref[base+ib] = r(r(b*c) + r(a*s))
			}
		}
	}
	return ropeIn{x: x, inv: inv, pos: pos, ref: ref}
}

func siluCase(rng *rand.Rand) llamaCase {
	odt := pick(rng, DTypes()...)
	n := 1 + rng.IntN(5000)
	g, u := randF32(rng, n, 3), randF32(rng, n, 1)
	ref := make([]float64, n)
	for i := range ref {
		gv := float64(g[i])
		ref[i] = roundRef(odt, roundRef(odt, gv/(1+math.Exp(-gv)))*float64(u[i]))
	}
	return llamaCase{kernel: "silumul", name: fmt.Sprintf("%s n=%d", odt, n), ref: ref, tol: tolFor(odt, 1e-6),
		run: func(r *rig) []float32 {
			oe, _ := ElemSize(odt)
			out := r.nans(uint64(oe * n))
			must(r.t, r.s.SiluMul(r.f32(g), r.f32(u), out, odt, uint64(n), r.st))
			return r.readDT(odt, out, n)
		}}
}

// elementCases: Add, Cast and Round are exact.
func elementCases(rng *rand.Rand) []llamaCase {
	n := 1 + rng.IntN(5000)
	x, y := randF32(rng, n, 10), randF32(rng, n, 10)
	sum := make([]float64, n)
	for i := range sum {
		sum[i] = float64(x[i] + y[i])
	}
	cs := []llamaCase{{kernel: "add", name: fmt.Sprintf("n=%d", n), ref: sum, tol: 0,
		run: func(r *rig) []float32 {
			xp := r.f32(x)
			must(r.t, r.s.Add(xp, r.f32(y), uint64(n), r.st))
			return r.readDT(F32, xp, n)
		}}}
	for _, dt := range DTypes() {
		want := make([]float64, n)
		for i := range want {
			want[i] = roundRef(dt, float64(x[i]))
		}
		cs = append(cs, llamaCase{kernel: "cast", name: fmt.Sprintf("%s n=%d", dt, n), ref: want, tol: 0,
			run: func(r *rig) []float32 {
				oe, _ := ElemSize(dt)
				out := r.nans(uint64(oe * n))
				must(r.t, r.s.Cast(r.f32(x), out, dt, uint64(n), r.st))
				return r.readDT(dt, out, n)
			}}, llamaCase{kernel: "round", name: fmt.Sprintf("%s n=%d", dt, n), ref: want, tol: 0,
			run: func(r *rig) []float32 {
				xp := r.f32(x)
				must(r.t, r.s.Round(xp, dt, uint64(n), r.st))
				return r.readDT(F32, xp, n)
			}})
	}
	return cs
}

// attnSetup is a random paged cache, its block table and the K/V rows of
// every position, written through KVWrite in two calls (positions before
// start, then the T current tokens).
type attnSetup struct {
	L              KVLayout
	layer          uint32
	start, T, nH   int
	table          []int32
	nblocks        int // blocks in the cache (more than the table uses)
	k, v, q        []float32
	scale          float32
	odt            string
	cacheBytes     uint64
	kStored, vStor []float32 // k, v rounded to the cache dtype
}

func newAttnSetup(rng *rand.Rand, start, T, kvH, G, hd int, dt string) *attnSetup {
	a := &attnSetup{start: start, T: T, nH: kvH * G, odt: pick(rng, DTypes()...)}
	elt, _ := ElemSize(dt)
	a.L = KVLayout{BlockTokens: uint32(pick(rng, 1, 3, 16, 32, 64)), KVHeads: uint32(kvH), HeadDim: uint32(hd),
		Layers: uint32(1 + rng.IntN(3)), DType: dt}
	a.layer = uint32(rng.IntN(int(a.L.Layers)))
	a.L.BlockBytes = uint64(a.L.Layers)*2*uint64(a.L.BlockTokens)*uint64(kvH*hd*elt) + uint64(pick(rng, 0, 16, 256))
	ctx := start + T
	used := (ctx + int(a.L.BlockTokens) - 1) / int(a.L.BlockTokens)
	a.nblocks = used + 1 + rng.IntN(used+1)
	perm := rng.Perm(a.nblocks)
	for i := range used {
		a.table = append(a.table, int32(perm[i]))
	}
	a.k, a.v = randF32(rng, ctx*kvH*hd, 1), randF32(rng, ctx*kvH*hd, 1)
	a.q = randF32(rng, T*a.nH*hd, 1)
	a.scale = float32(1 / math.Sqrt(float64(hd)))
	a.cacheBytes = uint64(a.nblocks) * a.L.BlockBytes
	for _, v := range a.k {
		a.kStored = append(a.kStored, RoundTo(dt, v))
	}
	for _, v := range a.v {
		a.vStor = append(a.vStor, RoundTo(dt, v))
	}
	return a
}

// ref is the float64 attention of the current tokens.
func (a *attnSetup) ref() []float64 {
	hd, kvH := int(a.L.HeadDim), int(a.L.KVHeads)
	G := a.nH / kvH
	out := make([]float64, 0, a.T*a.nH*hd)
	for t := range a.T {
		n := a.start + t + 1
		for h := range a.nH {
			kh := h / G
			q := a.q[(t*a.nH+h)*hd:][:hd]
			s := make([]float64, n)
			m := math.Inf(-1)
			for p := range n {
				var d float64
				for e, qv := range q {
					d += float64(qv) * float64(a.kStored[(p*kvH+kh)*hd+e])
				}
				s[p] = d * float64(a.scale)
				m = max(m, s[p])
			}
			var l float64
			acc := make([]float64, hd)
			for p := range n {
				w := math.Exp(s[p] - m)
				l += w
				for e := range acc {
					acc[e] += w * float64(a.vStor[(p*kvH+kh)*hd+e])
				}
			}
			for _, v := range acc {
				out = append(out, roundRef(a.odt, v/l))
			}
		}
	}
	return out
}

// write fills the cache through KVWrite and returns cache and table.
func (a *attnSetup) write(r *rig) (cache, table device.Ptr) {
	cache = r.nans(a.cacheBytes)
	table = r.i32(a.table)
	row := int(a.L.KVHeads * a.L.HeadDim)
	for _, part := range [][2]int{{0, a.start}, {a.start, a.start + a.T}} {
		n := part[1] - part[0]
		if n == 0 {
			continue
		}
		k, v := r.f32(a.k[part[0]*row:part[1]*row]), r.f32(a.v[part[0]*row:part[1]*row])
		must(r.t, r.s.KVWrite(k, v, cache, table, uint32(part[0]), uint32(n), a.L, a.layer, r.st))
	}
	return cache, table
}

func (a *attnSetup) name() string {
	return fmt.Sprintf("%s start=%d T=%d heads=%d/%d dim=%d bt=%d layer %d/%d out %s",
		a.L.DType, a.start, a.T, a.nH, a.L.KVHeads, a.L.HeadDim, a.L.BlockTokens, a.layer, a.L.Layers, a.odt)
}

// kvwriteCase checks every byte KVWrite wrote against the address formula,
// computed here from scratch.
func kvwriteCase(rng *rand.Rand) llamaCase {
	dt := pick(rng, DTypes()...)
	a := newAttnSetup(rng, rng.IntN(100), 1+rng.IntN(20), 1+rng.IntN(4), 1, 1+rng.IntN(70), dt)
	elt, _ := ElemSize(dt)
	hd, kvH := int(a.L.HeadDim), int(a.L.KVHeads)
	var want []float64
	var offs []uint64
	for p := range a.start + a.T {
		blk := uint64(a.table[p/int(a.L.BlockTokens)])
		slot := uint64(p % int(a.L.BlockTokens))
		for kv, src := range [][]float32{a.kStored, a.vStor} {
			for h := range kvH {
				off := blk*a.L.BlockBytes + ((uint64(a.layer)*2+uint64(kv))*uint64(a.L.BlockTokens)+slot)*uint64(kvH*hd*elt) + uint64(h*hd*elt)
				for e := range hd {
					offs = append(offs, off+uint64(e*elt))
					want = append(want, float64(src[(p*kvH+h)*hd+e]))
				}
			}
		}
	}
	return llamaCase{kernel: "kvwrite", name: a.name(), ref: want, tol: 0,
		run: func(r *rig) []float32 {
			cache, _ := a.write(r)
			all := r.read(cache, a.cacheBytes)
			got := make([]float32, len(offs))
			for i, o := range offs {
				got[i] = getDT(dt, all[o:], 0)
			}
			// Nothing else was written: count bytes that are not 0xFF outside the rows.
			written := map[uint64]bool{}
			for _, o := range offs {
				for j := range uint64(elt) {
					written[o+j] = true
				}
			}
			for i, b := range all {
				if b != 0xFF && !written[uint64(i)] {
					r.t.Errorf("kvwrite %s: byte %d of the cache written outside every row", a.name(), i)
					break
				}
			}
			return got
		}}
}

// flashEligible: shapes Attention may run on the flash kernel, which rounds
// q and the weights to the cache dtype (bf16: ~3e-3 relative error).
func flashEligible(T, hd int, dt string) bool {
	return T >= flashMinT && (hd == 64 || hd == 128) && (dt == BF16 || dt == F16)
}

func attnCase(rng *rand.Rand, start, T, kvH, G, hd int, dt string) llamaCase {
	a := newAttnSetup(rng, start, T, kvH, G, hd, dt)
	tol := tolFor(a.odt, 2e-5)
	kernel := "attention"
	if flashEligible(T, hd, dt) {
		tol = max(tol, tolFor(dt, 0))
		kernel = "attention_prefill"
	}
	return llamaCase{kernel: kernel, name: a.name(), ref: a.ref(), tol: tol, odt: a.odt,
		run: func(r *rig) []float32 {
			cache, table := a.write(r)
			oe, _ := ElemSize(a.odt)
			n := a.T * a.nH * hd
			out := r.nans(uint64(oe * n))
			must(r.t, r.s.Attention(r.f32(a.q), cache, table, uint32(a.start), uint32(a.T), uint32(a.nH), a.L, a.layer, a.scale, out, a.odt, r.st))
			return r.readDT(a.odt, out, n)
		}}
}

func randomAttnCase(rng *rand.Rand) llamaCase {
	dt := pick(rng, DTypes()...)
	hd := pick(rng, 1+rng.IntN(MaxHeadDim), 32, 64, 128, 128, 256)
	G := pick(rng, 1, 2, 3, 4, 8, 9)
	T := pick(rng, 1, 1, 2, 1+rng.IntN(40))
	start := pick(rng, 0, rng.IntN(300), rng.IntN(3000))
	return attnCase(rng, start, T, 1+rng.IntN(3), G, hd, dt)
}

// llamaCases draws n rounds of every kernel's cases.
func llamaCases(seed uint64, rounds int) []llamaCase {
	rng := rand.New(rand.NewPCG(seed, 7))
	var cs []llamaCase
	for range rounds {
		cs = append(cs, embedCase(rng), rmsnormCase(rng), ropeCase(rng), siluCase(rng), kvwriteCase(rng), randomAttnCase(rng), ropeGGUFCase(rng))
		cs = append(cs, elementCases(rng)...)
	}
	return cs
}

// On the simulator the Go twins must match the float64 references.
func TestSimLlamaKernels(t *testing.T) {
	d := newSim(t)
	s, err := Load(d, nil)
	must(t, err)
	defer s.Close()
	r := newRig(t, d, s)
	rounds := 6
	if testing.Short() {
		rounds = 3
	}
	for _, c := range llamaCases(1, rounds) {
		got := c.run(r)
		e := relErr(got, c.ref)
		if testing.Verbose() {
			t.Logf("%s %s: relative error %.3g", c.kernel, c.name, e)
		}
		if !(e <= c.tol) {
			t.Errorf("%s %s: relative error %.3g exceeds %.0e", c.kernel, c.name, e, c.tol)
		}
	}
}

// Decode and prefill shapes of Llama models, with splits and GQA.
func TestSimAttentionShapes(t *testing.T) {
	d := newSim(t)
	s, err := Load(d, nil)
	must(t, err)
	defer s.Close()
	r := newRig(t, d, s)
	rng := rand.New(rand.NewPCG(3, 3))
	for _, c := range []llamaCase{
		attnCase(rng, 700, 1, 2, 4, 128, BF16),  // decode, split
		attnCase(rng, 2100, 1, 1, 8, 64, F16),   // decode, many splits
		attnCase(rng, 0, 37, 2, 2, 128, BF16),   // prefill from 0
		attnCase(rng, 150, 20, 1, 16, 32, F32),  // prefill after a prefix, two head groups
		attnCase(rng, 1000, 3, 1, 1, 100, BF16), // odd head dim, split
		attnCase(rng, 70, 130, 2, 4, 64, F16),   // flash: three query tiles after a prefix
	} {
		got := c.run(r)
		if e := relErr(got, c.ref); !(e <= c.tol) {
			t.Errorf("%s: relative error %.3g exceeds %.0e", c.name, e, c.tol)
		}
	}
	// The split kernel takes prefill too (flash off): float32 precision.
	if !s.FlashAttention() {
		t.Fatal("the simulator runs the flash twin")
	}
	s.SetFlashAttention(false)
	defer s.SetFlashAttention(true)
	c := attnCase(rng, 33, 40, 2, 4, 128, BF16)
	if e := relErr(c.run(r), c.ref); !(e <= tolFor(c.odt, 2e-5)) {
		t.Errorf("split prefill %s: relative error %.3g", c.name, e)
	}
}

func TestPlanAttention(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for range 2000 {
		kvH := uint32(1 + rng.IntN(16))
		nH := kvH * uint32(1+rng.IntN(16))
		T := uint32(1 + rng.IntN(pick(rng, 4, 100, 5000)))
		start := uint32(rng.IntN(pick(rng, 10, 1000, 40000)))
		hd := uint32(1 + rng.IntN(MaxHeadDim))
		sms := uint32(1 + rng.IntN(200))
		p := PlanAttention(start, T, nH, kvH, hd, sms)
		ctx := uint64(start) + uint64(T)
		if p.Splits == 0 || p.Splits > maxSplits || uint64(p.Chunk)*uint64(p.Splits) < ctx ||
			uint64(p.Chunk)*uint64(p.Splits-1) >= ctx {
			t.Fatalf("plan %+v for start %d T %d: splits do not tile the context", p, start, T)
		}
		if p.Grid.Z != p.Splits || p.Grid.Y != T || p.Grid.X != kvH*ceilDiv(nH/kvH, attnHeads) {
			t.Fatalf("plan %+v: grid", p)
		}
		if p.ScratchBytes > maxScratch || (p.Splits > 1) != (p.ScratchBytes > 0) {
			t.Fatalf("plan %+v: scratch", p)
		}
		if p.Splits > 1 && p.Chunk < minChunk/2 {
			t.Fatalf("plan %+v: chunk under %d", p, minChunk/2)
		}
	}
	// A 32k decode of an 8-kv-head model fills an H200.
	if p := PlanAttention(32767, 1, 32, 8, 128, 132); p.Grid.X*p.Grid.Y*p.Grid.Z < 2*132 {
		t.Errorf("32k decode plan %+v leaves the GPU idle", p)
	}
}

func TestLlamaArgumentErrors(t *testing.T) {
	d := newSim(t)
	s, err := Load(d, nil)
	must(t, err)
	defer s.Close()
	st, err := d.NewStream()
	must(t, err)
	p := alloc(t, d, 1<<16)
	L := KVLayout{BlockTokens: 16, KVHeads: 2, HeadDim: 64, Layers: 2, DType: BF16, BlockBytes: 2 * 2 * 16 * 2 * 64 * 2}
	odd := p + 1
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"embed dtype", s.Embed(p, "f8", p, p, 1, 1, st), ErrDType},
		{"embed H=0", s.Embed(p, BF16, p, p, 1, 0, st), ErrShape},
		{"embed misaligned out", s.Embed(p, BF16, p, odd, 1, 4, st), device.ErrInvalid},
		{"rmsnorm odt", s.RMSNorm(p, p, F32, p, "q4", 1, 8, 1e-5, st), ErrDType},
		{"rmsnorm eps", s.RMSNorm(p, p, F32, p, F32, 1, 8, float32(math.NaN()), st), ErrShape},
		{"rmsnorm null x", s.RMSNorm(0, p, F32, p, F32, 1, 8, 1e-5, st), device.ErrInvalid},
		{"rope odd dim", s.RoPE(p, p, 1, 1, 7, p, false, st), ErrShape},
		{"rope misaligned", s.RoPE(p+2, p, 1, 1, 8, p, false, st), device.ErrInvalid},
		{"rope gguf overlap", s.RoPEGGUF(p, p+64, p, 1, 2, 64, p, F32, st), ErrShape},
		{"rope gguf odd dim", s.RoPEGGUF(p, p+4096, p, 1, 1, 7, p, F32, st), ErrShape},
		{"rope gguf misaligned src", s.RoPEGGUF(p+4, p+4096, p, 1, 1, 8, p, F32, st), device.ErrInvalid},
		{"rope gguf dtype", s.RoPEGGUF(p, p+4096, p, 1, 1, 8, p, "q4", st), ErrDType},
		{"silumul odt", s.SiluMul(p, p, p, "x", 4, st), ErrDType},
		{"silumul misaligned", s.SiluMul(p, odd, p, F32, 4, st), device.ErrInvalid},
		{"add null", s.Add(p, 0, 4, st), device.ErrInvalid},
		{"cast dtype", s.Cast(p, p, "", 4, st), ErrDType},
		{"round dtype", s.Round(p, "f64", 4, st), ErrDType},
		{"round misaligned", s.Round(odd, BF16, 4, st), device.ErrInvalid},
		{"kvwrite layer", s.KVWrite(p, p, p, p, 0, 1, L, 2, st), ErrShape},
		{"kvwrite layout", s.KVWrite(p, p, p, p, 0, 1, KVLayout{BlockTokens: 16, KVHeads: 2, HeadDim: 64, Layers: 2, DType: BF16, BlockBytes: 10}, 0, st), ErrShape},
		{"kvwrite dtype", s.KVWrite(p, p, p, p, 0, 1, KVLayout{BlockTokens: 1, KVHeads: 1, HeadDim: 1, Layers: 1, DType: "i8", BlockBytes: 10}, 0, st), ErrDType},
		{"attention heads", s.Attention(p, p, p, 0, 1, 3, L, 0, 1, p, F32, st), ErrShape},
		{"attention head dim", s.Attention(p, p, p, 0, 1, 2, KVLayout{BlockTokens: 1, KVHeads: 1, HeadDim: 257, Layers: 1, DType: F32, BlockBytes: 1 << 20}, 0, 1, p, F32, st), ErrShape},
		{"attention positions", s.Attention(p, p, p, math.MaxInt32, 1, 2, L, 0, 1, p, F32, st), ErrShape},
		{"attention scale", s.Attention(p, p, p, 0, 1, 2, L, 0, float32(math.Inf(1)), p, F32, st), ErrShape},
		{"attention odt", s.Attention(p, p, p, 0, 1, 2, L, 0, 1, p, "x", st), ErrDType},
		{"attention misaligned cache", s.Attention(p, odd, p, 0, 1, 2, L, 0, 1, p, F32, st), device.ErrInvalid},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: err %v, want %v", c.name, c.err, c.want)
		}
	}
	// Empty work launches nothing and is not an error.
	for i, err := range []error{s.Embed(0, BF16, 0, 0, 0, 0, st), s.RMSNorm(0, 0, F32, 0, F32, 0, 0, 0, st),
		s.RoPE(0, 0, 0, 0, 0, 0, false, st), s.SiluMul(0, 0, 0, F32, 0, st), s.Add(0, 0, 0, st),
		s.Cast(0, 0, F32, 0, st), s.Round(0, BF16, 0, st), s.Round(odd, F32, 9, st),
		s.KVWrite(0, 0, 0, 0, 0, 0, L, 0, st), s.Attention(0, 0, 0, 0, 0, 2, L, 0, 1, 0, F32, st)} {
		if err != nil {
			t.Errorf("empty call %d: %v", i, err)
		}
	}
	must(t, d.StreamSynchronize(st))
}

// The twins' own checks: wrong argument types and grids fail the launch.
func TestGoLlamaLaunchChecks(t *testing.T) {
	mem := newArena(1 << 16)
	p := mem.alloc(4096)
	one := device.Dim3{X: 1, Y: 1, Z: 1}
	for _, c := range []struct {
		name string
		grid device.Dim3
		args []any
	}{
		{NameEmbed, one, []any{p, uint32(1), p, p, uint32(1)}},                               // missing H
		{NameEmbed, one, []any{p, uint32(7), p, p, uint32(1), uint32(1)}},                    // dtype code
		{NameRMSNorm, one, []any{p, p, uint32(0), p, uint32(0), uint32(1), uint32(4), 1e-5}}, // float64 eps
		{AttnName(8), one, []any{p, p, p, uint32(0), uint32(1), uint32(1), uint32(1), uint32(8), uint32(4), uint32(0), uint32(0), uint64(1024), float32(1), uint32(1), p, p, uint32(0)}},    // grid below: one kv head needs X = 1
		{AttnName(1), one, []any{p, p, p, uint32(0), uint32(1), uint32(1), uint32(1), uint32(33), uint32(4), uint32(0), uint32(0), uint64(1024), float32(1), uint32(1), p, p, uint32(0)}},   // head dim 33 > 32 lanes
		{NameAttnFlash, one, []any{p, p, p, uint32(0), uint32(1), uint32(1), uint32(1), uint32(64), uint32(4), uint32(0), uint32(1), uint64(1024), float32(1), uint32(0), p, p, uint32(0)}}, // block of 256, not 128
		{NameAttnCombine, one, []any{p, p, uint32(0), uint32(1), uint32(4), uint32(0)}},
	} {
		k := kernelByName(t, c.name)
		grid := c.grid
		if c.name == AttnName(8) {
			grid = device.Dim3{X: 2, Y: 1, Z: 1} // one kv head: X must be 1
		}
		if err := k.run(mem, grid, blockDim(), c.args); !errors.Is(err, device.ErrInvalid) {
			t.Errorf("%s %v: err %v, want ErrInvalid", c.name, c.args, err)
		}
	}
}

func TestPTXTarget(t *testing.T) {
	for _, c := range []struct {
		ptx  string
		want int
	}{
		{"//\n.version 7.8\n.target sm_80\n.address_size 64\n", 80},
		{"//\n.target sm_70\n", 70},
		{"//\n.target sm_90a\n", 90},
		{".target sm_80\n", 0}, // not at a line start after the header
		{"//\n.target sm_\n", 0},
		{"//\n.target sm_99999999999999999999\n", 0},
		{"", 0},
	} {
		if got := PTXTarget([]byte(c.ptx)); got != c.want {
			t.Errorf("PTXTarget(%q) = %d, want %d", c.ptx, got, c.want)
		}
	}
	for _, target := range Targets() {
		want := map[string]int{TargetSM90: 90, TargetSM80: 80, TargetSM70: 70}[target]
		if got := PTXTarget(EmbeddedFor(target)); got != want {
			t.Errorf("embedded %s: PTXTarget %d", target, got)
		}
	}
}

func FuzzPTXTarget(f *testing.F) {
	f.Add([]byte("//\n.version 7.8\n.target sm_80\n"))
	f.Add([]byte("\n.target sm_1000\n"))
	f.Add([]byte("\n.target sm_"))
	f.Fuzz(func(t *testing.T, b []byte) {
		n := PTXTarget(b)
		want := 0
		if _, rest, ok := strings.Cut(string(b), "\n.target sm_"); ok {
			digits := rest[:len(rest)-len(strings.TrimLeft(rest, "0123456789"))]
			if v, err := strconv.Atoi(digits); err == nil && v <= 1000 {
				want = v
			}
		}
		if n != want {
			t.Fatalf("PTXTarget = %d, want %d", n, want)
		}
	})
}

// Attention picks its kernel by shape, as documented on Attention and in the
// README.
func TestAttentionKernelChoice(t *testing.T) {
	d := newFake("sim") // the simulator runs every kernel, flash included
	s, err := Load(d, nil)
	must(t, err)
	p := device.Ptr(1 << 20)
	layout := func(kvH, hd uint32, dt string) KVLayout {
		elt, _ := ElemSize(dt)
		return KVLayout{BlockTokens: 16, KVHeads: kvH, HeadDim: hd, Layers: 1, DType: dt, BlockBytes: uint64(2 * 16 * kvH * hd * uint32(elt))}
	}
	for _, c := range []struct {
		T, nH  uint32
		L      KVLayout
		q      device.Ptr
		flash  bool
		kernel string
	}{
		{1, 8, layout(2, 128, BF16), p, true, NameAttnDecode},
		{8, 8, layout(2, 64, F16), p, true, NameAttnDecode},
		{1, 8, layout(2, 64, F32), p, true, AttnName(64)},     // f32 caches take the split kernel
		{1, 32, layout(2, 128, BF16), p, true, AttnName(128)}, // 16 query heads per kv head
		{1, 4, layout(2, 96, BF16), p, true, AttnName(96)},
		{1, 4, layout(2, 256, F16), p, true, AttnName(256)},
		{40, 8, layout(2, 128, BF16), p, true, NameAttnFlash},
		{40, 8, layout(2, 128, F32), p, true, AttnName(128)},
		{40, 8, layout(2, 64, F16), p, false, AttnName(64)},
		{16, 8, layout(2, 128, BF16), p + 4, true, AttnName(128)}, // q not 16-byte aligned
		{9, 8, layout(2, 128, BF16), p, true, AttnName(128)},      // between decode and flash
	} {
		s.SetFlashAttention(c.flash)
		d.launches = nil
		must(t, s.Attention(c.q, p, p, 0, c.T, c.nH, c.L, 0, 0.1, p, F32, 1))
		if len(d.launches) != 1 || d.launches[0].name != c.kernel {
			t.Errorf("T=%d heads %d/%d dim %d %s flash=%v: launched %v, want %s", c.T, c.nH, c.L.KVHeads, c.L.HeadDim, c.L.DType, c.flash, d.launches, c.kernel)
			continue
		}
		l := d.launches[0]
		if c.kernel == NameAttnFlash {
			if l.grid != (device.Dim3{X: ceilDiv(c.T, flashRows), Y: c.nH, Z: 1}) || l.block.X != flashThreads {
				t.Errorf("flash launch %v", l)
			}
		} else if l.grid.Y != c.T || l.block != blockDim() {
			t.Errorf("%s launch %v", c.kernel, l)
		}
	}
}

// FuzzLlamaKernels draws every kernel's random cases from the fuzzed seed
// and checks the simulator's twins against the float64 references.
func FuzzLlamaKernels(f *testing.F) {
	for _, s := range []uint64{1, 2, 42, 1 << 40} {
		f.Add(s)
	}
	d := newSim(f)
	s, err := Load(d, nil)
	must(f, err)
	r := newRig(f, d, s)
	f.Fuzz(func(t *testing.T, seed uint64) {
		r.t = t
		for _, c := range llamaCases(seed, 1) {
			if e := relErr(c.run(r), c.ref); !(e <= c.tol) {
				t.Errorf("%s %s: relative error %.3g exceeds %.0e", c.kernel, c.name, e, c.tol)
			}
		}
	})
}

// The simulator's cost of attention follows the work: decode bytes are the
// K and V rows read, prefill FLOPs the causal pairs.
func TestLlamaCosts(t *testing.T) {
	p := device.Ptr(1 << 20)
	attnArgs := func(start, T uint32) []any {
		return []any{p, p, p, start, T, uint32(32), uint32(8), uint32(128), uint32(16), uint32(0), codeBF16,
			uint64(2 * 16 * 8 * 128 * 2), float32(0.1), uint32(1 << 20), p, p, codeF32}
	}
	dec, ok := kernelByName(t, NameAttnDecode).cost(device.Dim3{X: 8, Y: 1, Z: 1}, blockDim(), attnArgs(32767, 1))
	kv := 32768.0 * 2 * 8 * 128 * 2
	if !ok || dec.bytes < kv || dec.bytes > 1.1*kv {
		t.Errorf("32k decode cost %+v, want about %g bytes", dec, kv)
	}
	pre, ok := kernelByName(t, NameAttnFlash).cost(device.Dim3{X: 32, Y: 32, Z: 1}, device.Dim3{X: 128, Y: 1, Z: 1}, attnArgs(0, 2048))
	flops := 4 * 2048.0 * 2049 / 2 * 128 * 32
	if !ok || pre.flops != flops || pre.bytes <= 0 {
		t.Errorf("prefill cost %+v, want %g FLOPs", pre, flops)
	}
	for _, k := range llamaGoKernels() {
		if _, ok := k.cost(device.Dim3{X: 1, Y: 1, Z: 1}, blockDim(), []any{p}); ok {
			t.Errorf("%s cost accepted a bad argument list", k.name)
		}
	}
}

// Load's self-test keeps agreeing fast kernels and turns off one that
// disagrees with the split kernel.
func TestSelfTest(t *testing.T) {
	brokens := []string{"", NameAttnFlash, NameAttnDecode}
	gemvKind := map[string]int{}
	for _, k := range []int{gemvOne, gemvMMA} {
		brokens = append(brokens, gemvName(k, BF16))
		gemvKind[gemvName(k, BF16)] = k
	}
	for _, broken := range brokens {
		o := sim.DefaultOptions()
		o.Kernels = Sim()
		for i := range o.Kernels {
			if o.Kernels[i].Name == broken {
				run := o.Kernels[i].Run
				o.Kernels[i].Run = func(m *sim.Mem, grid, block device.Dim3, args []any) error {
					if err := run(m, grid, block, args); err != nil {
						return err
					}
					out, _ := args[len(args)-2].(device.Ptr) // a wrong answer: the first output doubled
					if _, ok := gemvKind[broken]; ok {
						out, _ = args[2].(device.Ptr)
					} else if grid.Z > 1 { // split: the first partial's first acc
						out, _ = args[14].(device.Ptr)
						out += 8
					}
					b, err := m.Bytes(out, 4)
					if err == nil {
						putF(b, 0, 2*getF(b, 0)+1)
					}
					return err
				}
			}
		}
		d := sim.New(o)
		s, err := Load(d, nil)
		must(t, err)
		must(t, s.selfTest())
		got := s.Disabled()
		switch broken {
		case "":
			if len(got) != 0 || !s.FlashAttention() || s.decodeOff || s.gemvOff != [gemvKinds]bool{} {
				t.Errorf("working kernels: disabled %v, flash %v, decode off %v", got, s.FlashAttention(), s.decodeOff)
			}
		case NameAttnFlash:
			if len(got) != 1 || !strings.Contains(got[0], "flash") || s.FlashAttention() || s.decodeOff {
				t.Errorf("broken flash: disabled %v, flash %v", got, s.FlashAttention())
			}
			if s.SetFlashAttention(true); s.FlashAttention() {
				t.Error("SetFlashAttention(true) brought back a kernel that failed the self-test")
			}
		case NameAttnDecode:
			if len(got) != 1 || !strings.Contains(got[0], "decode") || !s.decodeOff || !s.FlashAttention() {
				t.Errorf("broken decode: disabled %v, decode off %v", got, s.decodeOff)
			}
		default:
			k := gemvKind[broken]
			var want [gemvKinds]bool
			want[k] = true
			if len(got) != 1 || !strings.Contains(got[0], broken) || s.gemvOff != want || s.decodeOff {
				t.Errorf("broken %s: disabled %v, GEMV off %v", broken, got, s.gemvOff)
			}
			// Matmul keeps off the broken variant.
			for T := uint32(1); T <= GemvMaxTokens; T++ {
				if sh, err := s.Shape(BF16, 4096, 4096, T); err != nil || sh.Kernel == broken {
					t.Errorf("broken %s: T=%d still runs %s (%v)", broken, T, sh.Kernel, err)
				}
			}
		}
		must(t, s.Close())
		d.Close()
	}
}

func TestWarmUpMatmul(t *testing.T) {
	d := newSim(t)
	s, err := Load(d, nil)
	must(t, err)
	defer s.Close()
	st, err := d.NewStream()
	must(t, err)
	free0, _, _ := d.MemInfo()
	must(t, s.WarmUpMatmul(BF16, [][3]uint32{{64, 32, 16}, {128, 64, 9}, {16, 16, 1}}, st))
	if free1, _, _ := d.MemInfo(); free1 != free0 {
		t.Errorf("warm up left %d bytes allocated", int64(free0)-int64(free1))
	}
	if err := s.WarmUpMatmul("f8", [][3]uint32{{1, 1, 1}}, st); !errors.Is(err, ErrDType) {
		t.Errorf("bad dtype: %v", err)
	}
	if s.GemmWorkspaceBytes() != 0 || s.GemmLibrary() != "memwall" {
		t.Errorf("the simulator has no matrix library: %d bytes, %s", s.GemmWorkspaceBytes(), s.GemmLibrary())
	}
}

// checkRoPEGGUFExact holds RoPEGGUF to its contract on r's Set: the same
// bits as RoPEIn (HF pairing) of the rows put back in HF's order, over
// random shapes, positions and dtypes; rounds cases.
func checkRoPEGGUFExact(t *testing.T, r *rig, seed uint64, rounds int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 9))
	for range rounds {
		T, nH, hd := 1+rng.IntN(12), 1+rng.IntN(64), 2*(1+rng.IntN(128))
		rdt := pick(rng, F32, BF16, F16)
		in := ropeInputs(rng, T, nH, hd, false, rdt)
		pos, inv := r.i32(in.pos), r.f32(in.inv)
		want := r.f32(in.x)
		must(t, r.s.RoPEIn(want, pos, uint32(T), uint32(nH), uint32(hd), inv, false, rdt, r.st))
		got := r.nans(uint64(4 * len(in.x)))
		must(t, r.s.RoPEGGUF(r.f32(ggufOrder(in.x, hd)), got, pos, uint32(T), uint32(nH), uint32(hd), inv, rdt, r.st))
		w, g := r.read(want, uint64(4*len(in.x))), r.read(got, uint64(4*len(in.x)))
		for i := 0; i < len(w); i += 4 {
			if string(w[i:i+4]) != string(g[i:i+4]) {
				t.Fatalf("T=%d heads=%d dim=%d in %s: element %d is %x, RoPE of the HF-order rows gives %x", T, nH, hd, rdt, i/4, g[i:i+4], w[i:i+4])
			}
		}
	}
}

func TestSimRoPEGGUFExact(t *testing.T) {
	d := newSim(t)
	s, err := Load(d, nil)
	must(t, err)
	defer s.Close()
	if !s.HasRoPEGGUF() {
		t.Fatal("the simulator has no memwall_rope_gguf twin")
	}
	checkRoPEGGUFExact(t, newRig(t, d, s), 1, 40)
}
