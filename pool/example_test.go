package pool_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/pool"
)

// A pool sub-allocates one device's memory: Alloc and Free cost no driver
// call once the pool holds memory, and Stats accounts for every byte by
// purpose. The simulated device stands in for a GPU here.
func Example() {
	d := sim.New(sim.DefaultOptions())
	defer d.Close()
	p, err := pool.New(d, pool.DefaultOptions(d))
	if err != nil {
		panic(err)
	}
	defer p.Close()

	w, err := p.Alloc(64<<20, pool.AllocOptions{Purpose: pool.Weights})
	if err != nil {
		panic(err)
	}
	a, err := p.Alloc(3<<20, pool.AllocOptions{Purpose: pool.Activations})
	if err != nil {
		panic(err)
	}
	st := p.Stats()
	fmt.Println("live blocks:", st.LiveBlocks)
	fmt.Println("weights:", st.ByPurpose["weights"]>>20, "MiB; activations:", st.ByPurpose["activations"]>>20, "MiB")

	if err := p.Free(a); err != nil {
		panic(err)
	}
	if err := p.Free(w); err != nil {
		panic(err)
	}
	fmt.Println("live blocks after Free:", p.Stats().LiveBlocks)
	// Output:
	// live blocks: 2
	// weights: 64 MiB; activations: 3 MiB
	// live blocks after Free: 0
}

// An allocation the pool cannot serve says why, and carries a snapshot
// that `memwall replay --html page.html oom.jsonl` draws.
func ExampleOOMError() {
	so := sim.DefaultOptions()
	so.Backing = false
	d := sim.New(so)
	p, err := pool.New(d, pool.Options{Name: "kv", Limit: 8 << 20, History: 100})
	if err != nil {
		panic(err)
	}
	defer p.Close()
	_, err = p.Alloc(16<<20, pool.AllocOptions{})
	var oom *pool.OOMError
	if errors.As(err, &oom) {
		fmt.Println(oom.Cause, oom.Snapshot != nil)
		// trace.WriteSnapshot(f, oom.Snapshot) writes it for memwall replay --html.
	}
	// Output: pool limit true
}

// A replay, or a program that wants the reclaimer on its own clock, runs
// its passes itself (ReclaimByCaller). Free pages beyond the soft target
// that no block has lain on for a whole pass go back at the next one.
// (A hold time of 20 µs makes the pool hot from its first placement here;
// the default is 100 ms, and a pool placing fewer than 50,000 blocks a
// second moves its pages at once instead.)
func ExamplePool_Reclaim() {
	so := sim.DefaultOptions()
	so.Backing = false
	so.VirtualMemory = true
	so.Granularity = 2 << 20
	d := sim.New(so)
	defer d.Close()
	p, err := pool.New(d, pool.Options{Cache: pool.CacheOff, HoldTime: 20 * time.Microsecond, Reclaimer: pool.ReclaimByCaller, ReserveBytes: 1 << 30})
	if err != nil {
		panic(err)
	}
	defer p.Close()
	a, _ := p.Alloc(20<<20, pool.AllocOptions{})
	b, _ := p.Alloc(20<<20, pool.AllocOptions{})
	_ = p.Free(a)
	c, _ := p.Alloc(30<<20, pool.AllocOptions{}) // a's hole is too small: new pages, a's stay mapped
	fmt.Println("reserved MiB:", p.Stats().ReservedBytes>>20, "unmaps:", p.Stats().Unmaps)
	fmt.Println("first pass gives back MiB:", p.Reclaim()>>20)  // a's pages were not free at the pass before
	fmt.Println("second pass gives back MiB:", p.Reclaim()>>20) // idle for a whole pass, beyond the target
	fmt.Println("reserved MiB:", p.Stats().ReservedBytes>>20)
	_, _ = b, c
	// Output:
	// reserved MiB: 70 unmaps: 0
	// first pass gives back MiB: 0
	// second pass gives back MiB: 20
	// reserved MiB: 50
}
