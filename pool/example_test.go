package pool_test

import (
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
