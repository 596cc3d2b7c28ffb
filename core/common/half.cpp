#include "common/half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define KVSCOPE_X86 1
#endif

namespace kvscope {

#ifdef KVSCOPE_X86
namespace {

__attribute__((target("f16c,avx"))) void halfToFloatF16c(const uint16_t* in, float* out, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
    for (; i < n; ++i) out[i] = halfToFloat(in[i]);
}

__attribute__((target("f16c,avx"))) void floatToHalfF16c(const float* in, uint16_t* out, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; ++i) out[i] = floatToHalf(in[i]);
}

bool haveF16c()
{
    // CPUID leaf 1, ECX: F16C is bit 29 (gcc and clang both know bit_F16C; clang 14's
    // __builtin_cpu_supports does not accept "f16c").
    static const bool have = [] {
        unsigned a = 0, b = 0, c = 0, d = 0;
        return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) && __builtin_cpu_supports("avx");
    }();
    return have;
}

}  // namespace
#endif

void halfToFloatN(const uint16_t* in, float* out, size_t n)
{
#ifdef KVSCOPE_X86
    if (haveF16c()) return halfToFloatF16c(in, out, n);
#endif
    for (size_t i = 0; i < n; ++i) out[i] = halfToFloat(in[i]);
}

void floatToHalfN(const float* in, uint16_t* out, size_t n)
{
#ifdef KVSCOPE_X86
    if (haveF16c()) return floatToHalfF16c(in, out, n);
#endif
    for (size_t i = 0; i < n; ++i) out[i] = floatToHalf(in[i]);
}

}  // namespace kvscope
