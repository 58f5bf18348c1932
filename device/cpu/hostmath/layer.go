package hostmath

import "math"

// The element-wise pieces of a Llama layer. They are the same Go code in
// every variant and define the rounding memwall's kernels follow (package
// kernels' simulator twins call them): results here are bit for bit what
// the simulator computes.

// RMSNorm writes out[i] = odt(odt(x[i]·r)·w[i]) with r = 1/√(Σx²/H + eps),
// the sum of squares in float32 in order of i and r through float64, the
// values rounded to odt but stored as float32. out may be x. It panics
// when w or out is shorter than x.
func RMSNorm(out, x, w []float32, odt DType, eps float32) {
	out, w = out[:len(x)], w[:len(x)]
	var ss float32
	for _, v := range x {
		ss += v * v
	}
	r := float32(1 / math.Sqrt(float64(ss/float32(len(x))+eps)))
	for i, v := range x {
		out[i] = Round(odt, Round(odt, v*r)*w[i])
	}
}

// RopePair is RoPE's float32 math for one pair (a, b) at position pos with
// inverse frequency f: angle float32(pos)·f, float32 cos and sin of it,
// then (a·cos − b·sin, b·cos + a·sin).
func RopePair(a, b float32, pos int32, f float32) (float32, float32) {
	c, s := ropeAngle(pos, f)
	return a*c - b*s, b*c + a*s
}

// ropeAngle returns the float32 cos and sin of float32(pos)·f.
func ropeAngle(pos int32, f float32) (float32, float32) {
	sn, cs := math.Sincos(float64(float32(pos) * f))
	return float32(cs), float32(sn)
}

// RopePairIn is RopePair in dtype dt, as HF computes it for a model of
// that dtype: for bf16 and f16, cos, sin, a and b rounded to dt, then
// (dt(dt(a·cos) − dt(b·sin)), dt(dt(b·cos) + dt(a·sin))); f32 is RopePair.
func RopePairIn(dt DType, a, b float32, pos int32, f float32) (float32, float32) {
	c, s := ropeAngle(pos, f)
	return ropeRotate(dt, a, b, c, s)
}

// ropeRotate turns (a, b) by the angle of cos c and sin s in dt.
func ropeRotate(dt DType, a, b, c, s float32) (float32, float32) {
	if dt == F32 {
		return a*c - b*s, b*c + a*s
	}
	c, s = Round(dt, c), Round(dt, s)
	a, b = Round(dt, a), Round(dt, b)
	return Round(dt, Round(dt, a*c)-Round(dt, b*s)), Round(dt, Round(dt, b*c)+Round(dt, a*s))
}

// RoPE rotates one token's heads in place: x holds nHeads·headDim float32
// values, and pair i < headDim/2 of every head — (i, i + headDim/2), or
// (2i, 2i+1) when interleaved — turns by pos·invFreq[i] as RopePairIn
// computes it in dt. The cos and sin of each pair's angle are computed once
// for all heads (the same values RopePairIn gives). It panics when x or
// invFreq is short.
func RoPE(x []float32, nHeads, headDim int, pos int32, invFreq []float32, interleaved bool, dt DType) {
	half := headDim / 2
	x, invFreq = x[:nHeads*headDim], invFreq[:half]
	const batch = 64
	var cs, sn [batch]float32
	for i0 := 0; i0 < half; i0 += batch {
		n := min(batch, half-i0)
		for i := range n {
			cs[i], sn[i] = ropeAngle(pos, invFreq[i0+i])
		}
		for h := range nHeads {
			row := x[h*headDim : (h+1)*headDim]
			for i := range n {
				ia, ib := i0+i, i0+i+half
				if interleaved {
					ia, ib = 2*(i0+i), 2*(i0+i)+1
				}
				row[ia], row[ib] = ropeRotate(dt, row[ia], row[ib], cs[i], sn[i])
			}
		}
	}
}

// SiluMulValue is odt(odt(silu(g))·u), silu(g) = g/(1 + e^−g) in float32
// with e^−g through float64; f32 rounds nothing.
func SiluMulValue(g, u float32, odt DType) float32 {
	s := Round(odt, g/(1+float32(math.Exp(float64(-g)))))
	return Round(odt, s*u)
}

// SiluMul writes out[i] = SiluMulValue(rdt(g[i]), rdt(u[i]), odt) for i <
// len(out): the gate and up values rounded to rdt first (F32: not at all).
// It panics when g or u is shorter than out.
func SiluMul(out, g, u []float32, rdt, odt DType) {
	g, u = g[:len(out)], u[:len(out)]
	for i := range out {
		out[i] = SiluMulValue(Round(rdt, g[i]), Round(rdt, u[i]), odt)
	}
}

// Add adds y to x element-wise (x[i] += y[i] for i < len(x)); it panics
// when y is shorter.
func Add(x, y []float32) {
	y = y[:len(x)]
	for i := range x {
		x[i] += y[i]
	}
}

// SoftmaxScale multiplies each score by scale and returns their maximum
// (−Inf for none): the first half of a softmax over one split of
// positions.
func SoftmaxScale(s []float32, scale float32) float32 {
	m := float32(math.Inf(-1))
	for i, v := range s {
		v *= scale
		s[i] = v
		m = max(m, v)
	}
	return m
}

// SoftmaxExp replaces each scaled score by its weight float32(e^(s−m))
// (through float64) and returns their float32 sum, in order: the second
// half, after which Σ p·V / the sum is the attention output.
func SoftmaxExp(s []float32, m float32) float32 {
	var l float32
	for i, v := range s {
		w := float32(math.Exp(float64(v - m)))
		s[i] = w
		l += w
	}
	return l
}
