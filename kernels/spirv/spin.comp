#version 460
// memwall_spin(nanoseconds uint64): one invocation spins until the device's
// real-time clock has advanced by nanoseconds (VK_KHR_shader_clock's
// device-scope clock, which counts nanoseconds on NVIDIA and Mesa).
#extension GL_EXT_shader_realtime_clock : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(push_constant, std430) uniform Args {
    uint64_t nanoseconds;
} a;

void main() {
    if (gl_GlobalInvocationID.x != 0 || gl_GlobalInvocationID.y != 0 || gl_GlobalInvocationID.z != 0) return;
    uint64_t start = clockRealtimeEXT();
    while (clockRealtimeEXT() - start < a.nanoseconds) {
    }
}
