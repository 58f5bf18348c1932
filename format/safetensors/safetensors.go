// Package safetensors reads and writes the safetensors format: an 8-byte
// little-endian header length N, N bytes of JSON
//
//	{"__metadata__": {"k": "v"}, "name": {"dtype": "BF16", "shape": [4096, 4096], "data_offsets": [b, e]}, ...}
//
// and then the data section, in which each tensor occupies [b, e). Sharded
// checkpoints add a model.safetensors.index.json whose "weight_map" names the
// shard holding each tensor; Open reads either.
//
// Nothing in a header is trusted: the length is checked against the file and
// against MaxHeaderBytes before anything is decoded, every dtype must be
// known, every byte range must match its dtype and shape exactly (with
// overflow checks) and lie inside the data section, and no two tensors may
// overlap. Failures are *format.Error values naming the file and tensor.
package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"unicode/utf8"

	"github.com/memwall/memwall/format"
	"github.com/memwall/memwall/format/mmap"
)

// FormatName is the value of format.Model.Format for this package.
const FormatName = "safetensors"

// MaxHeaderBytes bounds the JSON header (and a sharded index file), as the
// reference implementation does.
const MaxHeaderBytes = 100 << 20

// metadataKey is the reserved header key holding string metadata.
const metadataKey = "__metadata__"

// Options adjusts how strictly files are checked. The zero value is the
// default used by Open and Parse.
type Options struct {
	// Strict also requires what the reference implementation requires: the
	// tensors tile the data section exactly, from its first byte to the end
	// of the file, with no gaps. Without it gaps and trailing bytes are
	// allowed (overlaps never are).
	Strict bool
}

// Header is one parsed safetensors file.
type Header struct {
	// Tensors in header order, with File set to the name given to Parse and
	// Offset absolute in the file.
	Tensors []format.Tensor
	// Metadata is the "__metadata__" object (nil if absent).
	Metadata map[string]string
	// DataStart is the offset of the data section: 8 + header length.
	DataStart uint64
}

// Open opens a safetensors file, or a sharded checkpoint through its
// *.index.json, with default Options.
func Open(path string) (*format.Model, error) { return Options{}.Open(path) }

// Parse parses a whole safetensors file held in b with default Options.
func Parse(name string, b []byte) (*Header, error) { return Options{}.Parse(name, b) }

// Open maps path read-only and parses it. A path ending in ".json" is read as
// a sharded index (see OpenIndex). The returned Model owns the mappings;
// Close releases them. On error nothing stays mapped.
func (o Options) Open(path string) (*format.Model, error) {
	if len(path) > 5 && path[len(path)-5:] == ".json" {
		return o.OpenIndex(path)
	}
	mp, err := mmap.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", FormatName, path, err)
	}
	h, err := o.Parse(path, mp.Bytes())
	if err != nil {
		mp.Close()
		return nil, err
	}
	meta := make(map[string]any, len(h.Metadata))
	for k, v := range h.Metadata {
		meta[k] = v
	}
	return format.NewModel(path, FormatName, h.Tensors, meta, map[string]*mmap.Mapping{path: mp}), nil
}

// rawEntry is one tensor's header entry; pointers tell missing fields apart.
type rawEntry struct {
	DType       *string   `json:"dtype"`
	Shape       *[]uint64 `json:"shape"`
	DataOffsets *[]uint64 `json:"data_offsets"`
}

// Parse parses the safetensors file whose complete contents are b. name is
// used in errors and as Tensor.File. It never panics and allocates at most a
// small multiple of the header length.
func (o Options) Parse(name string, b []byte) (*Header, error) {
	corrupt := func(tensor, field, f string, a ...any) error {
		return &format.Error{Format: FormatName, File: name, Tensor: tensor, Field: field,
			Reason: fmt.Sprintf(f, a...), Kind: format.ErrCorrupt}
	}
	size := uint64(len(b))
	if size < 8 {
		return nil, corrupt("", "header length", "file is %d bytes, shorter than the 8-byte length field (truncated?)", size)
	}
	n := binary.LittleEndian.Uint64(b)
	if n > MaxHeaderBytes {
		return nil, corrupt("", "header length", "%d bytes exceeds the %d-byte limit", n, MaxHeaderBytes)
	}
	if n > size-8 {
		return nil, corrupt("", "header length", "%d bytes runs past the end of the file (%d bytes follow the length field; truncated?)", n, size-8)
	}
	hdr := b[8 : 8+n]
	if !utf8.Valid(hdr) {
		return nil, corrupt("", "header", "not valid UTF-8")
	}
	dataStart := 8 + n
	dataSize := size - dataStart
	h := &Header{DataStart: dataStart}

	type span struct {
		b, e uint64
		name string
	}
	var spans []span
	err := walkObject(hdr, func(key string, dec *json.Decoder) error {
		if key == metadataKey {
			if err := dec.Decode(&h.Metadata); err != nil {
				return corrupt("", metadataKey, "want an object of strings: %v", jsonReason(err))
			}
			return nil
		}
		if key == "" {
			return corrupt("", "header", "empty tensor name")
		}
		var e rawEntry
		if err := dec.Decode(&e); err != nil {
			return corrupt(key, "", "entry: %v", jsonReason(err))
		}
		switch {
		case e.DType == nil:
			return corrupt(key, "dtype", "missing")
		case e.Shape == nil:
			return corrupt(key, "shape", "missing")
		case e.DataOffsets == nil:
			return corrupt(key, "data_offsets", "missing")
		case len(*e.DataOffsets) != 2:
			return corrupt(key, "data_offsets", "has %d values, want [begin, end]", len(*e.DataOffsets))
		}
		dtype, shape, off := *e.DType, *e.Shape, *e.DataOffsets
		want, err := TensorBytes(dtype, shape)
		if err != nil {
			var se *sizeError
			if errors.As(err, &se) && se.unsupported {
				return &format.Error{Format: FormatName, File: name, Tensor: key, Field: "dtype",
					Reason: fmt.Sprintf("%q is not a safetensors dtype (known: %v)", dtype, DTypes()), Kind: format.ErrUnsupported}
			}
			return corrupt(key, "shape", "%v", err)
		}
		begin, end := off[0], off[1]
		if begin > end {
			return corrupt(key, "data_offsets", "begin %d is after end %d", begin, end)
		}
		if end-begin != want {
			return corrupt(key, "data_offsets", "[%d, %d] spans %d bytes but %s %v needs %d", begin, end, end-begin, dtype, shape, want)
		}
		if end > dataSize {
			return corrupt(key, "data_offsets", "end %d is past the end of the data section (%d bytes; truncated?)", end, dataSize)
		}
		if shape == nil {
			shape = []uint64{}
		}
		h.Tensors = append(h.Tensors, format.Tensor{Name: key, DType: dtype, Shape: shape,
			Offset: dataStart + begin, Bytes: want, File: name})
		spans = append(spans, span{begin, end, key})
		return nil
	})
	if err != nil {
		var fe *format.Error
		if errors.As(err, &fe) {
			return nil, err
		}
		return nil, corrupt("", "header", "%v", err)
	}

	slices.SortFunc(spans, func(x, y span) int {
		if x.b != y.b {
			if x.b < y.b {
				return -1
			}
			return 1
		}
		if x.e != y.e {
			if x.e < y.e {
				return -1
			}
			return 1
		}
		return 0
	})
	var prev span
	havePrev := false
	for _, s := range spans {
		if havePrev && s.b < prev.e && s.b != s.e {
			return nil, corrupt(s.name, "data_offsets", "[%d, %d] overlaps tensor %q at [%d, %d]", s.b, s.e, prev.name, prev.b, prev.e)
		}
		if o.Strict {
			want := uint64(0)
			if havePrev {
				want = prev.e
			}
			if s.b != want {
				return nil, corrupt(s.name, "data_offsets", "begins at %d, want %d: tensors must tile the data section (strict)", s.b, want)
			}
		}
		if s.b != s.e || !havePrev {
			prev, havePrev = s, true
		}
	}
	if o.Strict {
		end := uint64(0)
		if havePrev {
			end = prev.e
		}
		if end != dataSize {
			return nil, corrupt("", "data_offsets", "tensors end at %d but the data section is %d bytes (strict)", end, dataSize)
		}
	}
	return h, nil
}

// walkObject decodes the JSON object in b key by key, calling fn with the
// decoder positioned at each value; fn must consume exactly that value. It
// rejects duplicate keys, a non-object top level and trailing data.
func walkObject(b []byte, fn func(key string, dec *json.Decoder) error) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("JSON: %v", jsonReason(err))
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("JSON: want an object, found %v", tok)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("JSON: %v", jsonReason(err))
		}
		key, ok := tok.(string)
		if !ok {
			return fmt.Errorf("JSON: want a key, found %v", tok)
		}
		if seen[key] {
			return fmt.Errorf("JSON: key %q appears twice", key)
		}
		seen[key] = true
		if err := fn(key, dec); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return fmt.Errorf("JSON: %v", jsonReason(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("JSON: data after the closing brace")
	}
	return nil
}

// jsonReason makes encoding/json errors about truncated input say so.
func jsonReason(err error) string {
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		return "unexpected end of JSON"
	}
	return err.Error()
}
