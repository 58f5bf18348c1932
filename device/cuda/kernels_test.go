package cuda

import (
	"testing"
	"unsafe"
)

// The cuLaunchKernelEx structures must match cuda.h's layout on 64-bit
// platforms: CUlaunchConfig is seven unsigned ints, the CUstream at 32, the
// attribute pointer at 40, numAttrs at 48 (56 bytes with tail padding);
// CUlaunchAttribute is the 4-byte id, 4 bytes of padding and the 64-byte
// value union (72 bytes).
func TestLaunchExLayout(t *testing.T) {
	var c launchConfig
	var a launchAttribute
	for _, f := range []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof(CUlaunchConfig)", unsafe.Sizeof(c), 56},
		{"offsetof(sharedMemBytes)", unsafe.Offsetof(c.sharedBytes), 24},
		{"offsetof(hStream)", unsafe.Offsetof(c.stream), 32},
		{"offsetof(attrs)", unsafe.Offsetof(c.attrs), 40},
		{"offsetof(numAttrs)", unsafe.Offsetof(c.numAttrs), 48},
		{"sizeof(CUlaunchAttribute)", unsafe.Sizeof(a), 72},
		{"offsetof(value)", unsafe.Offsetof(a.value), 8},
	} {
		if f.got != f.want {
			t.Errorf("%s = %d, want %d", f.name, f.got, f.want)
		}
	}
}

// Arguments pack into 8-byte slots with the parameter array pointing at
// them; an unsupported type is refused.
func TestPackParams(t *testing.T) {
	kp, err := packParams([]any{uint32(7), float32(1.5), uint64(1 << 40), int(-2)})
	if err != nil {
		t.Fatal(err)
	}
	if len(kp.params) != 5 || *(*uint32)(kp.params[0]) != 7 || *(*float32)(kp.params[1]) != 1.5 ||
		*(*uint64)(kp.params[2]) != 1<<40 || *(*int32)(kp.params[3]) != -2 {
		t.Errorf("packed %v", kp.slots)
	}
	if _, err := packParams([]any{"x"}); err == nil {
		t.Error("a string argument was accepted")
	}
}
