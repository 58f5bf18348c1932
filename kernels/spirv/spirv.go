// Package spirv holds memwall's Vulkan compute kernels: GLSL sources in this
// directory compiled by glslang (gen.sh) into SPIR-V that is committed, as
// the PTX is, so that building memwall needs no shader compiler.
//
// Quick start, with d a *vulkan.Device:
//
//	m, err := d.LoadModule(spirv.Module())
//	f, err := d.Function(m, spirv.NameFill)
//	err = d.Launch(f, grid, block, 0, s, dst, uint64(words), seed)
//
// The kernels follow the specifications of the CUDA ones in package kernels:
// memwall_fill_u32(dst Ptr, n uint64, seed uint32) writes kernels.Pattern;
// memwall_check_u32(src Ptr, n uint64, seed uint32, mismatches Ptr) adds the
// number of words that differ from it to a 64-bit counter; memwall_spin(ns
// uint64) keeps one invocation busy (it needs VK_KHR_shader_clock);
// memwall_matmul_<dtype> is kernels' Matmul (see MatmulName). The copy
// shader behind device/vulkan's device-to-device copies is the device's
// own (device/vulkan/shaders), so that no device package stands on this
// one.
package spirv

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"io/fs"
	"strings"
)

//go:generate sh gen.sh

// Kernel entry point names.
const (
	NameFill  = "memwall_fill_u32"
	NameCheck = "memwall_check_u32"
	NameSpin  = "memwall_spin"
)

// MatmulName is the entry point of the matrix product in dtype ("bf16",
// "f16", "f32"): memwall_matmul_<dtype>(W, X, Y Ptr, M, K, T uint32)
// computes Y[t, m] = Σ_k W[m, k]·X[t, k] as package kernels' Matmul does
// (float32 Y, accumulated in float32), launched with blocks of
// MatmulBlock invocations on any grid.
func MatmulName(dtype string) string { return "memwall_matmul_" + dtype }

// MatmulBlock is the block size the matmul kernels are written for.
const MatmulBlock = 64

// MatmulDTypes are the dtypes of the matmul kernels.
var MatmulDTypes = []string{"bf16", "f16", "f32"}

//go:embed kernels.spv
var module []byte

//go:embed sources.sha256
var sourcesHash string

// Module returns the compiled kernels: SPIR-V modules back to back, one per
// kernel, as device/vulkan's LoadModule takes them. The slice is shared:
// do not modify it.
func Module() []byte { return module }

// Names lists the kernels Module holds.
func Names() []string {
	names := []string{NameFill, NameCheck, NameSpin}
	for _, dt := range MatmulDTypes {
		names = append(names, MatmulName(dt))
	}
	return names
}

// Sources are the GLSL files Module was compiled from, in the order their
// hash covers them.
var Sources = []string{"pattern.glsl", "fill.comp", "check.comp", "spin.comp", "matmul.comp"}

// SourcesHash returns the hash recorded when Module was compiled.
func SourcesHash() string { return strings.TrimSpace(sourcesHash) }

// HashSources hashes the sources as gen.sh does (their concatenation), read
// from fsys (the directory holding them).
func HashSources(fsys fs.FS) (string, error) {
	h := sha256.New()
	for _, name := range Sources {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return "", err
		}
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
