#version 460
// memwall_check_u32(src Ptr, n uint64, seed uint32, mismatches Ptr):
// *mismatches += number of i < n with src[i] != pattern(seed, i). The count
// is a 64-bit word; its low half is added to atomically (counts below 2^32).
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_GOOGLE_include_directive : require
#include "pattern.glsl"

layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer Words { uint w[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) buffer Count { uint lo; uint hi; };
layout(push_constant, std430) uniform Args {
    Words src;
    uint64_t n;
    uint seed;
    Count mismatches;
} a;

void main() {
    uint64_t stride = uint64_t(gl_NumWorkGroups.x) * gl_WorkGroupSize.x;
    uint bad = 0;
    for (uint64_t i = gl_GlobalInvocationID.x; i < a.n; i += stride) {
        if (a.src.w[uint(i)] != pattern(a.seed, i)) bad++;
    }
    if (bad != 0) atomicAdd(a.mismatches.lo, bad);
}
