// Package sched simulates serving with a paged KV cache: continuous
// batching (FCFS admission under the block budget, a token budget per step,
// chunked prefill, preemption by recompute or swap when blocks run out)
// driving a kvcache.Manager, next to the pre-paging way of reserving each
// sequence's full context, on one device time model. It is what `memwall kv
// simulate` runs.
//
// # Quick start
//
//	m, _ := sched.Preset("llama-7b")
//	reqs, _ := sched.Synthetic(ctx, sched.SyntheticOptions{Kind: "sharegpt", Requests: 1000, MaxLen: m.Context})
//	res, err := sched.Simulate(ctx, reqs, sched.Options{Model: m, VRAMBytes: 40 << 30})
//	fmt.Println(res.Paged.WasteRatio, res.Paged.MeanBatch, res.Contiguous.MeanBatch)
//
// Requests come from JSON-lines files (ReadRequests) or synthetic mixes
// (Synthetic, whose distributions its documentation states). Waste is bytes
// held that hold no token's K/V over bytes held, both averaged over
// simulated time; the batch is the sequences computed per step, averaged
// over the time anything runs.
package sched
