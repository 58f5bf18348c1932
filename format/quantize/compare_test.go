package quantize_test

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"

	"github.com/memwall/memwall/format/llama"
	"github.com/memwall/memwall/format/quant"
	"github.com/memwall/memwall/format/quantize"
	"github.com/memwall/memwall/format/synth"
)

// relBound is the most a tensor's RMS error may be relative to its source's
// RMS, per type, for gen-model's values (ggml's quantizers give about half).
var relBound = map[quant.Type]float64{quant.F32: 0, quant.F16: 1e-3, quant.Q8_0: 0.01, quant.Q6_K: 0.03, quant.Q5_K: 0.06, quant.Q4_K: 0.12, quant.Q4_0: 0.15}

// TestWriteErrorIsCompare: the error Write measures for each tensor is the
// one Compare measures on the file it wrote, read back, from a checkpoint
// (Q and K rows permuted) and from a GGUF file; each is within its type's
// bound and counts every element.
func TestWriteErrorIsCompare(t *testing.T) {
	for _, from := range []string{synth.Safetensors, synth.GGUF} {
		m := genTiny(t, smallShape(), from)
		src, err := quantize.FromModel(m, "tiny", nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []quant.FileType{quant.MostlyQ4_K_M, quant.MostlyQ8_0, quant.MostlyQ4_0} {
			opts := quantize.Options{Workers: 2, ChunkElems: 5000}
			out, res := writeModel(t, m, f, opts)
			qm, err := llama.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			q, err := quantize.FromModel(qm, "q", nil)
			if err != nil {
				t.Fatal(err)
			}
			opts.Workers = 3
			got, err := quantize.Compare(context.Background(), src, q, opts)
			qm.Close()
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(res.Tensors) {
				t.Fatalf("%s %v: Compare gives %d tensors, Write %d", from, f, len(got), len(res.Tensors))
			}
			for i, w := range res.Tensors {
				c := got[i]
				e := w.Error
				if c.Name != w.Name || c.To != w.To || c.Error != e {
					t.Errorf("%s %v %s: Compare %v %+v, Write %v %+v", from, f, w.Name, c.To, c.Error, w.To, e)
				}
				n := uint64(1)
				for _, d := range w.Shape {
					n *= d
				}
				if e.Elems != n {
					t.Errorf("%s %v %s: %d elements counted of %d", from, f, w.Name, e.Elems, n)
				}
				if r := e.Relative(); !(r <= relBound[w.To]) || (w.To.IsQuantized() && r == 0) {
					t.Errorf("%s %v %s %v: relative RMS error %.4g, bound %g", from, f, w.Name, w.To, r, relBound[w.To])
				}
				if e.RMS() > e.Relative()*math.Sqrt(e.SqRef/float64(n))*(1+1e-12) {
					t.Errorf("%s: RMS %g and relative %g disagree", w.Name, e.RMS(), e.Relative())
				}
			}
		}
	}
}

// TestCompareShapes: tensors only one side has are left out; a tensor of
// another shape is an error naming it.
func TestCompareShapes(t *testing.T) {
	m := genTiny(t, smallShape(), synth.GGUF)
	src, err := quantize.FromModel(m, "tiny", nil)
	if err != nil {
		t.Fatal(err)
	}
	q := &quantize.Source{Tensors: []quantize.SourceTensor{src.Tensors[0], src.Tensors[1]}}
	q.Tensors[1].Name = "not.in.source"
	got, err := quantize.Compare(context.Background(), src, q, quantize.Options{})
	if err != nil || len(got) != 1 || got[0].Name != src.Tensors[0].Name || got[0].Error.SqErr != 0 {
		t.Fatalf("%+v, %v", got, err)
	}
	bad := src.Tensors[2]
	bad.Shape = []uint64{bad.Shape[0] * 2}
	if len(src.Tensors[2].Shape) == 2 {
		bad.Shape = []uint64{src.Tensors[2].Shape[1], src.Tensors[2].Shape[0]}
	}
	q.Tensors = []quantize.SourceTensor{bad}
	if _, err := quantize.Compare(context.Background(), src, q, quantize.Options{}); err == nil || !strings.Contains(err.Error(), bad.Name) {
		t.Errorf("shape %v against %v: %v", bad.Shape, src.Tensors[2].Shape, err)
	}
}

// TestErrorArithmetic: Relative and RMS at their edges.
func TestErrorArithmetic(t *testing.T) {
	for _, c := range []struct {
		e        quantize.Error
		rms, rel float64
	}{
		{quantize.Error{}, 0, 0},
		{quantize.Error{Elems: 4, SqRef: 8}, 0, 0},
		{quantize.Error{Elems: 4, SqErr: 1, SqRef: 0}, 0.5, math.Inf(1)},
		{quantize.Error{Elems: 4, SqErr: 1, SqRef: 100}, 0.5, 0.1},
	} {
		if c.e.RMS() != c.rms || c.e.Relative() != c.rel {
			t.Errorf("%+v: RMS %g, relative %g; want %g, %g", c.e, c.e.RMS(), c.e.Relative(), c.rms, c.rel)
		}
	}
	var sum quantize.Error
	sum.Add(quantize.Error{Elems: 1, SqErr: 2, SqRef: 3})
	sum.Add(quantize.Error{Elems: 10, SqErr: 20, SqRef: 30})
	if sum != (quantize.Error{Elems: 11, SqErr: 22, SqRef: 33}) {
		t.Errorf("sum %+v", sum)
	}
}

// TestWriteRefusesNonFinite: a NaN or an infinity in a tensor to quantize,
// or values so large that a block's f16 scale overflows, stop Write with
// an error naming the tensor and the row, as llama-quantize refuses them.
func TestWriteRefusesNonFinite(t *testing.T) {
	m := genTiny(t, smallShape(), synth.GGUF)
	for _, c := range []struct {
		bits uint16 // a BF16 value
		want string
	}{
		{0x7FC0, "NaN"},
		{0xFF80, "-Inf"},
		{0x7F00, "overflows f16"}, // 1.7e38
	} {
		src, err := quantize.FromModel(m, "tiny", nil)
		if err != nil {
			t.Fatal(err)
		}
		k := -1
		for i, st := range src.Tensors {
			if st.Name == "blk.1.ffn_up.weight" {
				k = i
			}
		}
		st := &src.Tensors[k]
		st.Data = append([]byte(nil), st.Data...)
		row := 3
		at := 2 * (row*int(st.Shape[1]) + 17)
		st.Data[at], st.Data[at+1] = byte(c.bits), byte(c.bits>>8)
		var buf bytes.Buffer
		_, err = quantize.Write(context.Background(), &buf, src, quant.MostlyQ4_K_M, quantize.Options{Workers: 2, ChunkElems: 1000})
		if err == nil || !strings.Contains(err.Error(), st.Name) || !strings.Contains(err.Error(), "row 3") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%#04x: %v", c.bits, err)
		}
	}
}
