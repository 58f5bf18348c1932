package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Sampling says how tokens are chosen and when generation stops.
type Sampling struct {
	// MaxNew is the most tokens generated (default 16).
	MaxNew int
	// Temperature 0 is greedy decoding (the argmax, lowest id on ties);
	// above 0 the logits are divided by it before TopK and TopP.
	Temperature float64
	// TopK > 0 keeps the K most likely tokens; TopP in (0, 1) keeps the
	// smallest set whose probability reaches P (after TopK).
	TopK int
	TopP float64
	// Seed seeds the sampler (math/rand/v2 PCG): the same seed, logits and
	// settings give the same tokens.
	Seed uint64
	// IgnoreEOS keeps generating past end-of-sequence tokens.
	IgnoreEOS bool
	// KeepLogits keeps every step's logits in Result.Logits.
	KeepLogits bool
}

// Validate checks the settings' ranges.
func (s Sampling) Validate() error {
	switch {
	case s.MaxNew < 0:
		return fmt.Errorf("engine: max new tokens %d is negative", s.MaxNew)
	case !(s.Temperature >= 0) || math.IsInf(s.Temperature, 0):
		return fmt.Errorf("engine: temperature %v, want a finite number >= 0", s.Temperature)
	case s.TopK < 0:
		return fmt.Errorf("engine: top-k %d is negative", s.TopK)
	case !(s.TopP >= 0 && s.TopP <= 1):
		return fmt.Errorf("engine: top-p %v, want 0..1", s.TopP)
	}
	return nil
}

// sampler draws tokens from logits.
type sampler struct {
	s   Sampling
	rng *rand.Rand
	idx []int
	p   []float64
}

func newSampler(s Sampling) *sampler {
	return &sampler{s: s, rng: rand.New(rand.NewPCG(s.Seed, s.Seed^0x9E3779B97F4A7C15))}
}

// next picks a token from logits (which it may not modify).
func (sm *sampler) next(logits []float32) int {
	if sm.s.Temperature == 0 {
		best := 0
		for i, v := range logits {
			if v > logits[best] {
				best = i
			}
		}
		return best
	}
	sm.idx = sm.idx[:0]
	for i, v := range logits {
		if !math.IsNaN(float64(v)) {
			sm.idx = append(sm.idx, i)
		}
	}
	if len(sm.idx) == 0 {
		return 0
	}
	slices.SortStableFunc(sm.idx, func(a, b int) int {
		switch {
		case logits[a] > logits[b]:
			return -1
		case logits[a] < logits[b]:
			return 1
		}
		return 0
	})
	if k := sm.s.TopK; k > 0 && k < len(sm.idx) {
		sm.idx = sm.idx[:k]
	}
	sm.p = sm.p[:0]
	top := float64(logits[sm.idx[0]])
	var sum float64
	for _, i := range sm.idx {
		v := math.Exp((float64(logits[i]) - top) / sm.s.Temperature)
		sm.p = append(sm.p, v)
		sum += v
	}
	n := len(sm.p)
	if p := sm.s.TopP; p > 0 && p < 1 {
		var acc float64
		for j, v := range sm.p {
			acc += v / sum
			if acc >= p {
				n = j + 1
				break
			}
		}
		sum = 0
		for _, v := range sm.p[:n] {
			sum += v
		}
	}
	r := sm.rng.Float64() * sum
	for j, v := range sm.p[:n] {
		r -= v
		if r < 0 {
			return sm.idx[j]
		}
	}
	return sm.idx[n-1]
}
