#include "codec/quantize.h"

#include "codec/simd_path.h"
#include "common/error.h"
#include "common/half.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's AVX-512 headers (false positives)
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVSCOPE_QUANT_X86 1
#endif

namespace kvscope::quant {

uint16_t scaleFor(float absmax, int maxLevel)
{
    if (!(absmax > 0.0f)) return 0;
    const float want = absmax / float(maxLevel);
    uint16_t h = floatToHalf(want);
    // Round up: the next fp16 above keeps |x| / scale <= maxLevel after rounding.
    while (halfToFloat(h) * float(maxLevel) < absmax) ++h;
    if ((h & 0x7c00u) == 0x7c00u)
        throw Error("value magnitude " + std::to_string(absmax) + " is too large for an fp16 scale");
    return h;
}

namespace {

inline uint8_t quantizeOne(float x, float inv, int maxLevel)
{
    // inv = 1/scale (0 for a zero scale, which maps every value to the zero symbol)
    int q = int(std::lrint(x * inv));
    q = std::clamp(q, -maxLevel, maxLevel);
    return uint8_t(q + maxLevel);
}

inline float inverse(uint16_t scaleBits)
{
    const float s = halfToFloat(scaleBits);
    return s > 0.0f ? 1.0f / s : 0.0f;
}

// Largest |v| of a row via the float bits: for non-negative floats the bit patterns order like
// the values, so an integer max (which vectorises) gives absmax and catches NaN and infinity too.
uint32_t absBitsScalar(const float* v, size_t n)
{
    uint32_t m = 0;
    for (size_t i = 0; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, v + i, 4);
        m = std::max(m, u & 0x7fffffffu);
    }
    return m;
}

// Round to nearest even without a libm call, exact for |v| < 2^22 (quantized values are <= 127):
// adding 1.5 * 2^23 pushes the fraction out of the float.
inline float roundEven(float v) { return (v + 12582912.0f) - 12582912.0f; }

// The scalar reference of a row: q = clamp(round_even(v * inv), -MAX, MAX) + MAX. The SIMD rows
// below do the same IEEE operations (a multiply, a round to nearest even of the product, min/max,
// an exact add), so they give the same bytes.
void quantizeRowScalar(const float* __restrict v, size_t n, float inv, int maxLevel, uint8_t* __restrict q)
{
    const float lo = float(-maxLevel), hi = float(maxLevel), off = float(maxLevel);
    for (size_t i = 0; i < n; ++i) q[i] = uint8_t(int(std::min(hi, std::max(lo, roundEven(v[i] * inv))) + off));
}

#ifdef KVSCOPE_QUANT_X86
#define KVS_Q512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define KVS_Q256 __attribute__((target("avx2")))

KVS_Q512 uint32_t absBits512(const float* v, size_t n)
{
    __m512i m = _mm512_setzero_si512();
    const __m512i abs = _mm512_set1_epi32(0x7fffffff);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_loadu_si512(v + i), abs));
    return std::max(uint32_t(_mm512_reduce_max_epu32(m)), absBitsScalar(v + i, n - i));
}

KVS_Q512 void quantizeRow512(const float* v, size_t n, float inv, int maxLevel, uint8_t* q)
{
    const __m512 vi = _mm512_set1_ps(inv), lo = _mm512_set1_ps(float(-maxLevel)), hi = _mm512_set1_ps(float(maxLevel));
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(v + i), vi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512 c = _mm512_add_ps(_mm512_min_ps(hi, _mm512_max_ps(lo, r)), hi);  // + MAX, exact
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(c)));
    }
    quantizeRowScalar(v + i, n - i, inv, maxLevel, q + i);
}

KVS_Q512 void subtract512(const float* x, const float* a, float* out, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, _mm512_sub_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(a + i)));
    for (; i < n; ++i) out[i] = x[i] - a[i];
}

KVS_Q256 void subtract256(const float* x, const float* a, float* out, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(a + i)));
    for (; i < n; ++i) out[i] = x[i] - a[i];
}

KVS_Q256 uint32_t absBits256(const float* v, size_t n)
{
    __m256i m = _mm256_setzero_si256();
    const __m256i abs = _mm256_set1_epi32(0x7fffffff);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i)), abs));
    alignas(32) uint32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), m);
    uint32_t r = absBitsScalar(v + i, n - i);
    for (uint32_t x : lanes) r = std::max(r, x);
    return r;
}

KVS_Q256 void quantizeRow256(const float* v, size_t n, float inv, int maxLevel, uint8_t* q)
{
    const __m256 vi = _mm256_set1_ps(inv), lo = _mm256_set1_ps(float(-maxLevel)), hi = _mm256_set1_ps(float(maxLevel));
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), vi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i c = _mm256_cvttps_epi32(_mm256_add_ps(_mm256_min_ps(hi, _mm256_max_ps(lo, r)), hi));
        const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), _mm_packus_epi16(w, w));
    }
    quantizeRowScalar(v + i, n - i, inv, maxLevel, q + i);
}
#endif

uint32_t absBits(const float* v, size_t n)
{
#ifdef KVSCOPE_QUANT_X86
    switch (simdPath()) {
    case SimdPath::Avx512: return absBits512(v, n);
    case SimdPath::Avx2: return absBits256(v, n);
    case SimdPath::Scalar: break;
    }
#endif
    return absBitsScalar(v, n);
}

void quantizeRow(const float* v, size_t n, float inv, int maxLevel, uint8_t* q)
{
#ifdef KVSCOPE_QUANT_X86
    switch (simdPath()) {
    case SimdPath::Avx512: return quantizeRow512(v, n, inv, maxLevel, q);
    case SimdPath::Avx2: return quantizeRow256(v, n, inv, maxLevel, q);
    case SimdPath::Scalar: break;
    }
#endif
    quantizeRowScalar(v, n, inv, maxLevel, q);
}

// out = x - a over n floats (the same IEEE subtraction on every path).
void subtractRow(const float* x, const float* a, float* out, size_t n)
{
#ifdef KVSCOPE_QUANT_X86
    switch (simdPath()) {
    case SimdPath::Avx512: return subtract512(x, a, out, n);
    case SimdPath::Avx2: return subtract256(x, a, out, n);
    case SimdPath::Scalar: break;
    }
#endif
    for (size_t i = 0; i < n; ++i) out[i] = x[i] - a[i];
}

float absMaxFinite(const float* v, size_t n)
{
    const uint32_t m = absBits(v, n);
    if (m >= 0x7f800000u) throw Error("KV value is not finite (NaN or infinity)");
    float f;
    std::memcpy(&f, &m, 4);
    return f;
}

}  // namespace

void quantizeBlock(const BlockSpec& b, const float* x, uint8_t* sym, uint16_t* scales)
{
    const int D = b.headDim, T = b.tokens, C = b.channels();
    auto at = [&](int h, int t, int d) { return x[(size_t(h) * T + t) * D + d]; };
    const bool delta = b.deltaGroup >= 2;

    if (b.quantizer == Quantizer::PerToken) {
        thread_local std::vector<float> row, anchor;  // the token across every head, the group's anchor: (channels)
        thread_local std::vector<uint8_t> q;
        row.resize(size_t(C)), anchor.resize(size_t(C)), q.resize(size_t(C));
        for (int t = 0; t < T; ++t) {
            const bool isAnchor = b.isAnchor(t);
            for (int h = 0; h < b.heads; ++h) {
                const float* src = x + (size_t(h) * T + t) * D;
                float* dst = row.data() + size_t(h) * D;
                if (delta && !isAnchor) subtractRow(src, anchor.data() + size_t(h) * D, dst, size_t(D));
                else std::memcpy(dst, src, sizeof(float) * size_t(D));
            }
            const int maxL = maxLevel(b.binsFor(t));
            scales[t] = scaleFor(absMaxFinite(row.data(), row.size()), maxL);
            quantizeRow(row.data(), row.size(), inverse(scales[t]), maxL, q.data());
            for (int h = 0; h < b.heads; ++h) std::copy_n(q.data() + size_t(h) * D, D, sym + (size_t(h) * T + t) * D);
            if (delta && isAnchor) {
                const float s = halfToFloat(scales[t]);
                for (int c = 0; c < C; ++c) anchor[size_t(c)] = float(int(q[size_t(c)]) - maxL) * s;
            }
        }
        return;
    }

    // Per-channel: scales over the block's tokens, anchors and deltas apart.
    absMaxFinite(x, size_t(b.heads) * T * D);  // throws on NaN or infinity
    const int maxL = maxLevel(b.bins), maxA = maxLevel(b.anchorBins);
    std::vector<float> absAnchor(size_t(C), 0.0f), absDelta(size_t(C), 0.0f);
    for (int h = 0; h < b.heads; ++h)
        for (int t = 0; t < T; ++t)
            for (int d = 0; d < D; ++d) {
                const float v = at(h, t, d);
                float& m = b.isAnchor(t) ? absAnchor[size_t(h) * D + d] : absDelta[size_t(h) * D + d];
                m = std::max(m, std::fabs(v));
            }
    uint16_t* anchorScales = scales + C;
    if (delta)
        for (int c = 0; c < C; ++c) anchorScales[c] = scaleFor(absAnchor[c], maxA);
    if (!delta) {
        for (int c = 0; c < C; ++c) scales[c] = scaleFor(absDelta[c], maxL);
    } else {
        // Delta magnitudes depend on the reconstructed anchors: reconstruct, then take absmax.
        std::fill(absDelta.begin(), absDelta.end(), 0.0f);
        for (int h = 0; h < b.heads; ++h)
            for (int t = 0; t < T; ++t) {
                if (b.isAnchor(t)) continue;
                const int a = t - t % b.deltaGroup;
                for (int d = 0; d < D; ++d) {
                    const int c = h * D + d;
                    const float inv = inverse(anchorScales[c]);
                    const float ah = float(int(quantizeOne(at(h, a, d), inv, maxA)) - maxA) *
                                     halfToFloat(anchorScales[c]);
                    absDelta[c] = std::max(absDelta[c], std::fabs(at(h, t, d) - ah));
                }
            }
        for (int c = 0; c < C; ++c) scales[c] = scaleFor(absDelta[c], maxL);
    }
    for (int h = 0; h < b.heads; ++h)
        for (int t = 0; t < T; ++t) {
            uint8_t* row = sym + (size_t(h) * T + t) * D;
            if (b.isAnchor(t)) {
                for (int d = 0; d < D; ++d)
                    row[d] = quantizeOne(at(h, t, d), inverse(anchorScales[h * D + d]), maxA);
                continue;
            }
            const int a = delta ? t - t % b.deltaGroup : -1;
            for (int d = 0; d < D; ++d) {
                const int c = h * D + d;
                float v = at(h, t, d);
                if (a >= 0) {
                    const uint8_t qa = sym[(size_t(h) * T + a) * D + d];  // anchor row already coded
                    v -= float(int(qa) - maxA) * halfToFloat(anchorScales[c]);
                }
                row[d] = quantizeOne(v, inverse(scales[c]), maxL);
            }
        }
}

void dequantizeBlock(const BlockSpec& b, const uint8_t* sym, const uint16_t* scales, float* out)
{
    const int D = b.headDim, T = b.tokens, C = b.channels();
    const bool delta = b.deltaGroup >= 2;
    const int maxL = maxLevel(b.bins), maxA = maxLevel(b.anchorBins);
    for (int h = 0; h < b.heads; ++h)
        for (int t = 0; t < T; ++t) {
            const uint8_t* row = sym + (size_t(h) * T + t) * D;
            float* o = out + (size_t(h) * T + t) * D;
            const bool anchor = b.isAnchor(t);
            const int m = anchor ? maxA : maxL;
            const float* base = (delta && !anchor) ? out + (size_t(h) * T + (t - t % b.deltaGroup)) * D : nullptr;
            if (b.quantizer == Quantizer::PerToken) {
                const float s = halfToFloat(scales[t]);
                for (int d = 0; d < D; ++d) o[d] = float(int(row[d]) - m) * s + (base ? base[d] : 0.0f);
            } else {
                const uint16_t* sc = (anchor ? scales + C : scales) + size_t(h) * D;
                for (int d = 0; d < D; ++d)
                    o[d] = float(int(row[d]) - m) * halfToFloat(sc[d]) + (base ? base[d] : 0.0f);
            }
        }
}

}  // namespace kvscope::quant
