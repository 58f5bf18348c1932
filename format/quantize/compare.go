package quantize

import (
	"context"
	"fmt"
	"runtime"
	"slices"

	"github.com/memwall/memwall/format/internal/ordered"
	"github.com/memwall/memwall/format/quant"
)

// Compare measures the error of quantized — a model written from src by
// Write, llama-quantize or any other tool, its tensors in types Dequantize
// reads — against src: every row of each tensor both have (by name) is
// dequantized and compared with the source row it holds (src's HeadRows
// permutation applied), in float64 sums. It returns one TensorResult per
// such tensor, in quantized's order, with From and Source of src, To and
// Bytes of quantized, and Error; tensors only one side has are left out. A
// tensor whose shape differs between the two is an error. The rows are
// split over opts.Workers goroutines in chunks of opts.ChunkElems; Progress
// counts quantized's bytes. It stops at ctx's cancellation with ctx's error.
func Compare(ctx context.Context, src, quantized *Source, opts Options) ([]TensorResult, error) {
	bySrc := make(map[string]*SourceTensor, len(src.Tensors))
	for i := range src.Tensors {
		bySrc[src.Tensors[i].Name] = &src.Tensors[i]
	}
	if opts.Workers <= 0 {
		opts.Workers = runtime.GOMAXPROCS(0)
	}
	if opts.ChunkElems <= 0 {
		opts.ChunkElems = 1 << 20
	}
	var out []TensorResult
	var jobs []job
	var total uint64
	for i := range quantized.Tensors {
		q := &quantized.Tensors[i]
		s, ok := bySrc[q.Name]
		if !ok {
			continue
		}
		if !slices.Equal(s.Shape, q.Shape) {
			return nil, fmt.Errorf("quant: tensor %q: shape %v in the quantized model, %v in the source", q.Name, q.Shape, s.Shape)
		}
		row := int(rowLen(q.Shape))
		rows := int(elems(q.Shape) / uint64(row))
		inRow, err := quant.RowBytes(s.Type, row)
		if err != nil || len(s.Data) != inRow*rows {
			return nil, fmt.Errorf("quant: source tensor %q: %d bytes of %v do not hold shape %v", s.Name, len(s.Data), s.Type, s.Shape)
		}
		outRow, err := quant.RowBytes(q.Type, row)
		if err != nil || len(q.Data) != outRow*rows {
			return nil, fmt.Errorf("quant: quantized tensor %q: %d bytes of %v do not hold shape %v", q.Name, len(q.Data), q.Type, q.Shape)
		}
		per := max(1, opts.ChunkElems/row)
		for r := 0; r < rows; r += per {
			jobs = append(jobs, job{t: s, tensor: len(out), to: q.Type, first: r, rows: min(per, rows-r), row: row, inRow: inRow, outRow: outRow,
				out: q.Data[r*outRow : (r+min(per, rows-r))*outRow]})
		}
		out = append(out, TensorResult{Name: q.Name, From: s.Type, To: q.Type, Shape: q.Shape, Bytes: uint64(len(q.Data)), Source: uint64(len(s.Data))})
		total += uint64(len(q.Data))
	}
	scratch := newScratch(opts.Workers)
	work := func(i int) error { return scratch.with(&jobs[i], jobs[i].compare) }
	var done uint64
	write := func(i int) error {
		j := &jobs[i]
		out[j.tensor].Error.Add(j.diff)
		done += uint64(len(j.out))
		if opts.Progress != nil {
			opts.Progress(done, total)
		}
		return nil
	}
	if err := ordered.Run(ctx, len(jobs), opts.Workers, work, write); err != nil {
		return nil, err
	}
	return out, nil
}

// compare measures the error of j.out, the job's rows in j.to, against
// the source rows they hold, in j.diff; scratch holds two rows.
func (j *job) compare(scratch []float32) error {
	x, y := scratch[:j.row], scratch[j.row:2*j.row]
	j.diff = Error{}
	for k := range j.rows {
		r := j.sourceRow(j.first + k)
		if err := quant.Dequantize(j.t.Type, x, j.t.Data[r*j.inRow:(r+1)*j.inRow]); err != nil {
			return err
		}
		if err := quant.Dequantize(j.to, y, j.out[k*j.outRow:(k+1)*j.outRow]); err != nil {
			return err
		}
		j.diff.accumulate(y, x)
	}
	return nil
}
