package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"

	"github.com/memwall/memwall/format"
)

// Writer writes one safetensors file in a single streaming pass: NewWriter
// emits the header, then the caller writes every tensor's bytes, in the order
// the specs were given, through Write. Nothing but the header is buffered, so
// files larger than memory can be written. Writer is not safe for concurrent
// use.
type Writer struct {
	w       io.Writer
	layout  []format.Tensor
	total   uint64
	written uint64
	err     error
}

// Layout computes the header bytes (length field included) and each
// tensor's place for the given specs and metadata, without writing. Tensor
// offsets are absolute in the file and File is empty. It fails on an empty or
// duplicate name, the reserved name "__metadata__", an unknown dtype or a
// shape whose size overflows or is not a whole number of bytes.
func Layout(specs []format.TensorSpec, metadata map[string]string) ([]byte, []format.Tensor, error) {
	seen := make(map[string]bool, len(specs))
	var body bytes.Buffer
	body.WriteByte('{')
	if len(metadata) > 0 {
		keys := make([]string, 0, len(metadata))
		for k := range metadata {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		body.WriteString(`"__metadata__":{`)
		for i, k := range keys {
			if i > 0 {
				body.WriteByte(',')
			}
			writeJSONString(&body, k)
			body.WriteByte(':')
			writeJSONString(&body, metadata[k])
		}
		body.WriteByte('}')
	}
	layout := make([]format.Tensor, 0, len(specs))
	var off uint64
	for i, s := range specs {
		switch {
		case s.Name == "":
			return nil, nil, fmt.Errorf("safetensors writer: tensor %d: empty name", i)
		case s.Name == metadataKey:
			return nil, nil, fmt.Errorf("safetensors writer: tensor %d: name %q is reserved", i, s.Name)
		case seen[s.Name]:
			return nil, nil, fmt.Errorf("safetensors writer: tensor %q: duplicate name", s.Name)
		}
		seen[s.Name] = true
		n, err := TensorBytes(s.DType, s.Shape)
		if err != nil {
			return nil, nil, fmt.Errorf("safetensors writer: tensor %q: %w", s.Name, err)
		}
		if off+n < off {
			return nil, nil, fmt.Errorf("safetensors writer: tensor %q: data section overflows 64 bits", s.Name)
		}
		if body.Len() > 1 {
			body.WriteByte(',')
		}
		writeJSONString(&body, s.Name)
		body.WriteString(`:{"dtype":`)
		writeJSONString(&body, s.DType)
		body.WriteString(`,"shape":[`)
		for j, d := range s.Shape {
			if j > 0 {
				body.WriteByte(',')
			}
			body.WriteString(strconv.FormatUint(d, 10))
		}
		body.WriteString(`],"data_offsets":[`)
		body.WriteString(strconv.FormatUint(off, 10))
		body.WriteByte(',')
		body.WriteString(strconv.FormatUint(off+n, 10))
		body.WriteString("]}")
		layout = append(layout, format.Tensor{Name: s.Name, DType: s.DType, Shape: slices.Clone(s.Shape), Offset: off, Bytes: n})
		off += n
	}
	body.WriteByte('}')
	// Pad with spaces so the data section starts 8-byte aligned, as the
	// reference writer does.
	for (8+body.Len())%8 != 0 {
		body.WriteByte(' ')
	}
	if body.Len() > MaxHeaderBytes {
		return nil, nil, fmt.Errorf("safetensors writer: header is %d bytes, over the %d-byte limit", body.Len(), MaxHeaderBytes)
	}
	hdr := make([]byte, 8, 8+body.Len())
	binary.LittleEndian.PutUint64(hdr, uint64(body.Len()))
	hdr = append(hdr, body.Bytes()...)
	for i := range layout {
		layout[i].Offset += uint64(len(hdr))
	}
	return hdr, layout, nil
}

func writeJSONString(b *bytes.Buffer, s string) {
	q, _ := json.Marshal(s) // a string always marshals
	b.Write(q)
}

// NewWriter writes the header for specs and metadata to w and returns a
// Writer expecting the tensors' data. The caller keeps ownership of w.
func NewWriter(w io.Writer, specs []format.TensorSpec, metadata map[string]string) (*Writer, error) {
	hdr, layout, err := Layout(specs, metadata)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(hdr); err != nil {
		return nil, fmt.Errorf("safetensors writer: header: %w", err)
	}
	sw := &Writer{w: w, layout: layout}
	for _, t := range layout {
		sw.total += t.Bytes
	}
	return sw, nil
}

// Tensors returns the layout being written (absolute offsets, File empty).
func (w *Writer) Tensors() []format.Tensor { return w.layout }

// DataBytes returns the size of the data section the header declared.
func (w *Writer) DataBytes() uint64 { return w.total }

// Write writes the next bytes of the data section: the tensors' contents
// concatenated in spec order. Writing past the declared size fails without
// writing anything; after any error every later call fails.
func (w *Writer) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	if uint64(len(p)) > w.total-w.written {
		w.err = fmt.Errorf("safetensors writer: %d bytes written past the %d-byte data section", uint64(len(p))-(w.total-w.written), w.total)
		return 0, w.err
	}
	n, err := w.w.Write(p)
	w.written += uint64(n)
	if err != nil {
		w.err = fmt.Errorf("safetensors writer: %w", err)
	}
	return n, w.err
}

// Close checks that the whole data section was written. It does not close
// the underlying writer.
func (w *Writer) Close() error {
	if w.err != nil {
		return w.err
	}
	if w.written != w.total {
		return fmt.Errorf("safetensors writer: %d of %d data bytes written", w.written, w.total)
	}
	return nil
}
