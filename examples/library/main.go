// Command library is memwall used as a Go library, end to end: it opens the
// GPU (the simulated device when there is none), sub-allocates device memory
// from a pool, shares a system prompt's blocks in a paged KV cache, and
// generates tokens from a small random Llama model inside a budget.
//
//	go run ./examples/library            # the GPU if one works, else the simulator
//	go run ./examples/library -device sim
//
// Each step is a few lines a Go inference engine would write; the package
// documentation of pool, kvcache and engine says more.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/auto"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/kvcache"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/residency"
)

func main() {
	backend := flag.String("device", auto.Auto, "auto, cuda or sim")
	flag.Parse()
	if err := run(context.Background(), os.Stdout, *backend); err != nil {
		fmt.Fprintln(os.Stderr, "library:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, w io.Writer, backend string) error {
	// 1. The device: auto opens the GPU when its driver works and says why
	// it fell back otherwise. kernels.Sim() gives the simulator the Go twins
	// of memwall's GPU kernels, so the engine below runs on it too.
	d, choice, err := auto.Open(backend, auto.Options{Kernels: kernels.Sim()})
	if err != nil {
		return err
	}
	defer d.Close()
	fmt.Fprintf(w, "device: %s (%s)\n", d.Info().Name, choice.Backend)

	// 2. A pool: Alloc and Free cost no driver call once it holds memory,
	// and its statistics count bytes by purpose.
	dev, err := pool.New(d, pool.DefaultOptions(d))
	if err != nil {
		return err
	}
	defer dev.Close()
	host, err := pool.NewHost(d, pool.Options{}) // pinned host memory, for swapped KV blocks
	if err != nil {
		return err
	}
	defer host.Close()
	if err := poolTour(w, dev); err != nil {
		return err
	}

	// 3. A paged KV cache over the same pools: two requests that share a
	// system prompt share its blocks.
	if err := cacheTour(w, d, dev, host); err != nil {
		return err
	}

	// 4. The engine: a small random Llama model (written here, so nothing
	// is downloaded), placed inside a 64 MiB budget above the device
	// context, and decoded greedily.
	return engineTour(ctx, w, d, dev, host)
}

func poolTour(w io.Writer, p *pool.Pool) error {
	weights, err := p.Alloc(32<<20, pool.AllocOptions{Purpose: pool.Weights})
	if err != nil {
		return err
	}
	act, err := p.Alloc(3<<20, pool.AllocOptions{Purpose: pool.Activations})
	if err != nil {
		return err
	}
	st := p.Stats()
	fmt.Fprintf(w, "pool: %d blocks live, weights %d MiB, activations %d MiB\n",
		st.LiveBlocks, st.ByPurpose["weights"]>>20, st.ByPurpose["activations"]>>20)
	if err := p.Free(act); err != nil {
		return err
	}
	return p.Free(weights)
}

func cacheTour(w io.Writer, d device.Device, dev, host *pool.Pool) error {
	c, err := kvcache.New(d, dev, host,
		kvcache.Config{Layers: 4, KVHeads: 4, HeadDim: 32, ElemBytes: 2, Blocks: 64},
		kvcache.Options{HostBlocks: 16})
	if err != nil {
		return err
	}
	defer c.Close()
	system := make([]int32, 32) // two blocks of 16 tokens
	for i := range system {
		system[i] = int32(100 + i)
	}
	if _, err := c.Add(1, append(append([]int32{}, system...), 1, 2, 3), 0); err != nil {
		return err
	}
	if err := c.Computed(1, len(system)+3); err != nil { // the prefill wrote its K/V
		return err
	}
	cached, err := c.Add(2, append(append([]int32{}, system...), 4, 5), 0)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "kv cache: the second request found %d tokens cached; first block shared: %v\n",
		cached, c.Table(1)[0] == c.Table(2)[0])
	return nil
}

func engineTour(ctx context.Context, w io.Writer, d device.Device, dev, host *pool.Pool) error {
	dir, err := os.MkdirTemp("", "memwall-library")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if _, err := synth.Generate(ctx, synth.Tiny(), filepath.Join(dir, "model.safetensors"), synth.Options{}); err != nil {
		return err
	}
	m, err := llama.Open(dir)
	if err != nil {
		return err
	}
	defer m.Close()
	ks, err := kernels.Load(d, nil)
	if err != nil {
		return err
	}
	defer ks.Close()
	ctxBytes, _ := residency.ContextBytes(d)
	budget, err := residency.PlanBudget(d, ctxBytes+64<<20)
	if err != nil {
		return err
	}
	e, err := engine.New(ctx, d, ks, dev, host, m, engine.Options{Budget: budget.PoolBytes, MaxTokens: 64})
	if err != nil {
		return err
	}
	defer e.Close()
	res, err := e.Generate(ctx, []int{1, 450, 434, 17}, engine.Sampling{MaxNew: 6, IgnoreEOS: true}, nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "engine: %d tokens %v, %d of %d weight groups streamed\n",
		len(res.Tokens), res.Tokens, len(e.Plan().Streamed()), len(e.Plan().Groups))
	return nil
}
