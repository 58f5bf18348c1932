package quant

import (
	"math"

	"github.com/memwall/memwall/half"
)

// The k-quants: super-blocks of 256 elements. Q4_K and Q5_K cut one into 8
// sub-blocks of 32, each with a scale and a minimum quantized to 6 bits
// against two f16 super-block scales; Q6_K cuts it into 16 sub-blocks of 16
// with signed 8-bit scales against one f16 scale. Their reference
// quantizers search a few candidate scales per sub-block for the least
// weighted squared error.

// groupEps is ggml's GROUP_MAX_EPS: below it a group counts as all zero.
const groupEps = 1e-15

// nearestInt rounds f to the nearest integer, ties to even, by ggml's
// trick: adding 1.5·2^23 leaves the integer in the low mantissa bits. It
// holds for |f| ≤ 2^22−1; outside that it returns what ggml returns.
func nearestInt(f float32) int32 {
	v := float32(f) + 12582912 // the conversion keeps a product passed in from being fused with the add
	return int32(math.Float32bits(v)&0x7FFFFF) - 0x400000
}

func sqrt32(v float32) float32 { return float32(math.Sqrt(float64(v))) } // exact: double's sqrt rounds once more, correctly

func clamp(l, lo, hi int32) int32 { return max(lo, min(hi, l)) }

// makeQKX2 is ggml's make_qkx2_quants for a sub-block of 32: levels
// L[i] in [0, nmax] with x ≈ scale·L − min for the scale and min that give
// the least weighted squared error among the plain range's and nstep+1
// candidates iscale = (rmin + rdelta·is + nmax)/(max − min), each level
// round(iscale·(x − min)), where min is the best candidate's so far (as in
// ggml, a round that wins moves the offset the later rounds start from).
// It returns the scale and the min as ggml stores them (the min
// negated, so ≥ 0 after the clamp of a positive offset to 0).
func makeQKX2(nmax int32, x, w *[32]float32, L *[32]uint8, rmin, rdelta float32, nstep int) (scale, theMin float32) {
	lo, hi := x[0], x[0]
	sumW := w[0]
	sumX := float32(sumW * x[0])
	for i := 1; i < 32; i++ {
		if x[i] < lo {
			lo = x[i]
		}
		if x[i] > hi {
			hi = x[i]
		}
		sumW += w[i]
		sumX += float32(w[i] * x[i])
	}
	if lo > 0 {
		lo = 0
	}
	if hi == lo {
		*L = [32]uint8{}
		return 0, -lo
	}
	// x − min, kept for the rounds: ggml's rounds use the min of the best
	// candidate so far, so it changes when one wins.
	var xm [32]float32
	for i, v := range x {
		xm[i] = v - lo
	}
	fmax := float32(nmax)
	iscale := fmax / (hi - lo)
	scale = 1 / iscale
	var best float32
	for i, v := range x {
		l := uint8(clamp(nearestInt(float32(iscale*xm[i])), 0, nmax))
		L[i] = l
		diff := float32(scale*float32(l)) + lo - v
		best += float32(w[i] * float32(diff*diff))
	}
	var aux [32]uint8
	for is := 0; is <= nstep; is++ {
		iscale = (float32(rmin+float32(rdelta*float32(is))) + fmax) / (hi - lo)
		var sumL, sumL2, sumXL float32
		for i, v := range x {
			l := uint8(clamp(nearestInt(float32(iscale*xm[i])), 0, nmax))
			aux[i] = l
			fl := float32(l)
			wl := float32(w[i] * fl)
			sumL += wl
			sumL2 += float32(wl * fl)
			sumXL += float32(wl * v)
		}
		D := float32(sumW*sumL2) - float32(sumL*sumL)
		if !(D > 0) {
			continue
		}
		thisScale := (float32(sumW*sumXL) - float32(sumX*sumL)) / D
		thisMin := (float32(sumL2*sumX) - float32(sumL*sumXL)) / D
		if thisMin > 0 {
			thisMin = 0
			thisScale = sumXL / sumL2
		}
		var cur float32
		for i, v := range x {
			diff := float32(thisScale*float32(aux[i])) + thisMin - v
			cur += float32(w[i] * float32(diff*diff))
		}
		if cur < best {
			*L = aux
			best = cur
			scale, lo = thisScale, thisMin
			for i, v := range x {
				xm[i] = v - lo
			}
		}
	}
	return scale, -lo
}

// makeQX is ggml's make_qx_quants for a sub-block of 16 with rmse_type 1
// (weights x²) and no importance weights: signed levels L[i]−nmax in
// [−nmax, nmax−1] for the best of 19 candidate scales around −nmax/max.
func makeQX(nmax int32, x *[16]float32, L *[16]uint8) float32 {
	var mx, amax float32
	for _, v := range x {
		if a := abs32(v); a > amax {
			amax, mx = a, v
		}
	}
	if amax < groupEps {
		*L = [16]uint8{}
		return 0
	}
	// ggml's weight w = x² and the product w·x, the same in every round.
	var w, wx [16]float32
	for i, v := range x {
		w[i] = v * v
		wx[i] = w[i] * v
	}
	fmax := float32(nmax)
	iscale := -fmax / mx
	var sumLX, sumL2 float32
	for i, v := range x {
		l := clamp(nearestInt(float32(iscale*v)), -nmax, nmax-1)
		L[i] = uint8(l + nmax)
		fl := float32(l)
		sumLX += float32(wx[i] * fl)
		sumL2 += float32(float32(w[i]*fl) * fl)
	}
	var scale float32
	if sumL2 != 0 {
		scale = sumLX / sumL2
	}
	best := scale * sumLX
	for is := int32(-9); is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale = -(fmax + float32(0.1*float32(is))) / mx
		sumLX, sumL2 = 0, 0
		for i, v := range x {
			fl := float32(clamp(nearestInt(float32(iscale*v)), -nmax, nmax-1))
			sumLX += float32(wx[i] * fl)
			sumL2 += float32(float32(w[i]*fl) * fl)
		}
		if sumL2 > 0 && float32(sumLX*sumLX) > float32(best*sumL2) {
			for i, v := range x {
				L[i] = uint8(clamp(nearestInt(float32(iscale*v)), -nmax, nmax-1) + nmax)
			}
			scale = sumLX / sumL2
			best = scale * sumLX
		}
	}
	return scale
}

// scaleMinK4 unpacks sub-block j's 6-bit scale and min from the 12 bytes
// of a Q4_K or Q5_K block: j < 4 in the low 6 bits of bytes j and j+4, the
// others split between a nibble of byte j+4 and the top 2 bits of bytes
// j−4 (scale) and j (min).
func scaleMinK4(j int, q *[12]byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0xF | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}

// subScale is sub-block j's scale and min as Q4_K's and Q5_K's
// dequantizers apply them: d·sc and dmin·m.
func subScale(j int, q *[12]byte, d, dmin float32) (scale, min float32) {
	s, m := scaleMinK4(j, q)
	return d * float32(s), float32(dmin * float32(m))
}

// packScalesK4 is scaleMinK4's inverse for all 8 sub-blocks.
func packScalesK4(q *[12]byte, ls, lm *[8]uint8) {
	for j := range 4 {
		q[j], q[j+4] = ls[j], lm[j]
	}
	for j := 4; j < 8; j++ {
		q[j+4] = ls[j]&0xF | (lm[j]&0xF)<<4
		q[j-4] |= (ls[j] >> 4) << 6
		q[j] |= (lm[j] >> 4) << 6
	}
}

// quantK45 is the part Q4_K and Q5_K share: the sub-blocks' levels L (0 to
// nmax), the packed scales and the two f16 super-block scales, as
// quantize_row_q4_K_ref and quantize_row_q5_K_ref compute them.
func quantK45(x *[256]float32, nmax int32, rmin, rdelta float32, nstep int, L *[256]uint8, sc *[12]byte) (d, dmin uint16) {
	var scales, mins [8]float32
	var maxScale, maxMin float32
	var w [8][32]float32
	for j := range 8 {
		xs := (*[32]float32)(x[32*j:])
		var sumX2 float32
		for _, v := range xs {
			sumX2 += float32(v * v)
		}
		av := sqrt32(sumX2 / 32)
		for l, v := range xs {
			w[j][l] = av + abs32(v)
		}
	}
	for j := 0; j < 8; j += 2 {
		scales[j], mins[j], scales[j+1], mins[j+1] = makeQKX2Pair(nmax, (*[32]float32)(x[32*j:]), (*[32]float32)(x[32*j+32:]),
			&w[j], &w[j+1], (*[32]uint8)(L[32*j:]), (*[32]uint8)(L[32*j+32:]), rmin, rdelta, nstep)
	}
	for j := range 8 {
		if scales[j] > maxScale {
			maxScale = scales[j]
		}
		if mins[j] > maxMin {
			maxMin = mins[j]
		}
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	var ls, lm [8]uint8
	for j := range 8 {
		ls[j] = min(63, uint8(nearestInt(float32(invScale*scales[j]))))
		lm[j] = min(63, uint8(nearestInt(float32(invMin*mins[j]))))
	}
	packScalesK4(sc, &ls, &lm)
	d, dmin = half.F32ToF16(maxScale/63), half.F32ToF16(maxMin/63)
	fd, fmin := half.F16ToF32(d), half.F16ToF32(dmin)
	for j := range 8 {
		s, m := scaleMinK4(j, sc)
		dj := fd * float32(s)
		if dj == 0 {
			continue // the levels from the search stay
		}
		dm := float32(fmin * float32(m))
		for i := 32 * j; i < 32*j+32; i++ {
			L[i] = uint8(clamp(nearestInt((x[i]+dm)/dj), 0, nmax))
		}
	}
	return d, dmin
}

func quantQ4_K(y *[144]byte, x *[256]float32) {
	var L [256]uint8
	d, dmin := quantK45(x, 15, -1, 0.1, 20, &L, (*[12]byte)(y[4:]))
	put16(y[0:], d)
	put16(y[2:], dmin)
	q := y[16:]
	for j := 0; j < 256; j += 64 {
		for l := range 32 {
			q[l] = L[j+l] | L[j+l+32]<<4
		}
		q = q[32:]
	}
}

func dequantQ4_K(y *[256]float32, x *[144]byte) {
	d, dmin := half.F16ToF32(le16(x[0:])), half.F16ToF32(le16(x[2:]))
	sc := (*[12]byte)(x[4:])
	q := x[16:]
	for j := 0; j < 4; j++ {
		d1, m1 := subScale(2*j, sc, d, dmin)
		d2, m2 := subScale(2*j+1, sc, d, dmin)
		o := y[64*j : 64*j+64]
		for l := range 32 {
			o[l] = float32(d1*float32(q[l]&0xF)) - m1
			o[32+l] = float32(d2*float32(q[l]>>4)) - m2
		}
		q = q[32:]
	}
}

func quantQ5_K(y *[176]byte, x *[256]float32) {
	var L [256]uint8
	d, dmin := quantK45(x, 31, -0.5, 0.1, 15, &L, (*[12]byte)(y[4:]))
	put16(y[0:], d)
	put16(y[2:], dmin)
	qh := (*[32]byte)(y[16:])
	*qh = [32]byte{}
	ql := y[48:]
	m1, m2 := uint8(1), uint8(2)
	for n := 0; n < 256; n += 64 {
		for j := range 32 {
			l1, l2 := L[n+j], L[n+j+32]
			if l1 > 15 {
				l1 -= 16
				qh[j] |= m1
			}
			if l2 > 15 {
				l2 -= 16
				qh[j] |= m2
			}
			ql[j] = l1 | l2<<4
		}
		m1 <<= 2
		m2 <<= 2
		ql = ql[32:]
	}
}

func dequantQ5_K(y *[256]float32, x *[176]byte) {
	d, dmin := half.F16ToF32(le16(x[0:])), half.F16ToF32(le16(x[2:]))
	sc := (*[12]byte)(x[4:])
	qh := (*[32]byte)(x[16:])
	ql := x[48:]
	u1, u2 := uint8(1), uint8(2)
	for j := 0; j < 4; j++ {
		d1, m1 := subScale(2*j, sc, d, dmin)
		d2, m2 := subScale(2*j+1, sc, d, dmin)
		o := y[64*j : 64*j+64]
		for l := range 32 {
			lo, hi := int32(ql[l]&0xF), int32(ql[l]>>4)
			if qh[l]&u1 != 0 {
				lo += 16
			}
			if qh[l]&u2 != 0 {
				hi += 16
			}
			o[l] = float32(d1*float32(lo)) - m1
			o[32+l] = float32(d2*float32(hi)) - m2
		}
		ql = ql[32:]
		u1 <<= 2
		u2 <<= 2
	}
}

// xs16Max is the largest |x| of a Q6_K sub-block.
func xs16Max(x *[16]float32) float32 {
	var m float32
	for _, v := range x {
		if a := abs32(v); a > m {
			m = a
		}
	}
	return m
}

func quantQ6_K(y *[210]byte, x *[256]float32) {
	var L [256]uint8
	var scales [16]float32
	var maxScale, maxAbs float32
	for ib := 0; ib < 16; ib += 2 {
		scales[ib], scales[ib+1] = makeQXPair(32, (*[16]float32)(x[16*ib:]), (*[16]float32)(x[16*ib+16:]), (*[16]uint8)(L[16*ib:]), (*[16]uint8)(L[16*ib+16:]))
	}
	for _, s := range scales {
		if a := abs32(s); a > maxAbs {
			maxAbs, maxScale = a, s
		}
	}
	if maxAbs < groupEps {
		*y = [210]byte{}
		return
	}
	iscale := -128 / maxScale
	d := half.F32ToF16(1 / iscale)
	put16(y[208:], d)
	sc := (*[16]byte)(y[192:])
	for ib := range 16 {
		sc[ib] = byte(int8(min(127, nearestInt(float32(iscale*scales[ib])))))
	}
	fd := half.F16ToF32(d)
	for j := range 16 {
		dj := fd * float32(int8(sc[j]))
		if dj == 0 {
			continue
		}
		xs, ls := (*[16]float32)(x[16*j:]), (*[16]uint8)(L[16*j:])
		if !(xs16Max(xs)/abs32(dj) < maxLevelArg/2) {
			for i, v := range xs {
				ls[i] = uint8(clamp(nearestInt(v/dj), -32, 31) + 32)
			}
			continue
		}
		for i, v := range xs {
			r := float32(v/dj+12582912) - 12582912 // nearestInt's value, as a float: see kquants_pair.go
			if r < -32 {
				r = -32
			} else if r > 31 {
				r = 31
			}
			ls[i] = uint8(int32(r) + 32)
		}
	}
	ql, qh := y[0:128], y[128:192]
	for j := 0; j < 256; j += 128 {
		for l := range 32 {
			a, b, c, e := L[j+l], L[j+l+32], L[j+l+64], L[j+l+96]
			ql[l] = a&0xF | (c&0xF)<<4
			ql[l+32] = b&0xF | (e&0xF)<<4
			qh[l] = a>>4 | (b>>4)<<2 | (c>>4)<<4 | (e>>4)<<6
		}
		ql, qh = ql[64:], qh[32:]
	}
}

func dequantQ6_K(y *[256]float32, x *[210]byte) {
	d := half.F16ToF32(le16(x[208:]))
	ql, qh, sc := x[0:128], x[128:192], x[192:208]
	for n := 0; n < 2; n++ {
		o := y[128*n : 128*n+128]
		s := sc[8*n : 8*n+8]
		for l := range 32 {
			is := l / 16
			q1 := int32(ql[l]&0xF|(qh[l]&3)<<4) - 32
			q2 := int32(ql[l+32]&0xF|(qh[l]>>2&3)<<4) - 32
			q3 := int32(ql[l]>>4|(qh[l]>>4&3)<<4) - 32
			q4 := int32(ql[l+32]>>4|(qh[l]>>6&3)<<4) - 32
			o[l] = d * float32(int8(s[is])) * float32(q1)
			o[l+32] = d * float32(int8(s[is+2])) * float32(q2)
			o[l+64] = d * float32(int8(s[is+4])) * float32(q3)
			o[l+96] = d * float32(int8(s[is+6])) * float32(q4)
		}
		ql, qh = ql[64:], qh[32:]
	}
}
