#version 460
// memwall_matmul_{bf16,f16,f32}(W Ptr, X Ptr, Y Ptr, M, K, T uint32):
// Y[t*M + m] = sum over k < K of W[m*K + k] * X[t*K + k], W (M×K) and X
// (T×K) row-major in the entry's dtype, Y (T×M) row-major float32,
// accumulated in float32: package kernels' Matmul. W and X are aligned to
// their element, Y to 4 bytes; T*M and M*K below 2^32. Launched with
// blocks of 64 invocations (specialization constant 0), any grid: each
// block takes outputs in turn (grid-stride), its invocations stride over k
// and add their partial sums in shared memory. One source, compiled once
// per dtype with DT_BF16, DT_F16 or DT_F32 defined (gen.sh).
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer Words { uint w[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) writeonly buffer Floats { float f[]; };
layout(push_constant, std430) uniform Args {
    uint64_t W;
    uint64_t X;
    Floats Y;
    uint M;
    uint K;
    uint T;
} a;

const uint lanes = 64;
shared float part[lanes];

// elem is element i of the array at byte address base.
float elem(uint64_t base, uint i) {
#if defined(DT_F32)
    return uintBitsToFloat(Words(base).w[i]);
#else
    // 16-bit elements: read the 32-bit word holding element i of an array
    // that may start halfway into a word.
    uint j = i + uint((base & 3ul) >> 1);
    uint word = Words(base & ~3ul).w[j >> 1];
    uint h = (j & 1u) == 0u ? (word & 0xFFFFu) : (word >> 16);
#if defined(DT_BF16)
    return uintBitsToFloat(h << 16);
#else
    return unpackHalf2x16(h).x;
#endif
#endif
}

void main() {
    uint lane = gl_LocalInvocationID.x;
    uint n = a.T * a.M;
    for (uint o = gl_WorkGroupID.x; o < n; o += gl_NumWorkGroups.x) {
        uint t = o / a.M;
        uint m = o - t * a.M;
        float s = 0.0;
        for (uint k = lane; k < a.K; k += lanes) {
            s += elem(a.W, m * a.K + k) * elem(a.X, t * a.K + k);
        }
        part[lane] = s;
        barrier();
        for (uint h = lanes / 2; h > 0; h >>= 1) {
            if (lane < h) part[lane] += part[lane + h];
            barrier();
        }
        if (lane == 0) a.Y.f[o] = part[0];
        barrier();
    }
}
