// Host/device code: KVS_HD marks a function that nvcc builds for both the GPU and the host, and the
// host C++ compiler builds as a plain inline function. The float arithmetic below rounds the same
// way on both sides (no multiply-add contraction on the device), so a rule written once with it
// gives the CPU decoder and the GPU decoder the same bits (common/half_rules.h,
// codec/fold_rules.h, codec/escape_rules.h; cuda/decode_core.h READ ME FIRST).
#pragma once

#include <stdint.h>

#ifndef KVS_HD
#if defined(__CUDACC__)
#define KVS_HD __host__ __device__ __forceinline__
#else
#define KVS_HD inline
#endif
#endif

namespace kvscope {
namespace hd {

KVS_HD float fmulRn(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

KVS_HD float faddRn(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

KVS_HD double dmulRn(double a, double b)
{
#if defined(__CUDA_ARCH__)
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

KVS_HD double daddRn(double a, double b)
{
#if defined(__CUDA_ARCH__)
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}

KVS_HD float d2fRn(double a)
{
#if defined(__CUDA_ARCH__)
    return __double2float_rn(a);
#else
    return float(a);
#endif
}

KVS_HD uint32_t floatBits(float f)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    return u;
#endif
}

KVS_HD float bitsFloat(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
#endif
}

}  // namespace hd
}  // namespace kvscope
