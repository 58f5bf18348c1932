package quant

// The searches of makeQKX2 and makeQX, two sub-blocks at a time: the same
// results bit for bit, in fewer instructions and with the two searches'
// chains of dependent additions side by side, where the processor overlaps
// them. A level is computed as a float, round(v) = (v + 1.5·2^23) − 1.5·2^23,
// which is nearestInt's integer exactly while |v| < 2^22 − 1; a round whose
// values could leave that range (see maxLevelArg) takes nearestInt itself.

// maxLevelArg bounds the arguments of the float rounding.
const maxLevelArg = 4194303

// roundLevels sets out[i] to round(iscale·xm[i]) clamped to [lo, hi], as a
// float; xmMax is the largest |xm[i]|.
func roundLevels(out, xm *[32]float32, iscale, xmMax, lo, hi float32) {
	_, _ = out[0], xm[0] // nil checks out of the loops
	if !(float32(abs32(iscale)*xmMax) < maxLevelArg) {
		for i, v := range xm {
			out[i] = float32(clamp(nearestInt(float32(iscale*v)), int32(lo), int32(hi)))
		}
		return
	}
	for i, v := range xm {
		r := float32(float32(iscale*v)+12582912) - 12582912
		if r < lo {
			r = lo
		} else if r > hi {
			r = hi
		}
		out[i] = r
	}
}

// xmBound is the largest |x − lo| over a sub-block whose values span
// [xmin, xmax]: rounding is monotonic, so it is at an end.
func xmBound(xmin, xmax, lo float32) float32 {
	a, b := abs32(xmin-lo), abs32(xmax-lo)
	if a > b {
		return a
	}
	return b
}

func toLevels(L *[32]uint8, f *[32]float32) {
	for i, v := range f {
		L[i] = uint8(v)
	}
}

// makeQKX2Pair is makeQKX2 for sub-blocks a and b.
func makeQKX2Pair(nmax int32, xa, xb, wa, wb *[32]float32, La, Lb *[32]uint8, rmin, rdelta float32, nstep int) (scaleA, minA, scaleB, minB float32) {
	_, _, _, _, _, _ = xa[0], xb[0], wa[0], wb[0], La[0], Lb[0] // nil checks out of the loops
	loA, hiA, loB, hiB := xa[0], xa[0], xb[0], xb[0]
	sumWA, sumWB := wa[0], wb[0]
	sumXA, sumXB := float32(sumWA*xa[0]), float32(sumWB*xb[0])
	for i := 1; i < 32; i++ {
		va, vb := xa[i], xb[i]
		loA, hiA = min(loA, va), max(hiA, va)
		loB, hiB = min(loB, vb), max(hiB, vb)
		sumWA += wa[i]
		sumWB += wb[i]
		sumXA += float32(wa[i] * va)
		sumXB += float32(wb[i] * vb)
	}
	minXA, minXB := loA, loB
	loA, loB = min(loA, 0), min(loB, 0)
	if !(hiA > loA) || !(hiB > loB) {
		// A constant sub-block (or one with a NaN): makeQKX2's own ways.
		scaleA, minA = makeQKX2(nmax, xa, wa, La, rmin, rdelta, nstep)
		scaleB, minB = makeQKX2(nmax, xb, wb, Lb, rmin, rdelta, nstep)
		return
	}
	var xmA, xmB [32]float32
	for i := range 32 {
		xmA[i], xmB[i] = xa[i]-loA, xb[i]-loB
	}
	xmaxA, xmaxB := xmBound(minXA, hiA, loA), xmBound(minXB, hiB, loB)
	fmax := float32(nmax)
	iA, iB := fmax/(hiA-loA), fmax/(hiB-loB)
	scaleA, scaleB = 1/iA, 1/iB
	var auxA, auxB [32]float32
	roundLevels(&auxA, &xmA, iA, xmaxA, 0, fmax)
	roundLevels(&auxB, &xmB, iB, xmaxB, 0, fmax)
	toLevels(La, &auxA)
	toLevels(Lb, &auxB)
	var bestA, bestB float32
	for i := range 32 {
		da := float32(scaleA*auxA[i]) + loA - xa[i]
		db := float32(scaleB*auxB[i]) + loB - xb[i]
		bestA += float32(wa[i] * float32(da*da))
		bestB += float32(wb[i] * float32(db*db))
	}
	for is := 0; is <= nstep; is++ {
		step := float32(rmin+float32(rdelta*float32(is))) + fmax
		iA, iB = step/(hiA-loA), step/(hiB-loB)
		roundLevels(&auxA, &xmA, iA, xmaxA, 0, fmax)
		roundLevels(&auxB, &xmB, iB, xmaxB, 0, fmax)
		var sLA, sL2A, sXLA, sLB, sL2B, sXLB float32
		for i := range 32 {
			fa, fb := auxA[i], auxB[i]
			wla, wlb := float32(wa[i]*fa), float32(wb[i]*fb)
			sLA += wla
			sLB += wlb
			sL2A += float32(wla * fa)
			sL2B += float32(wlb * fb)
			sXLA += float32(wla * xa[i])
			sXLB += float32(wlb * xb[i])
		}
		DA := float32(sumWA*sL2A) - float32(sLA*sLA)
		DB := float32(sumWB*sL2B) - float32(sLB*sLB)
		okA, okB := DA > 0, DB > 0
		if !okA && !okB {
			continue
		}
		// A lane whose D is not positive computes an error it does not use.
		tsA := (float32(sumWA*sXLA) - float32(sumXA*sLA)) / DA
		tmA := (float32(sL2A*sumXA) - float32(sLA*sXLA)) / DA
		if tmA > 0 {
			tmA = 0
			tsA = sXLA / sL2A
		}
		tsB := (float32(sumWB*sXLB) - float32(sumXB*sLB)) / DB
		tmB := (float32(sL2B*sumXB) - float32(sLB*sXLB)) / DB
		if tmB > 0 {
			tmB = 0
			tsB = sXLB / sL2B
		}
		var curA, curB float32
		for i := range 32 {
			da := float32(tsA*auxA[i]) + tmA - xa[i]
			db := float32(tsB*auxB[i]) + tmB - xb[i]
			curA += float32(wa[i] * float32(da*da))
			curB += float32(wb[i] * float32(db*db))
		}
		if okA && curA < bestA {
			toLevels(La, &auxA)
			bestA, scaleA, loA = curA, tsA, tmA
			for i := range 32 {
				xmA[i] = xa[i] - loA
			}
			xmaxA = xmBound(minXA, hiA, loA)
		}
		if okB && curB < bestB {
			toLevels(Lb, &auxB)
			bestB, scaleB, loB = curB, tsB, tmB
			for i := range 32 {
				xmB[i] = xb[i] - loB
			}
			xmaxB = xmBound(minXB, hiB, loB)
		}
	}
	return scaleA, -loA, scaleB, -loB
}

// makeQXPair is makeQX for sub-blocks a and b.
func makeQXPair(nmax int32, xa, xb *[16]float32, La, Lb *[16]uint8) (scaleA, scaleB float32) {
	_, _, _, _ = xa[0], xb[0], La[0], Lb[0] // nil checks out of the loops
	var mA, aA, mB, aB float32
	for i := range 16 {
		if v := abs32(xa[i]); v > aA {
			aA, mA = v, xa[i]
		}
		if v := abs32(xb[i]); v > aB {
			aB, mB = v, xb[i]
		}
	}
	if !(aA >= groupEps) || !(aB >= groupEps) {
		return makeQX(nmax, xa, La), makeQX(nmax, xb, Lb)
	}
	var wA, wxA, wB, wxB [16]float32
	for i := range 16 {
		wA[i], wB[i] = xa[i]*xa[i], xb[i]*xb[i]
		wxA[i], wxB[i] = wA[i]*xa[i], wB[i]*xb[i]
	}
	fmax := float32(nmax)
	lo, hi := -fmax, fmax-1
	var auxA, auxB [16]float32
	keep := func(L *[16]uint8, aux *[16]float32) {
		for i, v := range aux {
			L[i] = uint8(int32(v) + nmax)
		}
	}
	sLXA, sL2A, sLXB, sL2B := qxLevels(xa, xb, &wA, &wxA, &wB, &wxB, &auxA, &auxB, -fmax/mA, -fmax/mB, lo, hi)
	keep(La, &auxA)
	keep(Lb, &auxB)
	if sL2A != 0 {
		scaleA = sLXA / sL2A
	}
	if sL2B != 0 {
		scaleB = sLXB / sL2B
	}
	bestA, bestB := scaleA*sLXA, scaleB*sLXB
	for is := int32(-9); is <= 9; is++ {
		if is == 0 {
			continue
		}
		step := fmax + float32(0.1*float32(is))
		sLXA, sL2A, sLXB, sL2B = qxLevels(xa, xb, &wA, &wxA, &wB, &wxB, &auxA, &auxB, -step/mA, -step/mB, lo, hi)
		if sL2A > 0 && float32(sLXA*sLXA) > float32(bestA*sL2A) {
			keep(La, &auxA)
			scaleA = sLXA / sL2A
			bestA = scaleA * sLXA
		}
		if sL2B > 0 && float32(sLXB*sLXB) > float32(bestB*sL2B) {
			keep(Lb, &auxB)
			scaleB = sLXB / sL2B
			bestB = scaleB * sLXB
		}
	}
	return scaleA, scaleB
}

// qxLevels rounds iA·xa and iB·xb to levels clamped to [lo, hi] into auxA
// and auxB and returns makeQX's sums for both: Σ w·x·l and Σ w·l·l.
func qxLevels(xa, xb, wA, wxA, wB, wxB, auxA, auxB *[16]float32, iA, iB, lo, hi float32) (sLXA, sL2A, sLXB, sL2B float32) {
	_, _, _, _, _, _, _, _ = xa[0], xb[0], wA[0], wxA[0], wB[0], wxB[0], auxA[0], auxB[0] // nil checks out of the loop
	ilo, ihi := int32(lo), int32(hi)
	for i := range 16 {
		ia := min(max(nearestInt(float32(iA*xa[i])), ilo), ihi)
		ib := min(max(nearestInt(float32(iB*xb[i])), ilo), ihi)
		ra, rb := float32(ia), float32(ib)
		auxA[i], auxB[i] = ra, rb
		sLXA += float32(wxA[i] * ra)
		sLXB += float32(wxB[i] * rb)
		sL2A += float32(float32(wA[i]*ra) * ra)
		sL2B += float32(float32(wB[i]*rb) * rb)
	}
	return
}
