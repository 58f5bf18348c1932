package hostmath_test

import (
	"fmt"

	"github.com/memwall/memwall/device/cpu/hostmath"
)

// A 2×3 bf16 weight matrix times two tokens, on the fastest variant this
// CPU runs, rows split over two workers.
func Example() {
	k, err := hostmath.New(hostmath.Best())
	if err != nil {
		panic(err)
	}
	r := hostmath.NewRunner(2)
	defer r.Close()
	w := make([]byte, 2*3*2)
	for i, v := range []float32{1, 2, 3, 4, 5, 6} {
		hostmath.Store(hostmath.BF16, w, i, v)
	}
	x := []float32{1, 0, 1, 0.5, 0.5, 0.5}
	y := make([]float32, 2*2)
	k.Matmul(r, y, w, hostmath.BF16, x, 2, 3, 2)
	fmt.Println(y)
	// Output: [4 10 3 7.5]
}
