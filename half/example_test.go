package half_test

import (
	"fmt"

	"github.com/memwall/memwall/half"
)

// Narrowing rounds to nearest even; widening is exact.
func ExampleF32ToF16() {
	h := half.F32ToF16(0.1)
	b := half.F32ToBF16(0.1)
	fmt.Printf("%#04x %v\n", h, half.F16ToF32(h))
	fmt.Printf("%#04x %v\n", b, half.BF16ToF32(b))
	fmt.Printf("%#04x\n", half.F32ToF16(70000)) // past 65504: +Inf
	// Output:
	// 0x2e66 0.099975586
	// 0x3dcd 0.100097656
	// 0x7c00
}
