package hostmath

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/memwall/memwall/half"
)

// QType is a block-quantized weight type as GGUF files store it (ggml's
// block layouts, little-endian, f16 scales): a row is a whole number of
// blocks of BlockElems elements in BlockBytes bytes.
type QType uint8

// The block-quantized types the products take.
const (
	Q8_0 QType = iota // 32 elements, 34 bytes: d f16, 32 int8; x = q·d
	Q4_0              // 32 elements, 18 bytes: d f16, 16 nibble pairs; x = (q−8)·d
	Q4_K              // 256 elements, 144 bytes: d, dmin f16, 12 bytes of 6-bit scales and mins, 128 nibble pairs
	Q5_K              // 256 elements, 176 bytes: Q4_K with 32 bytes of fifth bits
	Q6_K              // 256 elements, 210 bytes: 128 low nibbles, 64 of top bit pairs, 16 int8 scales, d f16
	numQTypes
)

var qtypes = [numQTypes]struct {
	name         string
	elems, bytes int
}{
	Q8_0: {"Q8_0", 32, 34},
	Q4_0: {"Q4_0", 32, 18},
	Q4_K: {"Q4_K", 256, 144},
	Q5_K: {"Q5_K", 256, 176},
	Q6_K: {"Q6_K", 256, 210},
}

// QTypes lists the block-quantized types, in QType order.
func QTypes() []QType { return []QType{Q8_0, Q4_0, Q4_K, Q5_K, Q6_K} }

// BlockElems returns the elements of one block (0 for an unknown QType).
func (q QType) BlockElems() int {
	if q >= numQTypes {
		return 0
	}
	return qtypes[q].elems
}

// BlockBytes returns the bytes of one block (0 for an unknown QType).
func (q QType) BlockBytes() int {
	if q >= numQTypes {
		return 0
	}
	return qtypes[q].bytes
}

func (q QType) String() string {
	if q >= numQTypes {
		return fmt.Sprintf("QType(%d)", uint8(q))
	}
	return qtypes[q].name
}

// deqFunc is an assembly dequantizer: nb whole blocks at src into nb·elems
// float32 at dst.
type deqFunc func(dst, src unsafe.Pointer, nb uintptr)

// checkBlocks panics unless dst is a whole number of q's blocks and src
// holds at least their bytes; it returns the number of blocks.
func checkBlocks(q QType, dst int, src int) int {
	e := q.BlockElems()
	if e == 0 || dst%e != 0 || src < dst/e*q.BlockBytes() {
		panic(fmt.Sprintf("hostmath: dequantize %v: %d elements, %d bytes: not whole blocks", q, dst, src))
	}
	return dst / e
}

// Dequant decodes len(dst)/q.BlockElems() blocks from the start of src
// into dst, giving the values ggml's dequantizers give, bit for bit (a NaN
// scale gives NaNs whose payload bits may differ between variants). It
// panics when len(dst) is not a whole number of blocks or src is shorter
// than their bytes; src may start at any alignment.
func (k *Kernels) Dequant(q QType, dst []float32, src []byte) {
	nb := checkBlocks(q, len(dst), len(src))
	if nb == 0 {
		return
	}
	if f := k.arch.deq[q]; f != nil {
		f(unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0]), uintptr(nb))
		return
	}
	dequantGeneric(q, dst, src[:nb*q.BlockBytes()])
}

// qChunkBytes is about how many bytes of float32 rows a worker of QMatmul
// dequantizes at a time: they stay in the core's L2 while the float32 dots
// read them back.
const qChunkBytes = 64 << 10

// qRows returns the rows per chunk of a QMatmul with K columns.
func qRows(K int) int { return max(1, qChunkBytes/(4*K)) }

// QMatmul computes y[t·M + m] = Σ_{k<K} W[m, k]·x[t·K + k] for W M×K in
// q, row-major (each row K/q.BlockElems() blocks; w holds their bytes at
// any alignment), x T×K float32 and y T×M float32. The rows are split over
// r's workers in whole rows, each dequantizing a few rows at a time (Dequant's
// values, exactly) into a buffer in its cache and multiplying them with the
// float32 dots of Matmul, so the results are Matmul's over the dequantized
// matrix, bit for bit. It panics when K is not a whole number of blocks or
// a slice is shorter than the dimensions need.
func (k *Kernels) QMatmul(r *Runner, y []float32, w []byte, q QType, x []float32, M, K, T int) {
	e := q.BlockElems()
	if e == 0 || M < 0 || K < 0 || T < 0 || K%e != 0 {
		panic(fmt.Sprintf("hostmath: qmatmul %v M=%d K=%d T=%d: K is not a whole number of blocks", q, M, K, T))
	}
	rowB := K / e * q.BlockBytes()
	if M == 0 || T == 0 {
		return
	}
	if len(y) < T*M || len(w) < M*rowB || len(x) < T*K {
		panic(fmt.Sprintf("hostmath: qmatmul %v M=%d K=%d T=%d: y has %d elements, w %d bytes, x %d", q, M, K, T, len(y), len(w), len(x)))
	}
	if K == 0 {
		clear(y[:T*M])
		return
	}
	rows := qRows(K)
	r.Run(M, 1, func(lo, hi int) {
		bp := f32Pool.Get().(*[]float32)
		defer f32Pool.Put(bp)
		if cap(*bp) < rows*K {
			*bp = make([]float32, rows*K)
		}
		for m0 := lo; m0 < hi; m0 += rows {
			n := min(rows, hi-m0)
			buf := (*bp)[:n*K]
			k.Dequant(q, buf, w[m0*rowB:(m0+n)*rowB])
			wb := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), 4*len(buf))
			k.Dots(y[m0:], M, wb, 4*K, F32, x, K, n, K, T)
		}
	})
}

// dequantGeneric is Dequant in Go: ggml's dequantizers, operation by
// operation (every product rounded to float32 before the next operation).
func dequantGeneric(q QType, dst []float32, src []byte) {
	e, b := q.BlockElems(), q.BlockBytes()
	for i := range len(dst) / e {
		y, x := dst[i*e:(i+1)*e], src[i*b:(i+1)*b]
		switch q {
		case Q8_0:
			d := half.F16ToF32(binary.LittleEndian.Uint16(x))
			for j := range 32 {
				y[j] = float32(int8(x[2+j])) * d
			}
		case Q4_0:
			d := half.F16ToF32(binary.LittleEndian.Uint16(x))
			for j := range 16 {
				y[j] = float32(int(x[2+j]&0xF)-8) * d
				y[16+j] = float32(int(x[2+j]>>4)-8) * d
			}
		case Q4_K, Q5_K:
			dequantK45((*[256]float32)(y), q, x)
		case Q6_K:
			dequantQ6K((*[256]float32)(y), x)
		}
	}
}

// dequantK45 decodes one Q4_K or Q5_K block: element 64j+l is
// d·sc·q − dmin·m with sub-block 2j's scale and min for l < 32, 2j+1's above.
func dequantK45(y *[256]float32, q QType, x []byte) {
	d, dmin := half.F16ToF32(binary.LittleEndian.Uint16(x)), half.F16ToF32(binary.LittleEndian.Uint16(x[2:]))
	sc := x[4:16]
	qs, qh := x[16:], []byte(nil)
	if q == Q5_K {
		qs, qh = x[48:], x[16:48]
	}
	for j := range 4 {
		d1, m1 := scaleMin(2*j, sc, d, dmin)
		d2, m2 := scaleMin(2*j+1, sc, d, dmin)
		for l := range 32 {
			lo, hi := int32(qs[32*j+l]&0xF), int32(qs[32*j+l]>>4)
			if qh != nil {
				lo |= int32(qh[l]>>(2*j)&1) << 4
				hi |= int32(qh[l]>>(2*j+1)&1) << 4
			}
			y[64*j+l] = float32(d1*float32(lo)) - m1
			y[64*j+32+l] = float32(d2*float32(hi)) - m2
		}
	}
}

// scaleMin is sub-block j's d·sc and dmin·m of a Q4_K or Q5_K block, the
// 6-bit sc and m unpacked from its 12 scale bytes as ggml's
// get_scale_min_k4 does.
func scaleMin(j int, q []byte, d, dmin float32) (float32, float32) {
	var s, m uint8
	if j < 4 {
		s, m = q[j]&63, q[j+4]&63
	} else {
		s, m = q[j+4]&0xF|(q[j-4]>>6)<<4, q[j+4]>>4|(q[j]>>6)<<4
	}
	return d * float32(s), float32(dmin * float32(m))
}

// dequantQ6K decodes one Q6_K block: element 128n + 32i + l is
// d·sc·(q−32), q's low 4 bits from ql and top 2 from qh, sc the scale of
// its sub-block of 16.
func dequantQ6K(y *[256]float32, x []byte) {
	d := half.F16ToF32(binary.LittleEndian.Uint16(x[208:]))
	for n := range 2 {
		ql, qh, sc := x[64*n:], x[128+32*n:], x[192+8*n:]
		for l := range 32 {
			is := l / 16
			q := [4]int32{
				int32(ql[l]&0xF|(qh[l]&3)<<4) - 32,
				int32(ql[l+32]&0xF|(qh[l]>>2&3)<<4) - 32,
				int32(ql[l]>>4|(qh[l]>>4&3)<<4) - 32,
				int32(ql[l+32]>>4|(qh[l]>>6&3)<<4) - 32,
			}
			for i, v := range q {
				y[128*n+32*i+l] = float32(d*float32(int8(sc[is+2*i]))) * float32(v)
			}
		}
	}
}
