// The AVX2 passes of decode attention (decode_attention.h): head_dim a multiple of 8, fp16 loaded
// with F16C (which every AVX2 CPU has, as the weight kernels also assume). The target pragma
// covers only this file's own code, after every include, so the file builds without -mavx2 and
// its code runs only when the dispatcher (decode_attention.cpp) has chosen it.
#include "model/decode_attention.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace kvscope::detail {

namespace {

inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Eight cache values from `p` as fp32 (exact conversions: F16C for fp16, a shift for bf16).
template <KvElem E>
inline __m256 load8(const void* p, int64_t at)
{
    if constexpr (E == KvElem::F32) return _mm256_loadu_ps(static_cast<const float*>(p) + at);
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + at));
    if constexpr (E == KvElem::F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <KvElem E>
inline void prefetchRow(const void* p, int64_t at)
{
    const size_t bytes = E == KvElem::F32 ? 4 : 2;
    _mm_prefetch(static_cast<const char*>(p) + size_t(at) * bytes, _MM_HINT_T0);
}

template <KvElem E>
void scores(const DecodeAttention& a, float* scores)
{
    const int64_t n = a.S - a.first;
    const int hd = a.headDim;
    for (int64_t j = 0; j < n; ++j) {
        const int64_t k = (a.first + j) * hd;
        prefetchRow<E>(a.K, k + 8 * hd);
        for (int g = 0; g < a.groups; ++g) {
            const float* q = a.q + g * hd;
            __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
            int d = 0;
            for (; d + 16 <= hd; d += 16) {
                acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8<E>(a.K, k + d), acc0);
                acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), load8<E>(a.K, k + d + 8), acc1);
            }
            if (d < hd) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8<E>(a.K, k + d), acc0);
            scores[g * n + j] = hsum(_mm256_add_ps(acc0, acc1));
        }
    }
}

template <KvElem E>
void values(const DecodeAttention& a, const float* p, float* out)
{
    const int64_t n = a.S - a.first;
    const int hd = a.headDim;
    for (int g = 0; g < a.groups; ++g)
        for (int d = 0; d < hd; d += 8) _mm256_storeu_ps(out + g * hd + d, _mm256_setzero_ps());
    for (int64_t j = 0; j < n; ++j) {
        const int64_t v = (a.first + j) * hd;
        prefetchRow<E>(a.V, v + 8 * hd);
        for (int g = 0; g < a.groups; ++g) {
            const __m256 w = _mm256_set1_ps(p[g * n + j]);
            float* o = out + g * hd;
            for (int d = 0; d < hd; d += 8)
                _mm256_storeu_ps(o + d, _mm256_fmadd_ps(w, load8<E>(a.V, v + d), _mm256_loadu_ps(o + d)));
        }
    }
}

}  // namespace

void decodeScoresAvx2(const DecodeAttention& a, float* out)
{
    switch (a.elem) {
    case KvElem::F32: return scores<KvElem::F32>(a, out);
    case KvElem::F16: return scores<KvElem::F16>(a, out);
    case KvElem::BF16: return scores<KvElem::BF16>(a, out);
    }
}

void decodeValuesAvx2(const DecodeAttention& a, const float* p, float* out)
{
    switch (a.elem) {
    case KvElem::F32: return values<KvElem::F32>(a, p, out);
    case KvElem::F16: return values<KvElem::F16>(a, p, out);
    case KvElem::BF16: return values<KvElem::BF16>(a, p, out);
    }
}

}  // namespace kvscope::detail

#pragma GCC pop_options

#endif
