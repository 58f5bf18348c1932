package gguf

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"

	"github.com/memwall/memwall/format"
)

// Writer writes one GGUF v3 file in a single streaming pass: NewWriter emits
// the header, metadata and tensor infos; the caller then writes every
// tensor's bytes, in spec order and back to back, through Write, which
// inserts the alignment padding between tensors itself. Writer is not safe
// for concurrent use.
type Writer struct {
	w       io.Writer
	layout  []format.Tensor
	cur     int    // tensor being written
	left    uint64 // bytes of layout[cur] still to come
	pos     uint64 // absolute file position
	written uint64 // tensor bytes written
	total   uint64
	align   uint64
	err     error
}

// Layout encodes the header, metadata and tensor infos (padded to the
// alignment) and returns them with each tensor's place in the file (absolute
// offsets, File empty). The alignment is general.alignment if kvs sets it (a
// uint32 power of two), else DefaultAlignment. Spec shapes are
// outermost-first and are written reversed, as GGUF's ne[]. It fails on an
// empty or duplicate tensor name or key, an unknown type, more than MaxDims
// dims, a row length that is not a whole number of blocks, or a metadata
// value of a Go type GGUF cannot hold.
func Layout(kvs []KV, specs []format.TensorSpec) ([]byte, []format.Tensor, error) {
	align := uint64(DefaultAlignment)
	var b bytes.Buffer
	b.WriteString(Magic)
	put32(&b, 3)
	put64(&b, uint64(len(specs)))
	put64(&b, uint64(len(kvs)))
	seen := map[string]bool{}
	for _, kv := range kvs {
		if seen[kv.Key] {
			return nil, nil, fmt.Errorf("gguf writer: key %q: duplicate", kv.Key)
		}
		seen[kv.Key] = true
		if kv.Key == "general.alignment" {
			a, ok := kv.Value.(uint32)
			if !ok || a == 0 || a&(a-1) != 0 {
				return nil, nil, fmt.Errorf("gguf writer: general.alignment must be a uint32 power of two, got %T %v", kv.Value, kv.Value)
			}
			align = uint64(a)
		}
		putString(&b, kv.Key)
		if err := putValue(&b, kv.Value, true, 0); err != nil {
			return nil, nil, fmt.Errorf("gguf writer: key %q: %w", kv.Key, err)
		}
	}
	layout := make([]format.Tensor, 0, len(specs))
	seen = map[string]bool{}
	var off uint64
	for _, s := range specs {
		switch {
		case s.Name == "":
			return nil, nil, fmt.Errorf("gguf writer: empty tensor name")
		case seen[s.Name]:
			return nil, nil, fmt.Errorf("gguf writer: tensor %q: duplicate name", s.Name)
		case len(s.Shape) > MaxDims:
			return nil, nil, fmt.Errorf("gguf writer: tensor %q: %d dims, more than %d", s.Name, len(s.Shape), MaxDims)
		}
		seen[s.Name] = true
		ti, ok := TypeByName(s.DType)
		if !ok {
			return nil, nil, fmt.Errorf("gguf writer: tensor %q: unknown ggml type %q", s.Name, s.DType)
		}
		n, err := tensorBytes(ti, s.Shape)
		if err != nil {
			return nil, nil, fmt.Errorf("gguf writer: tensor %q: %w", s.Name, err)
		}
		putString(&b, s.Name)
		put32(&b, uint32(len(s.Shape)))
		for j := len(s.Shape) - 1; j >= 0; j-- {
			put64(&b, s.Shape[j])
		}
		put32(&b, ti.ID)
		put64(&b, off)
		layout = append(layout, format.Tensor{Name: s.Name, DType: ti.Name, Shape: slices.Clone(s.Shape), Offset: off, Bytes: n})
		next := alignUp(off+n, align)
		if next < off {
			return nil, nil, fmt.Errorf("gguf writer: tensor %q: data section overflows 64 bits", s.Name)
		}
		off = next
	}
	for uint64(b.Len())%align != 0 {
		b.WriteByte(0)
	}
	start := uint64(b.Len())
	for i := range layout {
		layout[i].Offset += start
	}
	return b.Bytes(), layout, nil
}

// tensorBytes is the data size of a tensor of type ti and outermost-first
// shape, checking that rows hold whole blocks.
func tensorBytes(ti TypeInfo, shape []uint64) (uint64, error) {
	elems := uint64(1)
	for _, d := range shape {
		hi, lo := bits.Mul64(elems, d)
		if hi != 0 || lo > math.MaxInt64 {
			return 0, fmt.Errorf("shape %v: element count overflows int64", shape)
		}
		elems = lo
	}
	row := uint64(1)
	if len(shape) > 0 {
		row = shape[len(shape)-1]
	}
	if row%ti.BlockElems != 0 {
		return 0, fmt.Errorf("shape %v: row length %d is not a multiple of the %s block size %d", shape, row, ti.Name, ti.BlockElems)
	}
	hi, n := bits.Mul64(elems/ti.BlockElems, ti.BlockBytes)
	if hi != 0 {
		return 0, fmt.Errorf("shape %v: size overflows 64 bits", shape)
	}
	return n, nil
}

func alignUp(v, a uint64) uint64 {
	if r := v % a; r != 0 {
		return v + a - r
	}
	return v
}

func put32(b *bytes.Buffer, v uint32) { b.Write(binary.LittleEndian.AppendUint32(nil, v)) }
func put64(b *bytes.Buffer, v uint64) { b.Write(binary.LittleEndian.AppendUint64(nil, v)) }
func putString(b *bytes.Buffer, s string) {
	put64(b, uint64(len(s)))
	b.WriteString(s)
}

// valueType maps a Go value to its GGUF type.
func valueType(v any) (ValueType, bool) {
	switch v.(type) {
	case uint8:
		return TypeUint8, true
	case int8:
		return TypeInt8, true
	case uint16:
		return TypeUint16, true
	case int16:
		return TypeInt16, true
	case uint32:
		return TypeUint32, true
	case int32:
		return TypeInt32, true
	case float32:
		return TypeFloat32, true
	case bool:
		return TypeBool, true
	case string:
		return TypeString, true
	case uint64:
		return TypeUint64, true
	case int64:
		return TypeInt64, true
	case float64:
		return TypeFloat64, true
	case []uint8, []int8, []uint16, []int16, []uint32, []int32, []float32, []bool, []string, []uint64, []int64, []float64, []any:
		return TypeArray, true
	}
	return 0, false
}

// putValue encodes v, preceded by its type tag if tagged.
func putValue(b *bytes.Buffer, v any, tagged bool, depth int) error {
	t, ok := valueType(v)
	if !ok {
		return fmt.Errorf("a %T cannot be stored in GGUF", v)
	}
	if tagged {
		put32(b, uint32(t))
	}
	switch x := v.(type) {
	case uint8:
		b.WriteByte(x)
	case int8:
		b.WriteByte(byte(x))
	case uint16:
		b.Write(binary.LittleEndian.AppendUint16(nil, x))
	case int16:
		b.Write(binary.LittleEndian.AppendUint16(nil, uint16(x)))
	case uint32:
		put32(b, x)
	case int32:
		put32(b, uint32(x))
	case float32:
		put32(b, math.Float32bits(x))
	case bool:
		if x {
			b.WriteByte(1)
		} else {
			b.WriteByte(0)
		}
	case string:
		putString(b, x)
	case uint64:
		put64(b, x)
	case int64:
		put64(b, uint64(x))
	case float64:
		put64(b, math.Float64bits(x))
	case []any:
		if depth+1 > MaxArrayDepth {
			return fmt.Errorf("arrays nested more than %d deep", MaxArrayDepth)
		}
		// An array of arrays: the element tag is "array" and every element
		// must itself be an array.
		put32(b, uint32(TypeArray))
		put64(b, uint64(len(x)))
		for i, e := range x {
			if et, _ := valueType(e); et != TypeArray {
				return fmt.Errorf("element %d of a []any is a %T; GGUF arrays are homogeneous, so a []any may hold only arrays", i, e)
			}
			if err := putValue(b, e, false, depth+1); err != nil {
				return err
			}
		}
	default:
		return putTypedArray(b, v, depth)
	}
	return nil
}

func putTypedArray(b *bytes.Buffer, v any, depth int) error {
	if depth+1 > MaxArrayDepth {
		return fmt.Errorf("arrays nested more than %d deep", MaxArrayDepth)
	}
	head := func(t ValueType, n int) {
		put32(b, uint32(t))
		put64(b, uint64(n))
	}
	switch x := v.(type) {
	case []uint8:
		head(TypeUint8, len(x))
		b.Write(x)
	case []int8:
		head(TypeInt8, len(x))
		for _, e := range x {
			b.WriteByte(byte(e))
		}
	case []bool:
		head(TypeBool, len(x))
		for _, e := range x {
			if e {
				b.WriteByte(1)
			} else {
				b.WriteByte(0)
			}
		}
	case []uint16:
		head(TypeUint16, len(x))
		for _, e := range x {
			b.Write(binary.LittleEndian.AppendUint16(nil, e))
		}
	case []int16:
		head(TypeInt16, len(x))
		for _, e := range x {
			b.Write(binary.LittleEndian.AppendUint16(nil, uint16(e)))
		}
	case []uint32:
		head(TypeUint32, len(x))
		for _, e := range x {
			put32(b, e)
		}
	case []int32:
		head(TypeInt32, len(x))
		for _, e := range x {
			put32(b, uint32(e))
		}
	case []float32:
		head(TypeFloat32, len(x))
		for _, e := range x {
			put32(b, math.Float32bits(e))
		}
	case []uint64:
		head(TypeUint64, len(x))
		for _, e := range x {
			put64(b, e)
		}
	case []int64:
		head(TypeInt64, len(x))
		for _, e := range x {
			put64(b, uint64(e))
		}
	case []float64:
		head(TypeFloat64, len(x))
		for _, e := range x {
			put64(b, math.Float64bits(e))
		}
	case []string:
		head(TypeString, len(x))
		for _, e := range x {
			putString(b, e)
		}
	}
	return nil
}

// NewWriter writes the header, metadata and tensor infos to w and returns a
// Writer expecting the tensors' data. The caller keeps ownership of w.
func NewWriter(w io.Writer, kvs []KV, specs []format.TensorSpec) (*Writer, error) {
	hdr, layout, err := Layout(kvs, specs)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(hdr); err != nil {
		return nil, fmt.Errorf("gguf writer: header: %w", err)
	}
	gw := &Writer{w: w, layout: layout, pos: uint64(len(hdr)), align: DefaultAlignment}
	if v, ok := lookup(kvs, "general.alignment"); ok {
		gw.align = uint64(v.(uint32))
	}
	for _, t := range layout {
		gw.total += t.Bytes
	}
	gw.advance()
	return gw, nil
}

func lookup(kvs []KV, key string) (any, bool) {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return nil, false
}

// Tensors returns the layout being written (absolute offsets, File empty).
func (w *Writer) Tensors() []format.Tensor { return w.layout }

// DataBytes returns the sum of the tensors' sizes (padding excluded).
func (w *Writer) DataBytes() uint64 { return w.total }

// advance skips finished (and empty) tensors and pads up to the next one.
func (w *Writer) advance() {
	for w.cur < len(w.layout) && w.left == 0 {
		t := w.layout[w.cur]
		if w.pos < t.Offset {
			if w.err = w.pad(t.Offset - w.pos); w.err != nil {
				return
			}
		}
		if t.Bytes > 0 {
			w.left = t.Bytes
			return
		}
		w.cur++
	}
}

func (w *Writer) pad(n uint64) error {
	var zero [64]byte
	for n > 0 {
		k := min(n, uint64(len(zero)))
		if _, err := w.w.Write(zero[:k]); err != nil {
			return fmt.Errorf("gguf writer: %w", err)
		}
		n -= k
		w.pos += k
	}
	return nil
}

// Write writes the next tensor bytes: the tensors' contents concatenated in
// spec order, without padding. Writing past the last tensor fails without
// writing anything; after any error every later call fails.
func (w *Writer) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	if uint64(len(p)) > w.total-w.written {
		w.err = fmt.Errorf("gguf writer: %d bytes written past the %d tensor bytes", uint64(len(p))-(w.total-w.written), w.total)
		return 0, w.err
	}
	done := 0
	for len(p) > 0 {
		k := min(uint64(len(p)), w.left)
		n, err := w.w.Write(p[:k])
		done += n
		w.pos += uint64(n)
		w.written += uint64(n)
		w.left -= uint64(n)
		if err != nil {
			w.err = fmt.Errorf("gguf writer: %w", err)
			return done, w.err
		}
		p = p[k:]
		if w.left == 0 {
			w.cur++
			w.advance()
			if w.err != nil {
				return done, w.err
			}
		}
	}
	return done, nil
}

// Close pads the last tensor to the alignment, as llama.cpp's writer does,
// and checks that every tensor byte was written. It does not close the
// underlying writer.
func (w *Writer) Close() error {
	if w.err != nil {
		return w.err
	}
	if w.written != w.total {
		return fmt.Errorf("gguf writer: %d of %d tensor bytes written", w.written, w.total)
	}
	if r := w.pos % w.align; r != 0 {
		w.err = w.pad(w.align - r)
	}
	return w.err
}
