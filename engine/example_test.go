package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/residency"
)

// An engine on the simulated device generates greedily from the tiny
// synthetic model; the same code runs on a GPU with device/cuda.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "engine-example")
	defer os.RemoveAll(dir)
	synth.Generate(ctx, synth.Tiny(), filepath.Join(dir, "model.safetensors"), synth.Options{})
	m, _ := llama.Open(dir)
	defer m.Close()

	o := sim.DefaultOptions()
	o.Kernels = kernels.Sim()
	d := sim.New(o)
	defer d.Close()
	ks, _ := kernels.Load(d, nil)
	defer ks.Close()
	budget, _ := residency.PlanBudget(d, 64<<20) // the whole footprint: 64 MiB
	dev, _ := pool.New(d, pool.DefaultOptions(d))
	defer dev.Close()
	host, _ := pool.NewHost(d, pool.Options{})
	defer host.Close()

	e, err := engine.New(ctx, d, ks, dev, host, m, engine.Options{Budget: budget.PoolBytes, MaxTokens: 64})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Close()
	res, err := e.Generate(ctx, []int{1, 450, 434, 17}, engine.Sampling{MaxNew: 6, IgnoreEOS: true}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(res.Tokens), "tokens, stop:", res.Stop, "- all resident:", len(e.Plan().Streamed()) == 0)
	// Output: 6 tokens, stop: max_new - all resident: true
}

// Estimate plans a model without touching a device: with PrefillChunk and
// Slots left 0 it chooses them from the budget. Here a 64 MiB budget holds
// the tiny model and its whole 300-token prompt in one chunk; in 4 MiB the
// weights stream, the largest chunk that still fits is 135 tokens, and the
// embedding table is read in place from host memory (Options.NoMapEmbedding
// keeps it on the device), so that its bytes keep a matrix resident.
func ExampleEstimate() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "engine-example")
	defer os.RemoveAll(dir)
	synth.Generate(ctx, synth.Tiny(), filepath.Join(dir, "model.safetensors"), synth.Options{})
	m, _ := llama.Open(dir)
	defer m.Close()
	o := sim.DefaultOptions()
	o.Granularity = 64 << 10
	info := sim.New(o).Info()
	for _, budget := range []uint64{64 << 20, 4 << 20} {
		f, err := engine.Estimate(ctx, m, engine.Options{Budget: budget, MaxTokens: 332, PromptTokens: 300}, info)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("budget %d MiB: chunk %d, %d slots, %d of %d weight groups stream\n", budget>>20, f.PrefillChunk, f.Slots, len(f.Plan.Streamed()), len(f.Plan.Groups))
	}
	// Output:
	// budget 64 MiB: chunk 300, 2 slots, 0 of 31 weight groups stream
	// budget 4 MiB: chunk 135, 2 slots, 29 of 31 weight groups stream
}
