package kernels

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
)

// fusedCheck runs ResidualRMSNorm and SiluMulIn on random shapes and dtypes
// (H on both sides of the kernel's 4096-element register path, T up to 9,
// rdt f32 too) and compares x, out and the SiLU output with the unfused
// composition on the same Set, bit for bit. It returns the cases run.
func fusedCheck(t *testing.T, r *rig, rng *rand.Rand, label string) int {
	t.Helper()
	n := 0
	for c := range 12 {
		rdt, wdt, odt := pick(rng, DTypes()...), pick(rng, F32, BF16, F16), pick(rng, DTypes()...)
		T := 1 + rng.IntN(9)
		H := pick(rng, 1+rng.IntN(3000), 4096, 4097, 4096+rng.IntN(5000))
		if c == 0 {
			T, H, rdt, wdt, odt = 1, 4096, BF16, BF16, BF16 // a decode step
		}
		x := f32Bytes(randF32(rng, T*H, pick(rng, 0.1, 1, 30)))
		y := f32Bytes(randF32(rng, T*H, pick(rng, 0.1, 1, 30)))
		wb, _ := Encode(wdt, randF32(rng, H, 1))
		oe, _ := ElemSize(odt)
		pw := r.upload(wb)
		// Fused.
		fx, fy, fo := r.upload(x), r.upload(y), r.nans(uint64(T*H*oe))
		must(t, r.s.ResidualRMSNorm(fx, fy, rdt, pw, wdt, fo, odt, uint32(T), uint32(H), 1e-5, r.st))
		// Composition.
		cx, cy, co := r.upload(x), r.upload(y), r.nans(uint64(T*H*oe))
		must(t, r.s.Round(cy, rdt, uint64(T*H), r.st))
		must(t, r.s.Add(cx, cy, uint64(T*H), r.st))
		must(t, r.s.Round(cx, rdt, uint64(T*H), r.st))
		must(t, r.s.RMSNorm(cx, pw, wdt, co, odt, uint32(T), uint32(H), 1e-5, r.st))
		for _, b := range []struct {
			what string
			f, c []byte
		}{{"x", r.read(fx, uint64(4*T*H)), r.read(cx, uint64(4*T*H))},
			{"out", r.read(fo, uint64(T*H*oe)), r.read(co, uint64(T*H*oe))}} {
			if !slices.Equal(b.f, b.c) {
				t.Errorf("%s ResidualRMSNorm T=%d H=%d rdt=%s wdt=%s odt=%s: %s differs from Round, Add, Round, RMSNorm", label, T, H, rdt, wdt, odt, b.what)
			}
		}
		if string(r.read(fy, uint64(4*T*H))) != string(y) {
			t.Errorf("%s ResidualRMSNorm: y was modified", label)
		}
		// SiluMulIn against Round, Round, SiluMul.
		m := uint64(T * H)
		g, u := f32Bytes(randF32(rng, int(m), 3)), f32Bytes(randF32(rng, int(m), 3))
		pg, pu, po := r.upload(g), r.upload(u), r.nans(m*uint64(oe))
		must(t, r.s.SiluMulIn(pg, pu, rdt, po, odt, m, r.st))
		qg, qu, qo := r.upload(g), r.upload(u), r.nans(m*uint64(oe))
		must(t, r.s.Round(qg, rdt, m, r.st))
		must(t, r.s.Round(qu, rdt, m, r.st))
		must(t, r.s.SiluMul(qg, qu, qo, odt, m, r.st))
		if !slices.Equal(r.read(po, m*uint64(oe)), r.read(qo, m*uint64(oe))) {
			t.Errorf("%s SiluMulIn n=%d rdt=%s odt=%s: differs from Round, Round, SiluMul", label, m, rdt, odt)
		}
		if string(r.read(pg, 4*m)) != string(g) {
			t.Errorf("%s SiluMulIn: g was modified", label)
		}
		n++
	}
	return n
}

// The fused residual norm and SiLU·mul equal their compositions on the
// simulator (the Go twins).
func TestFusedNorms(t *testing.T) {
	d := newSim(t)
	s, err := Load(d, nil)
	must(t, err)
	defer s.Close()
	fusedCheck(t, newRig(t, d, s), rand.New(rand.NewPCG(31, 31)), "sim")
}

// The same on every PTX target of the GPU (the compute_90 one overlapped).
func TestCUDAFusedNorms(t *testing.T) {
	d := openCUDA(t)
	targets := Targets()
	if v := os.Getenv("MEMWALL_TEST_TARGETS"); v != "" {
		targets = strings.Split(v, ",")
	}
	for _, target := range targets {
		s := loadChecked(t, d, target)
		n := fusedCheck(t, newRig(t, d, s), rand.New(rand.NewPCG(31, 31)), target)
		fmt.Printf("KCHECK residual_rmsnorm+silumul_in %s %s - %d\n", target, map[bool]string{false: "identical", true: "DIFFERS"}[t.Failed()], n)
	}
}
