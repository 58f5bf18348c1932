package kernels

import (
	"errors"
	"testing"

	"github.com/memwall/memwall/half"
)

func TestEncodeDecode(t *testing.T) {
	in := []float32{0, 1, -2.5, 3.140625, 1e-3, -65504}
	for _, dt := range DTypes() {
		t.Run(dt, func(t *testing.T) {
			b, err := Encode(dt, in)
			if err != nil {
				t.Fatal(err)
			}
			elt, _ := ElemSize(dt)
			if len(b) != len(in)*elt {
				t.Fatalf("Encode: %d bytes, want %d", len(b), len(in)*elt)
			}
			out, err := Decode(dt, b)
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range in {
				var want float32
				switch dt {
				case F32:
					want = v
				case BF16:
					want = half.BF16ToF32(half.F32ToBF16(v))
				case F16:
					want = half.F16ToF32(half.F32ToF16(v))
				}
				if out[i] != want {
					t.Errorf("element %d: %v -> %v, want %v", i, v, out[i], want)
				}
			}
			if _, err := Decode(dt, make([]byte, elt+1)); !errors.Is(err, ErrShape) {
				t.Errorf("Decode of %d bytes: err %v, want ErrShape", elt+1, err)
			}
		})
	}
	if _, err := Encode("fp8", in); !errors.Is(err, ErrDType) {
		t.Errorf("Encode(fp8): err %v, want ErrDType", err)
	}
	if _, err := Decode("int4", nil); !errors.Is(err, ErrDType) {
		t.Errorf("Decode(int4): err %v, want ErrDType", err)
	}
	// Little-endian layout, as the GPU reads it.
	b, _ := Encode(BF16, []float32{1})
	if b[0] != 0x80 || b[1] != 0x3F {
		t.Errorf("bf16(1) bytes % x, want 80 3f", b)
	}
}
