// The AVX-512 weight kernels (weight_kernels.h): 16 float lanes, one conversion per 16 values. The
// target pragma covers only this file's own code, after every include, so the file builds without
// -mavx512f and its code runs only when the dispatcher (weight_kernels.cpp) has checked the CPU.
#include "model/weight_kernels.h"

#if defined(__x86_64__) || defined(__i386__)

#include "common/error.h"
#include "modelio/ggml_quants.h"

#include <immintrin.h>

// GCC 12's AVX-512 headers: false positives on their own undefined-register idiom.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <cstring>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")

namespace kvscope::detail {

namespace {

struct Isa {
    using Vec = __m512;
    static Vec zero() { return _mm512_setzero_ps(); }
    static Vec mul16(__m128i q, const float* x)
    {
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_loadu_ps(x));
    }
    static Vec fma16(__m128i q, const float* x, Vec acc)
    {
        return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_loadu_ps(x), acc);
    }
    static Vec scaleAdd(Vec p, float s, Vec acc) { return _mm512_fmadd_ps(p, _mm512_set1_ps(s), acc); }
    static float hsum(Vec v)
    {
        const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        s = _mm_add_ss(s, _mm_movehdup_ps(s));
        return _mm_cvtss_f32(s);
    }
};

#include "model/weight_kernels_x86.h"

}  // namespace

void packedRowsAvx512(const PackedMatrix& w, int64_t r0, int64_t r1, const float* x, int batch, const float* xs,
                    float* y, int64_t yStride)
{
    packedRows(w, r0, r1, x, batch, xs, y, yStride);
}

}  // namespace kvscope::detail

#pragma GCC pop_options

#endif
