package synth

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/memwall/memwall/format"
)

// Expected writes into dst the bytes of t starting at element first, as
// Generate writes them for seed. len(dst) must be a multiple of t's element
// size (2 for BF16 and F16, 4 for F32); it returns an error otherwise or for
// another dtype.
func Expected(seed uint64, t Tensor, first uint64, dst []byte) error {
	c, err := newCodecVia(t.DType, t.Via, t.Mean, t.amplitude())
	if err != nil {
		return err
	}
	if len(dst)%c.size != 0 {
		return fmt.Errorf("synth: tensor %q: %d bytes is not a whole number of %s elements", t.Name, len(dst), t.DType)
	}
	c.fillTensor(dst, stream(seed, t.Key), first, t)
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
		size := 2
		if w.DType == "F32" {
			size = 4
		}
		for off := 0; off < len(data); off += len(buf) {
			n := min(len(buf), len(data)-off)
			if err := Expected(cfg.Seed, w, uint64(off/size), buf[:n]); err != nil {
				return err
			}
			if !bytes.Equal(buf[:n], data[off:off+n]) {
				i := 0
				for buf[i] == data[off+i] {
					i++
				}
				return fmt.Errorf("%s %s: tensor %q differs at byte %d", m.Format, m.Path, w.Name, off+i)
			}
		}
	}
	return nil
}
