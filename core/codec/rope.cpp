// RoPE rotation of key rows (rotate_half layout, angles in double): what rope_undo undoes on the
// encoder side and the decoder re-applies (transform.h READ ME FIRST, 1; declared there). Built with
// -ffp-contract=off like the rest of the transform codec, so that the rotation gives the same bytes
// on every CPU.
#include "codec/simd_path.h"
#include "codec/transform.h"

#include <cmath>

#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers build vectors from deliberately undefined ones (false positives).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#endif

namespace kvscope {

void ropeTable(int tokens, int headDim, const float* invFreq, int position0, int t0, std::vector<double>& cs)
{
    const int half = headDim / 2;
    cs.resize(size_t(2) * tokens * half);
    for (int t = 0; t < tokens; ++t) {
        const double pos = double(position0) + double(t0) + double(t);
        for (int i = 0; i < half; ++i) {
            const double a = pos * double(invFreq[i]);
            cs[2 * (size_t(t) * half + i)] = std::cos(a);
            cs[2 * (size_t(t) * half + i) + 1] = std::sin(a);
        }
    }
}

namespace {

#if defined(__x86_64__)
// 8 pairs at a time in double: the same rounded multiplies and subtraction or addition as the
// scalar loop, so the same bytes.
__attribute__((target("avx512f"))) void rotateAvx512(float* r, const double* e, int half, bool inverse)
{
    const __m512i evens = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), odds = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
    const __m512d sign = _mm512_set1_pd(inverse ? -1.0 : 1.0);
    for (int i = 0; i < half; i += 8) {
        const __m512d lo = _mm512_loadu_pd(e + 2 * i), hi = _mm512_loadu_pd(e + 2 * i + 8);
        const __m512d c = _mm512_permutex2var_pd(lo, evens, hi);
        const __m512d s = _mm512_mul_pd(_mm512_permutex2var_pd(lo, odds, hi), sign);  // exact: a sign
        const __m512d x1 = _mm512_cvtps_pd(_mm256_loadu_ps(r + i)), x2 = _mm512_cvtps_pd(_mm256_loadu_ps(r + i + half));
        _mm256_storeu_ps(r + i, _mm512_cvtpd_ps(_mm512_sub_pd(_mm512_mul_pd(x1, c), _mm512_mul_pd(x2, s))));
        _mm256_storeu_ps(r + i + half, _mm512_cvtpd_ps(_mm512_add_pd(_mm512_mul_pd(x2, c), _mm512_mul_pd(x1, s))));
    }
}
#endif

}  // namespace

void applyRopeTable(float* rows, int tokens, int headDim, const double* cs, bool inverse)
{
    const int half = headDim / 2;
#if defined(__x86_64__)
    if (half % 8 == 0 && simdPath() == SimdPath::Avx512) {
        for (int t = 0; t < tokens; ++t) rotateAvx512(rows + size_t(t) * headDim, cs + 2 * size_t(t) * half, half, inverse);
        return;
    }
#endif
    for (int t = 0; t < tokens; ++t) {
        float* r = rows + size_t(t) * headDim;
        const double* e = cs + 2 * size_t(t) * half;
        for (int i = 0; i < half; ++i) {
            const double c = e[2 * i], s = inverse ? -e[2 * i + 1] : e[2 * i + 1];
            const double x1 = r[i], x2 = r[i + half];
            r[i] = float(x1 * c - x2 * s);
            r[i + half] = float(x2 * c + x1 * s);
        }
    }
}

void applyRope(float* rows, int tokens, int headDim, const float* invFreq, int position0, int t0, bool inverse)
{
    std::vector<double> cs;
    ropeTable(tokens, headDim, invFreq, position0, t0, cs);
    applyRopeTable(rows, tokens, headDim, cs.data(), inverse);
}

}  // namespace kvscope
