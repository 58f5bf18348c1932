#version 460
// memwall_copy_u32x4(dst Ptr, src Ptr, n uint64): dst[i] = src[i] for the n
// 16-byte vectors i < n (both addresses 16-byte aligned, n < 2^32). Any grid;
// grid-stride loop. A device-to-device copy by the shader cores, which
// stream at memory bandwidth where the copy engines behind vkCmdCopyBuffer
// do not.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(buffer_reference, std430, buffer_reference_align = 16) writeonly buffer Dst { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer Src { uvec4 v[]; };
layout(push_constant, std430) uniform Args {
    Dst dst;
    Src src;
    uint64_t n;
} a;

void main() {
    uint64_t stride = uint64_t(gl_NumWorkGroups.x) * gl_WorkGroupSize.x;
    for (uint64_t i = gl_GlobalInvocationID.x; i < a.n; i += stride) {
        a.dst.v[uint(i)] = a.src.v[uint(i)];
    }
}
