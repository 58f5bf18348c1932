package residency_test

import (
	"context"
	"fmt"
	"os"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/format/synth"
	"github.com/memwall/memwall/format/weights"
	"github.com/memwall/memwall/plan"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/residency"
)

// A decode loop's view of the weights: plan the tiny model into a budget
// that streams some of its blocks, place it, and walk every group twice
// as two decode steps do, waiting for each copy on a compute stream.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "residency-example-")
	defer os.RemoveAll(dir)
	path, err := synth.WriteTiny(ctx, dir, synth.Safetensors)
	if err != nil {
		fmt.Println(err)
		return
	}
	m, err := weights.Open(path)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close()

	d := sim.New(sim.DefaultOptions())
	defer d.Close()
	budget, err := residency.PlanBudget(d, 4<<20) // the whole footprint: 4 MiB
	if err != nil {
		fmt.Println(err)
		return
	}
	groups, _ := plan.GroupWeights(m.Tensors)
	p, err := plan.PlanWeights(groups, plan.WeightOptions{Budget: budget.PoolBytes, LinkGBps: 25})
	if err != nil {
		fmt.Println(err)
		return
	}
	dev, _ := pool.New(d, pool.Options{Name: "weights"})
	defer dev.Close()
	host, _ := pool.NewHost(d, pool.Options{Name: "pinned", Cache: pool.CacheOff})
	defer host.Close()

	r, err := residency.New(ctx, d, dev, host, m, p, residency.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	compute, _ := d.NewStream()
	done := make([]device.Event, len(p.Groups))
	for g := range done {
		e, _ := d.NewEvent(false)
		done[g] = e
	}
	for step := range 2 {
		for g := range p.Groups {
			views, ready, err := r.Acquire(g)
			if err != nil {
				fmt.Println(err)
				return
			}
			if ready != 0 {
				d.StreamWaitEvent(compute, ready)
			}
			_ = views // kernels reading views[i].Ptr run on compute here
			d.EventRecord(done[g], compute)
			if err := r.Release(g, done[g]); err != nil {
				fmt.Println(err)
				return
			}
		}
		if step == 0 {
			st := r.Stats()
			fmt.Printf("%d groups, %d resident, %d slots; %d bytes streamed per step from %s\n",
				st.Groups, st.ResidentGroups, st.Slots, st.PassBytes, st.Source)
		}
	}
	d.StreamSynchronize(compute)
	st := r.Stats()
	fmt.Printf("after two steps: %d copies, %d bytes\n", st.Copies, st.StreamedBytes)
	if err := r.Close(); err != nil {
		fmt.Println(err)
	}
	fmt.Println("device pool bytes in use after Close:", dev.Stats().UsedBytes)
	// Output:
	// 7 groups, 3 resident, 2 slots; 5804032 bytes streamed per step from registered-mmap
	// after two steps: 9 copies, 13059072 bytes
	// device pool bytes in use after Close: 0
}
