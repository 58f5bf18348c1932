package kernels

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/memwall/memwall/device"
)

// Mirrors of kernels.cu's constants for the streamed GEMV.
const (
	mirrorWarps = 8
	mirrorPart  = 4096
)

// The streamed codes memwall_gemvm_* runs: the tensor-core gemvm<BF, 2,
// false> (bf16/f16, compute_80 and newer) and the CUDA-core
// gemvs<Tr, 4, 8> (f32, and compute_70).
const (
	mirrorMMA = iota
	mirrorCUDA
)

// mirrorStreamed replays, in Go, the index arithmetic of the streamed GEMV
// code kind (mirrorCUDA: gemvs<Tr, U, maxT>, mirrorMMA: gemvm<BF, U> in kernels.cu, line for
// line: shares, passes, the per-warp runs, the load and consume cursors of
// the U-deep pipeline, the partial-sum slots and the combine's choice of
// warps) for an M×K product of elt-byte elements on a grid of G blocks, and
// checks that every element of W is multiplied exactly once, by a lane that
// loaded it, into the partial sum of its own row, that partial sums stay
// inside the shared buffer and never overwrite one another, and that the
// combine adds exactly the warps that wrote a row. It returns the first
// violation.
func mirrorStreamed(kind int, M, K, G uint64, elt int) error {
	vecElts := uint64(16 / elt)
	nvec := (K + vecElts - 1) / vecElts
	mma := kind == mirrorMMA
	U, maxT, partSize := uint64(4), uint64(GemvMaxTokens), uint64(mirrorPart)
	if mma {
		U = 2
	}
	rowsPerUnit, vecsPerUnit, slotsPerUnit := uint64(1), uint64(32), maxT*mirrorWarps
	if mma {
		rowsPerUnit, vecsPerUnit, slotsPerUnit = 16, 8, mirrorWarps*128
	}
	cpr := (nvec + vecsPerUnit - 1) / vecsPerUnit
	if cpr == 0 {
		return nil // K = 0: no units to load; the combine writes zeros (the kernel's quotients by cpr go unused)
	}
	nUnits := (M + rowsPerUnit - 1) / rowsPerUnit // rows, or 16-row groups
	kPer := partSize / slotsPerUnit               // rows (groups) per pass
	used := make([]uint8, M*nvec)                 // times each vector of W was multiplied
	for b := range G {
		r0, r1 := nUnits*b/G, nUnits*(b+1)/G
		for rp := r0; rp < r1; rp += kPer {
			nr := min(kPer, r1-rp)
			units := nr * cpr
			wrote := map[[2]uint64]bool{} // (row in pass, warp) partial sums written
			for w := range uint64(mirrorWarps) {
				ua, ub := units*w/mirrorWarps, units*(w+1)/mirrorWarps
				lr, lj := ua/cpr, ua%cpr
				cr, cj := lr, lj
				pipe := make([][2]uint64, U) // (lr, lj) of the unit in each register slot
				for u := range U {
					if ua+u < ub {
						pipe[u] = [2]uint64{lr, lj}
						if lj++; lj == cpr {
							lj, lr = 0, lr+1
						}
					}
				}
				flush := func() error {
					if cr >= nr {
						return fmt.Errorf("block %d warp %d: flush of row %d past the pass's %d", b, w, cr, nr)
					}
					if (cr+1)*slotsPerUnit > partSize {
						return fmt.Errorf("block %d: partial slot of row %d past the shared buffer", b, cr)
					}
					if wrote[[2]uint64{cr, w}] {
						return fmt.Errorf("block %d warp %d: row %d flushed twice", b, w, cr)
					}
					wrote[[2]uint64{cr, w}] = true
					return nil
				}
				for i := ua; i < ub; i += U {
					for u := range U {
						if i+u >= ub {
							continue
						}
						if pipe[u] != [2]uint64{cr, cj} {
							return fmt.Errorf("block %d warp %d: consumes unit %v, register holds %v", b, w, [2]uint64{cr, cj}, pipe[u])
						}
						// The vectors this unit multiplies, over all lanes.
						for r := range rowsPerUnit {
							row := (rp+cr)*rowsPerUnit + r
							for v := range vecsPerUnit {
								if c := cj*vecsPerUnit + v; c < nvec && row < M {
									used[row*nvec+c]++
								}
							}
						}
						if i+u+U < ub {
							pipe[u] = [2]uint64{lr, lj}
							if lj++; lj == cpr {
								lj, lr = 0, lr+1
							}
						}
						if cj++; cj == cpr {
							if err := flush(); err != nil {
								return err
							}
							cj, cr = 0, cr+1
						}
					}
				}
				if cj != 0 {
					if err := flush(); err != nil {
						return err
					}
				}
			}
			// The combine's warps for each row are the writers.
			for r := range nr {
				for w := range uint64(mirrorWarps) {
					wa, wb := units*w/mirrorWarps, units*(w+1)/mirrorWarps
					if in := wa < (r+1)*cpr && wb > r*cpr; in != wrote[[2]uint64{r, w}] {
						return fmt.Errorf("block %d row %d warp %d: combine includes it %v, it wrote %v", b, rp+r, w, in, wrote[[2]uint64{r, w}])
					}
				}
			}
		}
	}
	for i, n := range used {
		if n != 1 {
			return fmt.Errorf("row %d vector %d multiplied %d times", uint64(i)/nvec, uint64(i)%nvec, n)
		}
	}
	return nil
}

func TestStreamedGemvPartition(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 15))
	check := func(kind int, M, K, G uint64, elt int) {
		t.Helper()
		if err := mirrorStreamed(kind, M, K, G, elt); err != nil {
			t.Errorf("%s (%s code) M=%d K=%d grid=%d: %v", gemvName(gemvMMA, map[int]string{2: BF16, 4: F32}[elt]), []string{"tensor-core", "CUDA-core"}[kind], M, K, G, err)
		}
	}
	for _, kind := range []int{mirrorMMA, mirrorCUDA} {
		for _, elt := range []int{2, 4} {
			check(kind, 1, 1, 1, elt)
			check(kind, 3000, 4096, 1, elt) // passes
			check(kind, 1024, 4096, uint64(gemvGrid(gemvMMA, 1024, 132, 4)), elt)
			check(kind, 4096, 14336, uint64(gemvGrid(gemvMMA, 4096, 132, 4)), elt)
			for range 15 {
				M, K := 1+rng.Uint64N(3000), 1+rng.Uint64N(6000)
				if rng.IntN(3) == 0 {
					M = 1 + rng.Uint64N(40)
				}
				G := 1 + rng.Uint64N(3*M+5)
				check(kind, M, K, G, elt)
			}
		}
	}
}

func FuzzStreamedGemvPartition(f *testing.F) {
	f.Add(uint8(0), uint16(3000), uint16(4096), uint16(1))
	f.Add(uint8(2), uint16(17), uint16(13), uint16(40))
	f.Fuzz(func(t *testing.T, kind uint8, M, K, G uint16) {
		k := int(kind % 2)
		if M == 0 || G == 0 || uint64(M)*uint64(K) > 1<<22 {
			return
		}
		for _, elt := range []int{2, 4} {
			if err := mirrorStreamed(k, uint64(M), uint64(K), uint64(G), elt); err != nil {
				t.Fatalf("%s code %d M=%d K=%d grid=%d elt=%d: %v", gemvName(gemvMMA, BF16), k, M, K, G, elt, err)
			}
		}
	})
}

// The selection rule: every GPU size, shape and token count gets a launch
// its kernel computes (T within the variant's limit, a grid its checks
// accept, at most as many blocks as units for the streamed ones), turned-off
// variants are avoided, and a GPU of unknown size gets the row-per-warp
// kernels (ShapeFor).
func TestPlanGemv(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 15))
	for range 2000 {
		dt := pick(rng, DTypes()...)
		M, K, T := 1+rng.Uint32N(200000), rng.Uint32N(20000), 1+rng.Uint32N(GemvMaxTokens)
		sms := pick(rng, 0, 1, 20, 46, 132, 144, rng.Uint32N(300))
		tensor := rng.IntN(2) == 0
		var off [gemvKinds]bool
		for k := range off {
			off[k] = k != gemvTwo && rng.IntN(4) == 0
		}
		p := planGemv(dt, M, K, T, sms, tensor, &off)
		switch {
		case off[p.kind]:
			t.Errorf("%s %d×%d T=%d sms=%d: turned-off %s", dt, M, K, T, sms, gemvName(p.kind, dt))
		case T > gemvMaxT(p.kind):
			t.Errorf("%s %d×%d T=%d: %s takes T ≤ %d", dt, M, K, T, gemvName(p.kind, dt), gemvMaxT(p.kind))
		case sms == 0 && gemvStreamed(p.kind):
			t.Errorf("%s %d×%d T=%d, unknown GPU: %s", dt, M, K, T, gemvName(p.kind, dt))
		case p.kind == gemvMMA && (!tensor || dt == F32):
			t.Errorf("%s %d×%d T=%d tensor=%v: %s", dt, M, K, T, tensor, gemvName(p.kind, dt))
		case gemvStreamed(p.kind) && (p.grid < 1 || p.grid > gemvUnits(p.kind, M)):
			t.Errorf("%s %d×%d T=%d: grid %d for %d units", dt, M, K, T, p.grid, gemvUnits(p.kind, M))
		case !gemvStreamed(p.kind) && p.grid != ceilDiv(M, gemvRowsPerBlock(gemvMaxT(p.kind))):
			t.Errorf("%s %d×%d T=%d: %s grid %d", dt, M, K, T, gemvName(p.kind, dt), p.grid)
		}
		if sms > 0 && gemvStreamed(p.kind) && p.grid > max(1, sms*gemvBlocksPerSM) {
			t.Errorf("%s %d×%d: grid %d exceeds the %d resident blocks", dt, M, K, p.grid, sms*gemvBlocksPerSM)
		}
	}
}

// MatmulGroup on the simulator: every random group (0-4 products, some
// empty, T 1-3) gives each product what Matmul gives alone, bit for bit,
// and bad arguments fail before anything runs.
func TestMatmulGroup(t *testing.T) {
	d := newSim(t)
	s, err := Load(d, nil)
	must(t, err)
	defer s.Close()
	matmulGroupSuite(t, d, s)
}

// matmulGroupSuite checks MatmulGroup on s against one Matmul per product
// (bit for bit) and the float64 reference, and its argument errors.
func matmulGroupSuite(t *testing.T, d device.Device, s *Set) {
	r := newRig(t, d, s)
	rng := rand.New(rand.NewPCG(7, 15))
	for i := range 40 {
		dt := pick(rng, DTypes()...)
		K, T := 1+rng.IntN(300), 1+rng.IntN(3)
		if rng.IntN(2) == 0 {
			T = 1
		}
		n := rng.IntN(MatmulGroupMax + 2)
		var ops, alone []MatmulOp
		var Ws [][]byte
		_, X := randMatrices(t, dt, 1, K, T, uint64(i))
		px := r.upload(X)
		for j := range n {
			M := rng.IntN(70)
			W, _ := randMatrices(t, dt, M, K, 1, uint64(100*i+j))
			pw := r.upload(W)
			Ws = append(Ws, W)
			ops = append(ops, MatmulOp{W: pw, Y: r.nans(uint64(4 * max(M*T, 1))), M: uint32(M)})
			alone = append(alone, MatmulOp{W: pw, Y: r.nans(uint64(4 * max(M*T, 1))), M: uint32(M)})
		}
		must(t, s.MatmulGroup(dt, px, uint32(K), uint32(T), ops, r.st))
		for j, op := range alone {
			if op.M == 0 {
				continue
			}
			must(t, s.Matmul(dt, op.W, px, op.Y, op.M, uint32(K), uint32(T), r.st))
			n := uint64(4 * int(op.M) * T)
			if g, w := r.read(ops[j].Y, n), r.read(op.Y, n); string(g) != string(w) {
				t.Errorf("%s K=%d T=%d product %d of %d (M=%d): grouped result differs from Matmul's", dt, K, T, j, len(ops), op.M)
			}
			y, _ := Decode(F32, r.read(ops[j].Y, n))
			must(t, CheckMatmul(dt, Ws[j], X, y, int(op.M), K, T, 0, 1))
		}
	}
	p := r.nans(64)
	for _, tc := range []struct {
		name string
		ops  []MatmulOp
		dt   string
		want error
	}{
		{"bad dtype", []MatmulOp{{p, p, 1}}, "f8", ErrDType},
		{"W misaligned", []MatmulOp{{p, p, 1}, {p + 1, p, 1}}, BF16, device.ErrInvalid},
		{"Y null", []MatmulOp{{p, 0, 1}}, F32, device.ErrInvalid},
	} {
		if err := s.MatmulGroup(tc.dt, p, 4, 1, tc.ops, r.st); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}
