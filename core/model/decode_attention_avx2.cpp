// The AVX2 passes of decode attention (decode_attention.h): head_dim a multiple of 8. The target
// pragma covers only this file's own code, after every include, so the file builds without -mavx2
// and its code runs only when the dispatcher (decode_attention.cpp) has chosen it.
#include "model/decode_attention.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma")

namespace kvscope::detail {

namespace {

inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

}  // namespace

void decodeScoresAvx2(const DecodeAttention& a, float* scores)
{
    const int64_t n = a.S - a.first;
    const int hd = a.headDim;
    for (int64_t j = 0; j < n; ++j) {
        const float* k = a.K + (a.first + j) * hd;
        _mm_prefetch(reinterpret_cast<const char*>(k + 8 * hd), _MM_HINT_T0);
        for (int g = 0; g < a.groups; ++g) {
            const float* q = a.q + g * hd;
            __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
            int d = 0;
            for (; d + 16 <= hd; d += 16) {
                acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), acc0);
                acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8), acc1);
            }
            if (d < hd) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), acc0);
            scores[g * n + j] = hsum(_mm256_add_ps(acc0, acc1));
        }
    }
}

void decodeValuesAvx2(const DecodeAttention& a, const float* p, float* out)
{
    const int64_t n = a.S - a.first;
    const int hd = a.headDim;
    for (int g = 0; g < a.groups; ++g)
        for (int d = 0; d < hd; d += 8) _mm256_storeu_ps(out + g * hd + d, _mm256_setzero_ps());
    for (int64_t j = 0; j < n; ++j) {
        const float* v = a.V + (a.first + j) * hd;
        _mm_prefetch(reinterpret_cast<const char*>(v + 8 * hd), _MM_HINT_T0);
        for (int g = 0; g < a.groups; ++g) {
            const __m256 w = _mm256_set1_ps(p[g * n + j]);
            float* o = out + g * hd;
            for (int d = 0; d < hd; d += 8)
                _mm256_storeu_ps(o + d, _mm256_fmadd_ps(w, _mm256_loadu_ps(v + d), _mm256_loadu_ps(o + d)));
        }
    }
}

}  // namespace kvscope::detail

#pragma GCC pop_options

#endif
