package onnx

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
)

// Decode parses a serialized ModelProto. On failure it returns a nil Model and
// an error that wraps ErrCorrupt and names the message and field at fault
// (for example "GraphProto.node[3]: NodeProto.attribute[0]: ..."). The
// returned Model aliases data (see the package comment).
//
// Memory use is linear in len(data): every repeated element consumes at least
// one byte of input, and packed arrays are sized from their byte length.
func Decode(data []byte) (*Model, error) {
	d := decoder{}
	m := &Model{}
	if err := d.model(data, m); err != nil {
		return nil, fmt.Errorf("onnx: %w", err)
	}
	if m.Graph == nil {
		return nil, fmt.Errorf("onnx: ModelProto.graph (field 7): missing: %w", ErrCorrupt)
	}
	return m, nil
}

// decoder carries the nesting depths of the message being decoded.
type decoder struct {
	depth      int // protobuf message nesting
	graphDepth int // GraphProto nesting
}

// field is one decoded key/value pair of a message. For varint, fixed32 and
// fixed64 fields v holds the value; for length-delimited fields b holds the
// payload. Groups are skipped by each and never reach the callback.
type field struct {
	num protowire.Number
	typ protowire.Type
	v   uint64
	b   []byte
}

var wireTypeNames = map[protowire.Type]string{
	protowire.VarintType:     "varint",
	protowire.Fixed32Type:    "fixed32",
	protowire.Fixed64Type:    "fixed64",
	protowire.BytesType:      "bytes",
	protowire.StartGroupType: "group",
	protowire.EndGroupType:   "end-group",
}

func wireName(t protowire.Type) string {
	if s, ok := wireTypeNames[t]; ok {
		return s
	}
	return fmt.Sprintf("wire type %d", t)
}

// corruptf returns an error naming msg.name (field num) that wraps ErrCorrupt.
func corruptf(msg, name string, num protowire.Number, format string, args ...any) error {
	return fmt.Errorf("%s.%s (field %d): %s: %w", msg, name, num, fmt.Sprintf(format, args...), ErrCorrupt)
}

func wrongType(msg, name string, f field) error {
	return corruptf(msg, name, f.num, "unexpected %s encoding", wireName(f.typ))
}

// enter and leave bracket the decoding of one nested message.
func (d *decoder) enter(msg string) error {
	d.depth++
	if d.depth > MaxDepth {
		return fmt.Errorf("%s: nesting deeper than %d messages: %w", msg, MaxDepth, ErrCorrupt)
	}
	return nil
}

func (d *decoder) leave() { d.depth-- }

// message walks the fields of one nested message (each), counting it
// against MaxDepth.
func (d *decoder) message(msg string, b []byte, fn func(f field) error) error {
	if err := d.enter(msg); err != nil {
		return err
	}
	defer d.leave()
	return each(msg, b, fn)
}

// each walks the fields of one message, calling fn for every field except
// groups (deprecated; validated and skipped).
func each(msg string, b []byte, fn func(f field) error) error {
	total := len(b)
	for len(b) > 0 {
		off := total - len(b)
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%s: bad field tag at byte %d: %v: %w", msg, off, protowire.ParseError(n), ErrCorrupt)
		}
		b = b[n:]
		f := field{num: num, typ: typ}
		switch typ {
		case protowire.VarintType:
			f.v, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var v uint32
			v, n = protowire.ConsumeFixed32(b)
			f.v = uint64(v)
		case protowire.Fixed64Type:
			f.v, n = protowire.ConsumeFixed64(b)
		case protowire.BytesType:
			f.b, n = protowire.ConsumeBytes(b)
		case protowire.StartGroupType:
			n = protowire.ConsumeFieldValue(num, typ, b)
		default:
			n = -1
		}
		if n < 0 {
			return fmt.Errorf("%s: field %d (%s) at byte %d: truncated or malformed: %w",
				msg, num, wireName(typ), off, ErrCorrupt)
		}
		b = b[n:]
		if typ == protowire.StartGroupType {
			continue
		}
		if err := fn(f); err != nil {
			return err
		}
	}
	return nil
}

// Scalar field helpers. Each checks the wire type and names the field on error.

func int64Field(msg, name string, f field) (int64, error) {
	if f.typ != protowire.VarintType {
		return 0, wrongType(msg, name, f)
	}
	return int64(f.v), nil
}

func int32Field(msg, name string, f field) (int32, error) {
	if f.typ != protowire.VarintType {
		return 0, wrongType(msg, name, f)
	}
	// int32 values are sign-extended to 64 bits on the wire; truncation is
	// what protobuf specifies.
	return int32(f.v), nil
}

func bytesField(msg, name string, f field) ([]byte, error) {
	if f.typ != protowire.BytesType {
		return nil, wrongType(msg, name, f)
	}
	return f.b, nil
}

func stringField(msg, name string, f field) (string, error) {
	b, err := bytesField(msg, name, f)
	return string(b), err
}

func floatField(msg, name string, f field) (float32, error) {
	if f.typ != protowire.Fixed32Type {
		return 0, wrongType(msg, name, f)
	}
	return math.Float32frombits(uint32(f.v)), nil
}

// Repeated scalar helpers accept both the packed encoding (one bytes field)
// and the unpacked one (one field per element), as protobuf requires.

func appendVarints[T int32 | int64 | uint64](msg, name string, dst []T, f field) ([]T, error) {
	switch f.typ {
	case protowire.VarintType:
		return append(dst, T(f.v)), nil
	case protowire.BytesType:
		b := f.b
		// Count first so the slice grows once; a varint takes at least one
		// byte, so the count is bounded by len(b).
		cnt := 0
		for i := range b {
			if b[i] < 0x80 {
				cnt++
			}
		}
		dst = growCap(dst, cnt)
		for len(b) > 0 {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return dst, corruptf(msg, name, f.num, "malformed packed varint")
			}
			dst = append(dst, T(v))
			b = b[n:]
		}
		return dst, nil
	}
	return dst, wrongType(msg, name, f)
}

func appendFloats(msg, name string, dst []float32, f field) ([]float32, error) {
	switch f.typ {
	case protowire.Fixed32Type:
		return append(dst, math.Float32frombits(uint32(f.v))), nil
	case protowire.BytesType:
		if len(f.b)%4 != 0 {
			return dst, corruptf(msg, name, f.num, "packed length %d is not a multiple of 4", len(f.b))
		}
		dst = growCap(dst, len(f.b)/4)
		for i := 0; i+4 <= len(f.b); i += 4 {
			dst = append(dst, math.Float32frombits(binary.LittleEndian.Uint32(f.b[i:])))
		}
		return dst, nil
	}
	return dst, wrongType(msg, name, f)
}

func appendDoubles(msg, name string, dst []float64, f field) ([]float64, error) {
	switch f.typ {
	case protowire.Fixed64Type:
		return append(dst, math.Float64frombits(f.v)), nil
	case protowire.BytesType:
		if len(f.b)%8 != 0 {
			return dst, corruptf(msg, name, f.num, "packed length %d is not a multiple of 8", len(f.b))
		}
		dst = growCap(dst, len(f.b)/8)
		for i := 0; i+8 <= len(f.b); i += 8 {
			dst = append(dst, math.Float64frombits(binary.LittleEndian.Uint64(f.b[i:])))
		}
		return dst, nil
	}
	return dst, wrongType(msg, name, f)
}

// growCap makes room for n more elements, growing geometrically so that many
// small packed fields for one repeated field stay linear in total.
func growCap[T any](s []T, n int) []T { return slices.Grow(s, n) }

// ModelProto.

func (d *decoder) model(b []byte, m *Model) error {
	const msg = "ModelProto"
	return each(msg, b, func(f field) error {
		var err error
		switch f.num {
		case 1:
			m.IRVersion, err = int64Field(msg, "ir_version", f)
		case 2:
			m.ProducerName, err = stringField(msg, "producer_name", f)
		case 3:
			m.ProducerVersion, err = stringField(msg, "producer_version", f)
		case 4:
			m.Domain, err = stringField(msg, "domain", f)
		case 5:
			m.ModelVersion, err = int64Field(msg, "model_version", f)
		case 7:
			var p []byte
			if p, err = bytesField(msg, "graph", f); err != nil {
				return err
			}
			if m.Graph == nil {
				m.Graph = &Graph{}
			}
			if err = d.graph(p, m.Graph); err != nil {
				return fmt.Errorf("%s.graph: %w", msg, err)
			}
		case 8:
			var p []byte
			if p, err = bytesField(msg, "opset_import", f); err != nil {
				return err
			}
			var o OpsetID
			if err = d.opset(p, &o); err != nil {
				return fmt.Errorf("%s.opset_import[%d]: %w", msg, len(m.OpsetImports), err)
			}
			m.OpsetImports = append(m.OpsetImports, o)
		case 14:
			var p []byte
			if p, err = bytesField(msg, "metadata_props", f); err != nil {
				return err
			}
			var kv StringPair
			if err = d.stringPair(p, &kv); err != nil {
				return fmt.Errorf("%s.metadata_props[%d]: %w", msg, len(m.Metadata), err)
			}
			m.Metadata = append(m.Metadata, kv)
		}
		return err
	})
}

func (d *decoder) opset(b []byte, o *OpsetID) error {
	const msg = "OperatorSetIdProto"
	return d.message(msg, b, func(f field) error {
		var err error
		switch f.num {
		case 1:
			o.Domain, err = stringField(msg, "domain", f)
		case 2:
			o.Version, err = int64Field(msg, "version", f)
		}
		return err
	})
}

func (d *decoder) stringPair(b []byte, kv *StringPair) error {
	const msg = "StringStringEntryProto"
	return d.message(msg, b, func(f field) error {
		var err error
		switch f.num {
		case 1:
			kv.Key, err = stringField(msg, "key", f)
		case 2:
			kv.Value, err = stringField(msg, "value", f)
		}
		return err
	})
}

// GraphProto.

func (d *decoder) graph(b []byte, g *Graph) error {
	const msg = "GraphProto"
	if err := d.enter(msg); err != nil {
		return err
	}
	defer d.leave()
	d.graphDepth++
	defer func() { d.graphDepth-- }()
	if d.graphDepth > MaxGraphDepth {
		return fmt.Errorf("%s: subgraphs nested deeper than %d: %w", msg, MaxGraphDepth, ErrCorrupt)
	}
	// Size the repeated fields first: appending large structs one at a time
	// dominated decoding. Counts are bounded by len(b) (each field takes at
	// least two bytes); a malformed message is reported by the pass below.
	var counts [16]int
	_ = each(msg, b, func(f field) error {
		if f.num < 16 && f.typ == protowire.BytesType {
			counts[f.num]++
		}
		return nil
	})
	g.Nodes = growCap(g.Nodes, counts[1])
	g.Initializers = growCap(g.Initializers, counts[5])
	g.Inputs = growCap(g.Inputs, counts[11])
	g.Outputs = growCap(g.Outputs, counts[12])
	g.ValueInfo = growCap(g.ValueInfo, counts[13])
	return each(msg, b, func(f field) error {
		var err error
		var p []byte
		switch f.num {
		case 1:
			if p, err = bytesField(msg, "node", f); err != nil {
				return err
			}
			g.Nodes = append(g.Nodes, Node{})
			if err = d.node(p, &g.Nodes[len(g.Nodes)-1]); err != nil {
				return fmt.Errorf("%s.node[%d]: %w", msg, len(g.Nodes)-1, err)
			}
		case 2:
			g.Name, err = stringField(msg, "name", f)
		case 5:
			if p, err = bytesField(msg, "initializer", f); err != nil {
				return err
			}
			g.Initializers = append(g.Initializers, Tensor{})
			if err = d.tensor(p, &g.Initializers[len(g.Initializers)-1]); err != nil {
				return fmt.Errorf("%s.initializer[%d]: %w", msg, len(g.Initializers)-1, err)
			}
		case 11, 12, 13:
			name, dst := "input", &g.Inputs
			if f.num == 12 {
				name, dst = "output", &g.Outputs
			} else if f.num == 13 {
				name, dst = "value_info", &g.ValueInfo
			}
			if p, err = bytesField(msg, name, f); err != nil {
				return err
			}
			*dst = append(*dst, ValueInfo{})
			if err = d.valueInfo(p, &(*dst)[len(*dst)-1]); err != nil {
				return fmt.Errorf("%s.%s[%d]: %w", msg, name, len(*dst)-1, err)
			}
		case 15:
			if _, err = bytesField(msg, "sparse_initializer", f); err != nil {
				return err
			}
			g.SparseInitializers++
		}
		return err
	})
}

// NodeProto.

func (d *decoder) node(b []byte, n *Node) error {
	const msg = "NodeProto"
	return d.message(msg, b, func(f field) error {
		var err error
		var s string
		switch f.num {
		case 1:
			if s, err = stringField(msg, "input", f); err == nil {
				n.Inputs = append(n.Inputs, s)
			}
		case 2:
			if s, err = stringField(msg, "output", f); err == nil {
				n.Outputs = append(n.Outputs, s)
			}
		case 3:
			n.Name, err = stringField(msg, "name", f)
		case 4:
			n.OpType, err = stringField(msg, "op_type", f)
		case 7:
			n.Domain, err = stringField(msg, "domain", f)
		case 5:
			var p []byte
			if p, err = bytesField(msg, "attribute", f); err != nil {
				return err
			}
			n.Attributes = append(n.Attributes, Attribute{})
			if err = d.attribute(p, &n.Attributes[len(n.Attributes)-1]); err != nil {
				return fmt.Errorf("%s.attribute[%d]: %w", msg, len(n.Attributes)-1, err)
			}
		}
		return err
	})
}

// AttributeProto.

func (d *decoder) attribute(b []byte, a *Attribute) error {
	const msg = "AttributeProto"
	if err := d.enter(msg); err != nil {
		return err
	}
	defer d.leave()
	var typed bool
	var seen AttributeType // the value field seen last, for files without a type
	err := each(msg, b, func(f field) error {
		var err error
		var p []byte
		switch f.num {
		case 1:
			a.Name, err = stringField(msg, "name", f)
		case 20:
			var t int32
			if t, err = int32Field(msg, "type", f); err == nil {
				a.Type, typed = AttributeType(t), true
			}
		case 2:
			a.F, err = floatField(msg, "f", f)
			seen = AttrFloat
		case 3:
			a.I, err = int64Field(msg, "i", f)
			seen = AttrInt
		case 4:
			a.S, err = bytesField(msg, "s", f)
			seen = AttrString
		case 5:
			if p, err = bytesField(msg, "t", f); err != nil {
				return err
			}
			if a.T == nil {
				a.T = &Tensor{}
			}
			if err = d.tensor(p, a.T); err != nil {
				return fmt.Errorf("%s.t: %w", msg, err)
			}
			seen = AttrTensor
		case 6:
			if p, err = bytesField(msg, "g", f); err != nil {
				return err
			}
			if a.G == nil {
				a.G = &Graph{}
			}
			if err = d.graph(p, a.G); err != nil {
				return fmt.Errorf("%s.g: %w", msg, err)
			}
			seen = AttrGraph
		case 7:
			a.Floats, err = appendFloats(msg, "floats", a.Floats, f)
			seen = AttrFloats
		case 8:
			a.Ints, err = appendVarints(msg, "ints", a.Ints, f)
			seen = AttrInts
		case 9:
			if p, err = bytesField(msg, "strings", f); err == nil {
				a.Strings = append(a.Strings, p)
			}
			seen = AttrStrings
		case 10:
			if p, err = bytesField(msg, "tensors", f); err != nil {
				return err
			}
			a.Tensors = append(a.Tensors, Tensor{})
			if err = d.tensor(p, &a.Tensors[len(a.Tensors)-1]); err != nil {
				return fmt.Errorf("%s.tensors[%d]: %w", msg, len(a.Tensors)-1, err)
			}
			seen = AttrTensors
		case 11:
			if p, err = bytesField(msg, "graphs", f); err != nil {
				return err
			}
			g := &Graph{}
			if err = d.graph(p, g); err != nil {
				return fmt.Errorf("%s.graphs[%d]: %w", msg, len(a.Graphs), err)
			}
			a.Graphs = append(a.Graphs, g)
			seen = AttrGraphs
		case 22:
			_, err = bytesField(msg, "sparse_tensor", f)
			seen = AttrSparseTensor
		case 23:
			_, err = bytesField(msg, "sparse_tensors", f)
			seen = AttrSparseTensors
		case 14:
			_, err = bytesField(msg, "tp", f)
			seen = AttrTypeProto
		case 15:
			_, err = bytesField(msg, "type_protos", f)
			seen = AttrTypeProtos
		}
		return err
	})
	if err != nil {
		return err
	}
	if !typed {
		a.Type = seen
	}
	return nil
}

// TensorProto.

func (d *decoder) tensor(b []byte, t *Tensor) error {
	const msg = "TensorProto"
	if err := d.enter(msg); err != nil {
		return err
	}
	defer d.leave()
	err := each(msg, b, func(f field) error {
		var err error
		var p []byte
		switch f.num {
		case 1:
			t.Dims, err = appendVarints(msg, "dims", t.Dims, f)
		case 2:
			var v int32
			v, err = int32Field(msg, "data_type", f)
			t.DataType = DataType(v)
		case 3:
			if _, err = bytesField(msg, "segment", f); err == nil {
				t.Segmented = true
			}
		case 4:
			t.FloatData, err = appendFloats(msg, "float_data", t.FloatData, f)
		case 5:
			t.Int32Data, err = appendVarints(msg, "int32_data", t.Int32Data, f)
		case 6:
			if p, err = bytesField(msg, "string_data", f); err == nil {
				t.StringData = append(t.StringData, p)
			}
		case 7:
			t.Int64Data, err = appendVarints(msg, "int64_data", t.Int64Data, f)
		case 8:
			t.Name, err = stringField(msg, "name", f)
		case 9:
			t.RawData, err = bytesField(msg, "raw_data", f)
		case 10:
			t.DoubleData, err = appendDoubles(msg, "double_data", t.DoubleData, f)
		case 11:
			t.Uint64Data, err = appendVarints(msg, "uint64_data", t.Uint64Data, f)
		case 13:
			if p, err = bytesField(msg, "external_data", f); err != nil {
				return err
			}
			var kv StringPair
			if err = d.stringPair(p, &kv); err != nil {
				return fmt.Errorf("%s.external_data[%d]: %w", msg, len(t.ExternalData), err)
			}
			t.ExternalData = append(t.ExternalData, kv)
		case 14:
			var v int32
			v, err = int32Field(msg, "data_location", f)
			t.DataLocation = DataLocation(v)
		}
		return err
	})
	if err != nil {
		return err
	}
	if len(t.Dims) > MaxRank {
		return corruptf(msg, "dims", 1, "rank %d exceeds the limit of %d", len(t.Dims), MaxRank)
	}
	for i, v := range t.Dims {
		if v < 0 {
			return corruptf(msg, "dims", 1, "dimension %d is negative (%d)", i, v)
		}
	}
	return nil
}

// ValueInfoProto and TypeProto.

func (d *decoder) valueInfo(b []byte, v *ValueInfo) error {
	const msg = "ValueInfoProto"
	return d.message(msg, b, func(f field) error {
		var err error
		switch f.num {
		case 1:
			v.Name, err = stringField(msg, "name", f)
		case 2:
			var p []byte
			if p, err = bytesField(msg, "type", f); err != nil {
				return err
			}
			if err = d.typeProto(p, &v.Type); err != nil {
				return fmt.Errorf("%s.type: %w", msg, err)
			}
		}
		return err
	})
}

func (d *decoder) typeProto(b []byte, t *Type) error {
	const msg = "TypeProto"
	return d.message(msg, b, func(f field) error {
		var err error
		var p []byte
		switch f.num {
		case 1, 8:
			name := "tensor_type"
			t.Kind = TypeTensor
			if f.num == 8 {
				name, t.Kind = "sparse_tensor_type", TypeSparseTensor
			}
			if p, err = bytesField(msg, name, f); err != nil {
				return err
			}
			if err = d.tensorType(p, t); err != nil {
				return fmt.Errorf("%s.%s: %w", msg, name, err)
			}
		case 4:
			_, err = bytesField(msg, "sequence_type", f)
			t.Kind = TypeSequence
		case 5:
			_, err = bytesField(msg, "map_type", f)
			t.Kind = TypeMap
		case 9:
			_, err = bytesField(msg, "optional_type", f)
			t.Kind = TypeOptional
		}
		return err
	})
}

func (d *decoder) tensorType(b []byte, t *Type) error {
	const msg = "TypeProto.Tensor"
	return d.message(msg, b, func(f field) error {
		var err error
		switch f.num {
		case 1:
			var v int32
			v, err = int32Field(msg, "elem_type", f)
			t.ElemType = DataType(v)
		case 2:
			var p []byte
			if p, err = bytesField(msg, "shape", f); err != nil {
				return err
			}
			t.HasShape = true
			if err = d.shape(p, t); err != nil {
				return fmt.Errorf("%s.shape: %w", msg, err)
			}
		}
		return err
	})
}

func (d *decoder) shape(b []byte, t *Type) error {
	const msg = "TensorShapeProto"
	return d.message(msg, b, func(f field) error {
		if f.num != 1 {
			return nil
		}
		p, err := bytesField(msg, "dim", f)
		if err != nil {
			return err
		}
		if len(t.Shape) >= MaxRank {
			return corruptf(msg, "dim", 1, "rank exceeds the limit of %d", MaxRank)
		}
		var dim Dim
		if err := d.dim(p, &dim); err != nil {
			return fmt.Errorf("%s.dim[%d]: %w", msg, len(t.Shape), err)
		}
		t.Shape = append(t.Shape, dim)
		return nil
	})
}

func (d *decoder) dim(b []byte, dim *Dim) error {
	const msg = "TensorShapeProto.Dimension"
	return d.message(msg, b, func(f field) error {
		var err error
		switch f.num {
		case 1:
			dim.Value, err = int64Field(msg, "dim_value", f)
			dim.HasValue, dim.Param = true, ""
		case 2:
			dim.Param, err = stringField(msg, "dim_param", f)
			dim.HasValue, dim.Value = false, 0
		}
		return err
	})
}
