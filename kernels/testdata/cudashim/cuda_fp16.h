#pragma once
struct __half {
    unsigned short x;
};
