package kernels

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/memwall/memwall/device"
)

// planAttentionOracle is PlanAttention's rule as first written (one
// function, no cap): the step-state kernels' split rule must reproduce it.
func planAttentionOracle(start, T, nHeads, kvHeads, headDim, sms uint32) (splits, chunk uint64) {
	groups := ceilDiv(nHeads/kvHeads, attnHeads)
	base := uint64(kvHeads) * uint64(groups) * uint64(T)
	ctx := uint64(start) + uint64(T)
	splits = 1
	want := 4 * uint64(max(sms, 1))
	if base < want && ctx > minChunk {
		splits = min((want+base-1)/base, (ctx+minChunk-1)/minChunk, maxSplits)
		per := uint64(T) * uint64(nHeads) * (uint64(headDim) + 2) * 4
		splits = max(1, min(splits, maxScratch/per))
	}
	chunk = (ctx + splits - 1) / splits
	return (ctx + chunk - 1) / chunk, chunk
}

// The split rule as the device applies it (cap, then the context) is
// PlanAttention's, and PlanAttentionAt's grid and scratch hold every
// context up to the longest.
func TestAttnSplitRule(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	for range 3000 {
		kvH := uint32(1 + rng.IntN(16))
		nH := kvH * uint32(1+rng.IntN(16))
		T := uint32(1 + rng.IntN(pick(rng, 2, 8, 100, 5000)))
		start := uint32(rng.IntN(pick(rng, 10, 200, 1000, 40000)))
		hd := uint32(1 + rng.IntN(MaxHeadDim))
		sms := uint32(1 + rng.IntN(200))
		ws, wc := planAttentionOracle(start, T, nH, kvH, hd, sms)
		p := PlanAttention(start, T, nH, kvH, hd, sms)
		if uint64(p.Splits) != ws || uint64(p.Chunk) != wc {
			t.Fatalf("start %d T %d heads %d/%d dim %d sms %d: plan %+v, the rule gives %d splits of %d", start, T, nH, kvH, hd, sms, p, ws, wc)
		}
		maxCtx := start + T + uint32(rng.IntN(3000))
		at := PlanAttentionAt(maxCtx, T, nH, kvH, hd, sms)
		if at.Grid.X != p.Grid.X || at.Grid.Y != T || at.Cap == 0 {
			t.Fatalf("at-plan %+v against %+v", at, p)
		}
		for _, ctx := range []uint32{T, start + T, maxCtx, T + uint32(rng.IntN(int(maxCtx-T+1)))} {
			q := PlanAttention(ctx-T, T, nH, kvH, hd, sms)
			if q.Splits > at.Grid.Z || q.ScratchBytes > at.ScratchBytes {
				t.Fatalf("context %d of at most %d: plan %+v does not fit the at-plan %+v", ctx, maxCtx, q, at)
			}
		}
	}
}

// stepStateCase runs a random cache through KVWrite then Attention, and
// the same through KVWriteAt and AttentionAt with the position in device
// memory: the caches and outputs must be the same bytes, and both near the
// float64 reference.
func stepStateCase(t *testing.T, r *rig, rng *rand.Rand) {
	t.Helper()
	dt := pick(rng, DTypes()...)
	hd := pick(rng, 1+rng.IntN(MaxHeadDim), 32, 64, 128, 128, 256)
	G := pick(rng, 1, 2, 4, 8, 9)
	T := pick(rng, 1, 1, 1, 2, 1+rng.IntN(8))
	start := pick(rng, 0, rng.IntN(130), 127, 128, 129, rng.IntN(700), 1000+rng.IntN(3000))
	a := newAttnSetup(rng, start, T, 1+rng.IntN(3), G, hd, dt)
	maxCtx := uint32(start + T + pick(rng, 0, rng.IntN(50), rng.IntN(5000)))
	name := fmt.Sprintf("%s, longest context %d, sms %d", a.name(), maxCtx, r.s.sms)

	cache, table := a.write(r)
	cache2 := r.nans(a.cacheBytes)
	row := int(a.L.KVHeads * a.L.HeadDim)
	if start > 0 {
		must(t, r.s.KVWrite(r.f32(a.k[:start*row]), r.f32(a.v[:start*row]), cache2, table, 0, uint32(start), a.L, a.layer, r.st))
	}
	pos := r.i32([]int32{int32(start)})
	must(t, r.s.KVWriteAt(r.f32(a.k[start*row:]), r.f32(a.v[start*row:]), cache2, table, pos, uint32(T), a.L, a.layer, r.st))
	if !bytes.Equal(r.read(cache, a.cacheBytes), r.read(cache2, a.cacheBytes)) {
		t.Fatalf("%s: KVWriteAt wrote other bytes than KVWrite", name)
	}
	oe, _ := ElemSize(a.odt)
	n := T * a.nH * hd
	q := r.f32(a.q)
	out, out2 := r.nans(uint64(oe*n)), r.nans(uint64(oe*n))
	must(t, r.s.Attention(q, cache, table, uint32(start), uint32(T), uint32(a.nH), a.L, a.layer, a.scale, out, a.odt, r.st))
	must(t, r.s.ReserveAttentionAt(r.st, maxCtx, uint32(T), uint32(a.nH), a.L))
	must(t, r.s.AttentionAt(q, cache2, table, pos, maxCtx, uint32(T), uint32(a.nH), a.L, a.layer, a.scale, out2, a.odt, r.st))
	got, got2 := r.read(out, uint64(oe*n)), r.read(out2, uint64(oe*n))
	if !bytes.Equal(got, got2) {
		t.Fatalf("%s: AttentionAt differs from Attention", name)
	}
	if e := relErr(r.readDT(a.odt, out2, n), a.ref()); !(e <= tolFor(a.odt, 2e-5)) {
		t.Fatalf("%s: relative error %.3g against the float64 reference", name, e)
	}
}

func TestSimStepState(t *testing.T) {
	d := newSim(t)
	s, err := Load(d, nil)
	must(t, err)
	defer s.Close()
	if !s.StepState() {
		t.Fatal("the simulator's Set has no step-state kernels")
	}
	r := newRig(t, d, s)
	rng := rand.New(rand.NewPCG(9, 9))
	rounds := 40
	if testing.Short() {
		rounds = 15
	}
	for range rounds {
		s.sms = uint32(pick(rng, 1, 4, 16, 132))
		stepStateCase(t, r, rng)
	}
}

// Refusals: flash-sized T, a context past the longest, a missing module.
func TestStepStateErrors(t *testing.T) {
	d := newSim(t)
	s, err := Load(d, nil)
	must(t, err)
	defer s.Close()
	L := KVLayout{BlockTokens: 16, KVHeads: 2, HeadDim: 64, Layers: 1, DType: BF16, BlockBytes: 2 * 16 * 2 * 64 * 2}
	p := device.Ptr(1 << 20)
	if err := s.AttentionAt(p, p, p, p, 100, 16, 4, L, 0, 0.1, p, BF16, 1); err == nil {
		t.Error("AttentionAt of 16 tokens with flash on: no error")
	}
	if err := s.AttentionAt(p, p, p, p, 1, 2, 4, L, 0, 0.1, p, BF16, 1); err == nil {
		t.Error("AttentionAt with a longest context under T: no error")
	}
	if err := s.AttentionAt(p, p, p, p, 10, 1, 3, L, 0, 0.1, p, BF16, 1); err == nil {
		t.Error("AttentionAt with 3 heads for 2 kv heads: no error")
	}
	s.state.ok = false
	defer func() { s.state.ok = true }()
	off := s
	if err := off.KVWriteAt(p, p, p, p, p, 1, L, 0, 1); !errors.Is(err, device.ErrUnsupported) {
		t.Errorf("KVWriteAt without the kernels: %v, want ErrUnsupported", err)
	}
	if err := off.AttentionAt(p, p, p, p, 10, 1, 4, L, 0, 0.1, p, BF16, 1); !errors.Is(err, device.ErrUnsupported) {
		t.Errorf("AttentionAt without the kernels: %v, want ErrUnsupported", err)
	}
	// A launch whose context needs more splits than its grid holds fails on
	// the twin, and so does a negative position.
	mem := newArena(4096)
	pos := mem.alloc(4)
	b, _ := mem.Bytes(pos, 4)
	args := []any{p, p, p, pos, uint32(1), uint32(4), uint32(2), uint32(64), uint32(16), uint32(0), uint32(1), L.BlockBytes,
		float32(0.1), uint32(64), p, p, uint32(0)}
	for _, v := range []int32{5000, -1} {
		binary.LittleEndian.PutUint32(b, uint32(v))
		if _, _, err := atArgs(NameAttnAt, mem, device.Dim3{X: 2, Y: 1, Z: 2}, args); err == nil {
			t.Errorf("position %d in a grid of 2 splits: no error", v)
		}
	}
}

// On the GPU (MEMWALL_TEST_DEVICE=cuda, MEMWALL_KERNELS_PTX naming PTX
// built from this kernels.cu while the embedded modules predate the
// step-state kernels): the same cases, bit-equal to the plain kernels.
func TestCUDAStepState(t *testing.T) {
	d := openCUDA(t)
	s, err := Load(d, os.Getenv)
	must(t, err)
	defer s.Close()
	if !s.StepState() {
		t.Skipf("%s has no step-state kernels: set %s to PTX built from this kernels.cu", s.Source(), EnvPTX)
	}
	r := newRig(t, d, s)
	rng := rand.New(rand.NewPCG(10, 10))
	rounds := 60
	if os.Getenv("MEMWALL_TEST_QUICK") != "" { // under compute-sanitizer
		rounds = 12
	}
	for range rounds {
		s.sms = uint32(pick(rng, 4, 16, 132))
		stepStateCase(t, r, rng)
	}
	t.Logf("%s: %d cases, KVWriteAt and AttentionAt bit-equal to KVWrite and Attention", s.Source(), rounds)
}
