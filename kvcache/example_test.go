package kvcache_test

import (
	"fmt"

	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/kvcache"
	"github.com/memwall/memwall/pool"
)

// A cache for a small model on the simulator: two requests share a system
// prompt's blocks, a fork shares everything until it appends.
func Example() {
	d := sim.New(sim.DefaultOptions())
	dev, _ := pool.New(d, pool.Options{})
	host, _ := pool.NewHost(d, pool.Options{})
	defer dev.Close()
	defer host.Close()
	c, err := kvcache.New(d, dev, host, kvcache.Config{Layers: 4, KVHeads: 4, HeadDim: 32, ElemBytes: 2, Blocks: 64},
		kvcache.Options{HostBlocks: 16})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	system := make([]int32, 32) // two full blocks of 16 tokens
	for i := range system {
		system[i] = int32(100 + i)
	}
	a := append(append([]int32{}, system...), 1, 2, 3)
	b := append(append([]int32{}, system...), 4, 5)
	ca, _ := c.Add(1, a, 0)
	// ... the engine's prefill writes a's K/V, then:
	_ = c.Computed(1, len(a))
	cb, _ := c.Add(2, b, 0)
	fmt.Println("cached tokens:", ca, cb)
	fmt.Println("shared first block:", c.Table(1)[0] == c.Table(2)[0])
	fmt.Println("block bytes:", c.BlockBytes())

	_ = c.Fork(2, 3)
	_ = c.Append(3, 6) // copies the shared partial block on the device
	fmt.Println("fork's last block is its own:", c.Table(3)[2] != c.Table(2)[2])
	// Output:
	// cached tokens: 0 32
	// shared first block: true
	// block bytes: 32768
	// fork's last block is its own: true
}
