package pool_test

import (
	"errors"
	"fmt"

	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/pool"
)

// Layers stack over a pool: a tenant's quota, an event log, counts. Each
// takes any Resource, so the order is the program's.
func ExampleResource() {
	d := sim.New(sim.DefaultOptions())
	defer d.Close()
	p, err := pool.New(d, pool.DefaultOptions(d))
	if err != nil {
		panic(err)
	}
	defer p.Close()
	model, err := p.Tenant("llama", 96<<20)
	if err != nil {
		panic(err)
	}
	events := 0 // package trace's EventLog.Record would write them to a file
	r := pool.NewCounter(pool.WithEvents(model, func(pool.Event) { events++ }), "llama")

	kv, err := r.Alloc(64<<20, pool.AllocOptions{Purpose: pool.KV})
	if err != nil {
		panic(err)
	}
	_, err = r.Alloc(64<<20, pool.AllocOptions{Purpose: pool.Activations})
	var oom *pool.OOMError
	if errors.As(err, &oom) {
		fmt.Println("refused by:", oom.Cause)
	}
	fmt.Println("freed through the pool:", errors.Is(p.Free(kv), pool.ErrInvalidHandle))
	fmt.Println("tenant uses:", model.Used()>>20, "MiB; counter sees:", r.Stats().UsedBytes>>20, "MiB")
	if err := r.Free(kv); err != nil {
		panic(err)
	}
	fmt.Println("logged events:", events, "; live:", r.Stats().LiveBlocks)
	// Output:
	// refused by: tenant quota
	// freed through the pool: true
	// tenant uses: 64 MiB; counter sees: 64 MiB
	// logged events: 2 ; live: 0
}

// A pool can take its chunks from another pool: a model's pool, with its
// own arenas and caches, inside a server's, whose limit holds both.
func ExampleChunks() {
	d := sim.New(sim.DefaultOptions())
	defer d.Close()
	server, err := pool.New(d, pool.Options{Name: "server", Limit: 1 << 30})
	if err != nil {
		panic(err)
	}
	defer server.Close()
	model, err := pool.New(d, pool.Options{Name: "model", Upstream: pool.Chunks(server, pool.AllocOptions{Purpose: pool.Weights})})
	if err != nil {
		panic(err)
	}
	b, err := model.Alloc(100<<20, pool.AllocOptions{})
	if err != nil {
		panic(err)
	}
	fmt.Println("model grows by:", model.Options().Growth, "; its limit:", model.Options().Limit>>20, "MiB")
	// A request of more than half a chunk gets a chunk of its own, with
	// room for its alignment, in whole 2 MiB.
	fmt.Println("server holds for the model:", server.Stats().ByPurpose["weights"]>>20, "MiB")
	if err := model.Free(b); err != nil {
		panic(err)
	}
	if err := model.Close(); err != nil {
		panic(err)
	}
	fmt.Println("server after the model closed:", server.Stats().UsedBytes, "bytes")
	// Output:
	// model grows by: chunks ; its limit: 1024 MiB
	// server holds for the model: 102 MiB
	// server after the model closed: 0 bytes
}
