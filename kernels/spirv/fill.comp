#version 460
// memwall_fill_u32(dst Ptr, n uint64, seed uint32): dst[i] = pattern(seed, i)
// for i < n. Any grid; grid-stride loop. The block shape is specialization
// constants 0-2, bound by device/vulkan from Launch's block.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_GOOGLE_include_directive : require
#include "pattern.glsl"

layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(buffer_reference, std430, buffer_reference_align = 4) writeonly buffer Words { uint w[]; };
layout(push_constant, std430) uniform Args {
    Words dst;
    uint64_t n;
    uint seed;
} a;

void main() {
    uint64_t stride = uint64_t(gl_NumWorkGroups.x) * gl_WorkGroupSize.x;
    for (uint64_t i = gl_GlobalInvocationID.x; i < a.n; i += stride) {
        a.dst.w[uint(i)] = pattern(a.seed, i);
    }
}
