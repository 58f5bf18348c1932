package kernels

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/memwall/memwall/device"
)

// rowsCase puts R sequences of random contexts into one paged cache (each
// its own blocks, tables of perSeq entries side by side) and writes and
// attends each one's last token twice: per sequence with KVWrite and
// Attention at T = 1, and all at once with KVWriteRows and AttentionRows.
// The caches must be the same bytes; so must each row's output where its
// context splits as it does alone, and elsewhere (the rows fill the GPU,
// so it splits into fewer parts) be within the output dtype's rounding
// of it.
func rowsCase(t *testing.T, r *rig, rng *rand.Rand) {
	t.Helper()
	dt := pick(rng, BF16, F16)
	hd := pick(rng, 64, 128)
	G := pick(rng, 1, 2, 4, 8)
	kvH := 1 + rng.IntN(4)
	nH := kvH * G
	elt, _ := ElemSize(dt)
	odt := pick(rng, DTypes()...)
	oe, _ := ElemSize(odt)
	L := KVLayout{BlockTokens: uint32(pick(rng, 1, 16, 16, 32)), KVHeads: uint32(kvH), HeadDim: uint32(hd),
		Layers: uint32(1 + rng.IntN(3)), DType: dt}
	layer := uint32(rng.IntN(int(L.Layers)))
	L.BlockBytes = uint64(L.Layers) * 2 * uint64(L.BlockTokens) * uint64(kvH*hd*elt)
	R := pick(rng, 1, 2, 1+rng.IntN(8), 1+rng.IntN(40))
	ctxs := make([]int, R)
	maxCtx := 0
	for i := range ctxs {
		ctxs[i] = 1 + pick(rng, 0, rng.IntN(130), 127, 128, 129, rng.IntN(700), 1000+rng.IntN(3000))
		maxCtx = max(maxCtx, ctxs[i])
	}
	maxCtx += pick(rng, 0, rng.IntN(300))
	perSeq := (maxCtx + int(L.BlockTokens) - 1) / int(L.BlockTokens)
	used := 0
	for _, c := range ctxs {
		used += (c + int(L.BlockTokens) - 1) / int(L.BlockTokens)
	}
	nblocks := used + rng.IntN(4)
	perm := rng.Perm(nblocks)
	tables := make([]int32, R*perSeq)
	next := 0
	for i, c := range ctxs {
		for j := range (c + int(L.BlockTokens) - 1) / int(L.BlockTokens) {
			tables[i*perSeq+j] = int32(perm[next])
			next++
		}
	}
	name := fmt.Sprintf("%s dim %d heads %d/%d bt %d layer %d/%d out %s, %d rows, contexts %v (longest %d), sms %d",
		dt, hd, nH, kvH, L.BlockTokens, layer, L.Layers, odt, R, ctxs, maxCtx, r.s.sms)
	if !r.s.Rows(uint32(nH), L, 1<<20) {
		t.Fatalf("%s: Rows is false", name)
	}
	cacheBytes := uint64(nblocks) * L.BlockBytes
	cache, cache2 := r.nans(cacheBytes), r.nans(cacheBytes)
	tabs := r.i32(tables)
	row := kvH * hd
	lastK, lastV := make([]float32, 0, R*row), make([]float32, 0, R*row)
	pos := make([]int32, R)
	for i, c := range ctxs {
		k, v := randF32(rng, c*row, 1), randF32(rng, c*row, 1)
		tab := tabs.Add(4 * uint64(i*perSeq))
		if c > 1 {
			kp, vp := r.f32(k[:(c-1)*row]), r.f32(v[:(c-1)*row])
			must(t, r.s.KVWrite(kp, vp, cache, tab, 0, uint32(c-1), L, layer, r.st))
			must(t, r.s.KVWrite(kp, vp, cache2, tab, 0, uint32(c-1), L, layer, r.st))
		}
		must(t, r.s.KVWrite(r.f32(k[(c-1)*row:]), r.f32(v[(c-1)*row:]), cache, tab, uint32(c-1), 1, L, layer, r.st))
		lastK, lastV = append(lastK, k[(c-1)*row:]...), append(lastV, v[(c-1)*row:]...)
		pos[i] = int32(c - 1)
	}
	posP := r.i32(pos)
	must(t, r.s.KVWriteRows(r.f32(lastK), r.f32(lastV), cache2, tabs, posP, uint32(perSeq), uint32(R), L, layer, r.st))
	if !bytes.Equal(r.read(cache, cacheBytes), r.read(cache2, cacheBytes)) {
		t.Fatalf("%s: KVWriteRows wrote other bytes than KVWrite per sequence", name)
	}
	qs := randF32(rng, R*nH*hd, 1)
	scale := float32(1 / math.Sqrt(float64(hd)))
	n := uint64(nH * hd * oe)
	want := make([]byte, 0, uint64(R)*n)
	for i, c := range ctxs {
		out := r.nans(n)
		q := r.f32(qs[i*nH*hd : (i+1)*nH*hd])
		must(t, r.s.Attention(q, cache, tabs.Add(4*uint64(i*perSeq)), uint32(c-1), 1, uint32(nH), L, layer, scale, out, odt, r.st))
		want = append(want, r.read(out, n)...)
	}
	out := r.nans(uint64(R) * n)
	must(t, r.s.AttentionRows(r.f32(qs), cache2, tabs, posP, uint32(perSeq), uint32(maxCtx), uint32(R), uint32(nH), L, layer, scale, out, odt, r.st))
	got := r.read(out, uint64(R)*n)
	rowsCap := attnSplitCap(uint32(R), uint32(nH), uint32(kvH), uint32(hd), r.s.sms)
	oneCap := attnSplitCap(1, uint32(nH), uint32(kvH), uint32(hd), r.s.sms)
	for i, c := range ctxs {
		g, w := got[uint64(i)*n:][:n], want[uint64(i)*n:][:n]
		rs, _ := attnSplits(uint64(c), rowsCap)
		alone, _ := attnSplits(uint64(c), oneCap)
		if rs == alone {
			if !bytes.Equal(g, w) {
				t.Fatalf("%s: AttentionRows' row %d (context %d, %d splits) differs from Attention's", name, i, c, rs)
			}
			continue
		}
		gf, err := Decode(odt, g)
		must(t, err)
		wf, err := Decode(odt, w)
		must(t, err)
		if e := relErr32(gf, wf); !(e <= 2*tolFor(odt, 2e-5)) {
			t.Fatalf("%s: row %d (context %d, %d splits, %d alone): relative error %.3g against Attention's", name, i, c, rs, alone, e)
		}
	}
}

func rowsRounds(t *testing.T, d device.Device, s *Set, rounds int, sms []int) {
	if !s.Rows(8, KVLayout{BlockTokens: 16, KVHeads: 2, HeadDim: 128, Layers: 1, DType: BF16, BlockBytes: 16 * 2 * 2 * 128 * 2}, 1<<20) {
		t.Skipf("%s has no row kernels: set %s to PTX built from this kernels.cu", s.Source(), EnvPTX)
	}
	r := newRig(t, d, s)
	rng := rand.New(rand.NewPCG(31, uint64(rounds)))
	for range rounds {
		s.sms = uint32(pick(rng, sms...))
		rowsCase(t, r, rng)
	}
}

func TestSimRows(t *testing.T) {
	d := newSim(t)
	s, err := Load(d, nil)
	must(t, err)
	defer s.Close()
	rounds := 40
	if testing.Short() {
		rounds = 12
	}
	rowsRounds(t, d, s, rounds, []int{1, 4, 16, 132})
}

func TestCPURows(t *testing.T) {
	cpuVariants(t, func(t *testing.T, d device.Device, s *Set) {
		rowsRounds(t, d, s, 8, []int{1, 16, 132})
	})
}

// On the GPU: the same cases, bit-equal to the per-sequence kernels.
func TestCUDARows(t *testing.T) {
	d := openCUDA(t)
	s, err := Load(d, os.Getenv)
	must(t, err)
	defer s.Close()
	rounds := 60
	if os.Getenv("MEMWALL_TEST_QUICK") != "" { // under compute-sanitizer
		rounds = 12
	}
	rowsRounds(t, d, s, rounds, []int{4, 16, 132})
	t.Logf("%s: %d cases, KVWriteRows and AttentionRows equal to KVWrite and Attention per sequence (bit for bit where a row splits as it does alone)", s.Source(), rounds)
}

// Refusals: shapes the decode kernel does not take, a missing module, a
// row past the grid's splits, a negative position.
func TestRowsErrors(t *testing.T) {
	d := newSim(t)
	s, err := Load(d, nil)
	must(t, err)
	defer s.Close()
	L := KVLayout{BlockTokens: 16, KVHeads: 2, HeadDim: 64, Layers: 1, DType: BF16, BlockBytes: 2 * 16 * 2 * 64 * 2}
	p := device.Ptr(1 << 20)
	for _, c := range []struct {
		what string
		nH   uint32
		L    KVLayout
	}{
		{"an f32 cache", 4, KVLayout{BlockTokens: 16, KVHeads: 2, HeadDim: 64, Layers: 1, DType: F32, BlockBytes: 2 * 16 * 2 * 64 * 4}},
		{"head dim 96", 4, KVLayout{BlockTokens: 16, KVHeads: 2, HeadDim: 96, Layers: 1, DType: BF16, BlockBytes: 2 * 16 * 2 * 96 * 2}},
		{"16 query heads a kv head", 32, L},
		{"3 heads for 2 kv heads", 3, L},
	} {
		if s.Rows(c.nH, c.L, p) {
			t.Errorf("Rows true for %s", c.what)
		}
		if err := s.AttentionRows(p, p, p, p, 4, 10, 1, c.nH, c.L, 0, 0.1, p, BF16, 1); !errors.Is(err, device.ErrUnsupported) {
			t.Errorf("AttentionRows with %s: %v, want ErrUnsupported", c.what, err)
		}
	}
	if err := s.AttentionRows(p, p, p, p, 0, 10, 1, 4, L, 0, 0.1, p, BF16, 1); err == nil {
		t.Error("AttentionRows with no table entries: no error")
	}
	if err := s.KVWriteRows(p, p, p, p, p, 4, 1, L, 1, 1); err == nil {
		t.Error("KVWriteRows into layer 1 of 1: no error")
	}
	s.rows.ok = false
	if err := s.KVWriteRows(p, p, p, p, p, 4, 1, L, 0, 1); !errors.Is(err, device.ErrUnsupported) {
		t.Errorf("KVWriteRows without the kernels: %v, want ErrUnsupported", err)
	}
	if s.Rows(4, L, p) {
		t.Error("Rows true without the kernels")
	}
	s.rows.ok = true
	mem := newArena(4096)
	pos := mem.alloc(4)
	b, _ := mem.Bytes(pos, 4)
	args := []any{p, p, p, pos, uint32(1), uint32(4), uint32(2), uint32(64), uint32(16), uint32(0), uint32(1), L.BlockBytes,
		float32(0.1), uint32(64), p, p, uint32(0), uint32(4)}
	run := runAttnRows(runAttnDecode)
	for _, v := range []int32{5000, -1} {
		b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		if err := run(mem, device.Dim3{X: 2, Y: 1, Z: 2}, blockDim(), args); err == nil {
			t.Errorf("position %d in a grid of 2 splits: no error", v)
		}
	}
}
