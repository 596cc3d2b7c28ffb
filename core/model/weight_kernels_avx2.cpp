// The AVX2 weight kernels (weight_kernels.h): 8 float lanes, two conversions per 16 values. The
// target pragma covers only this file's own code, after every include, so the file builds without
// -mavx2 and its code runs only when the dispatcher (weight_kernels.cpp) has checked the CPU.
#include "model/weight_kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include "common/error.h"
#include "modelio/ggml_quants.h"

#include <immintrin.h>

#include <cstring>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace kvscope::detail {

namespace {

struct Isa {
    using Vec = __m256;
    static Vec zero() { return _mm256_setzero_ps(); }
    static Vec mul16(__m128i q, const float* x)
    {
        const __m256 a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
        const __m256 b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
        return _mm256_fmadd_ps(b, _mm256_loadu_ps(x + 8), _mm256_mul_ps(a, _mm256_loadu_ps(x)));
    }
    static Vec fma16(__m128i q, const float* x, Vec acc)
    {
        const __m256 a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
        const __m256 b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
        return _mm256_fmadd_ps(b, _mm256_loadu_ps(x + 8), _mm256_fmadd_ps(a, _mm256_loadu_ps(x), acc));
    }
    static Vec scaleAdd(Vec p, float s, Vec acc) { return _mm256_fmadd_ps(p, _mm256_set1_ps(s), acc); }
    static float hsum(Vec v)
    {
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        return _mm_cvtss_f32(s);
    }
};

#include "model/weight_kernels_x86.h"

}  // namespace

void packedRowsAvx2(const PackedMatrix& w, int64_t r0, int64_t r1, const float* x, int batch, const float* xs,
                    float* y, int64_t yStride)
{
    packedRows(w, r0, r1, x, batch, xs, y, yStride);
}

}  // namespace kvscope::detail

#pragma GCC pop_options

#endif
