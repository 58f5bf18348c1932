#!/usr/bin/env bash
# Compiles memwall's CUDA kernels (kernels/kernels.cu) to the PTX that the Go
# package kernels embeds (kernels/kernels.ptx).
#
#   scripts/build-ptx.sh [OUTPUT.ptx]   compile with nvcc (default output:
#                                       kernels/kernels.ptx)
#   scripts/build-ptx.sh --clang-check  syntax-check the device code with
#                                       clang and stand-in headers, for
#                                       machines without the CUDA toolkit
#                                       (writes nothing)
#
# PTX for compute_90 runs on Hopper (sm_90) and is JIT-compiled by the driver
# at load time (cuModuleLoadData). Set NVCC to use another compiler binary.
# A last comment line records the SHA-256 of kernels.cu, so a Go test can tell
# when the committed PTX is stale.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
src="$root/kernels/kernels.cu"

if [[ "${1:-}" == "--clang-check" ]]; then
	clang -x cuda --cuda-device-only --cuda-gpu-arch=sm_80 -nocudainc -nocudalib \
		-std=c++17 -O2 -Wall -Wextra -Wno-pass-failed \
		-I "$root/kernels/testdata/cudashim" -include cuda_shim.h \
		-S -o /dev/null "$src"
	echo "clang-check: $src OK"
	exit 0
fi

out="${1:-$root/kernels/kernels.ptx}"
"${NVCC:-nvcc}" -ptx -O3 -std=c++17 -arch=compute_90 -o "$out" "$src"
echo "// memwall kernels.cu sha256 $(sha256sum "$src" | cut -d' ' -f1)" >>"$out"
echo "wrote $out"
