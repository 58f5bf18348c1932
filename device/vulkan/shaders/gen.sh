#!/bin/sh
# Compiles device/vulkan's own compute shader, the device-to-device copy
# (memwall_copy_u32x4), to SPIR-V with glslang and writes copy.spv and
# copy.sha256 (the hash of the source it was built from, which
# TestCopyShaderSource holds). Run by go generate ./device/vulkan.
set -eu
cd "$(dirname "$0")"
glslangValidator --target-env vulkan1.2 -e memwall_copy_u32x4 --source-entrypoint main -o copy.spv copy.comp >/dev/null
spirv-val --target-env vulkan1.2 copy.spv
sha256sum copy.comp | cut -d' ' -f1 >copy.sha256
