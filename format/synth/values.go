package synth

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"

	"github.com/memwall/memwall/format/quant"
	"github.com/memwall/memwall/half"
)

// Values are drawn from a counter-based generator, so any element of any
// tensor can be recomputed on its own: element i of a tensor takes the 16-bit
// lane i%4 of mix(stream + (i/4+1)·γ), where stream is derived from the seed
// and the tensor's key, γ is the golden-ratio increment of SplitMix64 and mix
// its finalizer. Lane r maps to Mean + Amplitude·((r+0.5)/32768 − 1), a
// uniform value strictly inside Mean ± Amplitude; BF16, F16 and F32 files
// store that same value, rounded to nearest even where the type is narrower.

// Amplitude is the half-width of the uniform weight distribution.
const Amplitude = 0.05

const gamma = 0x9E3779B97F4A7C15

func mix(z uint64) uint64 {
	z ^= z >> 30
	z *= 0xBF58476D1CE4E5B9
	z ^= z >> 27
	z *= 0x94D049BB133111EB
	z ^= z >> 31
	return z
}

// stream is the generator state of one tensor.
func stream(seed uint64, key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return mix(seed ^ mix(h.Sum64()))
}

func laneValue(r uint16, mean, amp float32) float32 {
	return mean + amp*((float32(r)+0.5)/32768-1)
}

// Value returns element i (in row-major order) of the tensor with the given
// key and mean, for seed, as a float32 before rounding to the file's dtype.
func Value(seed uint64, key string, mean float32, i uint64) float32 {
	r := mix(stream(seed, key) + (i/4+1)*gamma)
	return laneValue(uint16(r>>(16*(i%4))), mean, Amplitude)
}

// Value returns element i (in row-major Hugging Face order) of the tensor
// for seed, before rounding to its dtype: Value(seed, t.Key, t.Mean, i)
// with the amplitude widened by t.Scale.
func (t Tensor) Value(seed, i uint64) float32 {
	r := mix(stream(seed, t.Key) + (i/4+1)*gamma)
	return laneValue(uint16(r>>(16*(i%4))), t.Mean, t.amplitude())
}

func (t Tensor) amplitude() float32 {
	if t.Scale == 0 {
		return Amplitude
	}
	return Amplitude * t.Scale
}

// codec encodes every possible lane for one dtype and mean.
type codec struct {
	size int              // bytes per element
	t16  *[1 << 16]uint16 // BF16, F16
	t32  *[1 << 16]uint32 // F32
}

func newCodec(dtype string, mean, amp float32) (*codec, error) {
	return newCodecVia(dtype, "", mean, amp)
}

// newCodecVia is newCodec for values rounded to via ("BF16", "F16") first.
func newCodecVia(dtype, via string, mean, amp float32) (*codec, error) {
	value := func(r uint16) float32 { return laneValue(r, mean, amp) }
	switch via {
	case "":
	case "BF16":
		value = func(r uint16) float32 { return half.BF16ToF32(half.F32ToBF16(laneValue(r, mean, amp))) }
	case "F16":
		value = func(r uint16) float32 { return half.F16ToF32(half.F32ToF16(laneValue(r, mean, amp))) }
	default:
		return nil, fmt.Errorf("synth: via dtype %q: want BF16 or F16", via)
	}
	c := &codec{}
	switch dtype {
	case "BF16", "F16":
		c.size = 2
		c.t16 = new([1 << 16]uint16)
		enc := half.F32ToBF16
		if dtype == "F16" {
			enc = half.F32ToF16
		}
		for r := range c.t16 {
			c.t16[r] = enc(value(uint16(r)))
		}
	case "F32":
		c.size = 4
		c.t32 = new([1 << 16]uint32)
		for r := range c.t32 {
			c.t32[r] = math.Float32bits(value(uint16(r)))
		}
	default:
		return nil, fmt.Errorf("synth: dtype %q: want BF16, F16 or F32", dtype)
	}
	return c, nil
}

// fill encodes elements first, first+1, ... of the stream into dst, whose
// length must be a multiple of the element size.
func (c *codec) fill(dst []byte, st, first uint64) {
	n := uint64(len(dst) / c.size)
	i := uint64(0)
	one := func(i uint64) {
		e := first + i
		lane := uint16(mix(st+(e/4+1)*gamma) >> (16 * (e % 4)))
		if c.size == 2 {
			binary.LittleEndian.PutUint16(dst[2*i:], c.t16[lane])
		} else {
			binary.LittleEndian.PutUint32(dst[4*i:], c.t32[lane])
		}
	}
	for ; i < n && (first+i)%4 != 0; i++ {
		one(i)
	}
	// Whole groups of four elements share one generator output.
	ctr := st + ((first+i)/4+1)*gamma
	if c.size == 2 {
		t := c.t16
		for ; i+4 <= n; i += 4 {
			r := mix(ctr)
			ctr += gamma
			w := uint64(t[uint16(r)]) | uint64(t[uint16(r>>16)])<<16 | uint64(t[uint16(r>>32)])<<32 | uint64(t[uint16(r>>48)])<<48
			binary.LittleEndian.PutUint64(dst[2*i:], w)
		}
	} else {
		t := c.t32
		for ; i+4 <= n; i += 4 {
			r := mix(ctr)
			ctr += gamma
			binary.LittleEndian.PutUint64(dst[4*i:], uint64(t[uint16(r)])|uint64(t[uint16(r>>16)])<<32)
			binary.LittleEndian.PutUint64(dst[4*i+8:], uint64(t[uint16(r>>32)])|uint64(t[uint16(r>>48)])<<32)
		}
	}
	for ; i < n; i++ {
		one(i)
	}
}

// SourceRow returns the Hugging Face row that row r of a tensor with rows
// permuted in heads of d rows (Tensor.HeadDim) holds: llama.cpp's permute,
// reshape(n_head, 2, d/2, cols).swapaxes(1, 2), puts HF row h·d + s·d/2 + i
// at h·d + 2i + s. d == 0 means no permutation.
func SourceRow(r uint64, d int) uint64 {
	if d == 0 {
		return r
	}
	dd := uint64(d)
	h, j := r/dd, r%dd
	return h*dd + (j%2)*(dd/2) + j/2
}

// fillTensor is fill for elements first, first+1, ... of tensor t in the
// file's order, following t's row permutation.
func (c *codec) fillTensor(dst []byte, st, first uint64, t Tensor) {
	if t.HeadDim == 0 || len(t.Shape) != 2 {
		c.fill(dst, st, first)
		return
	}
	cols := t.Shape[1]
	n := uint64(len(dst) / c.size)
	for done := uint64(0); done < n; {
		e := first + done
		row, col := e/cols, e%cols
		seg := min(cols-col, n-done)
		c.fill(dst[done*uint64(c.size):(done+seg)*uint64(c.size)], st, SourceRow(row, t.HeadDim)*cols+col)
		done += seg
	}
}

// blockwise reports whether t is made a row at a time: block-quantized, or
// fixed values.
func (t Tensor) blockwise() bool { return t.Fixed != nil || t.quantType().IsQuantized() }

// valueDType is the dtype t's codec encodes: its own, or F32 for a
// block-quantized tensor, whose values are quantized from float32.
func (t Tensor) valueDType() string {
	if t.quantType().IsQuantized() {
		return "F32"
	}
	return t.DType
}

// chunkBytes is the size of n elements of t (whole rows if blockwise).
func (t Tensor) chunkBytes(n uint64) uint64 {
	typ := t.quantType()
	if !typ.IsQuantized() {
		return n * uint64(typ.BlockBytes())
	}
	b, _ := quant.RowBytes(typ, int(t.rowLen()))
	return n / t.rowLen() * uint64(b)
}

// rowScratch is a worker's buffers for quantized rows.
type rowScratch struct {
	raw []byte
	x   []float32
}

// fill writes into dst elements [first, first+n) of t: through codec c
// (t's valueDType) from stream st, then quantized for a block-quantized
// tensor, or t.Fixed's values. For those two first and n are whole rows.
func (t Tensor) fill(dst []byte, c *codec, st, first, n uint64, sc *rowScratch) {
	switch {
	case t.Fixed != nil:
		for i, v := range t.Fixed[first : first+n] {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	case t.quantType().IsQuantized():
		if uint64(len(sc.x)) < n {
			sc.raw, sc.x = make([]byte, 4*n), make([]float32, n)
		}
		raw, x := sc.raw[:4*n], sc.x[:n]
		c.fillTensor(raw, st, first, t)
		quant.Dequantize(quant.F32, x, raw)   // lengths fit: F32 bytes to floats
		quant.Quantize(t.quantType(), dst, x) // whole rows of whole blocks: Validate checked
	default:
		c.fillTensor(dst, st, first, t)
	}
}
