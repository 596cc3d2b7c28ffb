// The transform decoder's kernels (transform_kernels.h): the inverse transform over a tile of
// tokens and the dequantisation of a row of symbols, scalar, AVX2 and AVX-512, and the encoder's
// forward transform and quantisation. Compiled with -ffp-contract=off: the scalar inverse
// transform is FORMAT.md's reference (one rounded multiply and one rounded add per term). The
// register-blocked AVX2 and AVX-512 sums fuse each term's multiply and add (FMA, explicit
// intrinsics): within FORMAT.md's tolerance of the reference. The encoder's forward transform
// fuses every term on every path (std::fma in the scalar reference) in one fixed order, so all
// paths give the same bytes.
#include "codec/transform_kernels.h"

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers build vectors from deliberately undefined ones (false positives).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace kvscope::detail {

namespace {

// ---- the inverse transform over a tile of tokens ---------------------------------------------------

void accumulateScalar(const Tile& t)
{
    for (int k = 0; k < t.K; ++k) {
        const float* a = t.col + size_t(k) * t.C;
        for (int i = 0; i < t.nt; ++i) {
            const float z = t.zq[size_t(i) * t.K + k];
            if (z == 0.0f) continue;
            float* __restrict v = t.v + size_t(i) * t.C;
            const float* __restrict ak = a;
            // Lanes of a vector round each product and sum as the scalar loop does (no
            // contraction in this file), so letting the compiler vectorise keeps the bytes.
#pragma omp simd
            for (int c = t.lo[k]; c < t.hi[k]; ++c) v[c] += ak[c] * z;
        }
    }
}

#if defined(__x86_64__) || defined(__i386__)
// The store-based loop over channels [from, C): per component, per token with z != 0, the
// channels of [lo, hi) one vector at a time.
__attribute__((target("avx2"))) void accumulateAvx2From(const Tile& t, int from)
{
    for (int k = 0; k < t.K; ++k) {
        const float* a = t.col + size_t(k) * t.C;
        const int lo = std::max(t.lo[k], from), hi = t.hi[k];
        if (lo >= hi) continue;
        for (int i = 0; i < t.nt; ++i) {
            const float z = t.zq[size_t(i) * t.K + k];
            if (z == 0.0f) continue;
            float* v = t.v + size_t(i) * t.C;
            const __m256 zz = _mm256_set1_ps(z);
            int c = lo;
            for (; c + 8 <= hi; c += 8)
                _mm256_storeu_ps(v + c, _mm256_add_ps(_mm256_loadu_ps(v + c), _mm256_mul_ps(_mm256_loadu_ps(a + c), zz)));
            for (; c < hi; ++c) v[c] += a[c] * z;
        }
    }
}

// AVX2 with Tile::plain (see the AVX-512 sums below for why adding the zero terms leaves a sum
// as it was): one group of 16 channels, 6 tokens at a time (12 sums, 2 column vectors, the broadcast and a
// product: the 16 registers), each term one fused multiply-add. The sums are named variables, not
// an array: GCC kept an array of them on the stack.
template <bool Dense>
__attribute__((target("avx2,fma"))) void accumulateAvx2Group(const Tile& t, const float* zT, int g0)
{
    constexpr int I = 6, G = 16;
    for (int i0 = 0; i0 < t.nt; i0 += I, zT += size_t(I) * t.K) {
        const int ni = std::min(I, t.nt - i0);
        float* v0 = t.v + size_t(i0) * t.C + g0;
        float* v1 = t.v + size_t(i0 + std::min(1, ni - 1)) * t.C + g0;
        float* v2 = t.v + size_t(i0 + std::min(2, ni - 1)) * t.C + g0;
        float* v3 = t.v + size_t(i0 + std::min(3, ni - 1)) * t.C + g0;
        float* v4 = t.v + size_t(i0 + std::min(4, ni - 1)) * t.C + g0;
        float* v5 = t.v + size_t(i0 + std::min(5, ni - 1)) * t.C + g0;
        __m256 s00 = _mm256_loadu_ps(v0), s01 = _mm256_loadu_ps(v0 + 8);
        __m256 s10 = _mm256_loadu_ps(v1), s11 = _mm256_loadu_ps(v1 + 8);
        __m256 s20 = _mm256_loadu_ps(v2), s21 = _mm256_loadu_ps(v2 + 8);
        __m256 s30 = _mm256_loadu_ps(v3), s31 = _mm256_loadu_ps(v3 + 8);
        __m256 s40 = _mm256_loadu_ps(v4), s41 = _mm256_loadu_ps(v4 + 8);
        __m256 s50 = _mm256_loadu_ps(v5), s51 = _mm256_loadu_ps(v5 + 8);
        const float* a = t.col + g0;
        const float* z = zT;
        for (int k = 0; k < t.K; ++k, a += t.C, z += I) {
            if (!Dense && (t.hi[k] <= g0 || t.lo[k] >= g0 + G)) continue;  // the column is +-0 over the group
            const __m256 a0 = _mm256_loadu_ps(a), a1 = _mm256_loadu_ps(a + 8);
#define KVS_ROW(i)                                               \
    {                                                            \
        const __m256 zz = _mm256_broadcast_ss(z + i);            \
        s##i##0 = _mm256_fmadd_ps(a0, zz, s##i##0);              \
        s##i##1 = _mm256_fmadd_ps(a1, zz, s##i##1);              \
    }
            KVS_ROW(0) KVS_ROW(1) KVS_ROW(2) KVS_ROW(3) KVS_ROW(4) KVS_ROW(5)
#undef KVS_ROW
        }
        // Rows past nt were computed on a copy of the last row: stored first, so that the real
        // row's sums land last.
        _mm256_storeu_ps(v5, s50), _mm256_storeu_ps(v5 + 8, s51);
        _mm256_storeu_ps(v4, s40), _mm256_storeu_ps(v4 + 8, s41);
        _mm256_storeu_ps(v3, s30), _mm256_storeu_ps(v3 + 8, s31);
        _mm256_storeu_ps(v2, s20), _mm256_storeu_ps(v2 + 8, s21);
        _mm256_storeu_ps(v1, s10), _mm256_storeu_ps(v1 + 8, s11);
        _mm256_storeu_ps(v0, s00), _mm256_storeu_ps(v0 + 8, s01);
    }
}

__attribute__((target("avx2,fma"))) void accumulateAvx2(const Tile& t)
{
    if (!t.plain) return accumulateAvx2From(t, 0);
    // The components of each 6 tokens interleaved, zT[(i0 / 6) K 6 + 6 k + i], so that one
    // pointer reaches them all (6 pointers and 12 sums do not fit the registers together); 0 past nt.
    constexpr int I = 6;
    thread_local std::vector<float> zT;
    const int blocks = (t.nt + I - 1) / I;
    zT.assign(size_t(blocks) * I * t.K, 0.0f);
    for (int i = 0; i < t.nt; ++i)
        for (int k = 0; k < t.K; ++k) zT[(size_t(i / I) * t.K + k) * I + size_t(i % I)] = t.zq[size_t(i) * t.K + k];
    int g0 = 0;
    // Dense: no column is +-0 over a whole group (bases across heads), so no test per term.
    bool dense = true;
    for (int k = 0; k < t.K && dense; ++k) dense = t.lo[k] < 16 && t.hi[k] > t.C / 16 * 16 - 16;
    for (; g0 + 16 <= t.C; g0 += 16)
        dense ? accumulateAvx2Group<true>(t, zT.data(), g0) : accumulateAvx2Group<false>(t, zT.data(), g0);
    if (g0 < t.C) accumulateAvx2From(t, g0);
}

// AVX-512: the sums of 4 tokens x 64 channels stay in 16 registers while every component goes
// by, so no sum goes through memory between terms, and no term is a branch (zq is 40% zeros in
// no order; the store-based loop's branches on them were mispredicted). Each sum takes its terms
// in ascending k. Plain (Tile::plain): one fused multiply-add per term (FORMAT.md's tolerance),
// the zero terms included, which leave a sum as it was: a sum that starts at a mean other than
// -0 is never -0 (round to nearest gives -0 only from -0 + -0), and a * 0 with a finite is +-0.
// Otherwise (-0 means, steps or columns that are not finite) the reference's rounded multiply and
// add, a term whose z is 0 or a channel outside [lo, hi) a masked-off lane: the scalar bytes.
template <bool Plain>
__attribute__((target("avx512f"))) void accumulateAvx512Sums(const Tile& t)
{
    constexpr int G = 64, I = 4;  // channels of a group (4 vectors), tokens of a pass
    for (int g0 = 0; g0 < t.C; g0 += G) {
        __mmask16 inC[4];  // lanes of the group's vectors that are channels (< C)
        for (int j = 0; j < 4; ++j) {
            const int n = std::max(0, std::min(16, t.C - g0 - 16 * j));
            inC[j] = __mmask16((1u << n) - 1);
        }
        for (int i0 = 0; i0 < t.nt; i0 += I) {
            const int ni = std::min(I, t.nt - i0);
            __m512 acc[I][4];  // fully unrolled below, so that it lives in registers
#pragma GCC unroll 4
            for (int i = 0; i < I; ++i)
#pragma GCC unroll 4
                for (int j = 0; j < 4; ++j)
                    acc[i][j] = i < ni ? _mm512_maskz_loadu_ps(inC[j], t.v + size_t(i0 + i) * t.C + g0 + 16 * j)
                                       : _mm512_setzero_ps();
            for (int k = 0; k < t.K; ++k) {
                const int lo = std::max(t.lo[k] - g0, 0), hi = std::min(t.hi[k] - g0, G);
                if (lo >= hi) continue;  // the column is +-0 over the whole group
                __mmask16 cm[4];
                __m512 a[4];
                if constexpr (Plain) {
#pragma GCC unroll 4
                    for (int j = 0; j < 4; ++j) a[j] = _mm512_maskz_loadu_ps(inC[j], t.col + size_t(k) * t.C + g0 + 16 * j);
                } else {
                    const uint64_t range = (hi - lo == 64 ? ~uint64_t(0) : ((uint64_t(1) << (hi - lo)) - 1)) << lo;
#pragma GCC unroll 4
                    for (int j = 0; j < 4; ++j) {
                        cm[j] = __mmask16(range >> (16 * j)) & inC[j];
                        a[j] = _mm512_maskz_loadu_ps(cm[j], t.col + size_t(k) * t.C + g0 + 16 * j);
                    }
                }
#pragma GCC unroll 4
                for (int i = 0; i < I; ++i) {
                    const float z = i < ni ? t.zq[size_t(i0 + i) * t.K + k] : 0.0f;
                    const __m512 zz = _mm512_set1_ps(z);
                    if constexpr (Plain) {
#pragma GCC unroll 4
                        for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_fmadd_ps(a[j], zz, acc[i][j]);
                    } else {
                        const __mmask16 zm = z != 0.0f ? __mmask16(0xffff) : __mmask16(0);
#pragma GCC unroll 4
                        for (int j = 0; j < 4; ++j)
                            acc[i][j] = _mm512_mask_add_ps(acc[i][j], __mmask16(cm[j] & zm), acc[i][j], _mm512_mul_ps(a[j], zz));
                    }
                }
            }
#pragma GCC unroll 4
            for (int i = 0; i < I; ++i)
#pragma GCC unroll 4
                for (int j = 0; j < 4; ++j)
                    if (i < ni) _mm512_mask_storeu_ps(t.v + size_t(i0 + i) * t.C + g0 + 16 * j, inC[j], acc[i][j]);
        }
    }
}

void accumulateAvx512(const Tile& t)
{
    if (t.plain) accumulateAvx512Sums<true>(t);
    else accumulateAvx512Sums<false>(t);
}
#endif

// ---- dequantisation of one row of symbols ----------------------------------------------------------

// z[k] = q step[k] mult for k in [from, K), q = sym[k] - M[k] or the escape's value; exactly 0
// when q = 0 whatever the step (no branch: zeros come in no order).
void dequantScalarFrom(const uint8_t* sym, const int* M, const float* step, float mult, int from, int K, float* z,
                       EscapeReader& esc)
{
    for (int k = from; k < K; ++k) {
        const int s = sym[k];
        const int64_t q = (s == 0 || s == 2 * M[k]) ? esc.next(s, M[k]) : int64_t(s - M[k]);
        const float f = float(q) * step[k] * mult;
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        bits &= 0u - uint32_t(q != 0);
        std::memcpy(&z[k], &bits, 4);
    }
}

void dequantScalar(const uint8_t* sym, const int* M, const float* step, float mult, int K, float* z, EscapeReader& esc)
{
    dequantScalarFrom(sym, M, step, mult, 0, K, z, esc);
}

#if defined(__x86_64__) || defined(__i386__)
// 8 (AVX2) or 16 (AVX-512) components at a time, the same two rounded multiplies as the scalar
// loop; a vector holding an escape is done by the scalar loop, so escapes keep their order.
__attribute__((target("avx2"))) void dequantAvx2(const uint8_t* sym, const int* M, const float* step, float mult, int K,
                                                 float* z, EscapeReader& esc)
{
    const __m256 mv = _mm256_set1_ps(mult);
    int k = 0;
    for (; k + 8 <= K; k += 8) {
        const __m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sym + k)));
        const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(M + k));
        const __m256i escV = _mm256_or_si256(_mm256_cmpeq_epi32(s, _mm256_setzero_si256()),
                                             _mm256_cmpeq_epi32(s, _mm256_add_epi32(m, m)));
        if (!_mm256_testz_si256(escV, escV)) {
            dequantScalarFrom(sym, M, step, mult, k, k + 8, z, esc);
            continue;
        }
        const __m256i q = _mm256_sub_epi32(s, m);
        const __m256 f = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_loadu_ps(step + k)), mv);
        const __m256 nz = _mm256_castsi256_ps(_mm256_cmpeq_epi32(s, m));
        _mm256_storeu_ps(z + k, _mm256_andnot_ps(nz, f));
    }
    dequantScalarFrom(sym, M, step, mult, k, K, z, esc);
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void dequantAvx512(const uint8_t* sym, const int* M, const float* step,
                                                                        float mult, int K, float* z, EscapeReader& esc)
{
    const __m512 mv = _mm512_set1_ps(mult);
    for (int k = 0; k < K; k += 16) {
        const __mmask16 in = __mmask16(K - k >= 16 ? 0xffffu : (1u << (K - k)) - 1);
        const __m512i s = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(in, sym + k));
        const __m512i m = _mm512_maskz_loadu_epi32(in, M + k);
        const __mmask16 escM =
            in & (_mm512_cmpeq_epi32_mask(s, _mm512_setzero_si512()) | _mm512_cmpeq_epi32_mask(s, _mm512_add_epi32(m, m)));
        if (escM) {
            dequantScalarFrom(sym, M, step, mult, k, std::min(K, k + 16), z, esc);
            continue;
        }
        const __m512 f = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s, m)), _mm512_maskz_loadu_ps(in, step + k)), mv);
        _mm512_mask_storeu_ps(z + k, in, _mm512_maskz_mov_ps(_mm512_cmpneq_epi32_mask(s, m), f));
    }
}
#endif


// ---- the encoder: forward transform over a tile of tokens, quantisation of a row -----------------

// The reference: every z one fused multiply-add per channel, c ascending from +0 (ForwardTile).
// The sums of a token's components are independent, so they advance together channel by channel.
__attribute__((always_inline)) inline void forwardScalarBody(const ForwardTile& t)
{
    for (int i = 0; i < t.nt; ++i) {
        const float* v = t.v + size_t(i) * t.C;
        float* z = t.z + size_t(i) * t.Kp;
        std::fill(z, z + t.Kp, 0.0f);
        for (int c = 0; c < t.C; ++c) {
            const float* e = t.eT + size_t(c) * t.Kp;
            for (int k = 0; k < t.Kp; ++k) z[k] = std::fma(e[k], v[c], z[k]);
        }
    }
}

#if defined(__x86_64__) || defined(__i386__)
// std::fma is a library call in a build for any x86-64; on a CPU with FMA3 the same loop runs with
// the instruction inlined (one rounding per term either way: the same bytes).
__attribute__((target("fma"))) void forwardScalarFma(const ForwardTile& t) { forwardScalarBody(t); }
#endif

void forwardScalar(const ForwardTile& t)
{
#if defined(__x86_64__) || defined(__i386__)
    static const bool fma = __builtin_cpu_supports("fma");
    if (fma) return forwardScalarFma(t);
#endif
    forwardScalarBody(t);
}

void putVarint(std::vector<uint8_t>& out, uint64_t v)
{
    while (v >= 0x80) {
        out.push_back(uint8_t(v | 0x80));
        v >>= 7;
    }
    out.push_back(uint8_t(v));
}

void quantizeScalarFrom(const float* z, const double* div, const int* M, int from, int K, uint8_t* sym,
                        std::vector<uint8_t>& escapes)
{
    for (int k = from; k < K; ++k) {
        const double qd = std::nearbyint(double(z[k]) / div[k]);
        const int64_t q = int64_t(std::max(-2147483647.0, std::min(2147483647.0, qd)));
        if (q <= -M[k] || q >= M[k]) {
            sym[k] = uint8_t(q < 0 ? 0 : 2 * M[k]);
            putVarint(escapes, uint64_t(q < 0 ? (uint64_t(-q) << 1) - 1 : uint64_t(q) << 1));
        } else {
            sym[k] = uint8_t(int(q) + M[k]);
        }
    }
}

void quantizeScalar(const float* z, const double* div, const double*, const int* M, int K, uint8_t* sym,
                    std::vector<uint8_t>& escapes)
{
    quantizeScalarFrom(z, div, M, 0, K, sym, escapes);
}

#if defined(__x86_64__) || defined(__i386__)
// I tokens x J vectors of 8 components in registers while every channel goes by, each term the
// reference's fused multiply-add (the AVX2 path needs FMA3: simdPathSupported checks it).
template <int J>
__attribute__((target("avx2,fma"))) void forwardAvx2Cols(const ForwardTile& t, int k0)
{
    constexpr int I = 4;
    for (int i0 = 0; i0 < t.nt; i0 += I) {
        const int ni = std::min(I, t.nt - i0);
        const float* v[I];
#pragma GCC unroll 4
        for (int i = 0; i < I; ++i) v[i] = t.v + size_t(i0 + std::min(i, ni - 1)) * t.C;  // past nt: repeats, not stored
        __m256 acc[I][J];
#pragma GCC unroll 4
        for (int i = 0; i < I; ++i)
#pragma GCC unroll 3
            for (int j = 0; j < J; ++j) acc[i][j] = _mm256_setzero_ps();
        const float* e = t.eT + k0;
        for (int c = 0; c < t.C; ++c, e += t.Kp) {
            __m256 a[J];
#pragma GCC unroll 3
            for (int j = 0; j < J; ++j) a[j] = _mm256_loadu_ps(e + 8 * j);
#pragma GCC unroll 4
            for (int i = 0; i < I; ++i) {
                const __m256 x = _mm256_broadcast_ss(v[i] + c);
#pragma GCC unroll 3
                for (int j = 0; j < J; ++j) acc[i][j] = _mm256_fmadd_ps(a[j], x, acc[i][j]);
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < I; ++i)
#pragma GCC unroll 3
            for (int j = 0; j < J; ++j)
                if (i < ni) _mm256_storeu_ps(t.z + size_t(i0 + i) * t.Kp + k0 + 8 * j, acc[i][j]);
    }
}

__attribute__((target("avx2,fma"))) void forwardAvx2(const ForwardTile& t)
{
    int k0 = 0;
    for (; k0 + 16 <= t.Kp; k0 += 16) forwardAvx2Cols<2>(t, k0);
    if (t.Kp - k0 == 8) forwardAvx2Cols<1>(t, k0);
}

// AVX-512: I tokens x J vectors of 16 components in registers while every channel goes by, the
// last vector masked to the 8 components of a stride that is not a multiple of 16 (eT's padding
// columns are 0 and never stored). The same fused multiply-add per term as the scalar loop.
template <int I, int J>
__attribute__((target("avx512f"))) void forwardAvx512Cols(const ForwardTile& t, int k0, __mmask16 lastMask)
{
    for (int i0 = 0; i0 < t.nt; i0 += I) {
        const int ni = std::min(I, t.nt - i0);
        const float* v[I];
#pragma GCC unroll 8
        for (int i = 0; i < I; ++i) v[i] = t.v + size_t(i0 + std::min(i, ni - 1)) * t.C;  // past nt: repeats, not stored
        __m512 acc[I][J];
#pragma GCC unroll 8
        for (int i = 0; i < I; ++i)
#pragma GCC unroll 2
            for (int j = 0; j < J; ++j) acc[i][j] = _mm512_setzero_ps();
        const float* e = t.eT + k0;
        for (int c = 0; c < t.C; ++c, e += t.Kp) {
            __m512 a[J];
#pragma GCC unroll 2
            for (int j = 0; j < J; ++j) a[j] = _mm512_maskz_loadu_ps(j == J - 1 ? lastMask : __mmask16(0xffff), e + 16 * j);
#pragma GCC unroll 8
            for (int i = 0; i < I; ++i) {
                const __m512 x = _mm512_set1_ps(v[i][c]);
#pragma GCC unroll 2
                for (int j = 0; j < J; ++j) acc[i][j] = _mm512_fmadd_ps(a[j], x, acc[i][j]);
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < I; ++i)
#pragma GCC unroll 2
            for (int j = 0; j < J; ++j)
                if (i < ni)
                    _mm512_mask_storeu_ps(t.z + size_t(i0 + i) * t.Kp + k0 + 16 * j, j == J - 1 ? lastMask : __mmask16(0xffff),
                                          acc[i][j]);
    }
}

// quantizeAvx2's rule, 8 components at a time, the last few masked; only the lanes that fail the
// test go through the scalar loop, in k order (escapes are common where M is 1 or 2).
__attribute__((target("avx512f,avx512vl"))) void quantizeAvx512(const float* z, const double* div, const double* inv,
                                                                const int* M, int K, uint8_t* sym, std::vector<uint8_t>& escapes)
{
    const __m512d nearHalf = _mm512_set1_pd(0.5 - 0x1p-40);
    for (int k = 0; k < K; k += 8) {
        const __mmask8 in = __mmask8(K - k >= 8 ? 0xffu : (1u << (K - k)) - 1);
        const __m512d t = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_maskz_loadu_ps(in, z + k)), _mm512_maskz_loadu_pd(in, inv + k));
        const __m512d q = _mm512_roundscale_pd(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i m = _mm256_maskz_loadu_epi32(in, M + k);
        const __m512d md = _mm512_cvtepi32_pd(m);
        const __mmask8 ok = _mm512_cmp_pd_mask(q, md, _CMP_LT_OQ) & _mm512_cmp_pd_mask(q, _mm512_sub_pd(_mm512_setzero_pd(), md), _CMP_GT_OQ) &
                            _mm512_cmp_pd_mask(_mm512_abs_pd(_mm512_sub_pd(t, q)), nearHalf, _CMP_LT_OQ);
        _mm256_mask_cvtepi32_storeu_epi8(sym + k, __mmask8(ok & in), _mm256_add_epi32(_mm512_cvtpd_epi32(q), m));
        for (unsigned rest = unsigned(in & ~ok); rest != 0; rest &= rest - 1) {
            const int j = k + __builtin_ctz(rest);
            quantizeScalarFrom(z, div, M, j, j + 1, sym, escapes);
        }
    }
}

__attribute__((target("avx512f"))) void forwardAvx512(const ForwardTile& t)
{
    int k0 = 0;
    for (; k0 + 32 <= t.Kp; k0 += 32) forwardAvx512Cols<8, 2>(t, k0, 0xffff);
    const int rest = t.Kp - k0;  // 0, 8, 16 or 24
    if (rest == 24) forwardAvx512Cols<8, 2>(t, k0, 0x00ff);
    else if (rest > 0) forwardAvx512Cols<8, 1>(t, k0, rest == 16 ? 0xffff : 0x00ff);
}

// 4 components at a time in double, the scalar loop's rounding (to nearest, even: nearbyint's
// default mode) of z times 1 / div instead of z / div: the product is within 2^-51 of the quotient
// (relative), so the two round to the same integer unless a half-integer lies that close; a group
// with a lane within 2^-40 of one (|q| < M <= 127 here), an escape or a value that is not finite
// is done by the scalar loop, so the symbols are the division's and escapes keep their order.
__attribute__((target("avx2"))) void quantizeAvx2(const float* z, const double* div, const double* inv, const int* M, int K,
                                                  uint8_t* sym, std::vector<uint8_t>& escapes)
{
    const __m256d sign = _mm256_set1_pd(-0.0), nearHalf = _mm256_set1_pd(0.5 - 0x1p-40);
    int k = 0;
    for (; k + 4 <= K; k += 4) {
        const __m256d t = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(z + k)), _mm256_loadu_pd(inv + k));
        const __m256d q = _mm256_round_pd(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m128i m = _mm_loadu_si128(reinterpret_cast<const __m128i*>(M + k));
        const __m256d md = _mm256_cvtepi32_pd(m);
        const __m256d inside = _mm256_and_pd(
            _mm256_and_pd(_mm256_cmp_pd(q, md, _CMP_LT_OQ), _mm256_cmp_pd(q, _mm256_sub_pd(_mm256_setzero_pd(), md), _CMP_GT_OQ)),
            _mm256_cmp_pd(_mm256_andnot_pd(sign, _mm256_sub_pd(t, q)), nearHalf, _CMP_LT_OQ));
        if (_mm256_movemask_pd(inside) != 0xf) {
            quantizeScalarFrom(z, div, M, k, k + 4, sym, escapes);
            continue;
        }
        const __m128i s = _mm_add_epi32(_mm256_cvtpd_epi32(q), m);
        const __m128i b = _mm_shuffle_epi8(s, _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
        const int w = _mm_cvtsi128_si32(b);
        std::memcpy(sym + k, &w, 4);
    }
    quantizeScalarFrom(z, div, M, k, K, sym, escapes);
}
#endif

}  // namespace

namespace {

#if defined(__x86_64__) || defined(__i386__)
// Blocks of 8 components x 8 channels through registers (rows past K read as 0: the padding
// columns); returns the channels done, a multiple of 8.
__attribute__((target("avx2"))) int transposeAvx2(const float* encode, int C, const int* coded, int K, int Kp, float* eT)
{
    const int C8 = C / 8 * 8;
    for (int k0 = 0; k0 < Kp; k0 += 8)
        for (int c0 = 0; c0 < C8; c0 += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; ++j)
                r[j] = k0 + j < K ? _mm256_loadu_ps(encode + size_t(coded[k0 + j]) * C + c0) : _mm256_setzero_ps();
            __m256 t[8], u[8];
            for (int j = 0; j < 8; j += 2) {
                t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
                t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
            }
            for (int j = 0; j < 8; j += 4) {
                u[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
                u[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xee);
                u[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
                u[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xee);
            }
            for (int i = 0; i < 4; ++i) {  // channel c0 + i from the low halves, c0 + 4 + i from the high
                _mm256_storeu_ps(eT + size_t(c0 + i) * Kp + k0, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
                _mm256_storeu_ps(eT + size_t(c0 + 4 + i) * Kp + k0, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
            }
        }
    return C8;
}
#endif

}  // namespace

void transposeCodedRows(const float* encode, int C, const int* coded, int K, int Kp, float* eT)
{
    int from = 0;
#if defined(__x86_64__) || defined(__i386__)
    if (simdPath() != SimdPath::Scalar) from = transposeAvx2(encode, C, coded, K, Kp, eT);
#endif
    constexpr int B = 16;  // channels of a block: one cache line of a row of `encode`
    for (int c0 = from; c0 < C; c0 += B) {
        const int nc = std::min(B, C - c0);
        for (int k = 0; k < K; ++k) {
            const float* src = encode + size_t(coded[k]) * C + c0;
            for (int j = 0; j < nc; ++j) eT[size_t(c0 + j) * Kp + k] = src[j];
        }
        for (int j = 0; j < nc; ++j) std::fill(eT + size_t(c0 + j) * Kp + K, eT + size_t(c0 + j + 1) * Kp, 0.0f);
    }
}

bool allFinite(const float* x, size_t n)
{
    uint32_t bad = 0;
#pragma omp simd reduction(| : bad)
    for (size_t i = 0; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, x + i, 4);
        bad |= uint32_t((u & 0x7f800000u) == 0x7f800000u);  // exponent all ones: infinite or NaN
    }
    return bad == 0;
}

void centreRow(const float* __restrict x, const float* __restrict mean, int n, float* __restrict v)
{
#pragma omp simd
    for (int d = 0; d < n; ++d) v[d] = x[d] - mean[d];
}

TileKernels kernelsFor(SimdPath path)
{
#if defined(__x86_64__) || defined(__i386__)
    if (path == SimdPath::Avx512) return {dequantAvx512, accumulateAvx512, forwardAvx512, quantizeAvx512};
    if (path == SimdPath::Avx2) return {dequantAvx2, accumulateAvx2, forwardAvx2, quantizeAvx2};
#endif
    (void)path;
    return {dequantScalar, accumulateScalar, forwardScalar, quantizeScalar};
}

}  // namespace kvscope::detail
