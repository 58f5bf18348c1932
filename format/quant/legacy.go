package quant

import (
	"math"

	"github.com/memwall/memwall/half"
)

// The 32-element types: one f16 scale (and for Q5_1 an f16 offset) per
// block. Their reference quantizers take the scale from the block's largest
// magnitude (Q8_0, Q4_0, Q5_0) or its range (Q5_1) and round each element
// once.

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

// symmetricScale is the scale Q4_0 and Q5_0 share: the element of largest
// magnitude (the first of equals) over −levels, its inverse (0 for an all
// zero block), and the scale stored as f16 at y[0:2].
func symmetricScale(y []byte, x *[32]float32, levels float32) (id float32) {
	var mx, amax float32
	for _, v := range x {
		if a := abs32(v); amax < a {
			amax, mx = a, v
		}
	}
	d := mx / -levels
	if d != 0 {
		id = 1 / d
	}
	put16(y[0:], half.F32ToF16(d))
	return id
}

func quantQ8_0(y *[34]byte, x *[32]float32) {
	var amax float32
	for _, v := range x {
		amax = max(amax, abs32(v))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	put16(y[0:], half.F32ToF16(d))
	for j, v := range x {
		// roundf, half away from zero: in float64 the half is added
		// exactly, and the conversion truncates toward zero.
		f := float64(v * id)
		y[2+j] = byte(int8(f + math.Copysign(0.5, f)))
	}
}

func dequantQ8_0(y *[32]float32, x *[34]byte) {
	d := half.F16ToF32(le16(x[0:]))
	for j := range y {
		y[j] = float32(int8(x[2+j])) * d
	}
}

func quantQ4_0(y *[18]byte, x *[32]float32) {
	id := symmetricScale(y[:], x, 8)
	for j := range 16 {
		y[2+j] = nibble(float32(x[j]*id), 8.5, 15) | nibble(float32(x[16+j]*id), 8.5, 15)<<4
	}
}

// nibble is ggml's MIN(top, (int8_t)(v + bias)): truncated toward zero.
func nibble(v, bias float32, top int8) uint8 {
	q := int8(v + bias)
	if q > top {
		q = top
	}
	return uint8(q)
}

func dequantQ4_0(y *[32]float32, x *[18]byte) {
	d := half.F16ToF32(le16(x[0:]))
	for j := range 16 {
		y[j] = float32(int(x[2+j]&0xF)-8) * d
		y[16+j] = float32(int(x[2+j]>>4)-8) * d
	}
}

func quantQ5_0(y *[22]byte, x *[32]float32) {
	id := symmetricScale(y[:], x, 16)
	var qh uint32
	for j := range 16 {
		q0, q1 := nibble(float32(x[j]*id), 16.5, 31), nibble(float32(x[16+j]*id), 16.5, 31)
		y[6+j] = q0&0xF | (q1&0xF)<<4
		qh |= uint32(q0&0x10)>>4<<j | uint32(q1&0x10)>>4<<(j+16)
	}
	put32(y[2:], qh)
}

func dequantQ5_0(y *[32]float32, x *[22]byte) {
	d := half.F16ToF32(le16(x[0:]))
	qh := le32(x[2:])
	for j := range 16 {
		h0 := byte(qh>>j<<4) & 0x10
		h1 := byte(qh>>(j+12)) & 0x10
		y[j] = float32(int(x[6+j]&0xF|h0)-16) * d
		y[16+j] = float32(int(x[6+j]>>4|h1)-16) * d
	}
}

func quantQ5_1(y *[24]byte, x *[32]float32) {
	lo, hi := float32(math.MaxFloat32), float32(-math.MaxFloat32)
	for _, v := range x {
		if v < lo {
			lo = v
		}
		if v > hi {
			hi = v
		}
	}
	d := (hi - lo) / 31
	var id float32
	if d != 0 {
		id = 1 / d
	}
	put16(y[0:], half.F32ToF16(d))
	put16(y[2:], half.F32ToF16(lo))
	var qh uint32
	for j := range 16 {
		q0 := uint8(float32((x[j]-lo)*id) + 0.5)
		q1 := uint8(float32((x[16+j]-lo)*id) + 0.5)
		y[8+j] = q0&0xF | (q1&0xF)<<4
		qh |= uint32(q0&0x10)>>4<<j | uint32(q1&0x10)>>4<<(j+16)
	}
	put32(y[4:], qh)
}

func dequantQ5_1(y *[32]float32, x *[24]byte) {
	d := half.F16ToF32(le16(x[0:]))
	m := half.F16ToF32(le16(x[2:]))
	qh := le32(x[4:])
	for j := range 16 {
		h0 := byte(qh>>j<<4) & 0x10
		h1 := byte(qh>>(j+12)) & 0x10
		y[j] = float32(float32(x[8+j]&0xF|h0)*d) + m
		y[16+j] = float32(float32(x[8+j]>>4|h1)*d) + m
	}
}
