#!/bin/sh
# Compiles the GLSL compute kernels to SPIR-V with glslang and writes
# kernels.spv (the modules back to back; device/vulkan's LoadModule splits
# them) and sources.sha256 (the hash of the sources it was built from, which
# TestSourceHash holds). Run from this directory: go generate ./kernels/spirv
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# source:entry[:define], the define compiling one dtype of a shared source.
for k in fill:memwall_fill_u32 check:memwall_check_u32 spin:memwall_spin \
	matmul:memwall_matmul_bf16:DT_BF16 matmul:memwall_matmul_f16:DT_F16 matmul:memwall_matmul_f32:DT_F32; do
	src=${k%%:*}.comp
	rest=${k#*:}
	entry=${rest%%:*}
	def=""
	[ "$rest" = "$entry" ] || def="-D${rest#*:}"
	glslangValidator --target-env vulkan1.2 $def -e "$entry" --source-entrypoint main -o "$tmp/$entry.spv" "$src" >/dev/null
	spirv-val --target-env vulkan1.2 "$tmp/$entry.spv"
done
cat "$tmp/memwall_fill_u32.spv" "$tmp/memwall_check_u32.spv" "$tmp/memwall_spin.spv" \
	"$tmp/memwall_matmul_bf16.spv" "$tmp/memwall_matmul_f16.spv" "$tmp/memwall_matmul_f32.spv" >kernels.spv
cat pattern.glsl fill.comp check.comp spin.comp matmul.comp | sha256sum | cut -d' ' -f1 >sources.sha256
