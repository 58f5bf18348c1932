package kernels

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/memwall/memwall/device"
)

// arena is a fake simulator memory: one range of bytes at base.
type arena struct {
	base device.Ptr
	b    []byte
	next device.Ptr
}

func newArena(size int) *arena { return &arena{base: 1 << 20, b: make([]byte, size), next: 1 << 20} }

func (a *arena) Bytes(p device.Ptr, n uint64) ([]byte, error) {
	if p < a.base || uint64(p-a.base) > uint64(len(a.b)) || n > uint64(len(a.b))-uint64(p-a.base) {
		return nil, fmt.Errorf("fake memory: %#x+%d out of range: %w", uint64(p), n, device.ErrInvalid)
	}
	off := uint64(p - a.base)
	return a.b[off : off+n], nil
}

// alloc returns a 256-byte aligned range of n bytes.
func (a *arena) alloc(n int) device.Ptr {
	p := a.next
	a.next += device.Ptr((n + 255) &^ 255)
	if int(a.next-a.base) > len(a.b) {
		panic("arena too small for the test")
	}
	return p
}

func kernelByName(t *testing.T, name string) goKernel {
	t.Helper()
	for _, k := range goKernels() {
		if k.name == name {
			return k
		}
	}
	t.Fatalf("no Go kernel %s", name)
	return goKernel{}
}

func TestGoKernelsCoverNames(t *testing.T) {
	ks := goKernels()
	names := append(append(append(append(Names(), QuantNames()...), StateNames()...), ExtraNames()...), RowsNames()...)
	if len(ks) != len(names) {
		t.Fatalf("%d Go kernels, %d names", len(ks), len(names))
	}
	for i, k := range ks {
		if k.name != names[i] || k.run == nil || k.cost == nil {
			t.Errorf("Go kernel %d: %q (run %v, cost %v), want %q", i, k.name, k.run != nil, k.cost != nil, names[i])
		}
	}
}

func TestGoFillCheck(t *testing.T) {
	mem := newArena(1 << 20)
	const n = 10007
	buf := mem.alloc(4 * (n + 1))
	ctr := mem.alloc(8)
	fill, check := kernelByName(t, NameFill), kernelByName(t, NameCheck)
	grid, block := device.Dim3{X: 3, Y: 1, Z: 1}, blockDim()
	if err := fill.run(mem, grid, block, []any{buf, uint64(n), uint32(77)}); err != nil {
		t.Fatal(err)
	}
	b, _ := mem.Bytes(buf, 4*(n+1))
	for i := range uint64(n) {
		if got := binary.LittleEndian.Uint32(b[4*i:]); got != Pattern(77, i) {
			t.Fatalf("word %d = %#x, want %#x", i, got, Pattern(77, i))
		}
	}
	if binary.LittleEndian.Uint32(b[4*n:]) != 0 {
		t.Fatal("fill wrote past n words")
	}
	count := func(seed uint32) uint64 {
		c, _ := mem.Bytes(ctr, 8)
		clear(c)
		if err := check.run(mem, grid, block, []any{buf, uint64(n), seed, ctr}); err != nil {
			t.Fatal(err)
		}
		return binary.LittleEndian.Uint64(c)
	}
	if got := count(77); got != 0 {
		t.Fatalf("check after fill: %d mismatches", got)
	}
	for _, i := range []uint64{0, 17, n - 1} {
		binary.LittleEndian.PutUint32(b[4*i:], ^Pattern(77, i))
	}
	if got := count(77); got != 3 {
		t.Fatalf("check after corrupting 3 words: %d mismatches", got)
	}
	if got := count(78); got < n-3 {
		t.Fatalf("check with another seed: %d mismatches of %d", got, n)
	}
	// The counter accumulates, as the kernel's atomicAdd does.
	c, _ := mem.Bytes(ctr, 8)
	binary.LittleEndian.PutUint64(c, 1000)
	if err := check.run(mem, grid, block, []any{buf, uint64(n), uint32(77), ctr}); err != nil {
		t.Fatal(err)
	}
	if got := binary.LittleEndian.Uint64(c); got != 1003 {
		t.Errorf("counter = %d, want 1000 + 3", got)
	}
}

func TestGoKernelArgumentErrors(t *testing.T) {
	mem := newArena(1 << 16)
	p := mem.alloc(4096)
	g1 := device.Dim3{X: 1, Y: 1, Z: 1}
	gemmBF := device.Dim3{X: 1, Y: 1, Z: 1}
	tests := []struct {
		kernel      string
		grid, block device.Dim3
		args        []any
	}{
		{NameFill, g1, blockDim(), []any{p, uint64(4)}},
		{NameFill, g1, blockDim(), []any{p, 4, uint32(1)}},
		{NameFill, g1, blockDim(), []any{uint64(p), uint64(4), uint32(1)}},
		{NameFill, g1, blockDim(), []any{p, uint64(1 << 40), uint32(1)}},
		{NameFill, device.Dim3{}, blockDim(), []any{p, uint64(4), uint32(1)}},
		{NameCheck, g1, device.Dim3{X: 100, Y: 1, Z: 1}, []any{p, uint64(4), uint32(1), p}},
		{NameCheck, g1, blockDim(), []any{p, uint64(4), uint32(1), device.Ptr(8)}},
		{NameSpin, g1, g1, []any{int64(5)}},
		{GemvName(F16), g1, blockDim(), []any{p, p, p, uint32(8), uint32(8), uint32(9)}},                    // T > 8 on gemv
		{Gemv1Name(F16), g1, blockDim(), []any{p, p, p, uint32(9), uint32(8), uint32(1)}},                   // grid covers 8 rows
		{Gemv1Name(F16), g1, blockDim(), []any{p, p, p, uint32(8), uint32(8), uint32(2)}},                   // T > 1 on gemv1
		{GemvName(F16), g1, blockDim(), []any{p, p, p, uint32(17), uint32(8), uint32(3)}},                   // grid covers 16 rows
		{GemvName(F16), device.Dim3{X: 2, Y: 1, Z: 1}, g1, []any{p, p, p, uint32(9), uint32(8), uint32(1)}}, // block
		{GemmName(BF16), gemmBF, blockDim(), []any{p, p, p, uint32(8), uint32(8), uint32(129)}},             // grid.Y
		{GemmName(F32), gemmBF, blockDim(), []any{p, p + 2, p, uint32(8), uint32(8), uint32(9)}},            // misaligned X
		{GemmName(F32), gemmBF, blockDim(), []any{p, p, p, uint32(8), uint32(8)}},                           // arity
		{GemmName(F32), gemmBF, blockDim(), []any{p, p, p, uint32(64), uint32(1024), uint32(9)}},            // W out of memory
	}
	for i, tc := range tests {
		t.Run(fmt.Sprintf("%d_%s", i, tc.kernel), func(t *testing.T) {
			err := kernelByName(t, tc.kernel).run(mem, tc.grid, tc.block, tc.args)
			if !errors.Is(err, device.ErrInvalid) {
				t.Fatalf("err %v, want device.ErrInvalid", err)
			}
		})
	}
}

func TestGoMatmulKernels(t *testing.T) {
	shapes := []struct{ M, K, T uint32 }{{1, 1, 1}, {37, 13, 8}, {100, 70, 9}, {130, 64, 130}, {5, 0, 3}}
	for _, dt := range DTypes() {
		for _, s := range shapes {
			t.Run(fmt.Sprintf("%s/%dx%dx%d", dt, s.M, s.K, s.T), func(t *testing.T) {
				M, K, T := int(s.M), int(s.K), int(s.T)
				W, X := randMatrices(t, dt, M, K, T, 11)
				mem := newArena(1 << 22)
				pw, px, py := mem.alloc(len(W)), mem.alloc(len(X)), mem.alloc(4*M*T)
				wb, _ := mem.Bytes(pw, uint64(len(W)))
				xb, _ := mem.Bytes(px, uint64(len(X)))
				copy(wb, W)
				copy(xb, X)
				sh, err := ShapeFor(dt, s.M, s.K, s.T)
				if err != nil {
					t.Fatal(err)
				}
				k := kernelByName(t, sh.Kernel)
				args := []any{pw, px, py, s.M, s.K, s.T}
				if s.T <= GemvMaxTokens {
					args = append(args, uint32(0)) // the GEMV kernels' L2 prefetch bytes
				}
				if err := k.run(mem, sh.Grid, sh.Block, args); err != nil {
					t.Fatal(err)
				}
				yb, _ := mem.Bytes(py, uint64(4*M*T))
				y := make([]float32, M*T)
				for i := range y {
					y[i] = math.Float32frombits(binary.LittleEndian.Uint32(yb[4*i:]))
				}
				if err := CheckMatmul(dt, W, X, y, M, K, T, 0, 1); err != nil {
					t.Fatal(err)
				}
				c, ok := k.cost(sh.Grid, sh.Block, args)
				elt, _ := ElemSize(dt)
				wantBytes := float64(M*K*elt + T*K*elt + T*M*4)
				if !ok || c.flops != 2*float64(M*K*T) || c.bytes != wantBytes || c.fixed != 0 {
					t.Errorf("cost %+v ok=%v, want flops %d bytes %g", c, ok, 2*M*K*T, wantBytes)
				}
			})
		}
	}
}

func TestGoKernelCosts(t *testing.T) {
	p := device.Ptr(1 << 20)
	g := device.Dim3{X: 1, Y: 1, Z: 1}
	if c, ok := kernelByName(t, NameFill).cost(g, blockDim(), []any{p, uint64(1000), uint32(1)}); !ok || c.bytes != 4000 {
		t.Errorf("fill cost %+v %v, want 4000 bytes", c, ok)
	}
	if c, ok := kernelByName(t, NameCheck).cost(g, blockDim(), []any{p, uint64(10), uint32(1), p}); !ok || c.bytes != 40 {
		t.Errorf("check cost %+v %v, want 40 bytes", c, ok)
	}
	if c, ok := kernelByName(t, NameSpin).cost(g, g, []any{uint64(1500)}); !ok || c.fixed != 1500*time.Nanosecond {
		t.Errorf("spin cost %+v %v, want 1.5µs fixed", c, ok)
	}
	if _, ok := kernelByName(t, NameSpin).cost(g, g, []any{"x"}); ok {
		t.Error("spin cost accepted a bad argument")
	}
	if _, ok := kernelByName(t, GemmName(F16)).cost(g, g, []any{p}); ok {
		t.Error("gemm cost accepted a bad argument list")
	}
}
