// The scalar reference of decode attention (decode_attention.h) and its dispatcher.
#include "model/decode_attention.h"

#include "common/error.h"
#include "common/half.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kvscope {

namespace detail {
#if defined(__x86_64__) || defined(__i386__)
// Scores of every visible key for every query head into scores (groups, S - first), softcap
// applied; then out (groups, headDim) = sum_j p_gj V_j with p given in scores.
void decodeScoresAvx2(const DecodeAttention& a, float* scores);
void decodeValuesAvx2(const DecodeAttention& a, const float* p, float* out);
#endif
}  // namespace detail

namespace {

// Row `row` of a cache (headDim values of type `elem`) as fp32 into out.
void loadRow(const void* base, KvElem elem, int64_t row, int headDim, float* out)
{
    const int64_t at = row * headDim;
    switch (elem) {
    case KvElem::F32: std::copy_n(static_cast<const float*>(base) + at, headDim, out); return;
    case KvElem::F16:
        for (int d = 0; d < headDim; ++d) out[d] = halfToFloat(static_cast<const uint16_t*>(base)[at + d]);
        return;
    case KvElem::BF16:
        for (int d = 0; d < headDim; ++d) out[d] = bf16ToFloat(static_cast<const uint16_t*>(base)[at + d]);
        return;
    }
}

void scoresScalar(const DecodeAttention& a, float* scores)
{
    const int64_t n = a.S - a.first;
    std::vector<float> k(size_t(a.headDim));
    for (int64_t j = 0; j < n; ++j) {
        loadRow(a.K, a.elem, a.first + j, a.headDim, k.data());
        for (int g = 0; g < a.groups; ++g) {
            const float* q = a.q + g * a.headDim;
            float s = 0.0f;
            for (int d = 0; d < a.headDim; ++d) s += q[d] * k[size_t(d)];
            scores[g * n + j] = s;
        }
    }
}

void valuesScalar(const DecodeAttention& a, const float* p, float* out)
{
    const int64_t n = a.S - a.first;
    std::fill(out, out + a.groups * a.headDim, 0.0f);
    std::vector<float> v(size_t(a.headDim));
    for (int64_t j = 0; j < n; ++j) {
        loadRow(a.V, a.elem, a.first + j, a.headDim, v.data());
        for (int g = 0; g < a.groups; ++g) {
            const float w = p[g * n + j];
            float* o = out + g * a.headDim;
            for (int d = 0; d < a.headDim; ++d) o[d] += w * v[size_t(d)];
        }
    }
}

}  // namespace

void decodeAttention(const DecodeAttention& a, float* out, float* scratch, SimdPath path)
{
    KVSCOPE_ASSERT(a.q && a.K && a.V && out && scratch && a.groups >= 1 && a.headDim >= 1);
    KVSCOPE_ASSERT(a.first >= 0 && a.first < a.S);
    const int64_t n = a.S - a.first;
#if defined(__x86_64__) || defined(__i386__)
    const bool simd = path != SimdPath::Scalar && a.headDim % 8 == 0;
#else
    const bool simd = false;
    (void)path;
#endif
#if defined(__x86_64__) || defined(__i386__)
    if (simd) detail::decodeScoresAvx2(a, scratch);
    else
#endif
        scoresScalar(a, scratch);
    // Softmax per query head, normalised before the value pass.
    for (int g = 0; g < a.groups; ++g) {
        float* s = scratch + g * n;
        if (a.softcap > 0) {
            const float c = float(a.softcap);
            for (int64_t j = 0; j < n; ++j) s[j] = std::tanh(s[j] / c) * c;
        }
        const float m = *std::max_element(s, s + n);
        float sum = 0.0f;
        for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - m));
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; ++j) s[j] *= inv;
    }
#if defined(__x86_64__) || defined(__i386__)
    if (simd) return detail::decodeValuesAvx2(a, scratch, out);
#endif
    valuesScalar(a, scratch, out);
}

}  // namespace kvscope
