// Package format describes model weight files independently of their on-disk
// encoding. The parsers in format/safetensors and format/gguf return a *Model
// whose tensors point into read-only memory mappings of the files, so a weight
// streamer can hand each tensor's bytes to a device copy without reading the
// file through the Go heap.
//
// Conventions shared by every parser:
//   - Tensor.Shape is outermost-first (row-major, as PyTorch and NumPy write
//     it). GGUF lists its dims innermost-first; the gguf package reverses them.
//   - Tensor.Offset is absolute within Tensor.File, and Tensor.Bytes is the
//     exact length of the tensor's data, checked against its dtype and shape.
//   - Errors about a file's contents are *Error values that name the file and,
//     where there is one, the tensor; errors.Is(err, ErrCorrupt) or
//     errors.Is(err, ErrUnsupported) tells the two kinds apart.
package format

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/memwall/memwall/format/mmap"
)

// Sentinel kinds carried by *Error.
var (
	// ErrCorrupt marks a file whose bytes contradict its own header: a
	// truncated file, a length past the end, overlapping tensors, a shape that
	// does not match its byte range, malformed metadata.
	ErrCorrupt = errors.New("corrupt model file")
	// ErrUnsupported marks a well-formed file that uses something this
	// package does not implement: a GGUF version, an unknown dtype or ggml
	// type id, a big-endian file.
	ErrUnsupported = errors.New("unsupported model file")
)

// Error is a problem in one model file. Its message reads
//
//	safetensors model.safetensors: tensor "lm_head.weight": data_offsets: end 1024 past data size 512
//
// and it unwraps to Kind (ErrCorrupt or ErrUnsupported).
type Error struct {
	Format string // "safetensors", "gguf", ...
	File   string // the file as the caller named it
	Tensor string // the tensor concerned, "" if none
	Field  string // the header field or metadata key concerned, "" if none
	Reason string // what is wrong, with the numbers involved
	Kind   error  // ErrCorrupt or ErrUnsupported
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Format)
	b.WriteByte(' ')
	b.WriteString(e.File)
	b.WriteString(": ")
	if e.Tensor != "" {
		b.WriteString("tensor ")
		b.WriteString(strconv.Quote(e.Tensor))
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Reason)
	return b.String()
}

// Unwrap returns Kind.
func (e *Error) Unwrap() error { return e.Kind }

// Tensor describes one tensor's place in a model file.
type Tensor struct {
	Name string
	// DType is the canonical upper-case type name: "BF16", "F16", "F32",
	// "F8_E4M3", "I64", ... for safetensors; the ggml name ("Q4_K", "IQ2_XS",
	// "MXFP4", ...) for GGUF. Names shared by both formats mean the same.
	DType  string
	Shape  []uint64 // outermost first
	Offset uint64   // absolute byte offset of the data in File
	Bytes  uint64   // length of the data
	File   string   // the file holding the data
}

// Elements returns the product of Shape (1 for a scalar). Parsers have
// checked that it does not overflow.
func (t Tensor) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// TensorSpec is what a writer needs to lay out one tensor: name, canonical
// dtype and outermost-first shape.
type TensorSpec struct {
	Name  string
	DType string
	Shape []uint64
}

// Model is an open model: its tensors and metadata, backed by read-only
// mappings of its files. Data may be called from several goroutines at once;
// Close must not race with Data or with uses of the slices Data returned.
type Model struct {
	Path   string // what Open was given (a file, or a sharded index)
	Format string // "safetensors" or "gguf"
	// Tensors in storage order: by file, then by offset.
	Tensors []Tensor
	// Metadata: for safetensors the header's "__metadata__" strings, or for
	// a sharded checkpoint the index's "metadata" (JSON integers as uint64
	// or int64, other numbers as float64); for GGUF every key/value as a Go
	// value (uint8 … float64, bool, string, typed slices for arrays, []any
	// for arrays of arrays).
	Metadata  map[string]any
	DataBytes uint64 // sum of Tensors[i].Bytes

	files  map[string]*mmap.Mapping
	byName map[string]int
}

// NewModel assembles a Model from parsed tensors and the mappings their
// bytes live in, keyed by Tensor.File. It takes ownership of the mappings
// (Close releases them) and sorts tensors by file then offset. Parsers call
// it after validating every tensor against its mapping; NewModel itself does
// not re-validate, but Data never returns bytes outside a mapping.
func NewModel(path, formatName string, tensors []Tensor, metadata map[string]any, files map[string]*mmap.Mapping) *Model {
	slices.SortStableFunc(tensors, func(a, b Tensor) int {
		if c := strings.Compare(a.File, b.File); c != 0 {
			return c
		}
		if a.Offset != b.Offset {
			if a.Offset < b.Offset {
				return -1
			}
			return 1
		}
		return 0
	})
	m := &Model{
		Path:     path,
		Format:   formatName,
		Tensors:  tensors,
		Metadata: metadata,
		files:    files,
		byName:   make(map[string]int, len(tensors)),
	}
	if m.Metadata == nil {
		m.Metadata = map[string]any{}
	}
	for i, t := range tensors {
		m.byName[t.Name] = i
		m.DataBytes += t.Bytes
	}
	return m
}

// Tensor returns the tensor called name and whether it exists.
func (m *Model) Tensor(name string) (Tensor, bool) {
	i, ok := m.byName[name]
	if !ok {
		return Tensor{}, false
	}
	return m.Tensors[i], true
}

// Data returns t's bytes, sliced from the mapping of t.File. The slice is
// read-only (writing to it faults) and valid until Close. It returns nil if
// t.File is not one of this model's files, if the range does not lie inside
// the mapping, or after Close.
func (m *Model) Data(t Tensor) []byte {
	mp, ok := m.files[t.File]
	if !ok {
		return nil
	}
	b := mp.Bytes()
	if t.Offset > uint64(len(b)) || t.Bytes > uint64(len(b))-t.Offset {
		return nil
	}
	return b[t.Offset : t.Offset+t.Bytes : t.Offset+t.Bytes]
}

// Files returns the paths of the model's mapped files, sorted.
func (m *Model) Files() []string {
	out := make([]string, 0, len(m.files))
	for p := range m.files {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// Close unmaps every file. It returns the first unmap error, is safe to call
// twice, and leaves Tensors and Metadata readable.
func (m *Model) Close() error {
	var first error
	for _, p := range m.Files() {
		if err := m.files[p].Close(); err != nil && first == nil {
			first = fmt.Errorf("%s %s: %w", m.Format, m.Path, err)
		}
	}
	return first
}
