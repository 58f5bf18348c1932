package kernels

import (
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"
	"unsafe"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/device/cpu"
	"github.com/memwall/memwall/device/cpu/hostmath"
)

// CPU returns the kernels of Names for the CPU device (cpu.Options.Kernels):
// the products (every GEMV and GEMM entry, and the grouped GEMV), attention
// and SiLU·mul run on package hostmath's vector kernels over the device's
// workers, reading the weights where they lie; the others are the
// simulator's Go twins, whose math is hostmath's element-wise code too.
// They check their arguments as the twins do (a launch the CUDA code would
// run only partly fails with device.ErrInvalid). The products' sums are
// ordered differently from HostMatmul's, so results agree with the
// simulator's within float32 rounding, not bit for bit. Each call returns a
// new slice.
func CPU() []cpu.Kernel {
	fast := map[string]func(m *cpu.Mem, grid, block device.Dim3, args []any) error{
		NameSiluMul: func(m *cpu.Mem, grid, block device.Dim3, args []any) error {
			return siluMulOver(m.Runner(), m, grid, block, args)
		},
		NameAttnDecode: cpuAttnDecode,
		NameSpin:       cpuSpin,
	}
	for _, dt := range DTypes() {
		for _, kind := range []int{matGemv1, matGemv, matGemm} {
			fast[matName(dt, kind)] = cpuMatmul(dt, kind)
		}
		for k := gemvMMA; k < gemvKinds; k++ {
			fast[matName(dt, matStream+k)] = cpuMatmul(dt, matStream+k)
		}
		fast[gemvGroupName(dt)] = cpuGemvGroup(dt)
	}
	for _, e := range attnLanes {
		fast[AttnName(32*e)] = cpuAttn(AttnName(32*e), e)
	}
	maps.Copy(fast, quantCPU())
	// Each row of the batched decode attention runs the CPU's decode attention.
	rows := rowsGoKernels(func(mem memory, grid, block device.Dim3, args []any) error {
		return cpuAttnDecode(mem.(*cpu.Mem), grid, block, args)
	})
	for _, k := range rows {
		if k.name == NameAttnDecodeRows {
			fast[k.name] = func(m *cpu.Mem, grid, block device.Dim3, args []any) error { return k.run(m, grid, block, args) }
		}
	}
	var out []cpu.Kernel
	for _, k := range goKernels() {
		run := fast[k.name]
		if run == nil {
			run = func(m *cpu.Mem, grid, block device.Dim3, args []any) error { return k.run(m, grid, block, args) }
		}
		out = append(out, cpu.Kernel{Name: k.name, Run: run})
	}
	return out
}

// cpuSpin holds the stream for its nanoseconds, sleeping (not spinning a
// core).
func cpuSpin(m *cpu.Mem, grid, block device.Dim3, args []any) error {
	if err := runSpin(m, grid, block, args); err != nil {
		return err
	}
	time.Sleep(time.Duration(args[0].(uint64)))
	return nil
}

// f32s views b (4-byte aligned host memory: the kernels checked the
// address) as float32s.
func f32s(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}

func cpuMatmul(dtype string, kind int) func(m *cpu.Mem, grid, block device.Dim3, args []any) error {
	return func(m *cpu.Mem, grid, block device.Dim3, args []any) error {
		op, err := matOperands(dtype, kind, m, grid, block, args)
		if err != nil {
			return err
		}
		if err := writable(m, op.name, "Y", op.y); err != nil {
			return err
		}
		m.Math().MatmulNative(m.Runner(), f32s(op.y), op.w, op.x, hostDType(dtype), int(op.M), int(op.K), int(op.T))
		return nil
	}
}

// writable fails when b, an output, lies in read-only memory.
func writable(m *cpu.Mem, kernel, what string, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if _, err := m.Writable(device.Ptr(uintptr(unsafe.Pointer(unsafe.SliceData(b)))), uint64(len(b))); err != nil {
		return fmt.Errorf("kernels: %s: %s: %w", kernel, what, err)
	}
	return nil
}

func cpuGemvGroup(dtype string) func(m *cpu.Mem, grid, block device.Dim3, args []any) error {
	return func(m *cpu.Mem, grid, block device.Dim3, args []any) error {
		x, ops, err := groupOperands(dtype, m, grid, block, args)
		if err != nil || len(ops) == 0 {
			return err
		}
		ps := make([]hostmath.Product, len(ops))
		for i, op := range ops {
			if err := writable(m, op.name, fmt.Sprintf("Y%d", i), op.y); err != nil {
				return err
			}
			ps[i] = hostmath.Product{Y: f32s(op.y), W: op.w, M: int(op.M)}
		}
		m.Math().MatmulGroupNative(m.Runner(), ps, x, hostDType(dtype), int(ops[0].K), 1)
		return nil
	}
}

func cpuAttn(name string, lanes uint32) func(m *cpu.Mem, grid, block device.Dim3, args []any) error {
	return func(m *cpu.Mem, grid, block device.Dim3, args []any) error {
		op, err := attnOperands(name, lanes, m, grid, block, args)
		if err != nil || op.a.T == 0 {
			return err
		}
		return cpuAttention(m, name, &op)
	}
}

// cpuAttnDecode: memwall_attn_decode's shapes, the CPU's split attention.
func cpuAttnDecode(m *cpu.Mem, grid, block device.Dim3, args []any) error {
	if err := checkDecodeArgs(args); err != nil {
		return err
	}
	return cpuAttn(NameAttnDecode, 4)(m, grid, block, args)
}

// cpuAttention computes a checked split-attention launch as the twin does
// (scores scale·q·k in float32, softmax in float32 through float64 exp,
// then out = Σ w·v / Σ w, or the partials when split), one (token, kv
// head, split) at a time over the workers: each takes the group's query
// heads together through hostmath's products over the K rows of each cache
// block and its weighted sum over the V rows.
func cpuAttention(m *cpu.Mem, name string, op *attnOp) error {
	a, L := &op.a, op.a.L
	if err := writable(m, name, "out", op.out); err != nil {
		return err
	}
	dt, hd, G, pitch := hostDType(L.DType), int(L.HeadDim), int(op.G), int(L.RowBytes())
	elt, _ := ElemSize(L.DType)
	q := f32s(op.q)
	units := int(a.T) * int(L.KVHeads) * int(op.splits)
	var mu sync.Mutex
	var first error
	km := m.Math()
	m.Runner().Run(units, 1, func(lo, hi int) {
		scores := make([]float32, G*int(a.chunk))
		acc := make([]float32, G*hd)
		mx, l := make([]float32, G), make([]float32, G)
		for u := lo; u < hi; u++ {
			s := uint64(u) % op.splits
			kvh := uint32(u / int(op.splits) % int(L.KVHeads))
			t := uint32(u / int(op.splits) / int(L.KVHeads))
			n := uint64(a.start) + uint64(t) + 1
			p0 := s * uint64(a.chunk)
			p1 := max(p0, min(n, p0+uint64(a.chunk)))
			np := int(p1 - p0)
			row0 := uint64(t)*uint64(a.nHeads) + uint64(kvh)*uint64(op.G)
			qg := q[row0*uint64(hd) : (row0+uint64(G))*uint64(hd)]
			// each calls f on every run of positions [p, p+c) inside one
			// cache block, with the K (kv 0) or V rows there, at the
			// block's row pitch.
			each := func(kv uint32, f func(p uint64, c int, rows []byte)) error {
				for p := p0; p < p1; {
					c := min(p1, (p/uint64(L.BlockTokens)+1)*uint64(L.BlockTokens)) - p
					off := L.Offset(op.blocks[p/uint64(L.BlockTokens)], a.layer, kv, uint32(p), kvh)
					rows, err := m.Bytes(a.cache.Add(off), (c-1)*uint64(pitch)+uint64(hd*elt))
					if err != nil {
						return err
					}
					f(p, int(c), rows)
					p += c
				}
				return nil
			}
			err := each(0, func(p uint64, c int, rows []byte) {
				km.Dots(scores[p-p0:], np, rows, pitch, dt, qg, hd, c, hd, G)
			})
			for g := range G {
				sg := scores[g*np : g*np+np]
				mx[g] = hostmath.SoftmaxScale(sg, a.scale)
				l[g] = hostmath.SoftmaxExp(sg, mx[g])
			}
			clear(acc)
			if err == nil {
				err = each(1, func(p uint64, c int, rows []byte) {
					km.WeightedSum(acc, hd, scores[p-p0:], np, rows, pitch, dt, c, hd, G)
				})
			}
			if err != nil {
				mu.Lock()
				first = errors.Join(first, fmt.Errorf("kernels: %s: token %d kv head %d: %w", name, t, kvh, err))
				mu.Unlock()
				continue
			}
			for g := range G {
				op.put(row0+uint64(g), s, mx[g], l[g], acc[g*hd:(g+1)*hd])
			}
		}
	})
	return first
}
