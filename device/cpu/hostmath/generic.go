package hostmath

// The pure-Go kernels: the Generic variant, and the tails (rows shorter
// than a vector step) of the others.

// genericChunk is how many weights of a row dotsGeneric widens at a time.
const genericChunk = 256

// dotsGeneric is dots in Go: each row widened a chunk at a time, each
// token's sum of a chunk kept in four interleaved float32 partial sums
// (k mod 4), added as (s0 + s1) + (s2 + s3) into the token's total.
func dotsGeneric(y []float32, ys int, w []byte, ws int, dt DType, x []float32, xs int, M, K, T int) {
	var buf [genericChunk]float32
	var acc [MaxTile]float32
	for m := range M {
		row := w[m*ws:]
		acc = [MaxTile]float32{}
		for k0 := 0; k0 < K; k0 += genericChunk {
			n := min(genericChunk, K-k0)
			wf := buf[:n]
			Widen(wf, row[k0*dt.Size():], dt)
			for t := range T {
				acc[t] += dot4(wf, x[t*xs+k0:t*xs+k0+n])
			}
		}
		for t := range T {
			y[t*ys+m] = acc[t]
		}
	}
}

// dot4 returns Σ a[i]·b[i] (len(b) ≥ len(a)) in four partial sums.
func dot4(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// wsumGeneric is WeightedSum in Go for T ≤ MaxTile: acc[t·as + j] +=
// Σ_i p[t·ps + i]·V(i, j), in order of i.
func wsumGeneric(acc []float32, as int, p []float32, ps int, v []byte, vs int, dt DType, n, hd, T int) {
	var buf [genericChunk]float32
	for j0 := 0; j0 < hd; j0 += genericChunk {
		c := min(genericChunk, hd-j0)
		vf := buf[:c]
		for i := range n {
			Widen(vf, v[i*vs+j0*dt.Size():], dt)
			for t := range T {
				pv := p[t*ps+i]
				a := acc[t*as+j0 : t*as+j0+c]
				for j, x := range vf {
					a[j] += pv * x
				}
			}
		}
	}
}
