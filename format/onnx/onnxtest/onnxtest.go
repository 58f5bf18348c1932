// Package onnxtest encodes small ONNX models for tests: a graph of
// initializers, inline or in external data files, written with protowire the
// way exporters write them.
package onnxtest

import (
	"strconv"

	"google.golang.org/protobuf/encoding/protowire"
)

// Initializer is one TensorProto: external when Location is set (Length < 0
// leaves out the length entry), else inline RawData, or typed FloatData.
type Initializer struct {
	Name      string
	Dims      []int64
	DataType  int32
	RawData   []byte
	FloatData []float32
	Location  string
	Offset    int64
	Length    int64
}

// Tensor encodes a TensorProto.
func Tensor(in Initializer) []byte {
	var b []byte
	for _, d := range in.Dims {
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(d))
	}
	b = protowire.AppendTag(b, 2, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(in.DataType))
	for _, f := range in.FloatData {
		b = protowire.AppendTag(b, 4, protowire.Fixed32Type)
		b = protowire.AppendFixed32(b, uint32(int32(f)))
	}
	b = protowire.AppendTag(b, 8, protowire.BytesType)
	b = protowire.AppendString(b, in.Name)
	if in.RawData != nil {
		b = protowire.AppendTag(b, 9, protowire.BytesType)
		b = protowire.AppendBytes(b, in.RawData)
	}
	if in.Location != "" {
		kv := func(k, v string) {
			var e []byte
			e = protowire.AppendTag(e, 1, protowire.BytesType)
			e = protowire.AppendString(e, k)
			e = protowire.AppendTag(e, 2, protowire.BytesType)
			e = protowire.AppendString(e, v)
			b = protowire.AppendTag(b, 13, protowire.BytesType)
			b = protowire.AppendBytes(b, e)
		}
		kv("location", in.Location)
		kv("offset", strconv.FormatInt(in.Offset, 10))
		if in.Length >= 0 {
			kv("length", strconv.FormatInt(in.Length, 10))
		}
		b = protowire.AppendTag(b, 14, protowire.VarintType) // data_location = EXTERNAL
		b = protowire.AppendVarint(b, 1)
	}
	return b
}

// Model encodes a ModelProto (IR version 8) whose graph holds the
// initializers and no nodes.
func Model(inits []Initializer) []byte {
	var g []byte
	g = protowire.AppendTag(g, 2, protowire.BytesType)
	g = protowire.AppendString(g, "weights")
	for _, in := range inits {
		g = protowire.AppendTag(g, 5, protowire.BytesType)
		g = protowire.AppendBytes(g, Tensor(in))
	}
	var m []byte
	m = protowire.AppendTag(m, 1, protowire.VarintType)
	m = protowire.AppendVarint(m, 8)
	m = protowire.AppendTag(m, 7, protowire.BytesType)
	m = protowire.AppendBytes(m, g)
	return m
}
