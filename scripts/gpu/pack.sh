#!/usr/bin/env bash
# Builds the GPU binaries (scripts/gpu-build.sh) and packs them into
# gpupack/bin.tar.xz, small enough to travel with the working tree.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-gpubin} scripts/gpu-build.sh >/dev/null
mkdir -p gpupack
tar -cJf gpupack/bin.tar.xz "${BIN:-gpubin}"
ls -la gpupack/bin.tar.xz
