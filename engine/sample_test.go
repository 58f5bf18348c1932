package engine

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// TestSamplerDistribution draws many tokens from random logits and checks
// the support (top-k, top-p) and the frequencies against the softmax of the
// tempered logits restricted to that support.
func TestSamplerDistribution(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 30 {
		n := 2 + rng.IntN(40)
		logits := make([]float32, n)
		for i := range logits {
			logits[i] = float32(rng.NormFloat64() * 2)
		}
		s := Sampling{Temperature: 0.3 + rng.Float64()*2, Seed: uint64(trial)}
		if rng.IntN(2) == 0 {
			s.TopK = 1 + rng.IntN(n)
		}
		if rng.IntN(2) == 0 {
			s.TopP = 0.05 + rng.Float64()*0.9
		}
		want := expected(logits, s)
		sm := newSampler(s)
		const draws = 20000
		got := make([]float64, n)
		for range draws {
			got[sm.next(logits)]++
		}
		for i := range got {
			got[i] /= draws
			if want[i] == 0 && got[i] > 0 {
				t.Fatalf("trial %d (%+v): token %d outside the support drawn %.4f", trial, s, i, got[i])
			}
			if math.Abs(got[i]-want[i]) > 4*math.Sqrt(want[i]*(1-want[i])/draws)+1e-3 {
				t.Errorf("trial %d (%+v): token %d drawn %.4f, want %.4f", trial, s, i, got[i], want[i])
			}
		}
	}
}

// expected is the sampling distribution written out directly: sort, keep
// top-k, softmax at the temperature, keep the smallest prefix reaching top-p.
func expected(logits []float32, s Sampling) []float64 {
	n := len(logits)
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	for i := 1; i < n; i++ { // insertion sort, descending, stable
		for j := i; j > 0 && logits[idx[j]] > logits[idx[j-1]]; j-- {
			idx[j], idx[j-1] = idx[j-1], idx[j]
		}
	}
	if s.TopK > 0 && s.TopK < n {
		idx = idx[:s.TopK]
	}
	p := make([]float64, len(idx))
	var sum float64
	for j, i := range idx {
		p[j] = math.Exp(float64(logits[i]) / s.Temperature)
		sum += p[j]
	}
	keep := len(idx)
	if s.TopP > 0 && s.TopP < 1 {
		var acc float64
		for j := range p {
			acc += p[j] / sum
			if acc >= s.TopP {
				keep = j + 1
				break
			}
		}
	}
	var kept float64
	for j := range keep {
		kept += p[j]
	}
	out := make([]float64, n)
	for j := range keep {
		out[idx[j]] = p[j] / kept
	}
	return out
}

func TestSamplerGreedyAndValidate(t *testing.T) {
	sm := newSampler(Sampling{})
	if got := sm.next([]float32{1, 3, 3, -1}); got != 1 {
		t.Errorf("greedy picked %d, want the first of the tied best (1)", got)
	}
	for _, s := range []Sampling{{MaxNew: -1}, {Temperature: -1}, {Temperature: math.Inf(1)}, {Temperature: math.NaN()}, {TopK: -2}, {TopP: 1.5}, {TopP: -0.1}} {
		if s.Validate() == nil {
			t.Errorf("%+v accepted", s)
		}
	}
}

// decodeF32 reads little-endian float32s, aligned or not, NaN payloads
// and signed zeros included.
func TestDecodeF32(t *testing.T) {
	vals := []float32{0, float32(math.Copysign(0, -1)), 1.5, -3.25e-38, float32(math.Inf(1)), math.Float32frombits(0x7fc01234), math.MaxFloat32}
	buf := make([]byte, 4*len(vals)+1)
	for off := range 2 {
		src := buf[off : off+4*len(vals)]
		for i, v := range vals {
			binary.LittleEndian.PutUint32(src[4*i:], math.Float32bits(v))
		}
		dst := make([]float32, len(vals))
		decodeF32(dst, src)
		for i := range vals {
			if math.Float32bits(dst[i]) != math.Float32bits(vals[i]) {
				t.Errorf("offset %d, value %d: %#x, want %#x", off, i, math.Float32bits(dst[i]), math.Float32bits(vals[i]))
			}
		}
	}
}
