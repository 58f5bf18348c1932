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
