package onnx

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"unsafe"

	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/mmap"
)

// FormatName is the format.Model.Format of models opened with OpenWeights.
const FormatName = "onnx"

// dtypeNames maps ONNX element types to the canonical names format.Tensor
// uses (the safetensors spelling). Sub-byte, string and complex types are
// not streamable weights.
var dtypeNames = map[DataType]string{
	Float: "F32", Double: "F64", Float16: "F16", BFloat16: "BF16",
	Int8: "I8", Uint8: "U8", Int16: "I16", Uint16: "U16", Int32: "I32", Uint32: "U32",
	Int64: "I64", Uint64: "U64", Bool: "BOOL",
	Float8E4M3FN: "F8_E4M3", Float8E5M2: "F8_E5M2", Float8E4M3FNUZ: "F8_E4M3FNUZ",
	Float8E5M2FNUZ: "F8_E5M2FNUZ", Float8E8M0: "F8_E8M0",
}

// OpenWeights opens the initializers of an ONNX model as weights a streamer
// can map: each external-data initializer is a byte range of its data file
// (resolved relative to the model's folder, which it may not leave), and each
// inline raw_data initializer a byte range of the .onnx file itself; every
// file is mapped read-only. Initializers held in typed fields (float_data
// and the like: small constants) are not mappable and are left out, counted
// in Metadata["onnx.unmapped_initializers"].
//
// Errors name the file and the tensor: an element type that is not a plain
// numeric type, dims whose byte size overflows, an external length that does
// not match dtype × shape, a range past the end of its file, a location
// outside the model's folder, or tensors that overlap in one file.
func OpenWeights(path string) (*format.Model, error) {
	mp, err := mmap.Open(path)
	if err != nil {
		return nil, fmt.Errorf("onnx %s: %w", path, err)
	}
	files := map[string]*mmap.Mapping{path: mp}
	fail := func(err error) (*format.Model, error) {
		for _, m := range files {
			m.Close()
		}
		return nil, err
	}
	data := mp.Bytes()
	m, err := Decode(data)
	if err != nil {
		return fail(fmt.Errorf("onnx %s: %w", path, err))
	}
	if m.Graph == nil {
		return fail(fmt.Errorf("onnx %s: model has no graph: %w", path, format.ErrCorrupt))
	}
	dir := filepath.Dir(path)
	bad := func(t *Tensor, msg string, a ...any) error {
		return fmt.Errorf("onnx %s: initializer %q: %w", path, t.Name, fmt.Errorf(msg, a...))
	}
	var tensors []format.Tensor
	unmapped := 0
	for i := range m.Graph.Initializers {
		t := &m.Graph.Initializers[i]
		dt, ok := dtypeNames[t.DataType]
		if !ok {
			return fail(bad(t, "element type %d is not a streamable numeric type: %w", t.DataType, format.ErrUnsupported))
		}
		n, err := NumElements(t.Dims)
		if err != nil {
			return fail(bad(t, "dims %v: %v: %w", t.Dims, err, format.ErrCorrupt))
		}
		size := uint64(n) * uint64(t.DataType.Bits()/8) // NumElements caps n at 2^50: no overflow
		shape := make([]uint64, len(t.Dims))
		for j, d := range t.Dims {
			shape[j] = uint64(d)
		}
		ft := format.Tensor{Name: t.Name, DType: dt, Shape: shape, Bytes: size}
		ext, err := t.External()
		switch {
		case err != nil:
			return fail(fmt.Errorf("onnx %s: %v: %w", path, err, format.ErrCorrupt))
		case ext != nil:
			if filepath.IsAbs(ext.Location) || !filepath.IsLocal(ext.Location) {
				return fail(bad(t, "external location %q leaves the model's folder: %w", ext.Location, format.ErrCorrupt))
			}
			file := filepath.Join(dir, ext.Location)
			if ext.HasLength && uint64(ext.Length) != size {
				return fail(bad(t, "external length %d does not match %s %v (%d bytes): %w", ext.Length, dt, t.Dims, size, format.ErrCorrupt))
			}
			fm, ok := files[file]
			if !ok {
				if fm, err = mmap.Open(file); err != nil {
					return fail(bad(t, "external data: %v", err))
				}
				files[file] = fm
			}
			if uint64(ext.Offset) > uint64(fm.Len()) || size > uint64(fm.Len())-uint64(ext.Offset) {
				return fail(bad(t, "external range [%d, %d) is past the end of %s (%d bytes; truncated?): %w",
					ext.Offset, uint64(ext.Offset)+size, file, fm.Len(), format.ErrCorrupt))
			}
			ft.File, ft.Offset = file, uint64(ext.Offset)
		case t.RawData != nil:
			if uint64(len(t.RawData)) != size {
				return fail(bad(t, "raw_data holds %d bytes, %s %v needs %d: %w", len(t.RawData), dt, t.Dims, size, format.ErrCorrupt))
			}
			off, ok := offsetIn(data, t.RawData)
			if !ok {
				return fail(bad(t, "raw_data does not lie in the file"))
			}
			ft.File, ft.Offset = path, off
		default:
			if size == 0 {
				continue
			}
			unmapped++
			continue
		}
		tensors = append(tensors, ft)
	}
	if err := checkOverlaps(path, tensors); err != nil {
		return fail(err)
	}
	meta := map[string]any{
		"onnx.ir_version":            m.IRVersion,
		"onnx.producer":              strings.TrimSpace(m.ProducerName + " " + m.ProducerVersion),
		"onnx.initializers":          len(m.Graph.Initializers),
		"onnx.unmapped_initializers": unmapped,
		"onnx.sparse_initializers":   m.Graph.SparseInitializers,
		"onnx.external_data_files":   len(files) - 1,
	}
	return format.NewModel(path, FormatName, tensors, meta, files), nil
}

// offsetIn returns where sub starts within data, when it lies inside it.
func offsetIn(data, sub []byte) (uint64, bool) {
	if len(sub) == 0 || len(data) == 0 {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(sub)))
	if p < base || p-base > uintptr(len(data)) || uintptr(len(sub)) > uintptr(len(data))-(p-base) {
		return 0, false
	}
	return uint64(p - base), true
}

// checkOverlaps refuses tensors that share bytes of one file.
func checkOverlaps(path string, ts []format.Tensor) error {
	sorted := slices.Clone(ts)
	slices.SortFunc(sorted, func(a, b format.Tensor) int {
		if c := strings.Compare(a.File, b.File); c != 0 {
			return c
		}
		switch {
		case a.Offset < b.Offset:
			return -1
		case a.Offset > b.Offset:
			return 1
		}
		return 0
	})
	for i := 1; i < len(sorted); i++ {
		a, b := sorted[i-1], sorted[i]
		if a.File == b.File && a.Bytes > 0 && b.Bytes > 0 && a.Offset+a.Bytes > b.Offset {
			return fmt.Errorf("onnx %s: initializers %q and %q overlap in %s ([%d, %d) and [%d, %d)): %w",
				path, a.Name, b.Name, a.File, a.Offset, a.Offset+a.Bytes, b.Offset, b.Offset+b.Bytes, format.ErrCorrupt)
		}
	}
	return nil
}
