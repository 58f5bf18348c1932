// Package quantize writes a Llama model as a quantized GGUF file, as
// llama.cpp's converter and llama-quantize would: the per-tensor types of a
// file type (quant.Choose), every block as ggml's reference quantizers
// write it (quant.Quantize), in llama-quantize's order and with its
// metadata, so that from the same source the tensor data is llama-quantize's
// byte for byte. The work is parallel over tensors and rows and streams:
// memory is a few chunks per worker whatever the model's size.
package quantize

import (
	"context"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"

	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/gguf"
	"github.com/memwall/memwall/format/internal/ordered"
	"github.com/memwall/memwall/format/quant"
)

// Source is a model to write as a quantized GGUF file: its tensors in GGUF
// naming with their bytes, and the metadata to carry over.
type Source struct {
	Model    quant.Model
	Tensors  []SourceTensor
	Metadata []gguf.KV // in order; general.file_type and general.quantization_version are set by Write
}

// SourceTensor is one tensor of a Source.
type SourceTensor struct {
	quant.Tensor        // GGUF name, type of Data, shape (outermost first)
	Data         []byte // the tensor's bytes in Type, row-major
	// HeadRows, when not 0, says that the rows are to be permuted within
	// each run of HeadRows rows as llama.cpp's converter permutes Q and K
	// of a Hugging Face checkpoint: output row h·d + 2i + s is source row
	// h·d + s·d/2 + i (d = HeadRows).
	HeadRows int
	// AsF32 says that the tensor is written in F32 whatever the file type
	// (Choose is not asked): the converter's 1-dimensional tensors.
	AsF32 bool
}

// Options controls Write.
type Options struct {
	// Workers quantizing in parallel; 0 means GOMAXPROCS.
	Workers int
	// ChunkElems is the unit of work in elements, rounded to whole rows
	// (at least one); 0 means 1 Mi.
	ChunkElems int
	// Progress, if set, is called from one goroutine at a time with the
	// source bytes done and their total, in increasing order; the last call
	// has done == total.
	Progress func(done, total uint64)
}

// Result is what Write wrote.
type Result struct {
	Tensors     []TensorResult // in file order
	SourceBytes uint64         // tensor bytes read
	DataBytes   uint64         // tensor bytes written
	FileBytes   uint64         // bytes written, header and padding included
}

// TensorResult is one tensor of the output.
type TensorResult struct {
	Name   string
	From   quant.Type
	To     quant.Type
	Shape  []uint64
	Bytes  uint64 // written
	Source uint64 // read
	// Error is the written tensor's error against the source, over every
	// element; Write measures it by dequantizing each row it writes (0 for
	// a tensor whose bytes are copied). Plan leaves it zero.
	Error Error
}

// Error is a tensor's error against its source: sums of squares over its
// elements, accumulated in float64.
type Error struct {
	Elems uint64
	SqErr float64 // Σ (quantized − source)²
	SqRef float64 // Σ source²
}

// Add adds o's sums to e's.
func (e *Error) Add(o Error) {
	e.Elems += o.Elems
	e.SqErr += o.SqErr
	e.SqRef += o.SqRef
}

// RMS is the root mean square error, 0 for no elements.
func (e Error) RMS() float64 {
	if e.Elems == 0 {
		return 0
	}
	return math.Sqrt(e.SqErr / float64(e.Elems))
}

// Relative is the RMS error relative to the source's RMS, √(SqErr/SqRef):
// 0 when the error is 0, +Inf when only the source is (an all-zero source
// quantized with an error).
func (e Error) Relative() float64 {
	if e.SqErr == 0 {
		return 0
	}
	return math.Sqrt(e.SqErr / e.SqRef)
}

// accumulate adds the squared differences of got against ref.
func (e *Error) accumulate(got, ref []float32) {
	var se, sr float64
	for i, r := range ref {
		d := float64(got[i]) - float64(r)
		se += d * d
		sr += float64(r) * float64(r)
	}
	e.Elems += uint64(len(ref))
	e.SqErr += se
	e.SqRef += sr
}

// Plan returns the output's tensors (in file order: llama-quantize's, by
// block then name) with the type each gets, and the metadata Write writes:
// the source's, then general.quantization_version (quant.QuantizationVersion)
// and general.file_type (f), which replace any the source has, at the end,
// where llama-quantize puts them.
func Plan(src *Source, f quant.FileType) ([]TensorResult, []gguf.KV, error) {
	var ask []quant.Tensor
	var askAt []int
	out := make([]TensorResult, len(src.Tensors))
	for i, t := range src.Tensors {
		if !t.Type.Known() {
			return nil, nil, fmt.Errorf("quant: tensor %q: type %v cannot be read", t.Name, t.Type)
		}
		n, err := quant.RowBytes(t.Type, int(rowLen(t.Shape)))
		if err != nil || uint64(len(t.Data)) != uint64(n)*elems(t.Shape)/rowLen(t.Shape) {
			return nil, nil, fmt.Errorf("quant: tensor %q: %d bytes of %v do not hold shape %v", t.Name, len(t.Data), t.Type, t.Shape)
		}
		if t.HeadRows != 0 && (len(t.Shape) != 2 || t.HeadRows%2 != 0 || t.Shape[0]%uint64(t.HeadRows) != 0) {
			return nil, nil, fmt.Errorf("quant: tensor %q: rows %v cannot be permuted in heads of %d", t.Name, t.Shape, t.HeadRows)
		}
		out[i] = TensorResult{Name: t.Name, From: t.Type, To: quant.F32, Shape: t.Shape, Source: uint64(len(t.Data))}
		if !t.AsF32 {
			ask = append(ask, quant.Tensor{Name: t.Name, Type: t.Type, Shape: t.Shape})
			askAt = append(askAt, i)
		}
	}
	types, err := quant.Choose(f, src.Model, ask)
	if err != nil {
		return nil, nil, err
	}
	for k, i := range askAt {
		out[i].To = types[k]
	}
	for i := range out {
		t := &out[i]
		if t.From.IsQuantized() && t.To != t.From {
			return nil, nil, fmt.Errorf("quant: tensor %q: requantizing from %v to %v is not supported (quantize from the bf16, f16 or f32 model)", t.Name, t.From, t.To)
		}
		n, err := quant.RowBytes(t.To, int(rowLen(t.Shape)))
		if err != nil {
			return nil, nil, fmt.Errorf("quant: tensor %q: %w", t.Name, err)
		}
		t.Bytes = uint64(n) * elems(t.Shape) / rowLen(t.Shape)
	}
	names := make([]string, len(out))
	for i, t := range out {
		names[i] = t.Name
	}
	order := quant.Order(names)
	sorted := make([]TensorResult, len(out))
	for k, i := range order {
		sorted[k] = out[i]
	}
	kvs := slices.Clone(src.Metadata)
	kvs = gguf.Set(kvs, "general.quantization_version", uint32(quant.QuantizationVersion))
	kvs = gguf.Set(kvs, "general.file_type", uint32(f))
	return sorted, kvs, nil
}

// rowLen is a shape's row length, its last (innermost) dimension.
func rowLen(shape []uint64) uint64 {
	if len(shape) == 0 {
		return 1
	}
	return shape[len(shape)-1]
}

func elems(shape []uint64) uint64 {
	n := uint64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// Write writes src as a GGUF file of type f to w in one streaming pass:
// header and metadata (see Plan), then every tensor in Plan's order,
// converted (F16, BF16, F32) or quantized as Quantize does, so that the
// tensor data is llama-quantize's for the same source, byte for byte.
// Tensors are cut into chunks of whole rows quantized by Workers goroutines
// and written in order; memory is 2·Workers+2 chunks' output whatever the
// model's size. It stops at ctx's cancellation with ctx's error.
func Write(ctx context.Context, w io.Writer, src *Source, f quant.FileType, opts Options) (*Result, error) {
	plan, kvs, err := Plan(src, f)
	if err != nil {
		return nil, err
	}
	byName := make(map[string]*SourceTensor, len(src.Tensors))
	for i := range src.Tensors {
		byName[src.Tensors[i].Name] = &src.Tensors[i]
	}
	specs := make([]format.TensorSpec, len(plan))
	res := &Result{Tensors: plan}
	for i, t := range plan {
		specs[i] = format.TensorSpec{Name: t.Name, DType: t.To.String(), Shape: t.Shape}
		res.SourceBytes += t.Source
		res.DataBytes += t.Bytes
	}
	cw := &countWriter{w: w}
	gw, err := gguf.NewWriter(cw, kvs, specs)
	if err != nil {
		return nil, fmt.Errorf("quant: %w", err)
	}
	if opts.Workers <= 0 {
		opts.Workers = runtime.GOMAXPROCS(0)
	}
	if opts.ChunkElems <= 0 {
		opts.ChunkElems = 1 << 20
	}
	p := &pipeline{opts: opts, total: res.SourceBytes}
	jobs := make([]job, 0, len(plan))
	for ti, t := range plan {
		st := byName[t.Name]
		row := int(rowLen(t.Shape))
		rows := int(elems(t.Shape) / uint64(row))
		per := max(1, opts.ChunkElems/row)
		inRow, _ := quant.RowBytes(st.Type, row)
		outRow, _ := quant.RowBytes(t.To, row)
		for r := 0; r < rows; r += per {
			jobs = append(jobs, job{t: st, tensor: ti, to: t.To, first: r, rows: min(per, rows-r), row: row, inRow: inRow, outRow: outRow})
		}
	}
	if err := p.run(ctx, jobs, gw, res.Tensors); err != nil {
		return nil, err
	}
	if err := gw.Close(); err != nil {
		return nil, fmt.Errorf("quant: %w", err)
	}
	res.FileBytes = cw.n
	return res, nil
}

type countWriter struct {
	w io.Writer
	n uint64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += uint64(n)
	return n, err
}

// job is rows [first, first+rows) of one tensor.
type job struct {
	t             *SourceTensor
	tensor        int // index in Result.Tensors
	to            quant.Type
	first, rows   int
	row           int // elements per row
	inRow, outRow int // bytes per row in and out
	out           []byte
	diff          Error // of the rows written
}

// copies reports whether the job's bytes go out as they are.
func (j *job) copies() bool { return j.to == j.t.Type && j.t.HeadRows == 0 }

// sourceRow is the source row that output row r holds.
func (j *job) sourceRow(r int) int {
	d := j.t.HeadRows
	if d == 0 {
		return r
	}
	h, k := r/d, r%d
	return h*d + (k%2)*(d/2) + k/2
}

// work converts the job's rows through float32 into j.out and measures
// their error in j.diff; scratch holds two rows.
func (j *job) work(scratch []float32) error {
	x, y := scratch[:j.row], scratch[j.row:2*j.row]
	j.diff = Error{}
	for k := range j.rows {
		r := j.sourceRow(j.first + k)
		in := j.t.Data[r*j.inRow : (r+1)*j.inRow]
		if err := quant.Dequantize(j.t.Type, x, in); err != nil {
			return err
		}
		if j.to == j.t.Type {
			copy(j.out[k*j.outRow:], in)
			j.diff.accumulate(x, x)
			continue
		}
		q := j.out[k*j.outRow : (k+1)*j.outRow]
		if err := quant.Quantize(j.to, q, x); err != nil {
			return fmt.Errorf("row %d: %w", r, err)
		}
		if err := quant.Dequantize(j.to, y, q); err != nil {
			return err
		}
		before := j.diff.SqErr
		j.diff.accumulate(y, x)
		if d := j.diff.SqErr - before; math.IsNaN(d) || math.IsInf(d, 0) {
			// as llama-quantize's check of the rows it writes
			return fmt.Errorf("row %d: values beyond what %v holds (a block's scale overflows f16)", r, j.to)
		}
	}
	return nil
}

// scratch holds the workers' float32 rows, two per job.
type scratch chan []float32

func newScratch(workers int) scratch {
	s := make(scratch, workers)
	for range workers {
		s <- nil
	}
	return s
}

// with calls f with two of j's rows of scratch, and names j's tensor in
// f's error.
func (s scratch) with(j *job, f func([]float32) error) error {
	x := <-s
	if len(x) < 2*j.row {
		x = make([]float32, 2*j.row)
	}
	err := f(x)
	s <- x
	if err != nil {
		return fmt.Errorf("quant: tensor %q: %w", j.t.Name, err)
	}
	return nil
}

type pipeline struct {
	opts  Options
	total uint64
	done  uint64
}

// run quantizes the jobs on the workers and writes them in order. Each job
// in flight holds one output buffer; there are ordered.InFlight of them.
// Each job's error is added to its tensor's in out.
func (p *pipeline) run(ctx context.Context, jobs []job, w io.Writer, out []TensorResult) error {
	free := make(chan []byte, ordered.InFlight(p.opts.Workers))
	for range cap(free) {
		free <- nil
	}
	scratch := newScratch(p.opts.Workers)
	work := func(i int) error {
		j := &jobs[i]
		if j.copies() {
			start := j.first * j.inRow
			j.out = j.t.Data[start : start+j.rows*j.inRow]
			return scratch.with(j, j.compare) // no error, but the source's sum of squares
		}
		n := j.rows * j.outRow
		if j.out = <-free; cap(j.out) < n {
			j.out = make([]byte, n)
		}
		j.out = j.out[:n]
		return scratch.with(j, j.work)
	}
	write := func(i int) error {
		j := &jobs[i]
		if _, err := w.Write(j.out); err != nil {
			return err
		}
		if !j.copies() {
			free <- j.out
		}
		out[j.tensor].Error.Add(j.diff)
		j.out = nil
		p.done += uint64(j.rows * j.inRow)
		if p.opts.Progress != nil {
			p.opts.Progress(p.done, p.total)
		}
		return nil
	}
	return ordered.Run(ctx, len(jobs), p.opts.Workers, work, write)
}
