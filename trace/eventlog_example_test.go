package trace_test

import (
	"bytes"
	"fmt"
	"io"

	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/pool"
	"github.com/memwall/memwall/trace"
)

// An event log records every allocation and free of a pool as the JSON
// lines that `memwall replay` reads (a file in a real program), so a run's
// requests can be replayed through other pool configurations later.
func ExampleEventLog() {
	d := sim.New(sim.DefaultOptions())
	defer d.Close()
	var buf bytes.Buffer
	log := trace.NewEventLog(&buf)
	p, err := pool.New(d, pool.Options{OnEvent: log.Record})
	if err != nil {
		panic(err)
	}
	defer p.Close()

	b, err := p.Alloc(1<<20, pool.AllocOptions{Purpose: pool.KV})
	if err != nil {
		panic(err)
	}
	if err := p.Free(b); err != nil {
		panic(err)
	}
	if err := log.Flush(); err != nil {
		panic(err)
	}

	r, err := trace.NewReader(&buf, "pool.jsonl", trace.Options{})
	if err != nil {
		panic(err)
	}
	for {
		ev, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			panic(err)
		}
		fmt.Println(ev.Action, ev.Size, ev.Purpose)
	}
	// Output:
	// alloc 1048576 kv
	// free_requested 1048576 kv
	// free_completed 1048576 kv
}
