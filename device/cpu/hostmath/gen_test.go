package hostmath

import (
	"bytes"
	"os"
	"testing"

	"github.com/memwall/memwall/device/cpu/hostmath/internal/asmgen"
)

// TestGeneratedKernels checks that kernels_amd64.s and kernels_amd64.go are
// what internal/asmgen writes (go generate ./device/cpu/hostmath after a
// change to it), and that the VDPBF16PS encoder gives the bytes GNU as
// assembles for three register combinations.
func TestGeneratedKernels(t *testing.T) {
	asm, decl := asmgen.Generate()
	for name, want := range map[string][]byte{"kernels_amd64.s": asm, "kernels_amd64.go": decl} {
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from internal/asmgen's output: run go generate ./device/cpu/hostmath", name)
		}
	}
	for _, c := range []struct {
		dst, src1, src2 int
		want            string
	}{
		// as: vdpbf16ps %zmm1, %zmm28, %zmm0 → 62 f2 1e 40 52 c1, and so on.
		{0, 28, 1, "BYTE $0x62; BYTE $0xf2; BYTE $0x1e; BYTE $0x40; BYTE $0x52; BYTE $0xc1"},
		{17, 0, 31, "BYTE $0x62; BYTE $0x82; BYTE $0x7e; BYTE $0x48; BYTE $0x52; BYTE $0xcf"},
		{11, 10, 9, "BYTE $0x62; BYTE $0x52; BYTE $0x2e; BYTE $0x48; BYTE $0x52; BYTE $0xd9"},
	} {
		if got := asmgen.VDPBF16PS(c.dst, c.src1, c.src2); got != c.want {
			t.Errorf("VDPBF16PS(%d, %d, %d) = %s, want %s", c.dst, c.src1, c.src2, got, c.want)
		}
	}
}
