#!/usr/bin/env bash
# Compiles memwall's CUDA kernels (kernels/kernels.cu) to the three PTX
# modules that the Go package kernels embeds (gzip-compressed, .ptx.gz):
#
#   kernels/kernels_sm90.ptx  compute_90: compute_80's kernels plus
#                             programmatic dependent launch (griddepcontrol)
#                             and L2 prefetch of GEMV weights; Hopper and newer
#   kernels/kernels_sm80.ptx  compute_80: bf16/f16 tensor cores (WMMA),
#                             cp.async; Ampere, Ada, Hopper, Blackwell
#   kernels/kernels_sm70.ptx  compute_70: no bf16 hardware (bf16 by bit
#                             manipulation), every GEMM on CUDA cores; Volta,
#                             Turing
#
#   scripts/build-ptx.sh [OUTDIR]       compile with nvcc (default OUTDIR:
#                                       kernels/), write kernels_smNN.ptx.gz
#   scripts/build-ptx.sh FILE.ptx       compile one module, compute_$ARCH
#                                       (default 80; ARCH=90 for Hopper), into
#                                       FILE.ptx (for MEMWALL_KERNELS_PTX)
#   scripts/build-ptx.sh --clang-check  syntax-check the device code with
#                                       clang and stand-in headers, for
#                                       machines without the CUDA toolkit
#                                       (writes nothing)
#
# The driver JIT-compiles the PTX for the GPU at hand at load time
# (cuModuleLoadData); PTX for an older target runs on every newer GPU. Set
# NVCC to use another compiler binary and NVCC_FLAGS to add flags (e.g.
# "-ccbin clang-14" where nvcc refuses the system gcc). A last comment line
# records the SHA-256 of kernels.cu, so a Go test can tell when the committed
# PTX is stale.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$root/kernels/kernels.cu"

if [[ "${1:-}" == "--clang-check" ]]; then
	# (clang 14 knows no sm_90: the compute_90-only code is two asm blocks.)
	for arch in sm_80 sm_70; do
		clang -x cuda --cuda-device-only --cuda-gpu-arch=$arch -nocudainc -nocudalib \
			-std=c++17 -O2 -Wall -Wextra -Wno-pass-failed \
			-I "$root/kernels/testdata/cudashim" -include cuda_shim.h \
			-S -o /dev/null "$src"
	done
	echo "clang-check: $src OK"
	exit 0
fi

sum="$(sha256sum "$src" | cut -d' ' -f1)"
if [[ "${1:-}" == *.ptx ]]; then
	"${NVCC:-nvcc}" ${NVCC_FLAGS:-} -ptx -O3 -std=c++17 -arch=compute_${ARCH:-80} -o "$1" "$src"
	echo "// memwall kernels.cu sha256 $sum" >>"$1"
	echo "wrote $1"
	exit 0
fi
outdir="${1:-$root/kernels}"
# compute_70 is no longer built: nvcc 13 dropped it, and kernels_sm70.ptx.gz
# stays the module built on 2026-12-01 (kernels/testdata/sm70-source.sha256
# records its source), without the quantized products.
for arch in ${ARCHS:-90 80}; do
	out="$outdir/kernels_sm$arch.ptx"
	# shellcheck disable=SC2086 # NVCC_FLAGS is a list of flags
	"${NVCC:-nvcc}" ${NVCC_FLAGS:-} -ptx -O3 -std=c++17 -arch=compute_$arch -o "$out" "$src"
	echo "// memwall kernels.cu sha256 $sum" >>"$out"
	# -n: no name or time stamp, so the same PTX gives the same bytes.
	gzip -n -9 -f "$out"
	echo "wrote $out.gz"
done
