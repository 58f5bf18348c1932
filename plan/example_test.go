package plan_test

import (
	"context"
	"fmt"

	"github.com/memwall/memwall/plan"
)

// Solve places buffers with known lifetimes in one arena so that buffers
// never live at the same step share bytes. The lower bound is the most
// bytes live at one step; here the plan meets it.
func ExampleSolve() {
	bufs := []plan.Buffer{
		{ID: "a", Start: 0, End: 2, Size: 4 << 20}, // live on steps 0 and 1
		{ID: "b", Start: 1, End: 3, Size: 2 << 20},
		{ID: "c", Start: 2, End: 4, Size: 4 << 20}, // may reuse a's bytes
		{ID: "d", Start: 3, End: 5, Size: 1 << 20},
	}
	l, rep, err := plan.Solve(context.Background(), bufs, plan.Options{Alignment: 256})
	if err != nil {
		panic(err)
	}
	for i, b := range bufs {
		fmt.Printf("%s at %d MiB\n", b.ID, l.Offsets[i]>>20)
	}
	fmt.Printf("arena %d MiB, lower bound %d MiB, at the bound: %v\n", l.ArenaBytes>>20, rep.LowerBoundBytes>>20, rep.AtLowerBound)
	// Output:
	// a at 0 MiB
	// b at 4 MiB
	// c at 0 MiB
	// d at 4 MiB
	// arena 6 MiB, lower bound 6 MiB, at the bound: true
}

// NewORTSettings turns a plan into ONNX Runtime memory settings: the
// limit covers the weights, the planned arena and a stated margin.
func ExampleNewORTSettings() {
	s, err := plan.NewORTSettings(100<<20, 30<<20, 0) // 100 MiB of weights, a 30 MiB arena
	if err != nil {
		panic(err)
	}
	fmt.Println("workspace", s.WorkspaceBytes>>20, "MiB")
	fmt.Println("gpu_mem_limit", s.CUDAProviderOptions["gpu_mem_limit"])
	fmt.Println("arena_extend_strategy", s.CUDAProviderOptions["arena_extend_strategy"])
	fmt.Println("CPU arena initial chunk", s.ArenaCfg.InitialChunkSizeBytes>>20, "MiB")
	// Output:
	// workspace 154 MiB
	// gpu_mem_limit 297795584
	// arena_extend_strategy kSameAsRequested
	// CPU arena initial chunk 284 MiB
}
