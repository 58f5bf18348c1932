package synth

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/memwall/memwall/format"
)

// Expected writes into dst the bytes of t starting at element first, as
// Generate writes them for seed. len(dst) must be a whole number of t's
// elements (2 bytes for BF16 and F16, 4 for F32) or, for a block-quantized
// tensor and for fixed values, of rows, with first at a row's start; it
// returns an error otherwise.
func Expected(seed uint64, t Tensor, first uint64, dst []byte) error {
	c, err := newCodecVia(t.valueDType(), t.Via, t.Mean, t.amplitude())
	if err != nil {
		return err
	}
	unit, elems := uint64(c.size), uint64(1)
	if t.blockwise() {
		unit, elems = t.chunkBytes(t.rowLen()), t.rowLen()
		if first%elems != 0 {
			return fmt.Errorf("synth: tensor %q: element %d is not at the start of a row of %d", t.Name, first, elems)
		}
	}
	if uint64(len(dst))%unit != 0 {
		return fmt.Errorf("synth: tensor %q: %d bytes is not a whole number of %s %s", t.Name, len(dst), t.DType, map[bool]string{true: "rows", false: "elements"}[t.blockwise()])
	}
	n := uint64(len(dst)) / unit * elems
	if first > t.Elements() || n > t.Elements()-first {
		return fmt.Errorf("synth: tensor %q: elements [%d, %d) past its %d", t.Name, first, first+n, t.Elements())
	}
	t.fill(dst, c, stream(seed, t.Key), first, n, &rowScratch{})
	return nil
}

// Verify checks an opened model against the Config stored in its metadata:
// the same tensors, in the same dtypes and shapes, and every data byte equal
// to what Generate writes. It reads every tensor once; the first mismatch is
// reported with the tensor and the byte offset within it.
func Verify(m *format.Model) error {
	cfg, err := ConfigFromMetadata(m.Metadata)
	if err != nil {
		return fmt.Errorf("%s %s: %w", m.Format, m.Path, err)
	}
	want := cfg.Tensors(m.Format)
	if len(m.Tensors) != len(want) {
		return fmt.Errorf("%s %s: %d tensors, want %d", m.Format, m.Path, len(m.Tensors), len(want))
	}
	buf := make([]byte, 1<<20)
	for _, w := range want {
		got, ok := m.Tensor(w.Name)
		if !ok {
			return fmt.Errorf("%s %s: tensor %q missing", m.Format, m.Path, w.Name)
		}
		if got.DType != w.DType || !slices.Equal(got.Shape, w.Shape) {
			return fmt.Errorf("%s %s: tensor %q is %s %v, want %s %v", m.Format, m.Path, w.Name, got.DType, got.Shape, w.DType, w.Shape)
		}
		data := m.Data(got)
		if uint64(len(data)) != w.Bytes() {
			return fmt.Errorf("%s %s: tensor %q has %d bytes, want %d", m.Format, m.Path, w.Name, len(data), w.Bytes())
		}
		// Pieces of whole elements, or of whole rows.
		unit, elems := uint64(2), uint64(1)
		if w.DType == "F32" {
			unit = 4
		}
		if w.blockwise() {
			unit, elems = w.chunkBytes(w.rowLen()), w.rowLen()
		}
		piece := max(unit, uint64(len(buf))/unit*unit)
		if uint64(len(buf)) < piece {
			buf = make([]byte, piece)
		}
		for off := uint64(0); off < uint64(len(data)); off += piece {
			n := min(piece, uint64(len(data))-off)
			if err := Expected(cfg.Seed, w, off/unit*elems, buf[:n]); err != nil {
				return err
			}
			if !bytes.Equal(buf[:n], data[off:off+n]) {
				i := uint64(0)
				for buf[i] == data[off+i] {
					i++
				}
				return fmt.Errorf("%s %s: tensor %q differs at byte %d", m.Format, m.Path, w.Name, off+i)
			}
		}
	}
	return nil
}
