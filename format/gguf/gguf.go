// Package gguf reads and writes GGUF, the llama.cpp model format: a header
// ("GGUF", version, tensor count, key/value count), typed metadata key/values,
// tensor infos (name, dims innermost-first, ggml type, offset), padding to the
// alignment, and the tensor data.
//
// Versions 2 and 3 (little-endian) are read; version 1 and big-endian files
// are rejected with format.ErrUnsupported. Nothing in a header is trusted:
// every count and string length is checked against the bytes that remain
// before anything is allocated, arrays nest at most MaxArrayDepth deep, each
// tensor's byte size is derived from its ggml type's block size (with the row
// length checked to be a whole number of blocks, and overflow checks), and
// tensors must lie inside the file, aligned, without overlapping. Failures are
// *format.Error values naming the file and, where there is one, the tensor.
package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"slices"

	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/mmap"
)

// FormatName is the value of format.Model.Format for this package.
const FormatName = "gguf"

// Limits applied while parsing.
const (
	// DefaultAlignment applies when general.alignment is absent.
	DefaultAlignment = 32
	// MaxDims is ggml's GGML_MAX_DIMS.
	MaxDims = 4
	// MaxArrayDepth bounds nesting of metadata arrays.
	MaxArrayDepth = 4
	// MaxTensors bounds tensor_count; real models have tens of thousands.
	MaxTensors = 1 << 20
	// MaxMetadataBytes bounds the encoded key/value section (a 256k-token
	// vocabulary with scores and merges takes tens of MB).
	MaxMetadataBytes = 1 << 30
)

// Magic is the first four bytes of every GGUF file.
const Magic = "GGUF"

// KV is one metadata key/value. Value holds the Go type matching the wire
// type: uint8, int8, uint16, int16, uint32, int32, float32, bool, string,
// uint64, int64, float64; arrays are typed slices ([]uint32, []string, ...)
// and arrays of arrays are []any holding such slices.
type KV struct {
	Key   string
	Value any
}

// File is one parsed GGUF file.
type File struct {
	Version   uint32
	Metadata  []KV // in file order
	Alignment uint64
	// DataStart is the absolute offset of the data section.
	DataStart uint64
	// Tensors in tensor-info order, Offset absolute, Shape outermost-first
	// (the reverse of GGUF's ne[] order), File set to the name given to Parse.
	Tensors []format.Tensor
	// TypeIDs[i] is the ggml type id of Tensors[i].
	TypeIDs []uint32
}

// Lookup returns the value of key and whether it is present.
func (f *File) Lookup(key string) (any, bool) {
	for _, kv := range f.Metadata {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return nil, false
}

// Open maps path read-only and parses it. The returned Model owns the
// mapping; Close releases it. Model.Metadata holds every key/value. On error
// nothing stays mapped.
func Open(path string) (*format.Model, error) {
	mp, err := mmap.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", FormatName, path, err)
	}
	f, err := Parse(path, mp.Bytes())
	if err != nil {
		mp.Close()
		return nil, err
	}
	meta := make(map[string]any, len(f.Metadata))
	for _, kv := range f.Metadata {
		meta[kv.Key] = kv.Value
	}
	return format.NewModel(path, FormatName, f.Tensors, meta, map[string]*mmap.Mapping{path: mp}), nil
}

// reader walks a byte slice; every read is bounds-checked.
type reader struct {
	b    []byte
	off  uint64
	name string
	// limitWhy explains len(b) when it is shorter than the file because a
	// limit applies; "" when len(b) is the file's end.
	limitWhy string
	tensor   string // tensor being read, for errors
	field    string // field being read, for errors
}

func (r *reader) errf(kind error, f string, a ...any) error {
	return &format.Error{Format: FormatName, File: r.name, Tensor: r.tensor, Field: r.field,
		Reason: fmt.Sprintf(f, a...), Kind: kind}
}

func (r *reader) left() uint64 { return uint64(len(r.b)) - r.off }

func (r *reader) need(n uint64, what string) error {
	if n <= r.left() {
		return nil
	}
	if r.limitWhy != "" {
		return r.errf(format.ErrCorrupt, "%s at offset %d needs %d bytes: %s", what, r.off, n, r.limitWhy)
	}
	return r.errf(format.ErrCorrupt, "%s at offset %d needs %d bytes but the file ends %d bytes later (truncated?)", what, r.off, n, r.left())
}

func (r *reader) u8(what string) (uint8, error) {
	if err := r.need(1, what); err != nil {
		return 0, err
	}
	v := r.b[r.off]
	r.off++
	return v, nil
}

func (r *reader) u16(what string) (uint16, error) {
	if err := r.need(2, what); err != nil {
		return 0, err
	}
	v := binary.LittleEndian.Uint16(r.b[r.off:])
	r.off += 2
	return v, nil
}

func (r *reader) u32(what string) (uint32, error) {
	if err := r.need(4, what); err != nil {
		return 0, err
	}
	v := binary.LittleEndian.Uint32(r.b[r.off:])
	r.off += 4
	return v, nil
}

func (r *reader) u64(what string) (uint64, error) {
	if err := r.need(8, what); err != nil {
		return 0, err
	}
	v := binary.LittleEndian.Uint64(r.b[r.off:])
	r.off += 8
	return v, nil
}

// str reads a length-prefixed string, copying it out of the mapping.
func (r *reader) str(what string) (string, error) {
	n, err := r.u64(what + " length")
	if err != nil {
		return "", err
	}
	if err := r.need(n, what); err != nil {
		return "", err
	}
	s := string(r.b[r.off : r.off+n])
	r.off += n
	return s, nil
}

// Parse parses the GGUF file whose complete contents are b. name is used in
// errors and as Tensor.File. It never panics; allocation is bounded by a
// small multiple of len(b) and by MaxMetadataBytes and MaxTensors.
func Parse(name string, b []byte) (*File, error) { return parse(name, b, MaxMetadataBytes) }

// parse is Parse with the metadata limit as a parameter, for tests.
func parse(name string, b []byte, maxMetadata uint64) (*File, error) {
	r := &reader{b: b, name: name}
	r.field = "magic"
	if err := r.need(4, "magic"); err != nil {
		return nil, err
	}
	if string(b[:4]) != Magic {
		return nil, r.errf(format.ErrCorrupt, "file starts with %q, not %q: not a GGUF file", b[:4], Magic)
	}
	r.off = 4
	r.field = "version"
	version, err := r.u32("version")
	if err != nil {
		return nil, err
	}
	switch {
	case version == 1:
		return nil, r.errf(format.ErrUnsupported, "GGUF v1 is not supported (v2 and v3 are); re-convert the model with a current llama.cpp")
	case version == 2 || version == 3:
	case version == 0:
		return nil, r.errf(format.ErrCorrupt, "version 0 is invalid")
	case version&0xFFFF == 0 && bits.ReverseBytes32(version) <= 3:
		return nil, r.errf(format.ErrUnsupported, "big-endian GGUF (version field %#x) is not supported", version)
	default:
		return nil, r.errf(format.ErrUnsupported, "version %d is newer than this reader (v2 and v3)", version)
	}
	r.field = "tensor_count"
	nTensors, err := r.u64("tensor_count")
	if err != nil {
		return nil, err
	}
	r.field = "metadata_kv_count"
	nKV, err := r.u64("metadata_kv_count")
	if err != nil {
		return nil, err
	}
	// Each key/value takes at least 8 (key length) + 4 (type) + 1 bytes.
	if nKV > r.left()/13 {
		return nil, r.errf(format.ErrCorrupt, "%d key/values cannot fit in the %d bytes left in the file", nKV, r.left())
	}
	r.field = "tensor_count"
	if nTensors > MaxTensors {
		return nil, r.errf(format.ErrCorrupt, "%d tensors is over the %d limit", nTensors, MaxTensors)
	}
	// Each tensor info takes at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes.
	if nTensors > r.left()/24 {
		return nil, r.errf(format.ErrCorrupt, "%d tensor infos cannot fit in the %d bytes left in the file", nTensors, r.left())
	}

	f := &File{Version: version, Alignment: DefaultAlignment}
	if err := parseMetadata(r, f, nKV, maxMetadata); err != nil {
		return nil, err
	}
	if err := parseTensorInfos(r, f, nTensors); err != nil {
		return nil, err
	}
	return f, nil
}

func parseMetadata(r *reader, f *File, n, maxBytes uint64) error {
	full := r.b
	if limit := r.off + maxBytes; limit >= r.off && limit < uint64(len(r.b)) {
		r.b = r.b[:limit]
		r.limitWhy = fmt.Sprintf("metadata is over the %d-byte limit", maxBytes)
	}
	defer func() { r.b, r.limitWhy = full, "" }()

	f.Metadata = make([]KV, 0, n)
	seen := make(map[string]bool, n)
	for i := uint64(0); i < n; i++ {
		r.field = fmt.Sprintf("metadata key %d", i)
		key, err := r.str("key")
		if err != nil {
			return err
		}
		r.field = key
		if seen[key] {
			return r.errf(format.ErrCorrupt, "key appears twice")
		}
		seen[key] = true
		vt, err := r.u32("value type")
		if err != nil {
			return err
		}
		v, err := readValue(r, ValueType(vt), 0)
		if err != nil {
			return err
		}
		if key == "general.alignment" {
			a, ok := v.(uint32)
			if !ok {
				return r.errf(format.ErrCorrupt, "want a uint32, found %s", ValueType(vt))
			}
			if a == 0 || a&(a-1) != 0 {
				return r.errf(format.ErrCorrupt, "%d is not a power of two", a)
			}
			f.Alignment = uint64(a)
		}
		f.Metadata = append(f.Metadata, KV{Key: key, Value: v})
	}
	r.field = ""
	return nil
}

func readValue(r *reader, t ValueType, depth int) (any, error) {
	switch t {
	case TypeUint8:
		return r.u8("uint8 value")
	case TypeInt8:
		v, err := r.u8("int8 value")
		return int8(v), err
	case TypeUint16:
		return r.u16("uint16 value")
	case TypeInt16:
		v, err := r.u16("int16 value")
		return int16(v), err
	case TypeUint32:
		return r.u32("uint32 value")
	case TypeInt32:
		v, err := r.u32("int32 value")
		return int32(v), err
	case TypeFloat32:
		v, err := r.u32("float32 value")
		return math.Float32frombits(v), err
	case TypeUint64:
		return r.u64("uint64 value")
	case TypeInt64:
		v, err := r.u64("int64 value")
		return int64(v), err
	case TypeFloat64:
		v, err := r.u64("float64 value")
		return math.Float64frombits(v), err
	case TypeBool:
		v, err := r.u8("bool value")
		if err != nil {
			return nil, err
		}
		if v > 1 {
			return nil, r.errf(format.ErrCorrupt, "bool value %d at offset %d is neither 0 nor 1", v, r.off-1)
		}
		return v == 1, nil
	case TypeString:
		return r.str("string value")
	case TypeArray:
		return readArray(r, depth+1)
	}
	return nil, r.errf(format.ErrCorrupt, "value type %d at offset %d is not a GGUF type", uint32(t), r.off-4)
}

func readArray(r *reader, depth int) (any, error) {
	if depth > MaxArrayDepth {
		return nil, r.errf(format.ErrCorrupt, "arrays nested more than %d deep", MaxArrayDepth)
	}
	et, err := r.u32("array element type")
	if err != nil {
		return nil, err
	}
	t := ValueType(et)
	size := t.wireSize()
	if size == 0 {
		return nil, r.errf(format.ErrCorrupt, "array element type %d at offset %d is not a GGUF type", et, r.off-4)
	}
	n, err := r.u64("array length")
	if err != nil {
		return nil, err
	}
	if n > r.left()/size {
		if r.limitWhy != "" {
			return nil, r.errf(format.ErrCorrupt, "array of %d %s at offset %d: %s", n, t, r.off, r.limitWhy)
		}
		return nil, r.errf(format.ErrCorrupt, "array of %d %s at offset %d cannot fit in the %d bytes left in the file (truncated?)", n, t, r.off, r.left())
	}
	// n*size <= left, so the fixed-size cases below read in bounds.
	p := r.b[r.off:]
	switch t {
	case TypeUint8:
		r.off += n
		return slices.Clone(p[:n:n]), nil
	case TypeInt8:
		return fixed(r, n, 1, func(i uint64) int8 { return int8(p[i]) }), nil
	case TypeBool:
		out := make([]bool, n)
		for i := range out {
			if p[i] > 1 {
				return nil, r.errf(format.ErrCorrupt, "bool element %d at offset %d is %d, neither 0 nor 1", i, r.off+uint64(i), p[i])
			}
			out[i] = p[i] == 1
		}
		r.off += n
		return out, nil
	case TypeUint16:
		return fixed(r, n, 2, func(i uint64) uint16 { return binary.LittleEndian.Uint16(p[2*i:]) }), nil
	case TypeInt16:
		return fixed(r, n, 2, func(i uint64) int16 { return int16(binary.LittleEndian.Uint16(p[2*i:])) }), nil
	case TypeUint32:
		return fixed(r, n, 4, func(i uint64) uint32 { return binary.LittleEndian.Uint32(p[4*i:]) }), nil
	case TypeInt32:
		return fixed(r, n, 4, func(i uint64) int32 { return int32(binary.LittleEndian.Uint32(p[4*i:])) }), nil
	case TypeFloat32:
		return fixed(r, n, 4, func(i uint64) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(p[4*i:])) }), nil
	case TypeUint64:
		return fixed(r, n, 8, func(i uint64) uint64 { return binary.LittleEndian.Uint64(p[8*i:]) }), nil
	case TypeInt64:
		return fixed(r, n, 8, func(i uint64) int64 { return int64(binary.LittleEndian.Uint64(p[8*i:])) }), nil
	case TypeFloat64:
		return fixed(r, n, 8, func(i uint64) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(p[8*i:])) }), nil
	case TypeString:
		out := make([]string, n)
		for i := range out {
			s, err := r.str("array string")
			if err != nil {
				return nil, err
			}
			out[i] = s
		}
		return out, nil
	default: // TypeArray
		out := make([]any, n)
		for i := range out {
			v, err := readArray(r, depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	}
}

// fixed decodes n fixed-size elements with at; the caller has checked that
// n*size bytes remain.
func fixed[T any](r *reader, n, size uint64, at func(i uint64) T) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = at(uint64(i))
	}
	r.off += n * size
	return out
}

func parseTensorInfos(r *reader, f *File, n uint64) error {
	f.Tensors = make([]format.Tensor, 0, n)
	f.TypeIDs = make([]uint32, 0, n)
	rel := make([]uint64, 0, n) // offsets relative to the data section
	seen := make(map[string]bool, n)
	for i := uint64(0); i < n; i++ {
		r.tensor, r.field = "", fmt.Sprintf("tensor info %d", i)
		name, err := r.str("tensor name")
		if err != nil {
			return err
		}
		if name == "" {
			return r.errf(format.ErrCorrupt, "empty tensor name")
		}
		r.tensor, r.field = name, ""
		if seen[name] {
			return r.errf(format.ErrCorrupt, "tensor name appears twice")
		}
		seen[name] = true
		r.field = "n_dims"
		nd, err := r.u32("n_dims")
		if err != nil {
			return err
		}
		if nd > MaxDims {
			return r.errf(format.ErrCorrupt, "%d dimensions, more than ggml's %d", nd, MaxDims)
		}
		r.field = "ne"
		ne := make([]uint64, nd)
		elems := uint64(1)
		for j := range ne {
			d, err := r.u64("dimension")
			if err != nil {
				return err
			}
			hi, lo := bits.Mul64(elems, d)
			if hi != 0 || lo > math.MaxInt64 {
				return r.errf(format.ErrCorrupt, "element count of dims %v... overflows int64", append(ne[:j:j], d))
			}
			ne[j], elems = d, lo
		}
		r.field = "type"
		id, err := r.u32("ggml type")
		if err != nil {
			return err
		}
		ti, ok := TypeByID(id)
		switch {
		case !ok:
			return r.errf(format.ErrUnsupported, "ggml type id %d is unknown (this reader knows ids 0-%d)", id, len(types)-1)
		case ti.Removed:
			return r.errf(format.ErrUnsupported, "ggml type id %d (%s) was removed from ggml; re-convert the model", id, ti.Name)
		}
		row := uint64(1)
		if nd > 0 {
			row = ne[0]
		}
		if row%ti.BlockElems != 0 {
			return r.errf(format.ErrCorrupt, "row length ne[0]=%d is not a multiple of the %s block size %d", row, ti.Name, ti.BlockElems)
		}
		hi, size := bits.Mul64(elems/ti.BlockElems, ti.BlockBytes)
		if hi != 0 {
			return r.errf(format.ErrCorrupt, "%d elements of %s overflow 64 bits of bytes", elems, ti.Name)
		}
		r.field = "offset"
		off, err := r.u64("offset")
		if err != nil {
			return err
		}
		if off%f.Alignment != 0 {
			return r.errf(format.ErrCorrupt, "%d is not a multiple of the alignment %d", off, f.Alignment)
		}
		shape := make([]uint64, nd)
		for j := range ne {
			shape[int(nd)-1-j] = ne[j]
		}
		f.Tensors = append(f.Tensors, format.Tensor{Name: name, DType: ti.Name, Shape: shape, Bytes: size, File: r.name})
		f.TypeIDs = append(f.TypeIDs, id)
		rel = append(rel, off)
	}
	r.tensor, r.field = "", ""

	// The data section starts at the next multiple of the alignment.
	size := uint64(len(r.b))
	start := r.off
	if rem := start % f.Alignment; rem != 0 {
		start += f.Alignment - rem
	}
	f.DataStart = start
	dataSize := uint64(0)
	if start <= size {
		dataSize = size - start
	}
	order := make([]int, len(f.Tensors))
	for i := range order {
		order[i] = i
	}
	for i := range f.Tensors {
		t := &f.Tensors[i]
		if rel[i] > dataSize || t.Bytes > dataSize-rel[i] {
			r.tensor, r.field = t.Name, "offset"
			return r.errf(format.ErrCorrupt, "data [%d, %d) runs past the end of the data section (%d bytes; truncated?)", rel[i], rel[i]+t.Bytes, dataSize)
		}
		t.Offset = start + rel[i]
	}
	slices.SortFunc(order, func(a, b int) int {
		ta, tb := f.Tensors[a], f.Tensors[b]
		if ta.Offset != tb.Offset {
			if ta.Offset < tb.Offset {
				return -1
			}
			return 1
		}
		if ta.Bytes != tb.Bytes {
			if ta.Bytes < tb.Bytes {
				return -1
			}
			return 1
		}
		return a - b
	})
	prev := -1
	for _, i := range order {
		t := f.Tensors[i]
		if t.Bytes == 0 {
			continue
		}
		if prev >= 0 {
			p := f.Tensors[prev]
			if t.Offset < p.Offset+p.Bytes {
				r.tensor, r.field = t.Name, "offset"
				return r.errf(format.ErrCorrupt, "data [%d, %d) overlaps tensor %q at [%d, %d)",
					t.Offset-start, t.Offset-start+t.Bytes, p.Name, p.Offset-start, p.Offset-start+p.Bytes)
			}
		}
		prev = i
	}
	return nil
}
