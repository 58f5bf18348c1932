package sched_test

import (
	"context"
	"fmt"

	"github.com/memwall/memwall/kvcache/sched"
)

// Paged blocks against a contiguous reservation of the context, on a
// ShareGPT-like mix for a Llama-7B shape in 40 GiB.
func ExampleSimulate() {
	m, _ := sched.Preset("llama-7b")
	reqs, _ := sched.Synthetic(context.Background(), sched.SyntheticOptions{Kind: "sharegpt", Requests: 300, Seed: 1, MaxLen: m.Context})
	res, err := sched.Simulate(context.Background(), reqs, sched.Options{Model: m, VRAMBytes: 40 << 30})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("KV budget: %d blocks of %d tokens\n", res.Blocks, res.BlockTokens)
	fmt.Println("paged waste under 4%:", res.Paged.WasteRatio < 0.04)
	fmt.Println("contiguous waste over 80%:", res.Contiguous.WasteRatio > 0.8)
	fmt.Println("paged batches over 2x more:", res.Paged.MeanBatch > 2*res.Contiguous.MeanBatch)
	// Output:
	// KV budget: 3513 blocks of 16 tokens
	// paged waste under 4%: true
	// contiguous waste over 80%: true
	// paged batches over 2x more: true
}
