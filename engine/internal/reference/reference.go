// Package reference is a float32 forward pass of the Hugging Face Llama
// (LlamaForCausalLM), written from the model's definition and independently
// of package engine, as plain loops over the file's tensors. Tests check
// the engine's tokens and logits against it.
//
// With Round set to "BF16" or "F16", it rounds where transformers does when
// the model runs in that dtype: every linear layer's output, RMSNorm's
// normalized value and its product with the weight, the residual stream
// after each add, SiLU(gate) and SiLU(gate)·up, attention's output, RoPE's
// cos/sin tables and its products and sum, and the logits. Softmax runs in
// float32 over float32 scores (as transformers' SDPA and eager paths with
// an upcast softmax do). Without Round everything stays float32 after the
// weights are widened.
package reference

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/quant"
	"github.com/memwall/memwall/half"
)

// Model holds the weights widened to float32.
type Model struct {
	cfg    llama.Config
	round  func(float32) float32
	embed  []float32
	head   []float32
	norm   []float32
	blocks []block
}

type block struct {
	attnNorm, q, k, v, o, mlpNorm, gate, up, down []float32
}

// New widens m's weights. round is "", "BF16" or "F16". Q and K rows of a
// GGUF file are put back in Hugging Face order, so one forward serves both.
func New(m *llama.Model, round string) (*Model, error) {
	r := &Model{cfg: *m.Config, round: func(x float32) float32 { return x }}
	switch round {
	case "":
	case "BF16":
		r.round = RoundBF16
	case "F16":
		r.round = RoundF16
	default:
		return nil, fmt.Errorf("reference: round %q", round)
	}
	ts := m.Tensors
	var err error
	get := func(t format.Tensor, unpermute bool) []float32 {
		if err != nil {
			return nil
		}
		var v []float32
		v, err = widen(m.Weights, t)
		if err == nil && unpermute && m.Config.PermutedQK {
			v = unpermuteRows(v, int(t.Shape[1]), m.Config.HeadDim)
		}
		return v
	}
	r.embed = get(ts.Embedding, false)
	r.head = get(ts.LMHead, false)
	r.norm = get(ts.FinalNorm, false)
	for _, b := range ts.Blocks {
		r.blocks = append(r.blocks, block{get(b.AttnNorm, false), get(b.Q, true), get(b.K, true), get(b.V, false), get(b.O, false),
			get(b.MLPNorm, false), get(b.Gate, false), get(b.Up, false), get(b.Down, false)})
	}
	return r, err
}

// unpermuteRows undoes llama.cpp's Q/K permutation: file row h·d + 2i + s
// holds HF row h·d + s·d/2 + i.
func unpermuteRows(v []float32, cols, d int) []float32 {
	out := make([]float32, len(v))
	rows := len(v) / cols
	for r := range rows {
		h, j := r/d, r%d
		src := h*d + (j%2)*(d/2) + j/2
		copy(out[src*cols:(src+1)*cols], v[r*cols:(r+1)*cols])
	}
	return out
}

// Logits runs the prompt ids through the model (positions 0..len-1) and
// returns the logits at every position: out[t] predicts token t+1.
func (r *Model) Logits(ids []int) ([][]float32, error) {
	c := &r.cfg
	T, H, hd := len(ids), c.Hidden, c.HeadDim
	for _, id := range ids {
		if id < 0 || id >= c.Vocab {
			return nil, fmt.Errorf("reference: token %d outside the vocabulary of %d", id, c.Vocab)
		}
	}
	x := make([]float32, T*H)
	for t, id := range ids {
		copy(x[t*H:(t+1)*H], r.embed[id*H:(id+1)*H])
	}
	cos, sin := r.ropeTables(T)
	eps := float32(c.RMSNormEps)
	for _, b := range r.blocks {
		h := r.rmsNorm(x, b.attnNorm, eps, T, H)
		q := r.linear(h, b.q, T, H, c.Heads*hd)
		k := r.linear(h, b.k, T, H, c.KVHeads*hd)
		v := r.linear(h, b.v, T, H, c.KVHeads*hd)
		r.rope(q, cos, sin, T, c.Heads, hd)
		r.rope(k, cos, sin, T, c.KVHeads, hd)
		a := r.attention(q, k, v, T)
		o := r.linear(a, b.o, T, c.Heads*hd, H)
		r.addInto(x, o)
		h = r.rmsNorm(x, b.mlpNorm, eps, T, H)
		g := r.linear(h, b.gate, T, H, c.Intermediate)
		u := r.linear(h, b.up, T, H, c.Intermediate)
		for i := range g {
			s := r.round(g[i] / (1 + float32(math.Exp(float64(-g[i])))))
			g[i] = r.round(s * u[i])
		}
		d := r.linear(g, b.down, T, c.Intermediate, H)
		r.addInto(x, d)
	}
	h := r.rmsNorm(x, r.norm, eps, T, H)
	logits := r.linear(h, r.head, T, H, c.Vocab)
	out := make([][]float32, T)
	for t := range out {
		out[t] = logits[t*c.Vocab : (t+1)*c.Vocab]
	}
	return out, nil
}

func (r *Model) rmsNorm(x, w []float32, eps float32, T, H int) []float32 {
	out := make([]float32, len(x))
	for t := range T {
		row := x[t*H : (t+1)*H]
		var ss float32
		for _, v := range row {
			ss += v * v
		}
		inv := 1 / float32(math.Sqrt(float64(ss/float32(H)+eps)))
		for i, v := range row {
			out[t*H+i] = r.round(w[i] * r.round(v*inv))
		}
	}
	return out
}

// linear is y = x·Wᵀ (W is M×K), each output rounded.
func (r *Model) linear(x, w []float32, T, K, M int) []float32 {
	y := make([]float32, T*M)
	for t := range T {
		xr := x[t*K : (t+1)*K]
		for m := range M {
			wr := w[m*K : (m+1)*K]
			var s float32
			for k, xv := range xr {
				s += xv * wr[k]
			}
			y[t*M+m] = r.round(s)
		}
	}
	return y
}

func (r *Model) addInto(x, y []float32) {
	for i := range x {
		x[i] = r.round(x[i] + y[i])
	}
}

// ropeTables are transformers' cos and sin for positions 0..T-1:
// emb = cat(freqs, freqs), computed in float32, cast to the model dtype.
func (r *Model) ropeTables(T int) (cos, sin []float32) {
	inv := r.cfg.InvFreq()
	half := len(inv)
	cos, sin = make([]float32, T*half), make([]float32, T*half)
	for t := range T {
		for i, f := range inv {
			a := float32(t) * f
			cos[t*half+i] = r.round(float32(math.Cos(float64(a))))
			sin[t*half+i] = r.round(float32(math.Sin(float64(a))))
		}
	}
	return cos, sin
}

// rope rotates pairs (i, i+d/2) of each head (rotate_half).
func (r *Model) rope(x, cos, sin []float32, T, heads, d int) {
	half := d / 2
	for t := range T {
		for h := range heads {
			row := x[(t*heads+h)*d : (t*heads+h+1)*d]
			for i := range half {
				c, s := cos[t*half+i], sin[t*half+i]
				a, b := row[i], row[i+half]
				row[i] = r.round(r.round(a*c) - r.round(b*s))
				row[i+half] = r.round(r.round(b*c) + r.round(a*s))
			}
		}
	}
}

// attention is causal grouped-query attention, softmax in float32.
func (r *Model) attention(q, k, v []float32, T int) []float32 {
	c := &r.cfg
	d, nq, nkv := c.HeadDim, c.Heads, c.KVHeads
	group := nq / nkv
	scale := 1 / float32(math.Sqrt(float64(d)))
	out := make([]float32, T*nq*d)
	p := make([]float32, T)
	for t := range T {
		for h := range nq {
			kh := h / group
			qr := q[(t*nq+h)*d : (t*nq+h+1)*d]
			mx := float32(math.Inf(-1))
			for s := 0; s <= t; s++ {
				kr := k[(s*nkv+kh)*d : (s*nkv+kh+1)*d]
				var dot float32
				for i := range d {
					dot += qr[i] * kr[i]
				}
				p[s] = dot * scale
				mx = max(mx, p[s])
			}
			var sum float32
			for s := 0; s <= t; s++ {
				p[s] = float32(math.Exp(float64(p[s] - mx)))
				sum += p[s]
			}
			o := out[(t*nq+h)*d : (t*nq+h+1)*d]
			for s := 0; s <= t; s++ {
				w := p[s] / sum
				vr := v[(s*nkv+kh)*d : (s*nkv+kh+1)*d]
				for i := range d {
					o[i] += w * vr[i]
				}
			}
			for i := range o {
				o[i] = r.round(o[i])
			}
		}
	}
	return out
}

// widen reads a tensor as float32.
func widen(m *format.Model, t format.Tensor) ([]float32, error) {
	b := m.Data(t)
	n := int(t.Elements())
	out := make([]float32, n)
	switch t.DType {
	case "F32":
		if len(b) != 4*n {
			return nil, fmt.Errorf("reference: tensor %s: %d bytes", t.Name, len(b))
		}
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
	case "BF16", "F16":
		if len(b) != 2*n {
			return nil, fmt.Errorf("reference: tensor %s: %d bytes", t.Name, len(b))
		}
		conv := half.BF16ToF32
		if t.DType == "F16" {
			conv = half.F16ToF32
		}
		for i := range out {
			out[i] = conv(binary.LittleEndian.Uint16(b[2*i:]))
		}
	default:
		typ, ok := quant.TypeByName(t.DType)
		if !ok || !typ.IsQuantized() {
			return nil, fmt.Errorf("reference: tensor %s: dtype %s", t.Name, t.DType)
		}
		// Block-quantized: ggml's dequantized values, the reference's weights.
		if err := quant.Dequantize(typ, out, b); err != nil {
			return nil, fmt.Errorf("reference: tensor %s: %w", t.Name, err)
		}
	}
	return out, nil
}

// RoundBF16 rounds x to the nearest bfloat16 (ties to even), as package
// half converts.
func RoundBF16(x float32) float32 { return half.BF16ToF32(half.F32ToBF16(x)) }

// RoundF16 rounds x to the nearest IEEE half (ties to even, 65520 and
// beyond to infinity), as package half converts.
func RoundF16(x float32) float32 { return half.F16ToF32(half.F32ToF16(x)) }

// Argmax returns the index of the largest logit and the gap to the second.
func Argmax(l []float32) (best int, gap float32) {
	b, s := float32(math.Inf(-1)), float32(math.Inf(-1))
	for i, v := range l {
		if v > b {
			s, b, best = b, v, i
		} else if v > s {
			s = v
		}
	}
	return best, b - s
}
