package spirv_test

import (
	"encoding/binary"
	"os"
	"slices"
	"testing"

	"github.com/memwall/memwall/device/vulkan"
	"github.com/memwall/memwall/kernels/spirv"
)

// TestSourceHash fails when a GLSL source changed after kernels.spv was
// compiled: run go generate ./kernels/spirv (glslang and spirv-tools).
func TestSourceHash(t *testing.T) {
	got, err := spirv.HashSources(os.DirFS("."))
	if err != nil {
		t.Fatal(err)
	}
	if want := spirv.SourcesHash(); got != want {
		t.Fatalf("the GLSL sources hash to %s, kernels.spv was built from %s: run go generate ./kernels/spirv", got, want)
	}
}

// TestModule checks the committed SPIR-V: whole modules with the header's
// magic, each defining exactly the kernel it is named for.
func TestModule(t *testing.T) {
	m := spirv.Module()
	if len(m) == 0 || binary.LittleEndian.Uint32(m) != 0x07230203 {
		t.Fatal("kernels.spv does not start with the SPIR-V magic number")
	}
	mods, entries, err := vulkan.SplitSPIRV(m)
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for i := range mods {
		if len(entries[i]) != 1 {
			t.Errorf("module %d has entry points %q, want one", i, entries[i])
		}
		all = append(all, entries[i]...)
	}
	if !slices.Equal(all, spirv.Names()) {
		t.Errorf("entry points %q, want %q", all, spirv.Names())
	}
}

// TestSplitRejects feeds SplitSPIRV bytes that are not SPIR-V.
func TestSplitRejects(t *testing.T) {
	m := spirv.Module()
	for name, b := range map[string][]byte{
		"empty":     nil,
		"odd":       m[:len(m)-1],
		"truncated": m[:len(m)-4],
		"bad magic": append([]byte{1, 2, 3, 4}, m[4:]...),
		"header":    m[:12],
	} {
		if _, _, err := vulkan.SplitSPIRV(b); err == nil {
			t.Errorf("%s: SplitSPIRV accepted %d bytes", name, len(b))
		}
	}
}
