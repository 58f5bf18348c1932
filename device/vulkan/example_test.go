package vulkan_test

import (
	"fmt"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/vulkan"
	"github.com/memwall/memwall/kernels/spirv"
)

// Open a Vulkan device, copy bytes through it and fill a buffer with a
// SPIR-V kernel. (No Output: it needs a Vulkan driver; lavapipe will do.)
func Example() {
	d, err := vulkan.Open(vulkan.Options{}) // MEMWALL_VULKAN_DEVICE=0 or =NVIDIA picks one
	if err != nil {
		fmt.Println("no Vulkan here:", err)
		return
	}
	defer d.Close()
	p, _ := d.Alloc(1 << 20) // one VkDeviceMemory, a VkBuffer over it, a Ptr range
	defer d.Free(p)
	s, _ := d.NewStream() // a timeline semaphore; copies go to a transfer queue
	defer d.DestroyStream(s)

	_ = d.CopyHtoD(p.Add(100), []byte("hello"), s) // interior Ptrs resolve to buffer offsets
	m, _ := d.LoadModule(spirv.Module())
	fill, _ := d.Function(m, spirv.NameFill)
	_ = d.Launch(fill, device.Dim3{X: 64, Y: 1, Z: 1}, device.Dim3{X: 256, Y: 1, Z: 1}, 0, s,
		p.Add(4096), uint64(1024), uint32(7)) // a Ptr argument becomes a buffer device address
	got := make([]byte, 5)
	_ = d.CopyDtoH(got, p.Add(100), s)
	_ = d.StreamSynchronize(s)
	fmt.Println(string(got), d.Info().Backend)
}
