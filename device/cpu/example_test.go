package cpu_test

import (
	"fmt"

	"github.com/memwall/memwall/device/cpu"
)

// The host as a device: memory is host memory at real addresses, work
// runs in order on a stream's goroutine. (A program that runs memwall's
// kernels passes cpu.Options{Kernels: kernels.CPU()}.)
func Example() {
	d, err := cpu.New(cpu.Options{})
	if err != nil {
		panic(err)
	}
	defer d.Close()
	p, _ := d.Alloc(16)
	s, _ := d.NewStream()
	d.Memset8(p, 7, 16, s)
	out := make([]byte, 4)
	d.CopyDtoH(out, p+2, s)
	if err := d.StreamSynchronize(s); err != nil {
		panic(err)
	}
	fmt.Println(d.Info().Backend, out)
	// Output: cpu [7 7 7 7]
}
