package vulkan

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"os"
	"slices"
	"testing"
)

// TestCopyShaderSource fails when shaders/copy.comp changed after copy.spv
// was compiled: run go generate ./device/vulkan (glslang and spirv-tools).
func TestCopyShaderSource(t *testing.T) {
	src, err := os.ReadFile("shaders/copy.comp")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(src)
	if got, want := hex.EncodeToString(sum[:]), copySourceSum(); got != want {
		t.Fatalf("shaders/copy.comp hashes to %s, copy.spv was built from %s: run go generate ./device/vulkan", got, want)
	}
}

// TestCopyShaderModule checks the committed SPIR-V: one whole module with
// the header's magic, defining exactly the copy's entry point.
func TestCopyShaderModule(t *testing.T) {
	if len(copyModule) < 20 || binary.LittleEndian.Uint32(copyModule) != spirvMagic {
		t.Fatal("shaders/copy.spv does not start with the SPIR-V magic number")
	}
	mods, entries, err := SplitSPIRV(copyModule)
	if err != nil {
		t.Fatal(err)
	}
	if len(mods) != 1 || !slices.Equal(entries[0], []string{copyEntry}) {
		t.Fatalf("copy.spv holds %d modules with entry points %q, want one module defining %s", len(mods), entries, copyEntry)
	}
}
