package pool_test

import (
	"errors"
	"fmt"

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
		// oom.WriteSnapshot("oom.jsonl") writes it.
	}
	// Output: pool limit true
}
