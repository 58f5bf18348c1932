package kernels_test

import (
	"fmt"

	"github.com/memwall/memwall/device/sim"
	"github.com/memwall/memwall/kernels"
)

// One Llama step's first ops on the simulator: embed two tokens, normalize
// them into bf16, and round a float32 buffer to bf16 precision. The same
// calls run on a GPU with a *cuda.Device.
func Example() {
	o := sim.DefaultOptions()
	o.Kernels = kernels.Sim()
	d := sim.New(o)
	defer d.Close()
	s, err := kernels.Load(d, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	st, _ := d.NewStream()

	const V, H, T = 3, 4, 2
	table, _ := kernels.Encode(kernels.BF16, []float32{0, 0, 0, 0, 1, 2, 3, 4, -1, 1, -1, 1})
	ids := []byte{1, 0, 0, 0, 2, 0, 0, 0} // int32 1, 2
	norm, _ := kernels.Encode(kernels.F32, []float32{1, 1, 1, 1})
	pTable, _ := d.Alloc(uint64(len(table)))
	pIDs, _ := d.Alloc(8)
	pNorm, _ := d.Alloc(16)
	x, _ := d.Alloc(4 * T * H)
	out, _ := d.Alloc(2 * T * H)
	_ = d.CopyHtoD(pTable, table, st)
	_ = d.CopyHtoD(pIDs, ids, st)
	_ = d.CopyHtoD(pNorm, norm, st)

	if err := s.Embed(pTable, kernels.BF16, pIDs, x, T, H, st); err != nil {
		fmt.Println(err)
		return
	}
	if err := s.RMSNorm(x, pNorm, kernels.F32, out, kernels.BF16, T, H, 1e-5, st); err != nil {
		fmt.Println(err)
		return
	}
	b := make([]byte, 2*T*H)
	_ = d.CopyDtoH(b, out, st)
	_ = d.StreamSynchronize(st)
	y, _ := kernels.Decode(kernels.BF16, b)
	fmt.Printf("%.3f\n", y)
	fmt.Println(kernels.RoundTo(kernels.BF16, 1.00390625), s.GemmLibrary())
	// Output:
	// [0.365 0.730 1.094 1.461 -1.000 1.000 -1.000 1.000]
	// 1 memwall
}

// What Matmul launches for a decode step's products on a GPU of 46 SMs (the
// simulator's default): the one-row-per-warp GEMV for one token, the
// tensor-core GEMV with its grid sized to the GPU for four, and the tiled
// GEMM for a prefill chunk.
func ExampleSet_Shape() {
	o := sim.DefaultOptions()
	o.Kernels = kernels.Sim()
	d := sim.New(o)
	defer d.Close()
	s, err := kernels.Load(d, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	for _, T := range []uint32{1, 4, 512} {
		sh, _ := s.Shape(kernels.BF16, 14336, 4096, T)
		fmt.Println(T, sh.Kernel, sh.Grid.X)
	}
	// Output:
	// 1 memwall_gemv1_bf16 1792
	// 4 memwall_gemvm_bf16 128
	// 512 memwall_gemm_bf16 112
}

// Overlapped launches are the compute_90 module's, on a device that offers
// device.OverlapLauncher (a *cuda.Device on Hopper and newer). The
// simulator offers none, so its Set launches plainly; an A/B run turns them
// off with SetOverlap(false) or MEMWALL_KERNELS_PDL=0 at Load.
func ExampleSet_Overlap() {
	o := sim.DefaultOptions()
	o.Kernels = kernels.Sim()
	d := sim.New(o)
	defer d.Close()
	getenv := func(k string) string {
		return map[string]string{kernels.EnvPrefetch: "32768"}[k]
	}
	s, err := kernels.Load(d, getenv)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	fmt.Println(s.Overlap(), s.SetOverlap(true), s.GemvPrefetch())
	// Output:
	// false false 32768
}
