package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/engine"
	"github.com/memwall/memwall/fleet"
	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/kernels"
	"github.com/memwall/memwall/pool"
)

// Two copies of the tiny model share a budget that holds one of them
// whole: the one that serves takes the weights the idle one gives back.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "fleet-example")
	defer os.RemoveAll(dir)
	synth.Generate(ctx, synth.Tiny(), filepath.Join(dir, "model.safetensors"), synth.Options{})

	so := sim.DefaultOptions()
	so.Granularity = 64 << 10 // small pages for a small model
	so.Kernels = kernels.Sim()
	d := sim.New(so)
	defer d.Close()
	ks, _ := kernels.Load(d, nil)
	defer ks.Close()

	o := engine.Options{MaxTokens: 64, PrefillChunk: 16, Live: true}
	f := fleet.New(13<<20, fleet.Options{})
	for _, name := range []string{"a", "b"} {
		m, _ := llama.Open(dir)
		defer m.Close()
		// The least the model runs in: make room for it, load it there.
		probe := o
		probe.Budget = 1
		var be *engine.BudgetError
		_, err := engine.Estimate(ctx, m, probe, d.Info())
		if !errors.As(err, &be) || f.MakeRoom(ctx, be.Minimum) != nil {
			fmt.Println("no room:", err)
			return
		}
		po := pool.DefaultOptions(d)
		po.Limit, po.ReserveBytes = be.Minimum, d.Info().TotalBytes
		dev, _ := pool.New(d, po)
		defer dev.Close()
		host, _ := pool.NewHost(d, pool.Options{})
		defer host.Close()
		o.Budget = be.Minimum
		e, err := engine.New(ctx, d, ks, dev, host, m, o)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer e.Close()
		f.Add(ctx, fleet.Model{Name: name, Engine: e})
	}
	for _, name := range []string{"a", "b"} {
		f.Begin(ctx, name) // moves weights to it first
		e, unlock, _ := f.Lock(name)
		res, _ := e.Generate(ctx, []int{1, 450, 434, 17}, engine.Sampling{MaxNew: 4, IgnoreEOS: true}, nil)
		streamed := len(e.Plan().Streamed())
		unlock()
		f.End(ctx, name)
		fmt.Printf("%s: %d tokens, %d groups streamed\n", name, len(res.Tokens), streamed)
	}
	stats, _ := f.Stats()
	fmt.Println("b whole:", stats[1].StreamedGroups == 0, "- a streams:", stats[0].StreamedGroups > 0)
	// Output:
	// a: 4 tokens, 0 groups streamed
	// b: 4 tokens, 0 groups streamed
	// b whole: true - a streams: true
}
