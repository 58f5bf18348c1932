package sched

import (
	"bytes"
	"math"
	"math/rand/v2"
	"strconv"
)

// longSystemPrompts generates testdata/kv/long-system-prompts.jsonl (see
// its README): 1500 requests, Poisson arrivals at 25/s with a burst of 100 at
// t = 20 s; 90% start with one of 12 system prompts of 1500–3000 tokens
// chosen with Zipf-like weights 1/(k+1), the rest have none; user parts
// log-normal with mean 150 (σ 0.9), outputs mean 200 (σ 0.8), cut so that
// prompt + output ≤ 4096.
func longSystemPrompts() []byte {
	rng := rand.New(rand.NewPCG(2026, 12))
	ln := func(mean, sigma float64, hi int) int {
		mu := math.Log(mean) - sigma*sigma/2
		v := int(math.Round(math.Exp(mu + sigma*rng.NormFloat64())))
		return min(max(v, 4), hi)
	}
	sys := make([]int, 12)
	var weights []float64
	total := 0.0
	for k := range sys {
		sys[k] = 1500 + rng.IntN(1501)
		weights = append(weights, 1/float64(k+1))
		total += 1 / float64(k+1)
	}
	var reqs []Request
	t := 0.0
	for i := range 1500 {
		if i == 480 {
			t = 20
		}
		if i < 480 || i >= 580 {
			t += rng.ExpFloat64() / 25
		}
		r := Request{ArrivalS: math.Round(t*1000) / 1000}
		pre := 0
		if rng.Float64() < 0.9 {
			x, k := rng.Float64()*total, 0
			for ; k < len(sys)-1 && x > weights[k]; k++ {
				x -= weights[k]
			}
			pre = sys[k]
			r.PrefixID, r.PrefixTokens = "sys-"+strconv.Itoa(k), pre
		}
		room := 4096 - pre
		r.PromptTokens = pre + ln(150, 0.9, room/2)
		r.OutputTokens = ln(200, 0.8, 4096-r.PromptTokens)
		reqs = append(reqs, r)
	}
	var b bytes.Buffer
	_ = WriteRequests(&b, reqs)
	return b.Bytes()
}
