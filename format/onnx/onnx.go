// Package onnx decodes ONNX model files (the ModelProto protobuf message)
// without generated code: the wire format is read field by field with
// google.golang.org/protobuf/encoding/protowire, and every length, count and
// nesting level is checked against the input before it is trusted.
//
// The decoder keeps what a memory planner and a weight streamer need: the
// graph (nodes, initializers, inputs, outputs, value_info), attributes
// (including subgraphs of If/Loop/Scan), tensor shapes and types, inline
// tensor data and external-data references. Fields it does not model
// (doc strings, training info, functions, quantization annotations, ...) are
// skipped after their wire encoding has been validated. Sparse initializers
// are not decoded; Graph.SparseInitializers counts them.
//
// Byte fields of the returned Model (Tensor.RawData, Tensor.StringData,
// Attribute.S, Attribute.Strings) alias the input buffer: the caller must not
// modify the buffer while the Model is in use. Everything else is copied.
package onnx

import (
	"fmt"
	"os"

	"github.com/memwall/memwall/format"
)

// ErrCorrupt is wrapped by every error Decode returns for malformed input:
// bad wire encoding, a wrong wire type for a known field, a length past the
// end of its message, nesting deeper than MaxDepth, or an invalid count. It is
// format.ErrCorrupt, so callers can test every parser's errors the same way.
var ErrCorrupt = format.ErrCorrupt

// Limits applied while decoding. They bound work and memory for hostile input;
// real models are far below them.
const (
	// MaxDepth is the deepest nesting of protobuf messages accepted. A graph
	// inside an attribute inside a node inside a graph costs four levels, so
	// this allows roughly a dozen levels of nested subgraphs.
	MaxDepth = 48
	// MaxGraphDepth is the deepest nesting of subgraphs (If/Loop/Scan bodies)
	// accepted; the top-level graph is depth 1.
	MaxGraphDepth = 12
	// MaxRank is the largest number of dimensions accepted for a tensor or a
	// value_info shape.
	MaxRank = 64
)

// DataType is an ONNX TensorProto.DataType code.
type DataType int32

// ONNX element types (TensorProto.DataType).
const (
	Undefined      DataType = 0
	Float          DataType = 1
	Uint8          DataType = 2
	Int8           DataType = 3
	Uint16         DataType = 4
	Int16          DataType = 5
	Int32          DataType = 6
	Int64          DataType = 7
	String         DataType = 8
	Bool           DataType = 9
	Float16        DataType = 10
	Double         DataType = 11
	Uint32         DataType = 12
	Uint64         DataType = 13
	Complex64      DataType = 14
	Complex128     DataType = 15
	BFloat16       DataType = 16
	Float8E4M3FN   DataType = 17
	Float8E4M3FNUZ DataType = 18
	Float8E5M2     DataType = 19
	Float8E5M2FNUZ DataType = 20
	Uint4          DataType = 21
	Int4           DataType = 22
	Float4E2M1     DataType = 23
	Float8E8M0     DataType = 24
	Uint2          DataType = 25
	Int2           DataType = 26
)

var dataTypeNames = [...]string{
	"UNDEFINED", "FLOAT", "UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64", "STRING", "BOOL",
	"FLOAT16", "DOUBLE", "UINT32", "UINT64", "COMPLEX64", "COMPLEX128", "BFLOAT16",
	"FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "UINT4", "INT4",
	"FLOAT4E2M1", "FLOAT8E8M0", "UINT2", "INT2",
}

// String returns the ONNX name of the type, or "DataType(n)" for codes this
// package does not know.
func (d DataType) String() string {
	if d >= 0 && int(d) < len(dataTypeNames) {
		return dataTypeNames[d]
	}
	return fmt.Sprintf("DataType(%d)", int32(d))
}

// AttributeType is an ONNX AttributeProto.AttributeType code.
type AttributeType int32

// Attribute kinds (AttributeProto.AttributeType).
const (
	AttrUndefined     AttributeType = 0
	AttrFloat         AttributeType = 1
	AttrInt           AttributeType = 2
	AttrString        AttributeType = 3
	AttrTensor        AttributeType = 4
	AttrGraph         AttributeType = 5
	AttrFloats        AttributeType = 6
	AttrInts          AttributeType = 7
	AttrStrings       AttributeType = 8
	AttrTensors       AttributeType = 9
	AttrGraphs        AttributeType = 10
	AttrSparseTensor  AttributeType = 11
	AttrSparseTensors AttributeType = 12
	AttrTypeProto     AttributeType = 13
	AttrTypeProtos    AttributeType = 14
)

// DataLocation says where a tensor's bytes are (TensorProto.DataLocation).
type DataLocation int32

// Tensor data locations.
const (
	LocationDefault  DataLocation = 0 // inline: raw_data or a typed *_data field
	LocationExternal DataLocation = 1 // described by Tensor.ExternalData
)

// Model is a decoded ModelProto.
type Model struct {
	IRVersion       int64
	OpsetImports    []OpsetID
	ProducerName    string
	ProducerVersion string
	Domain          string
	ModelVersion    int64
	Metadata        []StringPair // metadata_props, in file order
	// Graph is the main graph. Decode fails if the file has none.
	Graph *Graph
}

// OpsetID is one opset_import entry. An empty Domain means the default
// "ai.onnx" operator set.
type OpsetID struct {
	Domain  string
	Version int64
}

// StringPair is a StringStringEntryProto (metadata and external_data entries).
type StringPair struct {
	Key   string
	Value string
}

// Opset returns the imported version of the operator set for domain, treating
// "" and "ai.onnx" as the same domain. It returns 0 when the domain is not
// imported.
func (m *Model) Opset(domain string) int64 {
	if domain == "ai.onnx" {
		domain = ""
	}
	var v int64
	for _, o := range m.OpsetImports {
		d := o.Domain
		if d == "ai.onnx" {
			d = ""
		}
		if d == domain && o.Version > v {
			v = o.Version
		}
	}
	return v
}

// Graph is a decoded GraphProto. Nodes are in file order, which the ONNX
// specification requires to be topological; Decode does not verify that.
type Graph struct {
	Name         string
	Nodes        []Node
	Initializers []Tensor
	// SparseInitializers counts sparse_initializer entries, which are skipped.
	SparseInitializers int
	Inputs             []ValueInfo
	Outputs            []ValueInfo
	ValueInfo          []ValueInfo
}

// Node is a decoded NodeProto. An empty string in Inputs marks an omitted
// optional input.
type Node struct {
	Name       string
	OpType     string
	Domain     string
	Inputs     []string
	Outputs    []string
	Attributes []Attribute
}

// Attr returns the node's attribute called name, or nil if it has none.
// The pointer refers into n.Attributes.
func (n *Node) Attr(name string) *Attribute {
	for i := range n.Attributes {
		if n.Attributes[i].Name == name {
			return &n.Attributes[i]
		}
	}
	return nil
}

// Attribute is a decoded AttributeProto. Type says which value field is in
// use; for files that omit it (IR version 1), Decode infers it from the field
// present. Sparse-tensor and type-proto attributes are recognized by Type
// but their values are not decoded.
type Attribute struct {
	Name    string
	Type    AttributeType
	F       float32
	I       int64
	S       []byte
	T       *Tensor
	G       *Graph
	Floats  []float32
	Ints    []int64
	Strings [][]byte
	Tensors []Tensor
	Graphs  []*Graph
}

// Tensor is a decoded TensorProto. At most one of the data fields is normally
// set; for external tensors (DataLocation == LocationExternal) none is, and
// ExternalData describes where the bytes are.
type Tensor struct {
	Name         string
	Dims         []int64
	DataType     DataType
	RawData      []byte
	FloatData    []float32
	Int32Data    []int32
	StringData   [][]byte
	Int64Data    []int64
	DoubleData   []float64
	Uint64Data   []uint64
	ExternalData []StringPair
	DataLocation DataLocation
	// Segmented is set when the tensor carries a segment field (a chunk of a
	// larger tensor); the segment bounds are not kept.
	Segmented bool
}

// ValueInfo is a decoded ValueInfoProto: a named value and its type.
type ValueInfo struct {
	Name string
	Type Type
}

// TypeKind says which member of TypeProto's oneof is set.
type TypeKind int

// Type kinds.
const (
	TypeUnknown      TypeKind = iota // no value set, or a kind this package does not model
	TypeTensor                       // tensor_type
	TypeSequence                     // sequence_type (element type not kept)
	TypeMap                          // map_type (key/value types not kept)
	TypeOptional                     // optional_type (element type not kept)
	TypeSparseTensor                 // sparse_tensor_type
)

// Type is a decoded TypeProto. ElemType and the shape are set for tensor and
// sparse-tensor types only. HasShape distinguishes "rank unknown" (false)
// from a scalar (true, empty Shape).
type Type struct {
	Kind     TypeKind
	ElemType DataType
	HasShape bool
	Shape    []Dim
}

// Dim is one TensorShapeProto.Dimension: a concrete Value (when HasValue), a
// symbolic Param, or neither (unknown).
type Dim struct {
	Value    int64
	Param    string
	HasValue bool
}

// Static returns the shape as concrete dimensions, and false if the type has
// no shape or any dimension is symbolic, unknown or negative.
func (t Type) Static() ([]int64, bool) {
	if t.Kind != TypeTensor || !t.HasShape {
		return nil, false
	}
	out := make([]int64, len(t.Shape))
	for i, d := range t.Shape {
		if !d.HasValue || d.Value < 0 {
			return nil, false
		}
		out[i] = d.Value
	}
	return out, true
}

// ReadFile reads and decodes the ONNX model at path. Errors name the file;
// decoding errors wrap ErrCorrupt.
func ReadFile(path string) (*Model, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("onnx: %w", err)
	}
	m, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("onnx %s: %w", path, err)
	}
	return m, nil
}
