package onnx

import (
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

func TestNumElements(t *testing.T) {
	cases := []struct {
		dims    []int64
		want    int64
		wantErr string
	}{
		{nil, 1, ""},
		{[]int64{2, 3, 4}, 24, ""},
		{[]int64{0, 1 << 62}, 0, ""},
		{[]int64{-1, 2}, 0, "negative"},
		{[]int64{1 << 30, 1 << 30}, 0, "more than"},
		{[]int64{1 << 62, 1 << 62, 4}, 0, "more than"},
	}
	for _, c := range cases {
		n, err := NumElements(c.dims)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("NumElements(%v) = %d, %v; want error %q", c.dims, n, err, c.wantErr)
			}
			continue
		}
		if err != nil || n != c.want {
			t.Errorf("NumElements(%v) = %d, %v; want %d", c.dims, n, err, c.want)
		}
	}
}

func TestTensorValues(t *testing.T) {
	raw := func(bs ...byte) []byte { return bs }
	f32 := make([]byte, 8)
	binary.LittleEndian.PutUint32(f32, math.Float32bits(0.5))
	binary.LittleEndian.PutUint32(f32[4:], math.Float32bits(-3))
	cases := []struct {
		name    string
		t       Tensor
		ints    []int64
		floats  []float64
		wantErr string
	}{
		{"int64 field", Tensor{Dims: []int64{3}, DataType: Int64, Int64Data: []int64{1, -2, 3}},
			[]int64{1, -2, 3}, []float64{1, -2, 3}, ""},
		{"int8 raw", Tensor{Dims: []int64{2}, DataType: Int8, RawData: raw(0xff, 7)},
			[]int64{-1, 7}, []float64{-1, 7}, ""},
		{"uint16 raw", Tensor{Dims: []int64{1}, DataType: Uint16, RawData: raw(0xff, 0xff)},
			[]int64{65535}, []float64{65535}, ""},
		{"int32 raw", Tensor{Dims: []int64{1}, DataType: Int32, RawData: raw(0xfe, 0xff, 0xff, 0xff)},
			[]int64{-2}, []float64{-2}, ""},
		{"bool int32 field", Tensor{Dims: []int64{2}, DataType: Bool, Int32Data: []int32{1, 0}},
			[]int64{1, 0}, []float64{1, 0}, ""},
		{"uint64 field", Tensor{Dims: []int64{1}, DataType: Uint64, Uint64Data: []uint64{9}},
			[]int64{9}, []float64{9}, ""},
		{"scalar", Tensor{DataType: Int64, Int64Data: []int64{5}}, []int64{5}, []float64{5}, ""},
		{"empty", Tensor{Dims: []int64{0}, DataType: Int64}, []int64{}, []float64{}, ""},
		{"float raw", Tensor{Dims: []int64{2}, DataType: Float, RawData: f32}, nil, []float64{0.5, -3}, "not an integer type"},
		{"float16 raw", Tensor{Dims: []int64{2}, DataType: Float16, RawData: raw(0x00, 0x3c, 0x00, 0xc0)},
			nil, []float64{1, -2}, "not an integer type"},
		{"bfloat16 field", Tensor{Dims: []int64{1}, DataType: BFloat16, Int32Data: []int32{0x3f80}},
			nil, []float64{1}, "not an integer type"},
		{"double field", Tensor{Dims: []int64{1}, DataType: Double, DoubleData: []float64{2.5}},
			nil, []float64{2.5}, "not an integer type"},
		{"raw too short", Tensor{Dims: []int64{2}, DataType: Int64, RawData: raw(1, 2, 3)}, nil, nil, "raw_data holds 3 bytes"},
		{"field count mismatch", Tensor{Dims: []int64{3}, DataType: Int64, Int64Data: []int64{1}}, nil, nil, "holds 1 values"},
		{"wrong field for type", Tensor{Dims: []int64{1}, DataType: Int64, Int32Data: []int32{1}}, nil, nil, "no inline data"},
		{"external", Tensor{Dims: []int64{1}, DataType: Int64, DataLocation: LocationExternal}, nil, nil, "no inline data"},
		{"string", Tensor{Dims: []int64{1}, DataType: String, StringData: [][]byte{[]byte("a")}}, nil, nil, "not supported"},
		{"huge dims", Tensor{Dims: []int64{1 << 40, 1 << 40}, DataType: Int8, RawData: raw(1)}, nil, nil, "more than"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ints, err := c.t.Int64s()
			switch {
			case c.ints != nil:
				if err != nil || !reflect.DeepEqual(ints, c.ints) {
					t.Errorf("Int64s = %v, %v; want %v", ints, err, c.ints)
				}
			case err == nil || !strings.Contains(err.Error(), c.wantErr):
				t.Errorf("Int64s = %v, %v; want error %q", ints, err, c.wantErr)
			}
			fs, err := c.t.Float64s()
			switch {
			case c.floats != nil:
				if err != nil || !reflect.DeepEqual(fs, c.floats) {
					t.Errorf("Float64s = %v, %v; want %v", fs, err, c.floats)
				}
			case err == nil:
				t.Errorf("Float64s = %v; want an error", fs)
			}
		})
	}
	_, err := (&Tensor{DataType: Int64}).Int64s()
	if !errors.Is(err, ErrNoData) {
		t.Errorf("scalar without data: %v, want ErrNoData", err)
	}
}

func TestExternal(t *testing.T) {
	ext := func(kv ...string) *Tensor {
		t := &Tensor{Name: "w", DataLocation: LocationExternal}
		for i := 0; i+1 < len(kv); i += 2 {
			t.ExternalData = append(t.ExternalData, StringPair{kv[i], kv[i+1]})
		}
		return t
	}
	cases := []struct {
		name    string
		t       *Tensor
		want    *External
		wantErr string
	}{
		{"inline", &Tensor{}, nil, ""},
		{"full", ext("location", "a.bin", "offset", "8", "length", "16", "checksum", "ab"),
			&External{Location: "a.bin", Offset: 8, Length: 16, HasLength: true, Checksum: "ab"}, ""},
		{"location only", ext("location", "a.bin"), &External{Location: "a.bin"}, ""},
		{"no location", ext("offset", "0"), nil, "without a location"},
		{"bad offset", ext("location", "a", "offset", "x"), nil, `offset "x"`},
		{"negative length", ext("location", "a", "length", "-1"), nil, `length "-1"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, err := c.t.External()
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("External = %+v, %v; want error %q", e, err, c.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(e, c.want) {
				t.Fatalf("External = %+v, %v; want %+v", e, err, c.want)
			}
		})
	}
}

func TestDataTypeBits(t *testing.T) {
	want := map[DataType]int{Float: 32, Float16: 16, BFloat16: 16, Double: 64, Int8: 8, Int64: 64, Bool: 8,
		Complex64: 64, Complex128: 128, Float8E4M3FN: 8, Float8E5M2FNUZ: 8, Int4: 4, Uint4: 4, Float4E2M1: 4,
		Int2: 2, Uint2: 2, String: 0, Undefined: 0, DataType(99): 0}
	for d, bits := range want {
		if d.Bits() != bits {
			t.Errorf("%v.Bits() = %d, want %d", d, d.Bits(), bits)
		}
	}
	if Float.String() != "FLOAT" || DataType(99).String() != "DataType(99)" || Int2.String() != "INT2" {
		t.Error("DataType.String")
	}
}
