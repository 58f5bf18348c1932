package alloc_test

import (
	"errors"
	"fmt"

	"github.com/memwall/memwall/alloc"
)

// An allocator hands out offsets of a range; what the range is (device
// memory, an arena, a file) is the caller's business.
func Example() {
	a, err := alloc.New("bestfit", 1<<20) // 1 MiB of offsets
	if err != nil {
		panic(err)
	}
	x, _ := a.Alloc(4096, 256)
	y, _ := a.Alloc(100_000, 256)
	fmt.Println("x at", x.Offset, "size", x.Size)
	fmt.Println("y at", y.Offset, "size", y.Size)
	if err := a.Free(x.Offset); err != nil {
		panic(err)
	}
	st := a.Stats()
	fmt.Println("live blocks", st.LiveBlocks, "used", st.Used)
	// Output:
	// x at 0 size 4096
	// y at 4096 size 100000
	// live blocks 1 used 100000
}

// A request that does not fit returns an *OOMError, which errors.Is
// matches against ErrOutOfMemory and which says why.
func Example_outOfMemory() {
	a, _ := alloc.New("tlsf", 64<<10)
	_, err := a.Alloc(128<<10, 1)
	fmt.Println(errors.Is(err, alloc.ErrOutOfMemory))
	var oom *alloc.OOMError
	fmt.Println(errors.As(err, &oom), oom.Requested)
	// Output:
	// true
	// true 131072
}

// Strategies lists the names New accepts.
func ExampleStrategies() {
	fmt.Println(alloc.Strategies())
	// Output: [tlsf bestfit buddy slab linear]
}

// A caller that may refuse best fit's place (a device pool whose pages
// there are not mapped) looks at it first with Find, and takes it with
// AllocFit only if it suits; refusing it costs nothing.
func ExampleBestFit_Find() {
	a := alloc.NewBestFit(1 << 20)
	f, ok := a.Find(4096, 256)
	fmt.Println(ok, f.Offset)
	b, _, err := a.AllocFit(f)
	fmt.Println(b.Offset, b.Size, err)
	// Output:
	// true 0
	// 0 4096 <nil>
}
