#pragma once
struct __nv_bfloat16 {
    unsigned short x;
};
