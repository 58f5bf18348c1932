package vulkan

import (
	_ "embed"
	"strings"
)

//go:generate sh shaders/gen.sh

// The device's own shader: the device-to-device copy CopyDtoD runs on the
// shader cores (shaders/copy.comp, compiled by shaders/gen.sh and
// committed, as package kernels/spirv's kernels are, so that building
// memwall needs no shader compiler). It is the device's, not a kernel's:
// no device package imports the kernels.
var (
	//go:embed shaders/copy.spv
	copyModule []byte
	//go:embed shaders/copy.sha256
	copySourceHash string
)

// copyEntry is the copy shader's entry point: memwall_copy_u32x4(dst, src
// Ptr, n uint64) copies n 16-byte vectors (both addresses 16-byte
// aligned), any grid, grid-stride.
const copyEntry = "memwall_copy_u32x4"

// copySourceSum returns the hash of shaders/copy.comp recorded when
// copy.spv was compiled.
func copySourceSum() string { return strings.TrimSpace(copySourceHash) }
