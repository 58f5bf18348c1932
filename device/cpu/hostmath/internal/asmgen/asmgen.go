// Package asmgen writes hostmath's amd64 kernels: Go assembly for every
// (instruction set, dtype, rows, tokens) shape of the product kernel and
// every (instruction set, dtype, tokens) shape of the weighted sum, and the
// Go file that declares them and lays them out in hostmath's tables.
// hostmath's go:generate line runs it; a test there checks that the
// committed files are what Generate gives.
package asmgen

import (
	"bytes"
	"fmt"
	"go/format"
	"strings"
)

// MaxTile is hostmath.MaxTile: the most tokens one kernel takes.
const MaxTile = 8

// isa is an instruction set the kernels are written for.
type isa struct {
	name  string // in Go identifiers: "AVX2", "AVX512"
	reg   string // vector register prefix: "Y" or "Z"
	regs  int    // vector registers
	width int    // float32 lanes per register
}

var (
	avx2   = isa{name: "AVX2", reg: "Y", regs: 16, width: 8}
	avx512 = isa{name: "AVX512", reg: "Z", regs: 32, width: 16}
)

// dtype is a weight element type.
type dtype struct {
	name  string // "F32", "BF16", "F16"
	scale int    // bytes per element
}

var dtypes = []dtype{{"F32", 4}, {"BF16", 2}, {"F16", 2}}

// General-purpose registers: the rows of W and the tokens of x (see dots).
var (
	rowRegs = []string{"SI", "R8", "R9", "R10"}
	tokRegs = []string{"DI", "R11", "R12", "R13", "R14", "R15", "BX", "DX"}
)

// maxRows is the most rows a product kernel of T tokens takes on s: R·T
// accumulators plus R weight registers (plus one for bf16 activations)
// within the register file, and at most four row pointers.
func maxRows(s isa, T int, extra int) int {
	r := (s.regs - extra) / (T + 1)
	return min(r, len(rowRegs))
}

// Rows returns the row count of the wide product kernel for T tokens on
// the instruction set named ("AVX2", "AVX512", or "AVX512BF16" for the
// bf16 × bf16 kernels).
func Rows(set string, T int) int {
	switch set {
	case "AVX2":
		return maxRows(avx2, T, 0)
	case "AVX512":
		return maxRows(avx512, T, 0)
	case "AVX512BF16":
		return maxRows(avx512, T, 1)
	}
	return 0
}

type writer struct{ bytes.Buffer }

func (w *writer) op(format string, a ...any) { fmt.Fprintf(&w.Buffer, "\t"+format+"\n", a...) }

// vreg names vector register i on s at the width used (Y or Z), or a
// narrower view of it.
func vreg(prefix string, i int) string { return fmt.Sprintf("%s%d", prefix, i) }

// loadRow writes the instructions that widen one register of elements of
// dt at mem into register dst.
func loadRow(w *writer, dt dtype, mem, dst string) {
	switch dt.name {
	case "F32":
		w.op("VMOVUPS %s, %s", mem, dst)
	case "BF16":
		w.op("VPMOVZXWD %s, %s", mem, dst)
		w.op("VPSLLD $16, %s, %s", dst, dst)
	case "F16":
		w.op("VCVTPH2PS %s, %s", mem, dst)
	}
}

// reduce writes the horizontal sum of accumulator acc (a full register of
// s) into its lowest lane, using register scratch, and stores it at mem.
func reduce(w *writer, s isa, acc, scratch int, mem string) {
	if s.reg == "Z" {
		w.op("VEXTRACTF32X8 $1, Z%d, Y%d", acc, scratch)
		w.op("VADDPS Y%d, Y%d, Y%d", scratch, acc, acc)
		w.op("VEXTRACTF32X4 $1, Y%d, X%d", acc, scratch)
	} else {
		w.op("VEXTRACTF128 $1, Y%d, X%d", acc, scratch)
	}
	w.op("VADDPS X%d, X%d, X%d", scratch, acc, acc)
	w.op("VMOVHLPS X%d, X%d, X%d", acc, scratch, scratch)
	w.op("VADDPS X%d, X%d, X%d", scratch, acc, acc)
	w.op("VMOVSHDUP X%d, X%d", acc, scratch)
	w.op("VADDSS X%d, X%d, X%d", scratch, acc, acc)
	w.op("VMOVSS X%d, %s", acc, mem)
}

// DotsName is the Go name of a product kernel.
func DotsName(set, dt string, R, T int) string { return fmt.Sprintf("dots%s%sR%dT%d", set, dt, R, T) }

// WsumName is the Go name of a weighted-sum kernel.
func WsumName(set, dt string, T int) string { return fmt.Sprintf("wsum%s%sT%d", set, dt, T) }

const dotsArgs = "(w unsafe.Pointer, ws uintptr, x unsafe.Pointer, xs uintptr, y unsafe.Pointer, ys uintptr, n uintptr)"
const wsumArgs = "(acc unsafe.Pointer, as uintptr, v unsafe.Pointer, vs uintptr, p unsafe.Pointer, ps uintptr, n uintptr)"

// pointers loads the row and token pointers of a product kernel of R rows
// and T tokens from its arguments: rows from w at stride ws, tokens from x
// at stride xs, then n into CX.
func pointers(w *writer, R, T int) {
	w.op("MOVQ w+0(FP), SI")
	w.op("MOVQ ws+8(FP), BX")
	chain(w, rowRegs[:R], "BX")
	w.op("MOVQ x+16(FP), DI")
	w.op("MOVQ xs+24(FP), DX")
	chain(w, tokRegs[:T], "DX")
	w.op("MOVQ n+48(FP), CX")
}

// chain sets regs[i] = regs[i−1] + stride for i ≥ 1 (regs[0] is loaded).
func chain(w *writer, regs []string, stride string) {
	for i := 1; i < len(regs); i++ {
		w.op("LEAQ (%s)(%s*1), %s", regs[i-1], stride, regs[i])
	}
}

// store writes the R·T accumulators' sums to y: token t's row r at
// y + t·ys + 4r. scratch is a register free by then.
func store(w *writer, s isa, R, T, scratch int, acc func(r, t int) int) {
	w.op("MOVQ y+32(FP), AX")
	w.op("MOVQ ys+40(FP), CX")
	for t := range T {
		for r := range R {
			reduce(w, s, acc(r, t), scratch, fmt.Sprintf("%d(AX)", 4*r))
		}
		if t < T-1 {
			w.op("ADDQ CX, AX")
		}
	}
	w.op("VZEROUPPER")
	w.op("RET")
}

// dots writes the product kernel of R rows and T tokens with float32
// activations: accumulators 0..R·T−1 (row r, token t at r·T + t), weight
// registers after them.
func dots(w *writer, s isa, dt dtype, R, T int) {
	name := DotsName(s.name, dt.name, R, T)
	fmt.Fprintf(&w.Buffer, "\n// func %s%s\nTEXT ·%s(SB), NOSPLIT, $0-56\n", name, dotsArgs, name)
	pointers(w, R, T)
	acc := func(r, t int) int { return r*T + t }
	wr := func(r int) int { return R*T + r }
	for i := range R * T {
		w.op("VXORPS %s, %s, %s", vreg(s.reg, i), vreg(s.reg, i), vreg(s.reg, i))
	}
	w.op("XORQ AX, AX")
	fmt.Fprintf(&w.Buffer, "loop:\n")
	for r := range R {
		loadRow(w, dt, fmt.Sprintf("(%s)(AX*%d)", rowRegs[r], dt.scale), vreg(s.reg, wr(r)))
	}
	for t := range T {
		for r := range R {
			w.op("VFMADD231PS (%s)(AX*4), %s, %s", tokRegs[t], vreg(s.reg, wr(r)), vreg(s.reg, acc(r, t)))
		}
	}
	w.op("ADDQ $%d, AX", s.width)
	w.op("CMPQ AX, CX")
	w.op("JB loop")
	store(w, s, R, T, wr(0), acc)
}

// VDPBF16PS returns the encoding of vdpbf16ps zmm(dst), zmm(src1),
// zmm(src2) — dst.f32[i] += src1.bf16[2i]·src2.bf16[2i] +
// src1.bf16[2i+1]·src2.bf16[2i+1] — as Go assembler BYTE directives: the
// assembler has no mnemonic for it. EVEX.512.F3.0F38.W0 52 /r, register
// form.
func VDPBF16PS(dst, src1, src2 int) string {
	inv := func(v, bit int) byte { return byte(^v>>bit) & 1 }
	p0 := inv(dst, 3)<<7 | inv(src2, 4)<<6 | inv(src2, 3)<<5 | inv(dst, 4)<<4 | 0b0010
	p1 := byte(^src1&15)<<3 | 1<<2 | 0b10
	p2 := byte(0b0100_0000) | inv(src1, 4)<<3
	modrm := byte(0xC0) | byte(dst&7)<<3 | byte(src2&7)
	b := []byte{0x62, p0, p1, p2, 0x52, modrm}
	parts := make([]string, len(b))
	for i, c := range b {
		parts[i] = fmt.Sprintf("BYTE $0x%02x", c)
	}
	return strings.Join(parts, "; ")
}

// bdots writes the bf16 × bf16 product kernel of R rows and T tokens on
// VDPBF16PS: 32 elements a step, x rows of bf16, one register for the
// token's step of x.
func bdots(w *writer, R, T int) {
	s := avx512
	name := DotsName("AVX512BF16", "BF16", R, T)
	fmt.Fprintf(&w.Buffer, "\n// func %s%s\nTEXT ·%s(SB), NOSPLIT, $0-56\n", name, dotsArgs, name)
	pointers(w, R, T)
	acc := func(r, t int) int { return r*T + t }
	wr := func(r int) int { return R*T + r }
	xr := R*T + R
	for i := range R * T {
		w.op("VXORPS Z%d, Z%d, Z%d", i, i, i)
	}
	w.op("XORQ AX, AX")
	fmt.Fprintf(&w.Buffer, "loop:\n")
	for r := range R {
		w.op("VMOVDQU16 (%s)(AX*2), Z%d", rowRegs[r], wr(r))
	}
	for t := range T {
		w.op("VMOVDQU16 (%s)(AX*2), Z%d", tokRegs[t], xr)
		for r := range R {
			w.op("%s // VDPBF16PS Z%d, Z%d, Z%d", VDPBF16PS(acc(r, t), wr(r), xr), xr, wr(r), acc(r, t))
		}
	}
	w.op("ADDQ $32, AX")
	w.op("CMPQ AX, CX")
	w.op("JB loop")
	store(w, s, R, T, wr(0), acc)
}

// pRegs hold the weighted sum's token pointers into p.
var pRegs = []string{"DI", "R10", "R11", "R12", "R13", "R14", "R15", "DX"}

// wsum writes the weighted-sum kernel of T tokens: accumulators 0..T−1 (one
// register of columns each), the V row in register T, and on AVX2 the
// broadcast weight in register T+1.
func wsum(w *writer, s isa, dt dtype, T int) {
	name := WsumName(s.name, dt.name, T)
	fmt.Fprintf(&w.Buffer, "\n// func %s%s\nTEXT ·%s(SB), NOSPLIT, $0-56\n", name, wsumArgs, name)
	accRows(w, s, T, true)
	w.op("MOVQ v+16(FP), SI")
	w.op("MOVQ vs+24(FP), R8")
	w.op("MOVQ p+32(FP), DI")
	w.op("MOVQ ps+40(FP), R9")
	chain(w, pRegs[:T], "R9")
	w.op("MOVQ n+48(FP), CX")
	w.op("XORQ AX, AX")
	fmt.Fprintf(&w.Buffer, "loop:\n")
	v := vreg(s.reg, T)
	loadRow(w, dt, "(SI)", v)
	for t := range T {
		if s.reg == "Z" {
			w.op("VFMADD231PS.BCST (%s)(AX*4), %s, Z%d", pRegs[t], v, t)
		} else {
			b := vreg(s.reg, T+1)
			w.op("VBROADCASTSS (%s)(AX*4), %s", pRegs[t], b)
			w.op("VFMADD231PS %s, %s, Y%d", b, v, t)
		}
	}
	w.op("ADDQ R8, SI")
	w.op("INCQ AX")
	w.op("CMPQ AX, CX")
	w.op("JB loop")
	accRows(w, s, T, false)
	w.op("VZEROUPPER")
	w.op("RET")
}

// accRows loads (load) or stores the weighted sum's T accumulators from or
// to acc + t·as.
func accRows(w *writer, s isa, T int, load bool) {
	w.op("MOVQ acc+0(FP), DX")
	w.op("MOVQ as+8(FP), BX")
	for t := range T {
		if load {
			w.op("VMOVUPS (DX), %s", vreg(s.reg, t))
		} else {
			w.op("VMOVUPS %s, (DX)", vreg(s.reg, t))
		}
		if t < T-1 {
			w.op("ADDQ BX, DX")
		}
	}
}

// Generate returns the assembly file and the Go file declaring its
// functions and building hostmath's tables (archAVX2, archAVX512 and
// archAVX512BF16, which returns AVX512's tables with the bf16 kernels).
func Generate() (asm, decl []byte) {
	const header = "// Code generated by internal/asmgen; DO NOT EDIT.\n\n"
	var a writer
	a.WriteString(header)
	a.WriteString("//go:build amd64\n\n#include \"textflag.h\"\n")
	var d writer
	d.WriteString(header)
	d.WriteString("//go:build amd64\n\npackage hostmath\n\nimport \"unsafe\"\n")
	declare := func(name, args string) {
		fmt.Fprintf(&d.Buffer, "\n//go:noescape\nfunc %s%s\n", name, args)
	}
	for _, s := range []isa{avx2, avx512} {
		for _, dt := range dtypes {
			for T := 1; T <= MaxTile; T++ {
				R := maxRows(s, T, 0)
				for _, r := range rowCounts(R) {
					dots(&a, s, dt, r, T)
					declare(DotsName(s.name, dt.name, r, T), dotsArgs)
				}
				wsum(&a, s, dt, T)
				declare(WsumName(s.name, dt.name, T), wsumArgs)
			}
		}
	}
	for T := 1; T <= MaxTile; T++ {
		for _, r := range rowCounts(maxRows(avx512, T, 1)) {
			bdots(&a, r, T)
			declare(DotsName("AVX512BF16", "BF16", r, T), dotsArgs)
		}
	}
	for _, s := range []isa{avx2, avx512} {
		fmt.Fprintf(&d.Buffer, "\nfunc arch%s() archKernels {\n\treturn archKernels{\n\t\twidth: %d,\n\t\tdots: [3][MaxTile]dotsKernels{\n", s.name, s.width)
		for _, dt := range dtypes {
			d.WriteString("\t\t\t{")
			for T := 1; T <= MaxTile; T++ {
				R := maxRows(s, T, 0)
				fmt.Fprintf(&d.Buffer, "{%d, %s, %s}, ", R, DotsName(s.name, dt.name, R, T), DotsName(s.name, dt.name, 1, T))
			}
			fmt.Fprintf(&d.Buffer, "}, // %s\n", strings.ToLower(dt.name))
		}
		d.WriteString("\t\t},\n\t\twsum: [3][MaxTile]wsumFunc{\n")
		for _, dt := range dtypes {
			d.WriteString("\t\t\t{")
			for T := 1; T <= MaxTile; T++ {
				fmt.Fprintf(&d.Buffer, "%s, ", WsumName(s.name, dt.name, T))
			}
			fmt.Fprintf(&d.Buffer, "}, // %s\n", strings.ToLower(dt.name))
		}
		d.WriteString("\t\t},\n\t}\n}\n")
	}
	d.WriteString("\n// bf16Tables are the VDPBF16PS kernels, by T−1.\nvar bf16Tables = [MaxTile]dotsKernels{\n")
	for T := 1; T <= MaxTile; T++ {
		R := maxRows(avx512, T, 1)
		fmt.Fprintf(&d.Buffer, "\t{%d, %s, %s},\n", R, DotsName("AVX512BF16", "BF16", R, T), DotsName("AVX512BF16", "BF16", 1, T))
	}
	d.WriteString("}\n")
	src, err := format.Source(d.Bytes())
	if err != nil {
		panic("asmgen: the Go file does not parse: " + err.Error())
	}
	return a.Bytes(), src
}

// rowCounts is the row counts generated for a wide kernel of R rows: R, and
// 1 for the rows left over.
func rowCounts(R int) []int {
	if R == 1 {
		return []int{1}
	}
	return []int{R, 1}
}
